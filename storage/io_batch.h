// IoBatch: a caller-owned set of aligned reads and writes that a BlockStore runs together,
// with one Status per request once it has completed.
//
// This is how the KV layer talks to the disk: fill a batch (tens to hundreds of group
// records), Submit it, compute, then Wait for exactly that batch. A batch can be reused
// (Clear, add requests again) once done() is true.
//
// Threads: fill and Clear a batch on one thread; Submit it from any thread. While it is in
// flight, only done() may be read, from any thread; request(i), status(i) and FirstError()
// are valid once done() returned true (the store publishes the statuses before done()).
// The completion callback runs on whichever thread reaps the completion (the one calling
// BlockStore::Poll/Wait/Reap, or Close during draining); it may Submit, but must not Poll,
// Wait or Reap (those report an error or do nothing when called from a callback).
// Destroying a batch that is still in flight waits for it, so its buffers are never written
// after the batch is gone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"

namespace strata::storage {

class BlockStore;

enum class IoKind : uint8_t { kRead, kWrite };

struct IoRequest {
  IoKind kind = IoKind::kRead;
  uint32_t length = 0;     // bytes; a multiple of BlockStore::block_size()
  uint64_t offset = 0;     // in the store's data area; a multiple of BlockStore::block_size()
  void* buffer = nullptr;  // aligned to BlockStore::block_size(); only read for writes
  uint64_t tag = 0;        // the caller's label, handed back in IoCompletion
};

struct IoCompletion {
  const IoRequest& request;
  size_t index;          // position of the request in its batch
  const Status& status;  // OK means exactly request.length bytes were transferred
};

using CompletionCallback = std::function<void(const IoCompletion&)>;

class IoBatch {
 public:
  IoBatch() = default;
  ~IoBatch();
  IoBatch(const IoBatch&) = delete;
  IoBatch& operator=(const IoBatch&) = delete;

  void AddRead(uint64_t offset, void* buffer, uint32_t length, uint64_t tag = 0);
  void AddWrite(uint64_t offset, const void* buffer, uint32_t length, uint64_t tag = 0);
  // Drops all requests (keeps the capacity). Must not be in flight.
  void Clear();
  // Called once per request as it completes; see the header comment for the thread.
  void set_callback(CompletionCallback callback) { callback_ = std::move(callback); }
  void reserve(size_t n);

  size_t size() const { return requests_.size(); }
  bool empty() const { return requests_.empty(); }
  const IoRequest& request(size_t i) const { return requests_[i]; }
  IoRequest& mutable_request(size_t i) { return requests_[i]; }  // only while not in flight

  // True when no request is in flight (also before the first Submit).
  bool done() const { return pending_.load(std::memory_order_acquire) == 0; }
  const Status& status(size_t i) const { return statuses_[i]; }
  // OK when every request succeeded, else the first failed request's status.
  Status FirstError() const;
  size_t failed_count() const;

 private:
  friend class BlockStore;

  std::vector<IoRequest> requests_;
  std::vector<Status> statuses_;
  std::atomic<size_t> pending_{0};
  BlockStore* store_ = nullptr;  // the store it was last submitted to
  CompletionCallback callback_;
};

}  // namespace strata::storage
