#include "platforms/tier_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "kernels/kernels.h"

namespace strata {
namespace {

class HostTierMemory final : public TierMemory {
 public:
  const char* name() const override { return "host"; }
  bool device() const override { return false; }
  Status Allocate(size_t bytes, size_t alignment, TierArena* out) override {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096)
      return Status::InvalidArgument("host memory: alignment " + std::to_string(alignment) +
                                     " is not a power of two up to 4096");
    // Anonymous pages: page-aligned, zeroed, committed on first touch.
    const size_t length = std::max<size_t>(bytes, 1);
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return Status::ResourceExhausted("host memory: cannot allocate " + std::to_string(bytes) +
                                       " bytes: " + std::strerror(errno));
    *out = TierArena(static_cast<std::byte*>(p), [length](std::byte* q) { munmap(q, length); });
    return Status::OK();
  }
  void StoreF16(uint16_t* dst, const float* src, int64_t n) override {
    kernels::F32ToF16Row(src, dst, n);
  }
  void Copy(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
};

}  // namespace

TierMemory* HostMemory() {
  static HostTierMemory host;
  return &host;
}

}  // namespace strata
