// FastTier: the memory the attention kernel reads KV from, with a hard byte budget.
//
// The budget is cut into equal block buffers once, up front, from one aligned arena (the
// pool), so the bytes in use can never pass the budget (Acquire simply finds none free) and
// the buffers can be handed to the slow tier for direct I/O (registered once). The arena
// comes from a TierMemory (platforms/): host RAM by default, GPU memory with the CUDA
// backend; only Create's allocation changes. Host pages are committed by the OS when first
// touched, so a large budget costs what is used.
//
// A FastTier is one client of its pool with a limit of its own. Share makes another client
// of the same pool: two caches that run in turn (a generator's KV and a verifier's) hold one
// budget between them, each up to its limit, and moving the limits moves memory from one to
// the other without a second arena (so the process never holds more than the budget).
//
// Counters: buffers in use now and at peak, in bytes, per client and for the pool, for tests
// that assert the budget.
// Threads: owned and used by the engine thread (clients of one pool: the same thread).
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
  // buffer size). The client's limit is every buffer.
  static Status Create(uint64_t budget_bytes, uint64_t buffer_bytes, uint32_t alignment,
                       int64_t max_buffers, std::unique_ptr<FastTier>* out,
                       TierMemory* memory = HostMemory());
  // Another client of this pool, allowed `limit` buffers (clamped to [0, pool buffers]).
  std::unique_ptr<FastTier> Share(int32_t limit) const;

  // A free buffer's index, or -1 when the pool has none free or this client is at its limit.
  int32_t Acquire();
  void Release(int32_t buffer);
  // The buffer's bytes; not host-addressable when memory()->device().
  std::byte* data(int32_t buffer) const {
    return pool_->arena.get() + size_t(buffer) * pool_->buffer_bytes;
  }
  TierMemory* memory() const { return pool_->memory; }

  // Buffers this client may hold; lowering it below in_use() leaves the excess to the owner to
  // release (free_count() is 0 until it does).
  void set_limit(int32_t n);
  int32_t limit() const { return limit_; }

  uint64_t buffer_bytes() const { return pool_->buffer_bytes; }
  uint64_t budget_bytes() const { return pool_->budget; }  // the pool's, shared by its clients
  int32_t pool_buffers() const { return pool_->capacity; }
  int32_t capacity() const { return limit_; }
  // Buffers this client can acquire now: within its limit and free in the pool.
  int32_t free_count() const;
  int32_t in_use() const { return in_use_; }
  uint64_t bytes_in_use() const { return uint64_t(in_use_) * pool_->buffer_bytes; }
  uint64_t peak_bytes() const { return uint64_t(peak_in_use_) * pool_->buffer_bytes; }
  // Every client's buffers together: never above budget_bytes().
  uint64_t pool_bytes_in_use() const;
  uint64_t pool_peak_bytes() const { return uint64_t(pool_->peak_in_use) * pool_->buffer_bytes; }
  void* arena() const { return pool_->arena.get(); }
  size_t arena_bytes() const { return pool_->arena_bytes; }

 private:
  struct Pool {
    TierArena arena{nullptr, nullptr};
    size_t arena_bytes = 0;
    TierMemory* memory = nullptr;
    uint64_t budget = 0;
    uint64_t buffer_bytes = 0;
    int32_t capacity = 0;
    int32_t peak_in_use = 0;
    std::vector<int32_t> free;  // LIFO: a buffer just released is still warm in the caches
  };
  FastTier() = default;
  std::shared_ptr<Pool> pool_;
  int32_t limit_ = 0;
  int32_t in_use_ = 0;
  int32_t peak_in_use_ = 0;
};

}  // namespace strata
