#include "runtime/kv/tree/prefix_tree_kv.h"

#include <algorithm>
#include <chrono>

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string Bytes(uint64_t b) { return std::to_string(b) + " bytes"; }

}  // namespace

uint64_t PrefixTreeKv::BlockBytes(const KvShape& shape, int32_t block_tokens, uint32_t alignment) {
  const uint64_t piece = 2ull * uint64_t(block_tokens) * uint64_t(shape.row()) * sizeof(uint16_t);
  return uint64_t(shape.n_layer) * RoundUp(piece, std::max<uint32_t>(alignment, 64));
}

PrefixTreeKv::PrefixTreeKv(const KvShape& shape, const PrefixTreeKvOptions& options)
    : shape_(shape),
      options_(options),
      residency_(options.residency),
      write_behind_(options.write_behind) {}

PrefixTreeKv::~PrefixTreeKv() {
  for (auto& io : staging_io_)
    if (io) (void)io->Wait();
  for (Block& b : blocks_)
    if (b.io) (void)b.io->Wait();
}

Status PrefixTreeKv::Create(const KvShape& shape, const PrefixTreeKvOptions& o,
                            std::unique_ptr<SlowTier> slow, std::unique_ptr<PrefixTreeKv>* out) {
  if (shape.n_layer <= 0 || shape.n_head_kv <= 0 || shape.head_dim <= 0 || shape.n_ctx <= 0)
    return Status::InvalidArgument(
        "prefix-tree KV: layers, KV heads, head dim and context must "
        "be > 0");
  if (o.block_tokens < 1 || o.block_tokens > 1024)
    return Status::InvalidArgument("prefix-tree KV: block_tokens " +
                                   std::to_string(o.block_tokens) + " is out of range [1, 1024]");
  if (o.max_blocks < 1 || o.max_blocks > (int64_t(1) << 30))
    return Status::InvalidArgument("prefix-tree KV: max_blocks " + std::to_string(o.max_blocks) +
                                   " is out of range [1, 2^30]");
  if (o.max_sequences < 1)
    return Status::InvalidArgument("prefix-tree KV: max_sequences must be > 0");
  if (!slow) return Status::InvalidArgument("prefix-tree KV: no slow tier");
  std::unique_ptr<PrefixTreeKv> kv(new PrefixTreeKv(shape, o));
  const uint32_t align = std::max<uint32_t>(slow->alignment(), 64);
  kv->piece_stride_ =
      RoundUp(2ull * uint64_t(o.block_tokens) * uint64_t(shape.row()) * sizeof(uint16_t), align);
  kv->block_bytes_ = uint64_t(shape.n_layer) * kv->piece_stride_;
  const uint64_t need = uint64_t(o.max_blocks) * kv->block_bytes_;
  if (slow->capacity() < need)
    return Status::InvalidArgument("prefix-tree KV: the slow tier holds " +
                                   Bytes(slow->capacity()) + ", " + std::to_string(o.max_blocks) +
                                   " blocks need " + Bytes(need));
  // Layer streaming also carves two staging areas (one layer of every block) from the budget.
  const int64_t max_buffers = o.max_blocks + 2 * (o.max_blocks / shape.n_layer + 1);
  TierMemory* memory = o.share_fast ? o.share_fast->memory() : (o.memory ? o.memory : HostMemory());
  if (memory->device() && !slow->moves_device_memory())
    return Status::InvalidArgument(std::string("prefix-tree KV: the slow tier (") +
                                   slow->Describe() + ") cannot move blocks to and from " +
                                   memory->name() + "; use pinned host RAM as the slow tier");
  if (o.share_fast) {
    const uint64_t buf = o.share_fast->buffer_bytes();
    if (buf < kv->block_bytes_ || buf % align != 0)
      return Status::InvalidArgument("prefix-tree KV: the shared fast tier's buffers of " +
                                     Bytes(buf) + " cannot hold a block of " +
                                     Bytes(kv->block_bytes_) + " aligned to " +
                                     std::to_string(align));
    const int64_t limit = std::min<int64_t>(int64_t(o.fast_budget_bytes / buf), max_buffers);
    if (limit < 1)
      return Status::ResourceExhausted("prefix-tree KV: a limit of " + Bytes(o.fast_budget_bytes) +
                                       " holds no buffer of " + Bytes(buf));
    kv->fast_ = o.share_fast->Share(int32_t(std::min<int64_t>(limit, INT32_MAX / 2)));
  } else {
    Status s = FastTier::Create(o.fast_budget_bytes, kv->block_bytes_, align, max_buffers,
                                &kv->fast_, memory);
    if (!s.ok()) return s.WithContext("prefix-tree KV");
  }
  // Fixed buffers only speed io_uring up; a refusal (e.g. RLIMIT_MEMLOCK) is not an error.
  if (!memory->device()) (void)slow->RegisterMemory(kv->fast_->arena(), kv->fast_->arena_bytes());
  kv->slow_ = std::move(slow);
  kv->stream_index_.reserve(size_t(std::min<int64_t>(o.max_blocks, 1 << 20)));
  *out = std::move(kv);
  return Status::OK();
}

PrefixTreeKv::Sequence* PrefixTreeKv::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}
const PrefixTreeKv::Sequence* PrefixTreeKv::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

bool PrefixTreeKv::Pinned(const Block& b) const {
  return b.pin_epoch == epoch_ || b.batch_pin == batch_stamp_;
}

bool PrefixTreeKv::Evictable(const Block& b) const {
  return b.refs > 0 && b.buffer >= 0 && !b.hold && !Pinned(b);
}

uint64_t PrefixTreeKv::SlotOffset(const Block& b) const { return uint64_t(b.slot) * block_bytes_; }

uint16_t* PrefixTreeKv::LayerK(std::byte* base, int32_t layer) const {
  return reinterpret_cast<uint16_t*>(base + uint64_t(layer) * piece_stride_);
}

Status PrefixTreeKv::NewBlock(int32_t pos0, BlockId* out) {
  BlockId id;
  if (!free_blocks_.empty()) {
    id = free_blocks_.back();
    free_blocks_.pop_back();
  } else {
    if (int64_t(blocks_.size()) >= options_.max_blocks)
      return Status::ResourceExhausted("prefix-tree KV: all " +
                                       std::to_string(options_.max_blocks) +
                                       " blocks are in use (max_blocks)");
    id = BlockId(blocks_.size());
    blocks_.emplace_back();
    stream_index_.push_back(-1);
  }
  const int32_t buf = fast_->Acquire();
  if (buf < 0) {
    free_blocks_.push_back(id);
    return Status::Internal("prefix-tree KV: no fast buffer for a new block after making room");
  }
  Block& b = blocks_[id];
  b = Block();
  b.pos0 = pos0;
  b.refs = 1;
  b.buffer = buf;
  if (pin_active_) b.pin_epoch = epoch_;  // it belongs to the pinned group's working set
  b.batch_pin = batch_stamp_;
  b.batch_mark = batch_stamp_;
  b.last_use = ++tick_;
  ++c_.live_blocks;
  c_.peak_live_blocks = std::max(c_.peak_live_blocks, c_.live_blocks);
  *out = id;
  return Status::OK();
}

void PrefixTreeKv::Ref(BlockId b) { ++blocks_[b].refs; }

Status PrefixTreeKv::Unref(BlockId id) {
  Block& b = blocks_[id];
  if (--b.refs > 0) return Status::OK();
  Status s = WaitIo(b);
  if (b.buffer >= 0) fast_->Release(b.buffer);
  if (b.slot >= 0) free_slots_.push_back(b.slot);
  b = Block();
  free_blocks_.push_back(id);
  --c_.live_blocks;
  return s;
}

Status PrefixTreeKv::AddSequence(SeqId* out) {
  if (int32_t(seqs_.size()) >= options_.max_sequences)
    return Status::ResourceExhausted("prefix-tree KV: already " + std::to_string(seqs_.size()) +
                                     " sequences, the limit is " +
                                     std::to_string(options_.max_sequences));
  const SeqId id = next_seq_++;
  seqs_[id] = Sequence();
  *out = id;
  return Status::OK();
}

Status PrefixTreeKv::RemoveSequence(SeqId seq) {
  if (batch_index_.count(seq))
    return Status::InvalidArgument("prefix-tree KV: sequence " + std::to_string(seq) +
                                   " is in the open batch");
  auto it = seqs_.find(seq);
  if (it == seqs_.end())
    return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(seq));
  Status first;
  for (BlockId b : it->second.path) {
    Status s = Unref(b);
    if (first.ok() && !s.ok()) first = s;
  }
  seqs_.erase(it);
  return first;
}

Status PrefixTreeKv::ForkSequence(SeqId src, SeqId* out) {
  if (batch_index_.count(src))
    return Status::InvalidArgument("prefix-tree KV: cannot fork sequence " + std::to_string(src) +
                                   " while it is in the open batch");
  if (!Find(src)) return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(src));
  SeqId id;
  STRATA_RETURN_IF_ERROR(AddSequence(&id));
  Sequence& d = seqs_[id];
  d = seqs_[src];
  for (BlockId b : d.path) Ref(b);
  *out = id;
  return Status::OK();
}

Status PrefixTreeKv::Truncate(SeqId seq, int32_t length) {
  if (!batch_.empty())
    return Status::Internal("prefix-tree KV: truncating a sequence while a batch is open");
  Sequence* s = Find(seq);
  if (!s) return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(seq));
  if (length < 0 || length > s->length)
    return Status::InvalidArgument("prefix-tree KV: sequence " + std::to_string(seq) + " has " +
                                   std::to_string(s->length) + " tokens, cannot keep " +
                                   std::to_string(length));
  const int32_t B = options_.block_tokens;
  const size_t keep = size_t((length + B - 1) / B);
  // The block the new end falls in, when partly kept and shared: copy it first, so that a
  // failure (no room, a read error) leaves the sequence as it was.
  BlockId copy = -1;
  if (length % B != 0 && blocks_[s->path[keep - 1]].refs > 1) {
    const BlockId src = s->path[keep - 1];
    Block& b = blocks_[src];
    const uint32_t saved_pin = b.batch_pin;
    b.batch_pin = batch_stamp_;  // not a victim of the room made for its copy
    Status st = MakeRoom(b.buffer < 0 ? 2 : 1, /*streaming_batch=*/false);
    if (st.ok() && b.buffer < 0) st = Load({src});
    if (st.ok() && b.loading) st = WaitIo(b);
    if (st.ok()) st = NewBlock(b.pos0, &copy);
    blocks_[src].batch_pin = saved_pin;
    if (!st.ok()) return st;
    Block& c = blocks_[copy];
    c.batch_pin = 0;
    fast_->memory()->Copy(fast_->data(c.buffer), fast_->data(blocks_[src].buffer), block_bytes_);
    ++c_.cow_copies;
  }
  Status first;
  auto drop = [&](BlockId b) {
    Status u = Unref(b);
    if (first.ok() && !u.ok()) first = u;
  };
  while (s->path.size() > keep) {
    drop(s->path.back());
    s->path.pop_back();
  }
  if (copy >= 0) {
    drop(s->path.back());
    s->path.back() = copy;
  }
  if (length % B != 0) blocks_[s->path.back()].n_tokens = length % B;
  s->length = length;
  return first;
}

int32_t PrefixTreeKv::Length(SeqId seq) const {
  const Sequence* s = Find(seq);
  return s ? s->length : 0;
}

Status PrefixTreeKv::Path(SeqId seq, std::vector<BlockId>* out) const {
  const Sequence* s = Find(seq);
  if (!s) return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(seq));
  *out = s->path;
  return Status::OK();
}

int32_t PrefixTreeKv::NewBlocksFor(SeqId seq, int32_t n_new) const {
  const Sequence* s = Find(seq);
  if (!s || n_new <= 0) return 0;
  const int32_t B = options_.block_tokens;
  int32_t room = 0, cow = 0;
  if (s->length % B != 0) {
    room = B - s->length % B;
    cow = blocks_[s->path.back()].refs > 1 ? 1 : 0;
  }
  return cow + (std::max(0, n_new - room) + B - 1) / B;
}

Status PrefixTreeKv::BeginBatch(std::span<const BatchSeq> batch) {
  if (!batch_.empty()) return Status::Internal("prefix-tree KV: BeginBatch while a batch is open");
  if (batch.empty()) return Status::InvalidArgument("prefix-tree KV: empty batch");
  const int32_t B = options_.block_tokens;
  std::map<SeqId, size_t> index;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchSeq& bs = batch[i];
    const Sequence* s = Find(bs.seq);
    if (!s) return Status::NotFound("prefix-tree KV: no sequence " + std::to_string(bs.seq));
    if (bs.pos0 != s->length)
      return Status::InvalidArgument("prefix-tree KV: sequence " + std::to_string(bs.seq) +
                                     " has " + std::to_string(s->length) +
                                     " tokens, batch starts at position " +
                                     std::to_string(bs.pos0));
    if (bs.n_new <= 0)
      return Status::InvalidArgument("prefix-tree KV: sequence " + std::to_string(bs.seq) +
                                     " gets " + std::to_string(bs.n_new) + " tokens");
    if (int64_t(s->length) + bs.n_new > shape_.n_ctx)
      return Status::OutOfRange("context full: sequence " + std::to_string(bs.seq) + " has " +
                                std::to_string(s->length) + " tokens + " +
                                std::to_string(bs.n_new) + " new > context length " +
                                std::to_string(shape_.n_ctx));
    if (!index.emplace(bs.seq, i).second)
      return Status::InvalidArgument("prefix-tree KV: sequence " + std::to_string(bs.seq) +
                                     " appears twice in one batch");
  }
  const uint32_t stamp = ++batch_stamp_;
  const bool streaming = residency_ == KvResidency::kLayerStreaming;
  // Plan without changing anything visible: which tails are copied, how many blocks are new,
  // what must be loaded. Siblings sharing a partial tail copy it, except the last sharer.
  std::map<BlockId, int32_t> refs_left;
  std::vector<uint8_t> cow(batch.size(), 0);
  std::vector<BlockId> missing;
  int32_t n_new_blocks = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *Find(batch[i].seq);
    for (BlockId id : s.path) {
      Block& b = blocks_[id];
      b.last_use = ++tick_;
      if (b.batch_mark == stamp) continue;
      b.batch_mark = stamp;
      if (!streaming) {
        b.batch_pin = stamp;
        if (b.buffer < 0) missing.push_back(id);
      }
    }
    int32_t room = 0;
    if (s.length % B != 0) {
      const BlockId t = s.path.back();
      Block& tb = blocks_[t];
      room = B - s.length % B;
      auto it = refs_left.try_emplace(t, tb.refs).first;
      if (it->second > 1) {
        cow[i] = 1;
        --it->second;
        ++n_new_blocks;
      }
      if (streaming && tb.batch_pin != stamp) {
        tb.batch_pin = stamp;
        if (tb.buffer < 0) missing.push_back(t);
      }
    }
    n_new_blocks += (std::max(0, batch[i].n_new - room) + B - 1) / B;
  }
  Status st;
  if (int64_t(c_.live_blocks) + n_new_blocks > options_.max_blocks)
    st = Status::ResourceExhausted("prefix-tree KV: " + std::to_string(c_.live_blocks) +
                                   " live blocks + " + std::to_string(n_new_blocks) +
                                   " new exceed max_blocks " + std::to_string(options_.max_blocks));
  if (st.ok()) st = MakeRoom(int32_t(missing.size()) + n_new_blocks, streaming);
  if (st.ok()) st = Load(missing);
  for (size_t i = 0; st.ok() && i < blocks_.size(); ++i)
    if (blocks_[i].batch_mark == stamp && blocks_[i].loading) st = WaitIo(blocks_[i]);
  if (!st.ok()) {
    ++batch_stamp_;
    return st;
  }

  batch_.assign(batch.begin(), batch.end());
  batch_index_ = std::move(index);
  for (size_t i = 0; i < batch.size() && st.ok(); ++i) {
    Sequence& s = *Find(batch[i].seq);
    if (cow[i]) {
      const BlockId src = s.path.back();
      BlockId copy;
      st = NewBlock(blocks_[src].pos0, &copy);
      if (!st.ok()) break;
      fast_->memory()->Copy(fast_->data(blocks_[copy].buffer), fast_->data(blocks_[src].buffer),
                            block_bytes_);
      blocks_[copy].n_tokens = blocks_[src].n_tokens;
      s.path.back() = copy;
      st = Unref(src);
      ++c_.cow_copies;
    }
    for (int32_t have = int32_t(s.path.size()) * B; st.ok() && have < s.length + batch[i].n_new;
         have += B) {
      BlockId id;
      st = NewBlock(have, &id);
      if (st.ok()) s.path.push_back(id);
    }
    s.pending = batch[i].n_new;
  }
  reserved_ = std::max(0, reserved_ - n_new_blocks);
  if (st.ok() && streaming) {
    for (const BatchSeq& bs : batch_)
      for (BlockId id : Find(bs.seq)->path)
        if (blocks_[id].buffer < 0 && stream_index_[id] < 0) {
          stream_index_[id] = int32_t(streamed_.size());
          streamed_.push_back(id);
        }
    const int32_t L = shape_.n_layer;
    const int32_t per_area = (int32_t(streamed_.size()) + L - 1) / L;
    for (int area = 0; area < 2 && st.ok(); ++area)
      for (int32_t j = 0; j < per_area && st.ok(); ++j) {
        const int32_t buf = fast_->Acquire();
        if (buf < 0)
          st = Status::Internal("prefix-tree KV: no fast buffer for layer staging");
        else
          staging_[area].push_back(buf);
      }
  }
  if (!st.ok()) {
    AbortBatch();
    return st;
  }
  views_.resize(batch_.size() * size_t(shape_.n_layer));
  return Status::OK();
}

Status PrefixTreeKv::Prepare(int32_t layer, const float*, int64_t) {
  if (batch_.empty() || streamed_.empty() || layer < 0 || layer >= shape_.n_layer)
    return Status::OK();
  return StartStagingRead(layer);
}

Status PrefixTreeKv::Append(int32_t layer, SeqId seq, const float* k, const float* v) {
  if (!batch_index_.count(seq) || layer < 0 || layer >= shape_.n_layer)
    return Status::InvalidArgument("prefix-tree KV: append to sequence " + std::to_string(seq) +
                                   " layer " + std::to_string(layer) + " outside the open batch");
  const Sequence& s = seqs_[seq];
  const int32_t B = options_.block_tokens;
  const int64_t row = shape_.row();
  for (int32_t t = 0; t < s.pending;) {
    const int32_t pos = s.length + t;
    const int32_t off = pos % B;
    const int32_t n = std::min(s.pending - t, B - off);
    Block& b = blocks_[s.path[size_t(pos / B)]];
    if (b.buffer < 0) return Status::Internal("prefix-tree KV: appending to an evicted block");
    uint16_t* kd = LayerK(fast_->data(b.buffer), layer);
    fast_->memory()->StoreF16(kd + off * row, k + t * row, n * row);
    fast_->memory()->StoreF16(kd + (B + off) * row, v + t * row, n * row);
    b.slow_valid = false;
    t += n;
  }
  return Status::OK();
}

Status PrefixTreeKv::View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) {
  auto it = batch_index_.find(seq);
  if (it == batch_index_.end() || layer < 0 || layer >= shape_.n_layer)
    return Status::InvalidArgument("prefix-tree KV: view of sequence " + std::to_string(seq) +
                                   " layer " + std::to_string(layer) + " outside the open batch");
  const int area = layer & 1;
  if (!streamed_.empty()) {
    if (staging_layer_[area] != layer) STRATA_RETURN_IF_ERROR(StartStagingRead(layer));
    if (staging_io_[area]) {
      const auto t0 = Clock::now();
      Status s = staging_io_[area]->Wait();
      c_.stall_seconds += Since(t0);
      staging_io_[area].reset();
      if (!s.ok()) return s.WithContext("prefix-tree KV: reading layer " + std::to_string(layer));
    }
  }
  const Sequence& s = seqs_[seq];
  const int32_t B = options_.block_tokens, L = shape_.n_layer;
  const int32_t row = shape_.row(), end = s.length + s.pending;
  std::vector<kernels::KvSpan>& v = views_[it->second * size_t(L) + size_t(layer)];
  v.clear();
  for (BlockId id : s.path) {
    const Block& b = blocks_[id];
    uint16_t* k;
    if (b.buffer >= 0) {
      k = LayerK(fast_->data(b.buffer), layer);
    } else if (stream_index_[id] >= 0) {
      const int32_t i = stream_index_[id];
      k = LayerK(fast_->data(staging_[area][i / L]) + (i % L) * piece_stride_, 0);
    } else {
      return Status::Internal("prefix-tree KV: block of sequence " + std::to_string(seq) +
                              " is neither resident nor streamed");
    }
    v.push_back({k, k + size_t(B) * row, std::min(B, end - b.pos0), b.pos0, row});
  }
  *out = v;
  return Status::OK();
}

Status PrefixTreeKv::EndBatch() {
  if (batch_.empty()) return Status::Internal("prefix-tree KV: EndBatch without a batch");
  Status st = ReleaseStaging();
  const int32_t B = options_.block_tokens;
  std::vector<BlockId> filled;
  for (const BatchSeq& bs : batch_) {
    Sequence& s = seqs_[bs.seq];
    const int32_t end = s.length + s.pending;
    for (int32_t i = s.length / B; i * B < end; ++i) {
      Block& b = blocks_[s.path[size_t(i)]];
      b.n_tokens = std::min(B, end - i * B);
      if (b.n_tokens == B && !b.slow_valid && write_behind_) filled.push_back(s.path[i]);
    }
    s.length = end;
    s.pending = 0;
  }
  batch_.clear();
  batch_index_.clear();
  ++batch_stamp_;
  if (st.ok()) st = WriteBlocks(filled, /*wait=*/false);
  return st;
}

void PrefixTreeKv::AbortBatch() {
  (void)ReleaseStaging();
  const int32_t B = options_.block_tokens;
  for (const BatchSeq& bs : batch_) {
    Sequence* s = Find(bs.seq);
    if (!s) continue;
    s->pending = 0;
    while (int32_t(s->path.size()) > (s->length + B - 1) / B) {
      (void)Unref(s->path.back());
      s->path.pop_back();
    }
  }
  batch_.clear();
  batch_index_.clear();
  ++batch_stamp_;
}

KvCounters PrefixTreeKv::counters() const {
  KvCounters k;
  k.bytes_read = c_.bytes_read;
  k.bytes_written = c_.bytes_written;
  k.reads_issued = c_.blocks_loaded + c_.layer_reads;
  k.io_wait_seconds = c_.stall_seconds;
  k.resident_bytes = fast_->bytes_in_use();
  k.peak_resident_bytes = fast_->peak_bytes();
  k.budget_bytes = fast_->budget_bytes();
  k.write_requests = c_.blocks_written;
  return k;
}

PrefixTreeCounters PrefixTreeKv::tree_counters() const {
  PrefixTreeCounters c = c_;
  c.shared_blocks = 0;
  for (const Block& b : blocks_)
    if (b.refs > 1) ++c.shared_blocks;
  c.block_bytes = block_bytes_;
  c.fast_budget_bytes = fast_->budget_bytes();
  c.fast_bytes_in_use = fast_->bytes_in_use();
  c.peak_fast_bytes = fast_->peak_bytes();
  return c;
}

Status PrefixTreeKv::CheckInvariants() const {
  auto fail = [](const std::string& m) {
    return Status::Internal("prefix-tree KV invariant: " + m);
  };
  const int32_t B = options_.block_tokens;
  std::vector<int32_t> refs(blocks_.size(), 0);
  for (const auto& [id, s] : seqs_) {
    const int32_t end = s.length + s.pending;
    if (int32_t(s.path.size()) != (end + B - 1) / B)
      return fail("sequence " + std::to_string(id) + " has " + std::to_string(s.path.size()) +
                  " blocks for " + std::to_string(end) + " tokens");
    for (size_t i = 0; i < s.path.size(); ++i) {
      const BlockId b = s.path[i];
      if (b < 0 || size_t(b) >= blocks_.size()) return fail("bad block id");
      ++refs[size_t(b)];
      if (blocks_[b].pos0 != int32_t(i) * B) return fail("block at the wrong position");
      if (s.pending == 0 && blocks_[b].n_tokens != std::min(B, s.length - int32_t(i) * B))
        return fail("block " + std::to_string(b) + " holds " + std::to_string(blocks_[b].n_tokens) +
                    " tokens, its path says otherwise");
    }
  }
  int32_t buffers = int32_t(staging_[0].size() + staging_[1].size());
  uint64_t live = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.refs != refs[i])
      return fail("block " + std::to_string(i) + " counts " + std::to_string(b.refs) +
                  " references, paths hold " + std::to_string(refs[i]));
    if (b.refs == 0) {
      if (b.buffer >= 0 || b.slot >= 0) return fail("free block keeps a buffer or slot");
      continue;
    }
    ++live;
    if (b.buffer >= 0)
      ++buffers;
    else if (b.slot < 0 || !b.slow_valid)
      return fail("block " + std::to_string(i) + " is lost");
  }
  if (live != c_.live_blocks) return fail("live block count");
  if (buffers != fast_->in_use()) return fail("fast-tier buffers leaked or double counted");
  if (fast_->peak_bytes() > fast_->budget_bytes() ||
      fast_->pool_peak_bytes() > fast_->budget_bytes())
    return fail("fast tier exceeded its budget");
  if (batch_.empty() && !pin_active_ && buffers > fast_->limit())
    return fail("fast tier holds " + std::to_string(buffers) + " buffers over its limit of " +
                std::to_string(fast_->limit()));
  return Status::OK();
}

}  // namespace strata
