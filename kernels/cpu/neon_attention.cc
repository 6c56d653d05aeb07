// NEON attention over F16 KV spans: the chunked online softmax of avx512_attention.cc with
// 4-lane registers. Per key, one F16->F32 conversion of each 4-dim slice of K serves a group
// of up to four query rows (GQA), whose dot products end in one across-lanes add (FADDP).
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/neon_common.h"
#include "kernels/cpu/neon_internal.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kChunk = kAttnChunk;

struct RowState {
  const float* q;
  float* acc;
  float* scores;
  float* m;
  float* l;
  int visible;
  float alpha;
};

template <int G>
void ProcessGroup(RowState* rows, const uint16_t* k, const uint16_t* v, int64_t stride, int n,
                  int D, float scale) {
  for (int j = 0; j < n; ++j) {
    const uint16_t* kr = k + static_cast<int64_t>(j) * stride;
    float32x4_t part[G];
    for (int r = 0; r < G; ++r) part[r] = vdupq_n_f32(0.f);
    for (int d = 0; d < D; d += 4) {
      const float32x4_t kv = LoadF16x4(kr + d);
      for (int r = 0; r < G; ++r) part[r] = vfmaq_f32(part[r], vld1q_f32(rows[r].q + d), kv);
    }
    for (int r = 0; r < G; ++r) rows[r].scores[j] = vaddvq_f32(part[r]) * scale;
  }
  int n_vis = 0;
  for (int r = 0; r < G; ++r) {
    RowState& row = rows[r];
    if (row.visible == 0) {  // causally masked from the whole chunk: nothing changes
      for (int j = 0; j < kChunk; ++j) row.scores[j] = 0.f;
      row.alpha = 1.f;
      continue;
    }
    float mx = -INFINITY;
    for (int j = 0; j < row.visible; ++j) mx = std::max(mx, row.scores[j]);
    for (int j = row.visible; j < kChunk; ++j) row.scores[j] = -INFINITY;
    const float m_new = std::max(*row.m, mx);
    float32x4_t sum = vdupq_n_f32(0.f);
    for (int j = 0; j < kChunk; j += 4) {
      const float32x4_t p = Exp4(vsubq_f32(vld1q_f32(row.scores + j), vdupq_n_f32(m_new)));
      vst1q_f32(row.scores + j, p);
      sum = vaddq_f32(sum, p);
    }
    row.alpha = *row.m == -INFINITY ? 0.f : std::exp(*row.m - m_new);
    *row.l = *row.l * row.alpha + vaddvq_f32(sum);
    *row.m = m_new;
    n_vis = std::max(n_vis, row.visible);
  }
  for (int d0 = 0; d0 < D; d0 += 16) {
    float32x4_t acc[G][4];
    for (int r = 0; r < G; ++r) {
      for (int c = 0; c < 4; ++c)
        acc[r][c] = vmulq_n_f32(vld1q_f32(rows[r].acc + d0 + 4 * c), rows[r].alpha);
    }
    for (int j = 0; j < n_vis; ++j) {
      const uint16_t* vr = v + static_cast<int64_t>(j) * stride + d0;
      float32x4_t vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = LoadF16x4(vr + 4 * c);
      for (int r = 0; r < G; ++r) {
        const float p = rows[r].scores[j];
        for (int c = 0; c < 4; ++c) acc[r][c] = vfmaq_n_f32(acc[r][c], vv[c], p);
      }
    }
    for (int r = 0; r < G; ++r) {
      for (int c = 0; c < 4; ++c) vst1q_f32(rows[r].acc + d0 + 4 * c, acc[r][c]);
    }
  }
}

}  // namespace

void NeonAttention(const AttentionArgs& a) {
  const int D = a.head_dim;
  const int n_rows = a.n_q * a.n_rep;
  float* base =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(a.scratch) + 63) & ~uintptr_t{63});
  float* acc = base;
  float* m = acc + static_cast<int64_t>(n_rows) * D;
  float* l = m + n_rows;
  float* scores = l + n_rows;
  std::fill(acc, acc + static_cast<int64_t>(n_rows) * D, 0.f);
  std::fill(m, m + n_rows, -INFINITY);
  std::fill(l, l + n_rows, 0.f);
  for (int32_t s = 0; s < a.n_spans; ++s) {
    const KvSpan& sp = a.spans[s];
    for (int32_t c0 = 0; c0 < sp.n_tokens; c0 += kChunk) {
      const int n = std::min<int32_t>(kChunk, sp.n_tokens - c0);
      const int32_t p0 = sp.pos0 + c0;
      const int32_t t_first = std::max<int32_t>(0, p0 - a.q_pos0);
      if (t_first >= a.n_q) continue;
      const int64_t off =
          static_cast<int64_t>(c0) * sp.stride + static_cast<int64_t>(a.kv_head) * D;
      for (int r0 = t_first * a.n_rep; r0 < n_rows; r0 += 4) {
        const int g = std::min(4, n_rows - r0);
        RowState rows[4];
        for (int i = 0; i < g; ++i) {
          const int r = r0 + i, t = r / a.n_rep, j = r % a.n_rep;
          rows[i] = {a.q + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(j) * D,
                     acc + static_cast<int64_t>(r) * D,
                     scores + static_cast<int64_t>(r % 4) * kChunk,
                     m + r,
                     l + r,
                     std::clamp(a.q_pos0 + t - p0 + 1, 0, n),
                     1.f};
        }
        const uint16_t* k = sp.k + off;
        const uint16_t* v = sp.v + off;
        switch (g) {
          case 4:
            ProcessGroup<4>(rows, k, v, sp.stride, n, D, a.scale);
            break;
          case 3:
            ProcessGroup<3>(rows, k, v, sp.stride, n, D, a.scale);
            break;
          case 2:
            ProcessGroup<2>(rows, k, v, sp.stride, n, D, a.scale);
            break;
          default:
            ProcessGroup<1>(rows, k, v, sp.stride, n, D, a.scale);
            break;
        }
      }
    }
  }
  for (int r = 0; r < n_rows; ++r) {
    const int t = r / a.n_rep, j = r % a.n_rep;
    float* o = a.out + static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(j) * D;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    if (a.lse) a.lse[r] = l[r] > 0.f ? m[r] + std::log(l[r]) : -INFINITY;
    for (int d = 0; d < D; d += 4) {
      vst1q_f32(o + d, vmulq_n_f32(vld1q_f32(acc + static_cast<int64_t>(r) * D + d), inv));
    }
  }
}

}  // namespace strata::kernels::cpu
