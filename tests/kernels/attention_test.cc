// AttentionOverSpans against a naive reference (all visible scores, softmax, weighted sum
// of V) over shuffled, partly masked spans, GQA groups and several query tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

using testing::GaussianFloats;

struct KvCache {
  int n_kv_heads, head_dim, stride;
  std::vector<uint16_t> k, v;  // [positions][stride]
};

KvCache MakeCache(int positions, int n_kv_heads, int head_dim, uint32_t seed, float k_sigma) {
  KvCache c{n_kv_heads, head_dim, n_kv_heads * head_dim + 16, {}, {}};
  c.k = testing::ToF16(GaussianFloats(size_t(positions) * c.stride, seed, k_sigma));
  c.v = testing::ToF16(GaussianFloats(size_t(positions) * c.stride, seed + 1));
  return c;
}

// Splits positions [0, n) into spans of the given sizes (cycled) and shuffles their order.
std::vector<KvSpan> MakeSpans(const KvCache& c, int n, std::vector<int> sizes, uint32_t seed) {
  std::vector<KvSpan> spans;
  for (int pos = 0, i = 0; pos < n; ++i) {
    const int len = std::min(sizes[i % sizes.size()], n - pos);
    spans.push_back({c.k.data() + size_t(pos) * c.stride, c.v.data() + size_t(pos) * c.stride, len,
                     pos, c.stride});
    pos += len;
  }
  std::shuffle(spans.begin(), spans.end(), std::mt19937(seed));
  return spans;
}

std::vector<float> NaiveAttention(const AttentionArgs& a) {
  const int D = a.head_dim;
  std::vector<float> out(size_t(a.n_q) * a.out_stride, 0.f);
  for (int t = 0; t < a.n_q; ++t) {
    for (int j = 0; j < a.n_rep; ++j) {
      const float* q = a.q + size_t(t) * a.q_stride + size_t(j) * D;
      std::vector<double> scores;
      std::vector<const uint16_t*> vals;
      for (int s = 0; s < a.n_spans; ++s) {
        const KvSpan& sp = a.spans[s];
        for (int i = 0; i < sp.n_tokens; ++i) {
          if (sp.pos0 + i > a.q_pos0 + t) continue;
          const uint16_t* k = sp.k + size_t(i) * sp.stride + size_t(a.kv_head) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[d]) * F16ToF32(k[d]);
          scores.push_back(dot * a.scale);
          vals.push_back(sp.v + size_t(i) * sp.stride + size_t(a.kv_head) * D);
        }
      }
      float* o = out.data() + size_t(t) * a.out_stride + size_t(j) * D;
      if (scores.empty()) continue;
      const double m = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - m));
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (size_t i = 0; i < scores.size(); ++i) acc += scores[i] * F16ToF32(vals[i][d]);
        o[d] = float(acc / sum);
      }
    }
  }
  return out;
}

struct Case {
  int head_dim, n_rep, n_q, n_keys, q_pos0;
  float k_sigma;  // larger keys give peaky softmaxes and big running-max jumps
  std::vector<int> span_sizes;
};

void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "D=" << c.head_dim << " n_rep=" << c.n_rep << " n_q=" << c.n_q
               << " keys=" << c.n_keys << " q_pos0=" << c.q_pos0 << " k_sigma=" << c.k_sigma);
  const int n_kv_heads = 2, kv_head = 1;
  KvCache cache = MakeCache(c.n_keys, n_kv_heads, c.head_dim, seed, c.k_sigma);
  std::vector<KvSpan> spans = MakeSpans(cache, c.n_keys, c.span_sizes, seed + 7);
  const int q_stride = c.n_rep * c.head_dim + 8, out_stride = c.n_rep * c.head_dim + 24;
  std::vector<float> q = GaussianFloats(size_t(c.n_q) * q_stride, seed + 3);
  std::vector<float> scratch(AttentionScratchFloats(c.n_q, c.n_rep, c.head_dim) + 1,
                             std::numeric_limits<float>::quiet_NaN());
  std::vector<float> out(size_t(c.n_q) * out_stride, -7.f);
  AttentionArgs a{};
  a.q = q.data();
  a.n_q = c.n_q;
  a.q_stride = q_stride;
  a.q_pos0 = c.q_pos0;
  a.n_rep = c.n_rep;
  a.head_dim = c.head_dim;
  a.kv_head = kv_head;
  a.spans = spans.data();
  a.n_spans = int(spans.size());
  a.scale = 1.f / std::sqrt(float(c.head_dim));
  a.out = out.data();
  a.out_stride = out_stride;
  a.scratch = scratch.data() + 1;  // deliberately misaligned: kernels align internally
  AttentionOverSpans(a);
  std::vector<float> ref = NaiveAttention(a);
  for (int t = 0; t < c.n_q; ++t) {
    for (int i = 0; i < out_stride; ++i) {
      const float got = out[size_t(t) * out_stride + i];
      if (i >= c.n_rep * c.head_dim) {
        ASSERT_EQ(got, -7.f) << "wrote past the heads, token " << t;
        continue;
      }
      ASSERT_NEAR(got, ref[size_t(t) * out_stride + i], 2e-5) << "token " << t << " elem " << i;
    }
  }
}

class AttentionIsa : public ::testing::TestWithParam<testing::Variant> {};

TEST_P(AttentionIsa, MatchesNaiveReference) {
  testing::ScopedVariant isa(GetParam());
  std::vector<Case> cases;
  for (int D : {64, 128, 16, 80}) {
    for (int n_rep : {1, 3, 4}) {
      // Decode: one query at the end, spans of mixed sizes in shuffled order.
      cases.push_back({D, n_rep, 1, 150, 149, 1.f, {16, 7, 33, 1, 64}});
      // Prefill block at the end of the context: causal mask inside the block.
      cases.push_back({D, n_rep, 13, 90, 77, 1.f, {32, 5, 40}});
      // Queries in the middle: later spans are entirely or partly in the future.
      cases.push_back({D, n_rep, 5, 120, 30, 3.f, {10, 25, 17}});
    }
  }
  // A sparse view's groups of a few tokens: gathered across spans into whole chunks where
  // every query sees them, cut by position where some do not.
  cases.push_back({64, 3, 1, 400, 399, 2.f, {4, 5, 1, 16}});
  cases.push_back({64, 3, 9, 200, 191, 2.f, {4, 5, 3}});
  // A pass over a prefix tree's blocks beginning inside one, and over mixed groups.
  cases.push_back({64, 3, 40, 200, 157, 2.f, {16}});
  cases.push_back({64, 3, 33, 120, 85, 2.f, {4, 5, 1, 16}});
  if (!testing::QuickMode()) {
    cases.push_back({64, 3, 64, 300, 236, 2.f, {128, 3, 97, 31}});
    cases.push_back({128, 4, 2, 700, 698, 4.f, {256, 200, 1, 243}});
  }
  uint32_t seed = 1;
  for (const Case& c : cases) RunCase(c, seed += 10);
}

// A query row's output is the same bits whichever token its pass begins at and however
// many follow it: chunks are cut from the view's keys, not from the pass's first position.
// Spans in position order, as a prefix tree's blocks or a sequence's own KV.
TEST_P(AttentionIsa, ARowGetsTheSameBitsWhereverItsPassBegins) {
  testing::ScopedVariant isa(GetParam());
  const int D = 64, n_rep = 3, n_keys = 130, row_pos = 101;
  for (std::vector<int> sizes : std::vector<std::vector<int>>{{16}, {16, 7, 33, 1, 64}, {130}}) {
    KvCache cache = MakeCache(n_keys, 2, D, 5, 2.f);
    std::vector<KvSpan> all;
    for (int pos = 0, i = 0; pos < n_keys; ++i) {
      const int len = std::min(sizes[i % sizes.size()], n_keys - pos);
      all.push_back({cache.k.data() + size_t(pos) * cache.stride,
                     cache.v.data() + size_t(pos) * cache.stride, len, pos, cache.stride});
      pos += len;
    }
    const std::vector<float> q_row = GaussianFloats(size_t(n_rep) * D, 9);
    std::vector<float> first;
    for (int q0 : {0, 64, 70, 96, 100, 101}) {
      for (int end : {row_pos + 1, row_pos + 3, n_keys}) {
        // The view holds the keys up to the pass's last token, as a KV policy's does.
        std::vector<KvSpan> view;
        for (KvSpan sp : all) {
          if (sp.pos0 >= end) break;
          sp.n_tokens = std::min(sp.n_tokens, end - sp.pos0);
          view.push_back(sp);
        }
        const int n_q = end - q0, stride = n_rep * D;
        std::vector<float> q = GaussianFloats(size_t(n_q) * stride, uint32_t(q0 + end));
        std::copy(q_row.begin(), q_row.end(), q.begin() + size_t(row_pos - q0) * stride);
        std::vector<float> scratch(AttentionScratchFloats(n_q, n_rep, D));
        std::vector<float> out(size_t(n_q) * stride);
        AttentionArgs a{};
        a.q = q.data();
        a.n_q = n_q;
        a.q_stride = stride;
        a.q_pos0 = q0;
        a.n_rep = n_rep;
        a.head_dim = D;
        a.kv_head = 1;
        a.spans = view.data();
        a.n_spans = int(view.size());
        a.scale = 0.125f;
        a.out = out.data();
        a.out_stride = stride;
        a.scratch = scratch.data();
        AttentionOverSpans(a);
        std::vector<float> row(out.begin() + (row_pos - q0) * stride,
                               out.begin() + (row_pos - q0 + 1) * stride);
        if (first.empty()) first = row;
        for (int i = 0; i < stride; ++i)
          ASSERT_EQ(row[size_t(i)], first[size_t(i)])
              << "spans of " << sizes[0] << "..., pass from " << q0 << " to " << end << ", elem "
              << i;
      }
    }
  }
}

TEST_P(AttentionIsa, RowWithoutVisibleKeysIsZero) {
  testing::ScopedVariant isa(GetParam());
  const int D = 64;
  KvCache cache = MakeCache(40, 1, D, 99, 1.f);
  KvSpan span{cache.k.data(), cache.v.data(), 40, 10, cache.stride};  // positions 10..49
  std::vector<float> q = GaussianFloats(2 * D, 5);
  std::vector<float> scratch(AttentionScratchFloats(2, 1, D)), out(2 * D, -1.f);
  AttentionArgs a{q.data(), 2, D, 9, 1, D, 0, &span, 1, 0.125f, out.data(), D, scratch.data()};
  AttentionOverSpans(a);  // query 0 at pos 9 sees nothing, query 1 at pos 10 sees one key
  for (int d = 0; d < D; ++d) {
    EXPECT_EQ(out[d], 0.f);
    EXPECT_NEAR(out[D + d], F16ToF32(cache.v[d]), 1e-6);
  }
  a.n_spans = 0;
  AttentionOverSpans(a);
  for (float v : out) EXPECT_EQ(v, 0.f);
}

// A view split into parts (whole spans to different parts, one part entirely in the future
// of some queries) and joined by MergeAttentionParts equals attention over the whole view;
// lse is the log of the softmax denominator in scaled-score units.
TEST_P(AttentionIsa, PartsMergeIntoTheWholeView) {
  testing::ScopedVariant isa(GetParam());
  const int D = 64, n_rep = 3, n_keys = 150, n_kv = 2;
  for (const int n_q : {1, 4}) {
    const int q_pos0 = n_q == 1 ? n_keys - 1 : 40;  // 4 queries at 40..43: later spans unseen
    SCOPED_TRACE(::testing::Message() << "n_q=" << n_q);
    KvCache cache = MakeCache(n_keys, n_kv, D, 31, 2.f);
    // Spans in position order so the last part holds only positions past 43.
    std::vector<KvSpan> spans = MakeSpans(cache, n_keys, {16, 7, 33, 1, 64}, 0);
    std::sort(spans.begin(), spans.end(),
              [](const KvSpan& a, const KvSpan& b) { return a.pos0 < b.pos0; });
    const int rows = n_q * n_rep;
    std::vector<float> q = GaussianFloats(size_t(rows) * D, 32);
    std::vector<float> scratch(AttentionScratchFloats(n_q, n_rep, D));
    std::vector<float> whole(size_t(rows) * D), whole_lse(static_cast<size_t>(rows));
    AttentionArgs a{
        q.data(),          n_q,    n_rep * D,    q_pos0,    n_rep,         D, 1, spans.data(),
        int(spans.size()), 0.125f, whole.data(), n_rep * D, scratch.data()};
    a.lse = whole_lse.data();
    AttentionOverSpans(a);
    // lse against the naive sum over visible keys.
    for (int r = 0; r < rows; ++r) {
      const int t = r / n_rep, j = r % n_rep;
      double sum = 0;
      for (int pos = 0; pos <= std::min(n_keys - 1, q_pos0 + t); ++pos) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(q[size_t(t) * n_rep * D + j * D + d]) *
                 F16ToF32(cache.k[size_t(pos) * cache.stride + D + d]);
        sum += std::exp(dot * 0.125);
      }
      EXPECT_NEAR(whole_lse[size_t(r)], std::log(sum), 1e-4) << r;
    }
    // Parts: spans [0,2), [2,4), [4,end).
    const int cuts[] = {0, 2, 4, int(spans.size())};
    const int n_parts = 3;
    std::vector<float> parts(size_t(n_parts) * rows * D, 99.f), lse(size_t(n_parts) * rows, 99.f);
    for (int p = 0; p < n_parts; ++p) {
      AttentionArgs b = a;
      b.spans = spans.data() + cuts[p];
      b.n_spans = cuts[p + 1] - cuts[p];
      b.out = parts.data() + size_t(p) * rows * D;
      b.lse = lse.data() + size_t(p) * rows;
      AttentionOverSpans(b);
    }
    if (n_q > 1) {
      EXPECT_EQ(lse[size_t(2 * rows)], -std::numeric_limits<float>::infinity());
    }
    std::vector<float> merged(size_t(rows) * D, -5.f);
    MergeAttentionParts(parts.data(), lse.data(), n_parts, n_q, n_rep, D, merged.data(), n_rep * D);
    for (size_t i = 0; i < merged.size(); ++i) ASSERT_NEAR(merged[i], whole[i], 2e-5) << i;
    // No part sees anything: zeros.
    std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
    MergeAttentionParts(parts.data(), lse.data(), n_parts, n_q, n_rep, D, merged.data(), n_rep * D);
    for (float v : merged) ASSERT_EQ(v, 0.f);
  }
}

// Q8_0 spans are expanded to F16 before the kernel runs: attention over Q8_0 records must
// equal attention over the same values stored as F16 (mixed with plain F16 spans, partly
// masked, for the second KV head so the head offset into the blocks counts). The rows every
// query sees are expanded into one span, so the sums run in another order: equal to float
// rounding, however small the spans (a sparse policy's groups, or single tokens).
TEST_P(AttentionIsa, Q8SpansEqualTheirF16Expansion) {
  testing::ScopedVariant isa(GetParam());
  for (const int D : {64, 128})
    for (const int n_q : {1, 13})
      for (const int span : {1, 4, 8}) {
        SCOPED_TRACE(::testing::Message() << "D=" << D << " n_q=" << n_q << " span=" << span);
        const int n_kv = 2, row = n_kv * D, n_keys = 97, n_rep = 3;
        const int q_pos0 = n_q == 1 ? n_keys - 1 : 60;
        const std::vector<float> kf = GaussianFloats(size_t(n_keys) * row, 11, 2.f);
        const std::vector<float> vf = GaussianFloats(size_t(n_keys) * row, 12);
        const size_t qrow = size_t(Q8_0RowBytes(row));
        std::vector<uint8_t> kq(n_keys * qrow), vq(n_keys * qrow);
        std::vector<float> kd(kf.size()), vd(vf.size());
        for (int t = 0; t < n_keys; ++t) {
          ASSERT_TRUE(QuantizeRow(DType::kQ8_0, &kf[size_t(t) * row], &kq[t * qrow], row));
          ASSERT_TRUE(QuantizeRow(DType::kQ8_0, &vf[size_t(t) * row], &vq[t * qrow], row));
          DequantizeRow(DType::kQ8_0, &kq[t * qrow], &kd[size_t(t) * row], row);
          DequantizeRow(DType::kQ8_0, &vq[t * qrow], &vd[size_t(t) * row], row);
        }
        const std::vector<uint16_t> k16 = testing::ToF16(kd), v16 = testing::ToF16(vd);
        // Spans in reverse order; every other one quantized in the mixed view.
        std::vector<KvSpan> plain, mixed;
        for (int pos = 0, i = 0; pos < n_keys; pos += span, ++i) {
          const int n = std::min(span, n_keys - pos);
          const KvSpan f{&k16[size_t(pos) * row], &v16[size_t(pos) * row], n, pos, row};
          plain.insert(plain.begin(), f);
          mixed.insert(mixed.begin(),
                       i % 2 ? f
                             : KvSpan{nullptr, nullptr, n, pos, int32_t(qrow), KvType::kQ8_0,
                                      &kq[pos * qrow], &vq[pos * qrow]});
        }
        const std::vector<float> q = GaussianFloats(size_t(n_q) * n_rep * D, 13);
        std::vector<float> scratch(AttentionScratchFloats(n_q, n_rep, D));
        std::vector<float> out_plain(size_t(n_q) * n_rep * D), out_mixed(out_plain.size());
        AttentionArgs a{
            q.data(),          n_q,  n_rep * D,        q_pos0,    n_rep,         D, 1, plain.data(),
            int(plain.size()), 0.1f, out_plain.data(), n_rep * D, scratch.data()};
        AttentionOverSpans(a);
        a.spans = mixed.data();
        a.out = out_mixed.data();
        AttentionOverSpans(a);
        a.spans = plain.data();
        const std::vector<float> naive = NaiveAttention(a);
        for (size_t i = 0; i < out_plain.size(); ++i) {
          ASSERT_NEAR(out_mixed[i], out_plain[i], 1e-5f * (1.f + std::fabs(out_plain[i]))) << i;
          ASSERT_NEAR(out_mixed[i], naive[i], 1e-4f * (1.f + std::fabs(naive[i]))) << i;
        }
        EXPECT_NE(out_plain[0], 0.f);
      }
}

INSTANTIATE_TEST_SUITE_P(Isas, AttentionIsa, ::testing::ValuesIn(testing::AllVariants()),
                         testing::VariantName);

}  // namespace
}  // namespace strata::kernels
