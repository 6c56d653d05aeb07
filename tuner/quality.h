// The quality half of the tuner's profile: what a disk KV configuration costs in accuracy
// against full KV, on text the adapters were not computed from, and what its decode steps
// read (requests and bytes a step, the reuse it finds), which the cost model needs.
//
// A window of `context` tokens: the first context - scored - 1 are a prefix replayed into
// the policy (tuner/kv_replay.h), the last `scored` are decoded one per pass, teacher-forced,
// as generation would; each position's next-token log-likelihood and top-1 token are
// compared with full KV's on the same window. Perplexity loss = exp(mean NLL difference) - 1.
// A configuration's windows decode side by side, one sequence each in one engine: a token's
// result does not depend on who shares its pass, and the pass reads the weights once for
// all of them and selects for them side by side, a fraction of one after another.
//
// Results are kept in a JSON-lines file, one line per (model, configuration, context,
// window), so an interrupted tune resumes where it stopped and a rerun measures nothing
// twice. A line is appended and flushed as soon as its window is done (windows decoded side
// by side: as soon as they are). Each line ends with a checksum of its record (the field
// "fnv1a", last): a line cut short by an interruption, or altered, is told from a whole one,
// reported once, left out of the file (rewritten without it, so the next line appended never
// continues a partial one) and measured again. The file and the captures beside it hold the
// model's activations on the text: they are created readable by their owner only.
//
// Runs engines on the caller's thread plus their pools.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/kv/kv_options.h"
#include "runtime/model/model.h"
#include "tuner/kv_replay.h"

namespace strata {

struct WindowQuality {
  int32_t positions = 0;
  double nll = 0;           // summed over positions
  int32_t agree = 0;        // positions whose top-1 token is full KV's
  int32_t clear = 0;        // positions where full KV's best two logits differ by >= 0.5
  int32_t clear_agree = 0;  // ... and the configuration agrees
  // Decode steps of the window (disk policy): what they read and reused, counted from the
  // scored pass `counted_from` on (kSettleSteps, or all but the last pass of a shorter
  // window: the passes before the plan's reads settle are not counted).
  int32_t counted_from = 0;
  int64_t steps = 0, reads = 0, bytes_read = 0, groups_selected = 0, reuse_hits = 0;
  int64_t refine_reads = 0;  // of reads: the refinements' (KvCounters::refine_reads_issued)
  // Groups attention read only because they were still resident (all layers): with the
  // selected ones, what a step attends beyond its sink and recent window.
  int64_t resident_attended = 0;
  // Of reads, each layer's (KvCounters::layer_reads_issued; empty in results written before
  // it: the cost model then spreads reads evenly).
  std::vector<int64_t> layer_reads;
  // Per position: the top-1 token and its margin over the second (full KV's are the
  // reference the configurations are compared with).
  std::vector<int32_t> argmax;
  std::vector<float> margin;
  std::vector<float> nlls;  // per position, for the spread of the differences
};

// One decoded position: the loss of the true next token (-log softmax), the top-1 token and
// its logit's margin over the second best.
struct PositionScore {
  double nll = 0;
  int32_t argmax = 0;
  float margin = 0;
};
PositionScore ScorePosition(const float* logits, int32_t n_vocab, int32_t target);

// One-sided 95% normal quantile: the tuner's bound holds for a plan's upper estimate of its
// loss, not its mean over a few hundred positions. Choosing the fastest plan whose mean
// falls below the bound favours plans whose windows happened to go easy on them; on text
// the tuner never saw, such a plan loses more (docs/experiments/tuner.md).
constexpr double kQualityZ = 1.645;

// Sums of windows, and what they mean.
struct QualitySummary {
  WindowQuality sum;
  double full_nll = 0;  // full KV's summed NLL over the same positions
  double diff_sq = 0;   // sum over positions of (NLL - full KV's NLL)^2
  int32_t windows = 0;
  double ppl_loss() const;  // exp((nll - full_nll) / positions) - 1
  // The loss at the mean NLL difference plus z standard errors of it (positions taken as
  // independent, which neighbours in one window are not quite: an estimate on the low side).
  double ppl_loss_upper(double z = kQualityZ) const;
  double agreement() const;  // on clear positions (all positions when none is clear)
  double requests_per_step() const;
  double refine_requests_per_step() const;  // of requests_per_step
  double bytes_per_step() const;
  // Slot groups attended a step, all layers: the selected and the still resident.
  double attended_groups_per_step() const;
  // Each layer's share of the reads (DiskStepShape::layer_read_shares); empty where a
  // window has no per-layer count.
  std::vector<double> layer_read_shares() const;
};

struct QualityOptions {
  std::string text_path;       // evaluation text
  double skip_fraction = 0.5;  // the part calibration used (tuner/calibration.h)
  int32_t scored = 32;         // decoded positions per window
  int32_t windows = 2;         // windows per context
  std::string cache_dir;       // replay captures and the results file live here
  int32_t threads = 0;
  // Tokens between the starts of consecutive windows; 0 (or less than a context): the
  // context itself. With several contexts the tuner sets the longest, so a shorter window is
  // the start of a longer one and both replay one capture of the longest prefix: computing
  // a capture (a full prefill) is most of a quick tune's time.
  int32_t window_stride = 0;
  // Captures kept loaded between windows, in bytes: every plan replays the same few, and
  // reading one back from the work directory costs about as much as replaying it. 0 keeps
  // none (each window reads its capture); captures past the limit are read each time. The
  // same bound holds the KV of windows decoded side by side (full KV, or a plan's budget,
  // a window): past it they run a few at a time.
  uint64_t capture_memory_bytes = 0;
  // Optional: where damaged work files (results lines, captures) are reported.
  std::function<void(const std::string&)> log;
};

class QualityProfiler {
 public:
  // Loads the text's evaluation tokens and the results file (cache_dir/quality.jsonl).
  static Status Open(const Model& model, const QualityOptions& options,
                     std::unique_ptr<QualityProfiler>* out);

  // The quality of `disk` (a disk policy configuration; its `dir` is used for the store)
  // at `context` over the options' windows, measuring only windows not in the results
  // file. `key` names the configuration in that file (the same key must mean the same
  // settings). *measured counts windows run now.
  Status Measure(const DiskKvOptions& disk, const std::string& key, int32_t context,
                 QualitySummary* out, int32_t* measured = nullptr);

  // Windows of `context` the text holds.
  int32_t WindowsAvailable(int32_t context) const;
  // The capture of window w of `context`: the K/V of all but the last token of the stride
  // that begins there (computed once, cached on disk, and held in memory within
  // options.capture_memory_bytes), so any prefix of any context whose windows start there
  // replays from it. The speed runs use window 0's.
  Status Capture(int32_t context, int32_t w, std::shared_ptr<const KvCapture>* out) const;
  // Where window w of `context` begins in tokens().
  size_t WindowBegin(int32_t context, int32_t w) const { return size_t(w) * Stride(context); }
  // The text's evaluation tokens (the part after options.skip_fraction).
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  QualityProfiler(const Model& model, const QualityOptions& options)
      : model_(model), options_(options) {}
  size_t Stride(int32_t context) const { return size_t(std::max(context, options_.window_stride)); }
  std::string LineKey(const std::string& config, int32_t context, int32_t window) const;
  // Windows ws of `context` under `disk`, or full KV (disk null), decoded side by side.
  Status Windows(int32_t context, std::span<const int32_t> ws, const DiskKvOptions* disk,
                 std::vector<WindowQuality>* out);
  // Measures and records the windows of `config` not in the results file.
  Status Missing(const std::string& config, int32_t context, const DiskKvOptions* disk);
  // Keeps a result and appends it to the results file, flushed.
  Status Record(const std::string& key, const WindowQuality& q);
  // Reads the results file's whole lines; rewrites it without its damaged ones, which are
  // reported (options_.log) and measured again.
  Status Load();

  const Model& model_;
  QualityOptions options_;
  std::vector<int32_t> tokens_;
  uint64_t text_hash_ = 0;
  std::string results_path_;
  std::map<std::string, WindowQuality> results_;
  // Loaded captures by the token offset their window begins at, and their bytes.
  mutable std::map<size_t, std::shared_ptr<const KvCapture>> held_;
  mutable uint64_t held_bytes_ = 0;
};

}  // namespace strata
