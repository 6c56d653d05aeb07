// ShapingBackend: a decorator over another IoBackend that decides, per request, to hold its
// completion until a later time, to fail it without running it, to run only part of it, or to
// report a different byte count than what happened. The slow-disk emulation (slow_disk.h) and
// fault injection (fault_injection.h) are both shapes, so both work over either backend and
// the store above cannot tell them from a real device.
//
// Internal to storage/. Threads: as io_backend.h; Shape() is called from Submit only.
// Held completions are released by Reap; CancelAll releases them all at once, and a Reap
// that waits on held completions wakes at least every 10 ms to notice it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "storage/io_backend.h"

namespace strata::storage {

struct OpShape {
  using Clock = std::chrono::steady_clock;
  Clock::time_point release_at{};  // completion is reported no earlier than this
  int fail_errno = 0;              // > 0: do not run the op; it completes with -fail_errno
  uint32_t run_length = 0;    // > 0: run only the first run_length bytes (a real short transfer)
  int64_t report_bytes = -1;  // >= 0: report this byte count if the op succeeded
};

class ShapingBackend : public IoBackend {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ShapingBackend(std::unique_ptr<IoBackend> inner);
  ~ShapingBackend() override;

  void Submit(std::span<const BackendOp> ops) final;
  size_t Reap(std::span<BackendResult> out, size_t min_results,
              std::chrono::nanoseconds max_wait) final;
  void CancelAll() final;
  Status RegisterBuffers(std::span<const MemoryRegion> regions) final;

 protected:
  // How to treat op, submitted at `now`.
  virtual OpShape Shape(const BackendOp& op, Clock::time_point now) = 0;
  const IoBackend& inner() const { return *inner_; }

 private:
  struct Held {
    Clock::time_point release_at;
    BackendResult result;
  };
  struct Pending {
    Clock::time_point release_at;
    int64_t report_bytes;
  };

  // Moves inner results into held_ (under mu_).
  void AbsorbLocked(std::span<const BackendResult> results);
  // Moves due held results into out (under mu_).
  size_t TakeDueLocked(std::span<BackendResult> out, Clock::time_point now);

  std::unique_ptr<IoBackend> inner_;
  std::mutex mu_;
  std::condition_variable cancel_cv_;
  std::unordered_map<uint64_t, Pending> pending_;  // by token, ops passed to inner_
  std::vector<Held> held_;
  std::vector<BackendOp> forward_;        // scratch for Submit
  std::vector<BackendResult> inner_out_;  // scratch for Reap
  bool cancelled_ = false;
};

}  // namespace strata::storage
