// Faults injected under the store (over both real backends) must surface as errors that name
// the file, offset and errno; nothing may come back as success with stale or partial data; a
// short transfer is either finished or reported; Close with requests in flight neither hangs
// nor leaks (ctest's timeout catches a hang, ASan a leak).
#include "storage/fault_injection.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"
#include "tests/storage/storage_test_util.h"

namespace strata::storage {
namespace {

using namespace std::chrono_literals;
using testing::FillPattern;
using testing::MatchesPattern;
using testing::TempDir;

constexpr uint64_t kCapacity = 1 << 20;
constexpr uint32_t kBlock = 4096;

class FaultInjectionTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kUring && !testing::UringRefusal().empty()) {
      GTEST_SKIP() << "io_uring refused on this machine: " << testing::UringRefusal();
    }
    faults_ = std::make_shared<FaultInjector>();
    StoreOptions o = testing::SmallStore(dir_.path(), kCapacity, GetParam());
    o.queue_depth = 8;
    o.faults = faults_;
    ASSERT_TRUE(BlockStore::Open(o, &store_).ok());
    ASSERT_TRUE(AlignedBuffer::Allocate(64 * kBlock, kBlock, &buf_).ok());
    // Known content everywhere: pattern(block, 1).
    for (uint32_t b = 0; b < 64; ++b) FillPattern(buf_.data() + b * kBlock, kBlock, b, 1);
    ASSERT_TRUE(store_->Write(0, buf_.data(), 64 * kBlock).ok());
    std::memset(buf_.data(), 0, buf_.size());
  }
  void ExpectNames(const Status& s, uint64_t offset, int err) {
    EXPECT_NE(s.message().find(store_->path()), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("offset " + std::to_string(offset)), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("errno " + std::to_string(err)), std::string::npos) << s.ToString();
  }

  TempDir dir_;
  std::shared_ptr<FaultInjector> faults_;
  std::unique_ptr<BlockStore> store_;
  AlignedBuffer buf_;
};

TEST_P(FaultInjectionTest, EioOnOneReadFailsOnlyThatRequestAndNamesIt) {
  FaultRule rule = FaultRule::Eio(IoKind::kRead);
  rule.range_begin = 5 * kBlock;
  rule.range_end = 6 * kBlock;
  faults_->Add(rule);
  IoBatch batch;
  for (uint32_t b = 0; b < 10; ++b) batch.AddRead(b * kBlock, buf_.data() + b * kBlock, kBlock);
  ASSERT_TRUE(store_->Submit(batch).ok());
  const Status s = store_->Wait(batch);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  ExpectNames(s, 5 * kBlock, EIO);
  EXPECT_EQ(batch.failed_count(), 1u);
  EXPECT_FALSE(batch.status(5).ok());
  for (uint32_t b = 0; b < 10; ++b) {
    if (b != 5) {
      EXPECT_TRUE(MatchesPattern(buf_.data() + b * kBlock, kBlock, b, 1)) << b;
    }
  }
  EXPECT_EQ(faults_->fired(), 1u);
  EXPECT_EQ(store_->counters().errors, 1u);
  // The rule fired once; the block itself is fine.
  ASSERT_TRUE(store_->Read(5 * kBlock, buf_.data(), kBlock).ok());
  EXPECT_TRUE(MatchesPattern(buf_.data(), kBlock, 5, 1));
}

TEST_P(FaultInjectionTest, NoSpaceOnWriteIsResourceExhaustedAndLeavesOldData) {
  faults_->Add(FaultRule::NoSpace());
  FillPattern(buf_.data(), kBlock, 3, 2);
  const Status s = store_->Write(3 * kBlock, buf_.data(), kBlock);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  ExpectNames(s, 3 * kBlock, ENOSPC);
  EXPECT_NE(s.message().find("write"), std::string::npos);
  ASSERT_TRUE(store_->Read(3 * kBlock, buf_.data(), kBlock).ok());
  EXPECT_TRUE(MatchesPattern(buf_.data(), kBlock, 3, 1));
}

TEST_P(FaultInjectionTest, AlignedShortReadIsFinishedTransparently) {
  faults_->Add(FaultRule::Short(kBlock, IoKind::kRead));
  ASSERT_TRUE(store_->Read(8 * kBlock, buf_.data(), 4 * kBlock).ok());
  for (uint32_t b = 0; b < 4; ++b) {
    EXPECT_TRUE(MatchesPattern(buf_.data() + b * kBlock, kBlock, 8 + b, 1)) << b;
  }
  EXPECT_EQ(store_->counters().short_transfers, 1u);
  EXPECT_EQ(faults_->fired(), 1u);
}

TEST_P(FaultInjectionTest, AlignedShortWriteIsFinishedTransparently) {
  faults_->Add(FaultRule::Short(2 * kBlock, IoKind::kWrite));
  for (uint32_t b = 0; b < 4; ++b) FillPattern(buf_.data() + b * kBlock, kBlock, 20 + b, 9);
  ASSERT_TRUE(store_->Write(20 * kBlock, buf_.data(), 4 * kBlock).ok());
  std::memset(buf_.data(), 0, 4 * kBlock);
  ASSERT_TRUE(store_->Read(20 * kBlock, buf_.data(), 4 * kBlock).ok());
  for (uint32_t b = 0; b < 4; ++b) {
    EXPECT_TRUE(MatchesPattern(buf_.data() + b * kBlock, kBlock, 20 + b, 9)) << b;
  }
}

TEST_P(FaultInjectionTest, UnalignedShortReadIsAnErrorNotPartialData) {
  faults_->Add(FaultRule::Short(100, IoKind::kRead));
  const Status s = store_->Read(2 * kBlock, buf_.data(), 2 * kBlock);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("100 of 8192 bytes"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("offset 8192"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(store_->path()), std::string::npos) << s.ToString();
}

TEST_P(FaultInjectionTest, ZeroByteReadIsAnError) {
  faults_->Add(FaultRule::Short(0, IoKind::kRead));
  const Status s = store_->Read(0, buf_.data(), kBlock);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("0-byte result"), std::string::npos) << s.ToString();
}

TEST_P(FaultInjectionTest, ReadThatStaysShortIsGivenUp) {
  FaultRule rule = FaultRule::Short(kBlock, IoKind::kRead);
  rule.times = 0;  // every attempt comes back one block long
  faults_->Add(rule);
  const Status s = store_->Read(0, buf_.data(), 16 * kBlock);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("still short"), std::string::npos) << s.ToString();
  EXPECT_EQ(store_->counters().errors, 1u);
}

TEST_P(FaultInjectionTest, SkipLetsEarlierRequestsThrough) {
  FaultRule rule = FaultRule::Eio(IoKind::kRead);
  rule.skip = 2;
  faults_->Add(rule);
  EXPECT_TRUE(store_->Read(0, buf_.data(), kBlock).ok());
  EXPECT_TRUE(store_->Read(0, buf_.data(), kBlock).ok());
  EXPECT_FALSE(store_->Read(0, buf_.data(), kBlock).ok());
  EXPECT_TRUE(store_->Read(0, buf_.data(), kBlock).ok());
}

TEST_P(FaultInjectionTest, DelayedCompletionArrivesLateButIntact) {
  faults_->Add(FaultRule::Delay(30ms));
  IoBatch batch;
  batch.AddRead(7 * kBlock, buf_.data(), kBlock);
  ASSERT_TRUE(store_->Submit(batch).ok());
  ASSERT_TRUE(store_->Wait(batch).ok());
  EXPECT_TRUE(MatchesPattern(buf_.data(), kBlock, 7, 1));
  // The store's own latency record cannot be below the injected delay (a lower bound only).
  EXPECT_GE(store_->counters().read_latency.max_ns, 30'000'000u);
}

TEST_P(FaultInjectionTest, CloseWithDelayedAndWaitingRequestsNeitherHangsNorLies) {
  faults_->Add([] {
    FaultRule r = FaultRule::Delay(std::chrono::hours(1));
    r.times = 0;
    return r;
  }());
  IoBatch batch;
  for (uint32_t b = 0; b < 32; ++b) batch.AddRead(b * kBlock, buf_.data() + b * kBlock, kBlock);
  ASSERT_TRUE(store_->Submit(batch).ok());  // 8 in the backend, 24 waiting in the store
  EXPECT_EQ(store_->Poll(), 0u);
  EXPECT_FALSE(batch.done());
  ASSERT_TRUE(store_->Close().ok());  // a hang here fails the test by ctest's timeout
  ASSERT_TRUE(batch.done());
  size_t ok = 0, aborted = 0;
  for (uint32_t b = 0; b < 32; ++b) {
    if (batch.status(b).ok()) {
      ++ok;  // it ran before the close: its data must be whole
      EXPECT_TRUE(MatchesPattern(buf_.data() + b * kBlock, kBlock, b, 1)) << b;
    } else {
      EXPECT_EQ(batch.status(b).code(), Status::Code::kAborted) << batch.status(b).ToString();
      ++aborted;
    }
  }
  EXPECT_EQ(ok + aborted, 32u);
  EXPECT_GE(aborted, 24u);
  EXPECT_EQ(store_->counters().cancelled, aborted);
}

TEST_P(FaultInjectionTest, CloseReleasesAnotherThreadWaitingOnADelayedBatch) {
  FaultRule r = FaultRule::Delay(std::chrono::hours(1));
  r.times = 0;
  faults_->Add(r);
  IoBatch batch;
  batch.AddRead(0, buf_.data(), kBlock);
  ASSERT_TRUE(store_->Submit(batch).ok());
  Status waited = Status::Internal("not run");
  std::thread waiter([&] { waited = store_->Wait(batch); });
  std::this_thread::sleep_for(20ms);  // let it block (not needed for correctness)
  ASSERT_TRUE(store_->Close().ok());
  waiter.join();
  EXPECT_TRUE(batch.done());
  if (waited.ok()) {
    EXPECT_TRUE(MatchesPattern(buf_.data(), kBlock, 0, 1));
  }
}

// A device that stops answering must not hang the waiter: after io_timeout the request
// fails with an error that names it and the timeout, and the store refuses more work.
TEST_P(FaultInjectionTest, ARequestThatNeverCompletesFailsAfterTheTimeout) {
  ASSERT_TRUE(store_->Close().ok());
  StoreOptions o = testing::SmallStore(dir_.path(), kCapacity, GetParam());
  o.queue_depth = 2;
  o.faults = faults_;
  o.io_timeout = 300ms;
  o.file_name = "stuck.strata";
  std::unique_ptr<BlockStore> store;
  ASSERT_TRUE(BlockStore::Open(o, &store).ok());
  FaultRule r = FaultRule::Delay(std::chrono::hours(1));
  r.times = 0;
  faults_->Add(r);
  IoBatch batch;
  for (uint32_t b = 0; b < 4; ++b) batch.AddRead(b * kBlock, buf_.data() + b * kBlock, kBlock);
  ASSERT_TRUE(store->Submit(batch).ok());  // 2 in the backend, 2 waiting in the store
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = store->Wait(batch);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);  // not an hour
  ASSERT_TRUE(batch.done());
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("did not complete within 300 ms"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find(store->path()), std::string::npos) << st.ToString();
  for (uint32_t b = 0; b < 4; ++b) EXPECT_FALSE(batch.status(b).ok()) << b;
  IoBatch more;
  more.AddRead(0, buf_.data(), kBlock);
  const Status refused = store->Submit(more);
  EXPECT_EQ(refused.code(), Status::Code::kIOError);
  EXPECT_NE(refused.message().find("takes no more requests"), std::string::npos)
      << refused.ToString();
  EXPECT_TRUE(store->Close().ok());
}

TEST_P(FaultInjectionTest, ErrorsAreSeenThroughCallbacksToo) {
  faults_->Add(FaultRule::Eio());
  IoBatch batch;
  Status seen;
  batch.set_callback([&](const IoCompletion& c) { seen = c.status; });
  batch.AddWrite(kBlock, buf_.data(), kBlock);
  ASSERT_TRUE(store_->Submit(batch).ok());
  EXPECT_FALSE(store_->Wait(batch).ok());
  EXPECT_EQ(seen.code(), Status::Code::kIOError);
  ExpectNames(seen, kBlock, EIO);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultInjectionTest,
                         ::testing::Values(BackendKind::kUring, BackendKind::kThreadPool),
                         testing::BackendParamName);

}  // namespace
}  // namespace strata::storage
