// bench_storage: the block store against fio on the same file, in the same run.
//
// For every block size and queue depth it measures random O_DIRECT reads three ways on one
// kept 2 GiB store file: fio (io_uring engine, run as a subprocess), the store on io_uring and
// the store on its pread/pwrite pool. It prints one table (fio IOPS, store IOPS, ratios), the
// exact fio command lines, and writes the random-read curve (bandwidth vs block size and
// depth) as CSV and/or JSON for the tuner. Measurements are short and interleaved (fio and
// the io_uring store back to back in alternating order), IOPS are medians over repeats and
// ratios medians of the per-repeat ratios, because on a shared machine behind a shared host
// one run's IOPS can swing by half from the next.
//
//   bench_storage --dir /path/on/the/disk --mode short            # about 30 s in all
//   bench_storage --dir ... --mode full --csv curve.csv --json curve.json
//   bench_storage --dir ... --emulate-emmc                         # labelled, no fio
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/storage/fio_runner.h"
#include "storage/block_store.h"
#include "storage/random_read.h"

namespace strata::bench {
namespace {

struct Config {
  std::string dir;
  std::string mode = "short";
  double size_gib = 2;
  double runtime = 0;  // per measurement; 0: from mode
  int repeat = 0;      // 0: from mode
  std::vector<uint32_t> blocks = {512, 3072, 4096, 16384, 65536};
  std::vector<uint32_t> depths = {1, 32};
  std::string csv;
  std::string json;
  bool no_fio = false;
  bool no_fallback = false;
  bool verbose = false;
  bool emulate_emmc = false;
  double emulate_mbps = 0;
  double emulate_iops = 0;
  double emulate_latency_us = 0;
  std::string command_line;
};

std::string ReadSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// "vda (254:0), logical block 512 B, rotational 0" for the device under path.
std::string DescribeDevice(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "unknown";
  const std::string sys =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  std::string queue = sys + "/queue";
  if (access(queue.c_str(), R_OK) != 0) queue = sys + "/../queue";  // a partition
  char target[512] = {};
  std::string name = "?";
  if (readlink(sys.c_str(), target, sizeof(target) - 1) > 0) {
    name = target;
    name = name.substr(name.rfind('/') + 1);
  }
  return name + " (" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) +
         "), logical block " + ReadSysfs(queue + "/logical_block_size") + " B, rotational " +
         ReadSysfs(queue + "/rotational") + ", scheduler " + ReadSysfs(queue + "/scheduler");
}

storage::StoreOptions StoreFor(const Config& c, uint64_t capacity, storage::BackendKind backend,
                               uint32_t depth) {
  storage::StoreOptions o;
  o.directory = c.dir;
  o.file_name = "bench_storage.strata";
  o.mode = storage::OpenMode::kOpenOrCreate;
  o.capacity = capacity;
  o.keep_files = true;  // made once (2 GiB), reused by later runs
  o.backend = backend;
  o.queue_depth = std::max<uint32_t>(depth, 1);
  o.fallback_threads = o.queue_depth;
  if (c.emulate_emmc || c.emulate_mbps > 0 || c.emulate_iops > 0 || c.emulate_latency_us > 0) {
    o.slow_disk = c.emulate_emmc ? storage::SlowDiskOptions::Emmc() : storage::SlowDiskOptions();
    o.slow_disk.enabled = true;
    if (c.emulate_mbps > 0) o.slow_disk.bandwidth_bytes_per_second = c.emulate_mbps * 1e6;
    if (c.emulate_iops > 0) o.slow_disk.requests_per_second = c.emulate_iops;
    o.slow_disk.latency = std::chrono::microseconds(static_cast<int64_t>(c.emulate_latency_us));
  }
  // The table header names the emulation once; the store's own line for it would repeat
  // on every open.
  o.report = [](std::string_view line) {
    if (line.find("slow-disk emulation") != std::string_view::npos) return;
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };
  return o;
}

Status MeasureStore(const Config& c, uint64_t capacity, storage::BackendKind backend,
                    uint32_t block, uint32_t depth, double seconds, uint64_t seed, ReadPoint* out) {
  std::unique_ptr<storage::BlockStore> store;
  storage::StoreOptions o = StoreFor(c, capacity, backend, depth);
  o.mode = storage::OpenMode::kOpenExisting;
  STRATA_RETURN_IF_ERROR(storage::BlockStore::Open(o, &store));
  STRATA_RETURN_IF_ERROR(storage::RunStoreRandomRead(*store, block, depth, seconds, seed, out));
  out->engine = backend == storage::BackendKind::kUring ? "io_uring" : "pread_pool";
  return store->Close();
}

ReadPoint Median(std::vector<ReadPoint> v) {
  std::sort(v.begin(), v.end(),
            [](const ReadPoint& a, const ReadPoint& b) { return a.iops < b.iops; });
  return v[v.size() / 2];
}

// Median over repeats of engine IOPS / fio IOPS within the same repeat. The two runs of a
// repeat are back to back, so load from other processes mostly cancels out of each ratio,
// which makes this steadier than a ratio of two medians on a shared machine.
double PairedRatio(const std::vector<ReadPoint>& engine, const std::vector<ReadPoint>& fio) {
  std::vector<double> r;
  for (size_t i = 0; i < engine.size() && i < fio.size(); ++i) {
    r.push_back(engine[i].iops / fio[i].iops);
  }
  if (r.empty()) return 0;
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

void WriteCsv(const std::string& path, const std::vector<ReadPoint>& points) {
  std::ofstream f(path);
  f << "engine,block_bytes,queue_depth,iops,mb_per_s,mean_us,p50_us,p99_us,seconds,emulation\n";
  for (const ReadPoint& p : points) {
    char line[512];
    std::snprintf(line, sizeof(line), "%s,%u,%u,%.0f,%.2f,%.2f,%.2f,%.2f,%.2f,\"%s\"\n",
                  p.engine.c_str(), p.block, p.depth, p.iops, p.mb_per_s, p.mean_us, p.p50_us,
                  p.p99_us, p.seconds, p.emulation.c_str());
    f << line;
  }
}

void WriteJson(const std::string& path, const Config& c, const std::string& device,
               const std::string& file, const std::vector<ReadPoint>& points) {
  std::ofstream f(path);
  f << "{\n  \"kind\": \"strata.random_read_curve\",\n  \"version\": 1,\n";
  f << "  \"device\": \"" << device << "\",\n  \"file\": \"" << file << "\",\n";
  f << "  \"direct_io\": true,\n  \"seconds_per_point\": " << c.runtime << ",\n";
  f << "  \"repeats\": " << c.repeat << ",\n  \"points\": [\n";
  for (size_t i = 0; i < points.size(); ++i) {
    const ReadPoint& p = points[i];
    char line[512];
    std::snprintf(line, sizeof(line),
                  "    {\"engine\": \"%s\", \"block_bytes\": %u, \"queue_depth\": %u, "
                  "\"iops\": %.0f, \"mb_per_s\": %.2f, \"mean_us\": %.2f, \"p50_us\": %.2f, "
                  "\"p99_us\": %.2f, \"emulation\": \"%s\"}%s\n",
                  p.engine.c_str(), p.block, p.depth, p.iops, p.mb_per_s, p.mean_us, p.p50_us,
                  p.p99_us, p.emulation.c_str(), i + 1 < points.size() ? "," : "");
    f << line;
  }
  f << "  ]\n}\n";
}

int Run(Config c) {
  if (c.runtime <= 0) c.runtime = c.mode == "full" ? 1 : 0.5;
  if (c.repeat <= 0) c.repeat = c.mode == "full" ? 15 : 1;
  const bool emulated =
      c.emulate_emmc || c.emulate_mbps > 0 || c.emulate_iops > 0 || c.emulate_latency_us > 0;
  if (emulated) c.no_fio = true;  // fio runs on the real disk; its numbers would not compare
  const uint64_t capacity = static_cast<uint64_t>(c.size_gib * (1 << 30)) / 65536 * 65536;
  const uint32_t max_depth = *std::max_element(c.depths.begin(), c.depths.end());

  // Make (or reuse) the filled store file.
  uint64_t data_offset = 0;
  std::string path;
  {
    std::unique_ptr<storage::BlockStore> store;
    storage::StoreOptions o = StoreFor(c, capacity, storage::BackendKind::kAuto, max_depth);
    o.slow_disk = storage::SlowDiskOptions();  // filling is not measured
    Status s = storage::BlockStore::Open(o, &store);
    if (!s.ok()) {
      std::fprintf(stderr, "bench_storage: %s\n", s.ToString().c_str());
      return 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    bool filled = false;
    s = storage::EnsureFilled(*store, &filled);
    if (!s.ok()) {
      std::fprintf(stderr, "bench_storage: filling %s: %s\n", store->path().c_str(),
                   s.ToString().c_str());
      return 1;
    }
    if (filled) {
      std::printf("filled %s (%.2f GiB) in %.1f s\n", store->path().c_str(),
                  double(capacity) / double(1 << 30),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    for (uint32_t b : c.blocks) {
      if (b == 0 || b % store->block_size() != 0) {
        std::fprintf(stderr, "bench_storage: block size %u is not a multiple of %u\n", b,
                     store->block_size());
        return 1;
      }
    }
    data_offset = store->data_offset_in_file();
    path = store->path();
  }
  std::string fio_version = "not used";
  if (!c.no_fio) {
    const Status s = FioVersion(&fio_version);
    if (!s.ok()) {
      std::fprintf(stderr,
                   "bench_storage: fio is needed (apt-get install fio) or pass --no-fio: %s\n",
                   s.ToString().c_str());
      return 1;
    }
  }
  const std::string device = DescribeDevice(path);
  utsname u{};
  uname(&u);
  std::printf("# bench_storage: random reads, O_DIRECT, uniform block-aligned offsets\n");
  std::printf("# command: %s\n", c.command_line.c_str());
  std::printf("# file: %s (%.2f GiB of data after a %llu-byte store header)\n", path.c_str(),
              double(capacity) / double(1 << 30), static_cast<unsigned long long>(data_offset));
  std::printf("# device: %s\n# kernel: %s %s, %ld CPUs online, %s\n", device.c_str(), u.sysname,
              u.release, sysconf(_SC_NPROCESSORS_ONLN), fio_version.c_str());
  std::printf(
      "# %.1f s per measurement, %d interleaved repeat(s); IOPS: median over repeats; ratio: "
      "median over repeats of engine/fio within a repeat\n",
      c.runtime, c.repeat);
  if (emulated) {
    std::printf(
        "# EMULATED DEVICE: %s -- store rows are not the real disk; fio not run\n",
        StoreFor(c, capacity, storage::BackendKind::kUring, 1).slow_disk.Describe().c_str());
  }
  std::printf("\n%7s %4s %12s %14s %7s %14s %7s %10s %9s %9s %s\n", "block", "QD", "fio IOPS",
              "io_uring IOPS", "ratio", "pread IOPS", "ratio", "uring MB/s", "p50 us", "p99 us",
              emulated ? "note" : "target>=0.90");
  std::fflush(stdout);

  std::vector<ReadPoint> curve;
  std::vector<std::string> fio_commands;
  bool all_met = true;
  uint64_t seed = 1;
  for (uint32_t block : c.blocks) {
    for (uint32_t depth : c.depths) {
      std::map<std::string, std::vector<ReadPoint>> runs;
      FioJob job{path, data_offset, capacity, block, depth, c.runtime};
      if (!c.no_fio) fio_commands.push_back(FioCommand(job));
      for (int r = 0; r < c.repeat; ++r) {
        // fio and the io_uring store run back to back, in alternating order, so what
        // drifts meanwhile (other processes, the host behind the virtual disk) hits both
        // alike; the pread store follows.
        for (int k = 0; k < 3; ++k) {
          const int engine = k == 2 ? 2 : (k + r) % 2;
          ReadPoint p;
          Status s;
          if (engine == 0 && !c.no_fio) {
            s = RunFio(job, &p);
            if (s.ok()) runs["fio"].push_back(p);
          } else if (engine == 1) {
            s = MeasureStore(c, capacity, storage::BackendKind::kUring, block, depth, c.runtime,
                             seed++, &p);
            if (s.ok()) runs["io_uring"].push_back(p);
          } else if (engine == 2 && !c.no_fallback) {
            s = MeasureStore(c, capacity, storage::BackendKind::kThreadPool, block, depth,
                             c.runtime, seed++, &p);
            if (s.ok()) runs["pread_pool"].push_back(p);
          }
          if (!s.ok()) {
            std::fprintf(stderr, "bench_storage: block %u depth %u: %s\n", block, depth,
                         s.ToString().c_str());
            return 1;
          }
          if (c.verbose && !p.engine.empty()) {
            std::fprintf(stderr, "  block %u depth %u repeat %d %-10s %10.0f IOPS  p50 %.1f us\n",
                         block, depth, r, p.engine.c_str(), p.iops, p.p50_us);
          }
        }
      }
      const ReadPoint uring = Median(runs["io_uring"]);
      curve.push_back(uring);
      ReadPoint fio, pread;
      if (!c.no_fio) curve.push_back(fio = Median(runs["fio"]));
      if (!c.no_fallback) curve.push_back(pread = Median(runs["pread_pool"]));
      auto num = [](bool have, double v) {
        char b[32];
        if (!have) return std::string("-");
        std::snprintf(b, sizeof(b), "%.0f", v);
        return std::string(b);
      };
      auto ratio = [&](bool have, const char* engine) {
        char b[32];
        if (!have || c.no_fio) return std::string("-");
        std::snprintf(b, sizeof(b), "%.3f", PairedRatio(runs[engine], runs["fio"]));
        return std::string(b);
      };
      const bool met = c.no_fio || PairedRatio(runs["io_uring"], runs["fio"]) >= 0.9;
      all_met = all_met && met;
      std::printf("%7u %4u %12s %14.0f %7s %14s %7s %10.1f %9.1f %9.1f %s\n", block, depth,
                  num(!c.no_fio, fio.iops).c_str(), uring.iops, ratio(true, "io_uring").c_str(),
                  num(!c.no_fallback, pread.iops).c_str(),
                  ratio(!c.no_fallback, "pread_pool").c_str(), uring.mb_per_s, uring.p50_us,
                  uring.p99_us, emulated ? "EMULATED" : (met ? "met" : "MISSED"));
      std::fflush(stdout);
    }
  }
  if (!fio_commands.empty()) {
    std::printf("\n# fio commands (one per point, run %d time(s) each):\n", c.repeat);
    for (const std::string& cmd : fio_commands) std::printf("%s\n", cmd.c_str());
  }
  if (!c.csv.empty()) {
    WriteCsv(c.csv, curve);
    std::printf("# random-read curve written to %s\n", c.csv.c_str());
  }
  if (!c.json.empty()) {
    WriteJson(c.json, c, device, path, curve);
    std::printf("# random-read curve written to %s\n", c.json.c_str());
  }
  if (!c.no_fio) {
    std::printf("# io_uring store >= 90%% of fio at every point: %s\n", all_met ? "yes" : "NO");
  }
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::Config c;
  CLI::App app{"Random-read benchmark of the Strata block store against fio"};
  app.add_option("--dir", c.dir, "directory on the disk to measure (the 2 GiB file is kept there)")
      ->required();
  app.add_option("--mode", c.mode,
                 "short (0.5 s per measurement, 1 repeat) or full (1 s, 15 repeats)")
      ->check(CLI::IsMember({"short", "full"}));
  app.add_option("--size-gib", c.size_gib, "data size of the benchmark file")
      ->check(CLI::Range(0.01, 1024.0));
  app.add_option("--runtime", c.runtime, "seconds per measurement (overrides --mode)")
      ->check(CLI::Range(0.1, 600.0));
  app.add_option("--repeat", c.repeat, "interleaved repeats per point (overrides --mode)")
      ->check(CLI::Range(1, 50));
  app.add_option("--block-sizes", c.blocks, "block sizes in bytes")->delimiter(',');
  app.add_option("--depths", c.depths, "queue depths")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--csv", c.csv, "write the random-read curve as CSV here");
  app.add_option("--json", c.json, "write the random-read curve as JSON here");
  app.add_flag("--no-fio", c.no_fio, "skip fio");
  app.add_flag("--no-fallback", c.no_fallback, "skip the pread-pool store");
  app.add_flag("--verbose", c.verbose, "print every measurement to stderr");
  app.add_flag("--emulate-emmc", c.emulate_emmc,
               "slow-disk emulation at 250 MB/s and 11000 IOPS (labelled)");
  app.add_option("--emulate-bandwidth-mbps", c.emulate_mbps, "slow-disk emulation bandwidth")
      ->check(CLI::Range(0.01, 1e6));
  app.add_option("--emulate-iops", c.emulate_iops, "slow-disk emulation request rate")
      ->check(CLI::Range(1.0, 1e8));
  app.add_option("--emulate-latency-us", c.emulate_latency_us, "slow-disk added latency")
      ->check(CLI::Range(0.0, 1e7));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (int i = 0; i < argc; ++i) c.command_line += (i ? " " : "") + std::string(argv[i]);
  return strata::bench::Run(c);
}
