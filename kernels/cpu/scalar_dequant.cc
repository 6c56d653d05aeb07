// Reference decoding of every block format into floats (DequantizeRow, scalar on all ISAs).
//
// Each value is computed with the operations, in the order, of the GGUF reference decoder
// (gguf-py's quants.py; ggml's dequantize_row_* do the same): a sub-block's float scale
// first (d * sc), then times the code, then minus the min term (dmin * m). This file is
// compiled with -ffp-contract=off so that no compiler fuses a multiply and an add, and the
// result is the reference's bit for bit on every CPU (tests/kernels/quant_golden_test.cc).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/block_math.h"
#include "kernels/cpu/scalar_internal.h"

namespace strata::kernels::cpu {
namespace {

inline float F(int v) { return static_cast<float>(v); }

void DecodeQ4_0(const BlockQ4_0* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK) {
    const float d = F16ToF32(b[k].d);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * F((b[k].qs[i] & 0xF) - 8);
      dst[i + 16] = d * F((b[k].qs[i] >> 4) - 8);
    }
  }
}

void DecodeQ4_1(const BlockQ4_1* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK) {
    const float d = F16ToF32(b[k].d), m = F16ToF32(b[k].m);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * F(b[k].qs[i] & 0xF) + m;
      dst[i + 16] = d * F(b[k].qs[i] >> 4) + m;
    }
  }
}

void DecodeQ5_0(const BlockQ5_0* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK) {
    const float d = F16ToF32(b[k].d);
    int q[32];
    Q5Codes(b[k].qh, b[k].qs, q);
    for (int i = 0; i < kQK; ++i) dst[i] = d * F(q[i] - 16);
  }
}

void DecodeQ5_1(const BlockQ5_1* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK) {
    const float d = F16ToF32(b[k].d), m = F16ToF32(b[k].m);
    int q[32];
    Q5Codes(b[k].qh, b[k].qs, q);
    for (int i = 0; i < kQK; ++i) dst[i] = d * F(q[i]) + m;
  }
}

void DecodeIQ4_NL(const BlockIQ4_NL* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK) {
    const float d = F16ToF32(b[k].d);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * F(kIQ4Grid[b[k].qs[i] & 0xF]);
      dst[i + 16] = d * F(kIQ4Grid[b[k].qs[i] >> 4]);
    }
  }
}

void DecodeQ8(const int8_t* qs, float d, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = d * F(qs[i]);
}

void DecodeQ2_K(const BlockQ2_K* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK_K) {
    const float d = F16ToF32(b[k].d), dmin = F16ToF32(b[k].dmin);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * F(b[k].scales[j] & 0xF), ml = dmin * F(b[k].scales[j] >> 4);
      for (int i = 16 * j; i < 16 * j + 16; ++i) dst[i] = dl * F(K2BitCode(b[k].qs, i)) - ml;
    }
  }
}

void DecodeQ3_K(const BlockQ3_K* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK_K) {
    const float d = F16ToF32(b[k].d);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * F(Q3KScaleCode(b[k].scales, j) - 32);
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        // A clear hmask bit subtracts 4 (the format stores the third bit inverted).
        const int high = (b[k].hmask[i % 32] >> (i / 32)) & 1;
        dst[i] = dl * F(K2BitCode(b[k].qs, i) - (high ? 0 : 4));
      }
    }
  }
}

void DecodeQ4_K(const BlockQ4_K* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK_K) {
    const float d = F16ToF32(b[k].d), dmin = F16ToF32(b[k].dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      Q4KScaleMin(b[k].scales, j, &sc, &m);
      const float dl = d * F(sc), ml = dmin * F(m);
      const uint8_t* q = b[k].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) dst[32 * j + l] = dl * F((q[l] >> shift) & 0xF) - ml;
    }
  }
}

void DecodeQ5_K(const BlockQ5_K* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK_K) {
    const float d = F16ToF32(b[k].d), dmin = F16ToF32(b[k].dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      Q4KScaleMin(b[k].scales, j, &sc, &m);
      const float dl = d * F(sc), ml = dmin * F(m);
      const uint8_t* q = b[k].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int code = ((q[l] >> shift) & 0xF) | (((b[k].qh[l] >> j) & 1) << 4);
        dst[32 * j + l] = dl * F(code) - ml;
      }
    }
  }
}

void DecodeQ6_K(const BlockQ6_K* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK_K) {
    const float d = F16ToF32(b[k].d);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * F(b[k].scales[j]);
      for (int i = 16 * j; i < 16 * j + 16; ++i) dst[i] = dl * F(Q6KCode(b[k], i) - 32);
    }
  }
}

void DecodeIQ4_XS(const BlockIQ4_XS* b, int64_t nb, float* dst) {
  for (int64_t k = 0; k < nb; ++k, dst += kQK_K) {
    const float d = F16ToF32(b[k].d);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * F(IQ4XSScaleCode(b[k], j) - 32);
      const uint8_t* q = b[k].qs + 16 * j;
      float* o = dst + 32 * j;
      for (int i = 0; i < 16; ++i) {
        o[i] = dl * F(kIQ4Grid[q[i] & 0xF]);
        o[i + 16] = dl * F(kIQ4Grid[q[i] >> 4]);
      }
    }
  }
}

}  // namespace

void ScalarDequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  const TypeInfo& info = GetTypeInfo(t);
  const int64_t nb = n / info.block_elems;
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
    case DType::kQ4_0:
      return DecodeQ4_0(static_cast<const BlockQ4_0*>(src), nb, dst);
    case DType::kQ4_1:
      return DecodeQ4_1(static_cast<const BlockQ4_1*>(src), nb, dst);
    case DType::kQ5_0:
      return DecodeQ5_0(static_cast<const BlockQ5_0*>(src), nb, dst);
    case DType::kQ5_1:
      return DecodeQ5_1(static_cast<const BlockQ5_1*>(src), nb, dst);
    case DType::kIQ4_NL:
      return DecodeIQ4_NL(static_cast<const BlockIQ4_NL*>(src), nb, dst);
    case DType::kQ8_0: {
      const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t k = 0; k < nb; ++k) DecodeQ8(b[k].qs, F16ToF32(b[k].d), kQK, dst + k * kQK);
      return;
    }
    case DType::kQ8_1: {
      const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
      for (int64_t k = 0; k < nb; ++k) DecodeQ8(b[k].qs, F16ToF32(b[k].d), kQK, dst + k * kQK);
      return;
    }
    case DType::kQ8_K: {
      const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
      for (int64_t k = 0; k < nb; ++k) DecodeQ8(b[k].qs, b[k].d, kQK_K, dst + k * kQK_K);
      return;
    }
    case DType::kQ2_K:
      return DecodeQ2_K(static_cast<const BlockQ2_K*>(src), nb, dst);
    case DType::kQ3_K:
      return DecodeQ3_K(static_cast<const BlockQ3_K*>(src), nb, dst);
    case DType::kQ4_K:
      return DecodeQ4_K(static_cast<const BlockQ4_K*>(src), nb, dst);
    case DType::kQ5_K:
      return DecodeQ5_K(static_cast<const BlockQ5_K*>(src), nb, dst);
    case DType::kQ6_K:
      return DecodeQ6_K(static_cast<const BlockQ6_K*>(src), nb, dst);
    case DType::kIQ4_XS:
      return DecodeIQ4_XS(static_cast<const BlockIQ4_XS*>(src), nb, dst);
    default:
      // Formats without a decoder (IQ2_XXS, TQ1_0, ...): the engine rejects such tensors at
      // load time, so reaching here is a bug; NaN keeps it visible without a crash.
      std::fill(dst, dst + std::max<int64_t>(n, 0), std::nanf(""));
      return;
  }
}

}  // namespace strata::kernels::cpu
