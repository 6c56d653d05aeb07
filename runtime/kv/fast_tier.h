// FastTier: the memory the attention kernel reads KV from, with a hard byte budget.
//
// The budget is cut into equal block buffers once, up front, from one aligned arena, so the
// bytes in use can never pass the budget (Acquire simply finds none free) and the buffers
// can be handed to the slow tier for direct I/O (registered once). The arena comes from a
// TierMemory (platforms/): host RAM by default, GPU memory with the CUDA backend; only
// Create's allocation changes. Host pages are committed by the OS when first touched, so a
// large budget costs what is used.
//
// Counters: buffers in use now and at peak, in bytes, for tests that assert the budget.
// Threads: owned and used by the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "platforms/tier_memory.h"

namespace strata {

class FastTier {
 public:
  // floor(budget_bytes / buffer_bytes) buffers, at most max_buffers, allocated from
  // `memory`. Fails when not even one buffer fits (the message names the budget and the
  // buffer size).
  static Status Create(uint64_t budget_bytes, uint64_t buffer_bytes, uint32_t alignment,
                       int64_t max_buffers, std::unique_ptr<FastTier>* out,
                       TierMemory* memory = HostMemory());

  // A free buffer's index, or -1 when all are in use.
  int32_t Acquire();
  void Release(int32_t buffer);
  // The buffer's bytes; not host-addressable when memory()->device().
  std::byte* data(int32_t buffer) const { return arena_.get() + size_t(buffer) * buffer_bytes_; }
  TierMemory* memory() const { return memory_; }

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  uint64_t budget_bytes() const { return budget_; }
  int32_t capacity() const { return capacity_; }
  int32_t free_count() const { return int32_t(free_.size()); }
  int32_t in_use() const { return capacity_ - free_count(); }
  uint64_t bytes_in_use() const { return uint64_t(in_use()) * buffer_bytes_; }
  uint64_t peak_bytes() const { return uint64_t(peak_in_use_) * buffer_bytes_; }
  void* arena() const { return arena_.get(); }
  size_t arena_bytes() const { return arena_bytes_; }

 private:
  FastTier() = default;
  TierArena arena_{nullptr, nullptr};
  size_t arena_bytes_ = 0;
  TierMemory* memory_ = nullptr;
  uint64_t budget_ = 0;
  uint64_t buffer_bytes_ = 0;
  int32_t capacity_ = 0;
  int32_t peak_in_use_ = 0;
  std::vector<int32_t> free_;  // LIFO: a buffer just released is still warm in the caches
};

}  // namespace strata
