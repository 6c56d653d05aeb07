#include "tuner/tune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <memory>

#include "platforms/platform.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/adapters.h"
#include "runtime/kv/disk_kv_plan.h"
#include "runtime/kv/disk_kv_store.h"
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
  // Per step, the whole batch: choosing what to load (KvCounters::predict_seconds) and
  // waiting on reads that compute did not hide.
  double select_seconds = 0, wait_seconds = 0;
};

// Decode speed of a configuration: `batch` sequences hold a replayed prefix of the
// evaluation text (sequence i the start of quality window i mod o.windows, whose capture it
// shares: a batch's reads are then those of the windows' text, which the quality runs
// average, rather than one window's, which can read several percent more or less), then
// decode kSettleSteps teacher-forced tokens together, not timed (the first warms the caches
// and loads the slots, the rest let the plan's reads settle), and `steps` more; the speed
// of the median of those.
Status MeasureSpeed(const Model& model, const TuneOptions& o, const QualityProfiler& quality,
                    int32_t batch, int32_t context, const DiskKvOptions* disk,
                    double* tokens_per_second, double* anchor_seconds = nullptr,
                    MeasuredReads* reads = nullptr, DiskAnchor* disk_anchor = nullptr) {
  const std::vector<int32_t>& tokens = quality.tokens();
  const int32_t steps = std::max(1, o.verify_steps);
  const int32_t prefix = context - kSettleSteps - steps - 1;
  if (prefix < 1)
    return Status::InvalidArgument(
        "tune: a context of " + std::to_string(context) + " tokens leaves no prefix before " +
        std::to_string(kSettleSteps) + " settling and " + std::to_string(steps) + " timed steps");
  // An anchor step after each of the run's: how fast the machine is while the run runs.
  AnchorTimer anchor;
  if (anchor_seconds) STRATA_RETURN_IF_ERROR(anchor.Init(model, o.threads, o.cuda_device, steps));
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(
      CreateRunEngine(model, o.threads, context, batch, disk, &e, o.cuda_device));
  std::vector<SeqId> seqs(static_cast<size_t>(batch));
  std::vector<size_t> begins(seqs.size());
  const int32_t windows = std::max(1, std::min(batch, o.windows));
  for (int32_t w = 0; w < windows; ++w) {
    // One capture loaded at a time: the sequences of a window replay it, then it goes.
    std::shared_ptr<const KvCapture> cap;
    STRATA_RETURN_IF_ERROR(quality.Capture(context, w, &cap));
    for (int32_t i = w; i < batch; i += windows) {
      begins[size_t(i)] = quality.WindowBegin(context, w);
      STRATA_RETURN_IF_ERROR(e->NewSequence(&seqs[size_t(i)]));
      STRATA_RETURN_IF_ERROR(ReplayPrefix(e->kv(), seqs[size_t(i)], *cap, prefix));
    }
  }
  std::vector<float> logits;
  ForwardBatch fb;
  std::vector<double> times;
  KvCounters c0;
  // A plan whose budget stages fewer tokens a pass than the batch steps it in as many passes.
  const size_t most =
      size_t(std::max(1, std::min(e->forward().max_tokens(), e->kv().max_pass_tokens())));
  for (int32_t i = 0; i < kSettleSteps + steps; ++i) {
    const bool timed = i >= kSettleSteps;
    if (i == kSettleSteps) c0 = e->kv().counters();
    const auto t0 = Clock::now();
    for (size_t j0 = 0; j0 < seqs.size(); j0 += most) {
      fb.Clear();
      for (size_t j = j0; j < std::min(seqs.size(), j0 + most); ++j)
        fb.Add(seqs[j], prefix + i,
               std::span<const int32_t>(&tokens[begins[j] + size_t(prefix + i)], 1));
      STRATA_RETURN_IF_ERROR(e->Evaluate(fb, &logits));
    }
    if (timed) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    // The anchor step warms up beside the first step and is timed beside the timed ones.
    if (anchor_seconds && (timed || i == 0)) STRATA_RETURN_IF_ERROR(anchor.Step());
    if (disk_anchor && disk && timed) STRATA_RETURN_IF_ERROR(disk_anchor->Step());
  }
  // The median step, as the profile times its steps: one stall of a shared machine would
  // otherwise move a short run's mean by more than the cost model's error.
  std::sort(times.begin(), times.end());
  const double step = times[times.size() / 2];
  *tokens_per_second = step > 0 ? double(batch) / step : 0;
  if (reads) {
    const KvCounters c1 = e->kv().counters();
    const double n = double(batch) * double(steps);
    reads->requests = double(c1.reads_issued - c0.reads_issued) / n;
    reads->refine_requests = double(c1.refine_reads_issued - c0.refine_reads_issued) / n;
    reads->bytes = double(c1.bytes_read - c0.bytes_read) / n;
    reads->select_seconds = (c1.predict_seconds - c0.predict_seconds) / double(steps);
    reads->wait_seconds = (c1.io_wait_seconds - c0.io_wait_seconds) / double(steps);
  }
  if (anchor_seconds) *anchor_seconds = anchor.Seconds();
  return Status::OK();
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
  DiskStepShape at = k->shape;
  at.requests = r.requests;
  at.refine_requests = r.refine_requests;
  at.bytes = r.bytes;
  k->predicted_at_measured_reads =
      PredictDiskStep(report.device, report.compute, at).tokens_per_second;
}

std::string Format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
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
    std::vector<int32_t> sigmas = {0};
    sigmas.insert(sigmas.end(), ratios.begin(), ratios.end());
    std::vector<Candidate> out;
    for (int32_t ratio : sigmas)
      for (int32_t g : {0, 4, 8, 16})
        for (KvRecordType rt : {KvRecordType::kAuto, KvRecordType::kF16})
          for (int32_t t : {-1, 0}) {
            Candidate c;
            c.options.dir = o.kv_dir;
            c.options.adapters = adapters_path;
            c.options.emulate_emmc = o.emulate_emmc;
            c.options.ratio = ratio;
            c.options.group_size = g;
            c.options.record_type = rt;
            c.options.read_through = t;
            c.options.budget_bytes = budget;
            c.automatic = ratio == 0 && g == 0 && rt == KvRecordType::kAuto && t == -1;
            const size_t before = out.size();
            Add(batch, context, c, &out);
            if (out.size() == before) continue;
            // The same settings with fewer groups re-selected a step. Read-through serves
            // selections beyond the slots; with M below the slots it has nothing to do.
            const DiskKvPlan& base = out.back().plan;
            const int32_t attended = base.reuse_slots + base.transient_groups;
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
          " neither full KV (" + std::to_string(full) +
          " bytes a sequence) nor any disk plan "
          "fits " +
          std::to_string(per_seq) + " bytes of KV memory a sequence (--memory " +
          std::to_string(memory) + " for the batch)");
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

  TuneReport report;
  const int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
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
    const uint64_t margin = uint64_t(o.process_memory_bytes) / 20 + (uint64_t(16) << 20);
    if (uint64_t(o.process_memory_bytes) <= base + margin)
      return Status::ResourceExhausted(
          "tune: --memory " + std::to_string(o.process_memory_bytes >> 20) +
          " MiB leaves no room for KV: the process needs " + std::to_string(base >> 20) +
          " MiB without it (model and scratch at batch " + std::to_string(max_batch) +
          ", measured) and a margin of " + std::to_string(margin >> 20) + " MiB");
    memory = uint64_t(o.process_memory_bytes) - base - margin;
    say(Format("KV memory for a batch: %.1f MiB of --memory %.1f MiB (the process needs ",
               double(memory) / 1048576.0, double(o.process_memory_bytes) / 1048576.0) +
        Format("%.1f MiB without KV, the margin is %.1f MiB)", double(base) / 1048576.0,
               double(margin) / 1048576.0));
  }

  QualityOptions qo;
  qo.text_path = o.text_path;
  qo.scored = o.scored;
  qo.windows = o.windows;
  qo.cache_dir = o.work_dir;
  qo.threads = o.threads;
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

  const std::string adapters_path =
      o.adapters.empty() ? Adapters::DefaultPath(model.path()) : o.adapters;
  Adapters adapters;
  STRATA_RETURN_IF_ERROR(Adapters::Read(adapters_path, &adapters)
                             .WithContext("tune needs the model's adapters (strata calibrate)"));
  STRATA_RETURN_IF_ERROR(adapters.CheckModel(model, adapters_path));

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
    // measure faster than reads over the stores (measured: 1.6x on a VM's virtual disk,
    // 64 MiB against 2 GiB). The probe spans the largest batch's cache at the longest
    // context, up to a quarter of the free space and kMaxProbeBytes.
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
  // The fitting runs replay the text's capture, as the check runs do (window 0, shared by
  // every context: windows start a longest context apart).
  {
    std::shared_ptr<const KvCapture> fit_capture;
    STRATA_RETURN_IF_ERROR(quality->Capture(cpo.fit_long_context, 0, &fit_capture));
    cpo.real.capture = fit_capture.get();
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
        Format("%.1f ns a group, %.2f us a read", sp.per_group * 1e9, sp.per_request * 1e6) +
        (many ? Format(", scoring at %.2fx one core's", sp.score_scale) : std::string()));
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
  uint32_t block = 0;
  {
    DiskKvOptions at;
    at.dir = o.kv_dir;
    STRATA_RETURN_IF_ERROR(DiskKvStore::ProbeBlockSize(at, &block));
  }
  std::vector<int32_t> ratios;
  for (const AdapterSet& a : adapters.sets) ratios.push_back(a.ratio);

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
      int64_t done = units - checks;
      auto tick = [&] {
        if (advance) advance(++done, units);
      };
      if (advance) advance(done, units);
      MeasuredReads choice_reads;
      DiskAnchor choice_disk(probe.get(), report.device);
      STRATA_RETURN_IF_ERROR(MeasureSpeed(
          model, o, *quality, batch, context, choice.disk ? &choice.disk_options : nullptr,
          &choice.measured_tokens_per_second, &choice.anchor_seconds, &choice_reads, &choice_disk));
      choice.anchor_disk_factor = choice_disk.Factor();
      for (TunedCandidate& k : choice.candidates)
        if (choice.disk && k.key == choice.key) RecordReads(report, choice_reads, &k);
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
      tick();
      // The runtime's defaults at the same memory, measured beside the choice: full KV where
      // it fits what a sequence has, else the disk policy with that budget and every
      // setting left to its own rules.
      const bool full_fits = FullKvBytes(model.hparams(), context) <= memory / uint64_t(batch);
      double defaults_anchor = 0, defaults_disk_factor = 1;
      if (!choice.disk && full_fits) {
        // The defaults are the chosen plan itself: a second run of it would only measure the
        // machine's drift between two runs.
        choice.default_tokens_per_second = choice.measured_tokens_per_second;
        defaults_anchor = choice.anchor_seconds;
        defaults_disk_factor = choice.anchor_disk_factor;
        say("  the runtime's defaults at the same memory: the same plan (full KV in memory)");
      } else {
        DiskKvOptions d;
        d.dir = o.kv_dir;
        d.adapters = adapters_path;
        d.emulate_emmc = o.emulate_emmc;
        d.budget_bytes = int64_t(memory / uint64_t(batch));
        DiskAnchor defaults_disk(probe.get(), report.device);
        STRATA_RETURN_IF_ERROR(MeasureSpeed(
            model, o, *quality, batch, context, full_fits ? nullptr : &d,
            &choice.default_tokens_per_second, &defaults_anchor, nullptr, &defaults_disk));
        defaults_disk_factor = defaults_disk.Factor();
        say(Format("  the runtime's defaults at the same memory: %.1f tok/s measured",
                   choice.default_tokens_per_second));
      }
      tick();
      // The runners-up by prediction, within the bound, and full KV where it fits (exact: the
      // defaults' run above); the measured fastest is the choice.
      {
        std::vector<TunedCandidate*> next;
        for (TunedCandidate& k : choice.candidates)
          if (k.within_bound && k.key != choice.key) next.push_back(&k);
        std::stable_sort(next.begin(), next.end(),
                         [](const TunedCandidate* a, const TunedCandidate* b) {
                           return a->predicted_tokens_per_second > b->predicted_tokens_per_second;
                         });
        next.resize(std::min(next.size(), size_t(std::max(0, o.runners_up))));
        TunedCandidate* faster = nullptr;
        for (TunedCandidate* k : next) {
          MeasuredReads reads;
          DiskAnchor disk_anchor(probe.get(), report.device);
          STRATA_RETURN_IF_ERROR(MeasureSpeed(model, o, *quality, batch, context, &k->options,
                                              &k->measured_tokens_per_second, &k->anchor_seconds,
                                              &reads, &disk_anchor));
          k->anchor_disk_factor = disk_anchor.Factor();
          RecordReads(report, reads, k);
          k->anchored_tokens_per_second = AnchoredTokensPerSecond(
              report, batch, context, true, k->shape, k->anchor_seconds, k->anchor_disk_factor);
          say(Format("  runner-up: %.1f tok/s predicted, %.1f measured (",
                     k->predicted_tokens_per_second, k->measured_tokens_per_second) +
              k->key + ")");
          tick();
          const double best =
              faster ? faster->measured_tokens_per_second : choice.measured_tokens_per_second;
          if (k->measured_tokens_per_second > best) faster = k;
        }
        const double best_disk =
            faster ? faster->measured_tokens_per_second : choice.measured_tokens_per_second;
        const bool to_full = choice.disk && full_fits && o.runners_up > 0 &&
                             choice.default_tokens_per_second > best_disk;
        if (faster || to_full) {
          // The plan predicted fastest keeps its measurement among the candidates.
          for (TunedCandidate& k : choice.candidates)
            if (k.key == choice.key) {
              k.measured_tokens_per_second = choice.measured_tokens_per_second;
              k.anchor_seconds = choice.anchor_seconds;
              k.anchor_disk_factor = choice.anchor_disk_factor;
              k.anchored_tokens_per_second = choice.anchored_tokens_per_second;
            }
          choice.predicted_best = choice.key;
        }
        if (to_full) {
          choice.disk = false;
          choice.disk_options = DiskKvOptions();
          choice.description = "full KV in memory";
          choice.key = "memory";
          choice.shape = DiskStepShape();
          choice.predicted = PredictMemoryStep(report.compute, batch, context);
          choice.measured_tokens_per_second = choice.default_tokens_per_second;
          choice.anchor_seconds = defaults_anchor;
          choice.anchor_disk_factor = defaults_disk_factor;
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
      }
      int32_t checked = 0;
      for (TunedCandidate& k : choice.candidates) {
        if (checked >= o.validate) break;
        if (k.key == choice.key || k.measured_tokens_per_second > 0) continue;
        MeasuredReads reads;
        DiskAnchor disk_anchor(probe.get(), report.device);
        STRATA_RETURN_IF_ERROR(MeasureSpeed(model, o, *quality, batch, context, &k.options,
                                            &k.measured_tokens_per_second, &k.anchor_seconds,
                                            &reads, &disk_anchor));
        k.anchor_disk_factor = disk_anchor.Factor();
        RecordReads(report, reads, &k);
        k.anchored_tokens_per_second = AnchoredTokensPerSecond(
            report, batch, context, true, k.shape, k.anchor_seconds, k.anchor_disk_factor);
        ++checked;
        tick();
        say(Format("  check: %.1f tok/s predicted, %.1f measured, ", k.predicted_tokens_per_second,
                   k.measured_tokens_per_second) +
            Format("%.1f at the anchors' speeds (disk %.2fx slower), %.1f at its reads (",
                   k.anchored_tokens_per_second, k.anchor_disk_factor,
                   k.predicted_at_measured_reads) +
            k.key + ")");
      }
      report.choices.push_back(std::move(choice));
    }
  }
  // Every run measured once more, after all of them: two measurements of one plan on this
  // machine lie apart by what it drifts in minutes, and no prediction can come closer to
  // both than half of that. The report sets the cost model's error beside that bound.
  if (o.repeat_checks) {
    int64_t runs = 0, done = 0;
    for (const TunedChoice& c : report.choices) {
      runs += c.measured_tokens_per_second > 0 ? 1 : 0;
      for (const TunedCandidate& k : c.candidates)
        runs += k.key != c.key && k.measured_tokens_per_second > 0 ? 1 : 0;
    }
    say(Format("measuring the %.0f runs again", double(runs)));
    const std::function<void(int64_t, int64_t)> advance = phase("runs measured again");
    auto again = [&](int32_t batch, int32_t context, bool disk, const DiskKvOptions& plan,
                     const DiskStepShape& shape, double* measured, double* anchored) -> Status {
      DiskAnchor disk_anchor(probe.get(), report.device);
      double anchor = 0;
      STRATA_RETURN_IF_ERROR(MeasureSpeed(model, o, *quality, batch, context,
                                          disk ? &plan : nullptr, measured, &anchor, nullptr,
                                          &disk_anchor));
      *anchored = AnchoredTokensPerSecond(report, batch, context, disk, shape, anchor,
                                          disk_anchor.Factor());
      if (advance) advance(++done, runs);
      return Status::OK();
    };
    for (TunedChoice& c : report.choices) {
      if (c.measured_tokens_per_second > 0)
        STRATA_RETURN_IF_ERROR(again(c.batch, c.context, c.disk, c.disk_options, c.shape,
                                     &c.remeasured_tokens_per_second,
                                     &c.remeasured_anchored_tokens_per_second));
      for (TunedCandidate& k : c.candidates)
        if (k.key != c.key && k.measured_tokens_per_second > 0)
          STRATA_RETURN_IF_ERROR(again(c.batch, c.context, true, k.options, k.shape,
                                       &k.remeasured_tokens_per_second,
                                       &k.remeasured_anchored_tokens_per_second));
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
