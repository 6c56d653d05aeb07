// The AVX-512 matmul driver shared by every quantized weight format (internal; included by
// the avx512_matmul_*.cc files only).
//
// Work is organised around "groups" (128 values of the 32-value formats, one 256-value
// super-block of the K formats). For each group:
//   * activations are rearranged once per matmul call into a panel on the stack, in the
//     order that matches how a weight group unpacks into registers, with the per-block
//     scales pre-broadcast (Traits::Prep);
//   * a weight group of one row is unpacked once per register tile (Traits::Decode) and
//     dotted with T tokens from the panel (Traits::Dot), integer dot products with VNNI
//     (vpdpbusd / vpdpwssd) and one float multiply-add per group.
// A register tile is R rows x T tokens of float accumulators, summed across lanes at the
// end with one transpose-and-add tree. Decode (n_tok = 1) uses T = 1 and more rows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/avx512_common.h"
#include "kernels/kernels.h"

namespace strata::kernels::cpu {
namespace {

// Stack budget for the activation panel: with k = 1536 (SmolLM2's FFN down) it holds 21
// tokens of the 32-value formats; larger k is processed in slices of groups.
constexpr size_t kPanelBytes = 64 * 1024;

template <class Tr, int R, int T>
STRATA_INLINE void RunTile(const uint8_t* const* rows, const __m512i* panel, int64_t tok_vecs,
                           int64_t n_full, int64_t tail_bytes, __m512* acc) {
  for (int i = 0; i < R * T; ++i) acc[i] = _mm512_setzero_ps();
    // Row by row, group by group: the tile's weights (adjacent rows) are read as one
    // sequential stream, which the hardware prefetcher follows at full bandwidth, and only
    // one decoded group is live at a time, leaving the registers to the accumulators.
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const uint8_t* row = rows[r];
    for (int64_t g = 0; g < n_full; ++g) {
      typename Tr::W w;
      Tr::template Decode<false>(row + g * Tr::kGroupBytes, 0, w);
      const __m512i* x = panel + g * Tr::kPanelVecs;
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
    }
    if (tail_bytes > 0) {
      typename Tr::W w;
      Tr::template Decode<true>(row + n_full * Tr::kGroupBytes, tail_bytes, w);
      const __m512i* x = panel + n_full * Tr::kPanelVecs;
      for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
    }
  }
}

// A tile of `nt` <= T tokens, decoding each weight group once for all of them: a ragged
// last tile (a batch of 7 is a tile of 4 and one of 3) costs about what its tokens do, not
// one weight decode per token. Accumulators past nt are zeroed.
template <class Tr, int R, int T>
STRATA_INLINE void RunTileUpTo(int nt, const uint8_t* const* rows, const __m512i* panel,
                               int64_t tok_vecs, int64_t n_full, int64_t tail_bytes, __m512* acc) {
  if constexpr (T > 1) {
    if (nt < T) {
      RunTileUpTo<Tr, R, T - 1>(nt, rows, panel, tok_vecs, n_full, tail_bytes, acc);
      for (int i = (T - 1) * R; i < T * R; ++i) acc[i] = _mm512_setzero_ps();
      return;
    }
  }
  RunTile<Tr, R, T>(rows, panel, tok_vecs, n_full, tail_bytes, acc);
}

// Sums the tile's accumulators and writes (or adds, for later slices of k) the valid part.
template <int R, int T>
STRATA_INLINE void StoreTile(const __m512* acc, int nr, int nt, float* y, int64_t y_stride,
                             bool accumulate) {
  constexpr int N = R * T <= 1 ? 1 : R * T <= 2 ? 2 : R * T <= 4 ? 4 : R * T <= 8 ? 8 : 16;
  static_assert(R * T <= 16);
  __m512 v[N];
  for (int i = 0; i < N; ++i) v[i] = i < R * T ? acc[i] : _mm512_setzero_ps();
  alignas(64) float sums[16];
  _mm512_store_ps(sums, ReduceLanes<N>(v));
  for (int t = 0; t < nt; ++t) {
    float* dst = y + t * y_stride;
    for (int r = 0; r < nr; ++r) dst[r] = accumulate ? dst[r] + sums[t * R + r] : sums[t * R + r];
  }
}

// All rows [rb, re) against the tokens of one panel. Ragged tiles repeat their last row or
// token (harmless extra work) and store only the valid part.
template <class Tr, int R, int T>
void PanelTiles(const MatmulArgs& a, int64_t rb, int64_t re, int64_t g0, int64_t n_full,
                int64_t tail_bytes, const __m512i* panel, int64_t tok_vecs, int64_t t0,
                int64_t nt_panel, bool accumulate) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + g0 * Tr::kGroupBytes;
  for (int64_t r0 = rb; r0 < re; r0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, re - r0));
    const uint8_t* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w + (r0 + std::min(r, nr - 1)) * a.w_row_bytes;
    for (int64_t tt = 0; tt < nt_panel; tt += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, nt_panel - tt));
      __m512 acc[R * T];
      RunTileUpTo<Tr, R, T>(nt, rows, panel + tt * tok_vecs, tok_vecs, n_full, tail_bytes, acc);
      StoreTile<R, T>(acc, nr, nt, a.y + (t0 + tt) * a.y_stride + r0, a.y_stride, accumulate);
    }
  }
}

// Groups of the row: n_full complete ones plus a partial one of `tail_bytes` weight bytes
// (32-value formats when k/32 is not a multiple of 4).
template <class Tr, int kGemvRows, int kGemmRows, int kGemmToks>
void MatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re) {
  const int64_t n_blocks = a.k / Tr::kBlockElems;
  const int64_t blocks_per_group = Tr::kGroupElems / Tr::kBlockElems;
  const int64_t n_groups = (n_blocks + blocks_per_group - 1) / blocks_per_group;
  const int64_t group_vec_bytes = Tr::kPanelVecs * 64;
  alignas(64) __m512i panel[kPanelBytes / 64];
  // Slice k so that at least min(n_tok, kGemmToks) tokens fit in the panel.
  const int64_t min_toks = std::min<int64_t>(a.n_tok, kGemmToks);
  const int64_t slice_groups =
      std::max<int64_t>(1, std::min<int64_t>(n_groups, kPanelBytes / (group_vec_bytes * min_toks)));
  for (int64_t g0 = 0; g0 < n_groups; g0 += slice_groups) {
    const int64_t g1 = std::min(n_groups, g0 + slice_groups);
    const bool last_slice = g1 == n_groups;
    const int64_t tail_blocks = last_slice ? n_blocks - (n_groups - 1) * blocks_per_group : 0;
    const bool has_tail = last_slice && tail_blocks < blocks_per_group;
    const int64_t n_full = (g1 - g0) - (has_tail ? 1 : 0);
    const int64_t tail_bytes = has_tail ? tail_blocks * Tr::kBlockBytes : 0;
    const int64_t tok_vecs = (g1 - g0) * Tr::kPanelVecs;
    const int64_t toks_per_panel = std::max<int64_t>(1, kPanelBytes / (tok_vecs * 64));
    for (int64_t t0 = 0; t0 < a.n_tok; t0 += toks_per_panel) {
      const int64_t nt = std::min(a.n_tok - t0, toks_per_panel);
      for (int64_t t = 0; t < nt; ++t) {
        const uint8_t* x = static_cast<const uint8_t*>(a.xq) + (t0 + t) * a.xq_row_bytes +
                           g0 * blocks_per_group * Tr::kActBlockBytes;
        __m512i* out = panel + t * tok_vecs;
        for (int64_t g = 0; g < n_full; ++g) {
          Tr::template Prep<false>(x + g * blocks_per_group * Tr::kActBlockBytes, 0,
                                   out + g * Tr::kPanelVecs);
        }
        if (has_tail) {
          Tr::template Prep<true>(x + n_full * blocks_per_group * Tr::kActBlockBytes,
                                  tail_blocks * Tr::kActBlockBytes, out + n_full * Tr::kPanelVecs);
        }
      }
      if (nt == 1) {
        PanelTiles<Tr, kGemvRows, 1>(a, rb, re, g0, n_full, tail_bytes, panel, tok_vecs, t0, nt,
                                     g0 > 0);
      } else {
        PanelTiles<Tr, kGemmRows, kGemmToks>(a, rb, re, g0, n_full, tail_bytes, panel, tok_vecs, t0,
                                             nt, g0 > 0);
      }
    }
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
