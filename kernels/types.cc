// Type table and portable half-precision conversion (see types.h).
#include "kernels/types.h"

#include <cmath>

namespace strata::kernels {
namespace {

// Sizes follow the block structs in types.h; K formats not implemented as weights keep
// their published sizes so the GGUF reader can still compute tensor extents.
constexpr TypeInfo kTypes[] = {
    {DType::kF32, "F32", 1, 4, true},
    {DType::kF16, "F16", 1, 2, true},
    {DType::kQ4_0, "Q4_0", kQK, sizeof(BlockQ4_0), true},
    {DType::kQ4_1, "Q4_1", kQK, sizeof(BlockQ4_1), true},
    {DType::kQ5_0, "Q5_0", kQK, 22, false},
    {DType::kQ5_1, "Q5_1", kQK, 24, false},
    {DType::kQ8_0, "Q8_0", kQK, sizeof(BlockQ8_0), true},
    {DType::kQ8_1, "Q8_1", kQK, sizeof(BlockQ8_1), false},
    {DType::kQ2_K, "Q2_K", kQK_K, 84, false},
    {DType::kQ3_K, "Q3_K", kQK_K, 110, false},
    {DType::kQ4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), true},
    {DType::kQ5_K, "Q5_K", kQK_K, 176, false},
    {DType::kQ6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), true},
    {DType::kQ8_K, "Q8_K", kQK_K, sizeof(BlockQ8_K), false},
    {DType::kBF16, "BF16", 1, 2, true},
};

}  // namespace

const TypeInfo* FindTypeInfo(uint32_t raw) {
  for (const TypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == raw) return &t;
  }
  return nullptr;
}

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
