#include "tuner/tune.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <memory>

#include "platforms/platform.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_store.h"
#include "strata/strata.h"
#include "tuner/kv_replay.h"
#include "tuner/quality.h"
#include "tuner/solver.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// Leaves room for the weights, activations and the rest of the process when the memory
// budget is what the machine has free.
constexpr uint64_t kMemoryMargin = uint64_t(512) << 20;

struct Candidate {
  DiskKvOptions options;
  DiskKvPlan plan;
  std::string key;
  StepPrediction optimistic;  // no reads: what the configuration cannot beat
  bool automatic = false;     // every setting left to the runtime's rules
  int32_t parent = -1;        // the plan of the same budget this one selects fewer groups than
};

// What a plan selects and reads depends on these settings only: not on the device's speed
// (kv.emulate_emmc) or the queue depth, so quality results serve every device.
// M is named only where it was set (0: every slot chosen afresh), so keys of plans that
// leave it to the runtime read as they always did and cached results stay valid.
std::string KeyOf(const DiskKvOptions& o) {
  return "disk:sigma=" + std::to_string(o.ratio) + ",G=" + std::to_string(o.group_size) +
         ",record=" + KvRecordTypeName(o.record_type) + ",T=" + std::to_string(o.read_through) +
         ",budget=" + std::to_string(o.budget_bytes) +
         ",group_summary=" + AutoSwitchName(o.group_summary) +
         ",calibrated=" + AutoSwitchName(o.calibrated_layers) +
         (o.groups_per_step > 0 ? ",M=" + std::to_string(o.groups_per_step) : "");
}

// M as a share of the groups a layer attends (C + T), besides the runtime's M = C + T. A
// smaller M re-selects fewer groups a step, so fewer are read: the slots keep stale picks
// of earlier steps, which attention still reads. On a device bound by its request rate
// (eMMC) the reads are most of the step and this is the setting that moves speed most; on
// a fast disk it saves little, and its cost is quality, which the search measures.
constexpr double kGroupShares[] = {0.75, 0.5};

// The largest file the device profile reads from (see ProfileDevice's caller).
constexpr uint64_t kMaxProbeBytes = uint64_t(8) << 30;

// What a check run read from the slow tier, and where its steps went.
struct MeasuredReads {
  double requests = 0, refine_requests = 0, bytes = 0;  // per sequence and step
  double attended_groups = 0;        // slot groups attended per sequence and step, all layers
  std::vector<double> layer_shares;  // each layer's share of the reads
  // Per step, the whole batch: choosing what to load (KvCounters::predict_seconds) and
  // waiting on reads that compute did not hide.
  double select_seconds = 0, wait_seconds = 0;
};

// A check run: the decode speed of a configuration. `batch` sequences hold a replayed prefix
// of the evaluation text (sequence i the start of quality window i mod o.windows, whose
// capture it shares: a batch's reads are then those of the windows' text, which the quality
// runs average, rather than one window's, which can read several percent more or less),
// then decode kSettleSteps teacher-forced tokens together, not timed (the first warms the
// caches and loads the slots, the rest let the plan's reads settle), and `steps` more in
// bursts (CheckRunner::Turn); the speed of the median of those. Its engine holds the prefix
// between turns, so that several runs can take their turns in turn (MeasureSpeeds).
struct CheckRun {
  int32_t batch = 1, context = 0;
  const DiskKvOptions* disk = nullptr;  // null: full KV in memory
  // Results.
  double tokens_per_second = 0;
  double anchor_seconds = 0;  // the anchor step timed beside the run's (AnchorTimer)
  double disk_factor = 1;     // the KV device's slowdown then (DiskAnchor::Factor)
  MeasuredReads reads;

  // KV memory the run holds: its budget, or full KV, for every sequence.
  uint64_t KvBytes(const HParams& hp) const {
    return uint64_t(batch) *
           (disk ? uint64_t(std::max<int64_t>(0, disk->budget_bytes)) : FullKvBytes(hp, context));
  }
};

// Timed steps of a check run in one turn. Each turn starts with one untimed step: the other
// runs' turns evict this run's summary rows, slots and tables from the CPU caches, which a
// run decoding alone (as the runtime does, and as the fitting runs are timed) keeps warm
// from one step to the next. Timed cold, a plan with a large working set measures slower
// than it decodes alone, and the cost model, fitted on warm steps, would be judged against
// a cost no user pays. A turn is still short beside the spells of a shared machine
// (MeasureSpeeds), so every run's turns span the same spells.
constexpr int32_t kTurnSteps = 8;

// Of a KV policy's counters, what the tuner compares with its estimates, summed over the
// timed steps only.
struct TimedCounters {
  uint64_t reads = 0, refine_reads = 0, bytes = 0, attended = 0;
  std::vector<uint64_t> layer_reads;
  double predict_seconds = 0, io_wait_seconds = 0;

  void Add(const KvCounters& before, const KvCounters& after) {
    reads += after.reads_issued - before.reads_issued;
    refine_reads += after.refine_reads_issued - before.refine_reads_issued;
    bytes += after.bytes_read - before.bytes_read;
    attended += after.slot_groups_attended() - before.slot_groups_attended();
    layer_reads.resize(std::max(layer_reads.size(), after.layer_reads_issued.size()));
    for (size_t l = 0; l < after.layer_reads_issued.size(); ++l)
      layer_reads[l] += after.layer_reads_issued[l] -
                        (l < before.layer_reads_issued.size() ? before.layer_reads_issued[l] : 0);
    predict_seconds += after.predict_seconds - before.predict_seconds;
    io_wait_seconds += after.io_wait_seconds - before.io_wait_seconds;
  }
};

class CheckRunner {
 public:
  // Decode steps a run of `steps` timed steps takes: the settling ones, the timed ones and
  // the untimed first step of every turn after the first.
  static int32_t DecodeSteps(int32_t steps) {
    return kSettleSteps + steps + (steps + kTurnSteps - 1) / kTurnSteps - 1;
  }

  Status Init(const Model& model, const TuneOptions& o, const QualityProfiler& quality,
              DiskProbe* probe, const DeviceProfile& device, CheckRun* run) {
    run_ = run;
    steps_ = std::max(1, o.verify_steps);
    prefix_ = run->context - DecodeSteps(steps_) - 1;
    if (prefix_ < 1)
      return Status::InvalidArgument(
          "tune: a context of " + std::to_string(run->context) +
          " tokens leaves no prefix before the " + std::to_string(DecodeSteps(steps_)) +
          " decode steps of a check run (" + std::to_string(kSettleSteps) + " settling, " +
          std::to_string(steps_) + " timed)");
    tokens_ = &quality.tokens();
    // An anchor step after each of the run's: how fast the machine is while the run runs.
    STRATA_RETURN_IF_ERROR(anchor_.Init(model, o.threads, o.cuda_device, steps_));
    if (run->disk) disk_anchor_ = std::make_unique<DiskAnchor>(probe, device);
    STRATA_RETURN_IF_ERROR(
        CreateRunEngine(model, o.threads, run->context, run->batch, run->disk, &e_, o.cuda_device));
    STRATA_RETURN_IF_ERROR(ReplayWindows(
        *e_, run->batch, o.windows,
        [&](int32_t w, std::shared_ptr<const KvCapture>* cap, size_t* begin) {
          *begin = quality.WindowBegin(run->context, w);
          return quality.Capture(run->context, w, cap);
        },
        prefix_, &seqs_, &begins_));
    // A plan whose budget stages fewer tokens a pass than the batch steps it in as many
    // passes.
    most_ = size_t(std::max(1, std::min(e_->forward().max_tokens(), e_->kv().max_pass_tokens())));
    return Status::OK();
  }

  bool done() const { return int32_t(times_.size()) == steps_; }

  // One turn: the settling steps (the first turn) or one untimed step (the others), then up
  // to kTurnSteps timed steps, each followed by its anchors. `on_step` sees each decode step.
  Status Turn(const std::function<void()>& on_step) {
    for (int32_t i = 0, n = step_ == 0 ? kSettleSteps : 1; i < n; ++i) {
      STRATA_RETURN_IF_ERROR(Step(nullptr));
      on_step();
    }
    const KvCounters c0 = e_->kv().counters();
    for (int32_t i = 0; i < kTurnSteps && !done(); ++i) {
      double seconds = 0;
      STRATA_RETURN_IF_ERROR(Step(&seconds));
      times_.push_back(seconds);
      // The anchor step warms up beside the first timed step and is timed beside the rest.
      if (times_.size() == 1) STRATA_RETURN_IF_ERROR(anchor_.Step());
      STRATA_RETURN_IF_ERROR(anchor_.Step());
      if (disk_anchor_) STRATA_RETURN_IF_ERROR(disk_anchor_->Step());
      on_step();
    }
    counted_.Add(c0, e_->kv().counters());
    if (done()) Finish();
    return Status::OK();
  }

 private:
  // One decode step of every sequence; `seconds` (optional) its time. A step's time ends
  // once the policy has nothing left running (KvPolicy::Settle): what the next step would
  // wait for when it followed at once is the step's, however long the other runs' turns
  // keep this one idle.
  Status Step(double* seconds) {
    const auto t0 = Clock::now();
    for (size_t j0 = 0; j0 < seqs_.size(); j0 += most_) {
      fb_.Clear();
      for (size_t j = j0; j < std::min(seqs_.size(), j0 + most_); ++j)
        fb_.Add(seqs_[j], prefix_ + step_,
                std::span<const int32_t>(&(*tokens_)[begins_[j] + size_t(prefix_ + step_)], 1));
      STRATA_RETURN_IF_ERROR(e_->Evaluate(fb_, &logits_));
    }
    STRATA_RETURN_IF_ERROR(e_->kv().Settle());
    if (seconds) *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    ++step_;
    return Status::OK();
  }

  void Finish() {
    // The median step, as the profile times its steps: one stall of a shared machine would
    // otherwise move a short run's mean by more than the cost model's error.
    std::sort(times_.begin(), times_.end());
    const double step = times_[times_.size() / 2];
    run_->tokens_per_second = step > 0 ? double(run_->batch) / step : 0;
    run_->anchor_seconds = anchor_.Seconds();
    run_->disk_factor = disk_anchor_ ? disk_anchor_->Factor() : 1;
    const double n = double(run_->batch) * double(steps_);
    MeasuredReads& r = run_->reads;
    r.requests = double(counted_.reads) / n;
    r.refine_requests = double(counted_.refine_reads) / n;
    r.bytes = double(counted_.bytes) / n;
    r.attended_groups = double(counted_.attended) / n;
    r.layer_shares = LayerReadShares(counted_.layer_reads, {});
    r.select_seconds = counted_.predict_seconds / double(steps_);
    r.wait_seconds = counted_.io_wait_seconds / double(steps_);
    e_.reset();  // its memory goes before the next group's runs start
  }

  CheckRun* run_ = nullptr;
  int32_t steps_ = 0, prefix_ = 0, step_ = 0;
  const std::vector<int32_t>* tokens_ = nullptr;
  AnchorTimer anchor_;
  std::unique_ptr<DiskAnchor> disk_anchor_;
  std::unique_ptr<Engine> e_;
  std::vector<SeqId> seqs_;
  std::vector<size_t> begins_;
  size_t most_ = 1;
  ForwardBatch fb_;
  std::vector<float> logits_;
  std::vector<double> times_;
  TimedCounters counted_;
};

// Measures `runs` with their steps taken in turn, a turn of each in a round
// (CheckRunner::Turn). A shared machine's speed moves by a fifth or more for seconds at a
// time, more for batched steps than for the anchor's (docs/experiments/tuner.md): runs one
// after another would each catch a spell of their own, and both the choice among
// runners-up and the comparison with the predictions would follow when each ran. In turn,
// every run's steps span the same spells. Runs whose KV would together pass half the
// memory free now go in groups, one after another. `on_step` (optional) sees the decode
// steps done of all.
Status MeasureSpeeds(const Model& model, const TuneOptions& o, const QualityProfiler& quality,
                     DiskProbe* probe, const DeviceProfile& device, std::span<CheckRun> runs,
                     const std::function<void(int64_t done, int64_t total)>& on_step = nullptr) {
  uint64_t room = UINT64_MAX;
  PlatformInfo now;
  if (DetectPlatform(&now).ok() && now.memory_available > 0) room = now.memory_available / 2;
  const int64_t per_run = CheckRunner::DecodeSteps(std::max(1, o.verify_steps));
  const int64_t total = per_run * int64_t(runs.size());
  int64_t done = 0;
  for (size_t first = 0; first < runs.size();) {
    size_t end = first + 1;
    uint64_t bytes = runs[first].KvBytes(model.hparams());
    while (end < runs.size() && bytes + runs[end].KvBytes(model.hparams()) <= room)
      bytes += runs[end++].KvBytes(model.hparams());
    std::vector<CheckRunner> group(end - first);
    for (size_t i = 0; i < group.size(); ++i)
      STRATA_RETURN_IF_ERROR(group[i].Init(model, o, quality, probe, device, &runs[first + i]));
    for (bool stepped = true; stepped;) {
      stepped = false;
      for (CheckRunner& r : group) {
        if (r.done()) continue;
        STRATA_RETURN_IF_ERROR(r.Turn([&] {
          if (on_step) on_step(++done, total);
        }));
        stepped = true;
      }
    }
    first = end;
  }
  return Status::OK();
}

// The median anchor step and disk anchor of `runs` (taken in turn: they saw one machine).
void MedianSpeeds(std::span<const CheckRun> runs, double* anchor_seconds, double* disk_factor) {
  std::vector<double> anchors, disks;
  for (const CheckRun& r : runs) {
    anchors.push_back(r.anchor_seconds);
    if (r.disk) disks.push_back(r.disk_factor);
  }
  *anchor_seconds = Median(anchors);
  *disk_factor = disks.empty() ? 1 : Median(disks);
}

// The prediction of a check run again, with the compute profile scaled by the machine's
// speed during the run against during the profile (the anchor steps') and the device's
// curve by the device's (the disk anchors'). On a shared machine or disk whose speed drifts
// between the profile and the checks, this separates the cost model's own error from the
// drift.
double AnchoredTokensPerSecond(const TuneReport& report, int32_t batch, int32_t context, bool disk,
                               const DiskStepShape& shape, double anchor_seconds,
                               double disk_factor = 1) {
  if (!(anchor_seconds > 0) || !(report.compute.anchor_seconds > 0)) return 0;
  const ComputeProfile scaled =
      report.compute.Scaled(anchor_seconds / report.compute.anchor_seconds);
  return disk ? PredictDiskStep(report.device.Scaled(disk_factor), scaled, shape).tokens_per_second
              : PredictMemoryStep(scaled, batch, context).tokens_per_second;
}

// A check run's reads beside the quality windows' estimate of them (TunedCandidate).
void RecordReads(const TuneReport& report, const MeasuredReads& r, TunedCandidate* k) {
  k->measured_requests_per_step = r.requests;
  k->measured_refine_requests_per_step = r.refine_requests;
  k->measured_bytes_per_step = r.bytes;
  k->measured_select_seconds = r.select_seconds;
  k->measured_wait_seconds = r.wait_seconds;
  k->predicted_select_seconds = SelectionSeconds(report.compute, k->shape);
  k->measured_attended_groups_per_step = r.attended_groups;
  DiskStepShape at = k->shape;
  at.requests = r.requests;
  at.refine_requests = r.refine_requests;
  at.bytes = r.bytes;
  at.layer_read_shares = r.layer_shares;
  // The slot groups attended as the check counted them, beside the same sink, recent and
  // rolling groups.
  const double more_tokens = (r.attended_groups - k->attended_groups_per_step) /
                             double(std::max(1, at.n_layer)) * double(at.group_size);
  at.attended_tokens = std::max<int64_t>(0, at.attended_tokens + std::llround(more_tokens));
  k->predicted_at_measured_reads =
      PredictDiskStep(report.device, report.compute, at).tokens_per_second;
}

std::string Format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

// The settings each budget's disk plans start from (Search::Plans): every sigma (0: the
// runtime's choice), G, record type and read-through, the first all automatic.
std::vector<DiskKvOptions> BaseSettings(const TuneOptions& o, const std::string& adapters_path,
                                        const std::vector<int32_t>& ratios, int64_t budget) {
  std::vector<int32_t> sigmas = {0};
  sigmas.insert(sigmas.end(), ratios.begin(), ratios.end());
  std::vector<DiskKvOptions> out;
  for (int32_t ratio : sigmas)
    for (int32_t g : {0, 4, 8, 16})
      for (KvRecordType rt : {KvRecordType::kAuto, KvRecordType::kF16})
        for (int32_t t : {-1, 0}) {
          DiskKvOptions d;
          d.dir = o.kv_dir;
          d.adapters = adapters_path;
          d.emulate_emmc = o.emulate_emmc;
          d.ratio = ratio;
          d.group_size = g;
          d.record_type = rt;
          d.read_through = t;
          d.budget_bytes = budget;
          out.push_back(std::move(d));
        }
  return out;
}

// Whether any disk plan the search could try at `context` fits `budget` bytes a sequence.
bool AnyPlanFits(const Model& model, const TuneOptions& o, const Adapters& adapters,
                 const std::string& adapters_path, const std::vector<int32_t>& ratios,
                 uint32_t block, int32_t context, int64_t budget) {
  const HParams& hp = model.hparams();
  DiskKvPlan plan;
  for (const DiskKvOptions& d : BaseSettings(o, adapters_path, ratios, budget))
    if (PlanDiskKv({hp.n_layer, hp.n_head_kv, hp.head_dim, context}, d, block, &plan,
                   &adapters.profile, ratios, hp.n_head)
            .ok())
      return true;
  return false;
}

// Before anything is measured: every (batch, context) of the grid can be tuned in `memory`
// bytes of KV for a batch, with full KV or with a disk plan. `given` says where the memory
// came from ("--kv-memory 4.0 KiB").
Status CheckKvMemory(const Model& model, const TuneOptions& o, const Adapters& adapters,
                     const std::string& adapters_path, const std::vector<int32_t>& ratios,
                     uint32_t block, uint64_t memory, const std::string& given) {
  for (int32_t context : o.contexts)
    for (int32_t batch : o.batches) {
      const uint64_t full = FullKvBytes(model.hparams(), context);
      const uint64_t per_seq = memory / uint64_t(batch);
      if (per_seq >= full ||
          AnyPlanFits(model, o, adapters, adapters_path, ratios, block, context, int64_t(per_seq)))
        continue;
      // The least a sequence needs: a plan fits any budget above one that it fits, so the
      // boundary is found by halving (full KV fits at `full`).
      uint64_t lo = per_seq, hi = full;
      while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (AnyPlanFits(model, o, adapters, adapters_path, ratios, block, context, int64_t(mid)))
          hi = mid;
        else
          lo = mid;
      }
      return Status::ResourceExhausted(
          "tune: " + given + " of KV memory for a batch: at batch " + std::to_string(batch) +
          " and context " + std::to_string(context) + " a sequence gets " + ReadableBytes(per_seq) +
          ", where neither full KV (" + ReadableBytes(full) +
          ") nor any disk plan fits; the least the tuner can plan with is " + ReadableBytes(hi) +
          " a sequence, " + ReadableBytes(hi * uint64_t(batch)) + " for the batch");
    }
  return Status::OK();
}

// The search for one (batch, context).
struct Search {
  const Model& model;
  const TuneOptions& o;
  const TuneReport& report;
  QualityProfiler& quality;
  const Adapters& adapters;
  const std::string& adapters_path;
  const std::vector<int32_t>& ratios;
  uint32_t block;
  const std::function<void(const std::string&)>& say;
  std::function<void(int32_t quality_runs)> progress;  // optional

  // Plans c.options and, when it fits, resolves the plan's automatic choices into them (a
  // candidate is what it runs) and appends it to *out unless an equal one is there.
  void Add(int32_t batch, int32_t context, Candidate c, std::vector<Candidate>* out) const {
    const HParams& hp = model.hparams();
    if (!PlanDiskKv({hp.n_layer, hp.n_head_kv, hp.head_dim, context}, c.options, block, &c.plan,
                    &adapters.profile, ratios, hp.n_head)
             .ok())
      return;
    c.options.group_size = c.plan.layout.group_size;
    c.options.record_type =
        c.plan.layout.type == kernels::KvType::kQ8_0 ? KvRecordType::kQ8_0 : KvRecordType::kF16;
    c.options.read_through = c.plan.transient_groups;
    c.options.ratio = c.plan.ratio;
    c.options.group_summary = c.plan.group_summary ? AutoSwitch::kOn : AutoSwitch::kOff;
    c.options.calibrated_layers = c.plan.calibrated ? AutoSwitch::kOn : AutoSwitch::kOff;
    c.key = KeyOf(c.options);
    for (const Candidate& x : *out)
      if (x.key == c.key) return;
    // No reads, and only the selection attended among the slots.
    c.optimistic = PredictDiskStep(report.device, report.compute,
                                   ShapeOfPlan(c.plan, c.options, batch, context, hp.n_layer, 0, 0,
                                               double(c.plan.groups_per_step) * hp.n_layer));
    out->push_back(std::move(c));
  }

  // The disk plans of one budget: every sigma (0: the runtime's choice), G, record type,
  // read-through and M (the runtime's, or a share of the groups attended: kGroupShares);
  // settings the plan resolves the same way are one candidate. The first is the runtime's
  // own choice (every setting automatic), when its plan fits.
  std::vector<Candidate> Plans(int32_t batch, int32_t context, int64_t budget) const {
    std::vector<Candidate> out;
    for (const DiskKvOptions& base : BaseSettings(o, adapters_path, ratios, budget)) {
      Candidate c;
      c.options = base;
      c.automatic = base.ratio == 0 && base.group_size == 0 &&
                    base.record_type == KvRecordType::kAuto && base.read_through == -1;
      const size_t before = out.size();
      Add(batch, context, c, &out);
      if (out.size() == before) continue;
      // The same settings with fewer groups re-selected a step. Read-through serves
      // selections beyond the slots; with M below the slots it has nothing to do.
      const DiskKvPlan& plan = out.back().plan;
      const int32_t attended = plan.reuse_slots + plan.transient_groups;
      Candidate v = out.back();
      v.automatic = false;
      v.parent = int32_t(out.size()) - 1;
      v.options.read_through = 0;
      for (double share : kGroupShares) {
        v.options.groups_per_step = std::max(1, int32_t(std::lround(share * attended)));
        const size_t n = out.size();
        Add(batch, context, v, &out);
        if (out.size() > n) v.parent = int32_t(n);
      }
    }
    return out;
  }

  Status Entry(int32_t batch, int32_t context, uint64_t memory, TunedChoice* choice) {
    const HParams& hp = model.hparams();
    choice->batch = batch;
    choice->context = context;
    const uint64_t full = FullKvBytes(hp, context);
    const uint64_t per_seq = memory / uint64_t(batch);
    const bool memory_fits = full <= per_seq;
    const StepPrediction mem = PredictMemoryStep(report.compute, batch, context);
    // Budgets from all a sequence may have (when full KV does not fit) down to 1/34 of full
    // KV: a smaller budget attends fewer groups (faster) and keeps fewer (worse quality).
    std::vector<int64_t> budgets;
    if (per_seq < full) budgets.push_back(int64_t(per_seq));
    for (uint64_t div : {3u, 6u, 10u, 13u, 20u, 34u}) {
      const int64_t b = int64_t(std::min(per_seq, full / div));
      if (b > 0 && std::find(budgets.begin(), budgets.end(), b) == budgets.end())
        budgets.push_back(b);
    }
    std::sort(budgets.rbegin(), budgets.rend());
    std::vector<std::vector<Candidate>> plans;
    size_t n_plans = 0;
    for (int64_t b : budgets) {
      plans.push_back(Plans(batch, context, b));
      n_plans += plans.back().size();
    }
    if (n_plans == 0 && !memory_fits)
      return Status::ResourceExhausted(
          "tune: at batch " + std::to_string(batch) + " and context " + std::to_string(context) +
          " neither full KV (" + ReadableBytes(full) + " a sequence) nor any disk plan fits " +
          ReadableBytes(per_seq) + " of KV memory a sequence (" + ReadableBytes(memory) +
          " for the batch); give more with --memory or --kv-memory");
    say("  full KV " + std::to_string(full >> 10) + " KiB a sequence " +
        (memory_fits ? "fits" : "does not fit") + " in " + std::to_string(per_seq >> 10) +
        " KiB; " + std::to_string(n_plans) + " disk plans at " + std::to_string(budgets.size()) +
        " budgets do");

    if (memory_fits)
      say(Format("  full KV in memory: %.1f tok/s predicted", mem.tokens_per_second));
    SolverSpace space;
    space.memory_fits = memory_fits;
    space.memory_tokens_per_second = mem.tokens_per_second;
    space.max_evaluations = o.max_candidates;
    space.max_variant_evaluations = o.max_variants;
    for (const std::vector<Candidate>& budget_plans : plans) {
      space.budgets.emplace_back();
      for (const Candidate& c : budget_plans)
        space.budgets.back().push_back({c.optimistic.tokens_per_second, c.automatic, c.parent});
    }
    struct Measured {
      StepPrediction predicted;
      DiskStepShape shape;
      QualitySummary quality;
    };
    std::vector<std::vector<Measured>> measured(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) measured[i].resize(plans[i].size());
    double closest_loss = INFINITY;
    std::string closest;
    // Measures one disk plan's quality and reads, and predicts its speed with those reads.
    auto evaluate = [&](size_t bi, size_t pi, SolverOutcome* out) -> Status {
      const Candidate& c = plans[bi][pi];
      QualitySummary q;
      int32_t ran = 0;
      // Quality and reads do not depend on the device's speed: measured at full speed.
      DiskKvOptions fast = c.options;
      fast.emulate_emmc = false;
      STRATA_RETURN_IF_ERROR(quality.Measure(fast, c.key, context, &q, &ran));
      ++choice->quality_runs;
      if (progress) progress(choice->quality_runs);
      DiskStepShape shape =
          ShapeOfPlan(c.plan, c.options, batch, context, hp.n_layer, q.requests_per_step(),
                      q.bytes_per_step(), q.attended_groups_per_step());
      shape.refine_requests = q.refine_requests_per_step();
      shape.layer_read_shares = q.layer_read_shares();
      shape.queue_depth = ChooseQueueDepth(report.device, report.compute, shape);
      const StepPrediction p = PredictDiskStep(report.device, report.compute, shape);
      say(Format("  budget %.0f KiB, sigma %.0f, ", double(c.options.budget_bytes >> 10),
                 c.options.ratio) +
          Format("G %.0f, ", c.options.group_size) + KvRecordTypeName(c.options.record_type) +
          Format(", T %.0f, M %.0f: ppl %+.2f%% ", c.options.read_through, c.plan.groups_per_step,
                 q.ppl_loss() * 100) +
          Format("(up to %+.2f%%), ", q.ppl_loss_upper() * 100) +
          Format("agreement %.1f%%, %.1f tok/s predicted", q.agreement() * 100,
                 p.tokens_per_second) +
          (ran == 0 ? " (cached)" : ""));
      if (q.ppl_loss_upper() < closest_loss) {
        closest_loss = q.ppl_loss_upper();
        closest = c.key;
      }
      measured[bi][pi] = {p, shape, q};
      out->within_bound = q.ppl_loss_upper() <= o.max_ppl_loss;
      out->predicted_tokens_per_second = p.tokens_per_second;
      TunedCandidate tc;
      tc.key = c.key;
      tc.options = c.options;
      tc.options.queue_depth = int32_t(shape.queue_depth);
      tc.predicted_tokens_per_second = p.tokens_per_second;
      tc.ppl_loss = q.ppl_loss();
      tc.ppl_loss_upper = q.ppl_loss_upper();
      tc.agreement = q.agreement();
      tc.requests_per_step = q.requests_per_step();
      tc.refine_requests_per_step = shape.refine_requests;
      tc.bytes_per_step = q.bytes_per_step();
      tc.attended_groups_per_step = q.attended_groups_per_step();
      tc.within_bound = out->within_bound;
      tc.shape = shape;
      tc.predicted = p;
      tc.description = c.plan.Describe();
      choice->candidates.push_back(std::move(tc));
      return Status::OK();
    };
    SolverResult solved;
    STRATA_RETURN_IF_ERROR(SolveEntry(space, evaluate, &solved));
    if (!solved.found)
      return Status::OutOfRange(
          "tune: at batch " + std::to_string(batch) + ", context " + std::to_string(context) +
          " no disk plan within " + std::to_string(per_seq) +
          " bytes a sequence kept the upper estimate of its perplexity loss within " +
          Format("%.1f%%", o.max_ppl_loss * 100) +
          " of full KV (closest: " + (closest.empty() ? std::string("none measured") : closest) +
          Format(" at %+.2f%%); raise --memory or --max-ppl-loss", closest_loss * 100));
    choice->disk = !solved.memory;
    if (choice->disk) {
      const Candidate& best = plans[size_t(solved.budget)][size_t(solved.plan)];
      const Measured& m = measured[size_t(solved.budget)][size_t(solved.plan)];
      choice->predicted = m.predicted;
      choice->shape = m.shape;
      choice->disk_options = best.options;
      choice->disk_options.queue_depth = int32_t(m.shape.queue_depth);
      choice->description = best.plan.Describe();
      choice->key = best.key;
      choice->ppl_loss = m.quality.ppl_loss();
      choice->ppl_loss_upper = m.quality.ppl_loss_upper();
      choice->agreement = m.quality.agreement();
    } else {
      choice->predicted = mem;
      choice->description = "full KV in memory";
      choice->key = "memory";
    }
    return Status::OK();
  }
};

}  // namespace

std::string ReadableBytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

Status Tune(const Model& model, const TuneOptions& options,
            const std::function<void(const std::string&)>& progress, TuneReport* out) {
  TuneOptions o = options;  // threads: the search's choice where left at 0
  const std::function<void(const std::string&)> say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  if (o.batches.empty() || o.contexts.empty())
    return Status::InvalidArgument("tune: the batch and context lists must not be empty");
  for (int32_t b : o.batches)
    if (b < 1 || b > 4096)
      return Status::OutOfRange("tune: batch " + std::to_string(b) + " is out of range [1, 4096]");
  for (int32_t c : o.contexts)
    if (c < 2 * (o.scored + 2) || c > (1 << 24))
      return Status::OutOfRange("tune: context " + std::to_string(c) + " is out of range [" +
                                std::to_string(2 * (o.scored + 2)) + ", 2^24]");
  if (!(o.max_ppl_loss > 0)) return Status::OutOfRange("tune: --max-ppl-loss must be > 0");
  if (o.work_dir.empty()) return Status::InvalidArgument("tune: no work directory");

  if (!std::filesystem::is_directory(o.kv_dir))
    return Status::InvalidArgument("tune: the KV directory " + o.kv_dir + " is not a directory");
  if (o.process_memory_bytes > 0 && o.kv_memory_bytes > 0)
    return Status::InvalidArgument(
        "tune: --memory (the whole process) and --kv-memory (KV of a batch) are alternatives; "
        "give one");

  TuneReport report;
  const int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  // The process's memory must hold the weights at least: known now, before the measured
  // step below, which would touch them all.
  const auto margin_of = [](int64_t process_memory) {
    return uint64_t(process_memory) / 20 + (uint64_t(16) << 20);
  };
  if (o.process_memory_bytes > 0 &&
      uint64_t(o.process_memory_bytes) <= model.weight_bytes() + margin_of(o.process_memory_bytes))
    return Status::ResourceExhausted(
        "tune: --memory " + ReadableBytes(uint64_t(o.process_memory_bytes)) +
        " leaves no room for KV: the model's weights alone take " +
        ReadableBytes(model.weight_bytes()) + ", besides a margin of " +
        ReadableBytes(margin_of(o.process_memory_bytes)));

  // What every disk plan needs, read before anything is measured: the adapters, and the
  // block size of the KV directory's store.
  const std::string adapters_path =
      o.adapters.empty() ? Adapters::DefaultPath(model.path()) : o.adapters;
  Adapters adapters;
  STRATA_RETURN_IF_ERROR(Adapters::Read(adapters_path, &adapters)
                             .WithContext("tune needs the model's adapters (strata calibrate)"));
  STRATA_RETURN_IF_ERROR(adapters.CheckModel(model, adapters_path));
  uint32_t block = 0;
  {
    DiskKvOptions at;
    at.dir = o.kv_dir;
    STRATA_RETURN_IF_ERROR(DiskKvStore::ProbeBlockSize(at, &block));
  }
  std::vector<int32_t> ratios;
  for (const AdapterSet& a : adapters.sets) ratios.push_back(a.ratio);
  if (o.kv_memory_bytes > 0)
    STRATA_RETURN_IF_ERROR(
        CheckKvMemory(model, o, adapters, adapters_path, ratios, block, uint64_t(o.kv_memory_bytes),
                      "--kv-memory " + ReadableBytes(uint64_t(o.kv_memory_bytes))));

  // What the process holds without KV: measured first, before the tuner's own buffers, on a
  // pass as large as a prefill chunk and a decode step of the largest batch (what a run
  // touches of its scratch), with full KV of a short context.
  {
    std::unique_ptr<Engine> e;
    STRATA_RETURN_IF_ERROR(CreateRunEngine(model, o.threads, 1024, max_batch, nullptr, &e));
    std::vector<SeqId> seqs(static_cast<size_t>(max_batch));
    for (SeqId& s : seqs) STRATA_RETURN_IF_ERROR(e->NewSequence(&s));
    const std::vector<int32_t> prompt(512, 1);
    ForwardBatch fb;
    std::vector<float> logits;
    fb.Add(seqs[0], 0, std::span<const int32_t>(prompt));
    STRATA_RETURN_IF_ERROR(e->Evaluate(fb, &logits));
    fb.Clear();
    for (size_t i = 0; i < seqs.size(); ++i)
      fb.Add(seqs[i], i == 0 ? 512 : 0, std::span<const int32_t>(prompt.data(), 1));
    STRATA_RETURN_IF_ERROR(e->Evaluate(fb, &logits));
    report.process_base_bytes = CurrentRssBytes();
  }
  uint64_t memory = uint64_t(std::max<int64_t>(0, o.kv_memory_bytes));
  if (o.process_memory_bytes > 0) {
    const uint64_t base = uint64_t(report.process_base_bytes);
    const uint64_t margin = margin_of(o.process_memory_bytes);
    const std::string given = "--memory " + ReadableBytes(uint64_t(o.process_memory_bytes));
    if (uint64_t(o.process_memory_bytes) <= base + margin)
      return Status::ResourceExhausted(
          "tune: " + given + " leaves no room for KV: the process needs " + ReadableBytes(base) +
          " without it (model and scratch at batch " + std::to_string(max_batch) +
          ", measured) and a margin of " + ReadableBytes(margin));
    memory = uint64_t(o.process_memory_bytes) - base - margin;
    say("KV memory for a batch: " + ReadableBytes(memory) + " of " + given +
        " (the process needs " + ReadableBytes(base) + " without KV, the margin is " +
        ReadableBytes(margin) + ")");
    STRATA_RETURN_IF_ERROR(CheckKvMemory(model, o, adapters, adapters_path, ratios, block, memory,
                                         given + " leaves " + ReadableBytes(memory)));
  }

  QualityOptions qo;
  qo.text_path = o.text_path;
  qo.scored = o.scored;
  qo.windows = o.windows;
  qo.cache_dir = o.work_dir;
  qo.threads = o.threads;
  qo.log = say;
  qo.window_stride = *std::max_element(o.contexts.begin(), o.contexts.end());
  {
    // A quarter of what is free now keeps every capture of a usual grid loaded (they are a
    // few hundred MiB each for small models) and leaves the runs their memory.
    PlatformInfo now;
    if (DetectPlatform(&now).ok()) qo.capture_memory_bytes = now.memory_available / 4;
  }
  std::unique_ptr<QualityProfiler> quality;
  STRATA_RETURN_IF_ERROR(QualityProfiler::Open(model, qo, &quality));
  // Windows of every context start a longest context apart (qo.window_stride).
  if (quality->WindowsAvailable(qo.window_stride) < o.windows)
    return Status::InvalidArgument("tune: the evaluation half of " + o.text_path + " holds " +
                                   std::to_string(quality->WindowsAvailable(qo.window_stride)) +
                                   " windows of " + std::to_string(qo.window_stride) +
                                   " tokens (the longest context); --windows asks for " +
                                   std::to_string(o.windows));

  say("profiling the KV device under " + o.kv_dir);
  DeviceProfileOptions dpo;
  dpo.kv_dir = o.kv_dir;
  dpo.emulate_emmc = o.emulate_emmc;
  dpo.threads = o.threads;
  auto phase = [&](const std::string& name) -> std::function<void(int64_t, int64_t)> {
    if (!o.on_progress) return nullptr;
    return [&o, name](int64_t done, int64_t total) { o.on_progress(name, done, total); };
  };
  dpo.progress = phase("device profile");
  if (o.quick) {
    dpo.blocks = {4096, 65536};
    // A batch's layer issues more reads than 16 at once: without deeper points the curve is
    // taken flat beyond 16, and without one past kv.queue_depth's default (64) no deeper
    // queue can be chosen (ChooseQueueDepth).
    dpo.depths = {1, 16, 64, 256};
    dpo.seconds_per_point = 0.1;
    dpo.file_bytes = uint64_t(64) << 20;
    dpo.stream_bytes = uint64_t(64) << 20;
  }
  {
    // Random reads over a file far smaller than the stores they stand for can be answered
    // from a cache below the file system (a virtual machine's host, a drive's own RAM) and
    // measure faster than reads over the stores (measured: 1.6x on the virtio disk of a
    // 2-core Intel Xeon, Emerald Rapids, 64 MiB against 2 GiB). The probe spans the largest
    // batch's cache at the longest context, up to a quarter of the free space and
    // kMaxProbeBytes.
    const int32_t longest = *std::max_element(o.contexts.begin(), o.contexts.end());
    const uint64_t stores = FullKvBytes(model.hparams(), longest) * uint64_t(max_batch);
    std::error_code ec;
    const std::filesystem::space_info space = std::filesystem::space(o.kv_dir, ec);
    const uint64_t room = ec ? dpo.file_bytes : uint64_t(space.available / 4);
    dpo.file_bytes = std::max(dpo.file_bytes, std::min({stores, room, kMaxProbeBytes}));
  }
  // The probe file stays for the disk anchors of the check runs.
  std::unique_ptr<DiskProbe> probe;
  STRATA_RETURN_IF_ERROR(ProfileDevice(dpo, &report.device, &probe));
  for (const ReadCurvePoint& p : report.device.reads)
    say(Format("  read %.0f KiB at depth %.0f: %.0f IOPS", p.block / 1024.0, p.depth, p.iops) +
        Format(", %.0f us", p.mean_us));
  say(Format("  memory %.1f GB/s", report.device.memory_gb_per_s));

  if (o.threads == 0 && o.cuda_device < 0) {
    ThreadsChoice tc;
    STRATA_RETURN_IF_ERROR(ChooseThreads(model, std::max(1, report.device.platform.cores),
                                         max_batch, o.quick ? 5 : 8, &tc));
    for (size_t i = 0; i < tc.counts.size(); ++i)
      say(Format("  %.0f threads: %.2f ms a token (batch 1 and %.0f)", tc.counts[i],
                 tc.seconds_per_token[i] * 1e3, max_batch));
    o.threads = tc.threads;
    say(Format("  using %.0f threads", o.threads));
  }

  say("profiling compute");
  ComputeProfileOptions cpo;
  cpo.threads = o.threads;
  cpo.memory_bytes_per_second = report.device.memory_gb_per_s * 1e9;
  cpo.cuda_device = o.cuda_device;
  cpo.device = &report.device;
  cpo.progress = phase("compute profile");
  cpo.batches.clear();
  for (int32_t b : {1, 2, 4, 8, 16, 32, 64})
    if (b <= std::max(1, *std::max_element(o.batches.begin(), o.batches.end())))
      cpo.batches.push_back(b);
  if (cpo.batches.back() < *std::max_element(o.batches.begin(), o.batches.end()))
    cpo.batches.push_back(*std::max_element(o.batches.begin(), o.batches.end()));
  // Attention is measured at the profile's own context (a long one, so its cost stands out
  // of the step's noise), whatever contexts are tuned.
  if (o.quick) {
    cpo.steps = 5;
  }
  cpo.fit_short_context = *std::min_element(o.contexts.begin(), o.contexts.end());
  cpo.fit_long_context = *std::max_element(o.contexts.begin(), o.contexts.end());
  if (cpo.fit_long_context == cpo.fit_short_context)
    cpo.fit_short_context = std::max(256, cpo.fit_long_context / 4);
  // The fitting runs replay the text's windows as the check runs do, sequence i window
  // i mod --windows: sequences of one text select alike, and a batch of them was priced below
  // what one of different texts then took (docs/experiments/tuner.md). A window's capture at
  // the longest context serves the shorter ones too (windows start a longest context apart).
  {
    cpo.real.windows = o.windows;
    cpo.real.window = [&](int32_t w, std::shared_ptr<const KvCapture>* cap, size_t* begin) {
      *begin = quality->WindowBegin(cpo.fit_long_context, w);
      return quality->Capture(cpo.fit_long_context, w, cap);
    };
    cpo.real.tokens = &quality->tokens();
    DiskKvOptions overhead_run;
    overhead_run.dir = o.kv_dir;
    overhead_run.adapters = adapters_path;
    // On the device being tuned for: its completions cost the CPU something too (the store
    // reaps each), which runs on a faster device would not price.
    overhead_run.emulate_emmc = o.emulate_emmc;
    STRATA_RETURN_IF_ERROR(ProfileCompute(model, adapters, cpo, &overhead_run, &report.compute));
  }
  for (size_t i = 0; i < report.compute.batches.size(); ++i)
    say(Format("  decode step at batch %.0f: %.2f ms", report.compute.batches[i],
               report.compute.dense_seconds[i] * 1e3));
  say(Format("  attention %.3f us a token (%.3f for several sequences)",
             report.compute.attention_seconds_per_token * 1e6,
             report.compute.AttentionSecondsPerToken(max_batch) * 1e6));
  const ComputeProfile& cp = report.compute;
  if (!cp.ranks.empty()) {
    std::string q = "  low-rank query, one row:";
    for (size_t i = 0; i < cp.ranks.size(); ++i)
      q += (i ? "," : "") +
           Format(" rank %.0f %.1f us", double(cp.ranks[i]), cp.QuerySeconds(cp.ranks[i]) * 1e6);
    say(q);
  }
  for (bool many : {false, true}) {
    const ComputeProfile::SelectionPrices& sp = many ? cp.select_many : cp.select_one;
    say(std::string(many ? "  selection of several sequences: " : "  selection of one sequence: ") +
        Format("%.2f us a layer, %.1f ns a candidate, ", sp.per_selection * 1e6,
               sp.per_candidate * 1e9) +
        Format("%.1f ns a group, %.2f us a read, ", sp.per_group * 1e9, sp.per_request * 1e6) +
        Format("%.1f ns a rank", sp.per_rank * 1e9) +
        (many ? Format(", %.2fx one sequence's on one core", sp.score_scale) : std::string()));
  }
  say(Format("  disk policy besides (fitted on %.0f runs): ", cp.disk_fit_runs) +
      Format("%.2f ms a step, ", cp.disk_overhead_seconds * 1e3) +
      Format("%.1f ns a group, %.2f us a read (%.2f for several sequences)",
             cp.disk_seconds_per_group * 1e9, cp.disk_seconds_per_request * 1e6,
             cp.disk_seconds_per_request_many * 1e6));
  {
    std::string q8 = "  Q8_0 records against F16, a token:";
    for (size_t i = 0; i < cp.q8_group_sizes.size() && i < cp.q8_seconds_per_token.size(); ++i)
      q8 += Format(" G %.0f %+.1f ns", cp.q8_group_sizes[i], cp.q8_seconds_per_token[i] * 1e9) +
            (i < cp.q8_seconds_per_token_many.size()
                 ? Format(" (%+.1f for several sequences)", cp.q8_seconds_per_token_many[i] * 1e9)
                 : std::string()) +
            (i + 1 < cp.q8_group_sizes.size() ? "," : "");
    if (!cp.q8_group_sizes.empty()) say(q8);
  }

  if (memory == 0) {
    const uint64_t avail = report.device.platform.memory_available;
    const uint64_t taken = model.weight_bytes() + kMemoryMargin;
    memory = avail > taken ? avail - taken : 0;
  }
  Search search{model, o, report, *quality, adapters, adapters_path, ratios, block, say};
  for (int32_t context : o.contexts) {
    for (int32_t batch : o.batches) {
      say("batch " + std::to_string(batch) + ", context " + std::to_string(context) + ":");
      TunedChoice choice;
      // Check runs: the choice, its runners-up, the defaults beside it, the --validate plans.
      const int64_t checks = 2 + std::max(0, o.runners_up) + std::max(0, o.validate);
      const int64_t units = std::max(1, o.max_candidates) + std::max(0, o.max_variants) + checks;
      const std::function<void(int64_t, int64_t)> advance =
          phase("batch " + std::to_string(batch) + ", context " + std::to_string(context));
      search.progress = [&](int32_t runs) {
        if (advance) advance(runs, units);
      };
      STRATA_RETURN_IF_ERROR(search.Entry(batch, context, memory, &choice));
      if (advance) advance(units - checks, units);
      // Check runs, measured in turn (MeasureSpeeds): the choice; the runtime's defaults at
      // the same memory (full KV where it fits what a sequence has, else the disk policy
      // with that budget and every setting left to its own rules); the runners-up by
      // prediction within the bound; the --validate plans.
      const bool full_fits = FullKvBytes(model.hparams(), context) <= memory / uint64_t(batch);
      // Full KV chosen where it fits: the defaults are the chosen plan itself, and a second
      // run of it would only measure the machine's drift between two runs.
      const bool defaults_run = choice.disk || !full_fits;
      DiskKvOptions defaults;
      defaults.dir = o.kv_dir;
      defaults.adapters = adapters_path;
      defaults.emulate_emmc = o.emulate_emmc;
      defaults.budget_bytes = int64_t(memory / uint64_t(batch));
      std::vector<TunedCandidate*> next, validate;
      for (TunedCandidate& k : choice.candidates)
        if (k.within_bound && k.key != choice.key) next.push_back(&k);
      std::stable_sort(next.begin(), next.end(),
                       [](const TunedCandidate* a, const TunedCandidate* b) {
                         return a->predicted_tokens_per_second > b->predicted_tokens_per_second;
                       });
      next.resize(std::min(next.size(), size_t(std::max(0, o.runners_up))));
      for (TunedCandidate& k : choice.candidates)
        if (int32_t(validate.size()) < o.validate && k.key != choice.key &&
            std::find(next.begin(), next.end(), &k) == next.end())
          validate.push_back(&k);
      std::vector<CheckRun> runs;
      runs.push_back({batch, context, choice.disk ? &choice.disk_options : nullptr});
      if (defaults_run) runs.push_back({batch, context, full_fits ? nullptr : &defaults});
      for (const std::vector<TunedCandidate*>* list : {&next, &validate})
        for (TunedCandidate* k : *list) runs.push_back({batch, context, &k->options});
      STRATA_RETURN_IF_ERROR(MeasureSpeeds(
          model, o, *quality, probe.get(), report.device, runs, [&](int64_t steps, int64_t all) {
            if (advance) advance(units - checks + checks * steps / all, units);
          }));
      // A disk plan's run beside its prediction.
      auto record = [&](const CheckRun& r, TunedCandidate* k) {
        k->measured_tokens_per_second = r.tokens_per_second;
        k->anchor_seconds = r.anchor_seconds;
        k->anchor_disk_factor = r.disk_factor;
        RecordReads(report, r.reads, k);
        k->anchored_tokens_per_second = AnchoredTokensPerSecond(
            report, batch, context, true, k->shape, k->anchor_seconds, k->anchor_disk_factor);
      };
      size_t at = 0;
      {
        const CheckRun& r = runs[at++];
        choice.measured_tokens_per_second = r.tokens_per_second;
        choice.anchor_seconds = r.anchor_seconds;
        choice.anchor_disk_factor = r.disk_factor;
        for (TunedCandidate& k : choice.candidates)
          if (choice.disk && k.key == choice.key) record(r, &k);
        choice.anchored_tokens_per_second =
            AnchoredTokensPerSecond(report, batch, context, choice.disk, choice.shape,
                                    choice.anchor_seconds, choice.anchor_disk_factor);
        say(std::string("  chose the ") + (choice.disk ? "disk" : "memory") + " policy" +
            (choice.disk ? Format(" (queue depth %.0f)", choice.disk_options.queue_depth) : "") +
            ": " +
            Format("%.1f tok/s predicted, %.1f measured", choice.predicted.tokens_per_second,
                   choice.measured_tokens_per_second) +
            Format(" (anchor step %.2f ms, disk %.2fx slower, %.1f predicted at those speeds)",
                   choice.anchor_seconds * 1e3, choice.anchor_disk_factor,
                   choice.anchored_tokens_per_second));
      }
      double defaults_anchor = choice.anchor_seconds;
      if (defaults_run) {
        const CheckRun& r = runs[at++];
        choice.default_tokens_per_second = r.tokens_per_second;
        defaults_anchor = r.anchor_seconds;
        say(Format("  the runtime's defaults at the same memory: %.1f tok/s measured",
                   choice.default_tokens_per_second));
      } else {
        choice.default_tokens_per_second = choice.measured_tokens_per_second;
        say("  the runtime's defaults at the same memory: the same plan (full KV in memory)");
      }
      // The runners-up and full KV where it fits (exact: the defaults' run above): the
      // measured fastest is the choice.
      TunedCandidate* faster = nullptr;
      for (TunedCandidate* k : next) {
        record(runs[at++], k);
        say(Format("  runner-up: %.1f tok/s predicted, %.1f measured (",
                   k->predicted_tokens_per_second, k->measured_tokens_per_second) +
            k->key + ")");
        const double best =
            faster ? faster->measured_tokens_per_second : choice.measured_tokens_per_second;
        if (k->measured_tokens_per_second > best) faster = k;
      }
      const double best_disk =
          faster ? faster->measured_tokens_per_second : choice.measured_tokens_per_second;
      const bool to_full = choice.disk && full_fits && o.runners_up > 0 &&
                           choice.default_tokens_per_second > best_disk;
      if (faster || to_full) choice.predicted_best = choice.key;
      if (to_full) {
        choice.disk = false;
        choice.disk_options = DiskKvOptions();
        choice.description = "full KV in memory";
        choice.key = "memory";
        choice.shape = DiskStepShape();
        choice.predicted = PredictMemoryStep(report.compute, batch, context);
        choice.measured_tokens_per_second = choice.default_tokens_per_second;
        choice.anchor_seconds = defaults_anchor;
        choice.anchor_disk_factor = 1;
        choice.anchored_tokens_per_second =
            AnchoredTokensPerSecond(report, batch, context, false, choice.shape, defaults_anchor);
        choice.ppl_loss = choice.ppl_loss_upper = 0;
        choice.agreement = 1;
        say("  chose full KV in memory, which measured fastest");
      } else if (faster) {
        choice.disk = true;
        choice.disk_options = faster->options;
        choice.description = faster->description;
        choice.key = faster->key;
        choice.shape = faster->shape;
        choice.predicted = PredictDiskStep(report.device, report.compute, faster->shape);
        choice.measured_tokens_per_second = faster->measured_tokens_per_second;
        choice.anchor_seconds = faster->anchor_seconds;
        choice.anchor_disk_factor = faster->anchor_disk_factor;
        choice.anchored_tokens_per_second = faster->anchored_tokens_per_second;
        choice.ppl_loss = faster->ppl_loss;
        choice.ppl_loss_upper = faster->ppl_loss_upper;
        choice.agreement = faster->agreement;
        say("  chose the runner-up that measured fastest: " + faster->key);
      }
      say(Format("  tuned %.2fx the runtime's defaults",
                 choice.default_tokens_per_second > 0
                     ? choice.measured_tokens_per_second / choice.default_tokens_per_second
                     : 0));
      for (TunedCandidate* k : validate) {
        record(runs[at++], k);
        say(Format("  check: %.1f tok/s predicted, %.1f measured, ", k->predicted_tokens_per_second,
                   k->measured_tokens_per_second) +
            Format("%.1f at the anchors' speeds (disk %.2fx slower), %.1f at its reads (",
                   k->anchored_tokens_per_second, k->anchor_disk_factor,
                   k->predicted_at_measured_reads) +
            k->key + ")");
      }
      MedianSpeeds(runs, &choice.checks_anchor_seconds, &choice.checks_disk_factor);
      auto at_checks = [&](bool disk, const DiskStepShape& shape) {
        return AnchoredTokensPerSecond(report, batch, context, disk, shape,
                                       choice.checks_anchor_seconds, choice.checks_disk_factor);
      };
      choice.checks_anchored_tokens_per_second = at_checks(choice.disk, choice.shape);
      for (TunedCandidate& k : choice.candidates)
        if (k.measured_tokens_per_second > 0)
          k.checks_anchored_tokens_per_second = at_checks(true, k.shape);
      say(
          Format("  the checks ran with the anchor step at %.2f ms (the profile's %.2f) and the "
                 "disk %.2fx slower than profiled",
                 choice.checks_anchor_seconds * 1e3, report.compute.anchor_seconds * 1e3,
                 choice.checks_disk_factor));
      report.choices.push_back(std::move(choice));
    }
  }
  // Every run measured again, after all of them, in rounds: two measurements of one plan on
  // this machine lie apart by what it drifts in minutes, and no prediction can come closer
  // to both than half of that. The report sets the cost model's error beside that bound, and
  // beside the median of each run's measurements, which a spell that slowed one round does
  // not move.
  int64_t runs = 0;
  for (const TunedChoice& c : report.choices) {
    runs += c.measured_tokens_per_second > 0 ? 1 : 0;
    for (const TunedCandidate& k : c.candidates)
      runs += k.key != c.key && k.measured_tokens_per_second > 0 ? 1 : 0;
  }
  for (int32_t round = 0; round < o.repeat_checks; ++round) {
    int64_t done = 0;
    say(Format("measuring the %.0f runs again (round %.0f of %.0f)", double(runs),
               double(round + 1), double(o.repeat_checks)));
    const std::function<void(int64_t, int64_t)> advance = phase("runs measured again");
    // An entry's runs again in turn, as the first time.
    for (TunedChoice& c : report.choices) {
      std::vector<CheckRun> again;
      // Measured, anchored, anchored at all the runs' speeds (the first round's), and every
      // round's measurement.
      std::vector<std::array<double*, 3>> into;
      std::vector<std::vector<double>*> rounds;
      std::vector<const DiskStepShape*> shapes;
      if (c.measured_tokens_per_second > 0) {
        again.push_back({c.batch, c.context, c.disk ? &c.disk_options : nullptr});
        into.push_back({&c.remeasured_tokens_per_second, &c.remeasured_anchored_tokens_per_second,
                        &c.remeasured_checks_anchored_tokens_per_second});
        rounds.push_back(&c.measured_again_tokens_per_second);
        shapes.push_back(&c.shape);
      }
      for (TunedCandidate& k : c.candidates)
        if (k.key != c.key && k.measured_tokens_per_second > 0) {
          again.push_back({c.batch, c.context, &k.options});
          into.push_back({&k.remeasured_tokens_per_second, &k.remeasured_anchored_tokens_per_second,
                          &k.remeasured_checks_anchored_tokens_per_second});
          rounds.push_back(&k.measured_again_tokens_per_second);
          shapes.push_back(&k.shape);
        }
      const int64_t before = done;
      STRATA_RETURN_IF_ERROR(MeasureSpeeds(
          model, o, *quality, probe.get(), report.device, again, [&](int64_t steps, int64_t all) {
            if (advance) advance(before * all + steps * int64_t(again.size()), runs * all);
          }));
      done += int64_t(again.size());
      double anchor = 0, disk_factor = 1;
      MedianSpeeds(again, &anchor, &disk_factor);
      for (size_t i = 0; i < again.size(); ++i) {
        rounds[i]->push_back(again[i].tokens_per_second);
        if (round > 0) continue;
        const bool disk = again[i].disk != nullptr;
        *into[i][0] = again[i].tokens_per_second;
        *into[i][1] = AnchoredTokensPerSecond(report, c.batch, c.context, disk, *shapes[i],
                                              again[i].anchor_seconds, again[i].disk_factor);
        *into[i][2] = AnchoredTokensPerSecond(report, c.batch, c.context, disk, *shapes[i], anchor,
                                              disk_factor);
      }
    }
  }
  *out = std::move(report);
  return Status::OK();
}

Config TunedConfig(const Model& model, const TuneOptions& o, const TuneReport& r) {
  Config c;
  c.model = o.model_path;
  c.engine.n_threads = r.compute.threads > 0 ? r.compute.threads : o.threads;  // as measured
  c.engine.cuda_device = o.cuda_device;  // speeds were measured there
  c.engine.n_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  c.engine.max_sequences = *std::max_element(o.batches.begin(), o.batches.end());
  c.engine.kv.disk.dir = o.kv_dir;
  c.engine.kv.disk.emulate_emmc = o.emulate_emmc;
  if (!o.adapters.empty()) c.engine.kv.disk.adapters = o.adapters;
  for (const TunedChoice& t : r.choices) {
    TunedEntry e;
    e.batch = t.batch;
    e.context = t.context;
    e.settings.emplace_back("kv.policy", t.disk ? "disk" : "memory");
    if (t.disk) {
      const DiskKvOptions& d = t.disk_options;
      e.settings.emplace_back("kv.ratio", std::to_string(d.ratio));
      e.settings.emplace_back("kv.group_size", std::to_string(d.group_size));
      e.settings.emplace_back("kv.record_type", KvRecordTypeName(d.record_type));
      e.settings.emplace_back("kv.read_through", std::to_string(d.read_through));
      e.settings.emplace_back("kv.groups_per_step", std::to_string(d.groups_per_step));
      e.settings.emplace_back("kv.budget_bytes", std::to_string(d.budget_bytes));
      e.settings.emplace_back("kv.queue_depth", std::to_string(d.queue_depth));
      e.settings.emplace_back("kv.group_summary", AutoSwitchName(d.group_summary));
      e.settings.emplace_back("kv.calibrated_layers", AutoSwitchName(d.calibrated_layers));
    }
    e.predicted_tokens_per_second = t.predicted.tokens_per_second;
    e.measured_tokens_per_second = t.measured_tokens_per_second;
    e.ppl_loss = t.ppl_loss;
    e.agreement = t.agreement;
    c.tuned.push_back(std::move(e));
  }
  // The base settings are the batch-1 entry at the largest context, or the first one.
  const TunedEntry* base = NearestTuned(c, 1, c.engine.n_ctx);
  if (base) (void)SelectTuned(1, c.engine.n_ctx, &c);
  c.tuned_choice.clear();
  TuneProvenance& p = c.provenance;
  p.model_identity = model.identity_hex();
  p.model_path = o.model_path;
  p.machine = r.device.Fingerprint();
  p.strata_version = std::to_string(STRATA_VERSION_MAJOR) + "." +
                     std::to_string(STRATA_VERSION_MINOR) + "." +
                     std::to_string(STRATA_VERSION_PATCH);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  p.date = date;
  p.command = o.command;
  for (const ReadCurvePoint& x : r.device.reads)
    p.read_curve += (p.read_curve.empty() ? "" : "; ") + std::to_string(x.block / 1024) + " KiB x" +
                    std::to_string(x.depth) + ": " + std::to_string(int64_t(std::lround(x.iops))) +
                    " IOPS";
  return c;
}

}  // namespace strata
