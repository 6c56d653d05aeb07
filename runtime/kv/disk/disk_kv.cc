#include "runtime/kv/disk/disk_kv.h"

#include <algorithm>
#include <cstring>

#include "common/thread_pool.h"
#include "runtime/kv/disk/disk_kv_view.h"
#include "runtime/model/model.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

DiskKv::DiskKv(const Model& model, const DiskKvOptions& options, const KvShape& shape)
    : model_(model), options_(options), shape_(shape) {}

DiskKv::~DiskKv() {
  // Nothing may still write into a sequence's buffers once they are freed (the store's own
  // batches are waited for by its destructor, which runs before the sequences go).
  if (store_)
    for (auto& [id, s] : seqs_) WaitStaging(*s);
}

Status DiskKv::Create(const Model& model, const DiskKvOptions& options, int32_t n_ctx,
                      int32_t max_sequences, ThreadPool* pool, std::unique_ptr<DiskKv>* out,
                      const DiskKvHooks& hooks) {
  STRATA_RETURN_IF_ERROR(ValidateDiskKvOptions(options));
  const HParams& hp = model.hparams();
  if (n_ctx <= 0 || max_sequences <= 0)
    return Status::InvalidArgument("disk KV: context and max_sequences must be > 0");
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx};
  std::unique_ptr<DiskKv> kv(new DiskKv(model, options, shape));
  kv->max_sequences_ = max_sequences;
  kv->on_decode_view_ = hooks.on_decode_view;

  if (options.ratio > 0) {
    int32_t rank = 0;
    STRATA_RETURN_IF_ERROR(RankForRatio(shape.row(), options.ratio, &rank).WithContext("kv.ratio"));
  }
  const std::string adapters =
      options.adapters.empty() ? Adapters::DefaultPath(model.path()) : options.adapters;
  STRATA_RETURN_IF_ERROR(Adapters::Read(adapters, &kv->adapters_));
  STRATA_RETURN_IF_ERROR(kv->adapters_.CheckModel(model, adapters));
  if (options.ratio > 0 && !kv->adapters_.Find(options.ratio))
    return Status::InvalidArgument("kv.ratio = " + std::to_string(options.ratio) +
                                   " is not in adapters " + adapters + " (they hold ratios " +
                                   kv->adapters_.RatioList() + "); calibrate it with --ratios");
  std::vector<int32_t> ratios;  // at least one: Adapters::Read refuses a file without sets
  for (const AdapterSet& a : kv->adapters_.sets) ratios.push_back(a.ratio);

  // Records are padded to the device block, so the plan needs the block size first.
  uint32_t block = 0;
  STRATA_RETURN_IF_ERROR(DiskKvStore::ProbeBlockSize(options, &block));
  STRATA_RETURN_IF_ERROR(PlanDiskKv(shape, options, block, &kv->plan_, &kv->adapters_.profile,
                                    ratios, model.hparams().n_head));
  const AdapterSet* set = kv->adapters_.Find(kv->plan_.ratio);
  if (kv->plan_.rank != set->rank)
    return Status::Corruption("adapters " + adapters + ": ratio " + std::to_string(set->ratio) +
                              " has rank " + std::to_string(set->rank) + ", expected " +
                              std::to_string(kv->plan_.rank));
  kv->layout_ = kv->plan_.layout;
  STRATA_RETURN_IF_ERROR(DiskKvStore::Open(options, kv->plan_, shape, max_sequences, block, &kv->c_,
                                           &kv->store_, hooks));
  STRATA_RETURN_IF_ERROR(DiskKvSelector::Create(model, *set, options, kv->plan_, n_ctx,
                                                max_sequences, pool, &kv->selector_));
  kv->c_.budget_bytes = kv->plan_.budget_bytes;
  *out = std::move(kv);
  return Status::OK();
}

DiskKv::Sequence* DiskKv::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}
const DiskKv::Sequence* DiskKv::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}

Status DiskKv::AddSequence(SeqId* out) {
  std::unique_ptr<Sequence> s;
  STRATA_RETURN_IF_ERROR(store_->NewSequence(selector_->predictor().n_head(), &s));
  const SeqId id = next_id_++;
  s->id = id;
  seqs_[id] = std::move(s);
  *out = id;
  NoteMemory();
  return Status::OK();
}

Status DiskKv::RemoveSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Status::NotFound("disk KV: no sequence " + std::to_string(seq));
  store_->ReleaseSequence(*it->second);
  seqs_.erase(it);
  NoteMemory();
  return Status::OK();
}

int32_t DiskKv::Length(SeqId seq) const {
  const Sequence* s = Find(seq);
  return s ? s->length : 0;
}

Status DiskKv::BeginBatch(std::span<const BatchSeq> batch) {
  STRATA_RETURN_IF_ERROR(store_->CheckFile());
  STRATA_RETURN_IF_ERROR(store_->SettleDecodeWrites());
  store_->RegisterArenas();
  for (const BatchSeq& b : batch) {
    const Sequence* s = Find(b.seq);
    if (!s) return Status::NotFound("disk KV: no sequence " + std::to_string(b.seq));
    if (!s->lost.ok()) return s->lost;
    if (b.pos0 != s->length)
      return Status::InvalidArgument("disk KV: sequence " + std::to_string(b.seq) + " has " +
                                     std::to_string(s->length) +
                                     " tokens, batch starts at position " + std::to_string(b.pos0));
    if (b.n_new <= 0 || int64_t(s->length) + b.n_new > shape_.n_ctx)
      return Status::OutOfRange("context full: sequence " + std::to_string(b.seq) + " has " +
                                std::to_string(s->length) + " tokens + " + std::to_string(b.n_new) +
                                " new > context length " + std::to_string(shape_.n_ctx));
  }
  pass_start_ = Clock::now();
  batch_.assign(batch.begin(), batch.end());
  batch_seqs_.clear();
  int32_t row = 0;
  for (const BatchSeq& b : batch_) {
    Sequence* s = Find(b.seq);
    s->pending = b.n_new;
    s->row = row;
    row += b.n_new;
    s->exact = b.n_new > 1 || options_.reload_all;
    batch_seqs_.push_back(s);
    if (!s->exact) continue;
    STRATA_RETURN_IF_ERROR(PlanStaging(*s, b.n_new));
  }
  store_->ForgetSettled();
  NoteMemory();
  return Status::OK();
}

Status DiskKv::Prepare(int32_t layer, const float* x, int64_t n_embd) {
  const disk_kv::RefineSchedule& sched = selector_->schedule();
  // x enters layer-1 now: its query for layer-1 is exact, so correct that layer's guess
  // (layer 0's guess already came from its own input; the last layer has no later call).
  if (layer >= 1 && sched.Refined(layer - 1)) STRATA_RETURN_IF_ERROR(Refine(layer - 1, x, n_embd));
  if (layer < 0 || layer >= shape_.n_layer) return Status::OK();
  const auto t0 = Clock::now();
  const double wait0 = c_.io_wait_seconds;
  const size_t guess = DiskKvStore::GuessReads(layer);
  // A pass that ended without viewing this layer may have left its reads in flight; and
  // layer-2's read-through records share the buffer this layer's reads go to.
  STRATA_RETURN_IF_ERROR(store_->SettleLayer(layer));
  if (plan_.transient_groups > 0 && layer >= 2)
    STRATA_RETURN_IF_ERROR(store_->SettleLayer(layer - 2));
  store_->reads(guess).Clear();
  if (sched.HasGuess(layer)) STRATA_RETURN_IF_ERROR(Select(layer, x, n_embd, /*refining=*/false));
  for (Sequence* s : batch_seqs_)
    if (s->exact) AddReadback(layer, *s);
  STRATA_RETURN_IF_ERROR(store_->SubmitReads(layer, guess));
  // Waits on reads are I/O wait, counted there, not prediction.
  c_.predict_seconds += Seconds(t0, Clock::now()) - (c_.io_wait_seconds - wait0);
  return Status::OK();
}

Status DiskKv::Select(int32_t layer, const float* x, int64_t n_embd, bool refining) {
  selected_.clear();
  selector_->Select(layer, x, n_embd, batch_seqs_, refining, &selected_);
  const size_t batch = refining ? DiskKvStore::RefineReads(layer) : DiskKvStore::GuessReads(layer);
  const bool first = selector_->schedule().FirstSelection(layer, refining);
  for (Sequence* s : selected_) store_->AddLoads(layer, *s, batch, first);
  return Status::OK();
}

Status DiskKv::Refine(int32_t layer, const float* x, int64_t n_embd) {
  const auto t0 = Clock::now();
  const double wait0 = c_.io_wait_seconds;
  const size_t refine = DiskKvStore::RefineReads(layer), guess = DiskKvStore::GuessReads(layer);
  STRATA_RETURN_IF_ERROR(store_->SettleReads(layer, refine));
  store_->reads(refine).Clear();
  STRATA_RETURN_IF_ERROR(Select(layer, x, n_embd, /*refining=*/true));
  // The guess's reads may still be landing. A slot the refinement gives to another group
  // must not take a new read while the guess's read into it is in flight: only then wait
  // for the guess (usually the refinement's new groups go to slots that were hits).
  if (!store_->settled(guess) && store_->RefineOverlapsGuess(layer))
    STRATA_RETURN_IF_ERROR(store_->SettleReads(layer, guess));
  STRATA_RETURN_IF_ERROR(store_->SubmitReads(layer, refine));
  c_.predict_seconds += Seconds(t0, Clock::now()) - (c_.io_wait_seconds - wait0);
  return Status::OK();
}

Status DiskKv::Append(int32_t layer, SeqId seq, const float* k, const float* v) {
  Sequence* s = Find(seq);
  if (!s || layer < 0 || layer >= shape_.n_layer || s->pending == 0)
    return Status::InvalidArgument("disk KV: append to unknown sequence " + std::to_string(seq) +
                                   " or layer " + std::to_string(layer) + " outside a pass");
  if (s->exact) return AppendExact(layer, *s, k, v);
  AppendDecode(layer, *s, k, v);
  return Status::OK();
}

void DiskKv::AppendDecode(int32_t layer, Sequence& s, const float* k, const float* v) {
  Layer& L = s.layers[size_t(layer)];
  const int32_t G = layout_.group_size, p = s.length, g = p / G, t = p % G;
  const uint32_t rec = layout_.record_bytes;
  std::byte* r = L.ring + size_t(g % plan_.ring_records()) * rec;
  layout_.PutF32(r, t, k, v, 1);
  if (plan_.tail) kernels::Add(L.v_new.data(), v, shape_.row());
  selector_->SummarizeKeys(layer, k, 1, p, L);
  if (t == G - 1) {
    selector_->SummarizeRecord(layer, r, g, L);
    // The write leaves at EndBatch from its own copy, so the ring slot can take the next
    // group while it is in flight.
    std::memcpy(L.write, r, layout_.payload_bytes);
    L.write_group = g;
    if (g < plan_.sink_groups) std::memcpy(L.sink + size_t(g) * rec, r, layout_.payload_bytes);
  }
}

Status DiskKv::View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) {
  Sequence* s = Find(seq);
  if (!s || layer < 0 || layer >= shape_.n_layer || s->pending == 0)
    return Status::InvalidArgument("disk KV: view of unknown sequence " + std::to_string(seq) +
                                   " or layer " + std::to_string(layer) + " outside a pass");
  STRATA_RETURN_IF_ERROR(store_->SettleLayer(layer));
  if (s->exact) {
    STRATA_RETURN_IF_ERROR(ViewExact(layer, *s, 0));
    *out = s->staging->view;
  } else {
    c_.resident_attended +=
        uint64_t(disk_kv::AssembleDecodeView(plan_, options_.attend_resident, *s, layer));
    *out = s->layers[size_t(layer)].view;
    if (on_decode_view_) on_decode_view_(layer, seq, *out);
  }
  return Status::OK();
}

int32_t DiskKv::MoreWindows(int32_t layer, SeqId seq) {
  const Sequence* s = Find(seq);
  if (!s || !s->exact || !s->staging || s->staging->window_layer != layer) return 0;
  return s->staging->windows - 1 - s->staging->window;
}

Status DiskKv::NextWindow(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) {
  Sequence* s = Find(seq);
  if (MoreWindows(layer, seq) <= 0)
    return Status::InvalidArgument("disk KV: no further window of layer " + std::to_string(layer) +
                                   " for sequence " + std::to_string(seq));
  STRATA_RETURN_IF_ERROR(ViewExact(layer, *s, s->staging->window + 1));
  *out = s->staging->view;
  return Status::OK();
}

bool DiskKv::Tail(int32_t layer, SeqId seq, KvTail* out) {
  Sequence* s = Find(seq);
  if (!plan_.tail || !s || layer < 0 || layer >= shape_.n_layer || s->pending == 0 || s->exact)
    return false;
  const Layer& L = s->layers[size_t(layer)];
  out->ratio = L.tail_ratio.data();
  out->mean_v = L.v_mean.data();
  return true;
}

Status DiskKv::EndBatch() {
  Status result;
  for (int32_t l = 0; l < shape_.n_layer; ++l) {
    Status st = store_->SettleLayer(l);
    if (result.ok() && !st.ok()) result = st;
  }
  for (Sequence* s : batch_seqs_) {
    if (!s->exact) continue;
    Status st = FinishExact(*s);
    if (!st.ok()) {
      // Nothing of the pass is committed: the sequence stays as it was before it.
      if (result.ok()) result = st;
      s->pending = 0;
    }
  }
  if (!result.ok()) {
    AbortBatch();
    return result;
  }
  // Waited for at the next BeginBatch, so the writes overlap the output head and sampling.
  if (Status st = store_->SubmitDecodeWrites(batch_seqs_); !st.ok()) {
    AbortBatch();
    return st;
  }
  for (Sequence* s : batch_seqs_) {
    if (plan_.tail)
      for (Layer& L : s->layers) {
        kernels::Add(L.v_sum.data(), L.v_new.data(), shape_.row());
        std::fill(L.v_new.begin(), L.v_new.end(), 0.0f);
      }
    s->length += s->pending;
    s->pending = 0;
    s->exact = false;
    s->staging.reset();
  }
  batch_.clear();
  batch_seqs_.clear();
  ++c_.steps;
  c_.step_seconds += Seconds(pass_start_, Clock::now());
  NoteMemory();
  return Status::OK();
}

Status DiskKv::Settle() { return store_->SettleDecodeWrites(); }

void DiskKv::AbortBatch() {
  for (int32_t l = 0; l < shape_.n_layer; ++l) (void)store_->SettleLayer(l);
  for (Sequence* s : batch_seqs_) {
    WaitStaging(*s);
    s->staging.reset();
    s->pending = 0;
    s->exact = false;
    for (Layer& L : s->layers) {
      L.write_group = -1;
      std::fill(L.v_new.begin(), L.v_new.end(), 0.0f);
    }
  }
  batch_.clear();
  batch_seqs_.clear();
  NoteMemory();
}

uint64_t DiskKv::SequenceResident(const Sequence& s) const {
  uint64_t b = s.arena.size();
  b += uint64_t(shape_.n_layer) *
       GroupPredictor::SummaryBytes(plan_.SummaryRows(s.length + s.pending), plan_.rank,
                                    plan_.summary_score_type(), plan_.group_summary);
  for (const Layer& L : s.layers)
    b += ReuseBuffer::TableBytes(L.reuse.size(), L.reuse.transient() > 0) +
         L.selected.capacity() * sizeof(int32_t) +
         L.placed.capacity() * sizeof(ReuseBuffer::Placement) +
         L.view.capacity() * sizeof(kernels::KvSpan) +
         (L.v_sum.capacity() + L.v_new.capacity() + L.v_mean.capacity() + L.tail_ratio.capacity()) *
             sizeof(float);
  return b;
}

void DiskKv::NoteMemory() {
  // An exact pass's staging lives in the slot pool, inside the arena counted here.
  uint64_t resident = 0, staging = 0;
  for (const auto& [id, s] : seqs_) {
    const uint64_t r = SequenceResident(*s);
    resident += r;
    c_.peak_sequence_resident_bytes = std::max(c_.peak_sequence_resident_bytes, r);
  }
  c_.resident_bytes = resident;
  c_.peak_resident_bytes = std::max(c_.peak_resident_bytes, resident);
  c_.staging_bytes = staging;
  c_.peak_staging_bytes = std::max(c_.peak_staging_bytes, staging);
}

KvCounters DiskKv::counters() const { return c_; }

}  // namespace strata
