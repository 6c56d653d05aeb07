// AVX2 matmul for float weights (F32, F16, BF16) with F32 activations, and ScoreTilesF16:
// R x T register tiles, 8 values per step, weights converted in registers; the last k % 8
// values go through a zero-padded copy.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/x86/avx2_common.h"
#include "kernels/cpu/x86/avx2_internal.h"
#include "kernels/cpu/x86/x86_matmul_driver.h"
#include "kernels/cpu/x86/x86_unpack_q4.h"

namespace strata::kernels::cpu {
namespace {

template <DType kType>
STRATA_INLINE __m256 LoadW8(const uint8_t* row, int64_t i) {
  if constexpr (kType == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kType == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + i)));
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// The last (k % 8) values of a row, zero padded to a full vector.
template <DType kType>
STRATA_INLINE __m256 LoadTail(const uint8_t* row, int64_t i, int64_t n) {
  constexpr size_t kElem = kType == DType::kF32 ? 4 : 2;
  alignas(32) uint8_t buf[32] = {};
  std::memcpy(buf, row + i * kElem, static_cast<size_t>(n) * kElem);
  return LoadW8<kType>(buf, 0);
}

STRATA_INLINE __m256 LoadXTail(const float* x, int64_t i, int64_t n) {
  alignas(32) float buf[8] = {};
  std::memcpy(buf, x + i, static_cast<size_t>(n) * sizeof(float));
  return _mm256_load_ps(buf);
}

// The inner loop of x86_matmul_driver.h's FloatMatmul.
template <DType kType>
struct FloatTile8 {
  template <int R, int T>
  STRATA_INLINE static void Run(const uint8_t* const* rows, const float* const* xs, int64_t k,
                                __m256* acc) {
    for (int i = 0; i < R * T; ++i) acc[i] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      for (int r = 0; r < R; ++r) {
        const __m256 w = LoadW8<kType>(rows[r], i);
        for (int t = 0; t < T; ++t) {
          acc[t * R + r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xs[t] + i), acc[t * R + r]);
        }
      }
    }
    if (i < k) {
      for (int r = 0; r < R; ++r) {
        const __m256 w = LoadTail<kType>(rows[r], i, k - i);
        for (int t = 0; t < T; ++t) {
          acc[t * R + r] = _mm256_fmadd_ps(w, LoadXTail(xs[t], i, k - i), acc[t * R + r]);
        }
      }
    }
  }
};

}  // namespace

void Avx2MatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re) {
  FloatMatmulAnyType<Avx2Vec, FloatTile8, 4, 2, 4>(a, rb, re);
}

namespace {

// One dimension of a tile's 16 tokens as two vectors of floats: F16 halves, or Q8/Q4
// integers (unscaled).
template <ScoreType kType>
STRATA_INLINE void LoadKeys(const uint8_t* tile, int64_t j, __m256* k0, __m256* k1) {
  if constexpr (kType != ScoreType::kF16) {
    const __m128i b = kType == ScoreType::kQ8
                          ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + j * kScoreTile))
                          : UnpackQ4x16(tile + j * (kScoreTile / 2));
    *k0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    *k1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
  } else {
    const uint8_t* p = tile + j * kScoreTile * 2;
    *k0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *k1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  }
}

// NQ queries against one tile (two __m256 of eight tokens each per query); Q8 and Q4 apply
// the tokens' scales once at the end.
// The query loops are unrolled by pragma so the accumulators stay in registers (see
// avx512_matmul_f.cc).
template <int NQ, ScoreType kType>
inline void ScoreTile(const uint8_t* tile, int64_t cols, const float* x, float* y,
                      int64_t y_stride) {
  __m256 lo[NQ], hi[NQ];
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) lo[q] = hi[q] = _mm256_setzero_ps();
  for (int64_t j = 0; j < cols; ++j) {
    __m256 k0, k1;
    LoadKeys<kType>(tile, j, &k0, &k1);
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q) {
      const __m256 xj = _mm256_set1_ps(x[q * cols + j]);
      lo[q] = _mm256_fmadd_ps(xj, k0, lo[q]);
      hi[q] = _mm256_fmadd_ps(xj, k1, hi[q]);
    }
  }
  if constexpr (kType != ScoreType::kF16) {
    const uint8_t* s = tile + ScoreValueBytes(kType, cols);
    const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16)));
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q) {
      lo[q] = _mm256_mul_ps(lo[q], s0);
      hi[q] = _mm256_mul_ps(hi[q], s1);
    }
  }
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) {
    _mm256_storeu_ps(y + q * y_stride, lo[q]);
    _mm256_storeu_ps(y + q * y_stride + 8, hi[q]);
  }
}

template <ScoreType kType>
void ScoreTilesAny(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                   const float* x, int64_t n_x, float* y, int64_t y_stride) {
  static_assert(kScoreTile == 16, "one tile is two __m256");
  const int64_t tile_bytes = ScoreTileBytes(kType, cols);
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint8_t* tile = tiles + i * tile_bytes;
    float* yo = y + (i - tile_begin) * kScoreTile;
    int64_t q = 0;
    for (; q + 4 <= n_x; q += 4)
      ScoreTile<4, kType>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
    for (; q < n_x; ++q) ScoreTile<1, kType>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
  }
}

}  // namespace

void Avx2ScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                       const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kF16>(reinterpret_cast<const uint8_t*>(tiles), tile_begin, tile_end,
                                 cols, x, n_x, y, y_stride);
}

void Avx2ScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kQ8>(tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

void Avx2ScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kQ4>(tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

}  // namespace strata::kernels::cpu
