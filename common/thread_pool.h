// ThreadPool: the engine's workers, which run the kernels over disjoint parts of a job.
//
// One job at a time: Run(n_tasks, fn) calls fn(task, worker) for every task in
// [0, n_tasks), spread over the caller (worker 0) and the pool's threads, and returns when
// all tasks are done. Tasks are handed out through an atomic counter, so uneven tasks
// balance themselves. Decode runs ~200 jobs per token, so a job's start and end must cost
// microseconds, not a condition-variable round trip: idle workers spin briefly on the job
// counter before they sleep (on an atomic wait, i.e. a futex).
//
// Run must be called from one thread at a time (the engine's thread); fn runs on all
// workers concurrently and must only write disjoint outputs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  using TaskFn = std::function<void(int64_t task, int worker)>;

  // n_threads counts the caller: 1 means no extra threads.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  void Run(int64_t n_tasks, const TaskFn& fn);

  // Splits [0, n) into about `chunks_per_thread * size()` chunks whose boundaries are
  // multiples of `align` (except the end) and runs fn(begin, end, worker) on each.
  void ParallelRange(int64_t n, int64_t align, int chunks_per_thread,
                     const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void WorkerLoop(int worker);
  void Work(int worker);

  const int n_threads_;
  std::vector<std::thread> threads_;
  const TaskFn* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<uint32_t> generation_{0};  // bumped per job; workers wait on it
  std::atomic<int> active_{0};           // workers still inside the current job
  std::atomic<bool> stop_{false};
};

}  // namespace strata
