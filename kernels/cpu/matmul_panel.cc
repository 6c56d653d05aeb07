// The per-thread activation panel of the x86 matmul driver (kernel_table.h).
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>

#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {

int64_t MatmulPanelBytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const int64_t half = l2 > 0 ? int64_t{l2} / 2 : int64_t{512} * 1024;
    return std::clamp<int64_t>(half, int64_t{64} * 1024, int64_t{1024} * 1024) / 64 * 64;
  }();
  return bytes;
}

int64_t MatmulPrefetchToL2PanelBytes() {
  static const int64_t bytes = [] {
    const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    const int64_t size = l1 > 0 ? int64_t{l1} : int64_t{32} * 1024;
    return std::clamp<int64_t>(size, int64_t{16} * 1024, int64_t{1024} * 1024) / 4;
  }();
  return bytes;
}

void* ThreadMatmulPanel() {
  struct Buffer {
    void* p = ::operator new (size_t(MatmulPanelBytes()), std::align_val_t{64});
    ~Buffer() { ::operator delete (p, std::align_val_t{64}); }
  };
  static thread_local Buffer buffer;
  return buffer.p;
}

}  // namespace strata::kernels::cpu
