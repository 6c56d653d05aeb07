// AVX-512 matmul for float weights (F32, F16, BF16) with F32 activations, and ScoreTilesF16.
// Register tiles of R rows x T tokens, 16 values per step, weights converted to F32 in
// registers (F16C for F16, a 16-bit shift for BF16); ragged k uses masked loads.
#include <algorithm>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/avx512_internal.h"

namespace strata::kernels::cpu {
namespace {

template <DType kType>
STRATA_INLINE __m512 LoadW(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (kType == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kType == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + i));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType kType>
STRATA_INLINE __m512 LoadW(const uint8_t* row, int64_t i) {
  if constexpr (kType == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kType == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + i)));
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType kType, int R, int T>
STRATA_INLINE void FloatTile(const uint8_t* const* rows, const float* const* xs, int64_t k,
                             __m512* acc) {
  for (int i = 0; i < R * T; ++i) acc[i] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 w = LoadW<kType>(rows[r], i);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[t * R + r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xs[t] + i), acc[t * R + r]);
      }
    }
  }
  if (i < k) {
    const __mmask16 m = LaneMask(k - i);
    for (int r = 0; r < R; ++r) {
      const __m512 w = LoadW<kType>(rows[r], i, m);
      for (int t = 0; t < T; ++t) {
        acc[t * R + r] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, xs[t] + i), acc[t * R + r]);
      }
    }
  }
}

template <int R, int T>
STRATA_INLINE void StoreSums(const __m512* acc, int nr, int nt, float* y, int64_t y_stride) {
  constexpr int N = R * T <= 1 ? 1 : R * T <= 2 ? 2 : R * T <= 4 ? 4 : R * T <= 8 ? 8 : 16;
  __m512 v[N];
  for (int j = 0; j < N; ++j) v[j] = j < R * T ? acc[j] : _mm512_setzero_ps();
  alignas(64) float sums[16];
  _mm512_store_ps(sums, ReduceLanes<N>(v));
  for (int t = 0; t < nt; ++t) {
    for (int r = 0; r < nr; ++r) y[t * y_stride + r] = sums[t * R + r];
  }
}

template <DType kType, int R, int T>
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
      __m512 acc[R * T];
      FloatTile<kType, R, T>(rows, xs, a.k, acc);
      StoreSums<R, T>(acc, nr, nt, a.y + t0 * a.y_stride + r0, a.y_stride);
    }
  }
}

template <DType kType>
void FloatMatmulAny(const MatmulArgs& a, int64_t rb, int64_t re) {
  if (a.n_tok == 1) {
    FloatMatmul<kType, 8, 1>(a, rb, re);
  } else {
    FloatMatmul<kType, 4, 4>(a, rb, re);
  }
}

}  // namespace

void Avx512MatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kF32:
      return FloatMatmulAny<DType::kF32>(a, rb, re);
    case DType::kF16:
      return FloatMatmulAny<DType::kF16>(a, rb, re);
    default:
      return FloatMatmulAny<DType::kBF16>(a, rb, re);
  }
}

namespace {

// NQ queries against one tile: one converted key vector feeds NQ accumulators.
template <int NQ>
inline void ScoreTile(const uint16_t* tile, int64_t cols, const float* x, float* y,
                      int64_t y_stride) {
  __m512 acc[NQ];
  for (int q = 0; q < NQ; ++q) acc[q] = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; ++j) {
    const __m512 k = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + j * kScoreTile)));
    for (int q = 0; q < NQ; ++q)
      acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(x[q * cols + j]), k, acc[q]);
  }
  for (int q = 0; q < NQ; ++q) _mm512_storeu_ps(y + q * y_stride, acc[q]);
}

}  // namespace

void Avx512ScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride) {
  static_assert(kScoreTile == 16, "one tile is one __m512");
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint16_t* tile = tiles + i * cols * kScoreTile;
    float* yo = y + (i - tile_begin) * kScoreTile;
    int64_t q = 0;
    for (; q + 8 <= n_x; q += 8)
      ScoreTile<8>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
    for (; q + 4 <= n_x; q += 4)
      ScoreTile<4>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
    for (; q < n_x; ++q) ScoreTile<1>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
  }
}

}  // namespace strata::kernels::cpu
