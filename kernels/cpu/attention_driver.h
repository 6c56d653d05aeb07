// The part of the SIMD attention kernels (AVX2, AVX-512, NEON) that is the same on every
// ISA: the walk over a view's keys in chunks of kAttnChunk, the causal cut of each chunk per
// query row, query rows in groups of four (the n_rep heads of consecutive tokens that share
// a KV head), and the final normalization. An ISA supplies only the arithmetic of one group
// against one chunk and the scaling of one output row, so a fix to the walk lands once.
//
// Keys are gathered from consecutive spans into full chunks: a sparse view's groups of a few
// tokens, or a prefix tree's blocks, would otherwise each pay a chunk's softmax update and
// accumulator rescale for a handful of keys. A chunk lying within one span is passed as a
// base and a stride, a gathered one as row pointers. Chunks are cut every kAttnChunk keys of
// the view whether every row sees them or only some (each row then takes the prefix at or
// before its position): where the pass's queries begin changes no chunk, so a row gets the
// same bits in any pass. That costs nothing where it matters: keys a row does not see
// change no bit of its state (probability 0), whatever chunk holds them.
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

// A chunk's keys within one span: key j's K and V rows at k + j * stride, v + j * stride.
struct StridedKeys {
  const uint16_t* k;
  const uint16_t* v;
  int64_t stride;
  const uint16_t* K(int j) const { return k + static_cast<int64_t>(j) * stride; }
  const uint16_t* V(int j) const { return v + static_cast<int64_t>(j) * stride; }
};
// A chunk gathered from several spans: key j's rows at k[j], v[j].
struct GatheredKeys {
  const uint16_t* const* k;
  const uint16_t* const* v;
  const uint16_t* K(int j) const { return k[j]; }
  const uint16_t* V(int j) const { return v[j]; }
};

// A chunk's keys converted to float once for all the groups of rows that use them: key j's
// K and V rows at k + j * d, v + j * d. The conversion is exact, so a row gets the same bits
// from a converted chunk as from the F16 rows.
struct F32Keys {
  const float* k;
  const float* v;
  int d;
  const float* K(int j) const { return k + static_cast<int64_t>(j) * d; }
  const float* V(int j) const { return v + static_cast<int64_t>(j) * d; }
};

// Keys of a chunk each query row sees: the first `all` by every row; of the rest, which
// ascend in position (pos[j] for key j), those at or before the row's own position.
struct ChunkVisibility {
  int n;
  int all;
  const int32_t* pos;
  int32_t q_pos0;
  int operator()(int t) const {
    if (all == n) return n;
    return static_cast<int>(std::upper_bound(pos + all, pos + n, q_pos0 + t) - pos);
  }
  // The first query token that sees a key of the chunk.
  int32_t first_row() const { return all > 0 ? 0 : std::max<int32_t>(0, pos[0] - q_pos0); }
};

// Isa must provide
//   template <int G, class Keys> static void ProcessGroup(AttnRow* rows, const Keys& keys,
//       int n, int D, float scale);  (keys.K(j), keys.V(j): key j's rows of the KV head)
//   static void ScaleRow(float* out, const float* acc, float inv, int D);
// and may provide
//   static void ToFloat(float* out, const uint16_t* in, int D);
// in which case a chunk that several groups of rows use (a prefill's) is converted once and
// passed to ProcessGroup as F32Keys, instead of each group converting it again.
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
  // Scores take four rows' worth (r % 4); the rest of their share holds a converted chunk.
  float* chunk_k = scores + static_cast<int64_t>(n_rows) * kChunk;
  float* chunk_v = chunk_k + static_cast<int64_t>(kChunk) * D;
  std::fill(acc, acc + static_cast<int64_t>(n_rows) * D, 0.f);
  std::fill(m, m + n_rows, -INFINITY);
  std::fill(l, l + n_rows, 0.f);
  // n keys against the rows of tokens t_first on; row t sees the first visible(t) of them.
  // kAll: every row sees every key (a decode step's chunks), the case to keep lean.
  auto groups = [&]<bool kAll>(const auto& keys, const ChunkVisibility& visible, int32_t t_first)
      __attribute__((always_inline)) {
    const int n = visible.n;
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
                   kAll ? n : visible(t),
                   1.f};
      }
      switch (g) {
        case 4:
          Isa::template ProcessGroup<4>(rows, keys, n, D, a.scale);
          break;
        case 3:
          Isa::template ProcessGroup<3>(rows, keys, n, D, a.scale);
          break;
        case 2:
          Isa::template ProcessGroup<2>(rows, keys, n, D, a.scale);
          break;
        default:
          Isa::template ProcessGroup<1>(rows, keys, n, D, a.scale);
          break;
      }
    }
  };
  auto run = [&]<bool kAll>(const auto& keys, const ChunkVisibility& visible)
      __attribute__((always_inline)) {
    const int32_t t_first = kAll ? 0 : visible.first_row();
    if (t_first >= a.n_q) return;
    if constexpr (requires { Isa::ToFloat(chunk_k, keys.K(0), D); }) {
      if (n_rows - t_first * a.n_rep > 4) {
        for (int j = 0; j < visible.n; ++j) {
          Isa::ToFloat(chunk_k + static_cast<int64_t>(j) * D, keys.K(j), D);
          Isa::ToFloat(chunk_v + static_cast<int64_t>(j) * D, keys.V(j), D);
        }
        groups.template operator()<kAll>(F32Keys{chunk_k, chunk_v, D}, visible, t_first);
        return;
      }
    }
    groups.template operator()<kAll>(keys, visible, t_first);
  };
  const int64_t head = static_cast<int64_t>(a.kv_head) * D;
  // The gathered chunk: key j's rows and position. Its first `seen_by_all` keys are at
  // positions every row sees; the rest ascend (a span that would break that is run after a
  // flush), so each row sees a prefix of the chunk.
  const uint16_t *gk[kChunk], *gv[kChunk];
  int32_t gpos[kChunk];
  int gathered = 0, seen_by_all = 0;
  auto flush = [&]() __attribute__((always_inline)) {
    if (gathered == 0) return;
    const ChunkVisibility vis{gathered, seen_by_all, gpos, a.q_pos0};
    if (seen_by_all == gathered)
      run.template operator()<true>(GatheredKeys{gk, gv}, vis);
    else
      run.template operator()<false>(GatheredKeys{gk, gv}, vis);
    gathered = seen_by_all = 0;
  };
  int32_t spos[kChunk];  // positions of an in-place chunk some row sees only in part
  auto gather = [&](const uint16_t* k, const uint16_t* v, int64_t stride, int32_t from, int n) {
    for (int j = 0; j < n; ++j) {
      gk[gathered + j] = k + static_cast<int64_t>(from + j) * stride;
      gv[gathered + j] = v + static_cast<int64_t>(from + j) * stride;
    }
    gathered += n;
  };
  for (int32_t s = 0; s < a.n_spans; ++s) {
    const KvSpan& sp = a.spans[s];
    const uint16_t* k = sp.k + head;
    const uint16_t* v = sp.v + head;
    const bool all_see = sp.pos0 + sp.n_tokens - 1 <= a.q_pos0;
    // Keys some row does not see must follow the chunk's last key in position.
    if (gathered > seen_by_all && sp.pos0 <= gpos[gathered - 1]) flush();
    // Chunks are cut from the keys in view order, every kChunk keys, wherever the pass's
    // queries begin: a row's result then depends only on the view and its own position,
    // not on which other tokens share its pass (a step verified with the tokens generated
    // ahead of it gets the scores it gets alone).
    if (all_see) {
      // Top up the gathered chunk, run the span's whole chunks in place, gather the rest;
      // a span every row sees only follows keys every row sees (else the flush above ran),
      // so no positions are kept.
      int32_t i = 0;
      if (gathered > 0) {
        i = std::min<int32_t>(kChunk - gathered, sp.n_tokens);
        gather(k, v, sp.stride, 0, i);
        seen_by_all += i;
        if (gathered < kChunk) continue;
        flush();
      }
      for (; i + kChunk <= sp.n_tokens; i += kChunk) {
        const int64_t off = static_cast<int64_t>(i) * sp.stride;
        run.template operator()<true>(StridedKeys{k + off, v + off, sp.stride},
                                      ChunkVisibility{kChunk, kChunk, nullptr, a.q_pos0});
      }
      gather(k, v, sp.stride, i, sp.n_tokens - i);
      seen_by_all += sp.n_tokens - i;
      continue;
    }
    for (int32_t i = 0; i < sp.n_tokens;) {
      if (gathered == 0 && sp.n_tokens - i >= kChunk) {
        // A whole chunk within the span runs in place; positions are consecutive.
        const int64_t off = static_cast<int64_t>(i) * sp.stride;
        for (int j = 0; j < kChunk; ++j) spos[j] = sp.pos0 + i + j;
        run.template operator()<false>(StridedKeys{k + off, v + off, sp.stride},
                                       ChunkVisibility{kChunk, 0, spos, a.q_pos0});
        i += kChunk;
        continue;
      }
      const int32_t take = std::min<int32_t>(kChunk - gathered, sp.n_tokens - i);
      for (int32_t j = 0; j < take; ++j) gpos[gathered + j] = sp.pos0 + i + j;
      gather(k, v, sp.stride, i, take);
      i += take;
      if (gathered == kChunk) flush();
    }
  }
  flush();
  for (int r = 0; r < n_rows; ++r) {
    const int t = r / a.n_rep, j = r % a.n_rep;
    float* o = a.out + static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(j) * D;
    if (a.lse) a.lse[r] = l[r] > 0.f ? m[r] + std::log(l[r]) : -INFINITY;
    Isa::ScaleRow(o, acc + static_cast<int64_t>(r) * D, l[r] > 0.f ? 1.f / l[r] : 0.f, D);
  }
}

}  // namespace strata::kernels::cpu

#endif  // STRATA_KERNELS_CPU_ATTENTION_DRIVER_H_
