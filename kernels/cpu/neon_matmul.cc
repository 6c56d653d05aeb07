// NEON matmul without the dot-product extension (any Armv8-A CPU): int8 products through
// widening multiplies (SMULL/SMULL2) and pairwise accumulation (SADALP). Also the float
// weight formats, which need nothing beyond base NEON.
#include <arm_neon.h>

#include <algorithm>

#include "kernels/cpu/neon_internal.h"
#include "kernels/cpu/neon_matmul_impl.h"

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

void NeonMatVecF16(const uint16_t* a, int64_t rows, int64_t cols, int64_t row_stride,
                   const float* x, float* y) {
  MatmulArgs m{};
  m.wtype = DType::kF16;
  m.w = a;
  m.w_row_bytes = static_cast<size_t>(row_stride) * sizeof(uint16_t);
  m.k = cols;
  m.xq = x;
  m.xq_row_bytes = static_cast<size_t>(cols) * sizeof(float);
  m.n_tok = 1;
  m.y = y;
  m.y_stride = 0;
  FloatTiles<DType::kF16, 4, 1>(m, 0, rows);
}

}  // namespace strata::kernels::cpu
