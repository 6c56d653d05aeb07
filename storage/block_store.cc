#include "storage/block_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "storage/fault_injection.h"
#include "storage/slow_disk.h"
#include "storage/store_file.h"
#include "storage/thread_pool_backend.h"
#include "storage/uring_backend.h"

namespace strata::storage {
namespace {

// A request that keeps coming back short is given up after this many submissions; real short
// transfers (a signal, a page-cache read racing truncation) resolve in one or two.
constexpr uint32_t kMaxAttempts = 8;
// io_uring takes at most 1 GiB per registered buffer (io_uring_register(2)).
constexpr size_t kMaxRegisteredChunk = size_t{1} << 30;
// Default pread pool size cap: one blocked thread per request in flight.
constexpr uint32_t kMaxDefaultThreads = 256;

thread_local bool t_in_callback = false;

const char* KindName(IoKind k) { return k == IoKind::kRead ? "read" : "write"; }

}  // namespace

Status BlockStore::Open(const StoreOptions& options, std::unique_ptr<BlockStore>* out) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  const std::string forced = ForcedFallback();
  if (!forced.empty() && forced != "io_uring" && forced != "direct" && forced != "tmpfile") {
    return Status::InvalidArgument("STRATA_STORAGE_FORCE_FALLBACK='" + forced +
                                   "': expected 'io_uring', 'direct' or 'tmpfile'");
  }
  std::unique_ptr<BlockStore> store(new BlockStore());
  store->options_ = options;
  STRATA_RETURN_IF_ERROR(StoreFile::Open(options, &store->file_));
  const StoreFile& file = *store->file_;
  store->path_ = file.path();
  store->store_id_ = file.store_id();
  store->unnamed_ = file.unnamed();
  store->capacity_ = file.capacity();
  store->data_origin_ = file.data_origin();
  store->block_size_ = file.block_size();
  store->direct_io_ = file.direct_io();
  store->queue_depth_ = options.queue_depth;

  std::string reason = options.direct_io ? file.direct_io_refusal() : std::string();
  std::unique_ptr<IoBackend> backend;
  if (options.backend == BackendKind::kUring && !file.direct_io()) {
    return Status::NotSupported("io_uring backend asked for " + store->path_ + ", but " +
                                (reason.empty() ? std::string("direct_io is off") : reason));
  }
  if (options.backend != BackendKind::kThreadPool && file.direct_io()) {
    UringConfig config;
    config.queue_depth = options.queue_depth;
    config.sq_poll = options.sq_poll;
    config.sq_poll_idle_ms = options.sq_poll_idle_ms;
    config.register_file = options.register_file;
    const Status s =
        forced == "io_uring"
            ? Status::FromErrno("io_uring_setup (forced by STRATA_STORAGE_FORCE_FALLBACK)", EPERM)
            : CreateUringBackend(file.fd(), config, &backend);
    if (!s.ok()) {
      if (options.backend == BackendKind::kUring) return s.WithContext("io_uring backend");
      reason = "io_uring unavailable: " + s.message();
      backend.reset();
    }
  }
  store->uses_uring_ = backend != nullptr;
  if (backend == nullptr) {
    const uint32_t threads = options.fallback_threads != 0
                                 ? options.fallback_threads
                                 : std::min(options.queue_depth, kMaxDefaultThreads);
    STRATA_RETURN_IF_ERROR(CreateThreadPoolBackend(file.fd(), threads, &backend));
  }
  if (options.slow_disk.enabled) {
    backend = WrapWithSlowDisk(std::move(backend), options.slow_disk);
    store->emulation_ = options.slow_disk.Describe();
  }
  if (options.faults != nullptr) {
    backend =
        WrapWithFaults(std::move(backend), options.faults, store->data_origin_, store->block_size_);
  }
  store->backend_ = std::move(backend);
  store->backend_name_ = store->backend_->Describe();
  store->slots_.resize(options.queue_depth);
  store->free_slots_.reserve(options.queue_depth);
  for (uint32_t i = options.queue_depth; i > 0; --i) store->free_slots_.push_back(i - 1);
  store->ops_scratch_.reserve(options.queue_depth);
  store->results_scratch_.resize(2 * size_t{options.queue_depth} + 8);

  store->file_->MarkOpened();
  if (options.backend == BackendKind::kAuto && !reason.empty()) {
    store->fallback_reason_ = reason;
    store->Report("strata storage: " + store->path_ + ": using " + store->backend_name_ +
                  " instead of io_uring with O_DIRECT: " + reason);
  }
  if (!store->emulation_.empty()) {
    store->Report("strata storage: " + store->path_ + ": " + store->emulation_ +
                  " (not the real device's speed)");
  }
  *out = std::move(store);
  return Status::OK();
}

BlockStore::~BlockStore() {
  const Status s = Close();
  if (!s.ok()) Report("strata storage: closing " + path_ + ": " + s.ToString());
}

void BlockStore::Report(const std::string& line) const {
  if (options_.report) {
    options_.report(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

Status BlockStore::Validate(const IoRequest& r) const {
  const char* kind = KindName(r.kind);
  auto where = [&] {
    return std::string(kind) + " of " + path_ + " at offset " + std::to_string(r.offset) +
           " length " + std::to_string(r.length);
  };
  if (r.length == 0) return Status::InvalidArgument(where() + ": zero length");
  if (r.buffer == nullptr) return Status::InvalidArgument(where() + ": null buffer");
  if (r.offset % block_size_ != 0 || r.length % block_size_ != 0) {
    return Status::InvalidArgument(where() + ": offset and length must be multiples of the " +
                                   std::to_string(block_size_) + "-byte block size");
  }
  if (reinterpret_cast<uintptr_t>(r.buffer) % block_size_ != 0) {
    char addr[32];
    std::snprintf(addr, sizeof(addr), "%p", r.buffer);
    return Status::InvalidArgument(where() + ": buffer " + addr + " is not aligned to " +
                                   std::to_string(block_size_) + " bytes");
  }
  if (r.offset > capacity_ || r.length > capacity_ - r.offset) {
    return Status::OutOfRange(where() + ": ends past the store's capacity of " +
                              std::to_string(capacity_) + " bytes");
  }
  return Status::OK();
}

Status BlockStore::Submit(IoBatch& batch) {
  if (batch.empty()) return Status::OK();
  if (!batch.done()) return Status::InvalidArgument("Submit: the batch is already in flight");
  for (size_t i = 0; i < batch.size(); ++i) {
    const Status s = Validate(batch.requests_[i]);
    if (!s.ok()) return s.WithContext("request " + std::to_string(i) + " of the batch");
  }
  batch.statuses_.assign(batch.size(), Status());
  batch.store_ = this;
  // Counted before any request starts: a completion may be reaped before Submit returns.
  batch.pending_.store(batch.size(), std::memory_order_release);
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) {
    batch.pending_.store(0, std::memory_order_release);
    return Status::Aborted("store " + path_ + " is closed");
  }
  if (!expired_.empty()) {
    batch.pending_.store(0, std::memory_order_release);
    return Status::IOError(expired_);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!free_slots_.empty()) {
      StartLocked(&batch, static_cast<uint32_t>(i), now);
    } else {
      waiting_.push_back(Finished{&batch, static_cast<uint32_t>(i)});
    }
  }
  FlushStartsLocked();
  return Status::OK();
}

void BlockStore::StartLocked(IoBatch* batch, uint32_t index, Clock::time_point now) {
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  Slot& s = slots_[slot];
  s.batch = batch;
  s.index = index;
  s.attempts = 1;
  s.done = 0;
  s.start = now;
  ++in_flight_;
  ops_scratch_.push_back(OpFor(slot));
}

BackendOp BlockStore::OpFor(uint32_t slot) const {
  const Slot& s = slots_[slot];
  const IoRequest& r = s.batch->requests_[s.index];
  BackendOp op;
  op.token = slot;
  op.file_offset = data_origin_ + r.offset + s.done;
  op.buffer = static_cast<std::byte*>(r.buffer) + s.done;
  op.length = r.length - s.done;
  op.kind = r.kind;
  const auto* begin = static_cast<const std::byte*>(op.buffer);
  for (size_t i = 0; i < registered_.size(); ++i) {
    const auto* base = static_cast<const std::byte*>(registered_[i].base);
    if (begin >= base && begin + op.length <= base + registered_[i].length) {
      op.fixed_buffer = static_cast<int32_t>(i);
      break;
    }
  }
  return op;
}

void BlockStore::FlushStartsLocked() {
  if (!ops_scratch_.empty()) {
    backend_->Submit(ops_scratch_);
    ops_scratch_.clear();
  }
  counters_.SetDepth(in_flight_, waiting_.size());
}

void BlockStore::CompleteLocked(const BackendResult& r, Clock::time_point now) {
  if (r.token >= slots_.size() || slots_[r.token].batch == nullptr) return;  // not ours
  const uint32_t slot = static_cast<uint32_t>(r.token);
  Slot& s = slots_[slot];
  const IoRequest& req = s.batch->requests_[s.index];
  const uint32_t remaining = req.length - s.done;
  auto where = [&] {
    return std::string(KindName(req.kind)) + " of " + path_ + " at offset " +
           std::to_string(req.offset) + " length " + std::to_string(req.length);
  };
  if (r.result < 0) {
    const int err = static_cast<int>(-r.result);
    if (err == ECANCELED) {
      FinishLocked(slot, Status::Aborted(where() + ": cancelled because the store is closing"),
                   now);
      return;
    }
    std::string what = where();
    if (s.done > 0) what += " (after " + std::to_string(s.done) + " bytes)";
    FinishLocked(slot, Status::FromErrno(what, err), now);
    return;
  }
  if (static_cast<uint64_t>(r.result) >= remaining) {
    FinishLocked(slot, Status::OK(), now);
    return;
  }
  // A short transfer: finish it with another request for the rest, or say why not.
  counters_.RecordShortTransfer();
  s.done += static_cast<uint32_t>(r.result);
  const std::string got = std::to_string(s.done) + " of " + std::to_string(req.length) + " bytes";
  if (r.result == 0) {
    FinishLocked(slot,
                 Status::IOError(where() + ": transfer stopped after " + got +
                                 " (0-byte result: the file ends early)"),
                 now);
  } else if (direct_io_ && s.done % block_size_ != 0) {
    FinishLocked(slot,
                 Status::IOError(where() + ": short transfer of " + got +
                                 " is not block-aligned and cannot be resumed with O_DIRECT"),
                 now);
  } else if (s.attempts >= kMaxAttempts) {
    FinishLocked(slot,
                 Status::IOError(where() + ": still short (" + got + ") after " +
                                 std::to_string(s.attempts) + " attempts"),
                 now);
  } else if (closing_) {
    FinishLocked(slot, Status::Aborted(where() + ": short (" + got + ") and the store is closing"),
                 now);
  } else {
    ++s.attempts;
    ops_scratch_.push_back(OpFor(slot));
  }
}

void BlockStore::FinishLocked(uint32_t slot, Status status, Clock::time_point now) {
  Slot& s = slots_[slot];
  const IoRequest& req = s.batch->requests_[s.index];
  const bool cancelled = status.code() == Status::Code::kAborted;
  counters_.RecordCompletion(req.kind, req.length, static_cast<uint64_t>((now - s.start).count()),
                             status.ok(), cancelled);
  finished_.emplace_back(Finished{s.batch, s.index}, std::move(status));
  s.batch = nullptr;
  free_slots_.push_back(slot);
  --in_flight_;
  if (!waiting_.empty() && !closing_ && expired_.empty()) {
    const Finished next = waiting_.front();
    waiting_.pop_front();
    StartLocked(next.batch, next.index, now);
  }
}

size_t BlockStore::ReapRound(std::chrono::nanoseconds max_wait) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (backend_ == nullptr) return 0;                            // closed
    if (in_flight_ == 0) max_wait = std::chrono::nanoseconds(0);  // nothing could arrive
  }
  const bool block = max_wait > std::chrono::nanoseconds(0);
  const size_t n = backend_->Reap(results_scratch_, block ? 1 : 0, max_wait);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > 0) {
      const Clock::time_point now = Clock::now();
      for (size_t i = 0; i < n; ++i) CompleteLocked(results_scratch_[i], now);
      FlushStartsLocked();
    }
    delivering_.swap(finished_);
  }
  const size_t delivered = delivering_.size();
  Deliver();
  return delivered;
}

void BlockStore::ExpireIfStuck() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    const Slot* oldest = nullptr;
    for (const Slot& sl : slots_)
      if (sl.batch != nullptr && (oldest == nullptr || sl.start < oldest->start)) oldest = &sl;
    if (oldest == nullptr || now - oldest->start < options_.io_timeout) return;
    const IoRequest& r = oldest->batch->requests_[oldest->index];
    expired_ = std::string(KindName(r.kind)) + " of " + path_ + " at offset " +
               std::to_string(r.offset) + " length " + std::to_string(r.length) +
               " did not complete within " + std::to_string(options_.io_timeout.count()) +
               " ms (storage.io_timeout; " + std::to_string(in_flight_) +
               " requests in flight): the device or the kernel stopped answering, so the " +
               "store takes no more requests";
    // Ask the backend to drop what it still holds; a late completion finds its slot free
    // and is ignored, and no slot is reused once the store has stopped.
    backend_->CancelAll();
    for (uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].batch != nullptr) FinishLocked(i, Status::IOError(expired_), now);
    FailWaitingLocked([&](const IoRequest&) { return Status::IOError(expired_); });
  }
  ReapRound(std::chrono::nanoseconds(0));  // delivers what was just failed
}

void BlockStore::ReapWatched() {
  if (options_.io_timeout.count() == 0) {
    ReapRound(kWaitForever);
    return;
  }
  // Wake at least once a second to check that requests still complete.
  const auto slice =
      std::min<std::chrono::nanoseconds>(options_.io_timeout, std::chrono::seconds(1));
  if (ReapRound(slice) == 0) ExpireIfStuck();
}

void BlockStore::FailWaitingLocked(const std::function<Status(const IoRequest&)>& why) {
  for (const Finished& w : waiting_) {
    const IoRequest& r = w.batch->requests_[w.index];
    counters_.RecordCompletion(r.kind, r.length, 0, false, true);
    finished_.emplace_back(w, why(r));
  }
  waiting_.clear();
}

void BlockStore::Deliver() {
  for (auto& [f, status] : delivering_) {
    IoBatch* b = f.batch;
    b->statuses_[f.index] = std::move(status);
    if (b->callback_) {
      t_in_callback = true;
      b->callback_(IoCompletion{b->requests_[f.index], f.index, b->statuses_[f.index]});
      t_in_callback = false;
    }
    // The last touch of b: once pending reaches 0 its owner may destroy it.
    b->pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
  delivering_.clear();
}

size_t BlockStore::Poll() {
  if (t_in_callback) return 0;
  std::unique_lock<std::mutex> reap(reap_mu_, std::try_to_lock);
  if (!reap.owns_lock()) return 0;
  return ReapRound(std::chrono::nanoseconds(0));
}

Status BlockStore::Wait(IoBatch& batch) {
  if (t_in_callback) {
    return Status::InvalidArgument("BlockStore::Wait called from a completion callback");
  }
  if (!batch.done() && batch.store_ != this) {
    return Status::InvalidArgument("BlockStore::Wait: the batch is in flight on another store");
  }
  while (!batch.done()) {
    std::lock_guard<std::mutex> reap(reap_mu_);
    if (batch.done()) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_ == 0 && finished_.empty()) {
        return Status::Internal("batch of " + path_ + " pending with nothing in flight");
      }
    }
    ReapWatched();
  }
  return batch.FirstError();
}

size_t BlockStore::Reap(size_t min_completions) {
  if (t_in_callback) return 0;
  size_t total = 0;
  while (total < min_completions) {
    std::lock_guard<std::mutex> reap(reap_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_ == 0 && finished_.empty()) break;
    }
    total += ReapRound(kWaitForever);
  }
  return total;
}

Status BlockStore::Read(uint64_t offset, void* buffer, uint32_t length) {
  IoBatch batch;
  batch.AddRead(offset, buffer, length);
  STRATA_RETURN_IF_ERROR(Submit(batch));
  return Wait(batch);
}

Status BlockStore::Write(uint64_t offset, const void* buffer, uint32_t length) {
  IoBatch batch;
  batch.AddWrite(offset, buffer, length);
  STRATA_RETURN_IF_ERROR(Submit(batch));
  return Wait(batch);
}

Status BlockStore::Sync() {
  // Under the lock so Close cannot take the descriptor away; submissions wait meanwhile.
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr || backend_ == nullptr || closing_) {
    return Status::Aborted("store " + path_ + " is closed");
  }
  if (fdatasync(file_->fd()) != 0) return Status::FromErrno("fdatasync " + path_, errno);
  return Status::OK();
}

Status BlockStore::Close() {
  {
    // Cancel first, without the reaping lock: a reaper blocked on a long (e.g. injected)
    // delay is released by the cancellation and then lets this thread in.
    std::lock_guard<std::mutex> lock(mu_);
    if (backend_ == nullptr) return Status::OK();
    if (!closing_) {
      closing_ = true;
      FailWaitingLocked([&](const IoRequest& r) {
        return Status::Aborted(std::string(KindName(r.kind)) + " of " + path_ + " at offset " +
                               std::to_string(r.offset) + " length " + std::to_string(r.length) +
                               ": cancelled before it started (store closing)");
      });
      backend_->CancelAll();
    }
  }
  std::lock_guard<std::mutex> reap(reap_mu_);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (backend_ == nullptr) return Status::OK();  // another thread finished closing
      if (in_flight_ == 0 && finished_.empty()) break;
    }
    ReapWatched();  // what the device never answers must not keep Close waiting either
  }
  std::unique_ptr<IoBackend> backend;
  {
    std::lock_guard<std::mutex> lock(mu_);
    backend = std::move(backend_);
    counters_.SetDepth(0, 0);
  }
  backend.reset();                        // joins pool threads, tears down the ring
  std::lock_guard<std::mutex> lock(mu_);  // Sync may be reading the descriptor
  file_->Close();
  return Status::OK();
}

Status BlockStore::RegisterBuffers(std::span<const MemoryRegion> regions) {
  std::vector<MemoryRegion> chunks;
  for (const MemoryRegion& r : regions) {
    if (r.base == nullptr || r.length == 0) {
      return Status::InvalidArgument("RegisterBuffers: empty region");
    }
    for (size_t off = 0; off < r.length; off += kMaxRegisteredChunk) {
      chunks.push_back(MemoryRegion{static_cast<std::byte*>(r.base) + off,
                                    std::min(kMaxRegisteredChunk, r.length - off)});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (backend_ == nullptr || closing_) return Status::Aborted("store " + path_ + " is closed");
  if (in_flight_ != 0 || !waiting_.empty()) {
    return Status::InvalidArgument("RegisterBuffers on " + path_ + " with " +
                                   std::to_string(in_flight_ + waiting_.size()) +
                                   " requests in flight");
  }
  registered_.clear();
  STRATA_RETURN_IF_ERROR(backend_->RegisterBuffers(chunks));
  registered_ = std::move(chunks);
  return Status::OK();
}

uint64_t BlockStore::registered_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const MemoryRegion& r : registered_) n += r.length;
  return n;
}

CountersSnapshot BlockStore::counters() const {
  CountersSnapshot s = counters_.Snapshot();
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.backend = backend_ != nullptr ? backend_->Describe() : backend_name_;
  }
  s.fallback_reason = fallback_reason_;
  s.emulation = emulation_;
  s.direct_io = direct_io_;
  return s;
}

}  // namespace strata::storage
