#include "runtime/kv/tree/fast_tier.h"

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
  auto pool = std::make_shared<Pool>();
  pool->arena_bytes = size_t(n) * buffer_bytes;
  Status s = memory->Allocate(pool->arena_bytes, alignment, &pool->arena);
  if (!s.ok()) return s.WithContext("fast tier");
  pool->memory = memory;
  pool->budget = budget_bytes;
  pool->buffer_bytes = buffer_bytes;
  pool->capacity = int32_t(n);
  pool->free.reserve(size_t(n));
  for (int32_t i = int32_t(n) - 1; i >= 0; --i) pool->free.push_back(i);
  std::unique_ptr<FastTier> t(new FastTier());
  t->pool_ = std::move(pool);
  t->limit_ = int32_t(n);
  *out = std::move(t);
  return Status::OK();
}

std::unique_ptr<FastTier> FastTier::Share(int32_t limit) const {
  std::unique_ptr<FastTier> t(new FastTier());
  t->pool_ = pool_;
  t->set_limit(limit);
  return t;
}

void FastTier::set_limit(int32_t n) { limit_ = std::clamp(n, 0, pool_->capacity); }

int32_t FastTier::free_count() const {
  return std::max(0, std::min(limit_ - in_use_, int32_t(pool_->free.size())));
}

uint64_t FastTier::pool_bytes_in_use() const {
  return uint64_t(pool_->capacity - int32_t(pool_->free.size())) * pool_->buffer_bytes;
}

int32_t FastTier::Acquire() {
  if (pool_->free.empty() || in_use_ >= limit_) return -1;
  const int32_t b = pool_->free.back();
  pool_->free.pop_back();
  ++in_use_;
  peak_in_use_ = std::max(peak_in_use_, in_use_);
  pool_->peak_in_use = std::max(pool_->peak_in_use, pool_->capacity - int32_t(pool_->free.size()));
  return b;
}

void FastTier::Release(int32_t buffer) {
  pool_->free.push_back(buffer);
  --in_use_;
}

}  // namespace strata
