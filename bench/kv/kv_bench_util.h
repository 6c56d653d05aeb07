// Shared pieces of the KV benchmarks (bench_kv_quality, bench_kv_speed): evaluation windows
// of the text, a cache of each window's post-RoPE K/V computed once with the memory policy,
// replaying a cached prefix into any policy, and disk policy settings written as short specs.
//
// Why a cache: both drivers need the same long prefixes in several policies. Prefill is
// exact under every policy here (the disk policy reads earlier records back for it), so the
// K/V a prefix leaves behind does not depend on the policy; computing it once and appending
// it through the KvPolicy interface gives every policy the state its own prefill would.
//
// Single-threaded (the benchmark's thread), apart from the engine's own pool.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "runtime/model/model.h"

namespace strata::bench {

// Tokens of the part of `text_path` after the first `skip_fraction` of its bytes (cut at a
// line end): the evaluation half when calibration used the first half.
Status EvaluationTokens(const Model& model, const std::string& text_path, double skip_fraction,
                        std::vector<int32_t>* out);

// F16 K and V of every layer for n tokens at positions 0..n-1: data is [layer][K|V][n][row].
struct KvCapture {
  int32_t n_layer = 0;
  int32_t row = 0;
  int32_t n_tokens = 0;
  std::vector<uint16_t> data;
  const uint16_t* k(int32_t layer) const {
    return data.data() + (size_t(2 * layer) * n_tokens) * row;
  }
  const uint16_t* v(int32_t layer) const { return k(layer) + size_t(n_tokens) * row; }
};

// Loads the capture of `tokens` from cache_dir, or computes it (memory policy, `threads`
// workers) and stores it there. *computed tells which.
Status LoadOrCapture(const Model& model, std::span<const int32_t> tokens,
                     const std::string& cache_dir, int32_t threads, KvCapture* out, bool* computed);

// Appends the first n tokens of cap to the empty sequence seq in one pass of Append calls.
Status ReplayPrefix(KvPolicy& kv, SeqId seq, const KvCapture& cap, int32_t n);

// "G=4,sigma=16,budget=1/13,M=0,C=0,T=-1,sink=1,recent=0,reuse=lru,scoring=softmax,reload=0,
// qd=64,adapters=PATH";
// any subset, applied over `base`. budget takes bytes or 1/N of the full cache.
Status ParseDiskSpec(const std::string& spec, const DiskKvOptions& base, int32_t n_ctx,
                     int64_t full_cache_bytes, DiskKvOptions* out);

// Command line as one string, for printing above a table.
std::string CommandLine(int argc, char** argv);

}  // namespace strata::bench
