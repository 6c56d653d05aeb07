// One point of a device's random-read curve, measured on fio or on a Strata store, plus the
// driver that produces it on a store (used by bench_storage and by the tuner's device
// profile): keep `depth` reads of `block` bytes in flight at uniformly
// random block-aligned offsets for a fixed time, the same access pattern fio's randread uses.
//
// Single-threaded: the benchmark thread submits and reaps.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "storage/block_store.h"

namespace strata::storage {

struct ReadPoint {
  std::string engine;  // "fio", "io_uring", "pread_pool"
  uint32_t block = 0;
  uint32_t depth = 0;
  double seconds = 0;
  uint64_t ios = 0;
  double iops = 0;
  double mb_per_s = 0;  // 10^6 bytes per second
  double mean_us = 0;
  double p50_us = 0;
  double p99_us = 0;
  std::string emulation;  // non-empty when the slow-disk emulation shaped this point
};

// Random reads on an open store for `seconds`; the store's queue depth must be >= depth.
Status RunStoreRandomRead(BlockStore& store, uint32_t block, uint32_t depth, double seconds,
                          uint64_t seed, ReadPoint* out);

// Writes the whole data area once with non-zero bytes, so reads hit allocated, written
// extents, and leaves a marker so later runs can reuse the file. Skips the work when the
// marker is already there.
Status EnsureFilled(BlockStore& store, bool* filled_now);

}  // namespace strata::storage
