#include "common/thread_pool.h"

#include <algorithm>

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

void ThreadPool::Work(int worker) {
  const int64_t n = n_tasks_;
  for (;;) {
    int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= n) break;
    (*fn_)(t, worker);
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
    Work(worker);
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::Run(int64_t n_tasks, const TaskFn& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  active_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  Work(0);
  while (active_.load(std::memory_order_acquire) != 0) STRATA_CPU_RELAX();
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
