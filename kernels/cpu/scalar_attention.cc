// Reference attention over KV spans: per query row, one pass over every visible key with
// an online softmax (running max m, running denominator l, rescaled accumulator).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/scalar_internal.h"

namespace strata::kernels {
namespace cpu {

void ScalarAttention(const AttentionArgs& a) {
  const int D = a.head_dim;
  float* acc = a.scratch;  // D floats, reused per query row
  for (int32_t t = 0; t < a.n_q; ++t) {
    const int32_t qpos = a.q_pos0 + t;
    for (int32_t j = 0; j < a.n_rep; ++j) {
      const float* q = a.q + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(j) * D;
      float* out = a.out + static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(j) * D;
      float m = -std::numeric_limits<float>::infinity(), l = 0.f;
      std::fill(acc, acc + D, 0.f);
      for (int32_t s = 0; s < a.n_spans; ++s) {
        const KvSpan& sp = a.spans[s];
        const int32_t visible = std::min(sp.n_tokens, qpos - sp.pos0 + 1);
        for (int32_t i = 0; i < visible; ++i) {
          const uint16_t* k =
              sp.k + static_cast<int64_t>(i) * sp.stride + static_cast<int64_t>(a.kv_head) * D;
          const uint16_t* v =
              sp.v + static_cast<int64_t>(i) * sp.stride + static_cast<int64_t>(a.kv_head) * D;
          float score = 0.f;
          for (int d = 0; d < D; ++d) score += q[d] * F16ToF32(k[d]);
          score *= a.scale;
          if (score > m) {
            const float r = std::exp(m - score);  // exp(-inf) = 0 on the first key
            l *= r;
            for (int d = 0; d < D; ++d) acc[d] *= r;
            m = score;
          }
          const float p = std::exp(score - m);
          l += p;
          for (int d = 0; d < D; ++d) acc[d] += p * F16ToF32(v[d]);
        }
      }
      // A row that sees no key (only possible with a malformed view) gets zeros, not NaN.
      const float inv = l > 0.f ? 1.f / l : 0.f;
      for (int d = 0; d < D; ++d) out[d] = acc[d] * inv;
      if (a.lse) a.lse[t * a.n_rep + j] = l > 0.f ? m + std::log(l) : -INFINITY;
    }
  }
}

}  // namespace cpu

size_t AttentionScratchFloats(int32_t n_q, int32_t n_rep, int32_t head_dim) {
  // Per query row: accumulator, running max and sum, one chunk of scores; per chunk: the
  // chunk's keys and values converted to float; plus slack for 64-byte alignment.
  const size_t rows =
      static_cast<size_t>(std::max(n_q, 0)) * static_cast<size_t>(std::max(n_rep, 0));
  const size_t d = static_cast<size_t>(std::max(head_dim, 0));
  return rows * (d + 2 + cpu::kAttnChunk) + 2 * cpu::kAttnChunk * d + 64;
}

}  // namespace strata::kernels
