#include "common/thread_pool.h"

#include <algorithm>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define STRATA_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define STRATA_CPU_RELAX() ((void)0)
#endif

namespace strata {
namespace {
// Spin iterations before a worker sleeps. At ~10-40 ns a pause, this keeps a worker awake
// for tens of microseconds: long enough to bridge the gap between two jobs of one decode
// step (measured: most gaps are a few microseconds), short enough not to burn a core
// while the engine waits on I/O or the application.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  threads_.reserve(n_threads_ - 1);
  for (int w = 1; w < n_threads_; ++w) threads_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Work(uint32_t job, int worker) {
  for (;;) {
    uint64_t v = next_.load(std::memory_order_acquire);
    if (uint32_t(v >> 32) != job) return;  // a later job: its own claimants run it
    // The task count of this job, not of one the caller is starting: a count read across
    // jobs would let a claim run past the end of this one.
    const uint64_t size = size_.load(std::memory_order_acquire);
    if (uint32_t(size >> 32) != job || uint32_t(v) >= uint32_t(size)) return;
    const uint32_t task = uint32_t(v);
    if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
    // The job cannot end while this task is not done, so fn_ is still its function.
    (*fn_)(int64_t(task), worker);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::WorkerLoop(int worker) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      STRATA_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    Work(gen, worker);
  }
}

void ThreadPool::Run(int64_t n_tasks, const TaskFn& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  constexpr int64_t kMaxJob = int64_t(UINT32_MAX);
  if (n_tasks <= kMaxJob) return RunJob(n_tasks, fn);
  for (int64_t t0 = 0; t0 < n_tasks; t0 += kMaxJob)
    RunJob(std::min(kMaxJob, n_tasks - t0), [&](int64_t t, int w) { fn(t0 + t, w); });
}

void ThreadPool::RunJob(int64_t n_tasks, const TaskFn& fn) {
  fn_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t job = generation_.load(std::memory_order_relaxed) + 1;
  size_.store(uint64_t(job) << 32 | uint64_t(n_tasks), std::memory_order_release);
  next_.store(uint64_t(job) << 32, std::memory_order_release);
  generation_.store(job, std::memory_order_release);
  generation_.notify_all();
  Work(job, 0);
  // The workers' tasks end within microseconds when each has a core, so spin; but a task
  // whose worker the OS has descheduled ends only when it runs again, and spinning would
  // hold this core meanwhile. Past the workers' own spin budget, give the core away.
  for (int i = 0; done_.load(std::memory_order_acquire) != n_tasks; ++i) {
    if (i < kSpinIterations) {
      STRATA_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ThreadPool::ParallelRange(int64_t n, int64_t align, int chunks_per_thread,
                               const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  align = std::max<int64_t>(1, align);
  const int64_t units = (n + align - 1) / align;
  const int64_t want = std::max<int64_t>(1, int64_t(n_threads_) * std::max(1, chunks_per_thread));
  const int64_t n_chunks = std::min(units, want);
  const int64_t per = units / n_chunks, extra = units % n_chunks;
  Run(n_chunks, [&](int64_t c, int worker) {
    // The first `extra` chunks get one more unit, so chunk sizes differ by at most one.
    int64_t u0 = c * per + std::min(c, extra);
    int64_t u1 = u0 + per + (c < extra ? 1 : 0);
    int64_t b = u0 * align, e = std::min(n, u1 * align);
    if (b < e) fn(b, e, worker);
  });
}

}  // namespace strata
