// IoBackend: the seam between BlockStore's request bookkeeping and the code that moves bytes:
// io_uring (uring_backend.h), a pread/pwrite thread pool (thread_pool_backend.h), or a
// decorator that shapes another backend's traffic (slow_disk.h, fault_injection.h).
//
// Internal to storage/. A backend reports raw outcomes (bytes moved, possibly short, or
// -errno); turning them into Statuses, finishing short transfers and counting is the store's
// job, so every backend behaves the same to the KV layer.
//
// Threads: BlockStore calls Submit, CancelAll and RegisterBuffers under its submission lock
// and Reap under its reaping lock, so each is single-threaded, but Submit and Reap run
// concurrently on different threads: a backend keeps its submission and completion sides
// independent.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "storage/aligned_buffer.h"
#include "storage/io_batch.h"

namespace strata::storage {

struct BackendOp {
  uint64_t token = 0;        // handed back unchanged in BackendResult
  uint64_t file_offset = 0;  // absolute byte offset in the file or device
  void* buffer = nullptr;
  uint32_t length = 0;
  IoKind kind = IoKind::kRead;
  int32_t fixed_buffer = -1;  // index of the registered region holding buffer, or -1
};

struct BackendResult {
  uint64_t token = 0;
  int64_t result = 0;  // bytes moved (may be fewer than asked) or -errno
};

// A wait with no limit.
inline constexpr std::chrono::nanoseconds kWaitForever = std::chrono::nanoseconds::max();

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  // One line for counters and reports, e.g. "io_uring qd=64 fixed-file".
  virtual std::string Describe() const = 0;
  // Starts every op. Each op yields exactly one BackendResult later, failures included.
  virtual void Submit(std::span<const BackendOp> ops) = 0;
  // Moves finished results into out (at most out.size()). Waits up to max_wait until at least
  // min_results are there; the caller only asks for results of ops it has submitted.
  virtual size_t Reap(std::span<BackendResult> out, size_t min_results,
                      std::chrono::nanoseconds max_wait) = 0;
  // Asks in-flight ops to finish soon: ones that have not started complete with -ECANCELED.
  // Returns at once; the results still come through Reap.
  virtual void CancelAll() = 0;
  // Replaces the set of registered buffer regions (only with nothing in flight). Region i is
  // what BackendOp::fixed_buffer == i refers to.
  virtual Status RegisterBuffers(std::span<const MemoryRegion> regions) = 0;
};

}  // namespace strata::storage
