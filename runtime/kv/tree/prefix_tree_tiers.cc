// Residency of the prefix tree's blocks: eviction to and loading from the slow tier, group
// pinning and prefetch for the beam scheduler, and the per-layer staging of the layer-streaming
// baseline. The tree itself (paths, references, copy on write, the batch protocol) is in
// prefix_tree_kv.cc.
#include <algorithm>
#include <chrono>

#include "runtime/kv/tree/prefix_tree_kv.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string Bytes(uint64_t b) { return std::to_string(b) + " bytes"; }

}  // namespace

Status PrefixTreeKv::WaitIo(Block& b) {
  if (!b.io) return Status::OK();
  const auto t0 = Clock::now();
  Status s = b.io->Wait();
  c_.stall_seconds += Since(t0);
  b.io.reset();
  if (!s.ok() && b.loading && b.buffer >= 0) {
    // A failed read leaves garbage: the block is only in the slow tier again.
    fast_->Release(b.buffer);
    b.buffer = -1;
  } else if (!s.ok() && !b.loading) {
    b.slow_valid = false;  // a failed write: the fast copy is the only one
  }
  b.loading = false;
  return s;
}

int32_t PrefixTreeKv::CountStreamed() const {
  int32_t x = 0;
  for (const Block& b : blocks_)
    if (b.refs > 0 && b.batch_mark == batch_stamp_ && b.buffer < 0 && b.batch_pin != batch_stamp_)
      ++x;
  return x;
}

Status PrefixTreeKv::MakeRoom(int32_t need, bool streaming_batch) {
  const int32_t L = shape_.n_layer;
  int32_t streamed = streaming_batch ? CountStreamed() : 0;
  auto staging = [&](int32_t x) { return x > 0 ? 2 * ((x + L - 1) / L) : 0; };
  auto enough = [&](int32_t freed) {
    return fast_->free_count() + freed >= need + staging(streamed);
  };
  if (enough(0)) return Status::OK();
  std::vector<BlockId> cand;
  for (BlockId i = 0; i < BlockId(blocks_.size()); ++i)
    if (Evictable(blocks_[i])) cand.push_back(i);
  // Clean blocks cost nothing to drop; among equals the least recently used goes first.
  std::sort(cand.begin(), cand.end(), [&](BlockId a, BlockId b) {
    const Block &x = blocks_[a], &y = blocks_[b];
    if (x.slow_valid != y.slow_valid) return x.slow_valid;
    return x.last_use != y.last_use ? x.last_use < y.last_use : a < b;
  });
  std::vector<BlockId> victims, dirty;
  for (BlockId v : cand) {
    if (enough(int32_t(victims.size()))) break;
    victims.push_back(v);
    if (streaming_batch && blocks_[v].batch_mark == batch_stamp_) ++streamed;
  }
  if (!enough(int32_t(victims.size())))
    return Status::ResourceExhausted(
        "prefix-tree KV: the fast-tier budget of " + Bytes(fast_->budget_bytes()) + " (" +
        std::to_string(fast_->capacity()) + " blocks of " + Bytes(block_bytes_) +
        ") is too small: this pass needs " + std::to_string(need + staging(streamed)) +
        " free blocks beyond the " + std::to_string(fast_->in_use() - int32_t(victims.size())) +
        " it must keep");
  for (BlockId v : victims)
    if (!blocks_[v].slow_valid) dirty.push_back(v);
  STRATA_RETURN_IF_ERROR(WriteBlocks(dirty, /*wait=*/true));
  for (BlockId v : victims) {
    Block& b = blocks_[v];
    STRATA_RETURN_IF_ERROR(WaitIo(b));
    fast_->Release(b.buffer);
    b.buffer = -1;
  }
  return Status::OK();
}

Status PrefixTreeKv::SetFastLimit(int32_t blocks) {
  if (!batch_.empty() || pin_active_)
    return Status::Internal("prefix-tree KV: the fast-tier limit moves only between batches");
  if (blocks < 1 || blocks > fast_->pool_buffers())
    return Status::InvalidArgument("prefix-tree KV: fast-tier limit " + std::to_string(blocks) +
                                   " is out of range [1, " + std::to_string(fast_->pool_buffers()) +
                                   "]");
  fast_->set_limit(blocks);
  const int32_t over = fast_->in_use() - blocks;
  // Over the limit free_count() is 0, so making room for `over` evicts exactly the excess.
  return over > 0 ? MakeRoom(over, false) : Status::OK();
}

Status PrefixTreeKv::WriteBlocks(const std::vector<BlockId>& ids, bool wait) {
  if (ids.empty()) return Status::OK();
  std::vector<TierExtent> ext;
  ext.reserve(ids.size());
  for (BlockId id : ids) {
    Block& b = blocks_[id];
    if (b.slot < 0) {
      if (!free_slots_.empty()) {
        b.slot = free_slots_.back();
        free_slots_.pop_back();
      } else {
        b.slot = next_slot_++;
      }
    }
    ext.push_back({SlotOffset(b), fast_->data(b.buffer), uint32_t(block_bytes_)});
  }
  std::unique_ptr<TierTransfer> t;
  STRATA_RETURN_IF_ERROR(slow_->Write(ext, &t));
  c_.bytes_written += uint64_t(ids.size()) * block_bytes_;
  c_.blocks_written += ids.size();
  for (BlockId id : ids) blocks_[id].slow_valid = true;
  if (wait) {
    const auto t0 = Clock::now();
    Status s = t->Wait();
    c_.stall_seconds += Since(t0);
    if (!s.ok())
      for (BlockId id : ids) blocks_[id].slow_valid = false;
    return s.WithContext("prefix-tree KV: evicting blocks");
  }
  std::shared_ptr<TierTransfer> shared(std::move(t));
  for (BlockId id : ids) blocks_[id].io = shared;
  return Status::OK();
}

Status PrefixTreeKv::Load(const std::vector<BlockId>& ids) {
  if (ids.empty()) return Status::OK();
  std::vector<TierExtent> ext;
  ext.reserve(ids.size());
  for (BlockId id : ids) {
    Block& b = blocks_[id];
    b.buffer = fast_->Acquire();
    if (b.buffer < 0)
      return Status::Internal("prefix-tree KV: no fast buffer to load a block into");
    ext.push_back({SlotOffset(b), fast_->data(b.buffer), uint32_t(block_bytes_)});
  }
  std::unique_ptr<TierTransfer> t;
  Status started = slow_->Read(ext, &t);
  if (!started.ok()) {
    for (BlockId id : ids) {
      fast_->Release(blocks_[id].buffer);
      blocks_[id].buffer = -1;
    }
    return started;
  }
  c_.bytes_read += uint64_t(ids.size()) * block_bytes_;
  c_.blocks_loaded += ids.size();
  const auto t0 = Clock::now();
  Status s = t->Wait();
  c_.stall_seconds += Since(t0);
  if (!s.ok())
    for (BlockId id : ids) {
      fast_->Release(blocks_[id].buffer);
      blocks_[id].buffer = -1;
    }
  return s.WithContext("prefix-tree KV: loading blocks");
}

Status PrefixTreeKv::Pin(std::span<const SeqId> seqs, int32_t reserve) {
  if (!batch_.empty()) return Status::Internal("prefix-tree KV: Pin with a batch open");
  ++epoch_;
  reserved_ = 0;
  pin_active_ = false;
  for (Block& b : blocks_) b.hold = false;
  std::vector<BlockId> pinned, missing;
  for (SeqId sq : seqs) {
    const Sequence* s = Find(sq);
    if (!s) return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(sq));
    for (BlockId id : s->path) {
      Block& b = blocks_[id];
      b.last_use = ++tick_;
      if (b.pin_epoch == epoch_) continue;
      b.pin_epoch = epoch_;
      pinned.push_back(id);
      if (b.buffer < 0) missing.push_back(id);
    }
  }
  if (int64_t(pinned.size()) + reserve > fast_->capacity())
    return Status::ResourceExhausted(
        "prefix-tree KV: a group of " + std::to_string(seqs.size()) + " sequences needs " +
        std::to_string(pinned.size() + size_t(reserve)) + " blocks of " + Bytes(block_bytes_) +
        ", the fast-tier budget of " + Bytes(fast_->budget_bytes()) + " holds " +
        std::to_string(fast_->capacity()));
  STRATA_RETURN_IF_ERROR(MakeRoom(int32_t(missing.size()) + reserve, false));
  STRATA_RETURN_IF_ERROR(Load(missing));
  for (BlockId id : pinned) STRATA_RETURN_IF_ERROR(WaitIo(blocks_[id]));
  reserved_ = reserve;
  pin_active_ = true;
  return Status::OK();
}

bool PrefixTreeKv::ReserveMore(int32_t extra) {
  if (!pin_active_ || !batch_.empty() || extra < 0) return false;
  int32_t spare = fast_->free_count() - reserved_;
  for (const Block& b : blocks_)
    if (Evictable(b)) ++spare;
  if (spare < extra) return false;
  reserved_ += extra;
  return true;
}

void PrefixTreeKv::Unpin() {
  ++epoch_;
  reserved_ = 0;
  pin_active_ = false;
}

Status PrefixTreeKv::Prefetch(std::span<const SeqId> seqs, int32_t max_blocks, int32_t* started) {
  *started = 0;
  if (!batch_.empty()) return Status::Internal("prefix-tree KV: Prefetch with a batch open");
  std::vector<BlockId> want;
  const uint32_t mark = ++batch_stamp_;  // a stamp no open batch uses: dedupes the list
  for (SeqId sq : seqs) {
    const Sequence* s = Find(sq);
    if (!s) return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(sq));
    for (BlockId id : s->path) {
      Block& b = blocks_[id];
      if (b.batch_mark == mark || b.buffer >= 0) continue;
      b.batch_mark = mark;
      want.push_back(id);
    }
  }
  // Victims: clean, unpinned, nothing in flight; least recently used first.
  std::vector<BlockId> clean;
  for (BlockId i = 0; i < BlockId(blocks_.size()); ++i) {
    const Block& b = blocks_[i];
    if (Evictable(b) && b.slow_valid && (!b.io || b.io->Done())) clean.push_back(i);
  }
  std::sort(clean.begin(), clean.end(),
            [&](BlockId a, BlockId b) { return blocks_[a].last_use < blocks_[b].last_use; });
  size_t next_victim = 0;
  std::vector<TierExtent> ext;
  std::vector<BlockId> loading;
  for (BlockId id : want) {
    if (int32_t(loading.size()) >= max_blocks) break;
    if (fast_->free_count() <= reserved_) {
      if (next_victim == clean.size()) break;
      Block& v = blocks_[clean[next_victim++]];
      STRATA_RETURN_IF_ERROR(WaitIo(v));
      fast_->Release(v.buffer);
      v.buffer = -1;
    }
    Block& b = blocks_[id];
    b.buffer = fast_->Acquire();
    b.hold = true;
    b.loading = true;
    ext.push_back({SlotOffset(b), fast_->data(b.buffer), uint32_t(block_bytes_)});
    loading.push_back(id);
  }
  if (loading.empty()) return Status::OK();
  std::unique_ptr<TierTransfer> t;
  STRATA_RETURN_IF_ERROR(slow_->Read(ext, &t));
  std::shared_ptr<TierTransfer> shared(std::move(t));
  for (BlockId id : loading) blocks_[id].io = shared;
  c_.bytes_read += uint64_t(loading.size()) * block_bytes_;
  c_.blocks_loaded += loading.size();
  c_.blocks_prefetched += loading.size();
  *started = int32_t(loading.size());
  return Status::OK();
}

Status PrefixTreeKv::StartStagingRead(int32_t layer) {
  const int area = layer & 1;
  if (staging_io_[area]) {
    const auto t0 = Clock::now();
    Status s = staging_io_[area]->Wait();
    c_.stall_seconds += Since(t0);
    staging_io_[area].reset();
    STRATA_RETURN_IF_ERROR(s);
  }
  const int32_t L = shape_.n_layer;
  std::vector<TierExtent> ext(streamed_.size());
  for (size_t i = 0; i < streamed_.size(); ++i)
    ext[i] = {SlotOffset(blocks_[streamed_[i]]) + uint64_t(layer) * piece_stride_,
              fast_->data(staging_[area][i / L]) + (i % L) * piece_stride_,
              uint32_t(piece_stride_)};
  STRATA_RETURN_IF_ERROR(slow_->Read(ext, &staging_io_[area]));
  staging_layer_[area] = layer;
  c_.bytes_read += streamed_.size() * piece_stride_;
  c_.layer_reads += streamed_.size();
  return Status::OK();
}

Status PrefixTreeKv::ReleaseStaging() {
  Status first;
  for (int area = 0; area < 2; ++area) {
    if (staging_io_[area]) {
      Status s = staging_io_[area]->Wait();
      if (first.ok()) first = s;
      staging_io_[area].reset();
    }
    for (int32_t buf : staging_[area]) fast_->Release(buf);
    staging_[area].clear();
    staging_layer_[area] = -1;
  }
  for (BlockId id : streamed_) stream_index_[id] = -1;
  streamed_.clear();
  return first;
}

}  // namespace strata
