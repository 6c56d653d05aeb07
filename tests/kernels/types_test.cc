// Type table, row sizes and the portable F16/BF16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/types.h"

namespace strata::kernels {
namespace {

TEST(Types, TableMatchesBlockStructs) {
  EXPECT_EQ(GetTypeInfo(DType::kQ4_0).block_bytes, int(sizeof(BlockQ4_0)));
  EXPECT_EQ(GetTypeInfo(DType::kQ5_0).block_bytes, int(sizeof(BlockQ5_0)));
  EXPECT_EQ(GetTypeInfo(DType::kQ5_1).block_bytes, int(sizeof(BlockQ5_1)));
  EXPECT_EQ(GetTypeInfo(DType::kIQ4_NL).block_bytes, int(sizeof(BlockIQ4_NL)));
  EXPECT_EQ(GetTypeInfo(DType::kQ2_K).block_bytes, int(sizeof(BlockQ2_K)));
  EXPECT_EQ(GetTypeInfo(DType::kQ3_K).block_bytes, int(sizeof(BlockQ3_K)));
  EXPECT_EQ(GetTypeInfo(DType::kQ5_K).block_bytes, int(sizeof(BlockQ5_K)));
  EXPECT_EQ(GetTypeInfo(DType::kIQ4_XS).block_bytes, int(sizeof(BlockIQ4_XS)));
  EXPECT_EQ(GetTypeInfo(DType::kQ4_1).block_bytes, int(sizeof(BlockQ4_1)));
  EXPECT_EQ(GetTypeInfo(DType::kQ8_0).block_bytes, int(sizeof(BlockQ8_0)));
  EXPECT_EQ(GetTypeInfo(DType::kQ4_K).block_bytes, int(sizeof(BlockQ4_K)));
  EXPECT_EQ(GetTypeInfo(DType::kQ6_K).block_bytes, int(sizeof(BlockQ6_K)));
  EXPECT_EQ(GetTypeInfo(DType::kQ8_K).block_bytes, int(sizeof(BlockQ8_K)));
  EXPECT_STREQ(TypeName(DType::kQ4_1), "Q4_1");
  EXPECT_STREQ(TypeName(DType::kBF16), "BF16");
  EXPECT_EQ(RowBytes(DType::kQ4_1, 576), 18u * 20u);
  EXPECT_EQ(RowBytes(DType::kQ6_K, 4096), 16u * 210u);
  EXPECT_EQ(RowBytes(DType::kF16, 7), 14u);
  EXPECT_EQ(FindTypeInfo(4), nullptr);  // removed Q4_2
  EXPECT_EQ(FindTypeInfo(1000), nullptr);
  ASSERT_NE(FindTypeInfo(14), nullptr);
  EXPECT_EQ(FindTypeInfo(14)->type, DType::kQ6_K);
  EXPECT_TRUE(GetTypeInfo(DType::kQ4_K).weight_supported);
  EXPECT_TRUE(GetTypeInfo(DType::kQ5_0).weight_supported);
  EXPECT_FALSE(GetTypeInfo(DType::kIQ2_XXS).weight_supported);
  EXPECT_FALSE(GetTypeInfo(DType::kQ8_K).weight_supported);  // an activation format only
}

// The published GGUF types are all named (so errors can say which one a file uses), in id
// order, each once; ids GGML retired (4, 5: Q4_2, Q4_3; 31-33, 36-38) stay unknown.
TEST(Types, KnownTypesCoverThePublishedIds) {
  uint32_t prev = 0;
  bool first = true;
  for (const TypeInfo& t : KnownTypes()) {
    const uint32_t id = static_cast<uint32_t>(t.type);
    EXPECT_TRUE(first || id > prev) << t.name;
    EXPECT_EQ(FindTypeInfo(id), &t);
    EXPECT_GT(t.block_elems, 0);
    EXPECT_GT(t.block_bytes, 0);
    prev = id;
    first = false;
  }
  EXPECT_EQ(KnownTypes().size(), 34u);
  for (uint32_t gone : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u})
    EXPECT_EQ(FindTypeInfo(gone), nullptr);
  EXPECT_STREQ(FindTypeInfo(20)->name, "IQ4_NL");
  EXPECT_STREQ(FindTypeInfo(23)->name, "IQ4_XS");
  EXPECT_STREQ(FindTypeInfo(34)->name, "TQ1_0");
}

TEST(Types, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Types, HalfValuesAndRounding) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.f);
  EXPECT_EQ(F16ToF32(0xc000), -2.f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.f, -24));
  EXPECT_EQ(F32ToF16(65519.f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(F32ToF16(1e-8f), 0x0000);
  EXPECT_EQ(F32ToF16(std::ldexp(1.f, -25)), 0x0000);            // tie to even (0)
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);           // above the tie
  EXPECT_EQ(F32ToF16(std::ldexp(3.f, -25)), 0x0002);            // tie to even (2)
  EXPECT_EQ(F32ToF16(1.f + std::ldexp(1.f, -11)), 0x3c00);      // tie to even
  EXPECT_EQ(F32ToF16(1.f + 3 * std::ldexp(1.f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(F32ToF16(-0.f), 0x8000);
  // Random floats: the result is the nearest half.
  uint32_t s = 12345;
  for (int i = 0; i < 100000; ++i) {
    s = s * 1664525u + 1013904223u;
    const float f = std::ldexp(static_cast<float>(s >> 8) / 16777216.f - 0.5f, int(s % 40) - 24);
    const uint16_t h = F32ToF16(f);
    const double err = std::fabs(double(F16ToF32(h)) - f);
    const double up = std::fabs(double(F16ToF32(uint16_t(h + 1))) - f);
    const double down = (h & 0x7fff) ? std::fabs(double(F16ToF32(uint16_t(h - 1))) - f) : 1e30;
    ASSERT_LE(err, up) << f;
    ASSERT_LE(err, down) << f;
  }
}

TEST(Types, BFloat16) {
  EXPECT_EQ(BF16ToF32(0x3f80), 1.f);
  EXPECT_EQ(F32ToBF16(1.f), 0x3f80);
  EXPECT_EQ(F32ToBF16(1.f + std::ldexp(1.f, -8)), 0x3f80);      // tie to even
  EXPECT_EQ(F32ToBF16(1.f + 3 * std::ldexp(1.f, -8)), 0x3f82);  // tie to even (up)
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::nanf("")))));
}

}  // namespace
}  // namespace strata::kernels
