#include "runtime/kv/group_predictor.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/kernels.h"
#include "runtime/engine/thread_pool.h"
#include "runtime/model/model.h"

namespace strata {
namespace {

// e^x for x <= 0 through 2^t = 2^floor(t) * 2^frac(t), the fraction by its Taylor series to
// degree 5 (relative error below 2e-4): ranking groups needs no more, and a branch-free
// loop of this lets the compiler vectorize it, which std::exp does not allow.
inline float ExpNonPositive(float x) {
  // Written as compare-selects the compiler turns into vector max/compare instructions.
  const float xc = x > -80.0f ? x : -80.0f;
  const float t = xc * 1.44269504f;
  const int32_t ti = int32_t(t);
  const int32_t fi = ti - int32_t(float(ti) > t);
  const float f = t - float(fi);
  const float p =
      1.0f + f * (0.69314718f +
                  f * (0.24022651f + f * (0.05550411f + f * (0.00961813f + f * 0.00133336f))));
  return p * std::bit_cast<float>(uint32_t(fi + 127) << 23);
}

// Below this many K_lr rows a scoring matmul runs on the engine thread alone.
constexpr int64_t kParallelRows = 4096;

}  // namespace

GroupPredictor::GroupPredictor(const Model& model, const AdapterSet& set, GroupScoring scoring,
                               ThreadPool* pool)
    : model_(model), set_(set), scoring_(scoring), pool_(pool) {}
GroupPredictor::~GroupPredictor() = default;

Status GroupPredictor::Create(const Model& model, const AdapterSet& set, GroupScoring scoring,
                              int32_t n_ctx, int32_t max_rows, ThreadPool* pool,
                              std::unique_ptr<GroupPredictor>* out) {
  const HParams& hp = model.hparams();
  if (int32_t(set.layers.size()) != hp.n_layer)
    return Status::InvalidArgument("group predictor: adapters for " +
                                   std::to_string(set.layers.size()) + " layers, model has " +
                                   std::to_string(hp.n_layer));
  std::unique_ptr<GroupPredictor> p(new GroupPredictor(model, set, scoring, pool));
  p->rank_ = set.rank;
  p->n_head_ = hp.n_head;
  p->n_rep_ = hp.n_rep();
  p->head_dim_ = hp.head_dim;
  p->row_ = hp.n_head_kv * hp.head_dim;
  p->n_embd_ = hp.n_embd;
  p->scale_ = 1.0f / std::sqrt(float(hp.head_dim));
  const int32_t half = hp.rope_dim / 2;
  p->inv_freq_.resize(size_t(half));
  const float* factors =
      model.weights().rope_freqs.present() ? model.weights().rope_freqs.f32() : nullptr;
  for (int32_t i = 0; i < half; ++i) {
    double f = std::pow(double(hp.rope_base), -2.0 * i / hp.rope_dim) * hp.rope_freq_scale;
    if (factors) f /= factors[i];
    p->inv_freq_[size_t(i)] = float(f);
  }
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
  p->heads_.resize(size_t(hp.n_head) * n);
  p->token_score_.resize(n);
  p->group_score_.resize(n);
  p->top_.resize(n);
  p->key_acc_.resize(size_t(set.rank));
  *out = std::move(p);
  return Status::OK();
}

uint64_t GroupPredictor::scratch_bytes() const {
  uint64_t b = 0;
  for (const auto* v : {&xn_, &q_, &cos_sin_, &heads_, &token_score_, &group_score_, &key_acc_})
    b += v->capacity() * sizeof(float);
  return b + xq_.capacity() + top_.capacity() * sizeof(int32_t);
}

void GroupPredictor::ProjectKeys(int32_t layer, const float* k, int64_t n, uint16_t* out) {
  const float* a = set_.layers[size_t(layer)].data();
  const int32_t r = rank_;
  for (int64_t t = 0; t < n; ++t) {
    float* acc = key_acc_.data();
    std::fill(acc, acc + r, 0.0f);
    const float* kt = k + t * row_;
    for (int32_t i = 0; i < row_; ++i) {
      const float ki = kt[i];
      const float* ai = a + size_t(i) * r;
      for (int32_t j = 0; j < r; ++j) acc[j] += ki * ai[j];
    }
    kernels::F32ToF16Row(acc, out + t * r, r);
  }
}

void GroupPredictor::LowRankQueries(int32_t layer, const float* x, int64_t n,
                                    const int32_t* positions, float* out) {
  const HParams& hp = model_.hparams();
  const LayerWeights& L = model_.weights().layers[size_t(layer)];
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
  pool_->ParallelRange(L.wq.rows, kernels::kMatmulRowAlign, 1,
                       [&](int64_t r0, int64_t r1, int) { kernels::Matmul(a, r0, r1); });

  const float* adapter = set_.query(layer).data();
  const int32_t half = hp.rope_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    float* q = q_.data() + t * q_dim;
    if (hp.has_qkv_bias) kernels::Add(q, L.bq.f32(), q_dim);
    if (hp.has_qk_norm)
      for (int32_t h = 0; h < n_head_; ++h)
        kernels::RmsNorm(q + h * head_dim_, L.q_norm.f32(), q + h * head_dim_, head_dim_,
                         hp.rms_eps);
    const double pos = double(positions[t]);
    for (int32_t j = 0; j < half; ++j) {
      const double ang = pos * inv_freq_[size_t(j)];
      cos_sin_[size_t(2 * j)] = float(std::cos(ang));
      cos_sin_[size_t(2 * j + 1)] = float(std::sin(ang));
    }
    kernels::RopeApply(q, n_head_, head_dim_, hp.rope_dim, cos_sin_.data(), hp.rope_layout);
    // Head h reads KV head h / n_rep: its query meets only that head's rows of A.
    for (int32_t h = 0; h < n_head_; ++h) {
      float* o = out + (t * n_head_ + h) * rank_;
      std::fill(o, o + rank_, 0.0f);
      const float* qh = q + h * head_dim_;
      const float* ah = adapter + size_t(h / n_rep_) * head_dim_ * rank_;
      for (int32_t i = 0; i < head_dim_; ++i) {
        const float qi = qh[i];
        const float* ai = ah + size_t(i) * rank_;
        for (int32_t j = 0; j < rank_; ++j) o[j] += qi * ai[j];
      }
    }
  }
}

// Largest of n floats with eight running maxima, so the loop vectorizes.
static float MaxOf(const float* x, int64_t n) {
  float m[8];
  for (float& v : m) v = x[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  for (int j = 1; j < 8; ++j) m[0] = m[j] > m[0] ? m[j] : m[0];
  return m[0];
}

// x = exp((x - m) * scale) in place; returns the sum.
static float ExpInPlace(float* x, int64_t n, float m, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] = ExpNonPositive((x[i] - m) * scale);
  float z[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) z[j] += x[i + j];
  for (; i < n; ++i) z[0] += x[i];
  float sum = 0;
  for (float v : z) sum += v;
  return sum;
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

void GroupPredictor::ScoreGroups(const float* q_lr, const uint16_t* klr, int64_t n_groups,
                                 int32_t group_size) {
  const int64_t n = n_groups * group_size;
  float* gs = group_score_.data();
  if (scoring_ == GroupScoring::kSum) {
    // The heads' dot products are linear in q, so their sum is one product with the summed
    // query.
    float* q_sum = key_acc_.data();
    std::fill(q_sum, q_sum + rank_, 0.0f);
    for (int32_t h = 0; h < n_head_; ++h)
      for (int32_t j = 0; j < rank_; ++j) q_sum[j] += q_lr[h * rank_ + j];
    kernels::MatVecF16(klr, n, rank_, rank_, q_sum, heads_.data());
    GroupMax(heads_.data(), n_groups, group_size, gs);
    return;
  }
  // Every head's scores in one pass over K_lr: the summary rows are the "weights", the
  // heads' low-rank queries the "tokens" of a float matmul.
  kernels::MatmulArgs a;
  a.wtype = kernels::DType::kF16;
  a.w = klr;
  a.w_row_bytes = size_t(rank_) * sizeof(uint16_t);
  a.k = rank_;
  a.xq = q_lr;
  a.xq_row_bytes = size_t(rank_) * sizeof(float);
  a.n_tok = n_head_;
  a.y = heads_.data();
  a.y_stride = n;
  if (n >= kParallelRows) {
    pool_->ParallelRange(n, kernels::kMatmulRowAlign, 1,
                         [&](int64_t r0, int64_t r1, int) { kernels::Matmul(a, r0, r1); });
  } else {
    kernels::Matmul(a, 0, n);
  }
  // Per head: the group's best token, then a softmax over groups. A group matters when any
  // of its tokens matters to any head, so the max is taken per head before heads are
  // summed; normalizing over groups rather than tokens costs G times fewer exponentials
  // and only rescales each head.
  std::fill(gs, gs + n_groups, 0.0f);
  float* hm = token_score_.data();
  for (int32_t h = 0; h < n_head_; ++h) {
    GroupMax(heads_.data() + size_t(h) * n, n_groups, group_size, hm);
    const float z = ExpInPlace(hm, n_groups, MaxOf(hm, n_groups), scale_);
    const float inv = 1.0f / z;
    for (int64_t g = 0; g < n_groups; ++g) gs[g] += hm[g] * inv;
  }
}

void GroupPredictor::SelectGroups(const float* q_lr, const uint16_t* klr, int32_t g0, int32_t g1,
                                  int32_t group_size, int32_t m, std::vector<int32_t>* out) {
  out->clear();
  const int32_t n_groups = g1 - g0;
  if (n_groups <= 0 || m <= 0) return;
  if (m >= n_groups) {
    for (int32_t g = g0; g < g1; ++g) out->push_back(g);
    return;
  }
  ScoreGroups(q_lr, klr, n_groups, group_size);
  // Only the set matters, not its order: a linear-time partition beats a heap here
  // (M is a sizeable fraction of the groups). Ties go to the older group.
  const float* gs = group_score_.data();
  int32_t* idx = top_.data();
  for (int32_t g = 0; g < n_groups; ++g) idx[g] = g;
  std::nth_element(idx, idx + m, idx + n_groups, [gs](int32_t a, int32_t b) {
    return gs[a] > gs[b] || (gs[a] == gs[b] && a < b);
  });
  out->assign(idx, idx + m);
  for (int32_t& g : *out) g += g0;
  std::sort(out->begin(), out->end());
}

}  // namespace strata
