#include "storage/shaping_backend.h"

#include <algorithm>
#include <cerrno>
#include <thread>

namespace strata::storage {
namespace {

// Longest a Reap sleeps on held completions before looking for a CancelAll again.
constexpr std::chrono::milliseconds kWakeSlice{10};
// Held completions due sooner than this are waited for by yielding, not sleeping.
constexpr std::chrono::microseconds kSpinBelow{100};

}  // namespace

ShapingBackend::ShapingBackend(std::unique_ptr<IoBackend> inner) : inner_(std::move(inner)) {}

ShapingBackend::~ShapingBackend() = default;

Status ShapingBackend::RegisterBuffers(std::span<const MemoryRegion> regions) {
  return inner_->RegisterBuffers(regions);
}

void ShapingBackend::Submit(std::span<const BackendOp> ops) {
  forward_.clear();
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const BackendOp& op : ops) {
      const OpShape shape = Shape(op, now);
      if (shape.fail_errno > 0) {
        held_.push_back(Held{shape.release_at, BackendResult{op.token, -shape.fail_errno}});
        continue;
      }
      BackendOp run = op;
      if (shape.run_length > 0 && shape.run_length < op.length) run.length = shape.run_length;
      // Registered before the op starts, so its result can never arrive unannounced.
      pending_[op.token] = Pending{shape.release_at, shape.report_bytes};
      forward_.push_back(run);
    }
  }
  if (!forward_.empty()) inner_->Submit(forward_);
}

void ShapingBackend::AbsorbLocked(std::span<const BackendResult> results) {
  for (BackendResult r : results) {
    auto it = pending_.find(r.token);
    Clock::time_point release_at{};
    if (it != pending_.end()) {
      release_at = it->second.release_at;
      if (r.result >= 0 && it->second.report_bytes >= 0) r.result = it->second.report_bytes;
      pending_.erase(it);
    }
    held_.push_back(Held{release_at, r});
  }
}

size_t ShapingBackend::TakeDueLocked(std::span<BackendResult> out, Clock::time_point now) {
  size_t n = 0;
  for (size_t i = 0; i < held_.size() && n < out.size();) {
    if (cancelled_ || held_[i].release_at <= now) {
      out[n++] = held_[i].result;
      held_[i] = held_.back();
      held_.pop_back();
    } else {
      ++i;
    }
  }
  return n;
}

size_t ShapingBackend::Reap(std::span<BackendResult> out, size_t min_results,
                            std::chrono::nanoseconds max_wait) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      max_wait == kWaitForever ? Clock::time_point::max() : start + max_wait;
  inner_out_.resize(std::max<size_t>(out.size(), 64));
  size_t n = 0;
  for (;;) {
    // Whatever the inner backend has finished, without waiting.
    const size_t got = inner_->Reap(inner_out_, 0, std::chrono::nanoseconds::zero());
    Clock::time_point now = Clock::now();
    Clock::time_point next_release = Clock::time_point::max();
    bool inner_busy = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      AbsorbLocked(std::span(inner_out_).first(got));
      n += TakeDueLocked(out.subspan(n), now);
      if (n >= min_results || n == out.size() || now >= deadline) return n;
      for (const Held& h : held_) next_release = std::min(next_release, h.release_at);
      inner_busy = !pending_.empty();
      if (!inner_busy && held_.empty()) return n;  // nothing outstanding at all
    }
    const Clock::time_point wake =
        std::min({deadline, next_release, now + std::chrono::nanoseconds(kWakeSlice)});
    if (inner_busy) {
      const size_t more =
          inner_->Reap(inner_out_, 1, std::max(wake - now, Clock::duration::zero()));
      std::lock_guard<std::mutex> lock(mu_);
      AbsorbLocked(std::span(inner_out_).first(more));
    } else if (wake - now < kSpinBelow) {
      // A timed sleep ends up to the timer slack (50 us by default) late, which would add a
      // fifth to an emulated 64 KiB read at 250 MB/s; the last stretch is spun instead.
      std::this_thread::yield();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cancel_cv_.wait_until(lock, wake - kSpinBelow, [this] { return cancelled_; });
    }
  }
}

void ShapingBackend::CancelAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cancel_cv_.notify_all();
  inner_->CancelAll();
}

}  // namespace strata::storage
