// The device half of the tuner's profile: how fast this machine's KV device reads at the
// request sizes and queue depths the disk policy issues, and how fast host memory streams,
// measured through Strata's own block store (not fio), so the numbers include what the
// policy pays itself (submission, O_DIRECT alignment, the emulation when one is asked for).
//
// A plain value once measured; ProfileDevice runs on the caller's thread (plus `threads`
// workers for the memory stream).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "platforms/platform.h"

namespace strata {

// One point of the random-read curve.
struct ReadCurvePoint {
  uint32_t block = 0;  // request bytes
  uint32_t depth = 0;  // requests in flight
  double iops = 0;
  double mean_us = 0;  // mean completion latency
};

struct DeviceProfile {
  PlatformInfo platform;
  std::string kv_dir;
  std::string kv_device;  // BlockDeviceOf(kv_dir)
  std::string backend;    // the store's backend ("io_uring", "pread_pool")
  bool emulate_emmc = false;
  std::vector<ReadCurvePoint> reads;  // by block, then depth, ascending
  double memory_gb_per_s = 0;         // host memory read bandwidth, all threads

  // Seconds to complete `requests` reads of `block` bytes each with at most `depth` in
  // flight, from the curve (interpolated in log block size and log depth; a request count
  // below the depth pays one mean latency).
  double ReadSeconds(double requests, uint32_t block, uint32_t depth) const;
  std::string Fingerprint() const { return MachineFingerprint(platform, kv_device); }
};

struct DeviceProfileOptions {
  std::string kv_dir = "/var/tmp";
  bool emulate_emmc = false;
  std::string backend = "auto";
  std::vector<uint32_t> blocks = {4096, 16384, 65536, 262144};
  std::vector<uint32_t> depths = {1, 4, 16, 64};
  double seconds_per_point = 0.25;
  uint64_t file_bytes = uint64_t(256) << 20;  // the probe file, written once, then removed
  uint64_t stream_bytes = uint64_t(256) << 20;
  int32_t threads = 0;                                        // 0: one per core
  std::function<void(int64_t done, int64_t total)> progress;  // optional
};

Status ProfileDevice(const DeviceProfileOptions& options, DeviceProfile* out);

}  // namespace strata
