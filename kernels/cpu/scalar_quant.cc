// Reference quantization and dequantization for every block format (scalar).
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
    float vmax = 0.f;
    for (int i = 0; i < kQK; ++i) {
      if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
    }
    out[b].d = F32ToF16(vmax / -8.f);
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

void QuantizeQ4_K(const float* x, BlockQ4_K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    float scale[8], minv[8], max_scale = 0.f, max_min = 0.f;
    for (int j = 0; j < 8; ++j) {
      float lo = 0.f, hi = x[32 * j];  // min is clamped to <= 0: weights are d*sc*q - dmin*m
      for (int i = 32 * j; i < 32 * j + 32; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      scale[j] = std::max(0.f, hi - lo) / 15.f;
      minv[j] = -lo;
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, minv[j]);
    }
    BlockQ4_K& o = out[b];
    o.d = F32ToF16(max_scale / 63.f);
    o.dmin = F32ToF16(max_min / 63.f);
    const float d = F16ToF32(o.d), dmin = F16ToF32(o.dmin);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(d > 0.f ? Clamp(RoundToInt(scale[j] / d), 0, 63) : 0);
      mn[j] = static_cast<uint8_t>(dmin > 0.f ? Clamp(RoundToInt(minv[j] / dmin), 0, 63) : 0);
    }
    std::memset(o.scales, 0, sizeof(o.scales));
    for (int j = 0; j < 4; ++j) {
      o.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      o.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
      o.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    uint8_t q[kQK_K];
    for (int j = 0; j < 8; ++j) {
      const float step = d * sc[j], offset = dmin * mn[j];
      const float istep = step != 0.f ? 1.f / step : 0.f;
      for (int i = 32 * j; i < 32 * j + 32; ++i) {
        q[i] = static_cast<uint8_t>(Clamp(RoundToInt((x[i] + offset) * istep), 0, 15));
      }
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        o.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
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

void ScalarDequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kQ4_0: {
      const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t k = 0; k < n / kQK; ++k, dst += kQK) {
        const float d = F16ToF32(b[k].d);
        for (int i = 0; i < 16; ++i) {
          dst[i] = d * static_cast<float>((b[k].qs[i] & 0xF) - 8);
          dst[i + 16] = d * static_cast<float>((b[k].qs[i] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kQ4_1: {
      const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t k = 0; k < n / kQK; ++k, dst += kQK) {
        const float d = F16ToF32(b[k].d), m = F16ToF32(b[k].m);
        for (int i = 0; i < 16; ++i) {
          dst[i] = d * static_cast<float>(b[k].qs[i] & 0xF) + m;
          dst[i + 16] = d * static_cast<float>(b[k].qs[i] >> 4) + m;
        }
      }
      return;
    }
    case DType::kQ8_0: {
      const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t k = 0; k < n / kQK; ++k, dst += kQK) {
        const float d = F16ToF32(b[k].d);
        for (int i = 0; i < kQK; ++i) dst[i] = d * static_cast<float>(b[k].qs[i]);
      }
      return;
    }
    case DType::kQ8_1: {
      const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
      for (int64_t k = 0; k < n / kQK; ++k, dst += kQK) {
        const float d = F16ToF32(b[k].d);
        for (int i = 0; i < kQK; ++i) dst[i] = d * static_cast<float>(b[k].qs[i]);
      }
      return;
    }
    case DType::kQ8_K: {
      const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
      for (int64_t k = 0; k < n / kQK_K; ++k, dst += kQK_K) {
        for (int i = 0; i < kQK_K; ++i) dst[i] = b[k].d * static_cast<float>(b[k].qs[i]);
      }
      return;
    }
    case DType::kQ4_K: {
      const BlockQ4_K* b = static_cast<const BlockQ4_K*>(src);
      for (int64_t k = 0; k < n / kQK_K; ++k, dst += kQK_K) {
        const float d = F16ToF32(b[k].d), dmin = F16ToF32(b[k].dmin);
        for (int c = 0; c < 4; ++c) {
          int sc0, m0, sc1, m1;
          Q4KScaleMin(b[k].scales, 2 * c, &sc0, &m0);
          Q4KScaleMin(b[k].scales, 2 * c + 1, &sc1, &m1);
          const uint8_t* q = b[k].qs + 32 * c;
          for (int l = 0; l < 32; ++l) {
            dst[64 * c + l] = d * sc0 * static_cast<float>(q[l] & 0xF) - dmin * m0;
            dst[64 * c + 32 + l] = d * sc1 * static_cast<float>(q[l] >> 4) - dmin * m1;
          }
        }
      }
      return;
    }
    case DType::kQ6_K: {
      const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
      for (int64_t k = 0; k < n / kQK_K; ++k, dst += kQK_K) {
        const float d = F16ToF32(b[k].d);
        for (int i = 0; i < kQK_K; ++i) {
          dst[i] = d * static_cast<float>(b[k].scales[i / 16]) *
                   static_cast<float>(Q6KCode(b[k], i) - 32);
        }
      }
      return;
    }
    default:
      // Formats without a decoder (Q5_*, Q2_K, ...): the engine rejects such tensors at
      // load time, so reaching here is a bug; NaN keeps it visible without a crash.
      std::fill(dst, dst + std::max<int64_t>(n, 0), std::nanf(""));
      return;
  }
}

}  // namespace cpu

DType ActivationType(DType weight) {
  switch (weight) {
    case DType::kQ4_0:
    case DType::kQ8_0:
      return DType::kQ8_0;
    case DType::kQ4_1:
      return DType::kQ8_1;
    case DType::kQ4_K:
    case DType::kQ6_K:
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
      cpu::QuantizeQ8_0(src, static_cast<BlockQ8_0*>(dst), n / kQK);
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
    default:
      return false;
  }
}

}  // namespace strata::kernels
