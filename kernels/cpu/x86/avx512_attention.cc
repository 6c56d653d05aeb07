// AVX-512 attention over F16 KV spans with an online softmax.
//
// Keys are taken in chunks of kAttnChunk. For each chunk and each group of up to four query
// rows (a row is one query head of one token; GQA rows share the KV head, so every K/V row
// converted from F16 serves the whole group):
//   1. scores for four keys at a time: per 16-dim slice, four K conversions feed 4 x G
//      multiply-adds, then one transpose-and-add tree gives the four dot products per row;
//   2. the online softmax update (running max m, denominator l, rescale factor alpha);
//   3. P x V into accumulators held in registers for up to 64 dims at a time, loaded from
//      and stored to scratch once per chunk.
// Rows whose token cannot see any key of the chunk (causal mask) skip it entirely.
// A chunk several groups of rows use (a prefill's) is converted to float once (ToFloat),
// not once a group: the same arithmetic on the same values, fewer conversions.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/attention_driver.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/x86/avx512_internal.h"
#include "kernels/cpu/x86/avx512_math.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kChunk = kAttnChunk;
static_assert(kChunk == 32, "score rows are handled as two 16-lane vectors");

using RowState = AttnRow;

STRATA_INLINE __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
STRATA_INLINE __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }

// Scores of G rows against keys [0, n) of the chunk (n rounded up to four; the extra keys
// repeat the last valid one and are masked by the softmax step).
template <int G, class Keys>
void Scores(RowState* rows, const Keys keys, int n, int D) {
  for (int j0 = 0; j0 < n; j0 += 4) {
    using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(keys.K(0))>>;
    const Elem* kr[4];
    for (int j = 0; j < 4; ++j) kr[j] = keys.K(std::min(j0 + j, n - 1));
    __m512 part[G][4];
    for (int r = 0; r < G; ++r) {
      for (int j = 0; j < 4; ++j) part[r][j] = _mm512_setzero_ps();
    }
    for (int d = 0; d < D; d += 16) {
      __m512 kv[4];
      for (int j = 0; j < 4; ++j) kv[j] = Load16(kr[j] + d);
#pragma GCC unroll 4
      for (int r = 0; r < G; ++r) {
        const __m512 q = _mm512_loadu_ps(rows[r].q + d);
        for (int j = 0; j < 4; ++j) part[r][j] = _mm512_fmadd_ps(q, kv[j], part[r][j]);
      }
    }
    for (int r = 0; r < G; ++r) {
      _mm_storeu_ps(rows[r].scores + j0, _mm512_castps512_ps128(ReduceLanes<4>(part[r])));
    }
  }
}

// Online softmax step for one row: scores -> probabilities (masked beyond `visible`),
// updates m and l, and records alpha for the accumulator.
void SoftmaxStep(RowState& row, float scale) {
  const __mmask16 m0 = LaneMask(row.visible), m1 = LaneMask(row.visible - 16);
  const __m512 vs = _mm512_set1_ps(scale);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512 s0 = _mm512_mask_mul_ps(ninf, m0, _mm512_loadu_ps(row.scores), vs);
  const __m512 s1 = _mm512_mask_mul_ps(ninf, m1, _mm512_loadu_ps(row.scores + 16), vs);
  const float chunk_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  const float m_old = *row.m;
  const float m_new = std::max(m_old, chunk_max);
  const __m512 mv = _mm512_set1_ps(m_new);
  const __m512 p0 = _mm512_maskz_mov_ps(m0, Exp(_mm512_sub_ps(s0, mv)));
  const __m512 p1 = _mm512_maskz_mov_ps(m1, Exp(_mm512_sub_ps(s1, mv)));
  _mm512_storeu_ps(row.scores, p0);
  _mm512_storeu_ps(row.scores + 16, p1);
  row.alpha = m_old == -INFINITY ? 0.f : std::exp(m_old - m_new);
  *row.l = *row.l * row.alpha + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  *row.m = m_new;
}

// acc = alpha * acc + P x V over dims [d0, d0 + 16 * NC) for G rows.
template <int G, int NC, class Keys>
STRATA_INLINE void AccumulateV(RowState* rows, const Keys keys, int n, int d0) {
  __m512 acc[G][NC];
  for (int r = 0; r < G; ++r) {
    const __m512 alpha = _mm512_set1_ps(rows[r].alpha);
    for (int c = 0; c < NC; ++c) {
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(rows[r].acc + d0 + 16 * c), alpha);
    }
  }
  for (int j = 0; j < n; ++j) {
    const auto* vr = keys.V(j) + d0;
    __m512 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = Load16(vr + 16 * c);
#pragma GCC unroll 4
    for (int r = 0; r < G; ++r) {
      const __m512 p = _mm512_set1_ps(rows[r].scores[j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < G; ++r) {
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(rows[r].acc + d0 + 16 * c, acc[r][c]);
  }
}

template <int G, class Keys>
void AccumulateVAllDims(RowState* rows, const Keys v, int n, int D) {
  int d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) AccumulateV<G, 4>(rows, v, n, d0);
  switch ((D - d0) / 16) {
    case 3:
      AccumulateV<G, 3>(rows, v, n, d0);
      break;
    case 2:
      AccumulateV<G, 2>(rows, v, n, d0);
      break;
    case 1:
      AccumulateV<G, 1>(rows, v, n, d0);
      break;
    default:
      break;
  }
}

// What the shared driver (kernels/cpu/attention_driver.h) asks of an ISA.
struct Isa {
  template <int G, class Keys>
  static void ProcessGroup(RowState* rows, const Keys keys, int n, int D, float scale) {
    Scores<G>(rows, keys, n, D);
    int n_vis = 0;
    for (int r = 0; r < G; ++r) {
      SoftmaxStep(rows[r], scale);
      n_vis = std::max(n_vis, rows[r].visible);
    }
    // Keys past a row's visible prefix have probability 0 there, so the group can run to the
    // largest prefix.
    AccumulateVAllDims<G>(rows, keys, n_vis, D);
  }
  static void ToFloat(float* out, const uint16_t* in, int D) {
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(out + d, Load16(in + d));
  }
  static void ScaleRow(float* o, const float* acc, float inv, int D) {
    const __m512 vi = _mm512_set1_ps(inv);
    for (int d = 0; d < D; d += 16)
      _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), vi));
  }
};

}  // namespace

void Avx512Attention(const AttentionArgs& a) { AttentionOverChunks<Isa>(a); }

}  // namespace strata::kernels::cpu
