#include "tuner/calibration.h"

#include <lapacke.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/file.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/disk/group_predictor.h"
#include "runtime/kv/memory_kv.h"

namespace strata {
namespace {

// A memory KV policy that also keeps a copy of every key it is given, per layer.
class KeyRecorder final : public KvPolicy {
 public:
  KeyRecorder(std::unique_ptr<MemoryKv> inner, int32_t capacity)
      : inner_(std::move(inner)),
        capacity_(capacity),
        keys_(size_t(inner_->shape().n_layer)),
        key_base_(size_t(inner_->shape().n_layer), 0) {}

  const char* name() const override { return "key-recorder"; }
  const KvShape& shape() const override { return inner_->shape(); }
  Status AddSequence(SeqId* out) override { return inner_->AddSequence(out); }
  Status RemoveSequence(SeqId seq) override { return inner_->RemoveSequence(seq); }
  int32_t Length(SeqId seq) const override { return inner_->Length(seq); }
  Status BeginBatch(std::span<const BatchSeq> batch) override {
    batch_.assign(batch.begin(), batch.end());
    return inner_->BeginBatch(batch);
  }
  Status Append(int32_t layer, SeqId seq, const float* k, const float* v) override {
    std::vector<float>& dst = keys_[size_t(layer)];
    const size_t row = size_t(shape().row());
    const size_t room = size_t(capacity_) * row - std::min(dst.size(), size_t(capacity_) * row);
    int32_t n_new = 0, pos0 = 0;
    for (const BatchSeq& b : batch_)
      if (b.seq == seq) n_new = b.n_new, pos0 = b.pos0;
    // Keys of position p of this sequence sit at index base + p.
    if (pos0 == 0) key_base_[size_t(layer)] = int64_t(dst.size() / row);
    dst.insert(dst.end(), k, k + std::min(room, size_t(n_new) * row));
    if (!pending_.empty()) {  // the profile needs the values too
      std::vector<float>& vals = values_[size_t(layer)];
      vals.insert(vals.end(), v, v + std::min(room, size_t(n_new) * row));
    }
    MeasurePending(layer);
    return inner_->Append(layer, seq, k, v);
  }
  Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override {
    return inner_->View(layer, seq, out);
  }
  // x enters layer-1 (the embeddings for layer 0): the input the disk policy predicts
  // layer's groups from, so the queries it yields are the ones the adapters will meet.
  Status Prepare(int32_t layer, const float* x, int64_t n_embd) override {
    if (layer < 0 || layer >= shape().n_layer) return Status::OK();
    int32_t n = 0;
    positions_.clear();
    for (const BatchSeq& b : batch_)
      for (int32_t i = 0; i < b.n_new; ++i) positions_.push_back(b.pos0 + i);
    SampleProfileQueries(layer, x, n_embd);
    if (query_cov_.empty()) return Status::OK();
    n = std::min(int32_t(positions_.size()), capacity_ - query_rows_[size_t(layer)]);
    if (n <= 0) return Status::OK();
    (void)n_embd;
    const int32_t row = shape().row(), d = shape().head_dim, n_head = queries_->n_head();
    q_.resize(size_t(n) * n_head * row);
    queries_->LowRankQueries(layer, x, n, positions_.data(), q_.data());
    // Head h lives in its KV head's block of the embedded query: accumulate v v^T there.
    std::vector<float> acc(size_t(shape().n_head_kv) * d * d, 0.0f);
    const int32_t n_rep = n_head / shape().n_head_kv;
    for (int32_t t = 0; t < n; ++t)
      for (int32_t h = 0; h < n_head; ++h) {
        const int32_t g = h / n_rep;
        const float* v = q_.data() + (size_t(t) * n_head + h) * row + size_t(g) * d;
        float* blk = acc.data() + size_t(g) * d * d;
        for (int32_t i = 0; i < d; ++i) {
          const float vi = v[i];
          float* r = blk + size_t(i) * d;
          for (int32_t j = 0; j < d; ++j) r[j] += vi * v[j];
        }
      }
    std::vector<double>& sq = query_cov_[size_t(layer)];
    for (int32_t g = 0; g < shape().n_head_kv; ++g)
      for (int32_t i = 0; i < d; ++i)
        for (int32_t j = 0; j < d; ++j)
          sq[size_t(g * d + i) * row + size_t(g * d + j)] += acc[(size_t(g) * d + i) * d + j];
    query_rows_[size_t(layer)] += n;
    return Status::OK();
  }
  Status EndBatch() override { return inner_->EndBatch(); }
  void AbortBatch() override { inner_->AbortBatch(); }
  KvCounters counters() const override { return inner_->counters(); }

  const std::vector<float>& keys(int32_t layer) const { return keys_[size_t(layer)]; }
  const std::vector<double>& query_cov(int32_t layer) const { return query_cov_[size_t(layer)]; }

  // Forms the queries the policy will form at run time (full rank), for the attention
  // profile and, with covariance, for the query-aware fit; the engine's pool does the matmuls.
  Status EnableQueries(const Model& model, ThreadPool* pool, int32_t max_rows, bool covariance,
                       int32_t window, int32_t samples) {
    const int32_t row = shape().row(), n_layer = shape().n_layer;
    identity_.ratio = 1;
    identity_.rank = row;
    std::vector<float> eye(size_t(row) * row, 0.0f);
    for (int32_t i = 0; i < row; ++i) eye[size_t(i) * row + i] = 1.0f;
    identity_.layers.assign(size_t(n_layer), eye);
    if (covariance) {
      query_cov_.assign(size_t(n_layer), std::vector<double>(size_t(row) * row, 0.0));
      query_rows_.assign(size_t(n_layer), 0);
    }
    // Profile samples: `samples` positions spread evenly over the second half of each
    // window, where the context is long enough to resemble long-context decoding.
    sample_lo_ = window / 2;
    sample_step_ = std::max(1, (window - sample_lo_) / std::max(1, samples));
    profile_tokens_ = AttentionProfile::DefaultTokens();
    err_sq_.assign(size_t(n_layer), std::vector<double>(profile_tokens_.size(), 0.0));
    out_sq_.assign(size_t(n_layer), 0.0);
    measured_.assign(size_t(n_layer), 0);
    values_.assign(size_t(n_layer), {});
    pending_.assign(size_t(n_layer), {});
    return GroupPredictor::Create(model, identity_, GroupScoring::kSum, kernels::ScoreType::kF16, 1,
                                  max_rows, pool, &queries_);
  }

  // Per layer and point, the relative error of the attention output: the root of the
  // summed squared errors over the summed squared full outputs (empty when nothing was
  // measured).
  AttentionProfile Profile() const {
    AttentionProfile p;
    for (int64_t m : measured_)
      if (m == 0) return p;
    p.tokens = profile_tokens_;
    for (size_t l = 0; l < err_sq_.size(); ++l) {
      std::vector<float> e(err_sq_[l].size());
      for (size_t i = 0; i < e.size(); ++i)
        e[i] = float(std::min(double(AttentionProfile::kMaxError),
                              std::sqrt(err_sq_[l][i] / std::max(out_sq_[l], 1e-30))));
      // More groups need not always mean less error for one query, but should on average;
      // keep the curve monotone so the planner's greedy spread is well defined.
      for (size_t i = 1; i < e.size(); ++i) e[i] = std::min(e[i], e[i - 1]);
      p.error.push_back(std::move(e));
    }
    return p;
  }

 private:
  std::unique_ptr<MemoryKv> inner_;
  const int32_t capacity_;
  std::vector<BatchSeq> batch_;
  std::vector<std::vector<float>> keys_;
  // Query-aware calibration.
  AdapterSet identity_;
  std::unique_ptr<GroupPredictor> queries_;
  std::vector<std::vector<double>> query_cov_;
  std::vector<int32_t> query_rows_;
  std::vector<int32_t> positions_;
  std::vector<float> q_;

  // Attention profile.
  struct Sample {
    int32_t pos;
    std::vector<float> q;  // [n_head][row]: head h's query in its KV head's block
  };
  void SampleProfileQueries(int32_t layer, const float* x, int64_t n_embd) {
    if (pending_.empty()) return;
    for (const BatchSeq& b : batch_)  // a new window: what the last one left is void
      if (b.pos0 == 0) pending_[size_t(layer)].clear();
    rows_.clear();
    for (size_t t = 0; t < positions_.size(); ++t) {
      const int32_t p = positions_[t];
      if (p >= sample_lo_ && (p - sample_lo_) % sample_step_ == 0) rows_.push_back(int32_t(t));
    }
    if (rows_.empty()) return;
    const int32_t row = shape().row(), n_head = queries_->n_head();
    xs_.resize(rows_.size() * size_t(n_embd));
    pos_.clear();
    for (size_t j = 0; j < rows_.size(); ++j) {
      std::copy_n(x + size_t(rows_[j]) * n_embd, n_embd, xs_.data() + j * n_embd);
      pos_.push_back(positions_[size_t(rows_[j])]);
    }
    qs_.resize(rows_.size() * n_head * row);
    queries_->LowRankQueries(layer, xs_.data(), int64_t(rows_.size()), pos_.data(), qs_.data());
    for (size_t j = 0; j < rows_.size(); ++j)
      pending_[size_t(layer)].push_back(
          {pos_[j], std::vector<float>(qs_.begin() + ptrdiff_t(j * n_head * row),
                                       qs_.begin() + ptrdiff_t((j + 1) * n_head * row))});
  }

  // Scores each pending sample of `layer` whose keys have all arrived against keys 0..pos of
  // its window and, per head, compares the attention output over the sink group, the newest
  // group and the n heaviest other groups with the full output, for n at every profile
  // point: squared errors and squared full outputs are summed per layer.
  void MeasurePending(int32_t layer) {
    if (pending_.empty()) return;
    std::vector<Sample>& pend = pending_[size_t(layer)];
    const std::vector<float>& keys = keys_[size_t(layer)];
    const std::vector<float>& vals = values_[size_t(layer)];
    const int32_t row = shape().row(), d = shape().head_dim, n_head = queries_->n_head();
    const int32_t n_rep = n_head / shape().n_head_kv, G = AttentionProfile::kGroupSize;
    const float scale = 1.0f / std::sqrt(float(d));
    const int64_t base = key_base_[size_t(layer)];
    const int64_t have = int64_t(keys.size() / size_t(row)) - base;
    full_.resize(size_t(d));
    acc_.resize(size_t(d));
    for (auto it = pend.begin(); it != pend.end();) {
      const int32_t p = it->pos;
      if (p >= have) {  // its keys are not all here yet (or were beyond the capacity)
        ++it;
        continue;
      }
      const int32_t n_groups = p / G;  // full groups before the newest (partial) one
      for (int32_t h = 0; h < n_head; ++h) {
        const int32_t g = h / n_rep;
        const float* q = it->q.data() + size_t(h) * row + size_t(g) * d;
        auto key = [&](int32_t j) { return keys.data() + size_t(base + j) * row + size_t(g) * d; };
        auto val = [&](int32_t j) { return vals.data() + size_t(base + j) * row + size_t(g) * d; };
        score_.resize(size_t(p) + 1);
        float mx = -INFINITY;
        for (int32_t j = 0; j <= p; ++j) {
          float dot = 0;
          for (int32_t i = 0; i < d; ++i) dot += q[i] * key(j)[i];
          score_[size_t(j)] = dot * scale;
          mx = std::max(mx, score_[size_t(j)]);
        }
        for (float& v : score_) v = std::exp(v - mx);
        std::fill(full_.begin(), full_.end(), 0.0);
        std::fill(acc_.begin(), acc_.end(), 0.0);
        double total = 0, w = 0;
        auto add = [&](int32_t j, std::vector<double>& to) {
          for (int32_t i = 0; i < d; ++i) to[size_t(i)] += double(score_[size_t(j)]) * val(j)[i];
        };
        for (int32_t j = 0; j <= p; ++j) {
          add(j, full_);
          total += score_[size_t(j)];
        }
        // Always read: the sink group (once complete) and the newest tokens.
        const int32_t sink_end = n_groups >= 1 ? G : 0;
        for (int32_t j = 0; j <= p; ++j)
          if (j < sink_end || j >= n_groups * G) {
            add(j, acc_);
            w += score_[size_t(j)];
          }
        order_.clear();
        for (int32_t gi = 1; gi < n_groups; ++gi) {
          double m = 0;
          for (int32_t j = gi * G; j < gi * G + G; ++j) m += score_[size_t(j)];
          order_.push_back({m, gi});
        }
        std::sort(order_.begin(), order_.end(), std::greater<>());
        double full_sq = 0;
        for (int32_t i = 0; i < d; ++i) full_sq += std::pow(full_[size_t(i)] / total, 2);
        size_t taken = 0;
        for (size_t i = 0; i < profile_tokens_.size(); ++i) {
          const size_t want = std::min(order_.size(), size_t(profile_tokens_[i] / G));
          for (; taken < want; ++taken) {
            const int32_t j0 = order_[taken].second * G;
            for (int32_t j = j0; j < j0 + G; ++j) {
              add(j, acc_);
              w += score_[size_t(j)];
            }
          }
          double err = 0;
          for (int32_t c = 0; c < d; ++c)
            err += std::pow(acc_[size_t(c)] / w - full_[size_t(c)] / total, 2);
          err_sq_[size_t(layer)][i] += err;
        }
        out_sq_[size_t(layer)] += full_sq;
        ++measured_[size_t(layer)];
      }
      it = pend.erase(it);
    }
  }

  int32_t sample_lo_ = 0, sample_step_ = 1;
  std::vector<int32_t> profile_tokens_;
  std::vector<std::vector<double>> err_sq_;  // [layer][point]
  std::vector<double> out_sq_;               // [layer]
  std::vector<int64_t> measured_;
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<Sample>> pending_;
  std::vector<int64_t> key_base_;
  std::vector<int32_t> rows_, pos_;
  std::vector<float> xs_, qs_, score_;
  std::vector<double> full_, acc_;
  std::vector<std::pair<double, int32_t>> order_;
};

Status ReadText(const CalibrationOptions& o, std::string* text) {
  std::string all;
  STRATA_RETURN_IF_ERROR(ReadRegularFile(o.text_path, "calibration text", kMaxTextBytes, &all));
  size_t end = size_t(double(all.size()) * o.text_fraction);
  // Cut at a line end so no UTF-8 character is split.
  while (end > 0 && end < all.size() && all[end - 1] != '\n') --end;
  *text = all.substr(0, end);
  return Status::OK();
}

}  // namespace

Status LowRankProjection(const std::vector<float>& keys, int32_t n, int32_t row, int32_t rank,
                         std::vector<float>* a) {
  if (n < row)
    return Status::InvalidArgument("calibration: " + std::to_string(n) +
                                   " keys are fewer than the key width " + std::to_string(row) +
                                   "; give more text or tokens");
  if (rank < 1 || rank > row)
    return Status::OutOfRange("calibration: rank " + std::to_string(rank) +
                              " is out of range [1, " + std::to_string(row) + "]");
  std::vector<double> m(size_t(n) * row);
  for (size_t i = 0; i < m.size(); ++i) m[i] = keys[i];
  const size_t w = size_t(row);
  std::vector<double> s(w), vt(w * w), superb(w);
  const lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'S', n, row, m.data(), row,
                                         s.data(), nullptr, 1, vt.data(), row, superb.data());
  if (info != 0)
    return Status::Internal("calibration: LAPACKE_dgesvd failed (info " + std::to_string(info) +
                            ")");
  // Rows of vt are the right singular vectors, by descending singular value.
  a->assign(size_t(row) * rank, 0.0f);
  for (int32_t i = 0; i < row; ++i)
    for (int32_t j = 0; j < rank; ++j) (*a)[size_t(i) * rank + j] = float(vt[size_t(j) * row + i]);
  return Status::OK();
}

Status QueryAwareProjection(const std::vector<double>& key_cov,
                            const std::vector<double>& query_cov, int32_t row,
                            const std::vector<int32_t>& ranks, std::vector<std::vector<float>>* a,
                            std::vector<std::vector<float>>* b) {
  const size_t n = size_t(row);
  // Cholesky factors of both covariances, with a ridge so a dimension nothing uses keeps
  // them positive definite.
  auto factor = [&](const std::vector<double>& cov, const char* what, std::vector<double>* l) {
    double trace = 0;
    for (size_t i = 0; i < n; ++i) trace += cov[i * n + i];
    *l = cov;
    const double ridge = 1e-6 * trace / double(n) + 1e-12;
    for (size_t i = 0; i < n; ++i) (*l)[i * n + i] += ridge;
    const lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', row, l->data(), row);
    if (info != 0)
      return Status::Internal(std::string("calibration: Cholesky of the ") + what +
                              " covariance failed (info " + std::to_string(info) + ")");
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) (*l)[i * n + j] = 0;
    return Status::OK();
  };
  std::vector<double> lk, lq;
  STRATA_RETURN_IF_ERROR(factor(key_cov, "key", &lk));
  STRATA_RETURN_IF_ERROR(factor(query_cov, "query", &lq));
  // E[(q^T (I - W) k)^2] = ||Lq^T (I - W) Lk||^2 for independent q, k: the best rank-r W
  // makes Lq^T W Lk the truncated SVD U_r S_r V_r^T of M = Lq^T Lk, i.e.
  // W = (Lq^-T U_r S_r)(Lk^-T V_r)^T = B A^T.
  std::vector<double> m(n * n, 0.0);
  for (size_t p = 0; p < n; ++p)
    for (size_t i = 0; i < n; ++i) {
      const double q = lq[p * n + i];
      if (q == 0) continue;
      for (size_t j = 0; j < n; ++j) m[i * n + j] += q * lk[p * n + j];
    }
  std::vector<double> s(n), u(n * n), vt(n * n), superb(n);
  lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', row, row, m.data(), row, s.data(),
                                   u.data(), row, vt.data(), row, superb.data());
  if (info != 0)
    return Status::Internal("calibration: LAPACKE_dgesvd failed (info " + std::to_string(info) +
                            ")");
  a->clear();
  b->clear();
  for (int32_t r : ranks) {
    std::vector<double> xa(n * size_t(r)), xb(n * size_t(r));
    for (size_t i = 0; i < n; ++i)
      for (int32_t j = 0; j < r; ++j) {
        xa[i * r + j] = vt[size_t(j) * n + i];
        xb[i * r + j] = u[i * n + size_t(j)] * s[size_t(j)];
      }
    info = LAPACKE_dtrtrs(LAPACK_ROW_MAJOR, 'L', 'T', 'N', row, r, lk.data(), row, xa.data(), r);
    if (info == 0)
      info = LAPACKE_dtrtrs(LAPACK_ROW_MAJOR, 'L', 'T', 'N', row, r, lq.data(), row, xb.data(), r);
    if (info != 0)
      return Status::Internal("calibration: triangular solve failed (info " + std::to_string(info) +
                              ")");
    a->emplace_back(xa.begin(), xa.end());
    b->emplace_back(xb.begin(), xb.end());
  }
  return Status::OK();
}

Status Calibrate(const Model& model, const CalibrationOptions& o, Adapters* out,
                 const std::function<void(const std::string&)>& progress) {
  const HParams& hp = model.hparams();
  const int32_t row = hp.n_head_kv * hp.head_dim;
  if (o.ratios.empty()) return Status::InvalidArgument("calibrate: no ratios given");
  if (!(o.text_fraction > 0 && o.text_fraction <= 1))
    return Status::OutOfRange("calibrate: text fraction " + std::to_string(o.text_fraction) +
                              " is out of range (0, 1]");
  if (o.window < 1 || o.tokens < row)
    return Status::OutOfRange("calibrate: window " + std::to_string(o.window) + " and tokens " +
                              std::to_string(o.tokens) +
                              " must be >= 1 and >= " + std::to_string(row) + " (the key width)");
  std::vector<int32_t> ranks;
  for (int32_t r : o.ratios) {
    int32_t rank = 0;
    STRATA_RETURN_IF_ERROR(RankForRatio(row, r, &rank).WithContext("calibrate --ratios"));
    ranks.push_back(rank);
  }
  std::string text;
  STRATA_RETURN_IF_ERROR(ReadText(o, &text));
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(model.tokenizer().Encode(text, false, false, &ids));
  if (int64_t(ids.size()) < o.tokens)
    return Status::InvalidArgument("calibrate: the first " + std::to_string(o.text_fraction) +
                                   " of " + o.text_path + " holds " + std::to_string(ids.size()) +
                                   " tokens, fewer than the " + std::to_string(o.tokens) +
                                   " asked for");

  const int32_t window = std::min(o.window, hp.n_ctx_train > 0 ? hp.n_ctx_train : o.window);
  EngineOptions eo;
  eo.n_threads = o.threads;
  eo.n_ctx = window;
  std::unique_ptr<MemoryKv> mem;
  STRATA_RETURN_IF_ERROR(
      MemoryKv::Create({hp.n_layer, hp.n_head_kv, hp.head_dim, window}, 1, &mem));
  auto recorder = std::make_unique<KeyRecorder>(std::move(mem), o.tokens);
  KeyRecorder* rec = recorder.get();
  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, std::move(recorder), &engine));
  STRATA_RETURN_IF_ERROR(rec->EnableQueries(model, &engine->pool(), eo.n_batch, o.query_aware,
                                            window, o.profile_samples));
  std::vector<float> logits;
  for (int32_t start = 0; start < o.tokens; start += window) {
    const int32_t n = std::min(window, o.tokens - start);
    SeqId seq;
    STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
    if (progress)
      progress("collecting keys of tokens " + std::to_string(start) + ".." +
               std::to_string(start + n));
    STRATA_RETURN_IF_ERROR(
        engine->Prefill(seq, std::span<const int32_t>(ids.data() + start, size_t(n)), &logits));
    STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
  }

  Adapters a;
  a.model_identity = model.identity();
  a.n_layer = hp.n_layer;
  a.n_head_kv = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.calibration_tokens = uint64_t(o.tokens);
  a.note = std::string(o.query_aware ? "query-aware fit to post-RoPE keys and queries"
                                     : "SVD of post-RoPE keys") +
           " of " + std::to_string(o.tokens) + " tokens (windows of " + std::to_string(window) +
           ") from the first " + std::to_string(int(std::lround(o.text_fraction * 100))) + "% of " +
           o.text_path;
  for (size_t i = 0; i < o.ratios.size(); ++i)
    a.sets.push_back(AdapterSet{o.ratios[i], ranks[i], {}, {}});
  a.profile = rec->Profile();
  const int32_t max_rank = *std::max_element(ranks.begin(), ranks.end());
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    if (o.query_aware) {
      if (progress) progress("query-aware fit of layer " + std::to_string(l));
      const std::vector<float>& k = rec->keys(l);
      std::vector<double> key_cov(size_t(row) * row, 0.0);
      std::vector<float> acc(size_t(row) * row);
      for (int32_t t0 = 0; t0 < o.tokens; t0 += 256) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int32_t t = t0; t < std::min(o.tokens, t0 + 256); ++t) {
          const float* kt = k.data() + size_t(t) * row;
          for (int32_t i = 0; i < row; ++i) {
            const float ki = kt[i];
            float* r = acc.data() + size_t(i) * row;
            for (int32_t j = 0; j < row; ++j) r[j] += ki * kt[j];
          }
        }
        for (size_t i = 0; i < acc.size(); ++i) key_cov[i] += acc[i];
      }
      std::vector<std::vector<float>> as, bs;
      STRATA_RETURN_IF_ERROR(
          QueryAwareProjection(key_cov, rec->query_cov(l), row, ranks, &as, &bs));
      for (size_t i = 0; i < a.sets.size(); ++i) {
        a.sets[i].layers.push_back(std::move(as[i]));
        a.sets[i].queries.push_back(std::move(bs[i]));
      }
      continue;
    }
    if (progress) progress("SVD of layer " + std::to_string(l) + " keys");
    std::vector<float> full;
    STRATA_RETURN_IF_ERROR(LowRankProjection(rec->keys(l), o.tokens, row, max_rank, &full));
    // The leading vectors of every smaller rank are a prefix of the largest one's.
    for (AdapterSet& set : a.sets) {
      std::vector<float> m(size_t(row) * set.rank);
      for (int32_t i = 0; i < row; ++i)
        for (int32_t j = 0; j < set.rank; ++j)
          m[size_t(i) * set.rank + j] = full[size_t(i) * max_rank + j];
      set.layers.push_back(std::move(m));
    }
  }
  *out = std::move(a);
  return Status::OK();
}

}  // namespace strata
