#include "runtime/engine/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "runtime/model/model_math.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Below this many tokens, per-token element-wise work runs on the engine thread: a pool
// job costs about as much as normalizing a few rows.
constexpr int64_t kSerialTokens = 4;

// Query tokens per attention task in prefill, at most: each task streams its view's K and V
// rows once, so more queries a task means fewer passes over a long context, until the rows'
// accumulators outgrow the L2 (docs/experiments/cpu-kernels.md), while fewer give every
// thread work. AttentionQueryChunk picks between kMinQueryChunk and this one from the
// pass's size and the thread count.
constexpr int32_t kAttentionQueryChunk = 128;
constexpr int32_t kMinQueryChunk = 32;

// The largest query chunk (a power of two from kMinQueryChunk up) that still leaves about
// four tasks a thread. A row's result does not depend on it: the kernels cut keys, not
// queries, into chunks.
int32_t AttentionQueryChunk(int64_t new_tokens, int32_t kv_heads, int threads) {
  int32_t c = kAttentionQueryChunk;
  while (c > kMinQueryChunk && new_tokens / c * kv_heads < int64_t(4) * threads) c /= 2;
  return c;
}
// A decoding sequence's attention runs in one part per kAttentionPartTokens tokens of its
// view (at most kAttentionMaxParts).
constexpr int64_t kAttentionPartTokens = 256;
constexpr int64_t kAttentionMaxParts = 8;

}  // namespace

int32_t DecodeAttentionParts(int64_t view_tokens) {
  return int32_t(std::clamp<int64_t>(view_tokens / kAttentionPartTokens, 1, kAttentionMaxParts));
}

void ForwardBatch::Add(SeqId seq, int32_t pos0, std::span<const int32_t> ids, bool all_logits) {
  seqs.push_back({seq, pos0, int32_t(ids.size())});
  for (size_t i = 0; i < ids.size(); ++i) {
    tokens.push_back(ids[i]);
    want_logits.push_back(all_logits || i + 1 == ids.size());
  }
}

Status CheckForwardBatch(const ForwardBatch& batch, int64_t max_tokens, int32_t n_vocab) {
  const int64_t n_tok = int64_t(batch.tokens.size());
  if (n_tok == 0) return Status::InvalidArgument("forward: empty batch");
  if (n_tok > max_tokens)
    return Status::InvalidArgument("forward: batch of " + std::to_string(n_tok) +
                                   " tokens exceeds the batch limit " + std::to_string(max_tokens));
  int64_t sum = 0;
  for (const BatchSeq& s : batch.seqs) sum += s.n_new;
  if (sum != n_tok || batch.want_logits.size() != batch.tokens.size())
    return Status::Internal("forward: batch sequence counts do not match its tokens");
  for (int64_t t = 0; t < n_tok; ++t) {
    if (batch.tokens[t] < 0 || batch.tokens[t] >= n_vocab)
      return Status::InvalidArgument("forward: token id " + std::to_string(batch.tokens[t]) +
                                     " is outside the vocabulary [0, " + std::to_string(n_vocab) +
                                     ")");
  }
  return Status::OK();
}

int64_t ForwardBatch::n_outputs() const {
  return std::count(want_logits.begin(), want_logits.end(), uint8_t(1));
}

Forward::Forward(const Model& model, KvPolicy* kv, ThreadPool* pool, int32_t max_tokens,
                 bool pass_invariant)
    : model_(model),
      hp_(model.hparams()),
      kv_(kv),
      pool_(pool),
      max_tokens_(max_tokens),
      pass_invariant_(pass_invariant) {
  const size_t T = size_t(max_tokens_);
  const size_t q_dim = size_t(hp_.n_head) * hp_.head_dim;
  const size_t kv_dim = size_t(hp_.n_head_kv) * hp_.head_dim;
  const size_t wide = std::max<size_t>({size_t(hp_.n_embd), q_dim, size_t(hp_.n_ff)});
  x_.resize(T * hp_.n_embd);
  xn_.resize(T * std::max<size_t>(hp_.n_embd, q_dim));
  q_.resize(T * q_dim);
  k_.resize(T * kv_dim);
  v_.resize(T * kv_dim);
  attn_.resize(T * q_dim);
  gate_.resize(T * hp_.n_ff);
  up_.resize(T * hp_.n_ff);
  rope_.resize(T * hp_.rope_dim);
  // The largest activation row any weight of the model will need, per token.
  size_t xq_row = 0;
  for (kernels::DType t : {kernels::DType::kQ8_0, kernels::DType::kQ8_1, kernels::DType::kQ8_K,
                           kernels::DType::kF16, kernels::DType::kF32, kernels::DType::kBF16}) {
    const kernels::TypeInfo& ti = kernels::GetTypeInfo(t);
    xq_row = std::max(xq_row, (wide + ti.block_elems - 1) / ti.block_elems * ti.block_bytes);
  }
  xq_.resize(T * xq_row + 64);
  attn_scratch_.resize(pool_->size());
  for (auto& s : attn_scratch_)
    s.resize(kernels::AttentionScratchFloats(kAttentionQueryChunk, hp_.n_rep(), hp_.head_dim));

  inv_freq_ = RopeInverseFrequencies(model_);
}

void Forward::ComputeRopeTable(const ForwardBatch& batch) {
  int64_t t = 0;
  for (const BatchSeq& s : batch.seqs)
    for (int32_t i = 0; i < s.n_new; ++i, ++t)
      RopeCosSin(inv_freq_, s.pos0 + i, rope_.data() + t * hp_.rope_dim);
}

void Forward::RmsNormRows(const float* x, const TensorRef& w, float* y, int64_t n_tok) {
  const int64_t n = hp_.n_embd;
  auto row = [&](int64_t t) { kernels::RmsNorm(x + t * n, w.f32(), y + t * n, n, hp_.rms_eps); };
  if (n_tok <= kSerialTokens) {
    for (int64_t t = 0; t < n_tok; ++t) row(t);
  } else {
    pool_->Run(n_tok, [&](int64_t t, int) { row(t); });
  }
}

void Forward::Matmul(std::span<const MatmulJob> jobs, const float* x, int64_t n_tok) {
  const auto t0 = Clock::now();
  const TensorRef& w0 = *jobs[0].w;
  const int64_t k = w0.cols;
  const kernels::DType at = kernels::ActivationType(w0.type);
  const size_t xq_row = kernels::RowBytes(at, k);
  auto quantize = [&](int64_t t) {
    kernels::QuantizeActivations(w0.type, x + t * k, k, xq_.data() + t * xq_row);
  };
  if (n_tok <= kSerialTokens) {
    for (int64_t t = 0; t < n_tok; ++t) quantize(t);
  } else {
    pool_->Run(n_tok, [&](int64_t t, int) { quantize(t); });
  }

  // Cut every job's rows into pieces of about equal size (whole multiples of the kernels'
  // row alignment) so the threads share the work of all jobs in one pool run.
  constexpr int64_t kAlign = kernels::kMatmulRowAlign;
  int64_t total_units = 0;
  for (const MatmulJob& j : jobs) total_units += (j.w->rows + kAlign - 1) / kAlign;
  const int64_t target_chunks = std::min<int64_t>(total_units, int64_t(pool_->size()) * 4);
  const int64_t units_per_chunk = (total_units + target_chunks - 1) / target_chunks;
  pieces_.clear();
  for (const MatmulJob& j : jobs) {
    for (int64_t r = 0; r < j.w->rows; r += units_per_chunk * kAlign)
      pieces_.push_back({&j, r, std::min(j.w->rows, r + units_per_chunk * kAlign)});
  }
  pool_->Run(int64_t(pieces_.size()), [&](int64_t p, int) {
    const MatmulPiece& pc = pieces_[p];
    kernels::MatmulArgs a;
    a.wtype = pc.job->w->type;
    a.w = pc.job->w->data;
    a.w_row_bytes = pc.job->w->row_bytes;
    a.k = k;
    a.xq = xq_.data();
    a.xq_row_bytes = xq_row;
    a.n_tok = n_tok;
    a.y = pc.job->y;
    a.y_stride = pc.job->w->rows;
    a.w_layout = pc.job->w->layout;
    kernels::Matmul(a, pc.r0, pc.r1);
  });
  times_.matmul += Seconds(t0, Clock::now());
}

namespace {

// Tokens [from, from + n) of a span, as a span.
kernels::KvSpan SliceSpan(const kernels::KvSpan& sp, int32_t from, int32_t n) {
  kernels::KvSpan out = sp;
  out.n_tokens = n;
  out.pos0 = sp.pos0 + from;
  if (sp.type == kernels::KvType::kQ8_0) {
    out.qk += int64_t(from) * sp.stride;
    out.qv += int64_t(from) * sp.stride;
  } else {
    out.k += int64_t(from) * sp.stride;
    out.v += int64_t(from) * sp.stride;
  }
  return out;
}

// Splits a view into n_parts runs of about equal token counts (spans cut where needed);
// part p is spans [cuts[p], cuts[p + 1]) of `out`.
void SplitView(std::span<const kernels::KvSpan> view, int32_t n_parts,
               std::vector<kernels::KvSpan>* out, std::vector<int32_t>* cuts) {
  int64_t total = 0;
  for (const kernels::KvSpan& sp : view) total += sp.n_tokens;
  out->clear();
  cuts->assign(1, 0);
  int64_t done = 0;
  for (const kernels::KvSpan& sp : view) {
    int32_t from = 0;
    while (from < sp.n_tokens) {
      const int32_t p = int32_t(cuts->size()) - 1;
      // Part p ends at token total * (p + 1) / n_parts; the last part takes the rest.
      const int64_t end = p + 1 == n_parts ? total : total * (p + 1) / n_parts;
      const int32_t n = int32_t(std::min<int64_t>(sp.n_tokens - from, end - done));
      if (n > 0) out->push_back(SliceSpan(sp, from, n));
      from += n;
      done += n;
      if (done == end && p + 1 < n_parts) cuts->push_back(int32_t(out->size()));
    }
  }
  while (int32_t(cuts->size()) <= n_parts) cuts->push_back(int32_t(out->size()));
}

}  // namespace

void Forward::Attention(const ForwardBatch& batch, int32_t layer,
                        const std::vector<std::span<const kernels::KvSpan>>& views) {
  (void)layer;
  const auto t0 = Clock::now();
  const int32_t hd = hp_.head_dim, n_rep = hp_.n_rep();
  const int32_t q_dim = hp_.n_head * hd;
  // A decoding sequence's view is cut by tokens into parts that run as separate tasks and
  // are joined by their softmax denominators, so few sequences still keep every thread
  // busy (batch 1: 3 KV heads on 2 threads). The number of parts depends only on the
  // sequence's own view, never on the batch or the thread count: a token's result must not
  // depend on who shares its batch (beam search promises identical results under any
  // grouping). A pass-invariant engine does not cut: a token must also get the same bits in
  // a pass of one token as among the tokens of a longer one.
  struct Task {
    int32_t seq_index, kv_head, t0, n_q, pos0, part;
    int64_t part_row;  // first row of its part's output in part_out_, or -1: direct to attn_
  };
  std::vector<Task> tasks;
  int64_t new_tokens = 0;
  for (const BatchSeq& bs : batch.seqs) new_tokens += bs.n_new;
  const int32_t query_chunk = AttentionQueryChunk(new_tokens, hp_.n_head_kv, pool_->size());
  split_spans_.resize(views.size());
  split_cuts_.resize(views.size());
  int64_t part_rows = 0;
  int32_t t_base = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const BatchSeq& bs = batch.seqs[s];
    int32_t n_parts = 1;
    if (bs.n_new == 1 && !pass_invariant_) {
      int64_t n = 0;
      for (const kernels::KvSpan& sp : views[s]) n += sp.n_tokens;
      n_parts = DecodeAttentionParts(n);
      if (n_parts > 1) SplitView(views[s], n_parts, &split_spans_[s], &split_cuts_[s]);
    }
    for (int32_t c = 0; c < bs.n_new; c += query_chunk) {
      int32_t n_q = std::min(query_chunk, bs.n_new - c);
      for (int32_t h = 0; h < hp_.n_head_kv; ++h)
        for (int32_t p = 0; p < n_parts; ++p) {
          tasks.push_back({int32_t(s), h, t_base + c, n_q, bs.pos0 + c, n_parts > 1 ? p : -1,
                           n_parts > 1 ? part_rows : -1});
          if (n_parts > 1) part_rows += n_rep;
        }
    }
    t_base += bs.n_new;
  }
  part_out_.resize(size_t(part_rows) * hd);
  part_lse_.resize(size_t(part_rows));
  const float scale = AttentionScale(hp_);
  pool_->Run(int64_t(tasks.size()), [&](int64_t i, int worker) {
    const Task& t = tasks[i];
    kernels::AttentionArgs a;
    a.q = q_.data() + size_t(t.t0) * q_dim + size_t(t.kv_head) * n_rep * hd;
    a.n_q = t.n_q;
    a.q_stride = q_dim;
    a.q_pos0 = t.pos0;
    a.n_rep = n_rep;
    a.head_dim = hd;
    a.kv_head = t.kv_head;
    if (t.part >= 0) {
      const std::vector<int32_t>& cuts = split_cuts_[size_t(t.seq_index)];
      a.spans = split_spans_[size_t(t.seq_index)].data() + cuts[size_t(t.part)];
      a.n_spans = cuts[size_t(t.part) + 1] - cuts[size_t(t.part)];
      a.out = part_out_.data() + size_t(t.part_row) * hd;
      a.out_stride = n_rep * hd;
      a.lse = part_lse_.data() + t.part_row;
    } else {
      a.spans = views[t.seq_index].data();
      a.n_spans = int32_t(views[t.seq_index].size());
      a.out = attn_.data() + size_t(t.t0) * q_dim + size_t(t.kv_head) * n_rep * hd;
      a.out_stride = q_dim;
    }
    a.scale = scale;
    a.scratch = attn_scratch_[worker].data();
    kernels::AttentionOverSpans(a);
  });
  // A split task's parts are consecutive, part 0 first.
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    if (t.part != 0) continue;
    int32_t n_parts = 1;
    while (i + n_parts < tasks.size() && tasks[i + n_parts].part > 0) ++n_parts;
    kernels::MergeAttentionParts(
        part_out_.data() + size_t(t.part_row) * hd, part_lse_.data() + t.part_row, n_parts, 1,
        n_rep, hd, attn_.data() + size_t(t.t0) * q_dim + size_t(t.kv_head) * n_rep * hd, q_dim);
  }
  times_.attention += Seconds(t0, Clock::now());
}

Status Forward::AttendWindows(const ForwardBatch& batch, int32_t layer, size_t s, int64_t t0,
                              std::span<const kernels::KvSpan> first, int32_t more,
                              KvWindowedView* windows) {
  const BatchSeq& bs = batch.seqs[s];
  const int32_t hd = hp_.head_dim, n_rep = hp_.n_rep(), n_kv = hp_.n_head_kv;
  const int32_t q_dim = hp_.n_head * hd, n_q = bs.n_new;
  const size_t rows = size_t(n_q) * hp_.n_head;
  win_out_.resize(rows * hd);
  acc_out_.resize(rows * hd);
  win_lse_.resize(rows);
  acc_lse_.assign(rows, -std::numeric_limits<float>::infinity());
  std::fill(acc_out_.begin(), acc_out_.end(), 0.0f);
  const float scale = AttentionScale(hp_);
  const int32_t query_chunk = AttentionQueryChunk(n_q, n_kv, pool_->size());
  const int32_t chunks = (n_q + query_chunk - 1) / query_chunk;
  std::span<const kernels::KvSpan> spans = first;
  for (int32_t w = 0; w <= more; ++w) {
    if (w > 0) {
      const auto tk = Clock::now();
      STRATA_RETURN_IF_ERROR(windows->NextWindow(layer, bs.seq, &spans));
      times_.kv += Seconds(tk, Clock::now());
    }
    const auto ta = Clock::now();
    pool_->Run(int64_t(chunks) * n_kv, [&](int64_t i, int worker) {
      const int32_t h = int32_t(i % n_kv), c = int32_t(i / n_kv) * query_chunk;
      kernels::AttentionArgs a;
      a.q = q_.data() + size_t(t0 + c) * q_dim + size_t(h) * n_rep * hd;
      a.n_q = std::min(query_chunk, n_q - c);
      a.q_stride = q_dim;
      a.q_pos0 = bs.pos0 + c;
      a.n_rep = n_rep;
      a.head_dim = hd;
      a.kv_head = h;
      a.spans = spans.data();
      a.n_spans = int32_t(spans.size());
      a.scale = scale;
      a.out = win_out_.data() + size_t(c) * q_dim + size_t(h) * n_rep * hd;
      a.out_stride = q_dim;
      a.lse = win_lse_.data() + (size_t(h) * n_q + c) * n_rep;  // [kv head][token][rep]
      a.scratch = attn_scratch_[worker].data();
      kernels::AttentionOverSpans(a);
    });
    // Join: each window's rows are normalized by its own denominator exp(lse).
    for (int32_t t = 0; t < n_q; ++t)
      for (int32_t qh = 0; qh < hp_.n_head; ++qh) {
        const float b = win_lse_[(size_t(qh / n_rep) * n_q + t) * n_rep + qh % n_rep];
        float& a = acc_lse_[size_t(t) * hp_.n_head + qh];
        const float m = std::max(a, b);
        if (m == -std::numeric_limits<float>::infinity()) continue;
        const float wa = std::exp(a - m), wb = std::exp(b - m), inv = 1.0f / (wa + wb);
        float* acc = acc_out_.data() + size_t(t) * q_dim + size_t(qh) * hd;
        const float* o = win_out_.data() + size_t(t) * q_dim + size_t(qh) * hd;
        for (int32_t d = 0; d < hd; ++d) acc[d] = (acc[d] * wa + o[d] * wb) * inv;
        a = m + std::log(wa + wb);
      }
    times_.attention += Seconds(ta, Clock::now());
  }
  std::copy(acc_out_.begin(), acc_out_.end(), attn_.begin() + t0 * q_dim);
  return Status::OK();
}

void Forward::AttendTail(const ForwardBatch& batch, int32_t layer) {
  const int32_t hd = hp_.head_dim, n_rep = hp_.n_rep();
  const int64_t q_dim = int64_t(hp_.n_head) * hd;
  int64_t t0 = 0;
  for (const BatchSeq& bs : batch.seqs) {
    KvTail tail;
    KvTailEstimate* estimate = kv_->tail_estimate();
    if (bs.n_new == 1 && estimate && estimate->Tail(layer, bs.seq, &tail)) {
      float* o = attn_.data() + t0 * q_dim;
      for (int32_t h = 0; h < hp_.n_head; ++h) {
        const float r = tail.ratio[h];
        if (r == 0.0f) continue;
        const float* mv = tail.mean_v + size_t(h / n_rep) * hd;
        const float w = 1.0f / (1.0f + r);
        for (int32_t i = 0; i < hd; ++i) o[h * hd + i] = (o[h * hd + i] + r * mv[i]) * w;
      }
    }
    t0 += bs.n_new;
  }
}

Status Forward::RunLayers(const ForwardBatch& batch, int64_t n_tok) {
  const ModelWeights& W = model_.cpu_weights();
  const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim;
  const int64_t q_dim = int64_t(hp_.n_head) * hd, kv_dim = int64_t(hp_.n_head_kv) * hd;
  std::vector<std::span<const kernels::KvSpan>> views(batch.seqs.size());
  auto per_token = [&](auto&& fn) {
    if (n_tok <= kSerialTokens) {
      for (int64_t t = 0; t < n_tok; ++t) fn(t);
    } else {
      pool_->Run(n_tok, [&](int64_t t, int) { fn(t); });
    }
  };

  auto tk = Clock::now();
  STRATA_RETURN_IF_ERROR(kv_->Prepare(0, x_.data(), n_embd));
  times_.kv_prepare += Seconds(tk, Clock::now());
  times_.kv += Seconds(tk, Clock::now());
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    const LayerWeights& L = W.layers[l];
    if (l + 1 < hp_.n_layer) {
      tk = Clock::now();
      STRATA_RETURN_IF_ERROR(kv_->Prepare(l + 1, x_.data(), n_embd));
      times_.kv_prepare += Seconds(tk, Clock::now());
      times_.kv += Seconds(tk, Clock::now());
    }

    // Attention block.
    RmsNormRows(x_.data(), L.attn_norm, xn_.data(), n_tok);
    const MatmulJob qkv[] = {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}};
    if (kernels::ActivationType(L.wq.type) == kernels::ActivationType(L.wk.type) &&
        kernels::ActivationType(L.wq.type) == kernels::ActivationType(L.wv.type)) {
      Matmul(qkv, xn_.data(), n_tok);
    } else {
      for (const MatmulJob& j : qkv) Matmul({&j, 1}, xn_.data(), n_tok);
    }
    const auto t_other = Clock::now();
    per_token([&](int64_t t) {
      FinishQkv(hp_, L, rope_.data() + t * hp_.rope_dim, q_.data() + t * q_dim,
                k_.data() + t * kv_dim, v_.data() + t * kv_dim);
    });
    times_.other += Seconds(t_other, Clock::now());

    tk = Clock::now();
    int64_t t0 = 0;
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const BatchSeq& bs = batch.seqs[s];
      STRATA_RETURN_IF_ERROR(
          kv_->Append(l, bs.seq, k_.data() + t0 * kv_dim, v_.data() + t0 * kv_dim));
      t0 += bs.n_new;
    }
    for (size_t s = 0; s < batch.seqs.size(); ++s)
      STRATA_RETURN_IF_ERROR(kv_->View(l, batch.seqs[s].seq, &views[s]));
    // Views that come in windows are attended apart (their first window is set aside).
    KvWindowedView* windowed = kv_->windowed_view();
    std::vector<int32_t> more(batch.seqs.size(), 0);
    std::vector<std::span<const kernels::KvSpan>> first(batch.seqs.size());
    if (windowed)
      for (size_t s = 0; s < batch.seqs.size(); ++s) {
        more[s] = windowed->MoreWindows(l, batch.seqs[s].seq);
        if (more[s] > 0) std::swap(first[s], views[s]);
      }
    times_.kv += Seconds(tk, Clock::now());
    Attention(batch, l, views);
    for (size_t s = 0, row = 0; s < batch.seqs.size(); row += size_t(batch.seqs[s++].n_new))
      if (more[s] > 0)
        STRATA_RETURN_IF_ERROR(
            AttendWindows(batch, l, s, int64_t(row), first[s], more[s], windowed));
    AttendTail(batch, l);

    const MatmulJob wo[] = {{&L.wo, xn_.data()}};
    Matmul(wo, attn_.data(), n_tok);
    kernels::Add(x_.data(), xn_.data(), n_tok * n_embd);

    // Feed-forward block (SwiGLU).
    RmsNormRows(x_.data(), L.ffn_norm, xn_.data(), n_tok);
    const MatmulJob gate_up[] = {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}};
    if (kernels::ActivationType(L.w_gate.type) == kernels::ActivationType(L.w_up.type)) {
      Matmul(gate_up, xn_.data(), n_tok);
    } else {
      for (const MatmulJob& j : gate_up) Matmul({&j, 1}, xn_.data(), n_tok);
    }
    per_token([&](int64_t t) {
      float* g = gate_.data() + t * hp_.n_ff;
      kernels::SwiGlu(g, up_.data() + t * hp_.n_ff, g, hp_.n_ff);
    });
    const MatmulJob down[] = {{&L.w_down, xn_.data()}};
    Matmul(down, gate_.data(), n_tok);
    kernels::Add(x_.data(), xn_.data(), n_tok * n_embd);
  }
  return Status::OK();
}

Status Forward::Run(const ForwardBatch& batch, std::vector<float>* logits) {
  const int64_t n_tok = int64_t(batch.tokens.size());
  STRATA_RETURN_IF_ERROR(CheckForwardBatch(batch, max_tokens_, hp_.n_vocab));
  STRATA_RETURN_IF_ERROR(kv_->BeginBatch(batch.seqs));

  const ModelWeights& W = model_.cpu_weights();
  const int64_t n_embd = hp_.n_embd;
  auto embed = [&](int64_t t) {
    const TensorRef& E = W.tok_embd;
    const auto* row = static_cast<const uint8_t*>(E.data) + size_t(batch.tokens[t]) * E.row_bytes;
    if (E.layout == kernels::WeightLayout::kRows16) {  // a tied head, repacked
      static thread_local std::vector<uint8_t> file_row;
      file_row.resize(E.row_bytes);
      kernels::Rows16Row(E.type, E.data, n_embd, batch.tokens[t], file_row.data());
      row = file_row.data();
    }
    kernels::DequantizeRow(E.type, row, x_.data() + t * n_embd, n_embd);
  };
  if (n_tok <= kSerialTokens) {
    for (int64_t t = 0; t < n_tok; ++t) embed(t);
  } else {
    pool_->Run(n_tok, [&](int64_t t, int) { embed(t); });
  }
  ComputeRopeTable(batch);

  Status st = RunLayers(batch, n_tok);
  if (!st.ok()) {
    kv_->AbortBatch();
    return st;
  }
  STRATA_RETURN_IF_ERROR(kv_->EndBatch());

  // Output head on the rows that want logits only.
  int64_t n_out = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    if (!batch.want_logits[t]) continue;
    kernels::RmsNorm(x_.data() + t * n_embd, W.output_norm.f32(), xn_.data() + n_out * n_embd,
                     n_embd, hp_.rms_eps);
    ++n_out;
  }
  logits->resize(size_t(n_out) * hp_.n_vocab);
  if (n_out > 0) {
    const MatmulJob head[] = {{&W.output, logits->data()}};
    Matmul(head, xn_.data(), n_out);
  }
  return Status::OK();
}

}  // namespace strata
