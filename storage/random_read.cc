#include "storage/random_read.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "storage/aligned_buffer.h"

namespace strata::storage {
namespace {

constexpr char kFillMarker[] = "strata bench_storage fill v1";
constexpr uint32_t kMarkerBytes = 4096;

}  // namespace

Status RunStoreRandomRead(BlockStore& store, uint32_t block, uint32_t depth, double seconds,
                          uint64_t seed, ReadPoint* out) {
  using Clock = std::chrono::steady_clock;
  if (block == 0 || block % store.block_size() != 0) {
    return Status::InvalidArgument("block " + std::to_string(block) +
                                   " is not a multiple of the store's block size " +
                                   std::to_string(store.block_size()));
  }
  if (depth == 0 || depth > store.queue_depth()) {
    return Status::InvalidArgument("depth " + std::to_string(depth) + " is outside [1, " +
                                   std::to_string(store.queue_depth()) + "]");
  }
  std::unique_ptr<BufferPool> pool;
  STRATA_RETURN_IF_ERROR(BufferPool::Create(block, depth, 4096, &pool));
  const MemoryRegion region = pool->region();
  STRATA_RETURN_IF_ERROR(store.RegisterBuffers({&region, 1}));

  const uint64_t slots = store.capacity() / block;
  std::mt19937_64 rng(seed);
  auto random_offset = [&] { return (rng() % slots) * block; };
  // One single-request batch per queue slot, resubmitted as soon as it completes: the
  // depth stays constant, as with fio's iodepth.
  std::vector<IoBatch> batches(depth);
  for (uint32_t i = 0; i < depth; ++i) batches[i].AddRead(random_offset(), pool->slot(i), block);

  const CountersSnapshot before = store.counters();
  const Clock::time_point start = Clock::now();
  const Clock::time_point end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (IoBatch& b : batches) STRATA_RETURN_IF_ERROR(store.Submit(b));
  uint64_t ios = 0;
  bool running = true;
  Status first_error;
  Clock::time_point stop = start;
  while (running) {
    store.Reap(1);
    stop = Clock::now();
    running = stop < end;
    for (uint32_t i = 0; i < depth; ++i) {
      IoBatch& b = batches[i];
      if (!b.done()) continue;
      if (!b.FirstError().ok() && first_error.ok()) first_error = b.FirstError();
      ++ios;
      if (!running) continue;
      b.mutable_request(0).offset = random_offset();
      STRATA_RETURN_IF_ERROR(store.Submit(b));
    }
  }
  // Reads still in flight at the stop are neither counted nor timed.
  for (IoBatch& b : batches) STRATA_RETURN_IF_ERROR(store.Wait(b));
  const double elapsed = std::chrono::duration<double>(stop - start).count();
  STRATA_RETURN_IF_ERROR(first_error);
  STRATA_RETURN_IF_ERROR(store.RegisterBuffers({}));

  const HistogramSnapshot lat = store.counters().read_latency.Since(before.read_latency);
  out->block = block;
  out->depth = depth;
  out->seconds = elapsed;
  out->ios = ios;
  out->iops = static_cast<double>(ios) / elapsed;
  out->mb_per_s = out->iops * block / 1e6;
  out->mean_us = lat.mean_ns() / 1e3;
  out->p50_us = static_cast<double>(lat.Quantile(0.5)) / 1e3;
  out->p99_us = static_cast<double>(lat.Quantile(0.99)) / 1e3;
  out->emulation = store.counters().emulation;
  return Status::OK();
}

Status EnsureFilled(BlockStore& store, bool* filled_now) {
  *filled_now = false;
  AlignedBuffer marker;
  STRATA_RETURN_IF_ERROR(AlignedBuffer::Allocate(kMarkerBytes, 4096, &marker));
  const uint64_t marker_offset = store.capacity() - kMarkerBytes;
  STRATA_RETURN_IF_ERROR(store.Read(marker_offset, marker.data(), kMarkerBytes));
  if (std::memcmp(marker.data(), kFillMarker, sizeof(kFillMarker)) == 0) return Status::OK();

  // Sequential 1 MiB writes, 8 in flight; bytes from a cheap generator (not zeros, so no
  // layer below can recognise and skip them).
  constexpr uint32_t kChunk = 1 << 20;
  constexpr uint32_t kInFlight = 8;
  AlignedBuffer data;
  STRATA_RETURN_IF_ERROR(AlignedBuffer::Allocate(size_t{kChunk} * kInFlight, 4096, &data));
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data.data() + i, &x, 8);
  }
  std::vector<IoBatch> batches(kInFlight);
  uint64_t offset = 0;
  while (offset < store.capacity()) {
    for (uint32_t i = 0; i < kInFlight && offset < store.capacity(); ++i) {
      STRATA_RETURN_IF_ERROR(store.Wait(batches[i]));
      batches[i].Clear();
      const uint32_t n =
          static_cast<uint32_t>(std::min<uint64_t>(kChunk, store.capacity() - offset));
      batches[i].AddWrite(offset, data.data() + size_t{i} * kChunk, n);
      STRATA_RETURN_IF_ERROR(store.Submit(batches[i]));
      offset += n;
    }
  }
  for (IoBatch& b : batches) STRATA_RETURN_IF_ERROR(store.Wait(b));
  std::memset(marker.data(), 0, kMarkerBytes);
  std::memcpy(marker.data(), kFillMarker, sizeof(kFillMarker));
  STRATA_RETURN_IF_ERROR(store.Write(marker_offset, marker.data(), kMarkerBytes));
  STRATA_RETURN_IF_ERROR(store.Sync());
  *filled_now = true;
  return Status::OK();
}

}  // namespace strata::storage
