#include "runtime/kv/disk/group_predictor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>

#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/model_math.h"

namespace strata {
namespace {

// Tokens a scoring task takes (rounded to whole tiles and groups): small enough that an
// 8K context makes ~16 tasks, which the pool balances between a busy and an idle core.
constexpr int64_t kChunkTokens = 512;

}  // namespace

GroupPredictor::GroupPredictor(const Model& model, const AdapterSet& set, GroupScoring scoring,
                               kernels::ScoreType type, ThreadPool* pool)
    : model_(model), set_(set), scoring_(scoring), type_(type), pool_(pool) {}
GroupPredictor::~GroupPredictor() = default;

Status GroupPredictor::Create(const Model& model, const AdapterSet& set, GroupScoring scoring,
                              kernels::ScoreType type, int32_t n_ctx, int32_t max_rows,
                              ThreadPool* pool, std::unique_ptr<GroupPredictor>* out) {
  const HParams& hp = model.hparams();
  if (int32_t(set.layers.size()) != hp.n_layer)
    return Status::InvalidArgument("group predictor: adapters for " +
                                   std::to_string(set.layers.size()) + " layers, model has " +
                                   std::to_string(hp.n_layer));
  std::unique_ptr<GroupPredictor> p(new GroupPredictor(model, set, scoring, type, pool));
  p->rank_ = set.rank;
  p->n_head_ = hp.n_head;
  p->n_rep_ = hp.n_rep();
  p->head_dim_ = hp.head_dim;
  p->row_ = hp.n_head_kv * hp.head_dim;
  p->n_embd_ = hp.n_embd;
  p->scale_ = AttentionScale(hp);
  p->inv_freq_ = RopeInverseFrequencies(model);
  const size_t rows = size_t(std::max(max_rows, 1));
  const size_t q_dim = size_t(hp.n_head) * hp.head_dim;
  p->xn_.resize(rows * hp.n_embd);
  p->q_.resize(rows * q_dim);
  p->cos_sin_.resize(size_t(hp.rope_dim));
  size_t xq_row = 0;
  for (const LayerWeights& L : model.weights().layers)
    xq_row = std::max(xq_row, kernels::RowBytes(kernels::ActivationType(L.wq.type), hp.n_embd));
  p->xq_.resize(rows * xq_row + 64);
  const size_t n = size_t(std::max(n_ctx, 1));
  p->chunk_scores_stride_ = kChunkTokens + 2 * kernels::kScoreTile;
  p->chunk_scores_.resize(size_t(pool->size()) * size_t(hp.n_head) *
                          size_t(p->chunk_scores_stride_));
  p->heads_stride_ = int64_t(n);
  // Sequences select side by side on the pool's workers only when a batch holds two or more.
  p->scores_.resize(max_rows >= 2 ? size_t(pool->size()) : 1);
  for (Scores& sc : p->scores_) {
    sc.heads.resize(size_t(hp.n_head) * n);
    sc.token.resize(n);
    sc.group.resize(n);
    sc.q.resize(size_t(hp.n_head) * set.rank);
    sc.log_norm.resize(size_t(hp.n_head));
  }
  p->key_acc_.resize(size_t(kProjectRows) * size_t(set.rank));
  p->key_mean_.resize(size_t(p->row_));
  p->key_row_.resize(size_t(set.rank));
  *out = std::move(p);
  return Status::OK();
}

uint64_t GroupPredictor::scratch_bytes() const {
  uint64_t b = 0;
  for (const auto* v : {&xn_, &q_, &cos_sin_, &chunk_scores_, &key_acc_, &key_mean_, &key_row_})
    b += v->capacity() * sizeof(float);
  for (const Scores& sc : scores_)
    for (const auto* v :
         {&sc.token, &sc.group, &sc.q, &sc.heads, &sc.log_norm, &sc.runs, &sc.run_mass})
      b += v->capacity() * sizeof(float);
  return b + xq_.capacity();
}

int64_t GroupPredictor::KlrTokens(int64_t n) {
  return (std::max<int64_t>(n, 0) + kernels::kScoreTile - 1) / kernels::kScoreTile *
         kernels::kScoreTile;
}

uint64_t GroupPredictor::KlrBytes(int64_t n, int32_t rank, kernels::ScoreType type) {
  return uint64_t(KlrTokens(n) / kernels::kScoreTile) *
         uint64_t(kernels::ScoreTileBytes(type, rank));
}

void GroupPredictor::ProjectRows(int32_t layer, const float* k, int64_t n, float* out) const {
  kernels::RowsTimesMatrix(k, n, row_, set_.layers[size_t(layer)].data(), rank_, out);
}

void GroupPredictor::ProjectKeys(int32_t layer, const float* k, int64_t n, int64_t p0,
                                 uint8_t* klr) {
  float* acc = key_acc_.data();
  for (int64_t t0 = 0; t0 < n; t0 += kProjectRows) {
    const int64_t m = std::min(kProjectRows, n - t0);
    ProjectRows(layer, k + t0 * row_, m, acc);
    for (int64_t t = 0; t < m; ++t)
      kernels::StoreScoreRow(type_, acc + t * rank_, rank_, p0 + t0 + t, klr);
  }
}

uint64_t GroupPredictor::SpreadBytes(int64_t n) { return uint64_t(KlrTokens(n)) * 2; }

void GroupPredictor::ProjectGroup(int32_t layer, const float* k, int32_t n, int64_t row,
                                  uint8_t* klr, uint16_t* spread) {
  // The projection is linear, so the mean of the keys' rows is the row of their mean.
  float* mean = key_mean_.data();
  std::fill(mean, mean + row_, 0.0f);
  for (int32_t t = 0; t < n; ++t) kernels::Add(mean, k + int64_t(t) * row_, row_);
  const float inv = 1.0f / float(std::max(n, 1));
  for (int32_t i = 0; i < row_; ++i) mean[i] *= inv;
  float* pm = key_row_.data();
  ProjectRows(layer, mean, 1, pm);
  kernels::StoreScoreRow(type_, pm, rank_, row, klr);
  // The spread: each key's own projection against the mean's.
  float* pt = key_acc_.data();
  float worst = 0.0f;
  for (int64_t t0 = 0; t0 < n; t0 += kProjectRows) {
    const int64_t m = std::min(kProjectRows, int64_t(n) - t0);
    ProjectRows(layer, k + t0 * row_, m, pt);
    for (int64_t t = 0; t < m; ++t) {
      float d2 = 0.0f;
      for (int32_t j = 0; j < rank_; ++j) {
        const float d = pt[t * rank_ + j] - pm[j];
        d2 += d * d;
      }
      worst = std::max(worst, d2);
    }
  }
  const float dist = std::sqrt(worst);
  kernels::F32ToF16Row(&dist, spread + row, 1);
}

void GroupPredictor::LowRankQueries(int32_t layer, const float* x, int64_t n,
                                    const int32_t* positions, float* out) {
  const HParams& hp = model_.hparams();
  const LayerWeights& L = model_.cpu_weights().layers[size_t(layer)];
  const int64_t q_dim = int64_t(n_head_) * head_dim_;
  for (int64_t t = 0; t < n; ++t)
    kernels::RmsNorm(x + t * n_embd_, L.attn_norm.f32(), xn_.data() + t * n_embd_, n_embd_,
                     hp.rms_eps);
  const kernels::DType at = kernels::ActivationType(L.wq.type);
  const size_t xq_row = kernels::RowBytes(at, n_embd_);
  for (int64_t t = 0; t < n; ++t)
    kernels::QuantizeActivations(L.wq.type, xn_.data() + t * n_embd_, n_embd_,
                                 xq_.data() + t * xq_row);
  kernels::MatmulArgs a;
  a.wtype = L.wq.type;
  a.w = L.wq.data;
  a.w_row_bytes = L.wq.row_bytes;
  a.k = n_embd_;
  a.xq = xq_.data();
  a.xq_row_bytes = xq_row;
  a.n_tok = n;
  a.y = q_.data();
  a.y_stride = L.wq.rows;
  a.w_layout = L.wq.layout;
  pool_->ParallelRange(L.wq.rows, kernels::kMatmulRowAlign, 1,
                       [&](int64_t r0, int64_t r1, int) { kernels::Matmul(a, r0, r1); });

  const float* adapter = set_.query(layer).data();
  for (int64_t t = 0; t < n; ++t) {
    float* q = q_.data() + t * q_dim;
    RopeCosSin(inv_freq_, positions[t], cos_sin_.data());
    FinishQkv(hp, L, cos_sin_.data(), q, nullptr, nullptr);
    // Head h reads KV head h / n_rep: the n_rep heads of a KV head (adjacent in q and in
    // out) meet only that head's rows of A, in one product.
    for (int32_t g = 0; g < n_head_ / n_rep_; ++g)
      kernels::RowsTimesMatrix(q + g * n_rep_ * head_dim_, n_rep_, head_dim_,
                               adapter + size_t(g) * head_dim_ * rank_, rank_,
                               out + (t * n_head_ + g * n_rep_) * rank_);
  }
}

// y[g] = max of x[g*G .. g*G+G); G a compile-time constant for the common sizes so the
// loop vectorizes over groups.
template <int G>
static void GroupMaxFixed(const float* x, int64_t n_groups, float* y) {
  for (int64_t g = 0; g < n_groups; ++g) {
    float best = x[g * G];
    for (int t = 1; t < G; ++t) best = x[g * G + t] > best ? x[g * G + t] : best;
    y[g] = best;
  }
}

static void GroupMax(const float* x, int64_t n_groups, int32_t group_size, float* y) {
  switch (group_size) {
    case 1:
      std::copy(x, x + n_groups, y);
      return;
    case 2:
      return GroupMaxFixed<2>(x, n_groups, y);
    case 4:
      return GroupMaxFixed<4>(x, n_groups, y);
    case 5:
      return GroupMaxFixed<5>(x, n_groups, y);
    case 8:
      return GroupMaxFixed<8>(x, n_groups, y);
  }
  for (int64_t g = 0; g < n_groups; ++g) {
    const float* s = x + g * group_size;
    float best = s[0];
    for (int32_t t = 1; t < group_size; ++t) best = s[t] > best ? s[t] : best;
    y[g] = best;
  }
}

int64_t GroupPredictor::ChunkTokens(int32_t group_size) {
  const int64_t unit = std::lcm(int64_t(kernels::kScoreTile), int64_t(group_size));
  return unit * std::max<int64_t>(1, kChunkTokens / unit);
}

void GroupPredictor::ReserveGroupSize(int32_t group_size) {
  // A chunk's tokens may start mid-tile; it is scored from its first tile's start. (A large
  // G makes chunks longer than kChunkTokens.)
  const int64_t need = ChunkTokens(group_size) + 2 * kernels::kScoreTile;
  if (need <= chunk_scores_stride_) return;
  chunk_scores_stride_ = need;
  chunk_scores_.resize(size_t(pool_->size()) * size_t(n_head_) * size_t(chunk_scores_stride_));
}

void GroupPredictor::ScoreGroups(Scores& sc, const float* q_lr, const uint8_t* klr, int32_t g0,
                                 int32_t g1, int32_t group_size, RowSpread spread, int worker) {
  const int64_t n_groups = g1 - g0, G = group_size;
  const int64_t t0 = g0 * G, t1 = g1 * G;
  constexpr int64_t T = kernels::kScoreTile;
  // Chunks start at multiples of a token count that is both whole tiles and whole groups, so
  // a chunk reduces its own tokens to group maxima. Each chunk's token scores stay in its
  // worker's scratch: handing them to another core to reduce cost more than the scoring
  // (every line of a shared score buffer moved between cores each call).
  const int64_t chunk = ChunkTokens(group_size);
  const int64_t c0 = t0 / chunk, n_chunks = (t1 + chunk - 1) / chunk - c0;
  // Inside a pool job the scratch must not move under the other workers.
  if (worker < 0) ReserveGroupSize(group_size);
  assert(chunk + 2 * T <= chunk_scores_stride_);
  float* gs = sc.group.data();
  const bool sum = scoring_ == GroupScoring::kSum;
  const float* x = nullptr;
  int64_t n_x = 0;
  if (sum) {
    // The heads' dot products are linear in q, so their sum is one product with the summed
    // query.
    float* q_sum = sc.q.data();
    std::fill(q_sum, q_sum + rank_, 0.0f);
    for (int32_t h = 0; h < n_head_; ++h)
      for (int32_t j = 0; j < rank_; ++j) q_sum[j] += q_lr[h * rank_ + j];
    x = q_sum;
    n_x = 1;
  } else {
    // Every head's scores in one pass over K_lr, the attention scale folded into the queries.
    float* qs = sc.q.data();
    for (int32_t i = 0; i < n_head_ * rank_; ++i) qs[i] = q_lr[i] * scale_;
    x = qs;
    n_x = n_head_;
  }
  // Row h of the per-head group maxima (the summed query's maxima are the scores).
  float* rows = sum ? gs : sc.heads.data();
  const int64_t row_stride = sum ? 0 : heads_stride_;
  auto run_chunk = [&](int64_t c, int w) {
    const int64_t a = std::max(t0, (c0 + c) * chunk), b = std::min(t1, (c0 + c + 1) * chunk);
    const int64_t ta = a / T, tz = (b + T - 1) / T;
    float* tok = chunk_scores_.data() + size_t(w) * chunk_scores_stride_ * n_head_;
    kernels::ScoreTiles(type_, klr, ta, tz, rank_, x, n_x, tok, chunk_scores_stride_);
    for (int64_t h = 0; h < n_x; ++h)
      GroupMax(tok + h * chunk_scores_stride_ + (a - ta * T), (b - a) / G, group_size,
               rows + h * row_stride + (a / G - g0));
  };
  if (worker < 0 && t1 - t0 >= GroupPredictor::kParallelRows) {
    pool_->Run(n_chunks, run_chunk);
  } else {
    for (int64_t c = 0; c < n_chunks; ++c) run_chunk(c, std::max(worker, 0));
  }
  if (spread.f16 && spread.weight != 0.0f) {
    // Each head's (or the summed query's) norm, weighted, times each row's spread.
    float* sp = sc.token.data();  // the rows' spreads as F32
    kernels::F16ToF32Row(spread.f16 + g0, sp, n_groups);
    for (int64_t h = 0; h < n_x; ++h) {
      const float* xh = x + h * rank_;
      float nn = 0.0f;
      for (int32_t j = 0; j < rank_; ++j) nn += xh[j] * xh[j];
      const float w = spread.weight * std::sqrt(nn);
      float* row = rows + h * row_stride;
      for (int64_t g = 0; g < n_groups; ++g) row[g] += w * sp[g];
    }
  }
  if (sum) return;
  // Per head: the group's best token, then a softmax over groups. A group matters when any
  // of its tokens matters to any head, so the max is taken per head before heads are
  // summed; normalizing over groups rather than tokens costs G times fewer exponentials
  // and only rescales each head.
  for (int32_t h = 0; h < n_head_; ++h) {
    float* row = rows + h * row_stride;
    sc.log_norm[size_t(h)] = kernels::SoftmaxInPlace(row, n_groups);  // for TailRatios
    if (h == 0)
      std::copy(row, row + n_groups, gs);
    else
      kernels::Add(gs, row, n_groups);
  }
}

void GroupPredictor::SelectGroups(const float* q_lr, const uint8_t* klr, int32_t g0, int32_t g1,
                                  int32_t group_size, int32_t m, std::vector<int32_t>* out,
                                  std::span<const int32_t> favored, float bonus, RowSpread spread,
                                  std::vector<float>* scores, int worker) {
  out->clear();
  if (scores) scores->clear();
  const int32_t n_groups = g1 - g0;
  if (n_groups <= 0 || m <= 0) return;
  if (m >= n_groups && !scores) {
    for (int32_t g = g0; g < g1; ++g) out->push_back(g);
    return;
  }
  Scores& sc = scores_[size_t(std::max(worker, 0))];
  ScoreGroups(sc, q_lr, klr, g0, g1, group_size, spread, worker);
  // s + bonus * |s| for a positive score (softmax shares always are); a negative raw sum is
  // brought toward zero instead (s / (1 + bonus)), so a favored group never passes one that
  // scored better than it by the sign of its score alone.
  if (bonus != 0.0f)
    for (int32_t g : favored)
      if (g >= g0 && g < g1) {
        float& s = sc.group[size_t(g - g0)];
        s = s >= 0.0f ? s + bonus * s : s / (1.0f + bonus);
      }
  const float* gs = sc.group.data();
  if (m >= n_groups) {
    for (int32_t g = 0; g < n_groups; ++g) {
      out->push_back(g0 + g);
      scores->push_back(gs[g]);
    }
    return;
  }
  // Only the set matters, not its order: the M-th best score by a linear-time partition of
  // a copy, then one ascending scan keeps every group above it and, of the groups equal to
  // it, the oldest (ties go to the older group).
  float* v = sc.token.data();
  std::copy(gs, gs + n_groups, v);
  std::nth_element(v, v + (n_groups - m), v + n_groups);
  const float thr = v[n_groups - m];
  int32_t above = 0;
  for (int32_t g = 0; g < n_groups; ++g) above += gs[g] > thr;
  int32_t ties = m - above;
  for (int32_t g = 0; g < n_groups; ++g)
    if (gs[g] > thr || (gs[g] == thr && ties-- > 0)) {
      out->push_back(g0 + g);
      if (scores) scores->push_back(gs[g]);
    }
}

void GroupPredictor::SpanReadThrough(int32_t g0, int32_t g1, int32_t keep, int32_t span,
                                     std::vector<int32_t>* out, std::vector<float>* scores,
                                     int worker) {
  const int32_t n_groups = g1 - g0, m = int32_t(out->size());
  if (span <= 1 || keep >= m || m >= n_groups || int32_t(scores->size()) != m) return;
  Scores& sc = scores_[size_t(std::max(worker, 0))];
  const float* gs = sc.group.data();  // the last selection's scores, bonus included
  // The keep best of the selection (ties: the older group) stay.
  std::vector<int32_t>& order = sc.order;
  order.resize(size_t(m));
  for (int32_t i = 0; i < m; ++i) order[size_t(i)] = i;
  const std::vector<float>& sv = *scores;
  auto better = [&](int32_t a, int32_t b) {
    return sv[size_t(a)] != sv[size_t(b)] ? sv[size_t(a)] > sv[size_t(b)] : a < b;
  };
  std::vector<uint8_t>& chosen = sc.chosen;
  chosen.assign(size_t(n_groups), 0);
  if (keep > 0) {
    std::nth_element(order.begin(), order.begin() + (keep - 1), order.end(), better);
    for (int32_t i = 0; i < keep; ++i) chosen[size_t((*out)[size_t(order[size_t(i)])] - g0)] = 1;
  }
  // Each span's weight over its groups not kept.
  const bool mass = scoring_ == GroupScoring::kSoftmax;
  const int32_t n_spans = (n_groups + span - 1) / span;
  std::vector<float>& w = sc.span;
  w.assign(size_t(n_spans), mass ? 0.0f : -INFINITY);
  int32_t open = 0;
  for (int32_t g = 0; g < n_groups; ++g) {
    if (chosen[size_t(g)]) continue;
    float& x = w[size_t(g / span)];
    x = mass ? x + gs[g] : std::max(x, gs[g]);
    ++open;
  }
  // Heaviest first; of equal weights the newer span (in practice only spans with nothing
  // left to take, which add no group, tie).
  order.resize(size_t(n_spans));
  for (int32_t i = 0; i < n_spans; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return w[size_t(a)] != w[size_t(b)] ? w[size_t(a)] > w[size_t(b)] : a > b;
  });
  // Whole spans while they fit; the span that does not gets its best groups.
  int32_t left = std::min(m - keep, open);
  for (int32_t i = 0; i < n_spans && left > 0; ++i) {
    const int32_t a = order[size_t(i)] * span, z = std::min(n_groups, a + span);
    int32_t free = 0;
    for (int32_t g = a; g < z; ++g) free += !chosen[size_t(g)];
    if (free <= left) {
      for (int32_t g = a; g < z; ++g) chosen[size_t(g)] |= 2;
      left -= free;
      continue;
    }
    for (; left > 0; --left) {
      int32_t best = -1;
      for (int32_t g = a; g < z; ++g)
        if (!chosen[size_t(g)] && (best < 0 || gs[g] > gs[best])) best = g;
      chosen[size_t(best)] = 2;
    }
  }
  out->clear();
  scores->clear();
  for (int32_t g = 0; g < n_groups; ++g)
    if (chosen[size_t(g)]) {
      out->push_back(g0 + g);
      scores->push_back(gs[g]);
    }
}

void GroupPredictor::TailRatios(const uint8_t* klr, int32_t g0, int32_t g1,
                                std::span<const int32_t> attended,
                                std::span<const TokenRun> outside, int worker, float* ratio) {
  assert(scoring_ == GroupScoring::kSoftmax && g1 > g0);
  (void)g1;
  Scores& sc = scores_[size_t(std::max(worker, 0))];
  // The shares sum to 1 over [g0, g1), so the left-out share is what the attended groups
  // leave: only they are visited.
  for (int32_t h = 0; h < n_head_; ++h) {
    const float* share = sc.heads.data() + h * heads_stride_;
    float att = 0.0f;
    for (int32_t g : attended) att += share[g - g0];
    ratio[h] = att;
  }
  // The outside runs: each head's best score among a run's tokens, with the queries the
  // selection left in sc.q (attention scale folded in), as a share exp(best - log norm).
  constexpr int64_t T = kernels::kScoreTile;
  int64_t tiles = 0;
  for (const TokenRun& r : outside)
    if (r.end > r.begin) tiles = std::max(tiles, (r.end + T - 1) / T - r.begin / T);
  const int64_t stride = tiles * T;
  sc.runs.resize(size_t(n_head_) * size_t(stride));
  std::vector<float>& mass = sc.run_mass;
  mass.assign(size_t(n_head_), 0.0f);
  for (const TokenRun& r : outside) {
    if (r.end <= r.begin) continue;
    const int64_t ta = r.begin / T, tz = (r.end + T - 1) / T;
    kernels::ScoreTiles(type_, klr, ta, tz, rank_, sc.q.data(), n_head_, sc.runs.data(), stride);
    for (int32_t h = 0; h < n_head_; ++h) {
      const float* y = sc.runs.data() + size_t(h) * stride;  // token ta * T first
      float m = y[r.begin - ta * T];
      for (int64_t t = r.begin + 1; t < r.end; ++t) m = std::max(m, y[t - ta * T]);
      mass[size_t(h)] += std::exp(m - sc.log_norm[size_t(h)]);
    }
  }
  for (int32_t h = 0; h < n_head_; ++h) {
    const float att = ratio[h] + mass[size_t(h)];
    ratio[h] = att > 0.0f ? std::max(0.0f, 1.0f - ratio[h]) / att : 0.0f;
  }
}

}  // namespace strata
