// The tuner's cost model of one decode step, and the compute half of its profile.
//
// A step of the disk policy at batch b runs, layer by layer, the selection for the next
// layer (scoring K_lr rows at the adapters' rank), then that layer's compute while the
// selected groups' reads are in flight:
//   step = sum over layers of [select_l + max(compute_l, read_l)]
//   compute = dense(b) + b * attended_tokens * attention_per_token
//   select  = b * [selections * (query + summary_rows * score_per_row(rank))
//                  + n_layer * tail_rows * score_per_row(rank)] / n_layer  (per layer)
//   plus disk_overhead once a step (the policy's per-layer bookkeeping, fitted on a real
//   run at batch 1; most of it is per call, not per sequence)
//   read_l  = DeviceProfile::ReadSeconds(b * requests / n_layer, bytes / request, qd)
// With full KV in memory a step is dense(b) + b * context * attention_per_token. The
// requests and bytes a step reads per sequence come from the quality runs of the same
// configuration (tuner/quality.h), which see the real reuse and coalescing.
//
// The hardware constants are measured here on the user's machine through the engine's own
// code (ProfileCompute); `strata tune` then runs the configurations it picks and records
// measured speed beside the prediction, so the model's error is visible in its output.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "runtime/kv/adapters.h"
#include "runtime/kv/kv_options.h"
#include "runtime/model/model.h"
#include "tuner/device_profile.h"

namespace strata {

struct ComputeProfile {
  int32_t threads = 0;
  // A decode step with a few tokens of context, by batch (ascending).
  std::vector<int32_t> batches;
  std::vector<double> dense_seconds;
  // One step, one sequence, one attended token (all layers).
  double attention_seconds_per_token = 0;
  // One selection of one layer for one sequence, per summary row scored, by adapter rank;
  // and the low-rank query it scores with (norm, Wq, RoPE, adapters), per selection.
  std::vector<int32_t> ranks;
  std::vector<double> score_seconds_per_row;
  double query_seconds = 0;
  // What a disk policy's step costs beyond the parts above (its bookkeeping: appends to the
  // summary, view assembly, waits that are not reads), per step, fitted on a real run of
  // the policy at batch 1 with every group resident (ProfileCompute with a disk policy).
  double disk_overhead_seconds = 0;

  // Interpolated linearly in batch; beyond the largest, extrapolated from the last two.
  double DenseSeconds(int32_t batch) const;
  // Linear in rank between measured ranks, proportional beyond them.
  double ScoreSecondsPerRow(int32_t rank) const;
};

struct ComputeProfileOptions {
  int32_t threads = 0;
  int32_t cuda_device = -1;  // decode steps on this CUDA device; -1: the CPU
  std::vector<int32_t> batches = {1, 2, 4, 8};
  int32_t attention_tokens = 2048;     // context of the attention measurement
  int32_t steps = 8;                   // timed decode steps per point
  int32_t score_rows = 8192;           // summary rows of the scoring measurement
  double memory_bytes_per_second = 0;  // floors attention per token; 0 = no floor
  std::function<void(int64_t done, int64_t total)> progress;  // optional
};

// disk: where the disk policy's overhead run keeps its store and finds the adapters; null
// leaves disk_overhead_seconds at 0.
Status ProfileCompute(const Model& model, const Adapters& adapters,
                      const ComputeProfileOptions& options, const DiskKvOptions* disk,
                      ComputeProfile* out);

// What one decode step of a disk configuration does, per sequence.
struct DiskStepShape {
  int32_t batch = 1;
  int32_t n_layer = 0;
  int64_t attended_tokens = 0;  // tokens attention reads per layer
  int64_t summary_rows = 0;     // K_lr rows scored per selection
  int32_t rank = 0;
  int32_t selections = 0;  // layer selections per step (guesses and refinements)
  int64_t tail_rows = 0;   // summary rows the tail estimate scores per layer (0: no tail)
  double requests = 0;     // reads per step
  double bytes = 0;        // bytes read per step
  uint32_t queue_depth = 64;
};

struct StepPrediction {
  double compute_seconds = 0, select_seconds = 0, read_seconds = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;  // batch / step
};

StepPrediction PredictDiskStep(const DeviceProfile& device, const ComputeProfile& compute,
                               const DiskStepShape& s);
StepPrediction PredictMemoryStep(const ComputeProfile& compute, int32_t batch, int32_t context);

}  // namespace strata
