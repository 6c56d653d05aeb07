// The x86 matmul driver shared by every weight format and both x86 ISAs (internal; included
// by the avx2_matmul_*.cc and avx512_matmul_*.cc files only, each compiled with its own ISA
// flags, so everything has internal linkage). Quantized formats below; float weights
// (FloatMatmul) at the end.
//
// Work is organised around "groups": a few 32-value blocks (two with AVX2, four with
// AVX-512) or one 256-value super-block of the K formats. For each group:
//   * activations are rearranged once per matmul call into a per-thread panel, in the
//     order that matches how a weight group unpacks into registers, with the per-block
//     scales pre-broadcast (Traits::Prep);
//   * a weight group of one row is unpacked once per register tile (Traits::Decode) and
//     dotted with T tokens from the panel (Traits::Dot): integer dot products (VNNI on
//     AVX-512, vpmaddubsw + vpmaddwd on AVX2) and one float multiply-add per group.
// A register tile is R rows x T tokens of float accumulators, summed across lanes at the
// end with one transpose-and-add tree. Decode (n_tok = 1) uses T = 1 and more rows. Where
// the R decoded groups fit the register file beside the accumulators (the 32-value formats
// on AVX-512), a tile goes group by group, so each token's panel vectors are loaded once
// for all R rows; otherwise row by row. Either way each (row, token) sums its groups in
// the same order, so a token's result does not depend on the batch it came in.
//
// The ISA enters through V (Avx2Vec or Avx512Vec from the ISA's common header): the float
// and integer register types, their width, a zero, and the lane-sum tree. The tile shapes
// come from the caller, since they follow the register count (16 on AVX2, 32 on AVX-512).
//
// Traits contract (per weight format and ISA):
//   kBlockElems, kActBlockBytes: values in one weight block, bytes of its activation block;
//   kGroupElems, kGroupBytes, kPanelVecs: one group of weights (whole blocks) and the panel
//   vectors of its activations;
//   W: a decoded weight group; Decode<kTail>(weights, tail_bytes, W&) and
//   Prep<kTail>(activations, tail_act_bytes, V::I* panel), where kTail marks the last,
//   partial group (fewer blocks than a full one: 32-value formats whose k / 32 is not a
//   multiple of the group's blocks) and the byte count says how much of it is valid;
//   Dot(W, const V::I* panel, V::F acc) -> V::F.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <immintrin.h>

#include "kernels/cpu/kernel_table.h"
#include "kernels/kernels.h"

namespace strata::kernels::cpu {
namespace {

template <class V, class Tr, int R, int T>
STRATA_INLINE void RunTile(const uint8_t* const* rows, const typename V::I* panel, int64_t tok_vecs,
                           int64_t n_full, int64_t tail_bytes, typename V::F* acc) {
  for (int i = 0; i < R * T; ++i) acc[i] = V::Zero();
  // Batches whose decoded weights of all R rows, the R x T accumulators and one token's
  // panel vectors fit the register file go group by group: the R rows are decoded once per
  // group and each token's panel vectors are loaded once for all R rows (loads, not
  // arithmetic, bound the row-by-row order below when the decode is cheap). Formats whose
  // decoded group is large (the K super-blocks) keep the row-by-row order.
  constexpr int kWeightRegs = int(sizeof(typename Tr::W) / sizeof(typename V::F));
  if constexpr (T > 1 && R * kWeightRegs + R * T + Tr::kPanelVecs <= V::kRegs) {
    for (int64_t g = 0; g < n_full; ++g) {
      typename Tr::W w[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        Tr::template Decode<false>(rows[r] + g * Tr::kGroupBytes, 0, w[r]);
      const typename V::I* x = panel + g * Tr::kPanelVecs;
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
          acc[t * R + r] = Tr::Dot(w[r], x + t * tok_vecs, acc[t * R + r]);
      }
    }
    if (tail_bytes > 0) {
      for (int r = 0; r < R; ++r) {
        typename Tr::W w;
        Tr::template Decode<true>(rows[r] + n_full * Tr::kGroupBytes, tail_bytes, w);
        const typename V::I* x = panel + n_full * Tr::kPanelVecs;
        for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
      }
    }
    return;
  }
  // Row by row, group by group: the tile's weights (adjacent rows) are read as one
  // sequential stream, prefetched ahead in decode, and only one decoded group is live at a
  // time, leaving the registers to the accumulators.
  [[maybe_unused]] const bool prefetch_to_l2 =
      T == 1 && tok_vecs * int64_t{sizeof(typename V::I)} > MatmulPrefetchToL2PanelBytes();
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const uint8_t* row = rows[r];
    for (int64_t g = 0; g < n_full; ++g) {
      typename Tr::W w;
      if constexpr (T == 1) {
        // Decode: each weight byte is used once, straight from DRAM (kMatmulPrefetchBytes).
        // A row's stream runs on into the next row of the tile or the thread's range; past
        // the matrix's end a prefetch is only a hint, it never faults.
        const char* pf =
            reinterpret_cast<const char*>(row + g * Tr::kGroupBytes) + kMatmulPrefetchBytes;
        if (prefetch_to_l2) {
          for (int l = 0; l < Tr::kGroupBytes; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
        } else {
          for (int l = 0; l < Tr::kGroupBytes; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
        }
      }
      Tr::template Decode<false>(row + g * Tr::kGroupBytes, 0, w);
      const typename V::I* x = panel + g * Tr::kPanelVecs;
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
    }
    if (tail_bytes > 0) {
      typename Tr::W w;
      Tr::template Decode<true>(row + n_full * Tr::kGroupBytes, tail_bytes, w);
      const typename V::I* x = panel + n_full * Tr::kPanelVecs;
      for (int t = 0; t < T; ++t) acc[t * R + r] = Tr::Dot(w, x + t * tok_vecs, acc[t * R + r]);
    }
  }
}

// A tile of `nt` <= T tokens, decoding each weight group once for all of them: a ragged
// last tile (a batch of 7 is a tile of 4 and one of 3) costs about what its tokens do, not
// one weight decode per token. Accumulators past nt are zeroed.
template <class V, class Tr, int R, int T>
STRATA_INLINE void RunTileUpTo(int nt, const uint8_t* const* rows, const typename V::I* panel,
                               int64_t tok_vecs, int64_t n_full, int64_t tail_bytes,
                               typename V::F* acc) {
  if constexpr (T > 1) {
    if (nt < T) {
      RunTileUpTo<V, Tr, R, T - 1>(nt, rows, panel, tok_vecs, n_full, tail_bytes, acc);
      for (int i = (T - 1) * R; i < T * R; ++i) acc[i] = V::Zero();
      return;
    }
  }
  RunTile<V, Tr, R, T>(rows, panel, tok_vecs, n_full, tail_bytes, acc);
}

// Sums the tile's accumulators and writes (or adds, for later slices of k) the valid part.
template <class V, int R, int T>
STRATA_INLINE void StoreTile(const typename V::F* acc, int nr, int nt, float* y, int64_t y_stride,
                             bool accumulate) {
  static_assert(R * T <= V::kLanes, "a tile's sums must fit one register");
  constexpr int N = R * T <= 1 ? 1 : R * T <= 2 ? 2 : R * T <= 4 ? 4 : R * T <= 8 ? 8 : 16;
  typename V::F v[N];
  for (int i = 0; i < N; ++i) v[i] = i < R * T ? acc[i] : V::Zero();
  alignas(64) float sums[V::kLanes];
  V::StoreSums(sums, V::template Sum<N>(v));
  for (int t = 0; t < nt; ++t) {
    float* dst = y + t * y_stride;
    for (int r = 0; r < nr; ++r) dst[r] = accumulate ? dst[r] + sums[t * R + r] : sums[t * R + r];
  }
}

// All rows [rb, re) against the tokens of one panel. Ragged tiles repeat their last row or
// token (harmless extra work) and store only the valid part.
template <class V, class Tr, int R, int T>
void PanelTiles(const MatmulArgs& a, int64_t rb, int64_t re, int64_t g0, int64_t n_full,
                int64_t tail_bytes, const typename V::I* panel, int64_t tok_vecs, int64_t t0,
                int64_t nt_panel, bool accumulate) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + g0 * Tr::kGroupBytes;
  for (int64_t r0 = rb; r0 < re; r0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, re - r0));
    const uint8_t* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w + (r0 + std::min(r, nr - 1)) * a.w_row_bytes;
    for (int64_t tt = 0; tt < nt_panel; tt += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, nt_panel - tt));
      typename V::F acc[R * T];
      RunTileUpTo<V, Tr, R, T>(nt, rows, panel + tt * tok_vecs, tok_vecs, n_full, tail_bytes, acc);
      StoreTile<V, R, T>(acc, nr, nt, a.y + (t0 + tt) * a.y_stride + r0, a.y_stride, accumulate);
    }
  }
}

// Groups per slice of k: as many as kGemmToks tokens' panel vectors fit the panel. The
// slices do not depend on n_tok: each slice's sums are added to y, so slicing decides the
// order in which a (row, token)'s groups are summed, and a token must get the same bits in
// any batch. A kernel that replaces this driver for some batches sums in the same slices.
inline int64_t SliceGroups(int64_t n_groups, int64_t group_vec_bytes, int64_t gemm_toks) {
  return std::max<int64_t>(
      1, std::min<int64_t>(n_groups, MatmulPanelBytes() / (group_vec_bytes * gemm_toks)));
}

// Rows [rb, re) of y = W x for every token. Groups of the row: n_full complete ones plus a
// partial one of `tail_bytes` weight bytes (32-value formats when k / 32 is not a multiple
// of the group's blocks).
template <class V, class Tr, int kGemvRows, int kGemmRows, int kGemmToks>
void MatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re) {
  using I = typename V::I;
  const int64_t n_blocks = a.k / Tr::kBlockElems;
  const int64_t blocks_per_group = Tr::kGroupElems / Tr::kBlockElems;
  const int64_t n_groups = (n_blocks + blocks_per_group - 1) / blocks_per_group;
  const int64_t group_vec_bytes = Tr::kPanelVecs * int64_t{sizeof(I)};
  const int64_t kPanelBytes = MatmulPanelBytes();
  I* const panel = static_cast<I*>(ThreadMatmulPanel());
  const int64_t slice_groups = SliceGroups(n_groups, group_vec_bytes, kGemmToks);
  for (int64_t g0 = 0; g0 < n_groups; g0 += slice_groups) {
    const int64_t g1 = std::min(n_groups, g0 + slice_groups);
    const bool last_slice = g1 == n_groups;
    const int64_t tail_blocks = last_slice ? n_blocks - (n_groups - 1) * blocks_per_group : 0;
    const bool has_tail = last_slice && tail_blocks < blocks_per_group;
    const int64_t n_full = (g1 - g0) - (has_tail ? 1 : 0);
    const int64_t tail_bytes = has_tail ? tail_blocks * (Tr::kGroupBytes / blocks_per_group) : 0;
    const int64_t tok_vecs = (g1 - g0) * Tr::kPanelVecs;
    const int64_t toks_per_panel =
        std::max<int64_t>(1, kPanelBytes / (tok_vecs * int64_t{sizeof(I)}));
    for (int64_t t0 = 0; t0 < a.n_tok; t0 += toks_per_panel) {
      const int64_t nt = std::min(a.n_tok - t0, toks_per_panel);
      for (int64_t t = 0; t < nt; ++t) {
        const uint8_t* x = static_cast<const uint8_t*>(a.xq) + (t0 + t) * a.xq_row_bytes +
                           g0 * blocks_per_group * Tr::kActBlockBytes;
        I* out = panel + t * tok_vecs;
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
        PanelTiles<V, Tr, kGemvRows, 1>(a, rb, re, g0, n_full, tail_bytes, panel, tok_vecs, t0, nt,
                                        g0 > 0);
      } else {
        PanelTiles<V, Tr, kGemmRows, kGemmToks>(a, rb, re, g0, n_full, tail_bytes, panel, tok_vecs,
                                                t0, nt, g0 > 0);
      }
    }
  }
}

// Float weights (F32, F16, BF16) with F32 activations: R x T register tiles over the whole
// of k, no panel (the activations are already floats). Tile::Run<R, T>(rows, xs, k, acc)
// is the ISA's inner loop: its weight conversion and its ragged end of k.
template <class V, class Tile, int R, int T>
void FloatMatmul(const MatmulArgs& a, int64_t rb, int64_t re) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const uint8_t* x = static_cast<const uint8_t*>(a.xq);
  for (int64_t t0 = 0; t0 < a.n_tok; t0 += T) {
    const int nt = static_cast<int>(std::min<int64_t>(T, a.n_tok - t0));
    const float* xs[T];
    for (int t = 0; t < T; ++t) {
      xs[t] = reinterpret_cast<const float*>(x + (t0 + std::min(t, nt - 1)) * a.xq_row_bytes);
    }
    for (int64_t r0 = rb; r0 < re; r0 += R) {
      const int nr = static_cast<int>(std::min<int64_t>(R, re - r0));
      const uint8_t* rows[R];
      for (int r = 0; r < R; ++r) rows[r] = w + (r0 + std::min(r, nr - 1)) * a.w_row_bytes;
      typename V::F acc[R * T];
      Tile::template Run<R, T>(rows, xs, a.k, acc);
      StoreTile<V, R, T>(acc, nr, nt, a.y + t0 * a.y_stride + r0, a.y_stride, false);
    }
  }
}

// Decode (one token) takes more rows per tile; batches share each weight load among T
// tokens.
template <class V, template <DType> class Tile, int kGemvRows, int kGemmRows, int kGemmToks>
void FloatMatmulAnyType(const MatmulArgs& a, int64_t rb, int64_t re) {
  auto run = [&]<DType kType>() {
    if (a.n_tok == 1) {
      FloatMatmul<V, Tile<kType>, kGemvRows, 1>(a, rb, re);
    } else {
      FloatMatmul<V, Tile<kType>, kGemmRows, kGemmToks>(a, rb, re);
    }
  };
  switch (a.wtype) {
    case DType::kF32:
      return run.template operator()<DType::kF32>();
    case DType::kF16:
      return run.template operator()<DType::kF16>();
    default:
      return run.template operator()<DType::kBF16>();
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
