// NEON matmul without the dot-product extension (any Armv8-A CPU): int8 products through
// widening multiplies (SMULL/SMULL2) and pairwise accumulation (SADALP). Also the float
// weight formats, which need nothing beyond base NEON.
#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/arm/neon_common.h"
#include "kernels/cpu/arm/neon_internal.h"
#include "kernels/cpu/arm/neon_matmul_impl.h"

namespace strata::kernels::cpu {
namespace {

struct WideningDot {
  static STRATA_INLINE int32x4_t Dot(int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vpadalq_s16(vpadalq_s16(acc, lo), hi);
  }
};

template <DType kType>
STRATA_INLINE float32x4_t LoadW4(const uint8_t* row, int64_t i) {
  if constexpr (kType == DType::kF32) {
    return vld1q_f32(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kType == DType::kF16) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(row) + i)));
  } else {
    return vreinterpretq_f32_u32(
        vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(row) + i), 16));
  }
}

template <DType kType>
STRATA_INLINE float LoadW1(const uint8_t* row, int64_t i) {
  if constexpr (kType == DType::kF32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (kType == DType::kF16) {
    return F16ToF32(reinterpret_cast<const uint16_t*>(row)[i]);
  } else {
    return BF16ToF32(reinterpret_cast<const uint16_t*>(row)[i]);
  }
}

// R rows x T tokens, 4 values per step with two accumulators per pair for latency.
template <DType kType, int R, int T>
void FloatTiles(const MatmulArgs& a, int64_t rb, int64_t re) {
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
      float32x4_t acc[R][T];
      for (int r = 0; r < R; ++r) {
        for (int t = 0; t < T; ++t) acc[r][t] = vdupq_n_f32(0.f);
      }
      int64_t i = 0;
      for (; i + 4 <= a.k; i += 4) {
        for (int r = 0; r < R; ++r) {
          const float32x4_t wv = LoadW4<kType>(rows[r], i);
          for (int t = 0; t < T; ++t) acc[r][t] = vfmaq_f32(acc[r][t], wv, vld1q_f32(xs[t] + i));
        }
      }
      for (int t = 0; t < nt; ++t) {
        for (int r = 0; r < nr; ++r) {
          float s = vaddvq_f32(acc[r][t]);
          for (int64_t j = i; j < a.k; ++j) s += LoadW1<kType>(rows[r], j) * xs[t][j];
          a.y[(t0 + t) * a.y_stride + r0 + r] = s;
        }
      }
    }
  }
}

template <DType kType>
void FloatMatmulAny(const MatmulArgs& a, int64_t rb, int64_t re) {
  if (a.n_tok == 1) {
    FloatTiles<kType, 4, 1>(a, rb, re);
  } else {
    FloatTiles<kType, 4, 4>(a, rb, re);
  }
}

}  // namespace

void NeonMatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantizedNeon<WideningDot>(a, rb, re);
}

void NeonMatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re) {
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

// One dimension of a tile's 16 tokens as four float32x4_t: F16 halves, or Q8/Q4 integers
// (unscaled).
template <ScoreType kType>
STRATA_INLINE void LoadKeys(const uint8_t* tile, int64_t j, float32x4_t* k) {
  if constexpr (kType != ScoreType::kF16) {
    int8x16_t b;
    if constexpr (kType == ScoreType::kQ8) {
      b = vld1q_s8(reinterpret_cast<const int8_t*>(tile + j * kScoreTile));
    } else {
      // Low nibbles are tokens 0-7, high nibbles tokens 8-15, each stored as integer + 8.
      const uint8x8_t p = vld1_u8(tile + j * (kScoreTile / 2));
      const uint8x16_t u = vcombine_u8(vand_u8(p, vdup_n_u8(0x0F)), vshr_n_u8(p, 4));
      b = vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(8));
    }
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    k[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    k[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    k[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    k[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(tile + j * kScoreTile * 2);
    for (int v = 0; v < 4; ++v) k[v] = LoadF16x4(p + 4 * v);
  }
}

// NQ queries against one tile (four float32x4_t of four tokens each per query); Q8 and Q4
// apply the tokens' scales once at the end.
template <int NQ, ScoreType kType>
inline void ScoreTile(const uint8_t* tile, int64_t cols, const float* x, float* y,
                      int64_t y_stride) {
  float32x4_t acc[NQ][4];
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < 4; ++v) acc[q][v] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < cols; ++j) {
    float32x4_t k[4];
    LoadKeys<kType>(tile, j, k);
    for (int q = 0; q < NQ; ++q) {
      const float xj = x[q * cols + j];
      for (int v = 0; v < 4; ++v) acc[q][v] = vfmaq_n_f32(acc[q][v], k[v], xj);
    }
  }
  if constexpr (kType != ScoreType::kF16) {
    uint16_t s[kScoreTile];  // the scales may sit at any byte offset
    std::memcpy(s, tile + ScoreValueBytes(kType, cols), sizeof(s));
    for (int v = 0; v < 4; ++v) {
      const float32x4_t sv = LoadF16x4(s + 4 * v);
      for (int q = 0; q < NQ; ++q) acc[q][v] = vmulq_f32(acc[q][v], sv);
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < 4; ++v) vst1q_f32(y + q * y_stride + 4 * v, acc[q][v]);
}

template <ScoreType kType>
void ScoreTilesAny(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                   const float* x, int64_t n_x, float* y, int64_t y_stride) {
  static_assert(kScoreTile == 16, "one tile is four float32x4_t");
  const int64_t tile_bytes = ScoreTileBytes(kType, cols);
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint8_t* tile = tiles + i * tile_bytes;
    float* yo = y + (i - tile_begin) * kScoreTile;
    int64_t q = 0;
    for (; q + 3 <= n_x; q += 3)
      ScoreTile<3, kType>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
    for (; q < n_x; ++q) ScoreTile<1, kType>(tile, cols, x + q * cols, yo + q * y_stride, y_stride);
  }
}

}  // namespace

void NeonScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                       const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kF16>(reinterpret_cast<const uint8_t*>(tiles), tile_begin, tile_end,
                                 cols, x, n_x, y, y_stride);
}

void NeonScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kQ8>(tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

void NeonScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreTilesAny<ScoreType::kQ4>(tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

}  // namespace strata::kernels::cpu
