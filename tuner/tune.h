// `strata tune`: measure this machine and this model once, choose the KV settings for each
// (batch, context) of a grid, check the choice by running it, and write strata.yaml.
//
// Steps (each reported through `progress`):
//   1. Device profile (tuner/device_profile.h): the KV device's random-read curve through
//      the block store, memory bandwidth.
//   2. Compute profile (tuner/cost_model.h): decode step time by batch, attention per
//      attended token, selection per summary row by adapter rank, through the engine.
//   3. For each (batch, context): full KV in memory where it fits the memory a sequence
//      has, and disk plans (sigma from the adapters, G, record type, read-through, and M at
//      shares of the groups attended) at budgets from 1/34 of full KV up to what a
//      sequence has. Candidates are taken in order
//      of their optimistic speed (the cost model without reads); each disk plan's quality
//      and reads are measured (tuner/quality.h, cached and resumable) until no untried
//      candidate could beat the best one within the perplexity bound. Full KV is exact and
//      is chosen only where it is also the fastest.
//   4. The chosen configurations run for real (decode steps after a replayed prefix), and
//      their measured speed is recorded beside the prediction and beside the speed of the
//      runtime's defaults at the same memory.
// Nothing of the user's is overwritten: the caller writes the result where it chooses.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/config/config.h"
#include "runtime/kv/kv_options.h"
#include "runtime/model/model.h"
#include "tuner/cost_model.h"
#include "tuner/device_profile.h"

namespace strata {

struct TuneOptions {
  std::string model_path;
  std::string adapters;   // "" = beside the model
  std::string text_path;  // evaluation text (its second half; the first is calibration's)
  std::string work_dir;   // captures and quality results (kept: a rerun resumes)
  std::string kv_dir = "/var/tmp";
  bool emulate_emmc = false;
  std::vector<int32_t> batches = {1};
  std::vector<int32_t> contexts = {4096};
  // KV memory for all the sequences of a batch (llama.cpp's --fit idea): the memory policy
  // must fit in it, a disk configuration gets memory / batch per sequence. 0 = what the
  // machine has available now, less the model's weights and a margin.
  int64_t kv_memory_bytes = 0;
  // Or the memory of the whole process (llama.cpp's --fit idea): KV gets what is left after
  // the process's own needs without KV (model, scratch), measured by running one step of
  // the largest batch, and a margin. At most one of the two is set.
  int64_t process_memory_bytes = 0;
  double max_ppl_loss = 0.03;
  int32_t threads = 0;
  // Speed is measured on this CUDA device (-1: the CPU); quality runs stay on the CPU, as
  // the selection and its results do not depend on where the step is computed.
  int32_t cuda_device = -1;
  int32_t windows = 4;        // quality windows per context
  int32_t scored = 48;        // scored positions per window
  int32_t verify_steps = 32;  // decode steps of the check run (its median is kept)
  // Besides the chosen plan, run up to this many other measured plans per entry and record
  // their speed beside the prediction: a check of the cost model on plans it did not pick.
  int32_t validate = 0;
  // After the grid, measure each run this many times more, a round of every entry's runs at a
  // time (TunedCandidate::remeasured_*: the first round; measured_again_tokens_per_second:
  // every round): how far measurements of one plan lie apart on this machine, and the
  // median of a run's measurements, which one spell of a shared machine does not move.
  int32_t repeat_checks = 0;
  // Besides the plan predicted fastest, run this many of the next ones by prediction (within
  // the bound) and keep whichever measured fastest: the prediction of the plan picked out of
  // many is the one most likely to be too high (its errors are what made it stand out).
  int32_t runners_up = 2;
  int32_t max_candidates = 16;  // quality runs per (batch, context) at most, variants aside
  // Quality runs of plans that re-select fewer groups a step than another measured plan
  // (kv.groups_per_step below C + T), per (batch, context), at most.
  int32_t max_variants = 6;
  bool quick = false;   // shorter device and compute profiles
  std::string command;  // the command line, for provenance
  // Optional: units done of each long phase, for a progress bar. A tuned entry's phase
  // counts its quality runs up to max_candidates + max_variants (the search may need
  // fewer), then its check runs (the choice, the defaults, the --validate plans).
  std::function<void(const std::string& phase, int64_t done, int64_t total)> on_progress;
};

// One disk plan whose quality was measured while choosing an entry.
struct TunedCandidate {
  std::string key;  // its settings
  DiskKvOptions options;
  double predicted_tokens_per_second = 0;
  double ppl_loss = 0, agreement = 1;
  double ppl_loss_upper = 0;  // what --max-ppl-loss is held to (QualitySummary::ppl_loss_upper)
  double requests_per_step = 0, bytes_per_step = 0;
  double refine_requests_per_step = 0;  // of requests_per_step (DiskStepShape)
  bool within_bound = false;
  std::string description;                // the plan
  DiskStepShape shape;                    // what the prediction priced
  StepPrediction predicted;               // its parts
  double measured_tokens_per_second = 0;  // 0: not run (see TuneOptions::validate)
  // The anchor step timed beside the check run (ComputeProfile::anchor_seconds), the KV
  // device's slowdown then against its profile (DiskAnchor::Factor), and the prediction
  // again with the compute profile and the device's curve scaled to those speeds.
  double anchor_seconds = 0;
  double anchor_disk_factor = 1;
  double anchored_tokens_per_second = 0;
  // The prediction at the machine's and the device's speeds during all of the entry's check
  // runs (TunedChoice::checks_anchor_seconds); 0 where not run.
  double checks_anchored_tokens_per_second = 0;
  // The same run measured again after every entry's (TuneOptions::repeat_checks), and the
  // prediction at that run's speeds and at those of all the entry's runs measured again; 0
  // where not run.
  double remeasured_tokens_per_second = 0, remeasured_anchored_tokens_per_second = 0;
  double remeasured_checks_anchored_tokens_per_second = 0;
  std::vector<double> measured_again_tokens_per_second;  // every round (repeat_checks)
  // What the check run read, per sequence and step (0 where none ran), and the prediction
  // again with those reads in place of the quality windows' (requests_per_step): the part of
  // a check's error that the windows' estimate of the reads explains is the difference
  // between the two predictions.
  double measured_requests_per_step = 0, measured_bytes_per_step = 0;
  double measured_refine_requests_per_step = 0;
  double predicted_at_measured_reads = 0;
  // The slot groups attended per sequence and step, all layers (selected or still
  // resident), as the quality windows counted them (what the prediction priced) and as the
  // check run did; predicted_at_measured_reads takes the check's. With M below the slots the
  // resident groups grow as a sequence decodes, so a longer run attends more of them.
  double attended_groups_per_step = 0, measured_attended_groups_per_step = 0;
  // A check run's step apart: the selection's time (the policy's own clock) and the reads it
  // waited on, per step; and the selection as the prediction priced it.
  double measured_select_seconds = 0, measured_wait_seconds = 0;
  double predicted_select_seconds = 0;
};

struct TunedChoice {
  int32_t batch = 1, context = 0;
  bool disk = false;
  DiskKvOptions disk_options;  // resolved: what the plan chose, not "auto"
  std::string description;     // the plan, or "full KV in memory"
  std::string key;             // the chosen candidate's settings key ("memory" for full KV)
  StepPrediction predicted;
  DiskStepShape shape;  // of the disk plan: what the prediction priced
  // The plan predicted fastest, when a runner-up measured faster and was chosen instead
  // (TuneOptions::runners_up); empty otherwise.
  std::string predicted_best;
  double measured_tokens_per_second = 0;
  double anchor_seconds = 0, anchor_disk_factor = 1;  // as TunedCandidate's
  double anchored_tokens_per_second = 0;
  // The entry's check runs take their steps in turn, so all see the same machine: the median
  // of their anchor steps and of their disk anchors, and the choice's prediction at those
  // speeds. One figure for all the runs, steadier than each run's own.
  double checks_anchor_seconds = 0, checks_disk_factor = 1;
  double checks_anchored_tokens_per_second = 0;
  double remeasured_tokens_per_second = 0, remeasured_anchored_tokens_per_second = 0;
  double remeasured_checks_anchored_tokens_per_second = 0;
  std::vector<double> measured_again_tokens_per_second;  // every round (repeat_checks)
  // The runtime's defaults at the same memory (full KV where it fits a sequence's share,
  // else the disk policy at that budget with every setting automatic), measured the same way.
  double default_tokens_per_second = 0;
  double ppl_loss = 0, agreement = 1;
  double ppl_loss_upper = 0;  // what --max-ppl-loss held (QualitySummary::ppl_loss_upper)
  int32_t quality_runs = 0;   // configurations whose quality was measured for this entry
  std::vector<TunedCandidate> candidates;  // in the order they were measured
};

struct TuneReport {
  int64_t process_base_bytes = 0;  // resident memory without KV (model, scratch), measured
  DeviceProfile device;
  ComputeProfile compute;
  std::vector<TunedChoice> choices;
};

Status Tune(const Model& model, const TuneOptions& options,
            const std::function<void(const std::string&)>& progress, TuneReport* out);

// A byte count for people: "1 B", "812 B", "1.5 KiB", "976.6 TiB". Below 1 KiB the exact
// bytes, else the largest binary unit it holds at least one of, so no size that is not zero
// reads as zero.
std::string ReadableBytes(uint64_t bytes);

// The configuration `strata tune` writes: the model, the largest context and the batch-1
// choice as the base settings, one tuned entry per choice, and the provenance.
Config TunedConfig(const Model& model, const TuneOptions& options, const TuneReport& report);

}  // namespace strata
