// NEON kernel tables (every Armv8-A CPU), one with the SDOT matmul for CPUs with dotprod
// (Armv8.2+, e.g. the Cortex-A78AE of Jetson Orin). Activation quantization and the
// element-wise ops live here; tails past a multiple of 4 use the scalar formulas.
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/arm/neon_common.h"
#include "kernels/cpu/arm/neon_internal.h"
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {
namespace {

template <bool kDot>
void Matmul(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kIQ4_NL:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS:
      return kDot ? NeonMatmulQuantizedDotprod(a, rb, re) : NeonMatmulQuantized(a, rb, re);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return NeonMatmulFloat(a, rb, re);
    default:
      return ScalarKernels().matmul(a, rb, re);
  }
}

// 16 floats times id rounded half to even into 16 int8 (|x * id| <= 127); returns their sum.
inline int Round16(const float* x, float id, int8_t* out, int lo = -128, int hi = 127) {
  int16x8_t h[2];
  int sum = 0;
  for (int i = 0; i < 2; ++i) {
    int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8 * i), id));
    int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8 * i + 4), id));
    a = vmaxq_s32(vminq_s32(a, vdupq_n_s32(hi)), vdupq_n_s32(lo));
    b = vmaxq_s32(vminq_s32(b, vdupq_n_s32(hi)), vdupq_n_s32(lo));
    sum += vaddvq_s32(vaddq_s32(a, b));
    h[i] = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
  }
  vst1q_s8(out, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
  return sum;
}

inline float AbsMax(const float* x, int n) {
  float32x4_t m = vdupq_n_f32(0.f);
  for (int i = 0; i < n; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + i)));
  return vmaxvq_f32(m);
}

// Byte-identical to the scalar reference (amax / 127, 1 / d, round half to even).
void QuantizeActivations(DType weight, const float* x, int64_t n, void* out) {
  const DType at = ActivationType(weight);
  if (at == DType::kQ8_0 || at == DType::kQ8_1) {
    const bool with_sum = at == DType::kQ8_1;
    uint8_t* o = static_cast<uint8_t*>(out);
    const size_t block_bytes = with_sum ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
    for (int64_t b = 0; b < n / kQK; ++b, x += kQK, o += block_bytes) {
      const float d = AbsMax(x, kQK) / 127.f;
      const float id = d != 0.f ? 1.f / d : 0.f;
      int8_t* qs = reinterpret_cast<int8_t*>(o + (with_sum ? 4 : 2));
      const int sum = Round16(x, id, qs) + Round16(x + 16, id, qs + 16);
      const uint16_t dh = F32ToF16(d);
      std::memcpy(o, &dh, 2);
      if (with_sum) {
        const uint16_t sh = F32ToF16(F16ToF32(dh) * static_cast<float>(sum));
        std::memcpy(o + 2, &sh, 2);
      }
    }
    return;
  }
  if (at == DType::kQ8_K) {
    BlockQ8_K* o = static_cast<BlockQ8_K*>(out);
    for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
      const float d = AbsMax(x, kQK_K) / 127.f;
      const float id = d != 0.f ? 1.f / d : 0.f;
      o[b].d = d;
      for (int g = 0; g < kQK_K / 16; ++g) {
        o[b].bsums[g] = static_cast<int16_t>(Round16(x + 16 * g, id, o[b].qs + 16 * g, -127, 127));
      }
    }
    return;
  }
  ScalarKernels().quantize_activations(weight, x, n, out);
}

void RmsNorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  float32x4_t s0 = vdupq_n_f32(0.f), s1 = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
    s0 = vfmaq_f32(s0, a, a);
    s1 = vfmaq_f32(s1, b, b);
  }
  float ss = vaddvq_f32(vaddq_f32(s0, s1));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (i = 0; i + 4 <= n; i += 4) {
    float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), scale);
    if (weight != nullptr) v = vmulq_f32(v, vld1q_f32(weight + i));
    vst1q_f32(y + i, v);
  }
  for (; i < n; ++i) y[i] = x[i] * scale * (weight != nullptr ? weight[i] : 1.f);
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t silu = vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.f), Exp4(vnegq_f32(g))));
    vst1q_f32(out + i, vmulq_f32(silu, vld1q_f32(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void Add(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

float Softmax(float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::fmax(m, x[i]);
  float32x4_t sum = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t e = Exp4(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(m)));
    vst1q_f32(x + i, e);
    sum = vaddq_f32(sum, e);
  }
  float s = vaddvq_f32(sum);
  for (; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
  const float inv = 1.f / s;
  for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), inv));
  for (; i < n; ++i) x[i] *= inv;
  return m + std::log(s);
}

float Dot(const float* a, const float* b, int64_t n) {
  float32x4_t s[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j)
      s[j] = vfmaq_f32(s[j], vld1q_f32(a + i + 4 * j), vld1q_f32(b + i + 4 * j));
  }
  for (; i + 4 <= n; i += 4) s[0] = vfmaq_f32(s[0], vld1q_f32(a + i), vld1q_f32(b + i));
  float r = vaddvq_f32(vaddq_f32(vaddq_f32(s[0], s[1]), vaddq_f32(s[2], s[3])));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void F32ToF16Row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
  }
  for (; i < n; ++i) dst[i] = F32ToF16(src[i]);
}

void Q8_0RowsToF16(const uint8_t* first, int64_t stride, int32_t n_rows, int32_t row_values,
                   uint16_t* dst) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(first + r * stride);
    for (int32_t i = 0; i < row_values; i += 32, ++b, dst += 32) {
      const float d = F16ToF32(b->d);
      for (int e = 0; e < 4; ++e) {
        const int16x8_t w = vmovl_s8(vld1_s8(b->qs + 8 * e));
        const float32x4_t lo = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d);
        const float32x4_t hi = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), d);
        vst1_u16(dst + 8 * e, vreinterpret_u16_f16(vcvt_f16_f32(lo)));
        vst1_u16(dst + 8 * e + 4, vreinterpret_u16_f16(vcvt_f16_f32(hi)));
      }
    }
  }
}

void F16ToF32Row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, LoadF16x4(src + i));
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

void Rope(float* x, int n_heads, int head_dim, int rot_dim, const float* cs, RopeLayout layout) {
  const int half = rot_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    int i = 0;  // pair index
    for (; i + 4 <= half; i += 4) {
      const float32x4x2_t c = vld2q_f32(cs + 2 * i);  // val[0] = cos, val[1] = sin
      if (layout == RopeLayout::kNormal) {
        float32x4x2_t p = vld2q_f32(v + 2 * i);
        const float32x4_t a = p.val[0], b = p.val[1];
        p.val[0] = vfmsq_f32(vmulq_f32(a, c.val[0]), b, c.val[1]);
        p.val[1] = vfmaq_f32(vmulq_f32(a, c.val[1]), b, c.val[0]);
        vst2q_f32(v + 2 * i, p);
      } else {
        const float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + i + half);
        vst1q_f32(v + i, vfmsq_f32(vmulq_f32(a, c.val[0]), b, c.val[1]));
        vst1q_f32(v + i + half, vfmaq_f32(vmulq_f32(a, c.val[1]), b, c.val[0]));
      }
    }
    for (; i < half; ++i) {
      const int i0 = layout == RopeLayout::kNormal ? 2 * i : i;
      const int i1 = layout == RopeLayout::kNormal ? 2 * i + 1 : i + half;
      const float a = v[i0], b = v[i1], c = cs[2 * i], s = cs[2 * i + 1];
      v[i0] = a * c - b * s;
      v[i1] = a * s + b * c;
    }
  }
}

KernelTable MakeTable(bool dotprod) {
  KernelTable t = ScalarKernels();
  t.isa = Isa::kNeon;
  t.variant = dotprod ? "neon+dotprod" : "neon";
  t.quantize_activations = QuantizeActivations;
  t.matmul = dotprod ? Matmul<true> : Matmul<false>;
  t.rms_norm = RmsNorm;
  t.swiglu = SwiGlu;
  t.add = Add;
  t.softmax = Softmax;
  t.dot_f32 = Dot;
  t.f32_to_f16 = F32ToF16Row;
  t.f16_to_f32 = F16ToF32Row;
  t.q8_0_rows_to_f16 = Q8_0RowsToF16;
  t.rope = Rope;
  t.attention = NeonAttention;
  t.score_tiles_f16 = NeonScoreTilesF16;
  t.score_tiles_q8 = NeonScoreTilesQ8;
  t.score_tiles_q4 = NeonScoreTilesQ4;
  return t;
}

}  // namespace

const KernelTable* NeonKernels(bool dotprod) {
  static const KernelTable plain = MakeTable(false);
  static const KernelTable with_dot = MakeTable(true);
  return dotprod ? &with_dot : &plain;
}

}  // namespace strata::kernels::cpu
