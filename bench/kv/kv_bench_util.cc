#include "bench/kv/kv_bench_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "runtime/engine/engine.h"

namespace strata::bench {

Status ParseDiskSpec(const std::string& spec, const DiskKvOptions& base, int32_t n_ctx,
                     int64_t full_cache_bytes, DiskKvOptions* out) {
  (void)n_ctx;
  DiskKvOptions o = base;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return Status::InvalidArgument("spec item '" + item + "' has no '='");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    try {
      if (k == "G") {
        o.group_size = std::stoi(v);
      } else if (k == "sigma") {
        o.ratio = std::stoi(v);
      } else if (k == "M") {
        o.groups_per_step = std::stoi(v);
      } else if (k == "C") {
        o.reuse_slots = std::stoi(v);
      } else if (k == "T") {
        o.read_through = std::stoi(v);
      } else if (k == "S") {
        o.read_through_span = std::stoi(v);
      } else if (k == "qd") {
        o.queue_depth = std::stoi(v);
      } else if (k == "sink") {
        o.sink_groups = std::stoi(v);
      } else if (k == "recent") {
        o.recent_groups = std::stoi(v);
      } else if (k == "adapters") {
        o.adapters = v;
      } else if (k == "refine") {
        o.refine = v == "1";
      } else if (k == "layers") {
        STRATA_RETURN_IF_ERROR(ParseAutoSwitch(v, &o.calibrated_layers));
      } else if (k == "resident") {
        o.attend_resident = v == "1";
      } else if (k == "tail") {
        o.attend_tail = v == "1";
      } else if (k == "tw") {
        o.tail_weight = std::stof(v);
      } else if (k == "tl") {
        o.tail_first_layer = std::stoi(v);
      } else if (k == "reload") {
        o.reload_all = v == "1";
      } else if (k == "reuse") {
        STRATA_RETURN_IF_ERROR(ParseReusePolicy(v, &o.reuse));
      } else if (k == "type") {
        STRATA_RETURN_IF_ERROR(ParseKvRecordType(v, &o.record_type));
      } else if (k == "bonus") {
        o.resident_bonus = std::stof(v);
      } else if (k == "dbonus") {
        o.dispersed_bonus = std::stof(v);
      } else if (k == "spread") {
        o.group_spread = std::stof(v);
      } else if (k == "gsum") {
        STRATA_RETURN_IF_ERROR(ParseAutoSwitch(v, &o.group_summary));
      } else if (k == "klr") {
        STRATA_RETURN_IF_ERROR(ParseKeySummaryType(v, &o.summary_type));
      } else if (k == "scoring") {
        STRATA_RETURN_IF_ERROR(ParseGroupScoring(v, &o.scoring));
      } else if (k == "budget") {
        o.budget_bytes =
            v.rfind("1/", 0) == 0 ? full_cache_bytes / std::stoll(v.c_str() + 2) : std::stoll(v);
      } else {
        return Status::InvalidArgument("unknown spec key '" + k + "'");
      }
    } catch (const std::exception&) {
      return Status::InvalidArgument("spec item '" + item + "': not a number");
    }
  }
  *out = o;
  return Status::OK();
}

std::string CommandLine(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s.push_back(' ');
    s.append(argv[i]);
  }
  return s;
}

}  // namespace strata::bench
