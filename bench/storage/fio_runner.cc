#include "bench/storage/fio_runner.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace strata::bench {
namespace {

Status RunCapture(const std::string& command, std::string* out) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return Status::FromErrno("popen '" + command + "'", errno);
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int rc = pclose(p);
  if (rc == -1) return Status::FromErrno("pclose '" + command + "'", errno);
  if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
    return Status::IOError("'" + command + "' failed (exit status " +
                           std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) +
                           "): " + out->substr(0, 500));
  }
  return Status::OK();
}

}  // namespace

std::string FioCommand(const FioJob& job) {
  // Same pattern as the store's driver: uniform random block-aligned offsets with
  // replacement (norandommap), a fresh seed per run, one job, io_uring with registered
  // buffers and file like the store uses, O_DIRECT, fixed duration.
  // Whole milliseconds: fio reads "0.5s" as zero, which makes a time_based job run on
  // until it has read the whole size.
  const long runtime_ms = std::lround(job.seconds * 1000);
  return "fio --name=strata_randread --filename=" + job.file +
         " --offset=" + std::to_string(job.offset) + " --size=" + std::to_string(job.size) +
         " --rw=randread --bs=" + std::to_string(job.block) +
         " --iodepth=" + std::to_string(job.depth) +
         " --direct=1 --ioengine=io_uring --fixedbufs --registerfiles --numjobs=1" +
         " --norandommap --randrepeat=0 --time_based --runtime=" + std::to_string(runtime_ms) +
         "ms --output-format=json";
}

Status FioVersion(std::string* version) {
  std::string out;
  STRATA_RETURN_IF_ERROR(RunCapture("fio --version 2>&1", &out));
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  *version = out;
  return Status::OK();
}

Status RunFio(const FioJob& job, ReadPoint* out) {
  std::string json_text;
  STRATA_RETURN_IF_ERROR(RunCapture(FioCommand(job) + " 2>/dev/null", &json_text));
  // fio may print notices before the JSON object.
  const size_t brace = json_text.find('{');
  if (brace == std::string::npos) return Status::IOError("fio printed no JSON: " + json_text);
  try {
    const nlohmann::json j = nlohmann::json::parse(json_text.substr(brace));
    const nlohmann::json& read = j.at("jobs").at(0).at("read");
    out->engine = "fio";
    out->block = job.block;
    out->depth = job.depth;
    out->seconds = read.at("runtime").get<double>() / 1e3;
    out->ios = read.at("total_ios").get<uint64_t>();
    out->iops = read.at("iops").get<double>();
    out->mb_per_s = read.at("bw_bytes").get<double>() / 1e6;
    const nlohmann::json& clat = read.at("clat_ns");
    out->mean_us = clat.at("mean").get<double>() / 1e3;
    const nlohmann::json& pct = clat.at("percentile");
    out->p50_us = pct.at("50.000000").get<double>() / 1e3;
    out->p99_us = pct.at("99.000000").get<double>() / 1e3;
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("cannot read fio's JSON output: ") + e.what());
  }
  if (out->ios == 0 || !std::isfinite(out->iops)) {
    return Status::IOError("fio completed no reads for " + FioCommand(job));
  }
  return Status::OK();
}

}  // namespace strata::bench
