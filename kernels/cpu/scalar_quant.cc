// Reference quantization for every block format (scalar); decoding is scalar_dequant.cc.
//
// Weight quantizers (QuantizeRow) are plain round-to-nearest with min/max scales: good for
// tests and tools, not a replacement for the importance-weighted search GGUF converters do.
// Activation quantizers are the exact formats Matmul consumes; SIMD variants must produce
// the same bytes (tests compare them bit for bit).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/block_math.h"
#include "kernels/cpu/scalar_internal.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace cpu {
namespace {

inline int RoundToInt(float v) { return static_cast<int>(std::nearbyint(v)); }
inline int Clamp(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

float AbsMax(const float* x, int n) {
  float m = 0.f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// The value of largest magnitude, with its sign.
float SignedMax(const float* x, int n) {
  float vmax = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  }
  return vmax;
}

void QuantizeQ8_0(const float* x, BlockQ8_0* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const float d = AbsMax(x, kQK) / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    out[b].d = F32ToF16(d);
    for (int i = 0; i < kQK; ++i) out[b].qs[i] = static_cast<int8_t>(RoundToInt(x[i] * id));
  }
}

void QuantizeQ8_1(const float* x, BlockQ8_1* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const float d = AbsMax(x, kQK) / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int i = 0; i < kQK; ++i) {
      const int q = RoundToInt(x[i] * id);
      out[b].qs[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = F32ToF16(d);
    // The stored (rounded) d, so that s is exactly what the dot product's d*sum would be.
    out[b].s = F32ToF16(F16ToF32(out[b].d) * static_cast<float>(sum));
  }
}

void QuantizeQ8_K(const float* x, BlockQ8_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    const float d = AbsMax(x, kQK_K) / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    out[b].d = d;
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        const int q = Clamp(RoundToInt(x[i] * id), -127, 127);
        out[b].qs[i] = static_cast<int8_t>(q);
        sum += q;
      }
      out[b].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

void QuantizeQ4_0(const float* x, BlockQ4_0* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    // The value of largest magnitude maps to code 0 (-8), using the full negative range.
    out[b].d = F32ToF16(SignedMax(x, kQK) / -8.f);
    const float d = F16ToF32(out[b].d);
    const float id = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < kQK / 2; ++i) {
      const int lo = Clamp(RoundToInt(x[i] * id) + 8, 0, 15);
      const int hi = Clamp(RoundToInt(x[i + 16] * id) + 8, 0, 15);
      out[b].qs[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void QuantizeQ4_1(const float* x, BlockQ4_1* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < kQK; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    out[b].d = F32ToF16((hi - lo) / 15.f);
    out[b].m = F32ToF16(lo);
    const float d = F16ToF32(out[b].d), m = F16ToF32(out[b].m);
    const float id = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < kQK / 2; ++i) {
      const int q0 = Clamp(RoundToInt((x[i] - m) * id), 0, 15);
      const int q1 = Clamp(RoundToInt((x[i + 16] - m) * id), 0, 15);
      out[b].qs[i] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Splits 32 five-bit codes into Q5_0 / Q5_1's nibbles and high-bit word.
void PackQ5(const int q[32], uint8_t qh[4], uint8_t qs[16]) {
  std::memset(qh, 0, 4);
  for (int i = 0; i < 16; ++i)
    qs[i] = static_cast<uint8_t>((q[i] & 0xF) | ((q[i + 16] & 0xF) << 4));
  for (int i = 0; i < 32; ++i)
    qh[i / 8] = static_cast<uint8_t>(qh[i / 8] | ((q[i] >> 4) << (i % 8)));
}

void QuantizeQ5_0(const float* x, BlockQ5_0* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    // As Q4_0: the value of largest magnitude maps to code 0 (-16).
    out[b].d = F32ToF16(SignedMax(x, kQK) / -16.f);
    const float d = F16ToF32(out[b].d);
    const float id = d != 0.f ? 1.f / d : 0.f;
    int q[kQK];
    for (int i = 0; i < kQK; ++i) q[i] = Clamp(RoundToInt(x[i] * id) + 16, 0, 31);
    PackQ5(q, out[b].qh, out[b].qs);
  }
}

void QuantizeQ5_1(const float* x, BlockQ5_1* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const float lo = *std::min_element(x, x + kQK), hi = *std::max_element(x, x + kQK);
    out[b].d = F32ToF16((hi - lo) / 31.f);
    out[b].m = F32ToF16(lo);
    const float d = F16ToF32(out[b].d), m = F16ToF32(out[b].m);
    const float id = d != 0.f ? 1.f / d : 0.f;
    int q[kQK];
    for (int i = 0; i < kQK; ++i) q[i] = Clamp(RoundToInt((x[i] - m) * id), 0, 31);
    PackQ5(q, out[b].qh, out[b].qs);
  }
}

// Index of the IQ4 grid value nearest to v (the grid is sorted).
int NearestIQ4(float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i) {
    if (std::fabs(v - kIQ4Grid[i]) < std::fabs(v - kIQ4Grid[best])) best = i;
  }
  return best;
}

float IQ4Error(const float* x, int n, float d) {
  float err = 0.f;
  for (int i = 0; i < n; ++i) {
    const float e = x[i] - (d != 0.f ? d * kIQ4Grid[NearestIQ4(x[i] / d)] : 0.f);
    err += e * e;
  }
  return err;
}

// A scale for n values on the IQ4 grid: the grid spans -127..113, so the value of largest
// magnitude goes to whichever end gives the smaller squared error.
float IQ4Scale(const float* x, int n) {
  const float vmax = SignedMax(x, n);
  const float neg = F16ToF32(F32ToF16(vmax / -127.f)), pos = F16ToF32(F32ToF16(vmax / 113.f));
  return IQ4Error(x, n, neg) <= IQ4Error(x, n, pos) ? neg : pos;
}

// Grid codes of n values at step d (all code 8, value ~0, when d is 0).
void IQ4Codes(const float* x, int n, float d, int* q) {
  for (int i = 0; i < n; ++i) q[i] = d != 0.f ? NearestIQ4(x[i] / d) : 8;
}

void QuantizeIQ4_NL(const float* x, BlockIQ4_NL* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    out[b].d = F32ToF16(IQ4Scale(x, kQK));
    int q[kQK];
    IQ4Codes(x, kQK, F16ToF32(out[b].d), q);
    for (int i = 0; i < 16; ++i) out[b].qs[i] = static_cast<uint8_t>(q[i] | (q[i + 16] << 4));
  }
}

// Q4_K and Q5_K: eight sub-blocks of 32 with 6-bit scales and mins, codes 0..levels, the
// min clamped to <= 0 (weights are d*sc*q - dmin*m). Writes d, dmin, the packed scales and
// the codes in value order.
void QuantizeScaleMin(const float* x, int levels, uint16_t* d_out, uint16_t* dmin_out,
                      uint8_t packed[12], uint8_t q[kQK_K]) {
  float scale[8], minv[8], max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.f, hi = x[32 * j];
    for (int i = 32 * j; i < 32 * j + 32; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    scale[j] = std::max(0.f, hi - lo) / static_cast<float>(levels);
    minv[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, minv[j]);
  }
  *d_out = F32ToF16(max_scale / 63.f);
  *dmin_out = F32ToF16(max_min / 63.f);
  const float d = F16ToF32(*d_out), dmin = F16ToF32(*dmin_out);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.f ? Clamp(RoundToInt(scale[j] / d), 0, 63) : 0);
    mn[j] = static_cast<uint8_t>(dmin > 0.f ? Clamp(RoundToInt(minv[j] / dmin), 0, 63) : 0);
  }
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  for (int j = 0; j < 8; ++j) {
    const float step = d * sc[j], offset = dmin * mn[j];
    const float istep = step != 0.f ? 1.f / step : 0.f;
    for (int i = 32 * j; i < 32 * j + 32; ++i) {
      q[i] = static_cast<uint8_t>(Clamp(RoundToInt((x[i] + offset) * istep), 0, levels));
    }
  }
}

// Low nibbles of sub-blocks 2c and 2c+1 share qs bytes 32c..32c+31 (Q4_K, Q5_K).
void PackKNibbles(const uint8_t q[kQK_K], uint8_t qs[128]) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4));
    }
  }
}

void QuantizeQ4_K(const float* x, BlockQ4_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    uint8_t q[kQK_K];
    QuantizeScaleMin(x, 15, &out[b].d, &out[b].dmin, out[b].scales, q);
    PackKNibbles(q, out[b].qs);
  }
}

void QuantizeQ5_K(const float* x, BlockQ5_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    uint8_t q[kQK_K];
    QuantizeScaleMin(x, 31, &out[b].d, &out[b].dmin, out[b].scales, q);
    PackKNibbles(q, out[b].qs);
    for (int l = 0; l < 32; ++l) {
      uint8_t h = 0;
      for (int j = 0; j < 8; ++j) h = static_cast<uint8_t>(h | ((q[32 * j + l] >> 4) << j));
      out[b].qh[l] = h;
    }
  }
}

// Two-bit codes into Q2_K / Q3_K's qs (see K2BitCode).
void Pack2Bit(const uint8_t q[kQK_K], uint8_t qs[64]) {
  std::memset(qs, 0, 64);
  for (int i = 0; i < kQK_K; ++i) {
    qs[32 * (i / 128) + i % 32] |= static_cast<uint8_t>((q[i] & 3) << (2 * ((i / 32) % 4)));
  }
}

void QuantizeQ2_K(const float* x, BlockQ2_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    float scale[16], minv[16], max_scale = 0.f, max_min = 0.f;
    for (int j = 0; j < 16; ++j) {
      const float* v = x + 16 * j;
      const float lo = std::min(0.f, *std::min_element(v, v + 16));
      const float hi = *std::max_element(v, v + 16);
      scale[j] = std::max(0.f, hi - lo) / 3.f;
      minv[j] = -lo;
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, minv[j]);
    }
    BlockQ2_K& o = out[b];
    o.d = F32ToF16(max_scale / 15.f);
    o.dmin = F32ToF16(max_min / 15.f);
    const float d = F16ToF32(o.d), dmin = F16ToF32(o.dmin);
    uint8_t q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0.f ? Clamp(RoundToInt(scale[j] / d), 0, 15) : 0;
      const int mn = dmin > 0.f ? Clamp(RoundToInt(minv[j] / dmin), 0, 15) : 0;
      o.scales[j] = static_cast<uint8_t>(sc | (mn << 4));
      const float step = d * static_cast<float>(sc), offset = dmin * static_cast<float>(mn);
      const float istep = step != 0.f ? 1.f / step : 0.f;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        q[i] = static_cast<uint8_t>(Clamp(RoundToInt((x[i] + offset) * istep), 0, 3));
      }
    }
    Pack2Bit(q, o.qs);
  }
}

void QuantizeQ3_K(const float* x, BlockQ3_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    // Per sub-block a signed step that maps the value of largest magnitude to -4 (as Q4_0),
    // then 6-bit signed multiples of one super-block scale.
    float step[16], max_step = 0.f;
    for (int j = 0; j < 16; ++j) {
      step[j] = SignedMax(x + 16 * j, 16) / -4.f;
      max_step = std::max(max_step, std::fabs(step[j]));
    }
    BlockQ3_K& o = out[b];
    o.d = F32ToF16(max_step / 31.f);
    const float d = F16ToF32(o.d);
    uint8_t q[kQK_K];
    std::memset(o.scales, 0, sizeof(o.scales));
    std::memset(o.hmask, 0, sizeof(o.hmask));
    for (int j = 0; j < 16; ++j) {
      const int ls = d > 0.f ? Clamp(RoundToInt(step[j] / d), -32, 31) : 0;
      const int code = ls + 32;
      o.scales[j % 8] = static_cast<uint8_t>(o.scales[j % 8] | ((code & 0xF) << (j < 8 ? 0 : 4)));
      o.scales[8 + j % 4] =
          static_cast<uint8_t>(o.scales[8 + j % 4] | ((code >> 4) << (2 * (j / 4))));
      const float s = d * static_cast<float>(ls);
      const float is = s != 0.f ? 1.f / s : 0.f;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        const int u = Clamp(RoundToInt(x[i] * is), -4, 3) + 4;  // 0..7: two low bits + hmask
        q[i] = static_cast<uint8_t>(u & 3);
        o.hmask[i % 32] = static_cast<uint8_t>(o.hmask[i % 32] | ((u >> 2) << (i / 32)));
      }
    }
    Pack2Bit(q, o.qs);
  }
}

void QuantizeIQ4_XS(const float* x, BlockIQ4_XS* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    float step[8], max_step = 0.f;
    for (int j = 0; j < 8; ++j) {
      step[j] = IQ4Scale(x + 32 * j, 32);
      max_step = std::max(max_step, std::fabs(step[j]));
    }
    BlockIQ4_XS& o = out[b];
    o.d = F32ToF16(max_step / 31.f);
    const float d = F16ToF32(o.d);
    o.scales_h = 0;
    std::memset(o.scales_l, 0, sizeof(o.scales_l));
    for (int j = 0; j < 8; ++j) {
      const int ls = d > 0.f ? Clamp(RoundToInt(step[j] / d), -32, 31) : 0;
      const int code = ls + 32;
      o.scales_l[j / 2] = static_cast<uint8_t>(o.scales_l[j / 2] | ((code & 0xF) << (4 * (j % 2))));
      o.scales_h = static_cast<uint16_t>(o.scales_h | ((code >> 4) << (2 * j)));
      int q[32];
      IQ4Codes(x + 32 * j, 32, d * static_cast<float>(ls), q);
      for (int i = 0; i < 16; ++i) o.qs[16 * j + i] = static_cast<uint8_t>(q[i] | (q[i + 16] << 4));
    }
  }
}

void QuantizeQ6_K(const float* x, BlockQ6_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    float scale[16], max_scale = 0.f;
    for (int j = 0; j < 16; ++j) {
      scale[j] = AbsMax(x + 16 * j, 16) / 31.f;
      max_scale = std::max(max_scale, scale[j]);
    }
    BlockQ6_K& o = out[b];
    o.d = F32ToF16(max_scale / 127.f);
    const float d = F16ToF32(o.d);
    uint8_t q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0.f ? Clamp(RoundToInt(scale[j] / d), 0, 127) : 0;
      o.scales[j] = static_cast<int8_t>(sc);
      const float step = d * static_cast<float>(sc);
      const float istep = step != 0.f ? 1.f / step : 0.f;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        q[i] = static_cast<uint8_t>(Clamp(RoundToInt(x[i] * istep), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* u = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        o.ql[64 * h + l] = static_cast<uint8_t>((u[l] & 0xF) | ((u[l + 64] & 0xF) << 4));
        o.ql[64 * h + l + 32] = static_cast<uint8_t>((u[l + 32] & 0xF) | ((u[l + 96] & 0xF) << 4));
        o.qh[32 * h + l] = static_cast<uint8_t>((u[l] >> 4) | ((u[l + 32] >> 4) << 2) |
                                                ((u[l + 64] >> 4) << 4) | ((u[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace

void ScalarQuantizeActivations(DType weight, const float* x, int64_t n, void* out) {
  switch (ActivationType(weight)) {
    case DType::kQ8_0:
      QuantizeQ8_0(x, static_cast<BlockQ8_0*>(out), n / kQK);
      return;
    case DType::kQ8_1:
      QuantizeQ8_1(x, static_cast<BlockQ8_1*>(out), n / kQK);
      return;
    case DType::kQ8_K:
      QuantizeQ8_K(x, static_cast<BlockQ8_K*>(out), n / kQK_K);
      return;
    default:
      if (n > 0) std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
      return;
  }
}

}  // namespace cpu

DType ActivationType(DType weight) {
  switch (weight) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0:
    case DType::kIQ4_NL:
      return DType::kQ8_0;
    case DType::kQ4_1:
    case DType::kQ5_1:
      return DType::kQ8_1;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS:
      return DType::kQ8_K;
    default:
      // Float weights (F32, F16, BF16) take float activations: the conversion of the weight
      // row is cheap next to its memory traffic and keeps full activation precision.
      return DType::kF32;
  }
}

bool QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  const TypeInfo& info = GetTypeInfo(t);
  if (n < 0 || n % info.block_elems != 0) return false;
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return true;
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return true;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBF16(src[i]);
      return true;
    }
    case DType::kQ4_0:
      cpu::QuantizeQ4_0(src, static_cast<BlockQ4_0*>(dst), n / kQK);
      return true;
    case DType::kQ4_1:
      cpu::QuantizeQ4_1(src, static_cast<BlockQ4_1*>(dst), n / kQK);
      return true;
    case DType::kQ8_0:
      // The disk KV policy's records are Q8_0 rows, quantized on every append: the active
      // ISA's activation quantizer writes the same bytes (tested) several times faster.
      QuantizeActivations(DType::kQ8_0, src, n, dst);
      return true;
    case DType::kQ8_1:
      cpu::QuantizeQ8_1(src, static_cast<BlockQ8_1*>(dst), n / kQK);
      return true;
    case DType::kQ8_K:
      cpu::QuantizeQ8_K(src, static_cast<BlockQ8_K*>(dst), n / kQK_K);
      return true;
    case DType::kQ4_K:
      cpu::QuantizeQ4_K(src, static_cast<BlockQ4_K*>(dst), n / kQK_K);
      return true;
    case DType::kQ6_K:
      cpu::QuantizeQ6_K(src, static_cast<BlockQ6_K*>(dst), n / kQK_K);
      return true;
    case DType::kQ5_0:
      cpu::QuantizeQ5_0(src, static_cast<BlockQ5_0*>(dst), n / kQK);
      return true;
    case DType::kQ5_1:
      cpu::QuantizeQ5_1(src, static_cast<BlockQ5_1*>(dst), n / kQK);
      return true;
    case DType::kIQ4_NL:
      cpu::QuantizeIQ4_NL(src, static_cast<BlockIQ4_NL*>(dst), n / kQK);
      return true;
    case DType::kQ2_K:
      cpu::QuantizeQ2_K(src, static_cast<BlockQ2_K*>(dst), n / kQK_K);
      return true;
    case DType::kQ3_K:
      cpu::QuantizeQ3_K(src, static_cast<BlockQ3_K*>(dst), n / kQK_K);
      return true;
    case DType::kQ5_K:
      cpu::QuantizeQ5_K(src, static_cast<BlockQ5_K*>(dst), n / kQK_K);
      return true;
    case DType::kIQ4_XS:
      cpu::QuantizeIQ4_XS(src, static_cast<BlockIQ4_XS*>(dst), n / kQK_K);
      return true;
    default:
      return false;
  }
}

}  // namespace strata::kernels
