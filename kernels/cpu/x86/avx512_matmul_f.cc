// AVX-512 matmul for float weights (F32, F16, BF16) with F32 activations, and ScoreTiles
// (Q4 tiles with VNNI integer products).
// Register tiles of R rows x T tokens, 16 values per step, weights converted to F32 in
// registers (F16C for F16, a 16-bit shift for BF16); ragged k uses masked loads.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/x86/avx512_common.h"
#include "kernels/cpu/x86/avx512_internal.h"
#include "kernels/cpu/x86/x86_matmul_driver.h"
#include "kernels/cpu/x86/x86_unpack_q4.h"

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

// The inner loop of x86_matmul_driver.h's FloatMatmul.
template <DType kType>
struct FloatTile {
  template <int R, int T>
  STRATA_INLINE static void Run(const uint8_t* const* rows, const float* const* xs, int64_t k,
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
};

}  // namespace

void Avx512MatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re) {
  FloatMatmulAnyType<Avx512Vec, FloatTile, 8, 4, 4>(a, rb, re);
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
// The query loops are unrolled by pragma: otherwise GCC 12 keeps the accumulator array in
// memory and stores all NQ accumulators on every dimension, which made the Q4 tile with 9
// queries 2.6x slower (bench_kernels ScoreTiles).
template <int NQ, ScoreType kType>
inline void ScoreTile(const uint8_t* tile, int64_t cols, const float* x, float* y,
                      int64_t y_stride) {
  __m512 acc[NQ];
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) acc[q] = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; ++j) {
    const __m512 k = LoadKeys<kType>(tile, j);
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q)
      acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(x[q * cols + j]), k, acc[q]);
  }
  if constexpr (kType != ScoreType::kF16) {
    const __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + ScoreValueBytes(kType, cols))));
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q) acc[q] = _mm512_mul_ps(acc[q], s);
  }
#pragma GCC unroll 16
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

// Q4 tiles against int8 queries with AVX-512 VNNI: four dimensions of the tile's 16 tokens
// become one vector of 16 x 4 unsigned nibbles (the stored value + 8), and one VPDPBUSD per
// query adds their products with the query's four int8 values: 64 multiply-adds per
// instruction where the float path does 16. The +8 comes back out as 8 * (sum of the
// query's int8 values); the integer dot product is exact, then scaled by the query's and
// each token's scales.
template <int NQ>
inline void ScoreTileQ4Vnni(const uint8_t* tile, int64_t cols, const int32_t* q4, int64_t n_groups,
                            const float* q_scale, const int32_t* q_bias, float* y,
                            int64_t y_stride) {
  // Byte 4t + d of the result takes dimension d of token t from [lo nibbles | hi nibbles],
  // where the nibbles of dimension d sit at 8d + t (tokens 0-7) and 32 + 8d + t - 8 (8-15).
  alignas(64) static constexpr uint8_t kOrder[64] = {
      0,  8,  16, 24, 1,  9,  17, 25, 2,  10, 18, 26, 3,  11, 19, 27, 4,  12, 20, 28, 5,  13,
      21, 29, 6,  14, 22, 30, 7,  15, 23, 31, 32, 40, 48, 56, 33, 41, 49, 57, 34, 42, 50, 58,
      35, 43, 51, 59, 36, 44, 52, 60, 37, 45, 53, 61, 38, 46, 54, 62, 39, 47, 55, 63};
  const __m512i order = _mm512_load_si512(kOrder);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m512i acc[NQ];
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) acc[q] = _mm512_setzero_si512();
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t dims = std::min<int64_t>(4, cols - 4 * g);
    const __m256i b =
        dims == 4
            ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32 * g))
            : _mm256_maskz_loadu_epi8(__mmask32((uint64_t{1} << (8 * dims)) - 1), tile + 32 * g);
    const __m256i lo = _mm256_and_si256(b, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
    const __m512i k =
        _mm512_permutexvar_epi8(order, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q)
      acc[q] = _mm512_dpbusd_epi32(acc[q], k, _mm512_set1_epi32(q4[q * n_groups + g]));
  }
  const __m512 ks = _mm512_cvtph_ps(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(tile + ScoreValueBytes(ScoreType::kQ4, cols))));
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) {
    const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[q], _mm512_set1_epi32(q_bias[q])));
    _mm512_storeu_ps(y + q * y_stride,
                     _mm512_mul_ps(_mm512_mul_ps(dot, _mm512_set1_ps(q_scale[q])), ks));
  }
}

using ScoreTileQ4VnniFn = void (*)(const uint8_t*, int64_t, const int32_t*, int64_t, const float*,
                                   const int32_t*, float*, int64_t);
template <int... N>
constexpr std::array<ScoreTileQ4VnniFn, sizeof...(N)> ScoreTileQ4VnniTable(
    std::integer_sequence<int, N...>) {
  return {&ScoreTileQ4Vnni<N + 1>...};
}
constexpr auto kTailQ4Vnni = ScoreTileQ4VnniTable(std::make_integer_sequence<int, 12>());

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
  // Queries rounded to int8, each against its own largest magnitude, padded with zeros to
  // whole 4-dimension groups.
  const int64_t n_groups = (cols + 3) / 4;
  thread_local std::vector<int32_t> packed;
  thread_local std::vector<float> scale;
  thread_local std::vector<int32_t> bias;
  packed.assign(size_t(n_x * n_groups), 0);
  scale.resize(size_t(n_x));
  bias.resize(size_t(n_x));
  for (int64_t q = 0; q < n_x; ++q) {
    const float* xq = x + q * cols;
    __m512 amax = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t j = 0; j < cols; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(LaneMask(cols - j), xq + j);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    const float m = _mm512_reduce_max_ps(amax);
    // A query with a NaN or infinity gets a NaN scale: its scores come out NaN, as the
    // float kernels' would.
    const bool finite = nan == 0 && std::isfinite(m);
    const __m512 inv = _mm512_set1_ps(finite && m > 0.f ? 127.f / m : 0.f);
    auto* bytes = reinterpret_cast<int8_t*>(packed.data() + q * n_groups);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 lanes = LaneMask(cols - j);
      // Rounded to nearest even, like nearbyint. NaN lanes (only in a non-finite query,
      // whose scale is NaN anyway) become 0.
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, xq + j), inv);
      const __m512i r = _mm512_maskz_cvtps_epi32(
          lanes & ~_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
          _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.f)), _mm512_set1_ps(127.f)));
      _mm512_mask_cvtsepi32_storeu_epi8(bytes + j, lanes, r);
      sum = _mm512_add_epi32(sum, r);
    }
    scale[size_t(q)] = finite ? m / 127.f : std::numeric_limits<float>::quiet_NaN();
    bias[size_t(q)] = 8 * _mm512_reduce_add_epi32(sum);
  }
  const int64_t tile_bytes = ScoreTileBytes(ScoreType::kQ4, cols);
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint8_t* tile = tiles + i * tile_bytes;
    float* yo = y + (i - tile_begin) * kScoreTile;
    int64_t q = 0;
    for (; n_x - q > 12; q += 8)
      ScoreTileQ4Vnni<8>(tile, cols, packed.data() + q * n_groups, n_groups, scale.data() + q,
                         bias.data() + q, yo + q * y_stride, y_stride);
    if (q < n_x)
      kTailQ4Vnni[n_x - q - 1](tile, cols, packed.data() + q * n_groups, n_groups, scale.data() + q,
                               bias.data() + q, yo + q * y_stride, y_stride);
  }
}

}  // namespace strata::kernels::cpu
