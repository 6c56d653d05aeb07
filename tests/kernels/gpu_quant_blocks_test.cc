// The GPU matmuls' block arithmetic (kernels/cuda/quant_blocks.h), run on the host: each
// type's in-place decoding against the CPU's scalar DequantizeRow, its dp4a dot products
// against a double-precision sum over the decoded values, and a token's result the same
// bits whatever the number of tokens it is computed with. The device compiles the same
// functions, so these run on every machine, GPU or not.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cuda/quant_blocks.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

namespace q = cuda::q;
using testing::GaussianFloats;

// A few rows of type t: quantized Gaussian values, plus one row of random bytes with sane
// scales so every code of the format (extreme ones included) occurs.
std::vector<uint8_t> RandomRows(DType t, int64_t rows, int64_t k, uint32_t seed) {
  const size_t rb = RowBytes(t, k);
  std::vector<uint8_t> out(rb * size_t(rows));
  for (int64_t r = 0; r + 1 < rows; ++r) {
    const std::vector<float> v = GaussianFloats(size_t(k), seed + uint32_t(r), 0.05f);
    EXPECT_TRUE(QuantizeRow(t, v.data(), out.data() + rb * size_t(r), k));
  }
  std::mt19937 rng(seed * 7 + 1);
  uint8_t* last = out.data() + rb * size_t(rows - 1);
  for (size_t i = 0; i < rb; ++i) last[i] = uint8_t(rng());
  // Scale fields: small finite halves (exponent bits kept away from inf/NaN).
  const TypeInfo& ti = GetTypeInfo(t);
  for (int64_t b = 0; b < k / ti.block_elems; ++b) {
    uint8_t* blk = last + b * ti.block_bytes;
    auto put = [&](size_t off) {
      const uint16_t h = F32ToF16(0.001f + 0.01f * float(rng() % 100) / 100.f);
      std::memcpy(blk + off, &h, 2);
    };
    switch (t) {
      case DType::kQ4_0:
      case DType::kQ8_0:
        put(0);
        break;
      case DType::kQ4_1:
      case DType::kQ4_K:
        put(0);
        put(2);
        break;
      case DType::kQ6_K:
        put(208);
        break;
      default:
        break;
    }
  }
  return out;
}

template <class B>
void CheckDequant(DType t, int64_t k) {
  const int64_t rows = 4;
  const std::vector<uint8_t> w = RandomRows(t, rows, k, 11);
  const size_t rb = RowBytes(t, k);
  std::vector<float> ref(static_cast<size_t>(k)), got(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w.data() + rb * size_t(r);
    DequantizeRow(t, row, ref.data(), k);
    for (int64_t u = 0; u < k / B::kUnit; ++u) B::Dequant(row, u, got.data() + u * B::kUnit);
    for (int64_t i = 0; i < k; ++i)
      ASSERT_NEAR(got[size_t(i)], ref[size_t(i)], 1e-6f * std::max(1.0f, std::fabs(ref[size_t(i)])))
          << TypeName(t) << " row " << r << " value " << i;
  }
}

template <class B>
void CheckDot(DType t, int64_t k) {
  constexpr int kTokens = 8;
  const int64_t rows = 4;
  const std::vector<uint8_t> w = RandomRows(t, rows, k, 23);
  const size_t rb = RowBytes(t, k);
  // Activations: quantized per block of 32, as the GPU quantizes them.
  std::vector<int8_t> xq(size_t(kTokens * k));
  std::vector<q::ActScale> xs(size_t(kTokens * k / 32));
  const std::vector<float> x = GaussianFloats(size_t(kTokens * k), 5, 2.0f);
  for (int64_t b = 0; b < kTokens * k / 32; ++b)
    q::QuantizeActBlock(x.data() + b * 32, xq.data() + b * 32, &xs[size_t(b)]);
  std::vector<float> wf(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w.data() + rb * size_t(r);
    DequantizeRow(t, row, wf.data(), k);
    float acc8[kTokens] = {};
    for (int64_t u = 0; u < k / B::kUnit; ++u)
      B::template Dot<kTokens>(row, u, xq.data(), xs.data(), k, kTokens, acc8);
    for (int tok = 0; tok < kTokens; ++tok) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double xv = double(xq[size_t(tok * k + i)]) * xs[size_t((tok * k + i) / 32)].d;
        ref += double(wf[size_t(i)]) * xv;
        mag += std::fabs(double(wf[size_t(i)]) * xv);
      }
      EXPECT_NEAR(acc8[tok], ref, 1e-5 * mag + 1e-6)
          << TypeName(t) << " row " << r << " token " << tok;
      // The same token alone (and as the last of a partial group) gives the same bits.
      float acc1[1] = {};
      float acc4[4] = {};
      for (int64_t u = 0; u < k / B::kUnit; ++u) {
        B::template Dot<1>(row, u, xq.data() + tok * k, xs.data() + tok * (k / 32), k, 1, acc1);
        B::template Dot<4>(row, u, xq.data() + tok * k, xs.data() + tok * (k / 32), k, 1, acc4);
      }
      EXPECT_EQ(acc1[0], acc8[tok]) << TypeName(t) << " row " << r << " token " << tok;
      EXPECT_EQ(acc4[0], acc8[tok]) << TypeName(t) << " row " << r << " token " << tok;
      EXPECT_EQ(acc4[1], 0.0f);  // tokens past nt are left alone
    }
  }
}

TEST(GpuQuantBlocks, DecodingMatchesTheScalarReference) {
  for (int64_t k : {256, 768}) {
    CheckDequant<q::Q4_0>(DType::kQ4_0, k);
    CheckDequant<q::Q4_1>(DType::kQ4_1, k);
    CheckDequant<q::Q8_0>(DType::kQ8_0, k);
    CheckDequant<q::Q4_K>(DType::kQ4_K, k);
    CheckDequant<q::Q6_K>(DType::kQ6_K, k);
  }
}

TEST(GpuQuantBlocks, Dp4aDotsMatchFloatMathAndIgnoreTheTokenCount) {
  for (int64_t k : {256, 1536}) {
    CheckDot<q::Q4_0>(DType::kQ4_0, k);
    CheckDot<q::Q4_1>(DType::kQ4_1, k);
    CheckDot<q::Q8_0>(DType::kQ8_0, k);
    CheckDot<q::Q4_K>(DType::kQ4_K, k);
    CheckDot<q::Q6_K>(DType::kQ6_K, k);
  }
}

TEST(GpuQuantBlocks, ActivationQuantizationRoundsToNearestWithinTheBlockScale) {
  const std::vector<float> x = GaussianFloats(64, 9, 3.0f);
  int8_t qv[32];
  q::ActScale s;
  q::QuantizeActBlock(x.data(), qv, &s);
  float amax = 0;
  int sum = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[size_t(i)]));
  EXPECT_FLOAT_EQ(s.d, amax / 127.0f);
  for (int i = 0; i < 32; ++i) {
    EXPECT_LE(std::fabs(qv[i] * s.d - x[size_t(i)]), 0.5f * s.d * 1.0001f);
    sum += qv[i];
  }
  EXPECT_FLOAT_EQ(s.s, s.d * float(sum));
  // An all-zero block has scale 0 and zero codes.
  const float zeros[32] = {};
  q::QuantizeActBlock(zeros, qv, &s);
  EXPECT_EQ(s.d, 0.0f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(qv[i], 0);
}

TEST(GpuQuantBlocks, EmulatedIntrinsicsFollowTheirDefinitions) {
  // dp4a: four signed byte products plus c.
  EXPECT_EQ(q::Dp4a(int(0x80FF017Fu), int(0x7F02FF80u), 5),
            5 + (-128) * 127 + (-1) * 2 + 1 * (-1) + 127 * (-128));
  // vsub4: byte-wise, no borrow across bytes.
  EXPECT_EQ(uint32_t(q::Vsub4(int(0x00103F20u), 0x20202020)), 0xE0F01F00u);
}

}  // namespace
}  // namespace strata::kernels
