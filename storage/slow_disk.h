// Slow-disk emulation: caps a store's bandwidth and request rate and adds a fixed latency to
// every request, so eMMC-class devices can be studied on a faster disk. Off by default. Every
// report that uses it must say so: BlockStore puts Describe() into its counters
// (CountersSnapshot::emulation) and the storage benchmark labels such rows.
//
// The model is a device of bandwidth B, request rate R and latency L: a request of n bytes
// occupies the device for max(n / B, 1 / R) after the previous one (a token bucket with no
// burst), and completes L after that. At queue depth 1 a request takes L + max(n / B, 1 / R);
// at any depth throughput stays at or below B bytes and R requests a second. A flash device
// reads a page however little of it is asked for, so small random reads are bound by R (an
// eMMC's random-read IOPS) and large ones by B (its sequential bandwidth). Real completions are
// never reported early, so the emulation only ever slows the real device down.
//
// Threads: configure before Open; the store owns the emulation afterwards.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "storage/io_backend.h"

namespace strata::storage {

struct SlowDiskOptions {
  bool enabled = false;
  double bandwidth_bytes_per_second = 0;  // 0: no bandwidth cap
  double requests_per_second = 0;         // 0: no request-rate (IOPS) cap
  std::chrono::microseconds latency{0};   // added to every request

  // The eMMC class the design targets: 250 MB/s and 11000 IOPS, the sequential and random 4 KiB
  // read figures of the first eMMC 5.1 parts (Samsung, 2015). The per-request latency is
  // left at 0; give one measured on the device being studied.
  static SlowDiskOptions Emmc();
  // "slow-disk emulation: 250 MB/s, 11000 IOPS, +0 us per request" (a cap that is off is
  // left out, or said as "no bandwidth cap").
  std::string Describe() const;
  Status Validate() const;
};

// Wraps inner so its traffic follows options (which must be enabled and valid).
std::unique_ptr<IoBackend> WrapWithSlowDisk(std::unique_ptr<IoBackend> inner,
                                            const SlowDiskOptions& options);

}  // namespace strata::storage
