// AVX-512 matmul for float weights (F32, F16, BF16) with F32 activations, and ScoreTiles.
// Register tiles of R rows x T tokens, 16 values per step, weights converted to F32 in
// registers (F16C for F16, a 16-bit shift for BF16); ragged k uses masked loads.
#include <algorithm>
#include <array>
#include <utility>

#include "kernels/cpu/avx512_common.h"
#include "kernels/cpu/avx512_internal.h"
#include "kernels/cpu/x86_unpack_q4.h"

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

// One dimension of a tile's 16 tokens as floats: F16 halves, or Q8/Q4 integers (unscaled).
template <ScoreType kType>
STRATA_INLINE __m512 LoadKeys(const uint8_t* tile, int64_t j) {
  if constexpr (kType == ScoreType::kQ8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + j * kScoreTile));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else if constexpr (kType == ScoreType::kQ4) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(UnpackQ4x16(tile + j * (kScoreTile / 2))));
  } else {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + j * kScoreTile * 2)));
  }
}

// NQ queries against one tile: one converted key vector feeds NQ accumulators; Q8 and Q4
// apply the tokens' scales once at the end.
template <int NQ, ScoreType kType>
inline void ScoreTile(const uint8_t* tile, int64_t cols, const float* x, float* y,
                      int64_t y_stride) {
  __m512 acc[NQ];
  for (int q = 0; q < NQ; ++q) acc[q] = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; ++j) {
    const __m512 k = LoadKeys<kType>(tile, j);
    for (int q = 0; q < NQ; ++q)
      acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(x[q * cols + j]), k, acc[q]);
  }
  if constexpr (kType != ScoreType::kF16) {
    const __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + ScoreValueBytes(kType, cols))));
    for (int q = 0; q < NQ; ++q) acc[q] = _mm512_mul_ps(acc[q], s);
  }
  for (int q = 0; q < NQ; ++q) _mm512_storeu_ps(y + q * y_stride, acc[q]);
}

// ScoreTile<1..12, kType>, by query count - 1.
using ScoreTileFn = void (*)(const uint8_t*, int64_t, const float*, float*, int64_t);
template <ScoreType kType, int... N>
constexpr std::array<ScoreTileFn, sizeof...(N)> ScoreTileTable(std::integer_sequence<int, N...>) {
  return {&ScoreTile<N + 1, kType>...};
}
template <ScoreType kType>
constexpr auto kTail = ScoreTileTable<kType>(std::make_integer_sequence<int, 12>());

template <ScoreType kType>
void ScoreTilesAny(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                   const float* x, int64_t n_x, float* y, int64_t y_stride) {
  static_assert(kScoreTile == 16, "one tile is one __m512");
  const int64_t tile_bytes = ScoreTileBytes(kType, cols);
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint8_t* tile = tiles + i * tile_bytes;
    float* yo = y + (i - tile_begin) * kScoreTile;
    int64_t q = 0;
    // Up to 12 queries share one pass over the tile (32 registers: 12 accumulators, the key,
    // the broadcasts), so 9 heads convert each key vector once, not twice.
    for (; n_x - q > 12; q += 8)
      ScoreTile<8, kType>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
    if (q < n_x) kTail<kType>[n_x - q - 1](tile, cols, x + q * cols, yo + q * y_stride, y_stride);
  }
}

}  // namespace

void Avx512ScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kF16>(reinterpret_cast<const uint8_t*>(tiles), tile_begin, tile_end,
                                 cols, x, n_x, y, y_stride);
}

void Avx512ScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kQ8>(tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

void Avx512ScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kQ4>(tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

}  // namespace strata::kernels::cpu
