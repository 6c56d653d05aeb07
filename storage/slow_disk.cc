#include "storage/slow_disk.h"

#include <cmath>
#include <cstdio>

#include "storage/shaping_backend.h"

namespace strata::storage {
namespace {

class SlowDiskBackend final : public ShapingBackend {
 public:
  SlowDiskBackend(std::unique_ptr<IoBackend> inner, const SlowDiskOptions& options)
      : ShapingBackend(std::move(inner)), options_(options) {}

  std::string Describe() const override {
    return inner().Describe() + " [" + options_.Describe() + "]";
  }

 protected:
  OpShape Shape(const BackendOp& op, Clock::time_point now) override {
    Clock::time_point finish = now;
    if (options_.bandwidth_bytes_per_second > 0) {
      const auto busy = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
          static_cast<double>(op.length) / options_.bandwidth_bytes_per_second));
      const Clock::time_point begin = std::max(now, bandwidth_free_at_);
      finish = begin + busy;
      bandwidth_free_at_ = finish;
    }
    OpShape shape;
    shape.release_at = finish + options_.latency;
    return shape;
  }

 private:
  const SlowDiskOptions options_;
  Clock::time_point bandwidth_free_at_{};  // Shape runs under Submit only, so no lock
};

}  // namespace

SlowDiskOptions SlowDiskOptions::Emmc() {
  SlowDiskOptions o;
  o.enabled = true;
  o.bandwidth_bytes_per_second = 250e6;
  return o;
}

std::string SlowDiskOptions::Describe() const {
  if (!enabled) return "";
  char buf[160];
  if (bandwidth_bytes_per_second > 0) {
    std::snprintf(buf, sizeof(buf), "slow-disk emulation: %.0f MB/s, +%lld us per request",
                  bandwidth_bytes_per_second / 1e6, static_cast<long long>(latency.count()));
  } else {
    std::snprintf(buf, sizeof(buf), "slow-disk emulation: no bandwidth cap, +%lld us per request",
                  static_cast<long long>(latency.count()));
  }
  return buf;
}

Status SlowDiskOptions::Validate() const {
  if (!enabled) return Status::OK();
  if (!std::isfinite(bandwidth_bytes_per_second) || bandwidth_bytes_per_second < 0) {
    return Status::InvalidArgument("slow_disk.bandwidth_bytes_per_second must be >= 0 (0: no cap)");
  }
  if (bandwidth_bytes_per_second > 0 && bandwidth_bytes_per_second < 4096) {
    return Status::InvalidArgument("slow_disk.bandwidth_bytes_per_second " +
                                   std::to_string(bandwidth_bytes_per_second) +
                                   " is below 4096 B/s: one block would take over a second");
  }
  if (latency.count() < 0 || latency > std::chrono::seconds(10)) {
    return Status::InvalidArgument("slow_disk.latency " + std::to_string(latency.count()) +
                                   " us is outside [0, 10 s]");
  }
  return Status::OK();
}

std::unique_ptr<IoBackend> WrapWithSlowDisk(std::unique_ptr<IoBackend> inner,
                                            const SlowDiskOptions& options) {
  return std::make_unique<SlowDiskBackend>(std::move(inner), options);
}

}  // namespace strata::storage
