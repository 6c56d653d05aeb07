#include "runtime/kv/disk/disk_kv_store.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "runtime/kv/disk/group_predictor.h"

namespace strata {
namespace {

using disk_kv::FromLoadTag;
using disk_kv::kBulkRequestBytes;
using disk_kv::kReadbackTag;
using disk_kv::LoadTag;
using disk_kv::LoadTarget;

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

storage::BackendKind BackendOf(const std::string& name) {
  if (name == "io_uring") return storage::BackendKind::kUring;
  if (name == "pread") return storage::BackendKind::kThreadPool;
  return storage::BackendKind::kAuto;
}

storage::StoreOptions StoreOptionsOf(const DiskKvOptions& options, const DiskKvHooks& hooks = {}) {
  storage::StoreOptions so;
  so.directory = options.dir;
  // A KV file must not outlive the process (a crash would leave gigabytes behind).
  so.mode = storage::OpenMode::kTemporary;
  so.backend = BackendOf(options.backend);
  so.queue_depth = uint32_t(options.queue_depth);
  if (options.emulate_emmc) so.slow_disk = storage::SlowDiskOptions::Emmc();
  so.faults = hooks.faults;
  so.file_name = "kv";
  return so;
}

}  // namespace

Status DiskKvStore::ProbeBlockSize(const DiskKvOptions& options, uint32_t* block) {
  storage::StoreOptions probe = StoreOptionsOf(options);
  probe.capacity = 1 << 20;
  probe.slow_disk = {};
  std::unique_ptr<storage::BlockStore> s;
  STRATA_RETURN_IF_ERROR(storage::BlockStore::Open(probe, &s).WithContext("disk KV store"));
  *block = s->block_size();
  return Status::OK();
}

DiskKvStore::DiskKvStore(const DiskKvOptions& options, const DiskKvHooks& hooks,
                         const DiskKvPlan& plan, const KvShape& shape, KvCounters* counters)
    : options_(options),
      hooks_(hooks),
      plan_(plan),
      shape_(shape),
      layout_(plan_.layout),
      c_(counters) {
  c_->layer_reads_issued.assign(size_t(shape.n_layer), 0);
}

Status DiskKvStore::Open(const DiskKvOptions& options, const DiskKvPlan& plan, const KvShape& shape,
                         int32_t max_sequences, uint32_t block, KvCounters* counters,
                         std::unique_ptr<DiskKvStore>* out, const DiskKvHooks& hooks) {
  std::unique_ptr<DiskKvStore> ds(new DiskKvStore(options, hooks, plan, shape, counters));
  storage::StoreOptions so = StoreOptionsOf(options, hooks);
  so.capacity = uint64_t(max_sequences) * ds->layout_.sequence_bytes();
  so.block_size = block;
  Status st = storage::BlockStore::Open(so, &ds->store_);
  if (!st.ok())
    return st.WithContext("disk KV store of " + std::to_string(so.capacity) + " bytes (" +
                          std::to_string(max_sequences) + " sequences x " +
                          std::to_string(shape.n_ctx) + " tokens) in " + options.dir);
  if (!ds->store_->unnamed()) {
    struct stat sb {};
    if (stat(ds->store_->path().c_str(), &sb) != 0)
      return Status::FromErrno("disk KV: stat " + ds->store_->path(), errno);
    ds->store_dev_ = sb.st_dev;
    ds->store_ino_ = sb.st_ino;
  }
  for (int32_t i = 0; i < 2 * shape.n_layer; ++i)
    ds->reads_.push_back(std::make_unique<storage::IoBatch>());
  ds->reads_settled_.assign(ds->reads_.size(), 1);
  for (int32_t r = max_sequences - 1; r >= 0; --r) ds->free_regions_.push_back(r);
  ds->by_region_.assign(size_t(max_sequences), nullptr);
  *out = std::move(ds);
  return Status::OK();
}

DiskKvStore::~DiskKvStore() {
  if (!store_) return;  // Open failed before the file was open
  // Nothing may still write into a sequence's buffers once they are freed.
  for (auto& b : reads_) (void)store_->Wait(*b);
  (void)store_->Wait(decode_writes_);
}

Status DiskKvStore::NewSequence(int32_t n_head, std::unique_ptr<disk_kv::Sequence>* out) {
  if (free_regions_.empty())
    return Status::ResourceExhausted("disk KV: already " + std::to_string(by_region_.size()) +
                                     " sequences, the limit is " +
                                     std::to_string(by_region_.size()));
  auto s = std::make_unique<disk_kv::Sequence>();
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
  s->record_bytes = uint32_t(rec);
  s->transient_groups = T;
  std::byte* slots = s->arena.data();
  std::byte* base = s->arena.data() + s->pool_bytes;
  for (int32_t l = 0; l < shape_.n_layer; ++l) {
    disk_kv::Layer& L = s->layers[size_t(l)];
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
      L.tail_ratio.assign(size_t(n_head), 0.0f);
    }
  }
  s->transient = T > 0 ? slots : nullptr;
  s->region = free_regions_.back();
  free_regions_.pop_back();
  by_region_[size_t(s->region)] = s.get();
  arenas_changed_ = true;
  *out = std::move(s);
  return Status::OK();
}

void DiskKvStore::ReleaseSequence(const disk_kv::Sequence& s) {
  // Its buffers may still be the target or source of I/O.
  for (auto& b : reads_) (void)store_->Wait(*b);
  (void)store_->Wait(decode_writes_);
  by_region_[size_t(s.region)] = nullptr;
  free_regions_.push_back(s.region);
  arenas_changed_ = true;
}

Status DiskKvStore::CheckFile() {
  if (!broken_.ok()) return broken_;
  // An unnamed store file lives as long as the process holds it, whatever happens to the
  // directory.
  if (store_->unnamed()) return Status::OK();
  struct stat sb {};
  if (stat(store_->path().c_str(), &sb) != 0 || sb.st_dev != store_dev_ || sb.st_ino != store_ino_)
    broken_ = Status::IOError("disk KV: the store file " + store_->path() +
                              " is gone (was the KV directory " + options_.dir +
                              " removed?); the KV cache of every sequence is lost");
  return broken_;
}

void DiskKvStore::RegisterArenas() {
  if (!arenas_changed_) return;
  arenas_changed_ = false;
  if (!register_status_.ok()) return;
  std::vector<storage::MemoryRegion> regions;
  for (const disk_kv::Sequence* s : by_region_)
    if (s) regions.push_back({s->arena.data(), s->arena.size()});
  register_status_ = store_->RegisterBuffers(regions);
}

void DiskKvStore::AddLoads(int32_t layer, disk_kv::Sequence& s, size_t batch, bool first) {
  disk_kv::Layer& L = s.layers[size_t(layer)];
  storage::IoBatch& rb = *reads_[batch];
  const uint32_t rec = layout_.record_bytes;
  // Reuse is counted on the first selection of each step: a refinement's hits include what
  // the guess loaded moments ago.
  if (first) c_->groups_selected += L.placed.size();
  for (size_t i = 0; i < L.placed.size();) {
    const ReuseBuffer::Placement& p = L.placed[i];
    if (!p.load) {
      if (first) ++c_->reuse_hits;
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
    if (transient) c_->read_through_groups += uint64_t(n);
    rb.AddRead(layout_.Offset(s.region, layer, p.group), s.SlotRecord(layer, p.slot),
               uint32_t(n) * rec, LoadTag(s.region, p.slot, n));
    i = j;
  }
}

Status DiskKvStore::SubmitReads(int32_t layer, size_t batch) {
  storage::IoBatch& rb = *reads_[batch];
  if (rb.empty()) return Status::OK();
  STRATA_RETURN_IF_ERROR(store_->Submit(rb).WithContext("disk KV: reading group records"));
  reads_settled_[batch] = 0;
  if (hooks_.on_read_submit) hooks_.on_read_submit(layer, rb);
  c_->reads_issued += rb.size();
  c_->layer_reads_issued[size_t(layer)] += rb.size();
  if (batch == RefineReads(layer)) c_->refine_reads_issued += rb.size();
  for (size_t i = 0; i < rb.size(); ++i) c_->bytes_read += rb.request(i).length;
  return Status::OK();
}

bool DiskKvStore::RefineOverlapsGuess(int32_t layer) const {
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

Status DiskKvStore::SettleLayer(int32_t layer) {
  const Status guess = SettleReads(layer, GuessReads(layer));
  const Status refine = SettleReads(layer, RefineReads(layer));
  return guess.ok() ? refine : guess;
}

Status DiskKvStore::SettleReads(int32_t layer, size_t batch) {
  if (reads_settled_[batch]) return Status::OK();
  storage::IoBatch& rb = *reads_[batch];
  const auto t0 = Clock::now();
  const Status st = store_->Wait(rb);
  c_->io_wait_seconds += Seconds(t0, Clock::now());
  reads_settled_[batch] = 1;
  if (st.ok()) return st;
  for (size_t i = 0; i < rb.size(); ++i) {
    const uint64_t tag = rb.request(i).tag;
    if (rb.status(i).ok() || tag == kReadbackTag) continue;
    const LoadTarget t = FromLoadTag(tag);
    if (disk_kv::Sequence* s = by_region_[size_t(t.region)])
      for (int32_t k = 0; k < t.count; ++k) s->layers[size_t(layer)].reuse.Invalidate(t.slot + k);
  }
  return st.WithContext("disk KV: reading layer " + std::to_string(layer) + " records");
}

void DiskKvStore::ForgetSettled() { std::fill(reads_settled_.begin(), reads_settled_.end(), 1); }

Status DiskKvStore::SubmitDecodeWrites(std::span<disk_kv::Sequence* const> batch) {
  decode_writes_.Clear();
  for (disk_kv::Sequence* s : batch) {
    if (s->exact) continue;
    for (int32_t l = 0; l < shape_.n_layer; ++l) {
      disk_kv::Layer& L = s->layers[size_t(l)];
      if (L.write_group < 0) continue;
      decode_writes_.AddWrite(layout_.Offset(s->region, l, L.write_group), L.write,
                              layout_.record_bytes, uint64_t(s->region));
      L.write_group = -1;
    }
  }
  if (decode_writes_.empty()) return Status::OK();
  Status st = store_->Submit(decode_writes_);
  if (!st.ok()) {
    decode_writes_.Clear();
    return st.WithContext("disk KV: writing group records");
  }
  c_->write_requests += decode_writes_.size();
  c_->bytes_written += uint64_t(decode_writes_.size()) * layout_.record_bytes;
  return Status::OK();
}

Status DiskKvStore::SettleDecodeWrites() {
  if (decode_writes_.empty()) return Status::OK();
  const auto t0 = Clock::now();
  const Status st = store_->Wait(decode_writes_);
  c_->io_wait_seconds += Seconds(t0, Clock::now());
  if (!st.ok()) {
    // The failed records are gone for good: their sequences cannot attend correctly.
    for (size_t i = 0; i < decode_writes_.size(); ++i) {
      if (decode_writes_.status(i).ok()) continue;
      disk_kv::Sequence* s = by_region_[size_t(decode_writes_.request(i).tag)];
      if (s && s->lost.ok())
        s->lost = decode_writes_.status(i).WithContext(
            "disk KV: sequence " + std::to_string(s->id) + " lost a group record");
    }
  }
  decode_writes_.Clear();
  return st.WithContext("disk KV: writing group records");
}

Status DiskKvStore::SubmitStaging(storage::IoBatch& batch, const char* what) {
  if (batch.empty()) return Status::OK();
  STRATA_RETURN_IF_ERROR(store_->Submit(batch).WithContext(what));
  for (size_t i = 0; i < batch.size(); ++i) {
    const storage::IoRequest& r = batch.request(i);
    if (r.kind == storage::IoKind::kRead) {
      ++c_->reads_issued;
      c_->bytes_read += r.length;
    } else {
      ++c_->write_requests;
      c_->bytes_written += r.length;
    }
  }
  return Status::OK();
}

Status DiskKvStore::WaitStaging(storage::IoBatch& batch, const char* what) {
  const auto t0 = Clock::now();
  const Status st = store_->Wait(batch);
  c_->io_wait_seconds += Seconds(t0, Clock::now());
  return st.WithContext(what);
}

}  // namespace strata
