// Shared pieces of the KV benchmarks (bench_kv_quality, bench_kv_speed): disk policy
// settings written as short specs, and the command line. Evaluation text and replayed
// prefixes come from the tuner (tuner/kv_replay.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "runtime/model/model.h"
#include "tuner/kv_replay.h"

namespace strata::bench {

// "group_size=4,ratio=16,budget_bytes=1/13,experimental.resident_bonus=0": keys of
// strata.yaml's kv section (with or without "kv."; docs/config-reference.md), checked by
// the same schema, applied over `base`. budget_bytes also takes 1/N of the full cache.
Status ParseDiskSpec(const std::string& spec, const DiskKvOptions& base, int32_t n_ctx,
                     int64_t full_cache_bytes, DiskKvOptions* out);

// Command line as one string, for printing above a table.
std::string CommandLine(int argc, char** argv);

}  // namespace strata::bench
