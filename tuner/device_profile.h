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
#include <memory>
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
  // flight, from the curve (interpolated in log depth; between two measured blocks, the
  // slower of the smaller one's request rate and the larger one's bandwidth; a request
  // count below the depth pays one mean latency).
  double ReadSeconds(double requests, uint32_t block, uint32_t depth) const;
  // The curve of a device `f` times slower (every read's latency times f, its rate over f).
  DeviceProfile Scaled(double f) const;
  // The point disk anchors read at (DiskAnchor): 4 KiB at the deepest depth up to 16, a
  // point every curve has; null for an empty curve.
  const ReadCurvePoint* AnchorPoint() const;
  std::string Fingerprint() const { return MachineFingerprint(platform, kv_device); }
};

struct DeviceProfileOptions {
  std::string kv_dir = "/var/tmp";
  bool emulate_emmc = false;
  std::string backend = "auto";
  std::vector<uint32_t> blocks = {4096, 16384, 65536, 262144};
  std::vector<uint32_t> depths = {1, 4, 16, 64, 256};
  double seconds_per_point = 0.25;
  // Each point is read this many times, the rounds interleaved, and its median kept: a
  // virtual disk's rate swings over seconds, and one pass could catch all its points in one
  // slow spell.
  int32_t rounds = 3;
  uint64_t file_bytes = uint64_t(256) << 20;  // the probe file, written once, then removed
  uint64_t stream_bytes = uint64_t(256) << 20;
  int32_t threads = 0;                                        // 0: one per core
  std::function<void(int64_t done, int64_t total)> progress;  // optional
};

class DiskProbe;

// `probe`, when given, receives the probe file, still open, for the disk anchors of later
// runs (DiskAnchor); otherwise it is removed at the end.
Status ProfileDevice(const DeviceProfileOptions& options, DeviceProfile* out,
                     std::unique_ptr<DiskProbe>* probe = nullptr);

// The device profile's probe file, kept to read again beside later runs.
class DiskProbe {
 public:
  ~DiskProbe();
  // Random reads of `block` bytes at `depth` in flight for `seconds`: their rate.
  Status Read(uint32_t block, uint32_t depth, double seconds, double* iops);

 private:
  friend Status ProfileDevice(const DeviceProfileOptions&, DeviceProfile*,
                              std::unique_ptr<DiskProbe>*);
  DiskProbe();
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

// How much slower the KV device reads while another run runs than when it was profiled: a
// short burst of reads at the profile's anchor point after each of the run's steps, the
// median of their rates against the point's. A virtual or shared disk's rate at depth
// drifts severalfold over seconds to minutes (docs/experiments/tuner.md), more than the
// cost model's own error; the model's error on a run is only its own once the device's
// speed during the run is known, as the anchor step gives the CPU's. The bursts fall
// between the run's steps, after its reads, so the two do not compete.
class DiskAnchor {
 public:
  // Null `probe` or a profile without the anchor point: Factor() is 1.
  DiskAnchor(DiskProbe* probe, const DeviceProfile& profile);
  Status Step();
  // The device's slowdown against the profile (above 1: slower now); 1 before any step.
  double Factor() const;

 private:
  DiskProbe* probe_;
  double reference_iops_ = 0;
  uint32_t block_ = 0, depth_ = 0;
  std::vector<double> iops_;
};

}  // namespace strata
