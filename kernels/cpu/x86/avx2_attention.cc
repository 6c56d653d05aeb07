// AVX2 attention over F16 KV spans: the AVX-512 algorithm (avx512_attention.cc) with 8-lane
// registers, scores four keys for two rows at a time and P x V 16 dims at a time so four
// query rows fit in the 16 registers. A chunk several groups of rows use (a prefill's) is
// converted to float once (ToFloat), not once a group.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/attention_driver.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/x86/avx2_common.h"
#include "kernels/cpu/x86/avx2_internal.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kChunk = kAttnChunk;

using RowState = AttnRow;

STRATA_INLINE __m256 Load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
STRATA_INLINE __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }

// Scores of R rows (one or two) against keys [0, n) of the chunk, four keys at a time (n
// rounded up to four: the extra keys repeat the last one and the softmax step masks them).
// Two rows' eight accumulators, the four keys and a query slice fit in the 16 registers;
// one reduction tree gives a row's four scores.
template <int R, class Keys>
STRATA_INLINE void ScoreRows(RowState* rows, const Keys keys, int n, int D) {
  for (int j0 = 0; j0 < n; j0 += 4) {
    using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(keys.K(0))>>;
    const Elem* kr[4];
    for (int j = 0; j < 4; ++j) kr[j] = keys.K(std::min(j0 + j, n - 1));
    __m256 part[R][4];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) part[r][j] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      __m256 kv[4];
      for (int j = 0; j < 4; ++j) kv[j] = Load8(kr[j] + d);
      for (int r = 0; r < R; ++r) {
        const __m256 q = _mm256_loadu_ps(rows[r].q + d);
        for (int j = 0; j < 4; ++j) part[r][j] = _mm256_fmadd_ps(q, kv[j], part[r][j]);
      }
    }
    for (int r = 0; r < R; ++r)
      _mm_storeu_ps(rows[r].scores + j0, _mm256_castps256_ps128(ReduceLanes8<4>(part[r])));
  }
}

template <int G, class Keys>
STRATA_INLINE void Scores(RowState* rows, const Keys keys, int n, int D) {
  for (int r = 0; r + 2 <= G; r += 2) ScoreRows<2>(rows + r, keys, n, D);
  if constexpr (G % 2 == 1) ScoreRows<1>(rows + G - 1, keys, n, D);
}

void SoftmaxStep(RowState& row, float scale) {
  float* s = row.scores;
  const __m256 idx = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 vmax = ninf;
  for (int j = 0; j < kChunk; j += 8) {
    // Lanes at or past `visible` are left out of the maximum (and get probability 0 below).
    const __m256 keep = _mm256_cmp_ps(_mm256_add_ps(idx, _mm256_set1_ps(static_cast<float>(j))),
                                      _mm256_set1_ps(static_cast<float>(row.visible)), _CMP_LT_OQ);
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), vs);
    _mm256_storeu_ps(s + j, x);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, x, keep));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float m_new = std::max(*row.m, _mm_cvtss_f32(h));
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < kChunk; j += 8) {
    // Lanes at or past `visible` get probability 0.
    const __m256 keep = _mm256_cmp_ps(_mm256_add_ps(idx, _mm256_set1_ps(static_cast<float>(j))),
                                      _mm256_set1_ps(static_cast<float>(row.visible)), _CMP_LT_OQ);
    const __m256 p = _mm256_and_ps(keep, Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
    _mm256_storeu_ps(s + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  row.alpha = *row.m == -INFINITY ? 0.f : std::exp(*row.m - m_new);
  *row.l = *row.l * row.alpha + _mm256_cvtss_f32(ReduceLanes8<1>(&sum));
  *row.m = m_new;
}

template <int G, int NC, class Keys>
STRATA_INLINE void AccumulateV(RowState* rows, const Keys keys, int n, int d0) {
  __m256 acc[G][NC];
  for (int r = 0; r < G; ++r) {
    const __m256 alpha = _mm256_set1_ps(rows[r].alpha);
    for (int c = 0; c < NC; ++c)
      acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(rows[r].acc + d0 + 8 * c), alpha);
  }
  for (int j = 0; j < n; ++j) {
    const auto* vr = keys.V(j) + d0;
    __m256 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = Load8(vr + 8 * c);
    for (int r = 0; r < G; ++r) {
      const __m256 p = _mm256_broadcast_ss(rows[r].scores + j);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < G; ++r) {
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(rows[r].acc + d0 + 8 * c, acc[r][c]);
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
    for (int d0 = 0; d0 < D; d0 += 16) AccumulateV<G, 2>(rows, keys, n_vis, d0);
  }
  static void ToFloat(float* out, const uint16_t* in, int D) {
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, Load8(in + d));
  }
  static void ScaleRow(float* o, const float* acc, float inv, int D) {
    const __m256 vi = _mm256_set1_ps(inv);
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vi));
  }
};

}  // namespace

void Avx2Attention(const AttentionArgs& a) { AttentionOverChunks<Isa>(a); }

}  // namespace strata::kernels::cpu
