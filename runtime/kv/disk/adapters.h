// Adapters: the low-rank key projections A of the disk-backed policy, one per layer and
// compression ratio, and the binary file `strata calibrate` writes them to.
//
// For a layer, A is (n_head_kv*head_dim) x rank and K_lr = K * A, sigma =
// n_head_kv*head_dim / rank. A query head h reading KV head g is projected by the rows of
// a matrix B that belong to g, so q_lr . K_lr = q_h^T B_g A^T k approximates q_h . k_g.
// With key-only calibration A has orthonormal columns (leading right singular vectors of
// the keys) and B = A; query-aware calibration fits B A^T to the queries and keys seen
// (see tuner/calibration.h) and stores B too. The file records the model's identity so the
// runtime refuses adapters made for another model, and a checksum so a damaged file is
// refused rather than used.
//
// Calibration also measures each layer's attention profile: how far its attention output
// moves when it reads only n groups, as a function of n. Layers of one model differ a lot here
// (some attend to a few tokens, some to thousands), and the disk policy uses the profile to
// give each layer its share of the selected groups and slots (DiskKvPlan).
//
// File layout (little-endian): "STRKVADP", u32 version (3; 2 is read too, without a
// profile), u64 model identity, u32 n_layer, n_head_kv, head_dim, u64 calibration tokens,
// u32 note length + note bytes, u32 set count, then per set u32 ratio, u32 rank and u32
// "has B", then per set per layer A (rank*row F32 values, row-major [row][rank]) followed by
// B when the set has one; then (version 3) u32 profile points P (0: none), P u32 token
// counts (ascending, the first 0), n_layer*P F32 relative errors; and last a u64 FNV-1a
// checksum of every byte before it.
//
// A plain value; thread-compatible. Read and Write touch only the named file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

class Model;

// rank = row / ratio (at least 1); errors name the ratio and the accepted range [1, row].
Status RankForRatio(int32_t row, int32_t ratio, int32_t* rank);

struct AdapterSet {
  int32_t ratio = 0;
  int32_t rank = 0;
  std::vector<std::vector<float>> layers;   // per layer A: [row][rank]
  std::vector<std::vector<float>> queries;  // per layer B: [row][rank]; empty: B = A
  const std::vector<float>& query(int32_t layer) const {
    return queries.empty() ? layers[size_t(layer)] : queries[size_t(layer)];
  }
};

// How much a layer's attention output changes when it reads only the sink group, the newest
// group and the n heaviest other groups of kGroupSize tokens instead of every token: the
// relative error sqrt(sum |o_n - o|^2 / sum |o|^2) over query heads and sampled positions of
// the calibration text, at token counts n * kGroupSize. A layer whose attention is spread
// over values that differ needs many groups; one that is spread over similar values, or
// concentrated on a few tokens, needs few.
struct AttentionProfile {
  static constexpr int32_t kGroupSize = 4;
  static constexpr float kMaxError = 16.0f;  // files holding more are refused as damaged
  std::vector<int32_t> tokens;               // ascending token counts (n * kGroupSize), from 0
  std::vector<std::vector<float>> error;     // [layer][point], non-increasing in the point

  bool empty() const { return tokens.empty(); }
  // The error of `layer` at t selected tokens, linear between points (flat past the last).
  double Error(int32_t layer, double t) const;
  // Error(layer, t0) - Error(layer, t1), t0 <= t1, summed segment by segment so that equal
  // steps inside one segment give bit-identical results wherever they start.
  double Drop(int32_t layer, double t0, double t1) const;
  // The token counts calibration measures at.
  static std::vector<int32_t> DefaultTokens();
};

struct Adapters {
  // The largest adapters file read (a 70B model's four ratio sets take about 350 MB).
  static constexpr uint64_t kMaxFileBytes = uint64_t(4) << 30;
  uint64_t model_identity = 0;
  int32_t n_layer = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  uint64_t calibration_tokens = 0;
  std::string note;  // what the calibration ran on, for people reading `strata info`
  std::vector<AdapterSet> sets;
  AttentionProfile profile;  // empty in files written before version 3

  int32_t row() const { return n_head_kv * head_dim; }
  const AdapterSet* Find(int32_t ratio) const;
  // "8, 16, 32"
  std::string RatioList() const;

  // Where a model's adapters live when kv.adapters is not set: its path with ".gguf"
  // replaced by ".adapters" (appended when it has no ".gguf").
  static std::string DefaultPath(const std::string& model_path);
  // Errors: missing file (NotFound), damage (Corruption: bad magic, version, sizes,
  // checksum), each naming the file and the field.
  static Status Read(const std::string& path, Adapters* out);
  // The same from the file's bytes (`path` names them in messages). verify_checksum false
  // skips the checksum, so a fuzzer reaches the fields behind it.
  static Status Parse(const std::vector<uint8_t>& bytes, const std::string& path, Adapters* out,
                      bool verify_checksum = true);
  // Writes to path + ".tmp" and renames, so a reader never sees half a file.
  Status Write(const std::string& path) const;
  // Refuses adapters made for another model: identity and shape must match.
  Status CheckModel(const Model& model, const std::string& path) const;
};

}  // namespace strata
