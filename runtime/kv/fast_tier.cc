#include "runtime/kv/fast_tier.h"

#include <algorithm>

namespace strata {

Status FastTier::Create(uint64_t budget_bytes, uint64_t buffer_bytes, uint32_t alignment,
                        int64_t max_buffers, std::unique_ptr<FastTier>* out, TierMemory* memory) {
  if (buffer_bytes == 0 || buffer_bytes % alignment != 0)
    return Status::InvalidArgument("fast tier: buffer size " + std::to_string(buffer_bytes) +
                                   " is not a positive multiple of the alignment " +
                                   std::to_string(alignment));
  const int64_t n = std::min<int64_t>(int64_t(budget_bytes / buffer_bytes), max_buffers);
  if (n < 1)
    return Status::ResourceExhausted("fast tier: budget of " + std::to_string(budget_bytes) +
                                     " bytes holds no KV block of " + std::to_string(buffer_bytes) +
                                     " bytes");
  if (n > INT32_MAX / 2)
    return Status::InvalidArgument("fast tier: " + std::to_string(n) + " buffers is too many");
  std::unique_ptr<FastTier> t(new FastTier());
  t->arena_bytes_ = size_t(n) * buffer_bytes;
  Status s = memory->Allocate(t->arena_bytes_, alignment, &t->arena_);
  if (!s.ok()) return s.WithContext("fast tier");
  t->memory_ = memory;
  t->budget_ = budget_bytes;
  t->buffer_bytes_ = buffer_bytes;
  t->capacity_ = int32_t(n);
  t->free_.reserve(size_t(n));
  for (int32_t i = int32_t(n) - 1; i >= 0; --i) t->free_.push_back(i);
  *out = std::move(t);
  return Status::OK();
}

int32_t FastTier::Acquire() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  peak_in_use_ = std::max(peak_in_use_, in_use());
  return b;
}

void FastTier::Release(int32_t buffer) { free_.push_back(buffer); }

}  // namespace strata
