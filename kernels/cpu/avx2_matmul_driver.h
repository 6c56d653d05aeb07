// The AVX2 matmul driver (internal; included by avx2_matmul_q.cc only). Same organisation
// as avx512_matmul_driver.h with 256-bit registers: activations rearranged once per call
// into a stack panel, then R x T register tiles over "groups" (two 32-value blocks, or one
// K super-block), rows read sequentially. AVX2 has 16 vector registers, hence the smaller
// tiles, and no VNNI: u8 x s8 products go through vpmaddubsw + vpmaddwd.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/avx2_common.h"
#include "kernels/kernels.h"

namespace strata::kernels::cpu {
namespace {

constexpr size_t kPanelBytes2 = 64 * 1024;

template <class Tr, int R, int T>
STRATA_INLINE void RunTile2(const uint8_t* const* rows, const __m256i* panel, int64_t tok_vecs,
                            int64_t n_full, bool tail, __m256* acc) {
  for (int i = 0; i < R * T; ++i) acc[i] = _mm256_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const uint8_t* row = rows[r];
    for (int64_t g = 0; g < n_full; ++g) {
      typename Tr::W w;
      Tr::template Decode<false>(row + g * Tr::kGroupBytes, w);
      const __m256i* x = panel + g * Tr::kPanelVecs;
      for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
    }
    if (tail) {
      typename Tr::W w;
      Tr::template Decode<true>(row + n_full * Tr::kGroupBytes, w);
      const __m256i* x = panel + n_full * Tr::kPanelVecs;
      for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
    }
  }
}

// A tile of `nt` <= T tokens that decodes each weight group once for all of them (see
// RunTileUpTo in the AVX-512 driver). Accumulators past nt are zeroed.
template <class Tr, int R, int T>
STRATA_INLINE void RunTileUpTo2(int nt, const uint8_t* const* rows, const __m256i* panel,
                                int64_t tok_vecs, int64_t n_full, bool tail, __m256* acc) {
  if constexpr (T > 1) {
    if (nt < T) {
      RunTileUpTo2<Tr, R, T - 1>(nt, rows, panel, tok_vecs, n_full, tail, acc);
      for (int i = (T - 1) * R; i < T * R; ++i) acc[i] = _mm256_setzero_ps();
      return;
    }
  }
  RunTile2<Tr, R, T>(rows, panel, tok_vecs, n_full, tail, acc);
}

template <int R, int T>
STRATA_INLINE void StoreTile2(const __m256* acc, int nr, int nt, float* y, int64_t y_stride,
                              bool accumulate) {
  static_assert(R * T <= 8);
  constexpr int N = R * T <= 1 ? 1 : R * T <= 2 ? 2 : R * T <= 4 ? 4 : 8;
  __m256 v[N];
  for (int i = 0; i < N; ++i) v[i] = i < R * T ? acc[i] : _mm256_setzero_ps();
  alignas(32) float sums[8];
  _mm256_store_ps(sums, ReduceLanes8<N>(v));
  for (int t = 0; t < nt; ++t) {
    float* dst = y + t * y_stride;
    for (int r = 0; r < nr; ++r) dst[r] = accumulate ? dst[r] + sums[t * R + r] : sums[t * R + r];
  }
}

template <class Tr, int R, int T>
void PanelTiles2(const MatmulArgs& a, int64_t rb, int64_t re, int64_t g0, int64_t n_full, bool tail,
                 const __m256i* panel, int64_t tok_vecs, int64_t t0, int64_t nt_panel,
                 bool accumulate) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + g0 * Tr::kGroupBytes;
  for (int64_t r0 = rb; r0 < re; r0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, re - r0));
    const uint8_t* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w + (r0 + std::min(r, nr - 1)) * a.w_row_bytes;
    for (int64_t tt = 0; tt < nt_panel; tt += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, nt_panel - tt));
      __m256 acc[R * T];
      RunTileUpTo2<Tr, R, T>(nt, rows, panel + tt * tok_vecs, tok_vecs, n_full, tail, acc);
      StoreTile2<R, T>(acc, nr, nt, a.y + (t0 + tt) * a.y_stride + r0, a.y_stride, accumulate);
    }
  }
}

template <class Tr, int kGemvRows, int kGemmRows, int kGemmToks>
void MatmulQuantized2(const MatmulArgs& a, int64_t rb, int64_t re) {
  const int64_t n_blocks = a.k / Tr::kBlockElems;
  const int64_t bpg = Tr::kGroupElems / Tr::kBlockElems;  // blocks per group: 1 or 2
  const int64_t n_groups = (n_blocks + bpg - 1) / bpg;
  const int64_t group_vec_bytes = Tr::kPanelVecs * 32;
  alignas(32) __m256i panel[kPanelBytes2 / 32];
  const int64_t min_toks = std::min<int64_t>(a.n_tok, kGemmToks);
  const int64_t slice_groups = std::max<int64_t>(
      1, std::min<int64_t>(n_groups, kPanelBytes2 / (group_vec_bytes * min_toks)));
  for (int64_t g0 = 0; g0 < n_groups; g0 += slice_groups) {
    const int64_t g1 = std::min(n_groups, g0 + slice_groups);
    const bool tail = g1 == n_groups && n_blocks % bpg != 0;
    const int64_t n_full = (g1 - g0) - (tail ? 1 : 0);
    const int64_t tok_vecs = (g1 - g0) * Tr::kPanelVecs;
    const int64_t toks_per_panel = std::max<int64_t>(1, kPanelBytes2 / (tok_vecs * 32));
    for (int64_t t0 = 0; t0 < a.n_tok; t0 += toks_per_panel) {
      const int64_t nt = std::min(a.n_tok - t0, toks_per_panel);
      for (int64_t t = 0; t < nt; ++t) {
        const uint8_t* x = static_cast<const uint8_t*>(a.xq) + (t0 + t) * a.xq_row_bytes +
                           g0 * bpg * Tr::kActBlockBytes;
        __m256i* out = panel + t * tok_vecs;
        for (int64_t g = 0; g < n_full; ++g) {
          Tr::template Prep<false>(x + g * bpg * Tr::kActBlockBytes, out + g * Tr::kPanelVecs);
        }
        if (tail) {
          Tr::template Prep<true>(x + n_full * bpg * Tr::kActBlockBytes,
                                  out + n_full * Tr::kPanelVecs);
        }
      }
      if (nt == 1) {
        PanelTiles2<Tr, kGemvRows, 1>(a, rb, re, g0, n_full, tail, panel, tok_vecs, t0, nt, g0 > 0);
      } else {
        PanelTiles2<Tr, kGemmRows, kGemmToks>(a, rb, re, g0, n_full, tail, panel, tok_vecs, t0, nt,
                                              g0 > 0);
      }
    }
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
