// The part of the SIMD attention kernels (AVX2, AVX-512, NEON) that is the same on every
// ISA: the walk over a view's spans in chunks of kAttnChunk keys, the causal cut of each
// chunk per query row, query rows in groups of four (the n_rep heads of consecutive tokens
// that share a KV head), and the final normalization. An ISA supplies only the arithmetic
// of one group against one chunk and the scaling of one output row, so a fix to the walk
// lands once.
#ifndef STRATA_KERNELS_CPU_ATTENTION_DRIVER_H_
#define STRATA_KERNELS_CPU_ATTENTION_DRIVER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {

// One query row's state while a chunk is processed.
struct AttnRow {
  const float* q;  // D floats
  float* acc;      // D floats
  float* scores;   // kAttnChunk floats: scores, then probabilities
  float* m;        // running maximum
  float* l;        // running denominator
  int visible;     // keys of the chunk this row sees (a prefix)
  float alpha;     // rescale of the old accumulator for this chunk
};

// Isa must provide
//   template <int G> static void ProcessGroup(AttnRow* rows, const uint16_t* k,
//       const uint16_t* v, int64_t stride, int n, int D, float scale);
//   static void ScaleRow(float* out, const float* acc, float inv, int D);
template <class Isa>
void AttentionOverChunks(const AttentionArgs& a) {
  constexpr int kChunk = kAttnChunk;
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
      // Token t sees key positions <= q_pos0 + t; earlier tokens may see none of the chunk.
      const int32_t t_first = std::max<int32_t>(0, p0 - a.q_pos0);
      if (t_first >= a.n_q) continue;
      const int64_t off =
          static_cast<int64_t>(c0) * sp.stride + static_cast<int64_t>(a.kv_head) * D;
      const uint16_t* k = sp.k + off;
      const uint16_t* v = sp.v + off;
      for (int r0 = t_first * a.n_rep; r0 < n_rows; r0 += 4) {
        const int g = std::min(4, n_rows - r0);
        AttnRow rows[4];
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
        switch (g) {
          case 4:
            Isa::template ProcessGroup<4>(rows, k, v, sp.stride, n, D, a.scale);
            break;
          case 3:
            Isa::template ProcessGroup<3>(rows, k, v, sp.stride, n, D, a.scale);
            break;
          case 2:
            Isa::template ProcessGroup<2>(rows, k, v, sp.stride, n, D, a.scale);
            break;
          default:
            Isa::template ProcessGroup<1>(rows, k, v, sp.stride, n, D, a.scale);
            break;
        }
      }
    }
  }
  for (int r = 0; r < n_rows; ++r) {
    const int t = r / a.n_rep, j = r % a.n_rep;
    float* o = a.out + static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(j) * D;
    if (a.lse) a.lse[r] = l[r] > 0.f ? m[r] + std::log(l[r]) : -INFINITY;
    Isa::ScaleRow(o, acc + static_cast<int64_t>(r) * D, l[r] > 0.f ? 1.f / l[r] : 0.f, D);
  }
}

}  // namespace strata::kernels::cpu

#endif  // STRATA_KERNELS_CPU_ATTENTION_DRIVER_H_
