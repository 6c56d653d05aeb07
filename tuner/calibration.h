// Calibration of the disk-backed KV policy's adapters: run the model over calibration text,
// collect every layer's post-RoPE keys, and take the leading right singular vectors of the
// key matrix (an SVD through LAPACKE) as that layer's low-rank projection A for each
// requested compression ratio. `strata calibrate` writes the result with Adapters::Write.
//
// Keys are taken after RoPE because that is what K_lr summarizes at run time, and from long
// windows so the rotations of late positions are represented too. The SVD is uncentered:
// A must keep q.k, which depends on the keys' mean as much as on their spread.
//
// Query-aware mode also collects the queries the policy will form at run time (each
// layer's approximate query from the previous layer's input) and fits K_lr = K A and
// q_lr = q B so that q B A^T k best matches q.k over what was seen (least squares for
// independent q and k: a truncated SVD of Lq^T Lk, with Lq, Lk the Cholesky factors of the
// query and key covariances). Key-only SVD keeps directions where keys vary most even when
// queries ignore them; this keeps the directions scores depend on.
//
// Runs its own engine (memory KV) on the caller's thread plus `threads` workers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/kv/disk/adapters.h"

namespace strata {

class Model;

struct CalibrationOptions {
  std::string text_path;
  // Use only the first part of the text (by bytes), so the rest can serve for evaluation;
  // the project calibrates on the first half of tinyshakespeare and evaluates on the second.
  double text_fraction = 0.5;
  std::vector<int32_t> ratios = {4, 8, 16, 32};
  int32_t tokens = 8192;  // keys collected per layer
  int32_t window = 8192;  // tokens per forward window (positions 0 .. window-1)
  int32_t threads = 0;    // 0 = one per core
  // Query-aware fit instead of the keys' SVD alone (B = A). Off by default: on SmolLM2-135M
  // it selected no better groups than the plain SVD (bench_kv_quality, 2 windows).
  bool query_aware = false;
  // Positions per window (spread over its second half) whose attention is measured for
  // the layers' attention profile (see AttentionProfile).
  int32_t profile_samples = 64;
};

// progress (may be empty) receives one line per stage.
Status Calibrate(const Model& model, const CalibrationOptions& options, Adapters* out,
                 const std::function<void(const std::string&)>& progress = {});

// The projection of one layer: the `rank` leading right singular vectors of keys
// ([n][row], row-major) as a [row][rank] matrix. Exposed for tests.
Status LowRankProjection(const std::vector<float>& keys, int32_t n, int32_t row, int32_t rank,
                         std::vector<float>* a);

// The query-aware pair (A, B) for each rank from the key and query covariances ([row][row],
// row-major). Exposed for tests.
Status QueryAwareProjection(const std::vector<double>& key_cov,
                            const std::vector<double>& query_cov, int32_t row,
                            const std::vector<int32_t>& ranks, std::vector<std::vector<float>>* a,
                            std::vector<std::vector<float>>* b);

}  // namespace strata
