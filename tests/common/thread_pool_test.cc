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
