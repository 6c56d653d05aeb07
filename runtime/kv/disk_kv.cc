#include "runtime/kv/disk_kv.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/thread_pool.h"
#include "runtime/kv/disk_kv_internal.h"
#include "runtime/model/model.h"

namespace strata {
namespace {

using disk_kv_internal::FromLoadTag;
using disk_kv_internal::kBulkRequestBytes;
using disk_kv_internal::kReadbackTag;
using disk_kv_internal::LoadTag;
using disk_kv_internal::LoadTarget;

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

storage::BackendKind BackendOf(const std::string& name) {
  if (name == "io_uring") return storage::BackendKind::kUring;
  if (name == "pread") return storage::BackendKind::kThreadPool;
  return storage::BackendKind::kAuto;
}

std::string DefaultAdaptersPath(const std::string& model_path) {
  const std::string ext = ".gguf";
  if (model_path.size() > ext.size() &&
      model_path.compare(model_path.size() - ext.size(), ext.size(), ext) == 0)
    return model_path.substr(0, model_path.size() - ext.size()) + ".adapters";
  return model_path + ".adapters";
}

}  // namespace

DiskKv::DiskKv(const Model& model, const DiskKvOptions& options, const KvShape& shape)
    : model_(model), options_(options), shape_(shape) {}

DiskKv::~DiskKv() {
  // Nothing may still write into a sequence's buffers once they are freed.
  if (store_) {
    for (auto& b : reads_)
      if (b) (void)store_->Wait(*b);
    if (decode_writes_) (void)store_->Wait(*decode_writes_);
    for (auto& [id, s] : seqs_)
      if (s->staging) {
        for (auto& w : s->staging->writes) (void)store_->Wait(w);
        (void)store_->Wait(s->staging->window_read);
      }
  }
}

Status DiskKv::Create(const Model& model, const DiskKvOptions& options, int32_t n_ctx,
                      int32_t max_sequences, ThreadPool* pool, std::unique_ptr<DiskKv>* out) {
  STRATA_RETURN_IF_ERROR(ValidateDiskKvOptions(options));
  const HParams& hp = model.hparams();
  if (n_ctx <= 0 || max_sequences <= 0)
    return Status::InvalidArgument("disk KV: context and max_sequences must be > 0");
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx};
  std::unique_ptr<DiskKv> kv(new DiskKv(model, options, shape));
  kv->max_sequences_ = max_sequences;

  if (options.ratio > 0) {
    int32_t rank = 0;
    STRATA_RETURN_IF_ERROR(RankForRatio(shape.row(), options.ratio, &rank).WithContext("kv.ratio"));
  }
  const std::string adapters =
      options.adapters.empty() ? DefaultAdaptersPath(model.path()) : options.adapters;
  STRATA_RETURN_IF_ERROR(Adapters::Read(adapters, &kv->adapters_));
  STRATA_RETURN_IF_ERROR(kv->adapters_.CheckModel(model, adapters));
  if (options.ratio > 0 && !kv->adapters_.Find(options.ratio))
    return Status::InvalidArgument("kv.ratio = " + std::to_string(options.ratio) +
                                   " is not in adapters " + adapters + " (they hold ratios " +
                                   kv->adapters_.RatioList() + "); calibrate it with --ratios");
  std::vector<int32_t> ratios;  // at least one: Adapters::Read refuses a file without sets
  for (const AdapterSet& a : kv->adapters_.sets) ratios.push_back(a.ratio);

  storage::StoreOptions so;
  so.directory = options.dir;
  // A KV file must not outlive the process (a crash would leave gigabytes behind).
  so.mode = storage::OpenMode::kTemporary;
  so.backend = BackendOf(options.backend);
  so.queue_depth = uint32_t(options.queue_depth);
  if (options.emulate_emmc) so.slow_disk = storage::SlowDiskOptions::Emmc();
  so.faults = options.faults;
  so.file_name = "kv";
  // Records are padded to the device block, so the plan needs the block size first: a
  // tiny probe store tells it (and fails early, with the store's message, on a bad dir).
  uint32_t block = 0;
  {
    storage::StoreOptions probe = so;
    probe.capacity = 1 << 20;
    probe.faults = nullptr;
    probe.slow_disk = {};
    std::unique_ptr<storage::BlockStore> s;
    STRATA_RETURN_IF_ERROR(storage::BlockStore::Open(probe, &s).WithContext("disk KV store"));
    block = s->block_size();
  }
  STRATA_RETURN_IF_ERROR(PlanDiskKv(shape, options, block, &kv->plan_, &kv->adapters_.profile,
                                    ratios, model.hparams().n_head));
  const AdapterSet* set = kv->adapters_.Find(kv->plan_.ratio);
  if (kv->plan_.rank != set->rank)
    return Status::Corruption("adapters " + adapters + ": ratio " + std::to_string(set->ratio) +
                              " has rank " + std::to_string(set->rank) + ", expected " +
                              std::to_string(kv->plan_.rank));
  kv->layout_ = kv->plan_.layout;
  so.capacity = uint64_t(max_sequences) * kv->layout_.sequence_bytes();
  so.block_size = block;
  Status st = storage::BlockStore::Open(so, &kv->store_);
  if (!st.ok())
    return st.WithContext("disk KV store of " + std::to_string(so.capacity) + " bytes (" +
                          std::to_string(max_sequences) + " sequences x " + std::to_string(n_ctx) +
                          " tokens) in " + options.dir);
  if (!kv->store_->unnamed()) {
    struct stat sb {};
    if (stat(kv->store_->path().c_str(), &sb) != 0)
      return Status::FromErrno("disk KV: stat " + kv->store_->path(), errno);
    kv->store_dev_ = sb.st_dev;
    kv->store_ino_ = sb.st_ino;
  }

  STRATA_RETURN_IF_ERROR(GroupPredictor::Create(model, *set, options.scoring,
                                                kv->plan_.summary_score_type(), n_ctx,
                                                max_sequences, pool, &kv->predictor_));
  for (int32_t i = 0; i < 2 * hp.n_layer; ++i)
    kv->reads_.push_back(std::make_unique<storage::IoBatch>());
  kv->reads_settled_.assign(kv->reads_.size(), 1);
  kv->decode_writes_ = std::make_unique<storage::IoBatch>();
  for (int32_t r = max_sequences - 1; r >= 0; --r) kv->free_regions_.push_back(r);
  kv->q_lr_.resize(size_t(max_sequences) * hp.n_head * kv->plan_.rank);
  kv->group_keys_.resize(size_t(kv->layout_.group_size) * size_t(kv->layout_.row));
  kv->pool_ = pool;
  kv->predictor_->ReserveGroupSize(kv->plan_.summary_group_size());
  kv->selections_.resize(max_sequences >= 2 ? size_t(pool->size()) : 1);
  for (Selection& sel : kv->selections_) {
    sel.favored.reserve(
        size_t(*std::max_element(kv->plan_.layer_slots.begin(), kv->plan_.layer_slots.end()) +
               kv->plan_.transient_groups));
    sel.scores.reserve(
        size_t(*std::max_element(kv->plan_.layer_groups.begin(), kv->plan_.layer_groups.end())));
  }
  kv->sparse_x_.resize(size_t(max_sequences) * hp.n_embd);
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
  if (free_regions_.empty())
    return Status::ResourceExhausted("disk KV: already " + std::to_string(seqs_.size()) +
                                     " sequences, the limit is " + std::to_string(max_sequences_));
  auto s = std::make_unique<Sequence>();
  const uint64_t rec = layout_.record_bytes;
  size_t records = 0;
  for (int32_t l = 0; l < shape_.n_layer; ++l) records += size_t(plan_.arena_records(l));
  records += size_t(plan_.transient_records());
  STRATA_RETURN_IF_ERROR(
      storage::AlignedBuffer::Allocate(records * rec, store_->block_size(), &s->arena));
  const int64_t rows = plan_.SummaryRows(shape_.n_ctx);
  const size_t klr_layer_bytes =
      size_t(GroupPredictor::KlrBytes(rows, plan_.rank, plan_.summary_score_type()));
  const size_t spread_layer_bytes =
      plan_.group_summary ? size_t(GroupPredictor::SpreadBytes(rows)) : 0;
  s->klr_map_bytes = size_t(shape_.n_layer) * (klr_layer_bytes + spread_layer_bytes);
  void* p = mmap(nullptr, s->klr_map_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return Status::FromErrno(
        "disk KV: reserving " + std::to_string(s->klr_map_bytes) + " bytes for the key summary",
        errno);
  s->klr_map = p;
  s->layers.resize(size_t(shape_.n_layer));
  // The slot pool first (every layer's slots, then the read-through buffers), then every
  // layer's ring, sink and write records.
  const int32_t T = plan_.transient_groups;
  size_t pool_records = size_t(plan_.transient_records());
  for (int32_t l = 0; l < shape_.n_layer; ++l) pool_records += size_t(plan_.layer_slots[size_t(l)]);
  s->pool_bytes = pool_records * rec;
  std::byte* slots = s->arena.data();
  std::byte* base = s->arena.data() + s->pool_bytes;
  for (int32_t l = 0; l < shape_.n_layer; ++l) {
    Layer& L = s->layers[size_t(l)];
    const int32_t slots_l = plan_.layer_slots[size_t(l)], m = plan_.layer_groups[size_t(l)];
    L.slots = slots;
    slots += size_t(slots_l) * rec;
    L.ring = base;
    base += size_t(plan_.arena_records(l) - slots_l) * rec;
    L.sink = L.ring + size_t(plan_.ring_records()) * rec;
    L.write = L.sink + size_t(plan_.sink_groups) * rec;
    L.klr = static_cast<uint8_t*>(p) + size_t(l) * klr_layer_bytes;
    if (plan_.group_summary)
      L.spread = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(p) +
                                             size_t(shape_.n_layer) * klr_layer_bytes) +
                 size_t(l) * spread_layer_bytes / sizeof(uint16_t);
    L.reuse = ReuseBuffer(slots_l, options_.reuse, T);
    L.selected.reserve(size_t(m));
    L.placed.reserve(size_t(m));
    L.view.reserve(size_t(slots_l + T + plan_.sink_groups + plan_.recent_groups + 1));
    if (plan_.tail) {
      L.v_sum.assign(size_t(shape_.row()), 0.0f);
      L.v_new.assign(size_t(shape_.row()), 0.0f);
      L.v_mean.assign(size_t(shape_.row()), 0.0f);
      L.tail_ratio.assign(size_t(predictor_->n_head()), 0.0f);
    }
  }
  s->transient = T > 0 ? slots : nullptr;
  s->region = free_regions_.back();
  free_regions_.pop_back();
  const SeqId id = next_id_++;
  seqs_[id] = std::move(s);
  arenas_changed_ = true;
  *out = id;
  NoteMemory();
  return Status::OK();
}

Status DiskKv::RemoveSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Status::NotFound("disk KV: no sequence " + std::to_string(seq));
  // Its buffers may still be the target or source of I/O.
  for (auto& b : reads_) (void)store_->Wait(*b);
  (void)store_->Wait(*decode_writes_);
  free_regions_.push_back(it->second->region);
  seqs_.erase(it);
  arenas_changed_ = true;
  NoteMemory();
  return Status::OK();
}

int32_t DiskKv::Length(SeqId seq) const {
  const Sequence* s = Find(seq);
  return s ? s->length : 0;
}

Status DiskKv::CheckStoreFile() const {
  // An unnamed store file lives as long as the process holds it, whatever happens to the
  // directory.
  if (store_->unnamed()) return Status::OK();
  struct stat sb {};
  if (stat(store_->path().c_str(), &sb) != 0 || sb.st_dev != store_dev_ || sb.st_ino != store_ino_)
    return Status::IOError("disk KV: the store file " + store_->path() +
                           " is gone (was the KV directory " + options_.dir +
                           " removed?); the KV cache of every sequence is lost");
  return Status::OK();
}

Status DiskKv::SettleDecodeWrites() {
  if (decode_writes_->empty()) return Status::OK();
  const auto t0 = Clock::now();
  const Status st = store_->Wait(*decode_writes_);
  c_.io_wait_seconds += Seconds(t0, Clock::now());
  if (!st.ok()) {
    // The failed records are gone for good: their sequences cannot attend correctly.
    for (size_t i = 0; i < decode_writes_->size(); ++i) {
      if (decode_writes_->status(i).ok()) continue;
      const int32_t region = int32_t(decode_writes_->request(i).tag);
      for (auto& [id, s] : seqs_)
        if (s->region == region && s->lost.ok())
          s->lost = decode_writes_->status(i).WithContext(
              "disk KV: sequence " + std::to_string(id) + " lost a group record");
    }
  }
  decode_writes_->Clear();
  return st.WithContext("disk KV: writing group records");
}

Status DiskKv::BeginBatch(std::span<const BatchSeq> batch) {
  if (!broken_.ok()) return broken_;
  if (Status st = CheckStoreFile(); !st.ok()) {
    broken_ = st;
    return st;
  }
  STRATA_RETURN_IF_ERROR(SettleDecodeWrites());
  if (arenas_changed_) RegisterArenas();
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
  std::fill(reads_settled_.begin(), reads_settled_.end(), 1);
  NoteMemory();
  return Status::OK();
}

// Bytes an exact pass of n_new tokens after `length` needs besides the earlier records: its
// new full groups (two layers), the ring as it will stand, and its fresh tokens in F16.
uint64_t DiskKv::PassBytes(int32_t length, int32_t n_new) const {
  const int32_t G = layout_.group_size;
  const uint64_t rec = layout_.record_bytes;
  const uint64_t full = uint64_t((length + n_new) / G - length / G) * rec;
  const uint64_t fresh = uint64_t(length % G + n_new) * uint64_t(layout_.row) * 2;
  return 2 * full + uint64_t(shape_.n_layer) * uint64_t(plan_.ring_records()) * rec +
         2 * ((fresh + 63) / 64 * 64);
}

int32_t DiskKv::max_pass_tokens() const {
  // The pool is the same for every sequence; the worst start is one token short of a group.
  const uint64_t pool = PoolBytes();
  const uint64_t need_min = 3 * uint64_t(layout_.record_bytes);
  int32_t lo = 0, hi = shape_.n_ctx;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (PassBytes(layout_.group_size - 1, mid) + need_min <= pool)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

uint64_t DiskKv::PoolBytes() const {
  uint64_t records = uint64_t(plan_.transient_records());
  for (int32_t l = 0; l < shape_.n_layer; ++l) records += uint64_t(plan_.layer_slots[size_t(l)]);
  return records * layout_.record_bytes;
}

Status DiskKv::PlanStaging(Sequence& s, int32_t n_new) {
  const uint64_t rec = layout_.record_bytes;
  const int32_t G = layout_.group_size;
  const int32_t prior = s.length / G;
  const uint64_t pass = PassBytes(s.length, n_new);
  if (pass + 3 * rec > s.pool_bytes)
    return Status::ResourceExhausted(
        "disk KV: a pass of " + std::to_string(n_new) + " tokens needs " + std::to_string(pass) +
        " bytes of staging inside the sequence's budget, whose slots hold " +
        std::to_string(s.pool_bytes) + "; pass at most " + std::to_string(max_pass_tokens()) +
        " tokens (--batch) or raise kv.budget_bytes");
  auto st = std::make_unique<Staging>();
  // The slots' contents go: forget them (the next decode step selects afresh).
  for (Layer& L : s.layers) L.reuse.Clear();
  const uint64_t room = (s.pool_bytes - pass) / rec;  // records left for the earlier ones
  if (uint64_t(prior) * 2 <= room) {
    st->window_records = prior;
    st->windows = 1;
  } else {
    st->window_records = int32_t(std::min<uint64_t>(room / 3, uint64_t(prior)));
    st->windows = (prior + st->window_records - 1) / st->window_records;
  }
  std::byte* at = s.arena.data();
  const int n_buffers = st->windows > 1 ? 3 : 2;
  for (int i = 0; i < n_buffers; ++i, at += size_t(st->window_records) * rec) st->readback[i] = at;
  const uint64_t full = uint64_t((s.length + n_new) / G - prior) * rec;
  for (int i = 0; i < 2; ++i, at += full) st->records[i] = at;
  st->ring = at;
  at += size_t(shape_.n_layer) * size_t(plan_.ring_records()) * rec;
  const size_t fresh = size_t(s.length % G + n_new) * size_t(layout_.row) * 2;
  st->fresh_k = reinterpret_cast<uint16_t*>(at);
  st->fresh_v = reinterpret_cast<uint16_t*>(at + (fresh + 63) / 64 * 64);
  st->view.reserve(size_t(std::min(prior, st->window_records)) + 1);
  s.staging = std::move(st);
  return Status::OK();
}

Status DiskKv::Prepare(int32_t layer, const float* x, int64_t n_embd) {
  // x enters layer-1 now: its query for layer-1 is exact, so correct that layer's guess
  // (layer 0's guess already came from its own input; the last layer has no later call).
  if (layer >= 1 && Refined(layer - 1)) STRATA_RETURN_IF_ERROR(Refine(layer - 1, x, n_embd));
  if (layer < 0 || layer >= shape_.n_layer) return Status::OK();
  const auto t0 = Clock::now();
  const double wait0 = c_.io_wait_seconds;
  storage::IoBatch& rb = *reads_[GuessReads(layer)];
  // A pass that ended without viewing this layer may have left its reads in flight; and
  // layer-2's read-through records share the buffer this layer's reads go to.
  STRATA_RETURN_IF_ERROR(SettleReads(layer));
  if (plan_.transient_groups > 0 && layer >= 2) STRATA_RETURN_IF_ERROR(SettleReads(layer - 2));
  rb.Clear();
  if (HasGuess(layer)) STRATA_RETURN_IF_ERROR(PrepareSparse(layer, x, n_embd, /*refining=*/false));
  for (Sequence* s : batch_seqs_)
    if (s->exact) AddReadback(layer, *s);
  STRATA_RETURN_IF_ERROR(SubmitReads(layer, GuessReads(layer)));
  // Waits on reads are I/O wait, counted there, not prediction.
  c_.predict_seconds += Seconds(t0, Clock::now()) - (c_.io_wait_seconds - wait0);
  return Status::OK();
}

Status DiskKv::SubmitReads(int32_t layer, size_t batch) {
  storage::IoBatch& rb = *reads_[batch];
  if (rb.empty()) return Status::OK();
  STRATA_RETURN_IF_ERROR(store_->Submit(rb).WithContext("disk KV: reading group records"));
  reads_settled_[batch] = 0;
  if (options_.on_read_submit) options_.on_read_submit(layer, rb);
  c_.reads_issued += rb.size();
  for (size_t i = 0; i < rb.size(); ++i) c_.bytes_read += rb.request(i).length;
  return Status::OK();
}

bool DiskKv::RefineOverlapsGuess(int32_t layer) const {
  const storage::IoBatch& guess = *reads_[GuessReads(layer)];
  const storage::IoBatch& refine = *reads_[RefineReads(layer)];
  for (size_t i = 0; i < refine.size(); ++i) {
    const LoadTarget a = FromLoadTag(refine.request(i).tag);
    for (size_t j = 0; j < guess.size(); ++j)
      if (guess.request(j).tag != kReadbackTag && a.Overlaps(FromLoadTag(guess.request(j).tag)))
        return true;
  }
  return false;
}

Status DiskKv::Refine(int32_t layer, const float* x, int64_t n_embd) {
  const auto t0 = Clock::now();
  const double wait0 = c_.io_wait_seconds;
  STRATA_RETURN_IF_ERROR(SettleBatch(layer, RefineReads(layer)));
  reads_[RefineReads(layer)]->Clear();
  STRATA_RETURN_IF_ERROR(PrepareSparse(layer, x, n_embd, /*refining=*/true));
  // The guess's reads may still be landing. A slot the refinement gives to another group
  // must not take a new read while the guess's read into it is in flight: only then wait
  // for the guess (usually the refinement's new groups go to slots that were hits).
  if (!reads_settled_[GuessReads(layer)] && RefineOverlapsGuess(layer))
    STRATA_RETURN_IF_ERROR(SettleBatch(layer, GuessReads(layer)));
  STRATA_RETURN_IF_ERROR(SubmitReads(layer, RefineReads(layer)));
  c_.predict_seconds += Seconds(t0, Clock::now()) - (c_.io_wait_seconds - wait0);
  return Status::OK();
}

Status DiskKv::PrepareSparse(int32_t layer, const float* x, int64_t n_embd, bool refining) {
  sparse_rows_.clear();
  sparse_pos_.clear();
  for (size_t i = 0; i < batch_seqs_.size(); ++i) {
    const Sequence* s = batch_seqs_[i];
    if (s->exact) continue;
    std::memcpy(sparse_x_.data() + sparse_rows_.size() * n_embd, x + int64_t(s->row) * n_embd,
                size_t(n_embd) * sizeof(float));
    sparse_rows_.push_back(int32_t(i));
    sparse_pos_.push_back(s->length);
  }
  if (sparse_rows_.empty()) return Status::OK();
  predictor_->LowRankQueries(layer, sparse_x_.data(), int64_t(sparse_rows_.size()),
                             sparse_pos_.data(), q_lr_.data());
  // Two or more sequences select side by side, each whole on one worker: a selection's
  // serial tail (softmax over groups, partition, slot planning) otherwise leaves the other
  // cores idle. Their reads join the batch afterwards in sequence order, as one at a time.
  const size_t n = sparse_rows_.size();
  if (n >= 2 && selections_.size() >= 2) {
    pool_->Run(int64_t(n), [&](int64_t j, int worker) {
      SelectForSequence(layer, size_t(j), refining, worker);
    });
  } else {
    for (size_t j = 0; j < n; ++j) SelectForSequence(layer, j, refining, -1);
  }
  for (size_t j = 0; j < n; ++j) AddLoads(layer, *batch_seqs_[size_t(sparse_rows_[j])], refining);
  return Status::OK();
}

template <typename Fn>
void DiskKv::ForEachViewed(const Layer& L, int32_t p, Fn&& fn) const {
  const int32_t G = layout_.group_size, gp = p / G, R = plan_.ring_records();
  const int32_t n_sink = std::min(plan_.sink_groups, gp);
  for (int32_t g = 0; g < n_sink; ++g) fn(Viewed::kSink, g, g, G);
  for (const ReuseBuffer::Placement& pl : L.placed) fn(Viewed::kSlot, pl.group, pl.slot, G);
  const int32_t g_hi = std::max(n_sink, gp - plan_.recent_groups);
  if (options_.attend_resident) {
    // Groups still held from earlier steps: their reads settled then (a failed one cleared
    // its slot), and they lie between the sink and the ring like every selected group.
    // Read-through slots the refinement gave up still hold this step's reads too.
    for (int32_t i = 0; i < L.reuse.size(); ++i) {
      const int32_t g = L.reuse.group_of(i);
      if (g >= n_sink && g < g_hi && !L.reuse.placed_last(i)) fn(Viewed::kResident, g, i, G);
    }
  }
  for (int32_t g = g_hi; g < gp; ++g) fn(Viewed::kRing, g, g % R, G);
  fn(Viewed::kRing, gp, gp % R, p - gp * G + 1);
}

void DiskKv::SelectForSequence(int32_t layer, size_t j, bool refining, int worker) {
  const int32_t G = layout_.group_size, rank = plan_.rank;
  const int32_t n_head = predictor_->n_head();
  Selection& sel = selections_[size_t(std::max(worker, 0))];
  Sequence& s = *batch_seqs_[size_t(sparse_rows_[j])];
  Layer& L = s.layers[size_t(layer)];
  const int32_t gp = s.length / G;
  const int32_t g_lo = std::min(plan_.sink_groups, gp);
  const int32_t g_hi = std::max(g_lo, gp - plan_.recent_groups);
  // A new step's read-through records are gone (later layers read into their buffer);
  // the refinement keeps what the guess read through this step.
  if (FirstSelection(layer, refining)) L.reuse.ForgetTransient();
  sel.favored.clear();
  const float bonus = plan_.layer_bonus[size_t(layer)];
  if (bonus > 0)
    for (int32_t slot = 0; slot < L.reuse.size(); ++slot)
      if (L.reuse.group_of(slot) >= 0) sel.favored.push_back(L.reuse.group_of(slot));
  const bool read_through = L.reuse.transient() > 0;
  predictor_->SelectGroups(
      q_lr_.data() + j * n_head * rank, L.klr, g_lo, g_hi, plan_.summary_group_size(),
      plan_.layer_groups[size_t(layer)], &L.selected, sel.favored, bonus,
      RowSpread{L.spread, options_.group_spread}, read_through ? &sel.scores : nullptr, worker);
  if (read_through && options_.read_through_span > 1)
    predictor_->SpanReadThrough(g_lo, g_hi,
                                plan_.layer_groups[size_t(layer)] - plan_.transient_groups,
                                options_.read_through_span, &L.selected, &sel.scores, worker);
  L.reuse.Resolve(L.selected, &L.placed,
                  read_through ? std::span<const float>(sel.scores) : std::span<const float>());
  // The view follows the step's last selection of the layer.
  if (plan_.tail && (refining || !Refined(layer))) TailRatios(layer, s, g_lo, g_hi, worker);
}

void DiskKv::TailRatios(int32_t layer, Sequence& s, int32_t n_sink, int32_t g_hi, int worker) {
  Layer& L = s.layers[size_t(layer)];
  Selection& sel = selections_[size_t(std::max(worker, 0))];
  const int32_t G = layout_.group_size, p = s.length;
  std::fill(L.tail_ratio.begin(), L.tail_ratio.end(), 0.0f);
  if (layer < options_.tail_first_layer || options_.tail_weight == 0.0f) return;
  // What the view will read: slots' groups among those the selection scored, [n_sink, g_hi),
  // and the sink and ring runs outside them (the new token has no summary row yet; its
  // share is left to attention).
  sel.attended.clear();
  sel.outside.clear();
  ForEachViewed(L, p, [&](Viewed kind, int32_t g, int32_t, int32_t n) {
    if (kind == Viewed::kSink || kind == Viewed::kRing) {
      const int64_t begin = int64_t(g) * G, end = std::min<int64_t>(begin + n, p);
      if (end > begin) sel.outside.push_back({begin, end});
    } else {
      sel.attended.push_back(g);
    }
  });
  // Nothing left out (also where the selection took every group without scoring them).
  if (int32_t(sel.attended.size()) >= g_hi - n_sink) return;
  predictor_->TailRatios(L.klr, n_sink, g_hi, sel.attended, sel.outside, worker,
                         L.tail_ratio.data());
  for (float& r : L.tail_ratio) r *= options_.tail_weight;
}

void DiskKv::AddLoads(int32_t layer, Sequence& s, bool refining) {
  Layer& L = s.layers[size_t(layer)];
  storage::IoBatch& rb = *reads_[refining ? RefineReads(layer) : GuessReads(layer)];
  const uint32_t rec = layout_.record_bytes;
  // Reuse is counted on the first selection of each step: a refinement's hits include what
  // the guess loaded moments ago.
  const bool first = FirstSelection(layer, refining);
  if (first) c_.groups_selected += L.placed.size();
  for (size_t i = 0; i < L.placed.size();) {
    const ReuseBuffer::Placement& p = L.placed[i];
    if (!p.load) {
      if (first) ++c_.reuse_hits;
      ++i;
      continue;
    }
    // Groups adjacent on disk that landed in adjacent slots (of the same buffer) travel in
    // one request.
    const bool transient = L.reuse.is_transient(p.slot);
    size_t j = i + 1;
    while (j < L.placed.size() && L.placed[j].load &&
           L.placed[j].group == p.group + int32_t(j - i) &&
           L.placed[j].slot == p.slot + int32_t(j - i) &&
           L.reuse.is_transient(L.placed[j].slot) == transient &&
           uint64_t(j - i + 1) * rec <= kBulkRequestBytes)
      ++j;
    const int32_t n = int32_t(j - i);
    if (transient) c_.read_through_groups += uint64_t(n);
    rb.AddRead(layout_.Offset(s.region, layer, p.group), SlotRecord(s, layer, p.slot),
               uint32_t(n) * rec, LoadTag(s.region, p.slot, n));
    i = j;
  }
}

Status DiskKv::SettleReads(int32_t layer) {
  const Status guess = SettleBatch(layer, GuessReads(layer));
  const Status refine = SettleBatch(layer, RefineReads(layer));
  return guess.ok() ? refine : guess;
}

Status DiskKv::SettleBatch(int32_t layer, size_t batch) {
  if (reads_settled_[batch]) return Status::OK();
  storage::IoBatch& rb = *reads_[batch];
  const auto t0 = Clock::now();
  const Status st = store_->Wait(rb);
  c_.io_wait_seconds += Seconds(t0, Clock::now());
  reads_settled_[batch] = 1;
  if (st.ok()) return st;
  for (size_t i = 0; i < rb.size(); ++i) {
    const uint64_t tag = rb.request(i).tag;
    if (rb.status(i).ok() || tag == kReadbackTag) continue;
    const LoadTarget t = FromLoadTag(tag);
    for (auto& [id, s] : seqs_)
      if (s->region == t.region)
        for (int32_t k = 0; k < t.count; ++k) s->layers[size_t(layer)].reuse.Invalidate(t.slot + k);
  }
  return st.WithContext("disk KV: reading layer " + std::to_string(layer) + " records");
}

void DiskKv::SummarizeGroup(int32_t layer, const std::byte* record, int32_t g, uint8_t* klr,
                            uint16_t* spread) {
  // From the record, not the F32 keys, so that prefill and decode give a group the same row.
  layout_.GetKeysF32(record, layout_.group_size, group_keys_.data());
  predictor_->ProjectGroup(layer, group_keys_.data(), layout_.group_size, g, klr, spread);
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
  if (!plan_.group_summary) predictor_->ProjectKeys(layer, k, 1, p, L.klr);
  if (t == G - 1) {
    if (plan_.group_summary) SummarizeGroup(layer, r, g, L.klr, L.spread);
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
  STRATA_RETURN_IF_ERROR(SettleReads(layer));
  if (s->exact) {
    STRATA_RETURN_IF_ERROR(ViewExact(layer, *s, 0));
    *out = s->staging->view;
  } else {
    ViewDecode(layer, *s);
    *out = s->layers[size_t(layer)].view;
  }
  return Status::OK();
}

std::byte* DiskKv::SlotRecord(Sequence& s, int32_t layer, int32_t slot) {
  const Layer& L = s.layers[size_t(layer)];
  const uint32_t rec = layout_.record_bytes;
  if (!L.reuse.is_transient(slot)) return L.slots + size_t(slot) * rec;
  const int32_t T = plan_.transient_groups;
  return s.transient + (size_t(layer % 2) * size_t(T) + size_t(slot - L.reuse.capacity())) * rec;
}

void DiskKv::ViewDecode(int32_t layer, Sequence& s) {
  Layer& L = s.layers[size_t(layer)];
  const int32_t p = s.length;
  const uint32_t rec = layout_.record_bytes;
  L.view.clear();
  ForEachViewed(L, p, [&](Viewed kind, int32_t g, int32_t where, int32_t n) {
    const std::byte* r = kind == Viewed::kSink   ? L.sink + size_t(where) * rec
                         : kind == Viewed::kRing ? L.ring + size_t(where) * rec
                                                 : SlotRecord(s, layer, where);
    L.view.push_back(layout_.Span(r, g, n));
    if (kind == Viewed::kResident) ++c_.resident_attended;
  });
  if (plan_.tail) {
    const float inv = 1.0f / float(p + s.pending);
    for (size_t i = 0; i < L.v_mean.size(); ++i) L.v_mean[i] = (L.v_sum[i] + L.v_new[i]) * inv;
  }
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
    Status st = SettleReads(l);
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
  decode_writes_->Clear();
  for (Sequence* s : batch_seqs_) {
    if (s->exact) continue;
    for (int32_t l = 0; l < shape_.n_layer; ++l) {
      Layer& L = s->layers[size_t(l)];
      if (L.write_group < 0) continue;
      decode_writes_->AddWrite(layout_.Offset(s->region, l, L.write_group), L.write,
                               layout_.record_bytes, uint64_t(s->region));
      L.write_group = -1;
    }
  }
  if (!decode_writes_->empty()) {
    // Waited for at the next BeginBatch, so the writes overlap the output head and sampling.
    Status st = store_->Submit(*decode_writes_);
    if (!st.ok()) {
      decode_writes_->Clear();
      AbortBatch();
      return st.WithContext("disk KV: writing group records");
    }
    c_.write_requests += decode_writes_->size();
    c_.bytes_written += uint64_t(decode_writes_->size()) * layout_.record_bytes;
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

void DiskKv::AbortBatch() {
  for (int32_t l = 0; l < shape_.n_layer; ++l) (void)SettleReads(l);
  for (Sequence* s : batch_seqs_) {
    if (s->staging) {
      for (storage::IoBatch& wb : s->staging->writes) (void)store_->Wait(wb);
      (void)store_->Wait(s->staging->window_read);
    }
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

void DiskKv::RegisterArenas() {
  arenas_changed_ = false;
  if (!register_status_.ok()) return;
  std::vector<storage::MemoryRegion> regions;
  for (const auto& [id, s] : seqs_) regions.push_back({s->arena.data(), s->arena.size()});
  // Reads into unregistered memory work as well, only with more work per request: a
  // failure (e.g. RLIMIT_MEMLOCK) is remembered, not raised.
  register_status_ = store_->RegisterBuffers(regions);
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
