#include "storage/slow_disk.h"

#include <algorithm>
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
    double busy_seconds = 0;
    if (options_.bandwidth_bytes_per_second > 0)
      busy_seconds = static_cast<double>(op.length) / options_.bandwidth_bytes_per_second;
    if (options_.requests_per_second > 0)
      busy_seconds = std::max(busy_seconds, 1.0 / options_.requests_per_second);
    if (busy_seconds > 0) {
      const auto busy =
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(busy_seconds));
      const Clock::time_point begin = std::max(now, device_free_at_);
      finish = begin + busy;
      device_free_at_ = finish;
    }
    OpShape shape;
    shape.release_at = finish + options_.latency;
    return shape;
  }

 private:
  const SlowDiskOptions options_;
  Clock::time_point device_free_at_{};  // Shape runs under Submit only, so no lock
};

}  // namespace

SlowDiskOptions SlowDiskOptions::Emmc() {
  SlowDiskOptions o;
  o.enabled = true;
  o.bandwidth_bytes_per_second = 250e6;
  o.requests_per_second = 11000;
  return o;
}

std::string SlowDiskOptions::Describe() const {
  if (!enabled) return "";
  char bandwidth[64] = "no bandwidth cap", rate[64] = "", buf[192];
  if (bandwidth_bytes_per_second > 0)
    std::snprintf(bandwidth, sizeof(bandwidth), "%.0f MB/s", bandwidth_bytes_per_second / 1e6);
  if (requests_per_second > 0)
    std::snprintf(rate, sizeof(rate), ", %.0f IOPS", requests_per_second);
  std::snprintf(buf, sizeof(buf), "slow-disk emulation: %s%s, +%lld us per request", bandwidth,
                rate, static_cast<long long>(latency.count()));
  return buf;
}

// A cap of 0 is off; a positive one must let one `unit` through within a second.
static Status CheckCap(const char* field, double value, double floor, const char* floor_text,
                       const char* unit) {
  const std::string said = std::string("slow_disk.") + field + " " + std::to_string(value);
  if (!std::isfinite(value) || value < 0)
    return Status::InvalidArgument(said + " must be >= 0 (0: no cap)");
  if (value > 0 && value < floor)
    return Status::InvalidArgument(said + " is below " + floor_text + ": one " + unit +
                                   " would take over a second");
  return Status::OK();
}

Status SlowDiskOptions::Validate() const {
  if (!enabled) return Status::OK();
  STRATA_RETURN_IF_ERROR(CheckCap("bandwidth_bytes_per_second", bandwidth_bytes_per_second, 4096,
                                  "4096 B/s", "block"));
  STRATA_RETURN_IF_ERROR(CheckCap("requests_per_second", requests_per_second, 1, "1", "request"));
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
