#include "storage/thread_pool_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace strata::storage {
namespace {

int64_t RunOp(int fd, const BackendOp& op) {
  for (;;) {
    const ssize_t r = op.kind == IoKind::kRead
                          ? pread(fd, op.buffer, op.length, static_cast<off_t>(op.file_offset))
                          : pwrite(fd, op.buffer, op.length, static_cast<off_t>(op.file_offset));
    if (r >= 0) return r;
    if (errno != EINTR) return -errno;
  }
}

class ThreadPoolBackend final : public IoBackend {
 public:
  explicit ThreadPoolBackend(int fd) : fd_(fd) {}
  ~ThreadPoolBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  Status Start(unsigned threads) {
    try {
      workers_.reserve(threads);
      for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      return Status::ResourceExhausted("cannot start pread pool thread " +
                                       std::to_string(workers_.size() + 1) + " of " +
                                       std::to_string(threads) + ": " + e.what());
    }
    return Status::OK();
  }

  std::string Describe() const override {
    return "pread/pwrite pool x" + std::to_string(workers_.size());
  }

  void Submit(std::span<const BackendOp> ops) override {
    size_t wake = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), ops.begin(), ops.end());
      wake = std::min<size_t>(idle_, ops.size());
    }
    for (size_t i = 0; i < wake; ++i) work_cv_.notify_one();
  }

  size_t Reap(std::span<BackendResult> out, size_t min_results,
              std::chrono::nanoseconds max_wait) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = max_wait == kWaitForever ? std::chrono::steady_clock::time_point::max()
                                                   : std::chrono::steady_clock::now() + max_wait;
    while (done_.size() < min_results) {
      if (!queue_.empty() && running_ == 0) {
        // Nothing else is running, so sleeping would only wait for a worker to wake up and
        // run this request: running it here saves two wake-ups (the queue-depth-1 case).
        // With other requests running it would hold up their completions, so it waits.
        const BackendOp op = queue_.front();
        queue_.pop_front();
        lock.unlock();
        const int64_t r = RunOp(fd_, op);
        lock.lock();
        done_.push_back(BackendResult{op.token, r});
        continue;
      }
      if (max_wait <= std::chrono::nanoseconds::zero()) break;
      reaper_waiting_ = true;
      const bool timed_out = done_cv_.wait_until(lock, deadline) == std::cv_status::timeout;
      reaper_waiting_ = false;
      if (timed_out && done_.size() < min_results) break;
    }
    const size_t n = std::min(out.size(), done_.size());
    std::copy(done_.begin(), done_.begin() + static_cast<ptrdiff_t>(n), out.begin());
    done_.erase(done_.begin(), done_.begin() + static_cast<ptrdiff_t>(n));
    return n;
  }

  void CancelAll() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const BackendOp& op : queue_) done_.push_back(BackendResult{op.token, -ECANCELED});
    queue_.clear();
    if (reaper_waiting_) done_cv_.notify_one();
  }

  Status RegisterBuffers(std::span<const MemoryRegion>) override { return Status::OK(); }

 private:
  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      while (queue_.empty() && !stop_) {
        ++idle_;
        work_cv_.wait(lock);
        --idle_;
      }
      if (queue_.empty()) return;  // stop_ with nothing left to run
      const BackendOp op = queue_.front();
      queue_.pop_front();
      ++running_;
      lock.unlock();
      const int64_t r = RunOp(fd_, op);
      lock.lock();
      --running_;
      done_.push_back(BackendResult{op.token, r});
      if (reaper_waiting_) {
        // Notified without the lock, so the reaper does not wake only to block on it. With
        // 32 workers on a 2-core AMD EPYC (Zen 4 class) over a virtio disk, 4 KiB reads at
        // depth 32 (bench_storage) went from about 17k IOPS with the notify under the lock to
        // about 60k without.
        lock.unlock();
        done_cv_.notify_one();
        lock.lock();
      }
    }
  }

  const int fd_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // workers wait here for requests
  std::condition_variable done_cv_;  // the reaper waits here for results
  std::deque<BackendOp> queue_;
  std::vector<BackendResult> done_;
  size_t idle_ = 0;
  size_t running_ = 0;  // requests inside a worker's pread/pwrite now
  bool reaper_waiting_ = false;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Status CreateThreadPoolBackend(int fd, unsigned threads, std::unique_ptr<IoBackend>* out) {
  if (threads == 0) return Status::InvalidArgument("pread pool with 0 threads");
  auto backend = std::make_unique<ThreadPoolBackend>(fd);
  STRATA_RETURN_IF_ERROR(backend->Start(threads));
  *out = std::move(backend);
  return Status::OK();
}

}  // namespace strata::storage
