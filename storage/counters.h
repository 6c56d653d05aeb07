// StoreCounters: what one BlockStore has done (requests, bytes, errors, in-flight depth and
// latency histograms), read by benchmarks, the tuner and the runtime's --stats output.
//
// Latency is measured from Submit to the moment the store processes the completion, the same
// point fio's completion latency ("clat") is taken at reap time.
//
// Threads: the store records from its submitting and reaping threads with relaxed atomics;
// Snapshot() may be called from any thread at any time. A snapshot taken while I/O runs is
// exact per field but fields may be a few requests apart from each other.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "storage/io_batch.h"

namespace strata::storage {

struct HistogramSnapshot {
  std::vector<uint64_t> counts;  // per bucket, see LatencyHistogram
  uint64_t count = 0;
  uint64_t sum_ns = 0;
  uint64_t max_ns = 0;

  double mean_ns() const {
    return count ? static_cast<double>(sum_ns) / static_cast<double>(count) : 0.0;
  }
  // Upper edge of the bucket holding quantile q in [0, 1]; 0 for an empty histogram.
  uint64_t Quantile(double q) const;
  // What happened between `earlier` and this snapshot (max_ns stays this snapshot's).
  HistogramSnapshot Since(const HistogramSnapshot& earlier) const;
};

// Log-linear buckets: values below 8 ns get one bucket each, then every power of two is split
// into 8 buckets, so a bucket's width is at most 1/8 of its lower edge (12.5% resolution)
// across the whole uint64 range with a fixed 496-bucket table.
class LatencyHistogram {
 public:
  static constexpr int kSubBits = 3;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr size_t kBuckets = kSub + (64 - kSubBits) * kSub;

  static size_t BucketOf(uint64_t ns);
  static uint64_t BucketLower(size_t bucket);
  static uint64_t BucketUpper(size_t bucket);

  void Record(uint64_t ns);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
  std::atomic<uint64_t> max_ns_{0};
};

struct CountersSnapshot {
  uint64_t reads = 0;  // completed read requests, successful or not
  uint64_t writes = 0;
  uint64_t bytes_read = 0;  // successful requests only
  uint64_t bytes_written = 0;
  uint64_t errors = 0;           // requests that completed with an error other than cancellation
  uint64_t cancelled = 0;        // requests aborted by Close before they ran
  uint64_t short_transfers = 0;  // partial transfers resubmitted for their remainder
  uint64_t in_flight = 0;        // requests in the backend now
  uint64_t max_in_flight = 0;
  uint64_t queued = 0;  // requests waiting for a free queue slot now
  HistogramSnapshot read_latency;
  HistogramSnapshot write_latency;
  // Filled by the store:
  std::string backend;          // e.g. "io_uring qd=64 fixed-file" or "pread pool x32"
  std::string fallback_reason;  // why io_uring/O_DIRECT was not used; empty if it was
  std::string emulation;        // "slow-disk emulation: ..." when on; empty when off
  bool direct_io = false;

  // One JSON object; latencies in microseconds.
  std::string ToJson() const;
};

class StoreCounters {
 public:
  void RecordCompletion(IoKind kind, uint64_t bytes, uint64_t latency_ns, bool ok, bool cancelled);
  void RecordShortTransfer() { short_transfers_.fetch_add(1, std::memory_order_relaxed); }
  void SetDepth(uint64_t in_flight, uint64_t queued);
  CountersSnapshot Snapshot() const;

 private:
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0};
  std::atomic<uint64_t> errors_{0}, cancelled_{0}, short_transfers_{0};
  std::atomic<uint64_t> in_flight_{0}, max_in_flight_{0}, queued_{0};
  LatencyHistogram read_latency_;
  LatencyHistogram write_latency_;
};

}  // namespace strata::storage
