// BlockStore: an asynchronous store of aligned extents in one file (or block device), the
// disk tier of the KV cache. It knows bytes and offsets, never tokens or layers.
//
// Open picks the backend: io_uring with O_DIRECT, registered file and (once registered)
// buffers; or a pread/pwrite thread pool where io_uring or O_DIRECT is refused, with the reason
// reported once through StoreOptions::report and kept in fallback_reason(). Slow-disk emulation
// and fault injection sit between the store and either backend, so the KV layer cannot tell
// a real disk from the test double.
//
// Typical use at decode: fill an IoBatch with reads into pool buffers, Submit, compute, then
// Wait for that batch; Poll reaps without blocking. Requests beyond queue_depth wait inside
// the store and start as earlier ones are reaped.
//
// Errors: bad requests (misaligned, past the end, zero length, store closed) are rejected by
// Submit before anything starts. A request that fails completes with a Status naming the
// operation, file, offset, length and errno; a short transfer is finished by resubmitting the
// remainder or reported as an error, never returned as success.
//
// Threads: Submit, Read, Write, Sync, the accessors and counters() may be called from any
// thread. Poll, Wait and Reap may be called from any thread too, but one reaps at a time (the
// others wait their turn); the intended shape is that the compute thread reaps. Completion
// callbacks run on the reaping thread (see io_batch.h). RegisterBuffers needs nothing in
// flight. Close (also run by the destructor) cancels what has not started, waits for the rest,
// and deletes the file unless keep_files; after it, Submit fails with kAborted.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "storage/aligned_buffer.h"
#include "storage/counters.h"
#include "storage/io_backend.h"
#include "storage/io_batch.h"
#include "storage/store_options.h"

namespace strata::storage {

class StoreFile;

class BlockStore {
 public:
  static Status Open(const StoreOptions& options, std::unique_ptr<BlockStore>* out);
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Starts every request of batch, or none if one is invalid (the error names it).
  Status Submit(IoBatch& batch);
  // Delivers finished completions without blocking; returns how many. 0 if another thread is
  // reaping at the moment.
  size_t Poll();
  // Blocks until every request of batch has completed; returns batch.FirstError().
  Status Wait(IoBatch& batch);
  // Blocks until at least min_completions requests (of any batch) completed in this call, or
  // nothing is left in flight; returns how many completed.
  size_t Reap(size_t min_completions);

  // Synchronous conveniences: one request, submitted and waited for.
  Status Read(uint64_t offset, void* buffer, uint32_t length);
  Status Write(uint64_t offset, const void* buffer, uint32_t length);
  // fdatasync: makes completed writes durable (the KV cache does not need it between runs).
  // Submissions from other threads wait while it runs.
  Status Sync();
  Status Close();

  // Registers memory (e.g. BufferPool::region()) for fixed-buffer I/O; requests whose buffer
  // lies inside a registered region then skip the per-request page pinning. Replaces the
  // previous set; needs nothing in flight. A no-op for the pread pool.
  Status RegisterBuffers(std::span<const MemoryRegion> regions);
  // Bytes registered by the last RegisterBuffers that succeeded.
  uint64_t registered_bytes() const;

  const std::string& path() const { return path_; }
  // A temporary store made without a name (OpenMode::kTemporary): path() only describes it.
  bool unnamed() const { return unnamed_; }
  uint64_t capacity() const { return capacity_; }
  // Where data offset 0 lies in the file (after the store header), e.g. for running another
  // tool such as fio over exactly the store's data.
  uint64_t data_offset_in_file() const { return data_origin_; }
  uint32_t block_size() const { return block_size_; }
  uint32_t queue_depth() const { return queue_depth_; }
  bool direct_io() const { return direct_io_; }
  bool uses_io_uring() const { return uses_uring_; }
  const std::string& backend_name() const { return backend_name_; }
  // Why the store is not on io_uring + O_DIRECT; empty when it is.
  const std::string& fallback_reason() const { return fallback_reason_; }
  const std::string& store_id() const { return store_id_; }
  CountersSnapshot counters() const;

 private:
  using Clock = std::chrono::steady_clock;

  // One request in the backend (or, on a short transfer, its remainder).
  struct Slot {
    IoBatch* batch = nullptr;
    uint32_t index = 0;     // in batch
    uint32_t attempts = 0;  // submissions so far
    uint32_t done = 0;      // bytes transferred so far
    Clock::time_point start;
  };
  struct Finished {
    IoBatch* batch;
    uint32_t index;
  };

  BlockStore() = default;
  Status Validate(const IoRequest& r) const;
  // Takes a free slot for (batch, index) and appends its op to ops_scratch_ (under mu_).
  void StartLocked(IoBatch* batch, uint32_t index, Clock::time_point now);
  BackendOp OpFor(uint32_t slot) const;
  // Turns a backend result into finishing or resubmitting (under mu_).
  void CompleteLocked(const BackendResult& r, Clock::time_point now);
  void FinishLocked(uint32_t slot, Status status, Clock::time_point now);
  void FlushStartsLocked();
  // One round of reaping: waits up to max_wait (zero: not at all) for at least one result.
  // Returns requests finished. Caller holds reap_mu_.
  size_t ReapRound(std::chrono::nanoseconds max_wait);
  // Fails every request once one has been in flight longer than options_.io_timeout and
  // stops the store taking more (see StoreOptions::io_timeout). Caller holds reap_mu_.
  void ExpireIfStuck();
  // One round of blocking reaping under the watchdog: waits forever when io_timeout is 0,
  // else at most a second and then checks for stuck requests. Caller holds reap_mu_.
  void ReapWatched();
  // Finishes every request still waiting for a slot with why(request) (under mu_).
  void FailWaitingLocked(const std::function<Status(const IoRequest&)>& why);
  // Publishes finished requests: callbacks, statuses, batch counts. Caller holds reap_mu_.
  void Deliver();
  void Report(const std::string& line) const;

  std::unique_ptr<StoreFile> file_;
  std::unique_ptr<IoBackend> backend_;
  StoreOptions options_;
  std::string path_;
  std::string store_id_;
  bool unnamed_ = false;
  std::string backend_name_;
  std::string fallback_reason_;
  std::string emulation_;
  uint64_t capacity_ = 0;
  uint64_t data_origin_ = 0;
  uint32_t block_size_ = 0;
  uint32_t queue_depth_ = 0;
  bool direct_io_ = false;
  bool uses_uring_ = false;

  // Submission side: slots, waiting requests, state. Held while calling backend Submit.
  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::deque<Finished> waiting_;  // requests waiting for a slot
  std::vector<BackendOp> ops_scratch_;
  std::vector<std::pair<Finished, Status>> finished_;  // filled under mu_, delivered after
  size_t in_flight_ = 0;
  bool closing_ = false;
  std::string expired_;  // why the store stopped taking requests ("" while it works)
  std::vector<MemoryRegion> registered_;

  // Reaping side: one reaper at a time.
  std::mutex reap_mu_;
  std::vector<BackendResult> results_scratch_;
  std::vector<std::pair<Finished, Status>> delivering_;

  StoreCounters counters_;
};

}  // namespace strata::storage
