// AVX2 attention over F16 KV spans: the AVX-512 algorithm (avx512_attention.cc) with 8-lane
// registers, scores two keys at a time and P x V 16 dims at a time so four query rows fit
// in the 16 registers.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention_driver.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/avx2_internal.h"
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kChunk = kAttnChunk;

using RowState = AttnRow;

template <int G, class Keys>
STRATA_INLINE void Scores(RowState* rows, const Keys keys, int n, int D) {
  for (int j0 = 0; j0 < n; j0 += 2) {
    const uint16_t* k0 = keys.K(j0);
    const uint16_t* k1 = keys.K(std::min(j0 + 1, n - 1));
    __m256 part[G][2];
    for (int r = 0; r < G; ++r) part[r][0] = part[r][1] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k0 + d)));
      const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k1 + d)));
      for (int r = 0; r < G; ++r) {
        const __m256 q = _mm256_loadu_ps(rows[r].q + d);
        part[r][0] = _mm256_fmadd_ps(q, a, part[r][0]);
        part[r][1] = _mm256_fmadd_ps(q, b, part[r][1]);
      }
    }
    for (int r = 0; r < G; ++r) {
      const __m128 s = _mm256_castps256_ps128(ReduceLanes8<2>(part[r]));
      _mm_storel_pi(reinterpret_cast<__m64*>(rows[r].scores + j0), s);
    }
  }
}

void SoftmaxStep(RowState& row, float scale) {
  float* s = row.scores;
  float mx = -INFINITY;
  for (int j = 0; j < row.visible; ++j) mx = std::max(mx, s[j] *= scale);
  const float m_new = std::max(*row.m, mx);
  const __m256 vm = _mm256_set1_ps(m_new);
  const __m256 idx = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
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
    const uint16_t* vr = keys.V(j) + d0;
    __m256 vv[NC];
    for (int c = 0; c < NC; ++c) {
      vv[c] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8 * c)));
    }
    for (int r = 0; r < G; ++r) {
      const __m256 p = _mm256_broadcast_ss(rows[r].scores + j);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < G; ++r) {
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(rows[r].acc + d0 + 8 * c, acc[r][c]);
  }
}

// What the shared driver (attention_driver.h) asks of an ISA.
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
  static void ScaleRow(float* o, const float* acc, float inv, int D) {
    const __m256 vi = _mm256_set1_ps(inv);
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vi));
  }
};

}  // namespace

void Avx2Attention(const AttentionArgs& a) { AttentionOverChunks<Isa>(a); }

}  // namespace strata::kernels::cpu
