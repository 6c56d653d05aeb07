// Type table and portable half-precision conversion (see types.h).
#include "kernels/types.h"

#include <cmath>
#include <iterator>

namespace strata::kernels {
namespace {

// Sizes follow the block structs in types.h. The types without kernels here keep their
// published sizes (ggml's type traits, as gguf-py's GGML_QUANT_SIZES lists them) so the GGUF
// reader can still compute tensor extents and an error can name the type.
constexpr TypeInfo kTypes[] = {
    {DType::kF32, "F32", 1, 4, true},
    {DType::kF16, "F16", 1, 2, true},
    {DType::kQ4_0, "Q4_0", kQK, sizeof(BlockQ4_0), true},
    {DType::kQ4_1, "Q4_1", kQK, sizeof(BlockQ4_1), true},
    {DType::kQ5_0, "Q5_0", kQK, sizeof(BlockQ5_0), true},
    {DType::kQ5_1, "Q5_1", kQK, sizeof(BlockQ5_1), true},
    {DType::kQ8_0, "Q8_0", kQK, sizeof(BlockQ8_0), true},
    {DType::kQ8_1, "Q8_1", kQK, sizeof(BlockQ8_1), false},
    {DType::kQ2_K, "Q2_K", kQK_K, sizeof(BlockQ2_K), true},
    {DType::kQ3_K, "Q3_K", kQK_K, sizeof(BlockQ3_K), true},
    {DType::kQ4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), true},
    {DType::kQ5_K, "Q5_K", kQK_K, sizeof(BlockQ5_K), true},
    {DType::kQ6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), true},
    {DType::kQ8_K, "Q8_K", kQK_K, sizeof(BlockQ8_K), false},
    {DType::kIQ2_XXS, "IQ2_XXS", kQK_K, 66, false},
    {DType::kIQ2_XS, "IQ2_XS", kQK_K, 74, false},
    {DType::kIQ3_XXS, "IQ3_XXS", kQK_K, 98, false},
    {DType::kIQ1_S, "IQ1_S", kQK_K, 50, false},
    {DType::kIQ4_NL, "IQ4_NL", kQK, sizeof(BlockIQ4_NL), true},
    {DType::kIQ3_S, "IQ3_S", kQK_K, 110, false},
    {DType::kIQ2_S, "IQ2_S", kQK_K, 82, false},
    {DType::kIQ4_XS, "IQ4_XS", kQK_K, sizeof(BlockIQ4_XS), true},
    {DType::kI8, "I8", 1, 1, false},
    {DType::kI16, "I16", 1, 2, false},
    {DType::kI32, "I32", 1, 4, false},
    {DType::kI64, "I64", 1, 8, false},
    {DType::kF64, "F64", 1, 8, false},
    {DType::kIQ1_M, "IQ1_M", kQK_K, 56, false},
    {DType::kBF16, "BF16", 1, 2, true},
    {DType::kTQ1_0, "TQ1_0", kQK_K, 54, false},
    {DType::kTQ2_0, "TQ2_0", kQK_K, 66, false},
    {DType::kMXFP4, "MXFP4", 32, 17, false},
    {DType::kNVFP4, "NVFP4", 64, 36, false},
    {DType::kQ1_0, "Q1_0", 128, 18, false},
};

}  // namespace

const TypeInfo* FindTypeInfo(uint32_t raw) {
  for (const TypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == raw) return &t;
  }
  return nullptr;
}

TypeRange KnownTypes() { return {kTypes, kTypes + std::size(kTypes)}; }

const TypeInfo& GetTypeInfo(DType t) {
  const TypeInfo* info = FindTypeInfo(static_cast<uint32_t>(t));
  // Every DType enumerator is in the table; a value outside the enum is a caller bug that
  // the GGUF reader prevents by using FindTypeInfo first.
  return info != nullptr ? *info : kTypes[0];
}

size_t RowBytes(DType t, int64_t n) {
  const TypeInfo& info = GetTypeInfo(t);
  return static_cast<size_t>(n / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: value = mant * 2^-24, exact in float.
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN; keep NaN quiet and non-zero
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24 bits dropped so units are 2^-24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: drop 13 mantissa bits with round to nearest even; a carry into the exponent
  // is the correct result.
  uint32_t r = abs - 0x38000000u;  // rebias 127 -> 15 (shifted left by 23)
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

}  // namespace strata::kernels
