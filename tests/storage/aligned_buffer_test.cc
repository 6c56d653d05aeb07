#include "storage/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <thread>
#include <vector>

namespace strata::storage {
namespace {

TEST(AlignedBufferTest, IsAlignedZeroedAndRoundedUp) {
  for (size_t alignment : {512u, 4096u, 65536u}) {
    for (size_t size : {1u, 3072u, 4096u, 5000u, 3u << 20}) {
      AlignedBuffer b;
      ASSERT_TRUE(AlignedBuffer::Allocate(size, alignment, &b).ok());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % alignment, 0u);
      EXPECT_GE(b.size(), size);
      EXPECT_EQ(b.size() % alignment, 0u);
      for (size_t i = 0; i < b.size(); i += 511) ASSERT_EQ(b.data()[i], std::byte{0});
    }
  }
}

TEST(AlignedBufferTest, RejectsBadArguments) {
  AlignedBuffer b;
  EXPECT_EQ(AlignedBuffer::Allocate(4096, 3000, &b).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(AlignedBuffer::Allocate(4096, 0, &b).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(AlignedBuffer::Allocate(0, 4096, &b).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(AlignedBuffer::Allocate(SIZE_MAX - 10, 4096, &b).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(b.data(), nullptr);
}

TEST(AlignedBufferTest, MovesOwnership) {
  AlignedBuffer a;
  ASSERT_TRUE(AlignedBuffer::Allocate(8192, 4096, &a).ok());
  std::byte* p = a.data();
  AlignedBuffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  a = std::move(b);
  EXPECT_EQ(a.data(), p);
}

TEST(BufferPoolTest, HandsOutDistinctAlignedBuffersUntilEmpty) {
  std::unique_ptr<BufferPool> pool;
  ASSERT_TRUE(BufferPool::Create(3072, 5, 4096, &pool).ok());
  EXPECT_EQ(pool->buffer_size(), 4096u);  // rounded up to the alignment
  std::vector<BufferPool::Lease> leases;
  std::set<std::byte*> seen;
  for (int i = 0; i < 5; ++i) {
    leases.push_back(pool->Acquire());
    ASSERT_TRUE(leases.back());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(leases.back().data()) % 4096, 0u);
    EXPECT_EQ(leases.back().data(), pool->slot(leases.back().index()));
    const MemoryRegion r = pool->region();
    EXPECT_GE(leases.back().data(), static_cast<std::byte*>(r.base));
    EXPECT_LE(leases.back().data() + 4096, static_cast<std::byte*>(r.base) + r.length);
    seen.insert(leases.back().data());
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_FALSE(pool->Acquire());
  EXPECT_EQ(pool->available(), 0u);
  leases.pop_back();
  EXPECT_EQ(pool->available(), 1u);
  BufferPool::Lease again = pool->Acquire();
  EXPECT_TRUE(again);
  again.Reset();
  EXPECT_FALSE(again);
  leases.clear();
  EXPECT_EQ(pool->available(), 5u);
}

TEST(BufferPoolTest, ConcurrentAcquireAndReleaseNeverHandsOutABufferTwice) {
  std::unique_ptr<BufferPool> pool;
  ASSERT_TRUE(BufferPool::Create(4096, 16, 4096, &pool).ok());
  std::vector<std::thread> threads;
  std::atomic<int> clashes{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        BufferPool::Lease l = pool->Acquire();
        if (!l) continue;
        auto* word = reinterpret_cast<std::atomic<int>*>(l.data());
        if (word->exchange(t + 1) != 0) ++clashes;
        word->store(0);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(clashes.load(), 0);
  EXPECT_EQ(pool->available(), 16u);
}

TEST(BufferPoolTest, RejectsBadArguments) {
  std::unique_ptr<BufferPool> pool;
  EXPECT_FALSE(BufferPool::Create(4096, 0, 4096, &pool).ok());
  EXPECT_FALSE(BufferPool::Create(0, 4, 4096, &pool).ok());
  EXPECT_FALSE(BufferPool::Create(4096, 4, 1000, &pool).ok());
  EXPECT_FALSE(BufferPool::Create(SIZE_MAX / 2, 4, 4096, &pool).ok());
}

}  // namespace
}  // namespace strata::storage
