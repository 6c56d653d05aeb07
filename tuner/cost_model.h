// The tuner's cost model of one decode step, and the compute half of its profile.
//
// A step of the disk policy at batch b runs, layer by layer, the selection for the next
// layer, then that layer's compute while the selected groups' reads are in flight:
//   step = select + sum over layers of max(compute_l + path_wait_l, read_l) + own
//   compute = dense(b) + b * attended_tokens * attention_per_token
//             + groups * group_work + q8_tokens * q8_work(b)
//   path_wait_l = what the reads in the layer's own path (read-through groups, a
//             refinement's) take beyond what runs meanwhile, times the share of layers
//             that issue any
//   own = per_step + requests * per_request
//   select  = b / p(b) * [selections * (summary_rows * score_per_row(rank, rows a group)
//                                       + candidate_groups * per_candidate
//                                       + per_selection + rank * per_rank)
//                         + groups * per_group]
//             + b * requests * per_request
//             + selections * query(b)
//   (query(b): one call of the low-rank queries for b rows; p(b): the cores a batch's
//   selections share, min(b, threads) from two sequences on, 1 for one: two or more
//   sequences select side by side, each whole on one worker, so their scoring is priced
//   at one core's rate, one sequence's over the pool; the prices per selection, group and
//   request are fitted for one sequence and for several apart)
//   read_l  = DeviceProfile::ReadSeconds(b * requests * share_l, bytes / request, qd)
//   (share_l: the layer's share of the step's reads, as measured; 1 / n_layer where not)
// Scoring is profiled on its own (GroupPredictor::SelectGroups over summary rows of
// realistic values, by rank and by rows a group: a group's softmax term costs as much as
// several rows' products). The selection's other work (slot planning, queueing and
// submitting reads) is fitted to the policy's own clock of it (KvCounters::predict_seconds)
// in real runs. The policy's own work is priced by constants fitted by least squares to the
// residuals of the same runs, as FlexGen fits its hardware constants, so that no one plan
// decides them: a constant a step and per read request (landing it in its slot), which do
// not overlap with anything, and per attended group (slot lookups, view assembly) and per
// attended token of Q8_0 records (their expansion against F16's, or its saving: the only
// price that may be negative, and fitted apart for one sequence and for several, whose
// records outgrow the cores' caches), which are work in a layer's path and so hide under
// its reads where reads bound the layer. Their fit's columns are therefore each price's
// marginal effect on the predicted step, not the raw counts. With full KV in memory a step is
// dense(b) + b * context * attention_per_token. The requests and bytes a step reads per sequence
// come from the quality runs of the same configuration (tuner/quality.h), which see the real reuse
// and coalescing.
//
// The hardware constants are measured here on the user's machine through the engine's own
// code (ProfileCompute); `strata tune` then runs the configurations it picks and records
// measured speed beside the prediction, so the model's error is visible in its output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/kv_options.h"
#include "runtime/model/model.h"
#include "tuner/device_profile.h"
#include "tuner/kv_replay.h"

namespace strata {

struct ComputeProfile {
  int32_t threads = 0;
  // A decode step with a few tokens of context, by batch (ascending).
  std::vector<int32_t> batches;
  std::vector<double> dense_seconds;
  // One step, one sequence, one attended token (all layers); and the same per sequence
  // for two or more, measured at the largest batch (0: not measured, one sequence's): one
  // sequence's attention splits its few KV heads over the pool's threads, a batch's spreads
  // evenly, so a token of a batch can cost less than one sequence's.
  double attention_seconds_per_token = 0;
  double attention_seconds_per_token_many = 0;
  double AttentionSecondsPerToken(int32_t batch) const {
    return batch >= 2 && attention_seconds_per_token_many > 0 ? attention_seconds_per_token_many
                                                              : attention_seconds_per_token;
  }
  // One selection of one layer for one sequence, per summary row scored, by adapter rank
  // and by summary rows a group (1 for a per-group summary, G for a per-token one):
  // [i * score_group_sizes.size() + j] for ranks[i] and score_group_sizes[j] (ascending;
  // empty: one value a rank, whatever the group). Spread over the pool, as one sequence
  // selects, and on one core, as each of two or more does (empty: as over the pool).
  std::vector<int32_t> ranks;
  std::vector<int32_t> score_group_sizes;
  std::vector<double> score_seconds_per_row;
  std::vector<double> score_seconds_per_row_one_core;
  // The low-rank query a selection scores with (norm, Wq, RoPE, adapters), by rank (ranks):
  // the adapters' product grows with the rank, and at small ranks the call's fixed part
  // (the norm, Wq over the pool) is most of it, so one price for every rank over-priced the
  // selections of small ranks by what the largest rank's adapters take.
  std::vector<double> query_seconds;      // one call for one row
  std::vector<double> query_row_seconds;  // each further row of the same call (a batch)
  // The selection's work beyond scoring and the queries (see the top of this file), fitted
  // to the policy's own clock of it, for one sequence (on the engine's thread, its scoring
  // over the pool) and for two or more (side by side on the workers, their reads queued
  // together): the two run differently enough that one set of prices misses one of them.
  struct SelectionPrices {
    double per_selection = 0;  // a layer selection of one sequence
    // A layer selection's price per candidate group (the groups it ranks, whatever their
    // summary rows): ranking and slot planning go by groups, which the scoring table, timed
    // by rows, does not see; a per-selection price fitted on plans of small G alone
    // over-priced those of large G.
    double per_candidate = 0;
    double per_group = 0;    // an attended group of one sequence
    double per_request = 0;  // a read request
    // A layer selection's price per unit of the summary's rank. In a step the previous
    // layer's compute has swept the caches, so a selection reads its query's adapters (rank
    // columns) from memory, which the profile's queries, one layer timed again and again, do
    // not: timed so, every rank costs about the same, and without this price plans of a
    // small rank were priced at what the runtime's rank takes (docs/experiments/tuner.md).
    double per_rank = 0;
    // The scoring table's prices (score_seconds_per_row*) times this: several sequences
    // select side by side, and how their cores' caches and memory bandwidth share out is
    // fitted on their runs rather than assumed (their other prices are one sequence's times
    // the same scale).
    double score_scale = 1;
  };
  SelectionPrices select_one, select_many;
  // What a disk policy's step costs beyond the parts above: once a step, per attended group
  // and layer of a sequence, per read request (for one sequence, and for two or more, fitted
  // on their runs: a batch submits and reaps its reads while several selections share the
  // cores).
  double disk_overhead_seconds = 0;
  double disk_seconds_per_group = 0;
  double disk_seconds_per_request = 0;
  double disk_seconds_per_request_many = 0;
  // Per attended token and layer of Q8_0 records, against F16 ones (negative where their
  // attention is cheaper), by tokens a group (the bytes a token takes, its record padded to
  // the device block, decide it): for one sequence, and for the largest batch. Timed on cold
  // record views, not fitted (TimeQ8Attention in cost_model.cc).
  std::vector<int32_t> q8_group_sizes;
  std::vector<double> q8_seconds_per_token;
  std::vector<double> q8_seconds_per_token_many;
  int32_t disk_fit_runs = 0;  // real runs these were fitted on
  // Each of those runs beside what the fitted constants predict of it (the tune's report
  // shows them: a fit that misses its own runs says so there).
  struct DiskFitRun {
    int32_t batch = 1, context = 0, group_size = 0, rank = 0, groups_per_step = 0;
    bool q8_records = false, group_summary = false;
    int64_t budget_bytes = 0;
    double step_seconds = 0, select_seconds = 0;  // measured, at the profile's speed
    double predicted_step_seconds = 0, predicted_select_seconds = 0;
  };
  std::vector<DiskFitRun> disk_fit;
  // The machine's speed these constants are at: a batch-1 step at a short context, full KV,
  // timed beside every profile measurement (AnchorTimer), the median; each measurement is
  // scaled to it. A check run times the same step beside itself, and the ratio says how
  // much faster or slower the machine is then.
  double anchor_seconds = 0;

  // Interpolated linearly in batch; beyond the largest, extrapolated from the last two.
  double DenseSeconds(int32_t batch) const;
  // Every compute time above times `factor` (the reads are the device profile's): the
  // profile of the same machine running `factor` times slower.
  ComputeProfile Scaled(double factor) const;
  // At the nearest measured group size; `many`: two or more sequences. 0 without a table.
  double Q8SecondsPerToken(int32_t group_size, bool many) const;
  // Linear in rank between measured ranks, proportional beyond them; linear in 1 / rows a
  // group between measured group sizes, the nearest beyond them.
  double ScoreSecondsPerRow(int32_t rank, int32_t group_rows = 1, bool one_core = false) const;
  // One call of the low-rank queries for `rows` rows at `rank`: linear in rank between
  // measured ranks, the nearest beyond them (the fixed part does not shrink with the rank).
  double QuerySeconds(int32_t rank, int32_t rows = 1) const;
};

struct ComputeProfileOptions {
  int32_t threads = 0;
  int32_t cuda_device = -1;  // decode steps on this CUDA device; -1: the CPU
  std::vector<int32_t> batches = {1, 2, 4, 8};
  int32_t attention_tokens = 2048;  // context of the attention measurement
  // Contexts of the disk policy's fitting runs, shortest and longest (0: half and twice
  // attention_tokens). The tuner gives the contexts it tunes, so the constants are fitted
  // where they are used rather than extrapolated to them.
  int32_t fit_short_context = 0;
  int32_t fit_long_context = 0;
  int32_t steps = 8;          // timed decode steps per point
  int32_t score_rows = 8192;  // summary rows of the scoring measurement
  // Summary rows a group the scoring is measured at: 1 (a per-group summary) and the
  // group sizes a per-token summary may have.
  std::vector<int32_t> score_group_sizes = {1, 4, 5, 8, 16};
  // Tokens a group Q8_0 records are priced at (with the runtime's own group size): the
  // group sizes the tuner's plans take.
  std::vector<int32_t> record_group_sizes = {4, 8, 16};
  double memory_bytes_per_second = 0;  // floors attention per token; 0 = no floor
  // The device the disk policy's fitting runs read from (their reads are modelled with it);
  // null: reads are taken as free.
  const DeviceProfile* device = nullptr;
  // The disk policy's fitting runs replay prefixes of text windows' captures and decode the
  // text's next tokens, as the tuner's check runs do: sequence i of a run window i mod
  // `windows` (windows 0: random K/V, a repeated token).
  struct RealText {
    int32_t windows = 0;
    // Window w's capture (of at least the longest fitting context) and where its tokens
    // begin in `tokens`.
    WindowSource window;
    const std::vector<int32_t>* tokens = nullptr;  // the windows' tokens and those after
  } real;
  std::function<void(int64_t done, int64_t total)> progress;  // optional
};

// The worker count for the CPU engine: of all `cores`, then halving down to 1, the one whose
// decode steps (batch 1 and max_batch, a short context) take least time per token. A
// smaller count must be at least kThreadsMargin faster to win, as it would then leave cores
// idle: it wins where threads contend (SMT siblings, slow cores of a big.LITTLE board, a
// shared machine), not on noise.
constexpr double kThreadsMargin = 0.03;
constexpr int32_t kThreadsRounds = 3;  // each count's timing is the median of these
struct ThreadsChoice {
  int32_t threads = 0;
  std::vector<int32_t> counts;            // tried, from the most
  std::vector<double> seconds_per_token;  // for each: batch-1 step + max-batch step / batch
};
Status ChooseThreads(const Model& model, int32_t cores, int32_t max_batch, int32_t steps,
                     ThreadsChoice* out);

// The upper median (0 for none): what the tuner keeps of repeated timings.
double Median(std::vector<double> v);

class DecodeTimer;

// The anchor step (ComputeProfile::anchor_seconds: one sequence, a short context, full KV)
// timed in between another run's steps, one for each: how fast the machine is while that
// run runs. Anchors timed before and after a run miss a shared machine's drift during it
// (docs/experiments/tuner.md). The two engines do not step at once: each step waits for
// the other engine's workers to stop spinning, since workers of two pools on the same cores
// slow each other.
class AnchorTimer {
 public:
  AnchorTimer();
  ~AnchorTimer();
  // Room for `steps` timed steps after a warm-up.
  Status Init(const Model& model, int32_t threads, int32_t cuda_device, int32_t steps);
  Status Step();
  // The median of the steps after the first; 0 before two steps.
  double Seconds() const;

 private:
  std::unique_ptr<DecodeTimer> timer_;
  std::vector<double> times_;
  int32_t steps_ = 0, done_ = 0;
};

// disk: where the disk policy's fitting runs keep their store and find the adapters; null
// leaves the disk policy's constants at 0.
Status ProfileCompute(const Model& model, const Adapters& adapters,
                      const ComputeProfileOptions& options, const DiskKvOptions* disk,
                      ComputeProfile* out);

// What one decode step of a disk configuration does, per sequence.
struct DiskStepShape {
  int32_t batch = 1;
  int32_t n_layer = 0;
  int64_t attended_tokens = 0;     // tokens attention reads per layer
  int32_t group_size = 1;          // tokens a group
  bool q8_records = false;         // Q8_0 records (attention expands them)
  int64_t summary_rows = 0;        // K_lr rows scored per selection (on average)
  int32_t summary_group_rows = 1;  // summary rows a group (1: a per-group summary)
  int32_t rank = 0;
  int32_t selections = 0;  // layer selections per step (guesses and refinements)
  double requests = 0;     // reads per step
  // Of those, a refinement's (KvCounters::refine_reads_issued): issued once a layer's input
  // is known, just before it attends.
  double refine_requests = 0;
  double bytes = 0;  // bytes read per step
  uint32_t queue_depth = 64;
  // Each layer's share of the step's reads, as measured (KvCounters::layer_reads_issued);
  // empty: every layer the same. Layers miss unevenly (a plan that re-selects a few groups
  // a step reads most in the layers whose attention moves most), and each layer waits for
  // its own reads, so a plan whose mean reads a layer hide under compute still waits on the
  // layers that read most.
  std::vector<double> layer_read_shares;
};

// Each layer's share of the reads counted between `before` and `now`
// (KvCounters::layer_reads_issued); empty where none were.
std::vector<double> LayerReadShares(const std::vector<uint64_t>& now,
                                    const std::vector<uint64_t>& before = {});

struct StepPrediction {
  // compute: the layers' (dense, attention, and the policy's work in a layer's path: per
  // attended group and Q8_0 token); read: all reads, overlapped or not.
  double compute_seconds = 0, select_seconds = 0, read_seconds = 0;
  // Of the step: what the layers wait on reads beyond their compute (the read-through and
  // refinement reads in a layer's path included), and the policy's work outside the layers
  // (once a step, per read request).
  double wait_seconds = 0, own_seconds = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;  // batch / step
};

StepPrediction PredictDiskStep(const DeviceProfile& device, const ComputeProfile& compute,
                               const DiskStepShape& s);
// The groups a layer selection ranks (summary rows over rows a group).
double CandidateGroups(const DiskStepShape& s);
// The selection's part of that step (StepPrediction::select_seconds).
double SelectionSeconds(const ComputeProfile& compute, const DiskStepShape& s);

// The disk policy's own work in a step, in the units its fitted constants price.
struct DiskOwnWork {
  double groups = 0;     // attended groups, all layers, all sequences
  double requests = 0;   // reads, all sequences
  double q8_tokens = 0;  // attended tokens of Q8_0 records, all layers, all sequences
};
DiskOwnWork OwnWork(const DiskStepShape& s);
// The cores a batch's selections share: min(batch, threads) from two sequences on (the
// disk policy selects for each sequence whole on one worker), 1 for one sequence.
double SelectionCores(const ComputeProfile& compute, int32_t batch);

// The shape of a planned configuration; requests, bytes and the slot groups attended
// (selected or still resident, all layers) per sequence step as measured; attended_groups
// < 0: not measured, every slot counted (an upper bound).
DiskStepShape ShapeOfPlan(const DiskKvPlan& plan, const DiskKvOptions& options, int32_t batch,
                          int32_t context, int32_t n_layer, double requests, double bytes,
                          double attended_groups = -1);
StepPrediction PredictMemoryStep(const ComputeProfile& compute, int32_t batch, int32_t context);

// The queue depth (kv.queue_depth) the tuner gives `shape`: a depth of the device's curve
// deeper than shape.queue_depth where the step is predicted at least kMinQueueDepthGain
// faster there (the shallowest such depth within 1% of the fastest), else shape.queue_depth.
// A batch's layer can issue more reads at once than the default queue holds, and a device
// that serves more at once (NVMe, a virtual disk) finishes them sooner in a deeper queue;
// one that does not (eMMC) keeps the default. The tuner never makes a queue shallower: that
// saves a few KiB of ring, and a curve's noise could make it slower.
constexpr double kMinQueueDepthGain = 0.05;
uint32_t ChooseQueueDepth(const DeviceProfile& device, const ComputeProfile& compute,
                          const DiskStepShape& shape);

// Least squares of y on the columns of x (a row per run) with every coefficient >= 0: the
// best of the fits on the subsets of columns whose solution is non-negative (meant for a
// handful of columns: the subsets are 2^columns).
std::vector<double> FitNonNegative(const std::vector<std::vector<double>>& x,
                                   const std::vector<double>& y);

}  // namespace strata
