// Block formats: quantize / dequantize round trips within each format's error bound, and
// every ISA's DequantizeRow (decoding against gguf-py is quant_golden_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

using testing::GaussianFloats;
using testing::ScopedIsa;

class QuantIsa : public ::testing::TestWithParam<testing::Variant> {};

TEST_P(QuantIsa, DequantizeMatchesScalarForEveryType) {
  const DType types[] = {DType::kF32,    DType::kF16,   DType::kBF16, DType::kQ8_0, DType::kQ8_1,
                         DType::kQ8_K,   DType::kQ4_0,  DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                         DType::kQ2_K,   DType::kQ3_K,  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                         DType::kIQ4_NL, DType::kIQ4_XS};
  for (DType t : types) {
    SCOPED_TRACE(TypeName(t));
    const int64_t n = 768;
    std::vector<float> x = GaussianFloats(n, 77);
    std::vector<uint8_t> q(RowBytes(t, n));
    ASSERT_TRUE(QuantizeRow(t, x.data(), q.data(), n));
    std::vector<float> ref(n), got(n, -1.f);
    {
      ScopedIsa scalar(Isa::kScalar);
      DequantizeRow(t, q.data(), ref.data(), n);
    }
    testing::ScopedVariant isa(GetParam());
    DequantizeRow(t, q.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(got[i], ref[i]) << "value " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, QuantIsa, ::testing::ValuesIn(testing::AllVariants()),
                         testing::VariantName);

// Largest magnitude in [i0, i1).
float AbsMax(const std::vector<float>& x, int64_t i0, int64_t i1) {
  float m = 0;
  for (int64_t i = i0; i < i1; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

std::vector<float> RoundTrip(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(RowBytes(t, n));
  EXPECT_TRUE(QuantizeRow(t, x.data(), q.data(), n));
  std::vector<float> y(n);
  DequantizeRow(t, q.data(), y.data(), n);
  return y;
}

TEST(Quant, RoundTripErrorWithinFormatStep) {
  const int64_t n = 1024;
  std::vector<float> x = GaussianFloats(n, 5, 0.7f);
  for (int64_t i = 256; i < 288; ++i) x[i] = 0.f;  // an all-zero block must stay zero
  const double f16 = std::ldexp(1.0, -10);         // F16 scale rounding, relative
  struct Case {
    DType t;
    int64_t block;
    double steps_per_amax;  // error bound in units of the block's largest magnitude
  };
  // Q8: half a step of amax/127. Q4_0, Q5_0: a full step of amax/8, amax/16 (the largest
  // positive value may be clamped from code 16 to 15, 32 to 31). Q4_1, Q5_1: half a step of
  // range/15, range/31 (range <= 2*amax). IQ4_NL: half the grid's widest gap (23) or its
  // clamped end (127 to 113) in units of amax/113.
  const Case cases[] = {{DType::kQ8_0, 32, 0.5 / 127},  {DType::kQ8_1, 32, 0.5 / 127},
                        {DType::kQ8_K, 256, 0.5 / 127}, {DType::kQ4_0, 32, 1.0 / 8},
                        {DType::kQ4_1, 32, 1.0 / 15},   {DType::kQ5_0, 32, 1.0 / 16},
                        {DType::kQ5_1, 32, 1.0 / 31},   {DType::kIQ4_NL, 32, 14.0 / 113}};
  for (const Case& c : cases) {
    SCOPED_TRACE(TypeName(c.t));
    std::vector<float> y = RoundTrip(c.t, x);
    for (int64_t b = 0; b < n / c.block; ++b) {
      const float amax = AbsMax(x, b * c.block, (b + 1) * c.block);
      for (int64_t i = b * c.block; i < (b + 1) * c.block; ++i) {
        ASSERT_NEAR(y[i], x[i], amax * (c.steps_per_amax + 2 * f16) + 1e-7) << "value " << i;
      }
    }
    for (int64_t i = 256; i < 288; ++i) EXPECT_EQ(y[i], 0.f);
  }
}

// K formats quantize the sub-block scales themselves (4, 6 or 8 bits), so the bound is a
// relative RMS error that shrinks with the levels per sub-block: Q2_K 4, Q3_K 8, Q4_K and
// IQ4_XS 16, Q5_K 32, Q6_K 64.
TEST(Quant, KFormatsRoundTripRmsError) {
  const int64_t n = 4096;
  std::vector<float> x = GaussianFloats(n, 9, 0.05f);
  for (int64_t i = 512; i < 1024; ++i) x[i] += 0.03f;  // shifted super-blocks use the mins
  const std::pair<DType, double> cases[] = {{DType::kQ2_K, 0.45}, {DType::kQ3_K, 0.25},
                                            {DType::kQ4_K, 0.12}, {DType::kQ5_K, 0.06},
                                            {DType::kQ6_K, 0.03}, {DType::kIQ4_XS, 0.12}};
  for (auto [t, limit] : cases) {
    SCOPED_TRACE(TypeName(t));
    std::vector<float> y = RoundTrip(t, x);
    double err = 0, sig = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (y[i] - x[i]) * (y[i] - x[i]);
      sig += x[i] * x[i];
    }
    EXPECT_LT(std::sqrt(err / sig), limit);
    EXPECT_GT(std::sqrt(err / sig), 0.0);  // it is a lossy format: identical means a bug
  }
}

TEST(Quant, FloatFormatsRoundTrip) {
  std::vector<float> x = GaussianFloats(100, 3);
  std::vector<float> y = RoundTrip(DType::kF32, x);
  EXPECT_EQ(x, y);
  y = RoundTrip(DType::kF16, x);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 4.9e-4);
  y = RoundTrip(DType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 3.91e-3);
}

TEST(Quant, RejectsPartialBlocksAndUnknownTypes) {
  std::vector<float> x(300, 1.f);
  std::vector<uint8_t> out(4096);
  EXPECT_FALSE(QuantizeRow(DType::kQ4_0, x.data(), out.data(), 33));
  EXPECT_FALSE(QuantizeRow(DType::kQ4_K, x.data(), out.data(), 288));
  EXPECT_FALSE(QuantizeRow(DType::kIQ2_XXS, x.data(), out.data(), 256));
  EXPECT_FALSE(QuantizeRow(DType::kQ8_0, x.data(), out.data(), -32));
  EXPECT_TRUE(QuantizeRow(DType::kQ8_0, x.data(), out.data(), 0));
}

TEST(Quant, ActivationTypes) {
  EXPECT_EQ(ActivationType(DType::kQ4_0), DType::kQ8_0);
  EXPECT_EQ(ActivationType(DType::kQ8_0), DType::kQ8_0);
  EXPECT_EQ(ActivationType(DType::kQ5_0), DType::kQ8_0);
  EXPECT_EQ(ActivationType(DType::kIQ4_NL), DType::kQ8_0);
  EXPECT_EQ(ActivationType(DType::kQ4_1), DType::kQ8_1);
  EXPECT_EQ(ActivationType(DType::kQ5_1), DType::kQ8_1);
  for (DType t :
       {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}) {
    EXPECT_EQ(ActivationType(t), DType::kQ8_K) << TypeName(t);
  }
  EXPECT_EQ(ActivationType(DType::kF16), DType::kF32);
  EXPECT_EQ(ActivationType(DType::kBF16), DType::kF32);
  EXPECT_EQ(ActivationType(DType::kF32), DType::kF32);
}

TEST(Quant, Q8_1StoresScaledSum) {
  std::vector<float> x = GaussianFloats(64, 11);
  BlockQ8_1 b[2];
  ASSERT_TRUE(QuantizeRow(DType::kQ8_1, x.data(), b, 64));
  for (const BlockQ8_1& blk : b) {
    int sum = 0;
    for (int8_t q : blk.qs) sum += q;
    EXPECT_NEAR(F16ToF32(blk.s), F16ToF32(blk.d) * float(sum),
                std::fabs(F16ToF32(blk.d) * float(sum)) * 5e-4);
  }
}

}  // namespace
}  // namespace strata::kernels
