#include "tuner/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include "common/thread_pool.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/forward.h"
#include "runtime/kv/disk/disk_kv.h"
#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_store.h"
#include "runtime/kv/disk/group_predictor.h"
#include "runtime/kv/disk/kv_record_layout.h"
#include "tuner/kv_replay.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

// Decode steps of `batch` sequences that already hold `context` tokens of random K/V, or of
// a captured text (imported through the policy, as a replayed prefix would be).
class DecodeTimer {
 public:
  // With `real` (windows whose captures hold at least `context` tokens), the sequences
  // replay their windows' prefixes and decode the text's next tokens, as the tuner's check
  // runs do.
  Status Init(const Model& model, int32_t threads, int32_t batch, int32_t context, int32_t steps,
              const DiskKvOptions* disk, int32_t cuda_device,
              const ComputeProfileOptions::RealText* real = nullptr) {
    const HParams& hp = model.hparams();
    context_ = context;
    STRATA_RETURN_IF_ERROR(
        CreateRunEngine(model, threads, context + steps + 2, batch, disk, &engine_, cuda_device));
    seqs_.resize(static_cast<size_t>(batch));
    if (real && real->windows > 0) {
      tokens_ = real->tokens;
      STRATA_RETURN_IF_ERROR(
          ReplayWindows(*engine_, batch, real->windows, real->window, context, &seqs_, &begins_));
      const size_t last = *std::max_element(begins_.begin(), begins_.end());
      if (!tokens_ || tokens_->size() < last + size_t(context + steps + 1))
        return Status::InvalidArgument("decode timer: the text holds fewer than the " +
                                       std::to_string(last + size_t(context + steps + 1)) +
                                       " tokens its windows decode");
      return Status::OK();
    }
    // Random K/V (attention's cost does not depend on the values), every layer the same,
    // replayed like a captured prefix.
    KvCapture cap;
    cap.n_layer = hp.n_layer;
    cap.row = hp.n_head_kv * hp.head_dim;
    cap.n_tokens = context;
    std::vector<float> one(size_t(context) * size_t(cap.row));
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (float& x : one) x = dist(rng);
    std::vector<uint16_t> half(one.size());
    kernels::F32ToF16Row(one.data(), half.data(), int64_t(one.size()));
    for (int32_t i = 0; i < 2 * hp.n_layer; ++i)
      cap.data.insert(cap.data.end(), half.begin(), half.end());
    for (SeqId& s : seqs_) {
      STRATA_RETURN_IF_ERROR(engine_->NewSequence(&s));
      STRATA_RETURN_IF_ERROR(ReplayPrefix(engine_->kv(), s, cap, context));
    }
    return Status::OK();
  }

  // One step; the first one warms caches and is what a caller should not count.
  Status Step(double* seconds) {
    fb_.Clear();
    for (size_t i = 0; i < seqs_.size(); ++i)
      fb_.Add(seqs_[i], context_ + done_,
              std::span<const int32_t>(
                  tokens_ ? &(*tokens_)[begins_[i] + size_t(context_ + done_)] : &kToken, 1));
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(engine_->Evaluate(fb_, &logits_));
    *seconds = Since(t0);
    ++done_;
    return Status::OK();
  }

  const Engine& engine() const { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
  std::vector<SeqId> seqs_;
  std::vector<size_t> begins_;  // where each sequence's window begins in tokens_
  ForwardBatch fb_;
  std::vector<float> logits_;
  int32_t context_ = 0;
  int32_t done_ = 0;
  const std::vector<int32_t>* tokens_ = nullptr;  // the real text's, or kToken every step
  static constexpr int32_t kToken = 1;
};

namespace {

// Timed steps of each of the disk policy's fitting runs, at least.
constexpr int32_t kFitSteps = 32;
// The batch of the fitting runs that price the selection of several sequences: the
// largest profiled.
constexpr int32_t kFitBatch = -1;

// Tokens a layer of the views Q8_0 records are priced on (TimeQ8Attention): the disk
// policy's plans attend some hundreds to thousands of tokens a layer.
constexpr int32_t kQ8Tokens = 512;
// The records' block where no disk options say which device (the smallest a store uses).
constexpr uint32_t kDefaultBlock = 512;

// Context of the steps that time the dense part of a decode step (and the anchor step).
constexpr int32_t kShortContext = 16;

// Fewest timed steps of a compute profile point: steps are milliseconds, and fewer let one
// stall of a shared machine move a median.
constexpr int32_t kMinSteps = 12;

// The median of `steps` decode steps after one warm-up: a shared machine's stalls would
// otherwise decide a mean of few steps. With `anchor`, an anchor step after each
// (AnchorTimer), whose median it receives.
Status TimeDecode(const Model& model, int32_t threads, int32_t cuda_device, int32_t batch,
                  int32_t context, int32_t steps, const DiskKvOptions* disk, double* seconds,
                  double* anchor = nullptr) {
  DecodeTimer t;
  STRATA_RETURN_IF_ERROR(t.Init(model, threads, batch, context, steps, disk, cuda_device));
  AnchorTimer a;
  if (anchor) STRATA_RETURN_IF_ERROR(a.Init(model, threads, cuda_device, steps));
  std::vector<double> times;
  for (int32_t i = 0; i <= steps; ++i) {
    double sec = 0;
    STRATA_RETURN_IF_ERROR(t.Step(&sec));
    if (i > 0) times.push_back(sec);
    if (anchor) STRATA_RETURN_IF_ERROR(a.Step());
  }
  *seconds = Median(std::move(times));
  if (anchor) *anchor = a.Seconds();
  return Status::OK();
}

double Interpolate(const std::vector<int32_t>& xs, const std::vector<double>& ys, double x) {
  if (xs.empty()) return 0;
  if (xs.size() == 1) return ys[0] * (xs[0] > 0 ? std::max(1.0, x / xs[0]) : 1.0);
  size_t i = 1;
  while (i + 1 < xs.size() && xs[i] < x) ++i;
  const double x0 = xs[i - 1], x1 = xs[i];
  const double t = (x - x0) / (x1 - x0);
  return std::max(0.0, ys[i - 1] + t * (ys[i] - ys[i - 1]));
}

// The disk policy's own constants (see cost_model.h), fitted on real runs of plans that
// differ in what drives them: every group resident at small and large G (groups, no reads),
// and budgets of a tenth and a twentieth of the cache (reads, read-through). A plan this
// model cannot place at this context is left out. Where the caller gives a capture the runs
// replay real text: real keys decide which groups a step selects, how often it selects them
// again and what it reads, and random keys select otherwise (a fit on random keys priced
// Q8_0 plans of small G well below what they then took on text: docs/experiments/tuner.md).
Status FitDiskConstants(const Model& model, const ComputeProfileOptions& o,
                        const DiskKvOptions& disk, ComputeProfile* p) {
  const HParams& hp = model.hparams();
  const int32_t short_ctx =
      o.fit_short_context > 0 ? o.fit_short_context : std::max(256, o.attention_tokens / 2);
  const int32_t long_ctx =
      o.fit_long_context > 0 ? o.fit_long_context : std::max(512, o.attention_tokens * 2);
  struct Run {
    int32_t context;
    int32_t divisor;  // budget = full KV / divisor; 0: twice full KV (every group resident)
    int32_t group_size;
    KvRecordType record;
    int32_t batch = 1;
    // M (kv.groups_per_step) as this share of the slots, without read-through, as the
    // tuner's candidates of fewer groups re-selected a step take it; 0: the runtime's M.
    double m_share = 0;
    // sigma and one summary row a group, without read-through; 0 and false: the runtime's
    // choices at the budget.
    int32_t ratio = 0;
    bool group_summary = false;
  };
  // Every group resident (groups, no reads), small and large budgets (reads, read-through),
  // F16 and Q8_0 records, at two contexts: each constant is driven by several runs. The
  // Q8_0 constant multiplies every attended token, so one run attends a whole long context
  // of Q8_0 records: without it a plan that keeps most of the cache is priced from runs that
  // attend a tenth as many.
  const Run runs[] = {{short_ctx, 0, 0, KvRecordType::kF16},
                      {short_ctx, 0, 16, KvRecordType::kF16},
                      {short_ctx, 2, 0, KvRecordType::kQ8_0},
                      // A third of the cache at the short context: many slots re-selected and
                      // many reads a step at batch 1, which only the long context had, so the
                      // selection of such plans at short contexts was priced from runs that
                      // re-select a tenth as many groups.
                      {short_ctx, 3, 0, KvRecordType::kQ8_0},
                      {short_ctx, 10, 0, KvRecordType::kAuto},
                      {short_ctx, 10, 8, KvRecordType::kQ8_0},
                      {short_ctx, 20, 16, KvRecordType::kF16},
                      {short_ctx, 20, 0, KvRecordType::kAuto},
                      {long_ctx, 3, 0, KvRecordType::kQ8_0},
                      {long_ctx, 10, 0, KvRecordType::kAuto},
                      {long_ctx, 20, 16, KvRecordType::kF16},
                      {long_ctx, 30, 0, KvRecordType::kAuto},
                      {long_ctx, 0, 0, KvRecordType::kQ8_0},
                      // M below the slots: the slots keep earlier picks, which attention still
                      // reads, so a layer attends as many groups as where all are re-selected
                      // but reads a fraction of them, unevenly over the layers: compute and
                      // reads balance, where the runs above are bound by one or the other.
                      // The tuner's plans of this kind ran 15-30% slower than predicted while
                      // no fitting run was like them (docs/experiments/tuner.md).
                      {short_ctx, 3, 0, KvRecordType::kQ8_0, 1, 0.5},
                      {long_ctx, 10, 0, KvRecordType::kQ8_0, 1, 0.5},
                      // Several sequences select side by side and queue their reads together: these
                      // price only the selection of several (the step's other constants are fitted
                      // at batch 1).
                      {short_ctx, 3, 0, KvRecordType::kQ8_0, kFitBatch},
                      {short_ctx, 10, 0, KvRecordType::kAuto, kFitBatch},
                      {long_ctx, 20, 0, KvRecordType::kAuto, kFitBatch},
                      {long_ctx, 10, 16, KvRecordType::kF16, kFitBatch},
                      {short_ctx, 3, 0, KvRecordType::kQ8_0, kFitBatch, 0.5},
                      {long_ctx, 10, 0, KvRecordType::kQ8_0, kFitBatch, 0.5},
                      // Small ranks with one summary row a group, where the runs above take
                      // the runtime's rank: a selection's query and scoring then cost a
                      // fraction of theirs (SelectionPrices::per_rank), and the tuner's plans
                      // of this kind ran well below their predictions while no fitting run
                      // was like them.
                      {long_ctx, 20, 16, KvRecordType::kF16, 1, 0, 16, true},
                      {short_ctx, 20, 16, KvRecordType::kF16, 1, 0, 32, true},
                      {long_ctx, 20, 16, KvRecordType::kF16, kFitBatch, 0, 16, true}};
  struct Measured {
    DiskStepShape shape;
    double step = 0, select = 0;  // medians over the timed steps
    int32_t batch = 1;
    ComputeProfile::DiskFitRun run;  // what the report shows of it
  };
  std::vector<Measured> measured;
  const DeviceProfile no_device;
  const DeviceProfile& device = o.device ? *o.device : no_device;
  // As many steps as a check run takes (TuneOptions::verify_steps) in a full profile: the
  // constants are small parts of a step, and the median of fewer steps moves by as much as
  // they add. A shorter profile (fewer steps a point) takes fewer.
  const int32_t steps = std::max(kMinSteps, std::min(kFitSteps, 4 * o.steps));
  // A run at context c replays c - kSettleSteps - steps - 1 tokens and decodes
  // kSettleSteps + steps more, timing the last `steps`, as a check run does.
  const int32_t unreplayed = kSettleSteps + steps + 1;
  // Every window checked here: a run whose engine cannot be made is left out below, which
  // must not hide a capture too short for all of them.
  const int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  for (int32_t w = 0; w < std::min(o.real.windows, std::max(1, max_batch)); ++w) {
    std::shared_ptr<const KvCapture> cap;
    size_t begin = 0;
    STRATA_RETURN_IF_ERROR(o.real.window(w, &cap, &begin));
    if (!o.real.tokens || cap->n_tokens < long_ctx - unreplayed ||
        o.real.tokens->size() < begin + size_t(long_ctx - 1))
      return Status::InvalidArgument("compute profile: window " + std::to_string(w) +
                                     "'s capture for the disk policy's fitting runs holds " +
                                     std::to_string(cap->n_tokens) + " tokens, fewer than the " +
                                     std::to_string(long_ctx - unreplayed) + " a run at context " +
                                     std::to_string(long_ctx) + " replays");
  }
  for (const Run& r : runs) {
    const int32_t context = r.context;
    const int64_t full = int64_t(hp.n_layer) * context * hp.n_head_kv * hp.head_dim * 2 * 2;
    DiskKvOptions d = disk;
    d.budget_bytes = r.divisor > 0 ? full / r.divisor : 2 * full;
    d.group_size = r.group_size;
    d.record_type = r.record;
    if (r.m_share > 0) d.read_through = 0;
    if (r.ratio > 0) d.ratio = r.ratio;
    if (r.group_summary) {
      d.group_summary = AutoSwitch::kOn;
      d.read_through = 0;
    }
    // The check runs' conditions where the caller has a capture: real keys decide which
    // groups a step selects, reads and re-reads, which random ones do not.
    const int32_t batch = r.batch == kFitBatch ? max_batch : r.batch;
    if (r.batch == kFitBatch && batch < 2) continue;
    auto timer = std::make_unique<DecodeTimer>();
    auto init = [&] {
      return timer
          ->Init(model, o.threads, batch, context - unreplayed, kSettleSteps + steps - 1, &d,
                 o.cuda_device, &o.real)
          .ok();
    };
    if (!init()) continue;
    const DiskKv* kv = dynamic_cast<const DiskKv*>(&timer->engine().kv());
    if (kv && r.m_share > 0) {  // M from the slots the plan of the runtime's M has
      d.groups_per_step =
          std::max(1, int32_t(std::lround(r.m_share * double(kv->plan().reuse_slots))));
      timer = std::make_unique<DecodeTimer>();
      if (!init()) continue;
      kv = dynamic_cast<const DiskKv*>(&timer->engine().kv());
    }
    DecodeTimer& t = *timer;
    // A budget whose slot pool stages fewer tokens a pass than the batch cannot step it at
    // once; the other runs price what this one would.
    if (!kv || t.engine().forward().max_tokens() < batch) continue;
    AnchorTimer anchor;
    STRATA_RETURN_IF_ERROR(anchor.Init(model, o.threads, o.cuda_device, steps));
    double sec = 0;
    STRATA_RETURN_IF_ERROR(anchor.Step());  // its warm-up
    for (int32_t i = 0; i < kSettleSteps; ++i) STRATA_RETURN_IF_ERROR(t.Step(&sec));
    const KvCounters c0 = kv->counters();
    std::vector<double> times, selects;
    double clock = c0.predict_seconds;
    for (int32_t i = 0; i < steps; ++i) {
      STRATA_RETURN_IF_ERROR(t.Step(&sec));
      times.push_back(sec);
      selects.push_back(kv->counters().predict_seconds - clock);
      clock = kv->counters().predict_seconds;
      STRATA_RETURN_IF_ERROR(anchor.Step());
    }
    const KvCounters c1 = kv->counters();
    const double n = double(steps) * batch;  // sequence steps
    const double requests = double(c1.reads_issued - c0.reads_issued) / n;
    const double refines = double(c1.refine_reads_issued - c0.refine_reads_issued) / n;
    const double bytes = double(c1.bytes_read - c0.bytes_read) / n;
    const double attended = double(c1.slot_groups_attended() - c0.slot_groups_attended()) / n;
    // At the profile's speed (ProfileCompute): the compute part of the step and the
    // selection scale with the machine's speed, the wait on reads with the device's.
    const double f =
        p->anchor_seconds > 0 && anchor.Seconds() > 0 ? p->anchor_seconds / anchor.Seconds() : 1.0;
    const double wait = (c1.io_wait_seconds - c0.io_wait_seconds) / double(steps);
    const double step = Median(std::move(times));
    DiskStepShape shape =
        ShapeOfPlan(kv->plan(), d, batch, context, hp.n_layer, requests, bytes, attended);
    shape.refine_requests = refines;
    shape.layer_read_shares = LayerReadShares(c1.layer_reads_issued, c0.layer_reads_issued);
    ComputeProfile::DiskFitRun run;
    run.batch = batch;
    run.context = context;
    run.group_size = kv->plan().layout.group_size;
    run.rank = kv->plan().rank;
    run.groups_per_step = d.groups_per_step;
    run.q8_records = shape.q8_records;
    run.group_summary = kv->plan().group_summary;
    run.budget_bytes = d.budget_bytes;
    measured.push_back({shape, std::max(0.0, step - wait) * f + std::min(step, wait),
                        Median(std::move(selects)) * f, batch, run});
  }
  if (measured.empty()) return Status::OK();
  // First the selection's own work, against the policy's clock of it: what scoring and the
  // queries (profiled apart) leave of each run's selection time.
  ComputeProfile bare = *p;  // the model without the constants being fitted
  bare.select_one = bare.select_many = {};
  bare.disk_overhead_seconds = bare.disk_seconds_per_group = bare.disk_seconds_per_request = 0;
  bare.disk_seconds_per_request_many = 0;  // Q8_0 records' prices are profiled (kept)
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  // The prices of one sequence's selection or of several's, fitted on the runs of that kind.
  // Several sequences select as one does on one worker (the same scoring, ranking and slot
  // planning), side by side on the cores, which share caches and memory bandwidth: their
  // runs being few, `many` fits one scale of one sequence's prices (scoring at the table's
  // one-core rate, per layer selection, candidate and group) and its own price per request.
  // Scoring and the rest scaled apart, the two traded places from
  // one tune to the next (the scoring scale 0.5 in one, 1.7 in the next) and plans of large
  // G, whose selection is mostly the per-selection part, were priced at up to twice what
  // they took. The scale is held within kScale of one core's.
  constexpr double kScale[2] = {0.5, 2.0};
  auto fit_prices = [&](bool many, ComputeProfile::SelectionPrices* prices) {
    x.clear();
    y.clear();
    const ComputeProfile::SelectionPrices& one = bare.select_one;
    std::vector<double> work;  // `many`: each run's selection at one sequence's prices
    for (const Measured& m : measured) {
      if ((m.batch > 1) != many) continue;
      const DiskOwnWork w = OwnWork(m.shape);
      const double cores = SelectionCores(bare, m.batch);
      const double selections = double(m.batch) * m.shape.selections / cores;
      ComputeProfile table = bare;
      table.select_one.score_scale = table.select_many.score_scale = 0;
      const double rest = SelectionSeconds(table, m.shape);  // the queries
      const double scoring = SelectionSeconds(bare, m.shape) - rest;
      const double ranked = selections * CandidateGroups(m.shape);
      if (many) {
        // Weighted by the run's selection time: the cost model is held to each plan's
        // relative error, and in absolute terms plans of many candidates a group (per-token
        // summaries) decided the fit.
        const double wt = 1.0 / std::max(m.select, 1e-6);
        work.push_back(
            wt * (scoring + selections * (one.per_selection + double(m.shape.rank) * one.per_rank) +
                  ranked * one.per_candidate + w.groups / cores * one.per_group));
        x.push_back({work.back(), wt * w.requests});
        y.push_back(wt * (m.select - rest));
      } else {
        x.push_back(
            {selections, ranked, w.groups / cores, w.requests, selections * double(m.shape.rank)});
        y.push_back(m.select - rest - scoring);
      }
    }
    if (x.empty()) return false;
    std::vector<double> c = FitNonNegative(x, y);
    if (many && (c[0] < kScale[0] || c[0] > kScale[1])) {
      const double scale = std::clamp(c[0], kScale[0], kScale[1]);
      for (size_t i = 0; i < x.size(); ++i) {
        y[i] -= scale * work[i];
        x[i].erase(x[i].begin());
      }
      c = FitNonNegative(x, y);
      c.insert(c.begin(), scale);
    }
    if (many)
      *prices = ComputeProfile::SelectionPrices{c[0] * one.per_selection, c[0] * one.per_candidate,
                                                c[0] * one.per_group,     c[1],
                                                c[0] * one.per_rank,      c[0]};
    else
      *prices = ComputeProfile::SelectionPrices{c[0], c[1], c[2], c[3], c[4], 1.0};
    return true;
  };
  fit_prices(false, &bare.select_one);
  // Without runs of several (a tune of batch 1 only), one sequence's prices.
  if (!fit_prices(true, &bare.select_many)) bare.select_many = bare.select_one;
  p->select_one = bare.select_one;
  p->select_many = bare.select_many;
  // Then the rest of the step. The prices per attended group and Q8_0 token are work in a
  // layer's path, hidden where reads bound the layer (PredictDiskStep), so their columns are
  // what a unit of each adds to the predicted step rather than the counts themselves.
  // A run whose reads hide the work entirely has a column of rounding noise, which a least
  // squares fit would answer with an enormous price: below a thousandth of the `count` of
  // units the column is taken as 0.
  auto marginal = [&](const ComputeProfile& at, const DiskStepShape& shape,
                      double ComputeProfile::*price, double count) {
    constexpr double kUnit = 1e-9;
    ComputeProfile more = at;
    more.*price += kUnit;
    const double m = (PredictDiskStep(device, more, shape).step_seconds -
                      PredictDiskStep(device, at, shape).step_seconds) /
                     kUnit;
    return m > 1e-3 * count ? m : 0.0;
  };
  // Each run is weighted by its step time, as the model is held to each plan's relative
  // error: in absolute terms the device-bound runs of a slow device decided the fit, and a
  // constant a step that was noise beside their reads took a fifth of a compute-bound plan's
  // step.
  x.clear();
  y.clear();
  for (const Measured& m : measured) {
    if (m.batch != 1) continue;
    const DiskOwnWork w = OwnWork(m.shape);
    const double wt = 1.0 / std::max(m.step, 1e-6);
    x.push_back({wt,
                 wt * marginal(bare, m.shape, &ComputeProfile::disk_seconds_per_group, w.groups),
                 wt * w.requests});
    y.push_back(wt * (m.step - PredictDiskStep(device, bare, m.shape).step_seconds));
  }
  const std::vector<double> c = FitNonNegative(x, y);
  p->disk_overhead_seconds = c[0];
  p->disk_seconds_per_group = c[1];
  p->disk_seconds_per_request = c[2];
  // Several sequences' read requests are priced on their own runs: a batch submits and
  // reaps its reads while several selections share the cores, and what a request costs
  // the CPU then is not what it costs one sequence. Without such runs, one sequence's price.
  p->disk_seconds_per_request_many = p->disk_seconds_per_request;
  ComputeProfile fitted = *p;
  fitted.disk_seconds_per_request_many = 0;
  x.clear();
  y.clear();
  for (const Measured& m : measured) {
    if (m.batch == 1) continue;
    const double wt = 1.0 / std::max(m.step, 1e-6);
    x.push_back({wt * OwnWork(m.shape).requests});
    y.push_back(wt * (m.step - PredictDiskStep(device, fitted, m.shape).step_seconds));
  }
  if (!x.empty()) p->disk_seconds_per_request_many = FitNonNegative(x, y)[0];
  p->disk_fit_runs = int32_t(measured.size());
  p->disk_fit.clear();
  for (Measured& m : measured) {
    m.run.step_seconds = m.step;
    m.run.select_seconds = m.select;
    const StepPrediction at = PredictDiskStep(device, *p, m.shape);
    m.run.predicted_step_seconds = at.step_seconds;
    m.run.predicted_select_seconds = at.select_seconds;
    p->disk_fit.push_back(m.run);
  }
  return Status::OK();
}

}  // namespace

double ComputeProfile::DenseSeconds(int32_t batch) const {
  return Interpolate(batches, dense_seconds, double(batch));
}

ComputeProfile ComputeProfile::Scaled(double f) const {
  ComputeProfile s = *this;
  for (double& x : s.dense_seconds) x *= f;
  for (double& x : s.score_seconds_per_row) x *= f;
  for (double& x : s.score_seconds_per_row_one_core) x *= f;
  for (double& x : s.q8_seconds_per_token) x *= f;
  for (double& x : s.q8_seconds_per_token_many) x *= f;
  for (double& x : s.query_seconds) x *= f;
  for (double& x : s.query_row_seconds) x *= f;
  for (double* x :
       {&s.attention_seconds_per_token, &s.attention_seconds_per_token_many,
        &s.select_one.per_selection, &s.select_one.per_candidate, &s.select_one.per_group,
        &s.select_one.per_request, &s.select_one.per_rank, &s.select_many.per_selection,
        &s.select_many.per_candidate, &s.select_many.per_group, &s.select_many.per_request,
        &s.select_many.per_rank, &s.disk_overhead_seconds, &s.disk_seconds_per_group,
        &s.disk_seconds_per_request, &s.disk_seconds_per_request_many, &s.anchor_seconds})
    *x *= f;
  return s;
}

namespace {
// Longer than a pool's workers spin after a job (common/thread_pool.cc) before they sleep.
constexpr auto kParkTime = std::chrono::milliseconds(2);
}  // namespace

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

AnchorTimer::AnchorTimer() = default;
AnchorTimer::~AnchorTimer() = default;

Status AnchorTimer::Init(const Model& model, int32_t threads, int32_t cuda_device, int32_t steps) {
  timer_ = std::make_unique<DecodeTimer>();
  steps_ = std::max(1, steps) + 1;
  done_ = 0;
  times_.clear();
  return timer_->Init(model, threads, 1, kShortContext, steps_, nullptr, cuda_device);
}

Status AnchorTimer::Step() {
  if (!timer_ || done_ >= steps_)
    return Status::Internal("anchor timer: not initialised or out of steps");
  // The other run's workers park first, and this pool's after, before that run steps again.
  std::this_thread::sleep_for(kParkTime);
  double sec = 0;
  STRATA_RETURN_IF_ERROR(timer_->Step(&sec));
  if (done_++ > 0) times_.push_back(sec);
  std::this_thread::sleep_for(kParkTime);
  return Status::OK();
}

double AnchorTimer::Seconds() const { return Median(times_); }

double ComputeProfile::Q8SecondsPerToken(int32_t group_size, bool many) const {
  const std::vector<double>& table =
      many && !q8_seconds_per_token_many.empty() ? q8_seconds_per_token_many : q8_seconds_per_token;
  size_t best = 0;
  for (size_t i = 1; i < q8_group_sizes.size() && i < table.size(); ++i)
    if (std::abs(q8_group_sizes[i] - group_size) < std::abs(q8_group_sizes[best] - group_size))
      best = i;
  return best < table.size() ? table[best] : 0.0;
}

double ComputeProfile::QuerySeconds(int32_t rank, int32_t rows) const {
  if (ranks.empty() || query_seconds.size() != ranks.size() ||
      query_row_seconds.size() != ranks.size())
    return 0;
  auto at = [&](size_t i) {
    return query_seconds[i] + double(std::max(0, rows - 1)) * query_row_seconds[i];
  };
  if (rank <= ranks.front()) return at(0);
  if (rank >= ranks.back()) return at(ranks.size() - 1);
  size_t i = 1;
  while (ranks[i] < rank) ++i;
  const double t = double(rank - ranks[i - 1]) / double(ranks[i] - ranks[i - 1]);
  return std::max(0.0, at(i - 1) + t * (at(i) - at(i - 1)));
}

double ComputeProfile::ScoreSecondsPerRow(int32_t rank, int32_t group_rows, bool one_core) const {
  if (ranks.empty()) return 0;
  const std::vector<double>& table = one_core && !score_seconds_per_row_one_core.empty()
                                         ? score_seconds_per_row_one_core
                                         : score_seconds_per_row;
  const size_t n_g = std::max<size_t>(1, score_group_sizes.size());
  if (table.size() != ranks.size() * n_g) return 0;
  // Rank i's price at group_rows: linear in 1 / rows a group (the per-group work is spread
  // over that many rows) between measured sizes, the nearest beyond them.
  auto at = [&](size_t i) {
    const double* v = table.data() + i * n_g;
    if (score_group_sizes.size() < 2) return v[0];
    const std::vector<int32_t>& g = score_group_sizes;
    if (group_rows <= g.front()) return v[0];
    if (group_rows >= g.back()) return v[n_g - 1];
    size_t j = 1;
    while (g[j] < group_rows) ++j;
    const double x0 = 1.0 / g[j - 1], x1 = 1.0 / g[j], x = 1.0 / group_rows;
    return v[j - 1] + (x - x0) / (x1 - x0) * (v[j] - v[j - 1]);
  };
  if (rank <= ranks.front()) return at(0) * rank / ranks.front();
  if (rank >= ranks.back()) return at(ranks.size() - 1) * rank / ranks.back();
  size_t i = 1;
  while (ranks[i] < rank) ++i;
  const double t = double(rank - ranks[i - 1]) / double(ranks[i] - ranks[i - 1]);
  return std::max(0.0, at(i - 1) + t * (at(i) - at(i - 1)));
}

Status ChooseThreads(const Model& model, int32_t cores, int32_t max_batch, int32_t steps,
                     ThreadsChoice* out) {
  if (cores < 1 || max_batch < 1 || steps < 1)
    return Status::InvalidArgument("threads search: cores, batch and steps must be >= 1");
  ThreadsChoice c;
  for (int32_t t = cores; t >= 1; t /= 2) c.counts.push_back(t);
  // Rounds over every count in turn, each count's median kept: a spell of a neighbour's load
  // on a shared machine then slows one round of each count, not all of one count's timings
  // (which once chose one thread of two).
  std::vector<std::vector<double>> rounds(c.counts.size());
  for (int32_t r = 0; r < kThreadsRounds; ++r)
    for (size_t i = 0; i < c.counts.size(); ++i) {
      double one = 0, many = 0;
      STRATA_RETURN_IF_ERROR(
          TimeDecode(model, c.counts[i], -1, 1, kShortContext, steps, nullptr, &one));
      if (max_batch > 1)
        STRATA_RETURN_IF_ERROR(
            TimeDecode(model, c.counts[i], -1, max_batch, kShortContext, steps, nullptr, &many));
      rounds[i].push_back(one + (max_batch > 1 ? many / max_batch : 0.0));
    }
  double best = INFINITY;
  for (size_t i = 0; i < c.counts.size(); ++i) {
    const double per_token = Median(rounds[i]);
    c.seconds_per_token.push_back(per_token);
    if (per_token < best * (1.0 - kThreadsMargin)) {
      best = per_token;
      c.threads = c.counts[i];
    }
  }
  *out = std::move(c);
  return Status::OK();
}

namespace {

// What attending a token of a layer in Q8_0 records costs beyond the same token in F16
// records (negative where it saves), for `batch` sequences side by side on the pool, the
// median of `pairs` steps of each timed in alternation, at the profile's speed (`anchor`
// beside each pair). The views are what the disk policy hands attention: records of
// `group` tokens in slot memory, `tokens` a layer, every layer its own. A Q8_0 record is
// expanded before the F16 kernel runs over it, so it costs arithmetic and saves half the
// bytes; which wins depends on where the records are, and in a decode step they are cold
// (the weights of the other layers sweep the caches between a layer's steps), so a buffer
// larger than the caches is swept before each timed step. A fit of this price on the disk
// policy's runs, confounded with their reads, moved by more than the price itself from one
// tune to the next.
Status TimeQ8Attention(const Model& model, const ComputeProfileOptions& o, ThreadPool* pool,
                       int32_t batch, int32_t tokens, int32_t group, uint32_t block, int32_t pairs,
                       double* price, double* anchor_seconds) {
  const HParams& hp = model.hparams();
  const KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, tokens};
  const int32_t hd = hp.head_dim, n_rep = hp.n_rep();
  const int32_t records = (tokens + group - 1) / group;
  const KvRecordLayout layouts[2] = {
      KvRecordLayout::Make(shape, group, block, kernels::KvType::kF16),
      KvRecordLayout::Make(shape, group, block, kernels::KvType::kQ8_0)};
  const size_t views = size_t(batch) * size_t(hp.n_layer);
  std::vector<std::vector<std::byte>> slots(2);
  std::vector<std::vector<kernels::KvSpan>> spans[2];
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> k(size_t(group) * size_t(shape.row())), v(k.size());
  // A few distinct records (normal values), copied over every slot: what attention costs
  // does not depend on the values, and drawing each would take longer than the timing.
  constexpr int32_t kDistinct = 16;
  // A layer's slots hold what its selections placed there, in no order of position, and its
  // view walks them in the order of the placements: each view's records lie shuffled over
  // its part of the slots (one shuffle for both types). Records in order let the hardware
  // prefetcher stream them, which halves what Q8_0 records take against F16 and does not
  // happen in a step (docs/experiments/tuner.md).
  std::vector<int32_t> order(views * size_t(records));
  for (size_t i = 0; i < views; ++i) {
    const auto first = order.begin() + std::ptrdiff_t(i * size_t(records));
    std::iota(first, first + records, 0);
    std::shuffle(first, first + records, rng);
  }
  for (int t = 0; t < 2; ++t) {
    const KvRecordLayout& l = layouts[t];
    std::vector<std::byte> distinct(size_t(kDistinct) * l.record_bytes);
    for (int32_t r = 0; r < kDistinct; ++r) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      l.PutF32(distinct.data() + size_t(r) * l.record_bytes, 0, k.data(), v.data(), group);
    }
    slots[size_t(t)].resize(views * size_t(records) * l.record_bytes);
    spans[t].resize(views);
    for (size_t i = 0; i < views; ++i)
      for (int32_t r = 0; r < records; ++r) {
        std::byte* rec =
            slots[size_t(t)].data() +
            (i * size_t(records) + size_t(order[i * size_t(records) + size_t(r)])) * l.record_bytes;
        std::memcpy(rec, distinct.data() + ((i + size_t(r)) % kDistinct) * l.record_bytes,
                    l.record_bytes);
        spans[t][i].push_back(l.Span(rec, r, std::min(group, tokens - r * group)));
      }
  }
  // Split into parts as the forward pass splits a decoding sequence's view.
  const int32_t parts = DecodeAttentionParts(tokens);
  const int32_t per_part = (records + parts - 1) / parts;
  const int64_t tasks = int64_t(batch) * hp.n_head_kv * parts;
  std::vector<float> q(size_t(hp.n_head) * size_t(hd));
  for (float& x : q) x = dist(rng);
  std::vector<float> out(size_t(tasks) * size_t(n_rep) * size_t(hd)), lse(size_t(tasks) * n_rep);
  std::vector<std::vector<float>> scratch(
      size_t(pool->size()), std::vector<float>(kernels::AttentionScratchFloats(1, n_rep, hd)));
  // Larger than a last-level cache of this class of machine.
  std::vector<uint8_t> sweep(size_t(64) << 20, 1);
  auto step = [&](int t, int32_t layer) {
    pool->Run(tasks, [&](int64_t i, int worker) {
      const int32_t part = int32_t(i % parts), h = int32_t(i / parts % hp.n_head_kv);
      const size_t seq = size_t(i / parts / hp.n_head_kv);
      const std::vector<kernels::KvSpan>& view = spans[t][seq * size_t(hp.n_layer) + size_t(layer)];
      const int32_t first = part * per_part;
      kernels::AttentionArgs a;
      a.q = q.data() + size_t(h) * n_rep * hd;
      a.n_q = 1;
      a.q_stride = hp.n_head * hd;
      a.q_pos0 = tokens;
      a.n_rep = n_rep;
      a.head_dim = hd;
      a.kv_head = h;
      a.spans = view.data() + first;
      a.n_spans = std::max(0, std::min(per_part, records - first));
      a.scale = 1.0f / std::sqrt(float(hd));
      a.out = out.data() + size_t(i) * n_rep * hd;
      a.out_stride = n_rep * hd;
      a.scratch = scratch[size_t(worker)].data();
      a.lse = lse.data() + size_t(i) * n_rep;
      kernels::AttentionOverSpans(a);
    });
  };
  auto timed = [&](int t) {
    for (size_t i = 0; i < sweep.size(); i += 64) ++sweep[i];  // through the caches
    const auto t0 = Clock::now();
    for (int32_t layer = 0; layer < hp.n_layer; ++layer) step(t, layer);
    return Since(t0);
  };
  AnchorTimer anchor;
  STRATA_RETURN_IF_ERROR(anchor.Init(model, o.threads, o.cuda_device, pairs));
  std::vector<double> diffs;
  for (int32_t i = 0; i <= pairs; ++i) {
    const double f16 = timed(0), q8 = timed(1);
    if (i > 0) diffs.push_back(q8 - f16);  // the first pair warms the code and the pages
    STRATA_RETURN_IF_ERROR(anchor.Step());
  }
  *price = Median(std::move(diffs)) / (double(batch) * hp.n_layer * tokens);
  *anchor_seconds = anchor.Seconds();
  return Status::OK();
}

}  // namespace

Status ProfileCompute(const Model& model, const Adapters& adapters, const ComputeProfileOptions& o,
                      const DiskKvOptions* disk, ComputeProfile* out) {
  if (o.batches.empty() || o.steps < 1 || o.attention_tokens < 64 || o.score_rows < 64)
    return Status::InvalidArgument("compute profile: empty batch list or too few steps/tokens");
  const HParams& hp = model.hparams();
  ComputeProfile p;
  p.threads = o.threads;
  // Batches, attention, one scoring point per adapter set, Q8_0 records, the disk policy's run.
  const int64_t units = int64_t(o.batches.size() + adapters.sets.size()) + 2 +
                        (*std::max_element(o.batches.begin(), o.batches.end()) >= 2 ? 1 : 0) +
                        (disk ? 1 : 0);
  int64_t done = 0;
  auto advance = [&] {
    if (o.progress) o.progress(++done, units);
  };
  // Each batch on its own engine, one after another: engines stepped in alternation slow
  // each other down, several times over on two cores (their pools' workers wake and sleep
  // out of turn), unless each waits for the other's workers to sleep (AnchorTimer). Two
  // passes some seconds apart.
  //
  // Every timing is taken with anchor steps beside it and scaled to one speed of the
  // machine, the median of those anchors (the profile's anchor_seconds): a shared machine
  // drifts by more than the cost model's error over the minute a profile takes, and a price
  // measured in a slow spell would otherwise be wrong by as much at every speed.
  std::vector<int32_t> batches = o.batches;
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  struct Timed {
    double seconds, anchor;
  };
  std::vector<Timed> dense[2];  // by pass, by batch
  auto time_batches = [&](int pass) -> Status {
    for (size_t i = 0; i < batches.size(); ++i) {
      Timed t{0, 0};
      STRATA_RETURN_IF_ERROR(TimeDecode(model, o.threads, o.cuda_device, batches[i], kShortContext,
                                        std::max(o.steps, kMinSteps), nullptr, &t.seconds,
                                        &t.anchor));
      dense[pass].push_back(t);
      if (pass == 0) advance();
    }
    return Status::OK();
  };
  STRATA_RETURN_IF_ERROR(time_batches(0));
  // Attention is what a long context adds to a short one's step. The two are timed in
  // alternation and the median of their differences kept, so that a stall or a neighbour on
  // a shared machine shifts both sides of a pair rather than deciding the difference. A
  // difference of two steps is noisier than either, hence more pairs than steps. A batch's
  // sequences hold attention_tokens between them, so its cache takes no more memory than one
  // sequence's. Per sequence-token.
  auto time_attention = [&](int32_t batch, Timed* timed) -> Status {
    const int32_t pairs = std::max(o.steps, 3 * kMinSteps);
    const int32_t context = std::max(4 * kShortContext, o.attention_tokens / batch);
    DecodeTimer short_ctx, long_ctx;
    STRATA_RETURN_IF_ERROR(
        short_ctx.Init(model, o.threads, batch, kShortContext, pairs, nullptr, o.cuda_device));
    STRATA_RETURN_IF_ERROR(
        long_ctx.Init(model, o.threads, batch, context, pairs, nullptr, o.cuda_device));
    AnchorTimer anchor;
    STRATA_RETURN_IF_ERROR(anchor.Init(model, o.threads, o.cuda_device, pairs));
    std::vector<double> diffs;
    for (int32_t i = 0; i <= pairs; ++i) {
      double a = 0, b = 0;
      STRATA_RETURN_IF_ERROR(short_ctx.Step(&a));
      STRATA_RETURN_IF_ERROR(long_ctx.Step(&b));
      if (i > 0) diffs.push_back(b - a);
      STRATA_RETURN_IF_ERROR(anchor.Step());
    }
    *timed = {Median(std::move(diffs)) / double(int64_t(batch) * (context - kShortContext)),
              anchor.Seconds()};
    advance();
    return Status::OK();
  };
  Timed attention{0, 0}, attention_many{0, 0};
  STRATA_RETURN_IF_ERROR(time_attention(1, &attention));
  if (batches.back() >= 2) STRATA_RETURN_IF_ERROR(time_attention(batches.back(), &attention_many));

  // One layer's selection over score_rows summary rows, per adapter set (rank) and rows a
  // group. The rows hold realistic values (a normal key projected, quantized as the policy
  // stores it): random bytes make scales of infinity and NaN, whose softmax and partition
  // run several times slower than real scores do.
  ThreadPool pool(o.threads > 0 ? o.threads : 1);
  std::mt19937 rng(11);
  std::vector<int32_t> sizes = o.score_group_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.empty() || sizes.front() < 1)
    return Status::InvalidArgument("compute profile: rows a group must be >= 1");
  p.score_group_sizes = sizes;
  // The low-rank queries of a layer are one call for the batch's rows: timed for one row and
  // for the largest batch, the rows after the first cost less than the first (the weights
  // are read once a call).
  const int32_t rows = std::max(2, *std::max_element(o.batches.begin(), o.batches.end()));
  const int32_t reps = std::max(o.steps, kMinSteps);
  // Every point (a rank's queries, its selections by rows a group, over the pool and on one
  // worker) is timed in kScoreRounds rounds, interleaved, and its median kept: the points of
  // one rank run back to back in milliseconds, so a neighbour that takes a core for longer
  // than that would otherwise decide all of them (seen: a rank's pool points slower than its
  // one-core ones), where now it decides a share of their samples.
  constexpr int32_t kScoreRounds = 3;
  const int32_t reps_a_round = std::max(1, (reps + kScoreRounds - 1) / kScoreRounds);
  struct RankScores {
    std::unique_ptr<GroupPredictor> gp;
    std::vector<uint8_t> klr;
    std::vector<float> x, q;
    std::vector<double> one_query, all_query;
    std::vector<std::vector<double>> pool, one_core;  // samples by group size
  };
  std::vector<RankScores> by_set;
  for (const AdapterSet& set : adapters.sets) {
    RankScores r;
    STRATA_RETURN_IF_ERROR(GroupPredictor::Create(model, set, GroupScoring::kSoftmax,
                                                  kernels::ScoreType::kQ4, o.score_rows, rows,
                                                  &pool, &r.gp));
    r.gp->ReserveGroupSize(sizes.back());
    const int32_t rank = r.gp->rank();
    r.klr.resize(size_t(GroupPredictor::KlrBytes(o.score_rows, rank, kernels::ScoreType::kQ4)));
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<float> row(static_cast<size_t>(rank));
    for (int32_t t = 0; t < o.score_rows; ++t) {
      for (float& v : row) v = dist(rng);
      kernels::StoreScoreRow(kernels::ScoreType::kQ4, row.data(), rank, t, r.klr.data());
    }
    r.x.resize(size_t(hp.n_embd) * size_t(rows));
    r.q.resize(size_t(hp.n_head) * size_t(rank) * size_t(rows));
    for (float& v : r.x) v = float(int32_t(rng() % 200) - 100) / 100.f;
    r.pool.resize(sizes.size());
    r.one_core.resize(sizes.size());
    by_set.push_back(std::move(r));
  }
  const std::vector<int32_t> pos(size_t(rows), o.score_rows);
  std::vector<int32_t> chosen;
  for (int32_t round = 0; round < kScoreRounds; ++round) {
    for (RankScores& r : by_set) {
      // The first call of a round warms what the previous point left cold: not kept.
      for (int32_t i = 0; i <= reps_a_round; ++i) {
        auto t0 = Clock::now();
        r.gp->LowRankQueries(0, r.x.data(), 1, pos.data(), r.q.data());
        if (i > 0) r.one_query.push_back(Since(t0));
        t0 = Clock::now();
        r.gp->LowRankQueries(0, r.x.data(), rows, pos.data(), r.q.data());
        if (i > 0) r.all_query.push_back(Since(t0));
      }
      for (size_t gi = 0; gi < sizes.size(); ++gi) {
        const int32_t g = sizes[gi];
        const int32_t groups = o.score_rows / g;
        // Over the pool (worker -1), as one sequence selects; on one worker, as each of two
        // or more does.
        for (int worker : {-1, 0}) {
          std::vector<double>& t = worker < 0 ? r.pool[gi] : r.one_core[gi];
          for (int32_t i = 0; i <= reps_a_round; ++i) {
            const auto t0 = Clock::now();
            r.gp->SelectGroups(r.q.data(), r.klr.data(), 0, groups, g, std::max(1, groups / 13),
                               &chosen, {}, 0.0f, {}, nullptr, worker);
            if (i > 0) t.push_back(Since(t0) / double(int64_t(groups) * g));
          }
        }
      }
      if (round + 1 == kScoreRounds) advance();
    }
  }
  // Ranks ascending for interpolation.
  std::sort(by_set.begin(), by_set.end(),
            [](const RankScores& a, const RankScores& b) { return a.gp->rank() < b.gp->rank(); });
  for (const RankScores& r : by_set) {
    const double one_s = Median(r.one_query), all_s = Median(r.all_query);
    p.query_seconds.push_back(one_s);
    p.query_row_seconds.push_back(std::max(0.0, all_s - one_s) / double(rows - 1));
    p.ranks.push_back(r.gp->rank());
    for (size_t gi = 0; gi < sizes.size(); ++gi) {
      p.score_seconds_per_row.push_back(Median(r.pool[gi]));
      p.score_seconds_per_row_one_core.push_back(Median(r.one_core[gi]));
    }
  }
  // Q8_0 records' price against F16 ones, for one sequence and for the largest batch
  // (where head_dim holds whole Q8_0 blocks; else the policy stores F16 alone).
  // What decides it is the bytes a token of each type takes, records padded to the device
  // block, so it is timed at each group size the plans may take (the runtime's own among
  // them).
  std::vector<Timed> q8, q8_many;
  if (hp.head_dim % 32 == 0) {
    uint32_t block = kDefaultBlock;
    if (disk) STRATA_RETURN_IF_ERROR(DiskKvStore::ProbeBlockSize(*disk, &block));
    std::vector<int32_t> groups = o.record_group_sizes;
    groups.push_back(AutoGroupSize({hp.n_layer, hp.n_head_kv, hp.head_dim, kQ8Tokens}, block,
                                   kernels::KvType::kQ8_0));
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    const int32_t pairs = std::max(o.steps, kMinSteps);
    for (int32_t g : groups) {
      if (g < 1) return Status::InvalidArgument("compute profile: tokens a group must be >= 1");
      p.q8_group_sizes.push_back(g);
      q8.push_back({0, 0});
      STRATA_RETURN_IF_ERROR(TimeQ8Attention(model, o, &pool, 1, kQ8Tokens, g, block, pairs,
                                             &q8.back().seconds, &q8.back().anchor));
      if (batches.back() < 2) continue;
      q8_many.push_back({0, 0});
      STRATA_RETURN_IF_ERROR(TimeQ8Attention(model, o, &pool, batches.back(), kQ8Tokens, g, block,
                                             pairs, &q8_many.back().seconds,
                                             &q8_many.back().anchor));
    }
  }
  advance();
  STRATA_RETURN_IF_ERROR(time_batches(1));
  {
    std::vector<double> anchors = {attention.anchor};
    if (attention_many.anchor > 0) anchors.push_back(attention_many.anchor);
    for (const std::vector<Timed>* v : {&q8, &q8_many})
      for (const Timed& t : *v) anchors.push_back(t.anchor);
    for (const std::vector<Timed>& pass : dense)
      for (const Timed& t : pass) anchors.push_back(t.anchor);
    p.anchor_seconds = Median(anchors);
  }
  // A timing taken `anchor` seconds an anchor step, at the profile's speed.
  auto at_profile_speed = [&](const Timed& t) {
    return t.anchor > 0 && p.anchor_seconds > 0 ? t.seconds * p.anchor_seconds / t.anchor
                                                : t.seconds;
  };
  for (size_t i = 0; i < batches.size(); ++i) {
    p.batches.push_back(batches[i]);
    // The faster pass: what drift the anchors did not catch only ever adds time.
    p.dense_seconds.push_back(
        std::min(at_profile_speed(dense[0][i]), at_profile_speed(dense[1][i])));
  }
  // A larger batch does all a smaller one does and more: where noise says otherwise, the
  // smaller batch's time is the better estimate of both.
  for (size_t i = p.dense_seconds.size(); i-- > 1;)
    p.dense_seconds[i - 1] = std::min(p.dense_seconds[i - 1], p.dense_seconds[i]);
  {
    // Attention cannot be faster than reading its K and V (F16, every layer) once from
    // memory: the floor that holds when noise still swamps the difference.
    const double kv_bytes = double(hp.n_layer) * 2.0 * hp.n_head_kv * hp.head_dim * 2.0;
    const double floor = o.memory_bytes_per_second > 0 ? kv_bytes / o.memory_bytes_per_second : 0.0;
    p.attention_seconds_per_token = std::max(at_profile_speed(attention), floor);
    if (attention_many.anchor > 0)
      p.attention_seconds_per_token_many = std::max(at_profile_speed(attention_many), floor);
    // A Q8_0 record saves at most half of F16 attention (half the bytes) and its expansion
    // costs at most attending it again: beyond those, the difference of two timings is noise.
    const double per_layer = p.attention_seconds_per_token / std::max(1, hp.n_layer);
    auto bounded = [&](const Timed& t) {
      return std::clamp(at_profile_speed(t), -0.5 * per_layer, per_layer);
    };
    for (const Timed& t : q8) p.q8_seconds_per_token.push_back(bounded(t));
    for (const Timed& t : q8_many) p.q8_seconds_per_token_many.push_back(bounded(t));
  }
  if (disk) {
    STRATA_RETURN_IF_ERROR(FitDiskConstants(model, o, *disk, &p));
    advance();
  }
  *out = std::move(p);
  return Status::OK();
}

double SelectionCores(const ComputeProfile& compute, int32_t batch) {
  return batch >= 2 ? double(std::max(1, std::min(batch, compute.threads))) : 1.0;
}

DiskOwnWork OwnWork(const DiskStepShape& s) {
  DiskOwnWork w;
  const double b = s.batch, layers = s.n_layer;
  w.groups = b * layers * double(s.attended_tokens) / double(std::max(1, s.group_size));
  w.requests = b * s.requests;
  w.q8_tokens = s.q8_records ? b * layers * double(s.attended_tokens) : 0;
  return w;
}

double CandidateGroups(const DiskStepShape& s) {
  return double(s.summary_rows) / double(std::max(1, s.summary_group_rows));
}

double SelectionSeconds(const ComputeProfile& compute, const DiskStepShape& s) {
  // Two or more sequences select side by side, each whole on one worker (scoring at one
  // core's rate, p of them at a time); one sequence's scoring is spread over the pool.
  const double cores = SelectionCores(compute, s.batch);
  // One sequence's scoring below GroupPredictor::kParallelRows rows stays on one core too.
  const bool one_core = s.batch >= 2 || s.summary_rows < GroupPredictor::kParallelRows;
  const double per_row = compute.ScoreSecondsPerRow(s.rank, s.summary_group_rows, one_core);
  const DiskOwnWork w = OwnWork(s);
  const double b = s.batch, selections = s.selections;
  const ComputeProfile::SelectionPrices& price =
      s.batch >= 2 ? compute.select_many : compute.select_one;
  return b / cores *
             (selections * (double(s.summary_rows) * per_row * price.score_scale +
                            CandidateGroups(s) * price.per_candidate + price.per_selection +
                            double(s.rank) * price.per_rank)) +
         w.groups / cores * price.per_group + w.requests * price.per_request +
         selections * compute.QuerySeconds(s.rank, s.batch);
}

StepPrediction PredictDiskStep(const DeviceProfile& device, const ComputeProfile& compute,
                               const DiskStepShape& s) {
  StepPrediction p;
  const double layers = std::max(1, s.n_layer);
  const DiskOwnWork w = OwnWork(s);
  // The policy's work per attended group and Q8_0 token is done in the layer's own path
  // (assembling its view, expanding its records), under the next layer's reads like the
  // rest of its compute: with many reads a step it is hidden, not added. A Q8_0 record's
  // saving against F16 (a negative price) is likewise hidden there when reads bound the
  // layer. What is done once a step or per request is not overlapped.
  const double layer_work = w.groups * compute.disk_seconds_per_group +
                            w.q8_tokens * compute.Q8SecondsPerToken(s.group_size, s.batch >= 2);
  p.compute_seconds =
      compute.DenseSeconds(s.batch) +
      double(s.batch) * double(s.attended_tokens) * compute.AttentionSecondsPerToken(s.batch) +
      layer_work;
  p.select_seconds = SelectionSeconds(compute, s);
  const double requests_l = double(s.batch) * s.requests / layers;
  const uint32_t request_bytes =
      s.requests > 0 ? uint32_t(std::max(1.0, s.bytes / s.requests)) : 4096;
  auto read = [&](double n) { return device.ReadSeconds(n, request_bytes, s.queue_depth); };
  // Each layer's mean reads: the step's, spread as measured; without a measured spread every
  // layer is the same, and one layer's figures stand for all (the solver predicts thousands
  // of plans, and a layer's wait sums a Poisson count's terms).
  const bool spread_measured = s.layer_read_shares.size() == size_t(layers);
  std::vector<double> layer_requests;
  if (spread_measured)
    for (double share : s.layer_read_shares)
      layer_requests.push_back(double(s.batch) * s.requests * share);
  else
    layer_requests.assign(1, requests_l);
  const double repeat = spread_measured ? 1.0 : layers;
  for (double n : layer_requests) p.read_seconds += repeat * (n > 0 ? read(n) : 0.0);
  // What `n` reads a layer (on average) in the layer's path cost it beyond `cover`: where
  // fewer than one a layer, only that share of the layers reads at all, and each of those
  // waits one read's latency, not every layer.
  auto path_wait = [&](double n, double cover) {
    if (n <= 0) return 0.0;
    const double share = std::min(1.0, n);
    return share * std::max(0.0, read(std::max(1.0, n)) - cover);
  };
  // Read-through groups (kv.read_through) go out with the layer's guess (DiskKv::Prepare)
  // and hide like the other reads: measured, a compute-bound plan with them waits a small
  // fraction of the read latency a layer that a wait in the layer's path would add
  // (docs/experiments/tuner.md). They count among the requests; no term of their own.
  // A refinement's reads go out once a layer's input is known, just before the layer
  // attends them: only the next layer's guess (a selection) runs meanwhile, and what of
  // their time that does not cover, the layer waits. Where they are many (large batches,
  // small groups) this is most of what compute does not hide.
  const double guess_select_l = p.select_seconds / std::max(1, s.selections);
  const double refine_wait_l =
      path_wait(std::min(requests_l, double(s.batch) * s.refine_requests / layers), guess_select_l);
  // A layer's guessed reads go out a layer ahead (DiskKv::Prepare) and run under what the
  // CPU does meanwhile: the previous layer's compute and the selections made before this
  // layer attends (its refinement, the next layer's guess). An I/O-bound layer waits only
  // for what all of that leaves of its reads.
  const double cover_l = (p.compute_seconds + p.select_seconds) / layers;
  // A layer's reads vary about their mean from layer to layer and step to step (the groups
  // each selection misses), and each layer waits for its own: where reads and the work that
  // covers them balance, a layer with more than the mean waits and one with fewer gives
  // nothing back, so the mean's wait is too small. The count is taken as Poisson about the
  // mean (independent misses: the least spread a count has) and the wait as its expectation.
  const double bound_l = cover_l + refine_wait_l;
  // When `k` reads of a layer are done. The store holds at most the queue depth's reads at
  // once and starts the others as earlier ones are reaped, which on this path happens only
  // once the layer waits (nothing polls the store while the CPU computes): a layer's reads
  // beyond the queue run after the work that covers the others, not under it. Where a batch
  // reads many small groups this is most of what it waits for.
  const double depth = std::max(1u, s.queue_depth);
  auto reads_done = [&](double k) {
    return k > depth ? std::max(read(k), cover_l + read(k - depth)) : read(k);
  };
  auto layer_wait = [&](double mean) {
    if (!(mean > 0)) return refine_wait_l;
    const double spread = 8 * std::sqrt(mean) + 8;
    const double lo = std::max(1.0, std::floor(mean - spread)), hi = std::ceil(mean + spread);
    if (reads_done(hi) <= bound_l) return refine_wait_l;  // covered whatever the count
    if (mean - spread >= 1 && reads_done(lo) >= bound_l)
      return reads_done(mean) - cover_l;  // never covered
    double expected = 0, mass = 0;
    for (double k = mean - spread >= 1 ? lo : 0; k <= hi; k += 1) {
      const double pk = std::exp(k * std::log(mean) - mean - std::lgamma(k + 1));
      expected += pk * std::max(bound_l, k >= 1 ? reads_done(k) : 0.0);
      mass += pk;
    }
    return expected / mass - cover_l;
  };
  for (double n : layer_requests) p.wait_seconds += repeat * layer_wait(n);
  p.own_seconds = compute.disk_overhead_seconds +
                  w.requests * (s.batch >= 2 ? compute.disk_seconds_per_request_many
                                             : compute.disk_seconds_per_request);
  p.step_seconds = p.select_seconds + p.compute_seconds + p.wait_seconds + p.own_seconds;
  p.tokens_per_second = p.step_seconds > 0 ? s.batch / p.step_seconds : 0;
  return p;
}

uint32_t ChooseQueueDepth(const DeviceProfile& device, const ComputeProfile& compute,
                          const DiskStepShape& shape) {
  std::vector<uint32_t> depths;
  for (const ReadCurvePoint& p : device.reads)
    if (p.depth > shape.queue_depth) depths.push_back(p.depth);
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  const double base = PredictDiskStep(device, compute, shape).step_seconds;
  std::vector<double> steps;
  double fastest = base;
  for (uint32_t d : depths) {
    DiskStepShape at = shape;
    at.queue_depth = d;
    steps.push_back(PredictDiskStep(device, compute, at).step_seconds);
    fastest = std::min(fastest, steps.back());
  }
  if (!(fastest < base * (1 - kMinQueueDepthGain))) return shape.queue_depth;
  for (size_t i = 0; i < depths.size(); ++i)
    if (steps[i] <= fastest * 1.01) return depths[i];
  return shape.queue_depth;
}

std::vector<double> LayerReadShares(const std::vector<uint64_t>& now,
                                    const std::vector<uint64_t>& before) {
  std::vector<double> shares(now.size());
  double total = 0;
  for (size_t l = 0; l < now.size(); ++l) {
    shares[l] = double(now[l] - (l < before.size() ? before[l] : 0));
    total += shares[l];
  }
  if (!(total > 0)) return {};
  for (double& x : shares) x /= total;
  return shares;
}

DiskStepShape ShapeOfPlan(const DiskKvPlan& plan, const DiskKvOptions& o, int32_t batch,
                          int32_t context, int32_t n_layer, double requests, double bytes,
                          double attended_groups) {
  DiskStepShape s;
  s.batch = batch;
  s.n_layer = n_layer;
  const int64_t G = plan.layout.group_size;
  // Attention reads the sink, the recent window and the rolling group, and the slot groups:
  // this step's selection and, with kv.experimental.attend_resident, whatever else the
  // slots still hold. Those last fill as a sequence decodes and may never all be taken when
  // the selections keep returning to the same groups (a large budget's slots can hold more
  // than a sequence ever selects), so the measured count is used where there is one; the
  // bound otherwise.
  const double slot_bound = o.attend_resident ? double(plan.reuse_slots + plan.transient_groups)
                                              : double(plan.groups_per_step);
  const double slots = attended_groups >= 0
                           ? std::min(slot_bound, attended_groups / std::max(1, n_layer))
                           : slot_bound;
  const double groups = double(plan.sink_groups) + slots + plan.recent_groups + 1;
  s.attended_tokens = std::min<int64_t>(context, int64_t(std::llround(groups * double(G))));
  s.group_size = int32_t(G);
  s.q8_records = plan.layout.type == kernels::KvType::kQ8_0;
  // A selection scores the groups between the sink and the recent ones, unless its layer
  // takes all of them (and has no read-through slots to rank them for).
  const int64_t gp = context / std::max<int64_t>(1, G);
  const int64_t g_lo = std::min<int64_t>(plan.sink_groups, gp);
  const int64_t candidates = std::max<int64_t>(g_lo, gp - plan.recent_groups) - g_lo;
  int32_t scored_layers = 0;
  for (int32_t l = 0; l < n_layer; ++l) {
    const int64_t m =
        size_t(l) < plan.layer_groups.size() ? plan.layer_groups[size_t(l)] : plan.groups_per_step;
    scored_layers += candidates > 0 && (m < candidates || plan.transient_groups > 0);
  }
  s.summary_group_rows = plan.summary_group_size();
  s.summary_rows = int64_t(std::llround(double(candidates * s.summary_group_rows) *
                                        double(scored_layers) / double(std::max(1, n_layer))));
  s.rank = plan.rank;
  s.selections = n_layer + (o.refine ? std::max(0, n_layer - 2) : 0);
  s.requests = requests;
  s.bytes = bytes;
  s.queue_depth = uint32_t(o.queue_depth);
  return s;
}

std::vector<double> FitNonNegative(const std::vector<std::vector<double>>& x,
                                   const std::vector<double>& y) {
  const size_t k = x.empty() ? 0 : x[0].size();
  std::vector<double> best(k, 0.0);
  double best_sse = 0;
  for (double v : y) best_sse += v * v;
  for (uint32_t mask = 1; mask < (1u << k); ++mask) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j)
      if (mask & (1u << j)) cols.push_back(j);
    const size_t m = cols.size();
    // Normal equations, Gaussian elimination with partial pivoting.
    std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0.0));
    for (size_t r = 0; r < x.size(); ++r)
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < m; ++j) a[i][j] += x[r][cols[i]] * x[r][cols[j]];
        a[i][m] += x[r][cols[i]] * y[r];
      }
    bool singular = false;
    for (size_t i = 0; i < m && !singular; ++i) {
      size_t piv = i;
      for (size_t r = i + 1; r < m; ++r)
        if (std::fabs(a[r][i]) > std::fabs(a[piv][i])) piv = r;
      std::swap(a[i], a[piv]);
      if (std::fabs(a[i][i]) < 1e-300) {
        singular = true;
        break;
      }
      for (size_t r = 0; r < m; ++r) {
        if (r == i) continue;
        const double f = a[r][i] / a[i][i];
        for (size_t j = i; j <= m; ++j) a[r][j] -= f * a[i][j];
      }
    }
    if (singular) continue;
    std::vector<double> coef(k, 0.0);
    bool feasible = true;
    for (size_t i = 0; i < m; ++i) {
      coef[cols[i]] = a[i][m] / a[i][i];
      feasible = feasible && coef[cols[i]] >= 0;
    }
    if (!feasible) continue;
    double sse = 0;
    for (size_t r = 0; r < x.size(); ++r) {
      double pred = 0;
      for (size_t j = 0; j < k; ++j) pred += coef[j] * x[r][j];
      sse += (y[r] - pred) * (y[r] - pred);
    }
    if (sse < best_sse) {
      best_sse = sse;
      best = coef;
    }
  }
  return best;
}

StepPrediction PredictMemoryStep(const ComputeProfile& compute, int32_t batch, int32_t context) {
  StepPrediction p;
  p.compute_seconds = compute.DenseSeconds(batch) +
                      double(batch) * double(context) * compute.AttentionSecondsPerToken(batch);
  p.step_seconds = p.compute_seconds;
  p.tokens_per_second = p.step_seconds > 0 ? batch / p.step_seconds : 0;
  return p;
}

}  // namespace strata
