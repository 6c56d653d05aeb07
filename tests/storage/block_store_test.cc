// BlockStore behaviour that must hold on both backends: round trips, batches larger than the
// queue, callbacks, polling, request validation, registered buffers, counters, Close.
#include "storage/block_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "storage/aligned_buffer.h"
#include "tests/storage/storage_test_util.h"

namespace strata::storage {
namespace {

using testing::FillPattern;
using testing::MatchesPattern;
using testing::SmallStore;
using testing::TempDir;

constexpr uint64_t kCapacity = 4 << 20;
constexpr uint32_t kBlock = 4096;

class BlockStoreTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kUring) {
      const std::string refusal = testing::UringRefusal();
      if (!refusal.empty()) GTEST_SKIP() << "io_uring refused on this machine: " << refusal;
    }
  }
  StoreOptions Options() const { return SmallStore(dir_.path(), kCapacity, GetParam()); }
  std::unique_ptr<BlockStore> OpenStore(StoreOptions o) {
    std::unique_ptr<BlockStore> store;
    const Status s = BlockStore::Open(o, &store);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return store;
  }

  TempDir dir_;
};

TEST_P(BlockStoreTest, OpensOnTheAskedBackendWithDirectIo) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->uses_io_uring(), GetParam() == BackendKind::kUring);
  EXPECT_TRUE(store->direct_io());
  EXPECT_EQ(store->capacity(), kCapacity);
  EXPECT_GT(store->block_size(), 0u);
  EXPECT_EQ(kBlock % store->block_size(), 0u);
  EXPECT_TRUE(store->fallback_reason().empty()) << store->fallback_reason();
  EXPECT_EQ(store->store_id().size(), 32u);
}

TEST_P(BlockStoreTest, WrittenDataReadsBackIdentical) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  AlignedBuffer out, in;
  ASSERT_TRUE(AlignedBuffer::Allocate(64 * 1024, kBlock, &out).ok());
  ASSERT_TRUE(AlignedBuffer::Allocate(64 * 1024, kBlock, &in).ok());
  // Sizes of a SmallStore KV group (3 KiB is 6 sectors) and larger extents.
  for (uint32_t len : {store->block_size(), 3072u, 4096u, 16384u, 65536u}) {
    if (len % store->block_size() != 0) continue;
    const uint64_t off = kCapacity - 65536 - 8 * uint64_t{len};
    FillPattern(out.data(), len, off, len);
    ASSERT_TRUE(store->Write(off, out.data(), len).ok());
    std::memset(in.data(), 0, len);
    ASSERT_TRUE(store->Read(off, in.data(), len).ok());
    EXPECT_TRUE(MatchesPattern(in.data(), len, off, len)) << "length " << len;
  }
  EXPECT_TRUE(store->Sync().ok());
}

TEST_P(BlockStoreTest, BatchLargerThanTheQueueCompletesWithOneStatusPerRequest) {
  StoreOptions o = Options();
  o.queue_depth = 4;
  auto store = OpenStore(o);
  ASSERT_NE(store, nullptr);
  constexpr int kRequests = 50;  // far beyond the depth: most wait inside the store
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(kRequests * kBlock, kBlock, &buf).ok());
  IoBatch writes;
  for (int i = 0; i < kRequests; ++i) {
    FillPattern(buf.data() + i * kBlock, kBlock, i, 7);
    writes.AddWrite(uint64_t{kBlock} * i * 3, buf.data() + i * kBlock, kBlock, i);
  }
  ASSERT_TRUE(store->Submit(writes).ok());
  ASSERT_TRUE(store->Wait(writes).ok());
  EXPECT_EQ(store->counters().max_in_flight, 4u);

  std::memset(buf.data(), 0, buf.size());
  IoBatch reads;
  std::vector<int> seen(kRequests, 0);
  reads.set_callback([&](const IoCompletion& c) {
    EXPECT_TRUE(c.status.ok());
    EXPECT_EQ(c.request.tag, c.index);
    ++seen[c.index];
  });
  for (int i = 0; i < kRequests; ++i) {
    reads.AddRead(uint64_t{kBlock} * i * 3, buf.data() + i * kBlock, kBlock, i);
  }
  ASSERT_TRUE(store->Submit(reads).ok());
  ASSERT_TRUE(store->Wait(reads).ok());
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(seen[i], 1) << i;
    EXPECT_TRUE(reads.status(i).ok());
    EXPECT_TRUE(MatchesPattern(buf.data() + i * kBlock, kBlock, i, 7)) << i;
  }
}

TEST_P(BlockStoreTest, PollReapsWithoutBlockingUntilEverythingIsDone) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(8 * kBlock, kBlock, &buf).ok());
  IoBatch batch;
  for (int i = 0; i < 8; ++i) batch.AddRead(uint64_t{kBlock} * i, buf.data() + i * kBlock, kBlock);
  ASSERT_TRUE(store->Submit(batch).ok());
  size_t reaped = 0;
  while (!batch.done()) reaped += store->Poll();
  EXPECT_EQ(reaped, 8u);
  EXPECT_TRUE(batch.FirstError().ok());
  EXPECT_EQ(store->Poll(), 0u);
}

TEST_P(BlockStoreTest, CallbackMaySubmitFollowUpWork) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(2 * kBlock, kBlock, &buf).ok());
  FillPattern(buf.data(), kBlock, 1, 1);
  IoBatch second;
  second.AddRead(0, buf.data() + kBlock, kBlock);
  IoBatch first;
  first.AddWrite(0, buf.data(), kBlock);
  Status nested_wait;
  first.set_callback([&](const IoCompletion& c) {
    ASSERT_TRUE(c.status.ok());
    EXPECT_TRUE(store->Submit(second).ok());
    nested_wait = store->Wait(second);  // not allowed from a callback: reported, not deadlocked
  });
  ASSERT_TRUE(store->Submit(first).ok());
  ASSERT_TRUE(store->Wait(first).ok());
  EXPECT_EQ(nested_wait.code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(store->Wait(second).ok());
  EXPECT_TRUE(MatchesPattern(buf.data() + kBlock, kBlock, 1, 1));
}

TEST_P(BlockStoreTest, BadRequestsAreRejectedBeforeAnythingStarts) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  const uint32_t bs = store->block_size();
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(4 * kBlock, kBlock, &buf).ok());
  struct Case {
    uint64_t offset;
    void* buffer;
    uint32_t length;
    Status::Code code;
    const char* says;
  };
  const Case cases[] = {
      {bs / 2, buf.data(), bs, Status::Code::kInvalidArgument, "multiples of the"},
      {0, buf.data(), bs + 1, Status::Code::kInvalidArgument, "multiples of the"},
      {0, buf.data() + 1, bs, Status::Code::kInvalidArgument, "is not aligned to"},
      {0, buf.data(), 0, Status::Code::kInvalidArgument, "zero length"},
      {0, nullptr, bs, Status::Code::kInvalidArgument, "null buffer"},
      {kCapacity, buf.data(), bs, Status::Code::kOutOfRange, "past the store's capacity"},
      {kCapacity - bs, buf.data(), 2 * bs, Status::Code::kOutOfRange, "past the store's capacity"},
      {UINT64_MAX - bs + 1, buf.data(), bs, Status::Code::kOutOfRange, "past the store's capacity"},
  };
  for (const Case& c : cases) {
    IoBatch batch;
    batch.AddRead(0, buf.data(), bs);  // a good request first: it must not start either
    batch.AddWrite(c.offset, c.buffer, c.length);
    const Status s = store->Submit(batch);
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(store->path()), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("request 1"), std::string::npos) << s.ToString();
    EXPECT_TRUE(batch.done());
  }
  const CountersSnapshot c = store->counters();
  EXPECT_EQ(c.reads + c.writes, 0u);
}

TEST_P(BlockStoreTest, ResubmittingABatchInFlightIsRefused) {
  StoreOptions o = Options();
  auto store = OpenStore(o);
  ASSERT_NE(store, nullptr);
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(64 * kBlock, kBlock, &buf).ok());
  IoBatch batch;
  for (int i = 0; i < 64; ++i) batch.AddRead(uint64_t{kBlock} * i, buf.data() + i * kBlock, kBlock);
  ASSERT_TRUE(store->Submit(batch).ok());
  if (!batch.done()) {
    EXPECT_EQ(store->Submit(batch).code(), Status::Code::kInvalidArgument);
  }
  ASSERT_TRUE(store->Wait(batch).ok());
  ASSERT_TRUE(store->Submit(batch).ok());  // done batches can go again
  ASSERT_TRUE(store->Wait(batch).ok());
}

TEST_P(BlockStoreTest, RegisteredPoolBuffersWorkAndNeedAnIdleStore) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  std::unique_ptr<BufferPool> pool;
  ASSERT_TRUE(BufferPool::Create(16384, 8, kBlock, &pool).ok());
  const MemoryRegion region = pool->region();
  ASSERT_TRUE(store->RegisterBuffers({&region, 1}).ok());
  if (GetParam() == BackendKind::kUring) {
    EXPECT_NE(store->counters().backend.find("fixed-buffers=1"), std::string::npos)
        << store->counters().backend;
  }
  BufferPool::Lease a = pool->Acquire();
  BufferPool::Lease b = pool->Acquire();
  FillPattern(a.data(), 16384, 42, 1);
  ASSERT_TRUE(store->Write(65536, a.data(), 16384).ok());
  ASSERT_TRUE(store->Read(65536, b.data(), 16384).ok());
  EXPECT_TRUE(MatchesPattern(b.data(), 16384, 42, 1));
  // A buffer outside the registered region takes the ordinary path.
  AlignedBuffer other;
  ASSERT_TRUE(AlignedBuffer::Allocate(16384, kBlock, &other).ok());
  ASSERT_TRUE(store->Read(65536, other.data(), 16384).ok());
  EXPECT_TRUE(MatchesPattern(other.data(), 16384, 42, 1));

  IoBatch big;
  std::vector<AlignedBuffer> bufs(40);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(AlignedBuffer::Allocate(kBlock, kBlock, &bufs[i]).ok());
    big.AddRead(uint64_t{kBlock} * i, bufs[i].data(), kBlock);
  }
  ASSERT_TRUE(store->Submit(big).ok());
  if (!big.done()) {
    EXPECT_EQ(store->RegisterBuffers({&region, 1}).code(), Status::Code::kInvalidArgument);
  }
  ASSERT_TRUE(store->Wait(big).ok());
}

TEST_P(BlockStoreTest, CountersAddUp) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(8 * kBlock, kBlock, &buf).ok());
  ASSERT_TRUE(store->Write(0, buf.data(), 8 * kBlock).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store->Read(i * kBlock, buf.data(), kBlock).ok());
  const CountersSnapshot c = store->counters();
  EXPECT_EQ(c.writes, 1u);
  EXPECT_EQ(c.reads, 5u);
  EXPECT_EQ(c.bytes_written, 8u * kBlock);
  EXPECT_EQ(c.bytes_read, 5u * kBlock);
  EXPECT_EQ(c.errors, 0u);
  EXPECT_EQ(c.in_flight, 0u);
  EXPECT_EQ(c.read_latency.count, 5u);
  EXPECT_EQ(c.write_latency.count, 1u);
  EXPECT_GT(c.read_latency.sum_ns, 0u);
  EXPECT_TRUE(c.emulation.empty());
  const std::string json = c.ToJson();
  EXPECT_NE(json.find("\"reads\":5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"bytes_written\":32768"), std::string::npos) << json;
}

TEST_P(BlockStoreTest, SubmitAfterCloseIsAborted) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Close().ok());
  ASSERT_TRUE(store->Close().ok());  // idempotent
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(kBlock, kBlock, &buf).ok());
  EXPECT_EQ(store->Read(0, buf.data(), kBlock).code(), Status::Code::kAborted);
  EXPECT_EQ(store->Poll(), 0u);
  EXPECT_EQ(store->Sync().code(), Status::Code::kAborted);
}

TEST_P(BlockStoreTest, DestroyingABatchInFlightWaitsForIt) {
  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(32 * kBlock, kBlock, &buf).ok());
  {
    IoBatch batch;
    for (int i = 0; i < 32; ++i)
      batch.AddRead(uint64_t{kBlock} * i, buf.data() + i * kBlock, kBlock);
    ASSERT_TRUE(store->Submit(batch).ok());
  }
  const CountersSnapshot c = store->counters();
  EXPECT_EQ(c.reads, 32u);
  EXPECT_EQ(c.in_flight, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockStoreTest,
                         ::testing::Values(BackendKind::kUring, BackendKind::kThreadPool),
                         testing::BackendParamName);

}  // namespace
}  // namespace strata::storage
