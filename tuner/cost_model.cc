#include "tuner/cost_model.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>

#include "runtime/engine/engine.h"
#include "runtime/kv/disk_kv.h"
#include "runtime/kv/group_predictor.h"
#include "tuner/kv_replay.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Decode steps of `batch` sequences that already hold `context` tokens of random K/V
// (imported through the policy, as a replayed prefix would be).
class DecodeTimer {
 public:
  Status Init(const Model& model, int32_t threads, int32_t batch, int32_t context, int32_t steps,
              const DiskKvOptions* disk, int32_t cuda_device) {
    const HParams& hp = model.hparams();
    context_ = context;
    STRATA_RETURN_IF_ERROR(
        CreateRunEngine(model, threads, context + steps + 2, batch, disk, &engine_, cuda_device));
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
    seqs_.resize(static_cast<size_t>(batch));
    for (SeqId& s : seqs_) {
      STRATA_RETURN_IF_ERROR(engine_->NewSequence(&s));
      STRATA_RETURN_IF_ERROR(ReplayPrefix(engine_->kv(), s, cap, context));
    }
    return Status::OK();
  }

  // One step; the first one warms caches and is what a caller should not count.
  Status Step(double* seconds) {
    const int32_t token = 1;
    fb_.Clear();
    for (SeqId s : seqs_) fb_.Add(s, context_ + done_, std::span<const int32_t>(&token, 1));
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(engine_->Evaluate(fb_, &logits_));
    *seconds = Since(t0);
    ++done_;
    return Status::OK();
  }

  std::unique_ptr<Engine> Release() { return std::move(engine_); }

 private:
  std::unique_ptr<Engine> engine_;
  std::vector<SeqId> seqs_;
  ForwardBatch fb_;
  std::vector<float> logits_;
  int32_t context_ = 0;
  int32_t done_ = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of `steps` decode steps after one warm-up: a shared machine's stalls would
// otherwise decide a mean of few steps.
Status TimeDecode(const Model& model, int32_t threads, int32_t cuda_device, int32_t batch,
                  int32_t context, int32_t steps, const DiskKvOptions* disk, double* seconds,
                  std::unique_ptr<Engine>* keep = nullptr) {
  DecodeTimer t;
  STRATA_RETURN_IF_ERROR(t.Init(model, threads, batch, context, steps, disk, cuda_device));
  std::vector<double> times;
  for (int32_t i = 0; i <= steps; ++i) {
    double sec = 0;
    STRATA_RETURN_IF_ERROR(t.Step(&sec));
    if (i > 0) times.push_back(sec);
  }
  *seconds = Median(std::move(times));
  if (keep) *keep = t.Release();
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

}  // namespace

double ComputeProfile::DenseSeconds(int32_t batch) const {
  return Interpolate(batches, dense_seconds, double(batch));
}

double ComputeProfile::ScoreSecondsPerRow(int32_t rank) const {
  if (ranks.empty()) return 0;
  if (rank <= ranks.front()) return score_seconds_per_row.front() * rank / ranks.front();
  if (rank >= ranks.back()) return score_seconds_per_row.back() * rank / ranks.back();
  return Interpolate(ranks, score_seconds_per_row, double(rank));
}

Status ProfileCompute(const Model& model, const Adapters& adapters, const ComputeProfileOptions& o,
                      const DiskKvOptions* disk, ComputeProfile* out) {
  if (o.batches.empty() || o.steps < 1 || o.attention_tokens < 64 || o.score_rows < 64)
    return Status::InvalidArgument("compute profile: empty batch list or too few steps/tokens");
  const HParams& hp = model.hparams();
  ComputeProfile p;
  p.threads = o.threads;
  constexpr int32_t kShortContext = 16;
  // Batches, attention, one scoring point per adapter set, the disk policy's run.
  const int64_t units = int64_t(o.batches.size() + adapters.sets.size()) + 1 + (disk ? 1 : 0);
  int64_t done = 0;
  auto advance = [&] {
    if (o.progress) o.progress(++done, units);
  };
  for (int32_t b : o.batches) {
    double sec = 0;
    STRATA_RETURN_IF_ERROR(
        TimeDecode(model, o.threads, o.cuda_device, b, kShortContext, o.steps, nullptr, &sec));
    p.batches.push_back(b);
    p.dense_seconds.push_back(sec);
    advance();
  }
  std::vector<size_t> order(p.batches.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return p.batches[a] < p.batches[b]; });
  ComputeProfile sorted = p;
  for (size_t i = 0; i < order.size(); ++i) {
    sorted.batches[i] = p.batches[order[i]];
    sorted.dense_seconds[i] = p.dense_seconds[order[i]];
  }
  p = sorted;
  {
    // Attention is what a long context adds to a short one's step. The two are timed in
    // alternation and the median of their differences kept, so that a stall or a neighbour
    // on a shared machine shifts both sides of a pair rather than deciding the difference.
    DecodeTimer short_ctx, long_ctx;
    STRATA_RETURN_IF_ERROR(
        short_ctx.Init(model, o.threads, 1, kShortContext, o.steps, nullptr, o.cuda_device));
    STRATA_RETURN_IF_ERROR(
        long_ctx.Init(model, o.threads, 1, o.attention_tokens, o.steps, nullptr, o.cuda_device));
    std::vector<double> diffs;
    for (int32_t i = 0; i <= o.steps; ++i) {
      double a = 0, b = 0;
      STRATA_RETURN_IF_ERROR(short_ctx.Step(&a));
      STRATA_RETURN_IF_ERROR(long_ctx.Step(&b));
      if (i > 0) diffs.push_back(b - a);
    }
    const double measured = Median(std::move(diffs)) / double(o.attention_tokens - kShortContext);
    // Attention cannot be faster than reading its K and V (F16, every layer) once from
    // memory: the floor that holds when noise still swamps the difference.
    const double kv_bytes = double(hp.n_layer) * 2.0 * hp.n_head_kv * hp.head_dim * 2.0;
    const double floor = o.memory_bytes_per_second > 0 ? kv_bytes / o.memory_bytes_per_second : 0.0;
    p.attention_seconds_per_token = std::max(measured, floor);
    advance();
  }

  // One layer's selection over score_rows summary rows, per adapter set (rank).
  ThreadPool pool(o.threads > 0 ? o.threads : 1);
  std::mt19937 rng(11);
  for (const AdapterSet& set : adapters.sets) {
    std::unique_ptr<GroupPredictor> gp;
    STRATA_RETURN_IF_ERROR(GroupPredictor::Create(
        model, set, GroupScoring::kSoftmax, kernels::ScoreType::kQ4, o.score_rows, 1, &pool, &gp));
    std::vector<uint8_t> klr(
        size_t(GroupPredictor::KlrBytes(o.score_rows, gp->rank(), kernels::ScoreType::kQ4)));
    for (uint8_t& b : klr) b = uint8_t(rng());
    std::vector<float> x(size_t(hp.n_embd)), q(size_t(hp.n_head) * size_t(gp->rank()));
    for (float& v : x) v = float(int32_t(rng() % 200) - 100) / 100.f;
    const int32_t pos = o.score_rows;
    double query = 0;
    for (int32_t i = 0; i <= o.steps; ++i) {
      const auto t0 = Clock::now();
      gp->LowRankQueries(0, x.data(), 1, &pos, q.data());
      if (i > 0) query += Since(t0);
    }
    p.query_seconds = std::max(p.query_seconds, query / o.steps);
    constexpr int32_t kGroup = 8;
    const int32_t groups = o.score_rows / kGroup;
    std::vector<int32_t> chosen;
    double total = 0;
    for (int32_t i = 0; i <= o.steps; ++i) {
      const auto t0 = Clock::now();
      gp->SelectGroups(q.data(), klr.data(), 0, groups, kGroup, std::max(1, groups / 13), &chosen);
      if (i > 0) total += Since(t0);
    }
    p.ranks.push_back(gp->rank());
    p.score_seconds_per_row.push_back(total / o.steps / double(o.score_rows));
    advance();
  }
  // Ranks ascending for interpolation.
  for (size_t i = 1; i < p.ranks.size(); ++i)
    for (size_t j = i; j > 0 && p.ranks[j - 1] > p.ranks[j]; --j) {
      std::swap(p.ranks[j - 1], p.ranks[j]);
      std::swap(p.score_seconds_per_row[j - 1], p.score_seconds_per_row[j]);
    }
  if (disk) {
    // The disk policy with every group resident (a budget of the whole cache): what its step
    // costs beyond the modelled parts is its own bookkeeping.
    DiskKvOptions d = *disk;
    const int32_t context = std::max(256, o.attention_tokens / 2);
    d.budget_bytes = int64_t(hp.n_layer) * context * hp.n_head_kv * hp.head_dim * 2 * 2 * 2;
    d.record_type = KvRecordType::kF16;
    double sec = 0;
    std::unique_ptr<Engine> e;
    STRATA_RETURN_IF_ERROR(
        TimeDecode(model, o.threads, o.cuda_device, 1, context, o.steps, &d, &sec, &e));
    if (const auto* kv = dynamic_cast<const DiskKv*>(&e->kv())) {
      const DiskKvPlan& plan = kv->plan();
      DiskStepShape shape;
      shape.n_layer = hp.n_layer;
      shape.attended_tokens = context;
      shape.summary_rows = plan.SummaryRows(context);
      shape.rank = plan.rank;
      shape.selections = hp.n_layer + (d.refine ? std::max(0, hp.n_layer - 2) : 0);
      shape.tail_rows = plan.tail ? context : 0;
      const StepPrediction modelled = PredictDiskStep(DeviceProfile(), p, shape);
      p.disk_overhead_seconds = std::max(0.0, sec - modelled.step_seconds);
    }
    advance();
  }
  *out = std::move(p);
  return Status::OK();
}

StepPrediction PredictDiskStep(const DeviceProfile& device, const ComputeProfile& compute,
                               const DiskStepShape& s) {
  StepPrediction p;
  const double layers = std::max(1, s.n_layer);
  p.compute_seconds = compute.DenseSeconds(s.batch) + double(s.batch) * double(s.attended_tokens) *
                                                          compute.attention_seconds_per_token;
  const double per_row = compute.ScoreSecondsPerRow(s.rank);
  p.select_seconds =
      double(s.batch) *
      (double(s.selections) * (compute.query_seconds + double(s.summary_rows) * per_row) +
       double(s.n_layer) * double(s.tail_rows) * per_row);
  const double requests_l = double(s.batch) * s.requests / layers;
  const uint32_t request_bytes =
      s.requests > 0 ? uint32_t(std::max(1.0, s.bytes / s.requests)) : 4096;
  const double read_l = device.ReadSeconds(requests_l, request_bytes, s.queue_depth);
  p.read_seconds = read_l * layers;
  p.step_seconds = p.select_seconds + layers * std::max(p.compute_seconds / layers, read_l) +
                   compute.disk_overhead_seconds;
  p.tokens_per_second = p.step_seconds > 0 ? s.batch / p.step_seconds : 0;
  return p;
}

StepPrediction PredictMemoryStep(const ComputeProfile& compute, int32_t batch, int32_t context) {
  StepPrediction p;
  p.compute_seconds = compute.DenseSeconds(batch) +
                      double(batch) * double(context) * compute.attention_seconds_per_token;
  p.step_seconds = p.compute_seconds;
  p.tokens_per_second = p.step_seconds > 0 ? batch / p.step_seconds : 0;
  return p;
}

}  // namespace strata
