// Several threads submit random reads and writes at once and each reaps its own batches (some
// by Wait, some by Poll): every read must return exactly what the model says was written,
// on both backends, with registered and unregistered buffers, and with a queue shallower than
// the traffic so requests also wait inside the store.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"
#include "tests/storage/storage_test_util.h"

namespace strata::storage {
namespace {

using testing::FillPattern;
using testing::MatchesPattern;
using testing::TempDir;

constexpr uint32_t kUnit = 4096;
constexpr uint32_t kUnits = 1024;       // 4 MiB store
constexpr uint32_t kFrozenUnits = 256;  // written once up front, then only read by everyone
constexpr int kThreads = 4;
constexpr int kBatchesPerThread = 150;
constexpr int kMaxBatch = 8;
constexpr int kMaxExtent = 2;  // units per request

class ConcurrencyTest : public ::testing::TestWithParam<BackendKind> {};

TEST_P(ConcurrencyTest, RandomReadsAndWritesFromManyThreadsReadBackIdentical) {
  if (GetParam() == BackendKind::kUring && !testing::UringRefusal().empty()) {
    GTEST_SKIP() << "io_uring refused on this machine: " << testing::UringRefusal();
  }
  TempDir dir;
  StoreOptions o = testing::SmallStore(dir.path(), uint64_t{kUnits} * kUnit, GetParam());
  o.queue_depth = 8;  // below the traffic of 4 threads x 8 requests
  std::unique_ptr<BlockStore> store;
  ASSERT_TRUE(BlockStore::Open(o, &store).ok());

  // Unit u's content is pattern(u, generation[u]); frozen units stay at generation 0.
  {
    AlignedBuffer all;
    ASSERT_TRUE(AlignedBuffer::Allocate(kFrozenUnits * kUnit, kUnit, &all).ok());
    for (uint32_t u = 0; u < kFrozenUnits; ++u) FillPattern(all.data() + u * kUnit, kUnit, u, 0);
    ASSERT_TRUE(store->Write(0, all.data(), kFrozenUnits * kUnit).ok());
  }
  // Threads with even ids use buffers from registered pools.
  std::vector<std::unique_ptr<BufferPool>> pools(kThreads);
  std::vector<MemoryRegion> regions;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(BufferPool::Create(kMaxExtent * kUnit, 2 * kMaxBatch, kUnit, &pools[t]).ok());
    if (t % 2 == 0) regions.push_back(pools[t]->region());
  }
  ASSERT_TRUE(store->RegisterBuffers(regions).ok());

  std::vector<uint64_t> generation(kUnits, 0);  // each owned unit is touched by one thread only
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(1234 + t);
    std::vector<uint32_t> owned;
    for (uint32_t u = kFrozenUnits; u + kMaxExtent <= kUnits; u += kMaxExtent) {
      if ((u / kMaxExtent) % kThreads == static_cast<uint32_t>(t)) owned.push_back(u);
    }
    std::vector<bool> written(kUnits, false);
    BufferPool& pool = *pools[t];
    for (int b = 0; b < kBatchesPerThread; ++b) {
      IoBatch batch;
      std::vector<BufferPool::Lease> leases;
      struct Expect {
        uint32_t unit, units;
        bool read;
        uint64_t gen;
      };
      std::vector<Expect> expect;
      std::vector<uint32_t> used;  // owned extents already in this batch
      const int n = 1 + static_cast<int>(rng() % kMaxBatch);
      for (int i = 0; i < n; ++i) {
        BufferPool::Lease lease = pool.Acquire();
        if (!lease) break;
        const bool frozen = rng() % 3 == 0;
        if (frozen) {
          const uint32_t units = 1 + rng() % kMaxExtent;
          const auto u = static_cast<uint32_t>(rng() % (kFrozenUnits - units + 1));
          batch.AddRead(uint64_t{u} * kUnit, lease.data(), units * kUnit);
          expect.push_back({u, units, true, 0});
        } else {
          const uint32_t u = owned[rng() % owned.size()];
          if (std::find(used.begin(), used.end(), u) != used.end()) continue;
          used.push_back(u);
          const uint32_t units = kMaxExtent;
          if (!written[u] || rng() % 2 == 0) {
            const uint64_t gen = generation[u] + 1;
            for (uint32_t k = 0; k < units; ++k) {
              FillPattern(lease.data() + k * kUnit, kUnit, u + k, gen);
              generation[u + k] = gen;
            }
            written[u] = true;
            batch.AddWrite(uint64_t{u} * kUnit, lease.data(), units * kUnit);
            expect.push_back({u, units, false, gen});
          } else {
            batch.AddRead(uint64_t{u} * kUnit, lease.data(), units * kUnit);
            expect.push_back({u, units, true, generation[u]});
          }
        }
        leases.push_back(std::move(lease));
      }
      if (batch.empty()) continue;
      if (!store->Submit(batch).ok()) {
        ++failures;
        return;
      }
      if (b % 2 == 0) {
        if (!store->Wait(batch).ok()) ++failures;
      } else {
        while (!batch.done()) {
          if (store->Poll() == 0) std::this_thread::yield();
        }
        if (!batch.FirstError().ok()) ++failures;
      }
      for (size_t i = 0; i < expect.size(); ++i) {
        if (!expect[i].read) continue;
        const auto* data = static_cast<const std::byte*>(batch.request(i).buffer);
        for (uint32_t k = 0; k < expect[i].units; ++k) {
          const uint64_t gen = expect[i].gen == 0 ? 0 : generation[expect[i].unit + k];
          if (!MatchesPattern(data + k * kUnit, kUnit, expect[i].unit + k, gen)) ++failures;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);

  // Everything on disk matches the final model.
  AlignedBuffer all;
  ASSERT_TRUE(AlignedBuffer::Allocate(uint64_t{kUnits} * kUnit, kUnit, &all).ok());
  ASSERT_TRUE(store->Read(0, all.data(), kUnits * kUnit).ok());
  int mismatched = 0;
  for (uint32_t u = 0; u < kUnits; ++u) {
    const bool never_written = u >= kFrozenUnits && generation[u] == 0;
    if (never_written) continue;
    if (!MatchesPattern(all.data() + uint64_t{u} * kUnit, kUnit, u, generation[u])) ++mismatched;
  }
  EXPECT_EQ(mismatched, 0);
  const CountersSnapshot c = store->counters();
  EXPECT_EQ(c.errors, 0u);
  EXPECT_LE(c.max_in_flight, 8u);
  EXPECT_EQ(c.in_flight, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, ConcurrencyTest,
                         ::testing::Values(BackendKind::kUring, BackendKind::kThreadPool),
                         testing::BackendParamName);

}  // namespace
}  // namespace strata::storage
