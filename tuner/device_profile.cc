#include "tuner/device_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "common/thread_pool.h"
#include "storage/block_store.h"
#include "storage/random_read.h"

namespace strata {
namespace {

storage::BackendKind BackendOf(const std::string& name) {
  if (name == "io_uring") return storage::BackendKind::kUring;
  if (name == "pread") return storage::BackendKind::kThreadPool;
  return storage::BackendKind::kAuto;
}

// Interpolation weight of x between a and b in log space (0 at a, 1 at b, clamped).
double LogWeight(double x, double a, double b) {
  if (b <= a) return 0.0;
  return std::clamp((std::log(x) - std::log(a)) / (std::log(b) - std::log(a)), 0.0, 1.0);
}

// The measured values bracketing v in sorted, unique `grid`.
void Bracket(const std::vector<uint32_t>& grid, double v, uint32_t* lo, uint32_t* hi) {
  *lo = grid.front();
  *hi = grid.back();
  for (uint32_t g : grid) {
    if (g <= v) *lo = g;
    if (g >= v) {
      *hi = g;
      break;
    }
  }
}

// Streams `bytes` of memory on every worker; GB/s of the slowest pass of three.
double StreamGbPerSecond(uint64_t bytes, int32_t threads) {
  ThreadPool pool(threads);
  const size_t n = size_t(bytes / sizeof(uint64_t));
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  std::vector<uint64_t> sums(size_t(pool.size()) + 1, 0);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t parts = std::max<int64_t>(1, pool.size());
    pool.Run(parts, [&](int64_t p, int worker) {
      const size_t b = n * size_t(p) / size_t(parts), e = n * size_t(p + 1) / size_t(parts);
      uint64_t s = 0;
      for (size_t i = b; i < e; ++i) s += buf[i];
      sums[size_t(std::max(worker, 0))] += s;
    });
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(bytes) / sec / 1e9);
  }
  // Keeps the sums alive so the loop is not removed.
  if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 42) best += 1e-12;
  return best;
}

}  // namespace

double DeviceProfile::ReadSeconds(double requests, uint32_t block, uint32_t depth) const {
  if (requests <= 0 || reads.empty()) return 0;
  std::vector<uint32_t> blocks, depths;
  for (const ReadCurvePoint& p : reads) {
    blocks.push_back(p.block);
    depths.push_back(p.depth);
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  const double d = std::max(1.0, std::min(double(depth), requests));
  auto at = [&](uint32_t b, uint32_t q) -> const ReadCurvePoint* {
    for (const ReadCurvePoint& p : reads)
      if (p.block == b && p.depth == q) return &p;
    return nullptr;
  };
  uint32_t b0, b1, q0, q1;
  Bracket(blocks, double(block), &b0, &b1);
  Bracket(depths, d, &q0, &q1);
  const double wq = LogWeight(d, q0, q1);
  // A measured block's request rate and latency at depth d: log(iops) and log(latency)
  // interpolated between the depths present.
  auto at_block = [&](uint32_t b, double* iops, double* latency_us) {
    double log_iops = 0, log_lat = 0, weight = 0;
    for (uint32_t q : {q0, q1}) {
      const ReadCurvePoint* p = at(b, q);
      if (!p || p->iops <= 0) continue;
      const double w = (q == q1 ? wq : 1 - wq) + 1e-9;
      log_iops += w * std::log(p->iops);
      log_lat += w * std::log(std::max(p->mean_us, 1e-3));
      weight += w;
    }
    if (weight == 0) return false;
    *iops = std::exp(log_iops / weight);
    *latency_us = std::exp(log_lat / weight);
    return true;
  };
  // Between two measured blocks a request goes no faster than the smaller one's request
  // rate allows, nor than the larger one's bandwidth: the device is bound by one or the
  // other, as flash parts are (a rate limit for small reads, a byte limit for large ones).
  // Interpolating in log block size instead took a request of three times the small block
  // to be half again as slow where the rate limit held it, as on eMMC
  // (docs/experiments/tuner.md). Beyond the largest block, bandwidth holds.
  double iops0 = 0, lat0 = 0, iops1 = 0, lat1 = 0;
  const bool has0 = at_block(b0, &iops0, &lat0), has1 = b1 != b0 && at_block(b1, &iops1, &lat1);
  if (!has0 && !has1) return 0;
  double iops = has0 ? iops0 : iops1 * double(b1) / double(block);
  double latency = has0 ? lat0 : lat1 * double(block) / double(b1);
  if (has0 && has1) {
    iops = std::min(iops0, iops1 * double(b1) / double(block));
    latency = std::max(lat0, lat1 * double(block) / double(b1));
  }
  if (double(block) > b1) iops *= double(b1) / double(block);
  return std::max(latency * 1e-6, requests / iops);
}

struct DiskProbe::Rep {
  std::unique_ptr<storage::BlockStore> store;
  uint64_t seed = 1;
};

DiskProbe::DiskProbe() : rep_(std::make_unique<Rep>()) {}
DiskProbe::~DiskProbe() = default;

Status DiskProbe::Read(uint32_t block, uint32_t depth, double seconds, double* iops) {
  storage::ReadPoint rp;
  STRATA_RETURN_IF_ERROR(
      storage::RunStoreRandomRead(*rep_->store, block, depth, seconds, rep_->seed++, &rp));
  *iops = rp.iops;
  return Status::OK();
}

DeviceProfile DeviceProfile::Scaled(double f) const {
  DeviceProfile s = *this;
  if (f > 0)
    for (ReadCurvePoint& p : s.reads) {
      p.iops /= f;
      p.mean_us *= f;
    }
  return s;
}

const ReadCurvePoint* DeviceProfile::AnchorPoint() const {
  const ReadCurvePoint* best = nullptr;
  for (const ReadCurvePoint& p : reads)
    if (p.block == 4096 && p.depth <= 16 && (!best || p.depth > best->depth)) best = &p;
  if (!best && !reads.empty()) best = &reads.front();
  return best;
}

DiskAnchor::DiskAnchor(DiskProbe* probe, const DeviceProfile& profile) : probe_(probe) {
  const ReadCurvePoint* p = profile.AnchorPoint();
  if (!p || !(p->iops > 0)) probe_ = nullptr;
  if (!probe_) return;
  reference_iops_ = p->iops;
  block_ = p->block;
  depth_ = p->depth;
}

Status DiskAnchor::Step() {
  if (!probe_) return Status::OK();
  // Long enough for a few hundred reads at a fast device's depth-16 rate, short beside a
  // decode step's share of a check run.
  constexpr double kBurstSeconds = 0.015;
  double iops = 0;
  STRATA_RETURN_IF_ERROR(probe_->Read(block_, depth_, kBurstSeconds, &iops));
  if (iops > 0) iops_.push_back(iops);
  return Status::OK();
}

double DiskAnchor::Factor() const {
  if (iops_.empty()) return 1.0;
  std::vector<double> v = iops_;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  const double median = v[v.size() / 2];
  return median > 0 ? reference_iops_ / median : 1.0;
}

Status ProfileDevice(const DeviceProfileOptions& o, DeviceProfile* out,
                     std::unique_ptr<DiskProbe>* keep) {
  if (o.blocks.empty() || o.depths.empty() || o.seconds_per_point <= 0 || o.rounds < 1)
    return Status::InvalidArgument("device profile: no request sizes, depths, rounds or time");
  DeviceProfile p;
  STRATA_RETURN_IF_ERROR(DetectPlatform(&p.platform));
  p.kv_dir = o.kv_dir;
  p.kv_device = BlockDeviceOf(o.kv_dir);
  p.emulate_emmc = o.emulate_emmc;

  storage::StoreOptions so;
  so.directory = o.kv_dir;
  so.mode = storage::OpenMode::kTemporary;
  so.backend = BackendOf(o.backend);
  so.file_name = "tune-probe";
  so.capacity = o.file_bytes;
  so.queue_depth = std::max(16u, *std::max_element(o.depths.begin(), o.depths.end()));
  if (o.emulate_emmc) so.slow_disk = storage::SlowDiskOptions::Emmc();
  std::unique_ptr<DiskProbe> probe(new DiskProbe());
  STRATA_RETURN_IF_ERROR(storage::BlockStore::Open(so, &probe->rep_->store)
                             .WithContext("device profile: the KV directory"));
  storage::BlockStore& store = *probe->rep_->store;
  p.backend = store.backend_name();
  // Reads of never-written extents can be answered without touching the device.
  bool filled = false;
  STRATA_RETURN_IF_ERROR(storage::EnsureFilled(store, &filled));
  std::vector<uint32_t> blocks, depths = o.depths;
  for (uint32_t b : o.blocks)
    if (b % store.block_size() == 0) blocks.push_back(b);
  if (blocks.empty())
    return Status::InvalidArgument(
        "device profile: no request size is a multiple of the "
        "store's block size " +
        std::to_string(store.block_size()));
  std::sort(blocks.begin(), blocks.end());
  std::sort(depths.begin(), depths.end());
  // The read points, round after round, then the memory bandwidth.
  const size_t points = blocks.size() * depths.size();
  const int64_t total = int64_t(points) * o.rounds + 1;
  int64_t done = 0;
  auto advance = [&] {
    if (o.progress) o.progress(++done, total);
  };
  std::vector<std::vector<storage::ReadPoint>> rounds(points);
  for (int32_t r = 0; r < o.rounds; ++r) {
    size_t i = 0;
    for (uint32_t block : blocks) {
      for (uint32_t depth : depths) {
        storage::ReadPoint rp;
        STRATA_RETURN_IF_ERROR(storage::RunStoreRandomRead(store, block, depth, o.seconds_per_point,
                                                           probe->rep_->seed++, &rp));
        rounds[i++].push_back(rp);
        advance();
      }
    }
  }
  for (std::vector<storage::ReadPoint>& v : rounds) {
    std::sort(v.begin(), v.end(), [](const storage::ReadPoint& a, const storage::ReadPoint& b) {
      return a.iops < b.iops;
    });
    const storage::ReadPoint& m = v[v.size() / 2];
    p.reads.push_back({m.block, m.depth, m.iops, m.mean_us});
  }
  if (keep)
    *keep = std::move(probe);
  else
    probe.reset();
  const int32_t threads = o.threads > 0 ? o.threads : std::max(1, p.platform.cores);
  p.memory_gb_per_s = StreamGbPerSecond(o.stream_bytes, threads);
  advance();
  *out = std::move(p);
  return Status::OK();
}

}  // namespace strata
