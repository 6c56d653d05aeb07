// NEON attention over F16 KV spans: the chunked online softmax of avx512_attention.cc with
// 4-lane registers. Per key, one F16->F32 conversion of each 4-dim slice of K serves a group
// of up to four query rows (GQA), whose dot products end in one across-lanes add (FADDP).
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/arm/neon_common.h"
#include "kernels/cpu/arm/neon_internal.h"
#include "kernels/cpu/attention_driver.h"
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kChunk = kAttnChunk;

using RowState = AttnRow;

// What the shared driver (kernels/cpu/attention_driver.h) asks of an ISA.
struct Isa {
  template <int G, class Keys>
  static void ProcessGroup(RowState* rows, const Keys keys, int n, int D, float scale) {
    for (int j = 0; j < n; ++j) {
      const uint16_t* kr = keys.K(j);
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
        const uint16_t* vr = keys.V(j) + d0;
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
  static void ScaleRow(float* o, const float* acc, float inv, int D) {
    for (int d = 0; d < D; d += 4) vst1q_f32(o + d, vmulq_n_f32(vld1q_f32(acc + d), inv));
  }
};

}  // namespace

void NeonAttention(const AttentionArgs& a) { AttentionOverChunks<Isa>(a); }

}  // namespace strata::kernels::cpu
