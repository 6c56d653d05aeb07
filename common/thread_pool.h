// ThreadPool: the engine's workers, which run the kernels over disjoint parts of a job.
//
// One job at a time: Run(n_tasks, fn) calls fn(task, worker) for every task in
// [0, n_tasks), spread over the caller (worker 0) and the pool's threads, and returns when
// all tasks are done. Tasks are handed out through an atomic counter, so uneven tasks
// balance themselves. Decode runs ~200 jobs per token, so a job's start and end must cost
// microseconds, not a condition-variable round trip: idle workers spin briefly on the job
// counter before they sleep (on an atomic wait, i.e. a futex).
//
// A job ends when its tasks are done, not when every worker has checked in: with more
// runnable threads than cores (another process, another program) a worker may be off its
// core for a whole time slice, and a job that waited for it would take that long however
// little work it had; the caller and the workers that run take its tasks instead. A task
// is claimed together with its job's number (one atomic word), so a worker that wakes late
// can never take a task of a later job with the earlier job's function.
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
  // Runs tasks of job `job` until none is left to claim.
  void Work(uint32_t job, int worker);
  // One job of at most 2^32 - 1 tasks (Run splits larger ones).
  void RunJob(int64_t n_tasks, const TaskFn& fn);

  const int n_threads_;
  std::vector<std::thread> threads_;
  const TaskFn* fn_ = nullptr;           // read only by the claimant of a task of the current job
  std::atomic<uint64_t> size_{0};        // the current job's number << 32 | its task count
  std::atomic<uint64_t> next_{0};        // the current job's number << 32 | its next task
  std::atomic<int64_t> done_{0};         // tasks of the current job finished
  std::atomic<uint32_t> generation_{0};  // the current job's number; workers wait on it
  std::atomic<bool> stop_{false};
};

}  // namespace strata
