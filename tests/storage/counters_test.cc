#include "storage/counters.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

namespace strata::storage {
namespace {

TEST(LatencyHistogramTest, BucketsTileTheRangeWithBoundedWidth) {
  EXPECT_EQ(LatencyHistogram::BucketLower(0), 0u);
  for (size_t b = 0; b + 1 < LatencyHistogram::kBuckets; ++b) {
    const uint64_t lo = LatencyHistogram::BucketLower(b);
    const uint64_t hi = LatencyHistogram::BucketUpper(b);
    ASSERT_LE(lo, hi) << b;
    ASSERT_EQ(hi + 1, LatencyHistogram::BucketLower(b + 1)) << b;
    ASSERT_EQ(LatencyHistogram::BucketOf(lo), b);
    ASSERT_EQ(LatencyHistogram::BucketOf(hi), b);
    if (lo >= 8) {
      ASSERT_LE(hi - lo + 1, lo / 8) << b;  // 12.5% resolution
    }
  }
  EXPECT_EQ(LatencyHistogram::BucketOf(UINT64_MAX), LatencyHistogram::kBuckets - 1);
}

TEST(LatencyHistogramTest, QuantilesTrackTheSamples) {
  LatencyHistogram h;
  std::mt19937_64 rng(7);
  std::vector<uint64_t> samples;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = 1000 + rng() % 1'000'000;
    samples.push_back(v);
    h.Record(v);
  }
  std::sort(samples.begin(), samples.end());
  const HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count, 10000u);
  EXPECT_EQ(s.max_ns, samples.back());
  for (double q : {0.01, 0.5, 0.9, 0.99}) {
    const double exact = static_cast<double>(samples[static_cast<size_t>(q * 10000) - 1]);
    const double got = static_cast<double>(s.Quantile(q));
    EXPECT_GE(got, exact * 0.999) << q;
    EXPECT_LE(got, exact * 1.13) << q;  // one bucket above at most
  }
  uint64_t sum = 0;
  for (uint64_t v : samples) sum += v;
  EXPECT_DOUBLE_EQ(s.mean_ns(), static_cast<double>(sum) / 10000);
  EXPECT_EQ(s.Quantile(1.0), samples.back());
}

TEST(LatencyHistogramTest, SinceGivesTheDifference) {
  LatencyHistogram h;
  for (int i = 0; i < 10; ++i) h.Record(100);
  const HistogramSnapshot a = h.Snapshot();
  for (int i = 0; i < 5; ++i) h.Record(1'000'000);
  const HistogramSnapshot d = h.Snapshot().Since(a);
  EXPECT_EQ(d.count, 5u);
  EXPECT_EQ(d.sum_ns, 5'000'000u);
  EXPECT_GE(d.Quantile(0.01), 1'000'000u * 7 / 8);
}

TEST(StoreCountersTest, RecordsFromManyThreadsExactly) {
  StoreCounters c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, t] {
      for (int i = 0; i < 1000; ++i) {
        c.RecordCompletion(t % 2 ? IoKind::kRead : IoKind::kWrite, 4096, 1000 + i, i % 10 != 0,
                           false);
      }
    });
  }
  for (auto& th : threads) th.join();
  c.SetDepth(3, 1);
  c.SetDepth(1, 0);
  const CountersSnapshot s = c.Snapshot();
  EXPECT_EQ(s.reads, 2000u);
  EXPECT_EQ(s.writes, 2000u);
  EXPECT_EQ(s.errors, 400u);
  EXPECT_EQ(s.bytes_read, 1800u * 4096);
  EXPECT_EQ(s.read_latency.count, 1800u);
  EXPECT_EQ(s.in_flight, 1u);
  EXPECT_EQ(s.max_in_flight, 3u);
}

TEST(CountersSnapshotTest, JsonEscapesStrings) {
  CountersSnapshot s;
  s.backend = "a \"quoted\"\nname";
  const std::string j = s.ToJson();
  EXPECT_NE(j.find("a \\\"quoted\\\"\\u000aname"), std::string::npos) << j;
}

}  // namespace
}  // namespace strata::storage
