#include "runtime/kv/memory_kv.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace strata {

// One mapping per sequence holds [layer][K|V][n_ctx][row] F16 values.
struct MemoryKv::Sequence {
  uint16_t* base = nullptr;
  size_t map_bytes = 0;
  TierArena arena{nullptr, nullptr};   // device memory (base points into it), else empty
  int32_t length = 0;                  // committed tokens
  int32_t pending = 0;                 // tokens of the batch in flight
  std::vector<kernels::KvSpan> views;  // one per layer

  ~Sequence() {
    if (base && !arena) munmap(base, map_bytes);
  }
};

MemoryKv::MemoryKv(const KvShape& shape, int32_t max_sequences)
    : shape_(shape), max_sequences_(max_sequences) {}
MemoryKv::~MemoryKv() = default;

Status MemoryKv::Create(const KvShape& shape, int32_t max_sequences, std::unique_ptr<MemoryKv>* out,
                        TierMemory* memory) {
  if (shape.n_layer <= 0 || shape.n_head_kv <= 0 || shape.head_dim <= 0 || shape.n_ctx <= 0)
    return Status::InvalidArgument("memory KV: layers, KV heads, head dim and context must be > 0");
  if (max_sequences <= 0)
    return Status::InvalidArgument("memory KV: max_sequences must be > 0, got " +
                                   std::to_string(max_sequences));
  out->reset(new MemoryKv(shape, max_sequences));
  if (memory && memory->device()) (*out)->memory_ = memory;
  return Status::OK();
}

MemoryKv::Sequence* MemoryKv::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}
const MemoryKv::Sequence* MemoryKv::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}

Status MemoryKv::AddSequence(SeqId* out) {
  if (int32_t(seqs_.size()) >= max_sequences_)
    return Status::ResourceExhausted("memory KV: already " + std::to_string(seqs_.size()) +
                                     " sequences, the limit is " + std::to_string(max_sequences_));
  auto s = std::make_unique<Sequence>();
  s->map_bytes = size_t(shape_.n_layer) * 2 * shape_.n_ctx * shape_.row() * sizeof(uint16_t);
  if (memory_) {
    Status st = memory_->Allocate(s->map_bytes, 256, &s->arena);
    if (!st.ok())
      return st.WithContext("memory KV: a sequence of " + std::to_string(shape_.n_ctx) + " tokens");
    s->base = reinterpret_cast<uint16_t*>(s->arena.get());
  } else {
    void* p = mmap(nullptr, s->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      return Status::FromErrno("memory KV: reserving " + std::to_string(s->map_bytes) + " bytes",
                               errno);
    s->base = static_cast<uint16_t*>(p);
  }
  s->views.resize(shape_.n_layer);
  SeqId id = next_id_++;
  seqs_[id] = std::move(s);
  *out = id;
  return Status::OK();
}

Status MemoryKv::RemoveSequence(SeqId seq) {
  if (seqs_.erase(seq) == 0)
    return Status::NotFound("memory KV: no sequence " + std::to_string(seq));
  return Status::OK();
}

Status MemoryKv::ForkSequence(SeqId src, SeqId* out) {
  const Sequence* s = Find(src);
  if (!s) return Status::NotFound("memory KV: no sequence " + std::to_string(src));
  SeqId id;
  STRATA_RETURN_IF_ERROR(AddSequence(&id));
  Sequence* d = Find(id);
  const size_t plane = size_t(shape_.n_ctx) * shape_.row();
  const size_t used = size_t(s->length) * shape_.row() * sizeof(uint16_t);
  for (int32_t p = 0; p < 2 * shape_.n_layer; ++p) {
    if (memory_)
      memory_->Copy(d->base + p * plane, s->base + p * plane, used);
    else
      std::memcpy(d->base + p * plane, s->base + p * plane, used);
  }
  d->length = s->length;
  *out = id;
  return Status::OK();
}

int32_t MemoryKv::Length(SeqId seq) const {
  const Sequence* s = Find(seq);
  return s ? s->length : 0;
}

Status MemoryKv::BeginBatch(std::span<const BatchSeq> batch) {
  for (const BatchSeq& b : batch) {
    const Sequence* s = Find(b.seq);
    if (!s) return Status::NotFound("memory KV: no sequence " + std::to_string(b.seq));
    if (b.pos0 != s->length)
      return Status::InvalidArgument("memory KV: sequence " + std::to_string(b.seq) + " has " +
                                     std::to_string(s->length) +
                                     " tokens, batch starts at position " + std::to_string(b.pos0));
    if (int64_t(s->length) + b.n_new > shape_.n_ctx)
      return Status::OutOfRange("context full: sequence " + std::to_string(b.seq) + " has " +
                                std::to_string(s->length) + " tokens + " + std::to_string(b.n_new) +
                                " new > context length " + std::to_string(shape_.n_ctx));
  }
  batch_.assign(batch.begin(), batch.end());
  for (const BatchSeq& b : batch_) Find(b.seq)->pending = b.n_new;
  return Status::OK();
}

Status MemoryKv::Append(int32_t layer, SeqId seq, const float* k, const float* v) {
  Sequence* s = Find(seq);
  if (!s || layer < 0 || layer >= shape_.n_layer)
    return Status::InvalidArgument("memory KV: append to unknown sequence or layer");
  const size_t row = shape_.row(), plane = size_t(shape_.n_ctx) * row;
  uint16_t* kd = s->base + (2 * size_t(layer)) * plane + size_t(s->length) * row;
  uint16_t* vd = kd + plane;
  if (memory_) {
    memory_->StoreF16(kd, k, int64_t(s->pending) * row);
    memory_->StoreF16(vd, v, int64_t(s->pending) * row);
  } else {
    kernels::F32ToF16Row(k, kd, int64_t(s->pending) * row);
    kernels::F32ToF16Row(v, vd, int64_t(s->pending) * row);
  }
  return Status::OK();
}

Status MemoryKv::View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) {
  Sequence* s = Find(seq);
  if (!s || layer < 0 || layer >= shape_.n_layer)
    return Status::InvalidArgument("memory KV: view of unknown sequence or layer");
  const size_t plane = size_t(shape_.n_ctx) * shape_.row();
  kernels::KvSpan& sp = s->views[layer];
  sp.k = s->base + (2 * size_t(layer)) * plane;
  sp.v = sp.k + plane;
  sp.n_tokens = s->length + s->pending;
  sp.pos0 = 0;
  sp.stride = shape_.row();
  *out = std::span<const kernels::KvSpan>(&sp, 1);
  return Status::OK();
}

Status MemoryKv::EndBatch() {
  for (const BatchSeq& b : batch_) {
    Sequence* s = Find(b.seq);
    s->length += s->pending;
    s->pending = 0;
  }
  batch_.clear();
  peak_resident_ = std::max(peak_resident_, counters().resident_bytes);
  return Status::OK();
}

void MemoryKv::AbortBatch() {
  for (const BatchSeq& b : batch_)
    if (Sequence* s = Find(b.seq)) s->pending = 0;
  batch_.clear();
}

KvCounters MemoryKv::counters() const {
  KvCounters c;
  for (const auto& [id, s] : seqs_)
    c.resident_bytes += uint64_t(s->length) * shape_.row() * 2 * sizeof(uint16_t) * shape_.n_layer;
  c.peak_resident_bytes = std::max(peak_resident_, c.resident_bytes);
  return c;
}

}  // namespace strata
