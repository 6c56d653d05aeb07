#include "common/thread_pool.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 17, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.Run(n, [&](int64_t t, int worker) {
        ASSERT_GE(worker, 0);
        ASSERT_LT(worker, threads);
        hits[t].fetch_add(1);
      });
      for (int64_t t = 0; t < n; ++t) EXPECT_EQ(hits[t].load(), 1) << "task " << t;
    }
  }
}

TEST(ThreadPoolTest, ManyShortJobsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 5000; ++job) pool.Run(4, [&](int64_t t, int) { sum += t; });
  EXPECT_EQ(sum.load(), 5000 * 6);
}

// More threads than cores: workers are often off their core when a job starts, wake during
// a later one, and a job ends without them when the others took its tasks. Each job's
// tasks must still run once each, with that job's own function.
TEST(ThreadPoolTest, WorkersThatWakeLateNeverRunAnotherJobsTasks) {
  ThreadPool pool(8);
  constexpr int kJobs = 4000, kMost = 7;
  std::vector<int32_t> owner(size_t(kJobs) * kMost, -1);
  for (int32_t job = 0; job < kJobs; ++job) {
    pool.Run(1 + job % kMost, [&owner, job](int64_t t, int) {
      int32_t& o = owner[size_t(job) * kMost + size_t(t)];
      EXPECT_EQ(o, -1) << "job " << job << " task " << t << " ran twice";
      o = job;
    });
  }
  for (int32_t job = 0; job < kJobs; ++job)
    for (int32_t t = 0; t < kMost; ++t)
      ASSERT_EQ(owner[size_t(job) * kMost + size_t(t)], t <= job % kMost ? job : -1)
          << "job " << job << " task " << t;
}

TEST(ThreadPoolTest, ParallelRangeCoversWithAlignedBoundaries) {
  ThreadPool pool(2);
  for (int64_t n : {1, 15, 16, 17, 100, 1536}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelRange(n, 16, 4, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(b % 16, 0);
      EXPECT_TRUE(e == n || e % 16 == 0);
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, ZeroTasksIsANoOp) {
  ThreadPool pool(2);
  bool ran = false;
  pool.Run(0, [&](int64_t, int) { ran = true; });
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace strata
