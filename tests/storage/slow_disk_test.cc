// The slow-disk emulation is off by default, labelled wherever it is on, keeps data intact,
// and never lets a request finish sooner than its model allows. Only lower bounds on time are
// checked: the emulation can make things slower than asked on a busy machine, never faster.
#include "storage/slow_disk.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"
#include "tests/storage/storage_test_util.h"

namespace strata::storage {
namespace {

using namespace std::chrono_literals;
using testing::FillPattern;
using testing::MatchesPattern;
using testing::TempDir;

TEST(SlowDiskTest, OffByDefault) {
  StoreOptions o;
  EXPECT_FALSE(o.slow_disk.enabled);
  EXPECT_EQ(o.slow_disk.Describe(), "");
}

TEST(SlowDiskTest, EmmcPresetIsLabelled) {
  const SlowDiskOptions e = SlowDiskOptions::Emmc();
  EXPECT_TRUE(e.enabled);
  EXPECT_DOUBLE_EQ(e.bandwidth_bytes_per_second, 250e6);
  EXPECT_DOUBLE_EQ(e.requests_per_second, 11000);
  EXPECT_EQ(e.Describe(), "slow-disk emulation: 250 MB/s, 11000 IOPS, +0 us per request");
  SlowDiskOptions rate_only;
  rate_only.enabled = true;
  rate_only.requests_per_second = 500;
  EXPECT_EQ(rate_only.Describe(),
            "slow-disk emulation: no bandwidth cap, 500 IOPS, +0 us per request");
}

class SlowDiskStoreTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kUring && !testing::UringRefusal().empty())
      GTEST_SKIP() << "io_uring refused on this machine: " << testing::UringRefusal();
  }
  // Opens an 8 MiB store under `emulation`; its one report line at opening is report_.
  void OpenEmulated(const SlowDiskOptions& emulation) {
    StoreOptions o = testing::SmallStore(dir_.path(), 8 << 20, GetParam());
    o.slow_disk = emulation;
    o.slow_disk.enabled = true;
    o.report = [this](std::string_view l) { reports_.emplace_back(l); };
    const Status st = BlockStore::Open(o, &store_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(reports_.size(), 1u);
    report_ = reports_[0];
  }

  TempDir dir_;
  std::vector<std::string> reports_;  // outlives the store, which reports into it
  std::unique_ptr<BlockStore> store_;
  std::string report_;
};

TEST_P(SlowDiskStoreTest, LatencyAndBandwidthAreFloorsAndDataIsIntact) {
  SlowDiskOptions e;
  e.bandwidth_bytes_per_second = 100e6;  // 100 MB/s
  e.latency = 2ms;
  ASSERT_NO_FATAL_FAILURE(OpenEmulated(e));
  BlockStore* store = store_.get();
  EXPECT_NE(report_.find("slow-disk emulation: 100 MB/s, +2000 us"), std::string::npos) << report_;
  EXPECT_NE(store->counters().emulation.find("slow-disk emulation"), std::string::npos);
  EXPECT_NE(store->counters().backend.find("slow-disk emulation"), std::string::npos);
  EXPECT_NE(store->counters().ToJson().find("slow-disk emulation"), std::string::npos);

  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(16 << 20, 4096, &buf).ok());
  FillPattern(buf.data(), 4 << 20, 1, 1);
  ASSERT_TRUE(store->Write(0, buf.data(), 4 << 20).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store->Read(i * 4096, buf.data(), 4096).ok());
  // Every small read took at least the added latency.
  const CountersSnapshot c = store->counters();
  EXPECT_GE(c.read_latency.Quantile(0.0), 2'000'000u * 7 / 8);  // bucket resolution
  EXPECT_GE(c.read_latency.sum_ns, 5u * 2'000'000u);
  // 16 MiB at 100 MB/s cannot finish in less than 0.167 s, however deep the queue.
  IoBatch batch;
  for (int i = 0; i < 16; ++i)
    batch.AddRead((i % 4) << 20, buf.data() + (size_t{1} << 20) * i, 1 << 20);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(store->Submit(batch).ok());
  ASSERT_TRUE(store->Wait(batch).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 16.0 * (1 << 20) / 100e6);
  for (int i = 0; i < 16; i += 4)
    EXPECT_TRUE(MatchesPattern(buf.data() + (size_t{1} << 20) * i, 4 << 20, 1, 1)) << i;
}

// Small reads are bound by the request rate, not the bandwidth: 64 reads of 4 KiB at 1000
// IOPS cannot finish in less than 64 ms however deep the queue, though 256 KiB at 200 MB/s
// would take 1.3 ms. One large read is bound by the bandwidth.
TEST_P(SlowDiskStoreTest, RequestRateIsAFloorForSmallReads) {
  SlowDiskOptions e;
  e.bandwidth_bytes_per_second = 200e6;
  e.requests_per_second = 1000;
  ASSERT_NO_FATAL_FAILURE(OpenEmulated(e));
  BlockStore* store = store_.get();
  EXPECT_NE(report_.find("slow-disk emulation: 200 MB/s, 1000 IOPS"), std::string::npos) << report_;

  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(8 << 20, 4096, &buf).ok());
  FillPattern(buf.data(), 4 << 20, 7, 3);
  ASSERT_TRUE(store->Write(0, buf.data(), 4 << 20).ok());
  IoBatch small;
  for (int i = 0; i < 64; ++i)
    small.AddRead(uint64_t(i) * 61 * 4096 % (4 << 20), buf.data() + (4 << 20) + i * 4096, 4096);
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(store->Submit(small).ok());
  ASSERT_TRUE(store->Wait(small).ok());
  const double small_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(small_seconds, 64 / 1000.0);
  for (int i = 0; i < 64; ++i) {
    const uint64_t off = uint64_t(i) * 61 * 4096 % (4 << 20);
    EXPECT_EQ(std::memcmp(buf.data() + (4 << 20) + i * 4096, buf.data() + off, 4096), 0) << i;
  }
  // 1 MiB in one request: the bandwidth's 5.2 ms, not the request rate's 1 ms, is its floor.
  IoBatch large;
  large.AddRead(0, buf.data() + (4 << 20), 1 << 20);
  start = std::chrono::steady_clock::now();
  ASSERT_TRUE(store->Submit(large).ok());
  ASSERT_TRUE(store->Wait(large).ok());
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            double(1 << 20) / 200e6);
  EXPECT_TRUE(std::memcmp(buf.data() + (4 << 20), buf.data(), 1 << 20) == 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, SlowDiskStoreTest,
                         ::testing::Values(BackendKind::kUring, BackendKind::kThreadPool),
                         testing::BackendParamName);

}  // namespace
}  // namespace strata::storage
