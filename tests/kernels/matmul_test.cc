// Matmul: the scalar reference against float math on the same (dequantized) values, and
// every SIMD variant against the scalar reference over types, token counts, ragged row
// ranges and inner sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

using testing::GaussianFloats;
using testing::QuickMode;
using testing::ScopedIsa;

const DType kWeightTypes[] = {DType::kF32,  DType::kF16,    DType::kBF16,  DType::kQ8_0,
                              DType::kQ4_0, DType::kQ4_1,   DType::kQ5_0,  DType::kQ5_1,
                              DType::kQ2_K, DType::kQ3_K,   DType::kQ4_K,  DType::kQ5_K,
                              DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

bool IsKQuant(DType t) { return GetTypeInfo(t).block_elems == kQK_K; }
bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

std::vector<int64_t> InnerSizes(DType t) {
  if (IsKQuant(t))
    return QuickMode() ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{256, 768, 1536};
  if (IsFloat(t))
    return QuickMode() ? std::vector<int64_t>{40, 576} : std::vector<int64_t>{16, 40, 576, 1000};
  return QuickMode() ? std::vector<int64_t>{96, 576} : std::vector<int64_t>{32, 96, 576, 1536};
}

std::vector<int64_t> TokenCounts() {
  if (QuickMode()) return {1, 3, 4, 8, 17};
  return {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 64};
}

// A weight matrix with per-row scale and offset variety, plus rows whose codes sit at the
// extremes of the format (the cases where 8/16-bit intermediate sums could saturate).
struct Weights {
  DType type;
  int64_t rows, k;
  size_t row_bytes;  // dense row size plus padding, so strides are exercised
  std::vector<uint8_t> data;

  const uint8_t* row(int64_t r) const { return data.data() + r * row_bytes; }
  uint8_t* row(int64_t r) { return data.data() + r * row_bytes; }
};

void SetExtremeCodes(DType t, uint8_t* row, int64_t k, bool high) {
  switch (t) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < k / kQK; ++b) {
        auto* blk = reinterpret_cast<BlockQ8_0*>(row) + b;
        std::memset(blk->qs, high ? 0x7f : 0x80, sizeof(blk->qs));  // 127 or -128
      }
      break;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL: {
      // The codes are the block's last 16 bytes, the Q5 high bits the 4 before them. For
      // IQ4_NL code 0 is the grid's -127 and code 15 its 113.
      const size_t bb = GetTypeInfo(t).block_bytes;
      const bool q5 = t == DType::kQ5_0 || t == DType::kQ5_1;
      for (int64_t b = 0; b < k / kQK; ++b) {
        std::memset(row + b * bb + bb - 16, high ? 0xff : 0, 16);
        if (q5) std::memset(row + b * bb + bb - 20, high ? 0xff : 0, 4);
      }
      break;
    }
    case DType::kQ2_K:
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        auto* blk = reinterpret_cast<BlockQ2_K*>(row) + b;
        std::memset(blk->qs, high ? 0xff : 0, sizeof(blk->qs));
        std::memset(blk->scales, 0xff, sizeof(blk->scales));  // every scale and min = 15
      }
      break;
    case DType::kQ3_K:
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        auto* blk = reinterpret_cast<BlockQ3_K*>(row) + b;
        std::memset(blk->qs, high ? 0xff : 0, sizeof(blk->qs));
        std::memset(blk->hmask, high ? 0xff : 0, sizeof(blk->hmask));  // codes 3 or -4
        // Scale codes 0, 48, 15, 63 by quarter: scales -32, 16, -17, 31.
        for (int i = 0; i < 12; ++i) blk->scales[i] = static_cast<uint8_t>(i < 8 ? 0xf0 : 0xcc);
      }
      break;
    case DType::kQ5_K:
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        auto* blk = reinterpret_cast<BlockQ5_K*>(row) + b;
        std::memset(blk->qs, high ? 0xff : 0, sizeof(blk->qs));
        std::memset(blk->qh, high ? 0xff : 0, sizeof(blk->qh));
        std::memset(blk->scales, 0xff, sizeof(blk->scales));  // every scale and min = 63
      }
      break;
    case DType::kIQ4_XS:
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        auto* blk = reinterpret_cast<BlockIQ4_XS*>(row) + b;
        std::memset(blk->qs, high ? 0xff : 0, sizeof(blk->qs));
        blk->scales_h = 0xcccc;                                   // sub-blocks alternate
        std::memset(blk->scales_l, 0xf0, sizeof(blk->scales_l));  // scales -32 and 31
      }
      break;
    case DType::kQ4_K:
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        auto* blk = reinterpret_cast<BlockQ4_K*>(row) + b;
        std::memset(blk->qs, high ? 0xff : 0, sizeof(blk->qs));
        std::memset(blk->scales, 0xff, sizeof(blk->scales));  // every scale and min = 63
      }
      break;
    case DType::kQ6_K:
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        auto* blk = reinterpret_cast<BlockQ6_K*>(row) + b;
        std::memset(blk->ql, high ? 0xff : 0, sizeof(blk->ql));
        std::memset(blk->qh, high ? 0xff : 0, sizeof(blk->qh));
        for (int j = 0; j < 16; ++j) blk->scales[j] = static_cast<int8_t>(j % 2 ? -128 : 127);
      }
      break;
    default:
      break;
  }
}

Weights MakeWeights(DType t, int64_t rows, int64_t k, uint32_t seed) {
  Weights w{t, rows, k, RowBytes(t, k) + 24, {}};
  w.data.assign(w.row_bytes * rows + 64, 0xcd);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> v =
        GaussianFloats(k, seed + static_cast<uint32_t>(r), 0.02f * float(1 + r % 7));
    if (r % 5 == 1) {
      for (float& f : v) f += 0.05f;  // rows with an offset exercise the *_1 / K mins
    }
    if (r % 11 == 3) std::fill(v.begin(), v.begin() + std::min<int64_t>(k, 64), 0.f);
    EXPECT_TRUE(QuantizeRow(t, v.data(), w.row(r), k));
  }
  if (rows > 2 && !IsFloat(t)) {
    SetExtremeCodes(t, w.row(0), k, true);
    SetExtremeCodes(t, w.row(rows - 1), k, false);
  }
  return w;
}

struct Activations {
  DType type;
  int64_t n_tok, k;
  size_t row_bytes;
  std::vector<float> x;    // [n_tok][k] original floats
  std::vector<uint8_t> q;  // quantized rows, row_bytes apart
  std::vector<float> deq;  // the quantized rows dequantized
};

Activations MakeActivations(DType wtype, int64_t n_tok, int64_t k, uint32_t seed) {
  Activations a{
      ActivationType(wtype), n_tok, k, RowBytes(ActivationType(wtype), k) + 8, {}, {}, {}};
  a.x = GaussianFloats(static_cast<size_t>(n_tok * k), seed);
  // Token 0 has constant magnitude, so every code is +-127: the saturation corner.
  for (int64_t i = 0; i < k; ++i) a.x[i] = (i % 3 == 0) ? -1.5f : 1.5f;
  a.q.assign(a.row_bytes * n_tok + 64, 0);
  a.deq.resize(a.x.size());
  ScopedIsa scalar(Isa::kScalar);
  for (int64_t t = 0; t < n_tok; ++t) {
    QuantizeActivations(wtype, a.x.data() + t * k, k, a.q.data() + t * a.row_bytes);
    DequantizeRow(a.type, a.q.data() + t * a.row_bytes, a.deq.data() + t * k, k);
  }
  return a;
}

MatmulArgs Args(const Weights& w, const Activations& a, float* y, int64_t y_stride) {
  MatmulArgs m{};
  m.wtype = w.type;
  m.w = w.data.data();
  m.w_row_bytes = w.row_bytes;
  m.k = w.k;
  m.xq = a.q.data();
  m.xq_row_bytes = a.row_bytes;
  m.n_tok = a.n_tok;
  m.y = y;
  m.y_stride = y_stride;
  return m;
}

// Sum of |w_i * x_i| over a row: the scale of the float rounding any summation order makes.
double Magnitude(const std::vector<float>& wrow, const float* x, int64_t k) {
  double m = 0;
  for (int64_t i = 0; i < k; ++i) m += std::fabs(static_cast<double>(wrow[i]) * x[i]);
  return m;
}

TEST(MatmulScalar, MatchesFloatMathOnDequantizedValues) {
  for (DType t : kWeightTypes) {
    for (int64_t k : InnerSizes(t)) {
      SCOPED_TRACE(std::string(TypeName(t)) + " k=" + std::to_string(k));
      const int64_t rows = 21, n_tok = 5;
      Weights w = MakeWeights(t, rows, k, 100);
      Activations a = MakeActivations(t, n_tok, k, 200);
      std::vector<float> y(n_tok * rows);
      {
        ScopedIsa scalar(Isa::kScalar);
        Matmul(Args(w, a, y.data(), rows), 0, rows);
      }
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> wrow(k);
        DequantizeRow(t, w.row(r), wrow.data(), k);
        for (int64_t tok = 0; tok < n_tok; ++tok) {
          const float* xd = a.deq.data() + tok * k;
          double ref = 0;
          for (int64_t i = 0; i < k; ++i) ref += static_cast<double>(wrow[i]) * xd[i];
          // Float rounding of the per-block products and sums, plus for Q8_1 the F16
          // rounding of the stored block sum s (relative 2^-11 of |m * s| per block).
          double tol = 2e-6 * Magnitude(wrow, xd, k) + 1e-6;
          if (ActivationType(t) == DType::kQ8_1) {
            // Q4_1 and Q5_1 keep their F16 min at bytes 2..3 of each block.
            const size_t bb = GetTypeInfo(t).block_bytes;
            const auto* xb = reinterpret_cast<const BlockQ8_1*>(a.q.data() + tok * a.row_bytes);
            for (int64_t b = 0; b < k / kQK; ++b) {
              uint16_t m;
              std::memcpy(&m, w.row(r) + b * bb + 2, 2);
              tol += std::fabs(F16ToF32(m) * F16ToF32(xb[b].s)) * std::ldexp(1.0, -11);
            }
          }
          EXPECT_NEAR(y[tok * rows + r], ref, tol) << "row " << r << " token " << tok;
        }
      }
    }
  }
}

// Against the unquantized activations the error is the activation rounding: each value is
// off by at most half a step (d/2) and, over many values, the error of a dot product is a
// sum of independent uniform errors with variance sum(w_i^2 d_i^2 / 12). Six standard
// deviations (plus the F16 rounding of the block scale) bound it.
TEST(MatmulScalar, ActivationQuantizationErrorIsWithinItsBound) {
  for (DType t : kWeightTypes) {
    if (IsFloat(t)) continue;
    const int64_t k = IsKQuant(t) ? 1536 : 1024, rows = 16, n_tok = 4;
    SCOPED_TRACE(TypeName(t));
    Weights w = MakeWeights(t, rows, k, 300);
    Activations a = MakeActivations(t, n_tok, k, 400);
    std::vector<float> y(n_tok * rows);
    {
      ScopedIsa scalar(Isa::kScalar);
      Matmul(Args(w, a, y.data(), rows), 0, rows);
    }
    const int64_t block = IsKQuant(t) ? kQK_K : kQK;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> wrow(k);
      DequantizeRow(t, w.row(r), wrow.data(), k);
      for (int64_t tok = 1; tok < n_tok; ++tok) {  // token 0 is the +-1.5 corner case
        const float* x = a.x.data() + tok * k;
        double ref = 0, var = 0, scale_err = 0;
        for (int64_t b = 0; b < k / block; ++b) {
          float amax = 0;
          for (int64_t i = b * block; i < (b + 1) * block; ++i)
            amax = std::max(amax, std::fabs(x[i]));
          const double step = amax / 127.0;
          for (int64_t i = b * block; i < (b + 1) * block; ++i) {
            ref += static_cast<double>(wrow[i]) * x[i];
            var += static_cast<double>(wrow[i]) * wrow[i] * step * step / 12.0;
            scale_err += std::fabs(static_cast<double>(wrow[i]) * x[i]) * std::ldexp(1.0, -10);
          }
        }
        EXPECT_NEAR(y[tok * rows + r], ref, 6 * std::sqrt(var) + scale_err + 1e-6)
            << "row " << r << " token " << tok;
      }
    }
  }
}

class MatmulSimd : public ::testing::TestWithParam<testing::Variant> {};

TEST_P(MatmulSimd, MatchesScalarReference) {
  const int64_t rows = 53;  // not a multiple of 16: ragged last chunk
  const int64_t y_stride = rows + 3;
  const std::pair<int64_t, int64_t> ranges[] = {{0, rows}, {16, 32}, {5, 37}, {48, 53}, {52, 53}};
  for (DType t : kWeightTypes) {
    for (int64_t k : InnerSizes(t)) {
      Weights w = MakeWeights(t, rows, k, 500 + static_cast<uint32_t>(k));
      std::vector<float> wrow(k);
      std::vector<double> mag_w(rows);
      for (int64_t n_tok : TokenCounts()) {
        SCOPED_TRACE(std::string(TypeName(t)) + " k=" + std::to_string(k) +
                     " n_tok=" + std::to_string(n_tok));
        Activations a = MakeActivations(t, n_tok, k, 600 + static_cast<uint32_t>(n_tok));
        std::vector<float> ref(n_tok * y_stride);
        {
          ScopedIsa scalar(Isa::kScalar);
          Matmul(Args(w, a, ref.data(), y_stride), 0, rows);
        }
        testing::ScopedVariant simd(GetParam());
        for (auto [rb, re] : ranges) {
          std::vector<float> y(n_tok * y_stride, std::numeric_limits<float>::quiet_NaN());
          Matmul(Args(w, a, y.data(), y_stride), rb, re);
          for (int64_t r = 0; r < rows; ++r) {
            DequantizeRow(t, w.row(r), wrow.data(), k);
            for (int64_t tok = 0; tok < n_tok; ++tok) {
              const float got = y[tok * y_stride + r];
              if (r < rb || r >= re) {
                ASSERT_TRUE(std::isnan(got))
                    << "wrote row " << r << " outside [" << rb << "," << re << ") token " << tok;
                continue;
              }
              // Rows with offsets and Q4_1 min terms can cancel, so scale the bound by the
              // row's largest weight rather than by |w| * |x| alone.
              float wmax = 0;
              for (float v : wrow) wmax = std::max(wmax, std::fabs(v));
              double xabs = 0;
              for (int64_t i = 0; i < k; ++i) xabs += std::fabs(a.deq[tok * k + i]);
              const double tol = 1e-5 * 3 * wmax * xabs + 1e-6;
              ASSERT_NEAR(got, ref[tok * y_stride + r], tol)
                  << "row " << r << " token " << tok << " range [" << rb << "," << re << ")";
            }
          }
        }
      }
    }
  }
}

TEST_P(MatmulSimd, EmptyRangeWritesNothing) {
  testing::ScopedVariant simd(GetParam());
  Weights w = MakeWeights(DType::kQ4_1, 16, 64, 7);
  Activations a = MakeActivations(DType::kQ4_1, 2, 64, 8);
  std::vector<float> y(32, 7.f);
  Matmul(Args(w, a, y.data(), 16), 5, 5);
  MatmulArgs none = Args(w, a, y.data(), 16);
  none.n_tok = 0;
  Matmul(none, 0, 16);
  for (float v : y) EXPECT_EQ(v, 7.f);
}

TEST_P(MatmulSimd, QuantizeActivationsMatchesScalarBytes) {
  for (DType t : kWeightTypes) {
    for (int64_t k : InnerSizes(t)) {
      SCOPED_TRACE(std::string(TypeName(t)) + " k=" + std::to_string(k));
      std::vector<float> x = GaussianFloats(k, 900 + static_cast<uint32_t>(k), 3.f);
      if (k >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.f);  // an all-zero block
      const size_t bytes = RowBytes(ActivationType(t), k);
      std::vector<uint8_t> ref(bytes), got(bytes);
      {
        ScopedIsa scalar(Isa::kScalar);
        QuantizeActivations(t, x.data(), k, ref.data());
      }
      testing::ScopedVariant simd(GetParam());
      QuantizeActivations(t, x.data(), k, got.data());
      EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), bytes));
    }
  }
}

// Batch invariance: a token's outputs are bit-identical whatever other tokens share the
// call and whichever row range a thread computes. The engine relies on it: step-wise beam
// search must give the same results however beams are grouped into batches.
TEST_P(MatmulSimd, EachTokensOutputIsIndependentOfTheBatch) {
  const int64_t rows = 37;
  for (DType t : kWeightTypes) {
    const int64_t k = InnerSizes(t).back();
    SCOPED_TRACE(std::string(TypeName(t)) + " k=" + std::to_string(k));
    Weights w = MakeWeights(t, rows, k, 77);
    testing::ScopedVariant simd(GetParam());
    // 17..19 tokens end in a ragged tile of 1, 2 or 3 tokens after whole tiles of 4.
    for (int64_t n_tok : {17, 18, 19}) {
      Activations a = MakeActivations(t, n_tok, k, 78);
      std::vector<float> all(n_tok * rows);
      Matmul(Args(w, a, all.data(), rows), 0, rows);
      for (int64_t tok = 0; tok < n_tok; ++tok) {
        Activations one = a;
        one.n_tok = 1;
        one.q.assign(a.q.begin() + tok * a.row_bytes, a.q.begin() + (tok + 1) * a.row_bytes);
        std::vector<float> y(rows);
        Matmul(Args(w, one, y.data(), rows), 0, 16);
        Matmul(Args(w, one, y.data(), rows), 16, rows);
        ASSERT_EQ(0, std::memcmp(y.data(), all.data() + tok * rows, rows * sizeof(float)))
            << "batch " << n_tok << " token " << tok;
      }
    }
  }
}

// A k too wide for one panel of the x86 driver (cpu::MatmulPanelBytes(), from the core's L2)
// is summed in slices of groups; the slices must not depend on the batch, or a token decoded
// alone would get other bits than the same token in a prefill.
TEST_P(MatmulSimd, AWideKSlicedAcrossPanelsMatchesTheReferenceInAnyBatch) {
  const int64_t k = (cpu::MatmulPanelBytes() + kQK_K - 1) / kQK_K * kQK_K + kQK_K;
  const int64_t rows = 3, n_tok = 9;
  for (DType t : kWeightTypes) {
    if (IsFloat(t)) continue;  // float weights take no activation panel
    SCOPED_TRACE(std::string(TypeName(t)) + " k=" + std::to_string(k));
    Weights w = MakeWeights(t, rows, k, 91);
    Activations a = MakeActivations(t, n_tok, k, 92);
    std::vector<float> ref(n_tok * rows), all(n_tok * rows);
    {
      ScopedIsa scalar(Isa::kScalar);
      Matmul(Args(w, a, ref.data(), rows), 0, rows);
    }
    testing::ScopedVariant simd(GetParam());
    Matmul(Args(w, a, all.data(), rows), 0, rows);
    std::vector<float> wrow(k);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(t, w.row(r), wrow.data(), k);
      float wmax = 0;
      for (float v : wrow) wmax = std::max(wmax, std::fabs(v));
      for (int64_t tok = 0; tok < n_tok; ++tok) {
        double xabs = 0;
        for (int64_t i = 0; i < k; ++i) xabs += std::fabs(a.deq[tok * k + i]);
        ASSERT_NEAR(all[tok * rows + r], ref[tok * rows + r], 1e-5 * 3 * wmax * xabs + 1e-6)
            << "row " << r << " token " << tok;
      }
    }
    for (int64_t tok = 0; tok < n_tok; ++tok) {
      Activations one = a;
      one.n_tok = 1;
      one.q.assign(a.q.begin() + tok * a.row_bytes, a.q.begin() + (tok + 1) * a.row_bytes);
      std::vector<float> y(rows);
      Matmul(Args(w, one, y.data(), rows), 0, rows);
      ASSERT_EQ(0, std::memcmp(y.data(), all.data() + tok * rows, rows * sizeof(float)))
          << "token " << tok;
    }
  }
}

// The kRows16 layout: the repacked tiles hold the file's bytes (a tile of 16 rows, zero rows
// past the end), and every table multiplies them to the same value as the row-major rows
// for any batch, row range and k (including a k sliced across panels): the same bits where
// the table unpacks the tiles or for Q4_K, and for every type the same bits for a token
// alone as in a batch, so an engine may repack or not without changing how it batches.
const DType kRows16Types[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};

std::vector<uint8_t> Repacked(const Weights& w) {
  std::vector<uint8_t> out(Rows16Bytes(w.type, w.rows, w.k));
  const int64_t tiles = (w.rows + kRows16Tile - 1) / kRows16Tile;
  // Two calls on disjoint tile ranges, as the loader's threads make them.
  RepackRows16(w.type, w.data.data(), w.row_bytes, w.rows, w.k, out.data(), 0, tiles / 2);
  RepackRows16(w.type, w.data.data(), w.row_bytes, w.rows, w.k, out.data(), tiles / 2, tiles);
  return out;
}

TEST(MatmulRows16, TilesHoldEachRowsBlocksAsDescribed) {
  for (DType t : kRows16Types) {
    EXPECT_TRUE(Rows16Supported(t));
    for (int64_t k : InnerSizes(t)) {  // odd and even numbers of blocks per row
      SCOPED_TRACE(std::string(TypeName(t)) + " k=" + std::to_string(k));
      const int64_t rows = 21;  // two tiles, the second with 5 rows and 11 zero rows
      Weights w = MakeWeights(t, rows, k, 5);
      const size_t tile = Rows16TileBytes(t, k), row_bytes = RowBytes(t, k);
      ASSERT_EQ(tile % 64, 0u);
      ASSERT_GE(tile, row_bytes * 16);
      ASSERT_LT(tile, row_bytes * 16 + 64);
      ASSERT_EQ(Rows16Bytes(t, rows, k), 2 * tile);
      const std::vector<uint8_t> p = Repacked(w);
      // Block b's code dword j of row r at codes + 4 (16 v + r), v = j (Q6_K: the v with
      // kQ6_KRows16Order[v] = j), the block's 2-byte scale (Q4_0, Q4_1, Q8_0: its first bytes;
      // Q6_K: its last) at scales + 2 r, and Q4_1's 2-byte min (its bytes 2-3) at scales + 32
      // + 2 r.
      const int64_t block_bytes = t == DType::kQ4_0   ? 18
                                  : t == DType::kQ4_1 ? 20
                                  : t == DType::kQ8_0 ? 34
                                  : t == DType::kQ4_K ? 144
                                                      : 210;
      const int64_t scale_at = t == DType::kQ6_K ? 208 : 0;
      const int64_t scale_bytes = t == DType::kQ4_K ? 0 : 2;
      const int64_t min_bytes = t == DType::kQ4_1 ? 2 : 0;
      const int64_t codes_at = t == DType::kQ6_K ? 0 : scale_bytes + min_bytes;
      const int64_t dwords = (block_bytes - scale_bytes - min_bytes) / 4;
      const int64_t nb = int64_t(row_bytes) / block_bytes;
      std::vector<uint8_t> want(static_cast<size_t>(block_bytes)), got = want;
      for (int64_t r = 0; r < 32; ++r) {
        const uint8_t* tile_p = p.data() + size_t(r / 16) * tile;
        for (int64_t b = 0; b < nb; ++b) {
          const Rows16Block at = Rows16BlockAt(t, nb, b);
          ASSERT_EQ(at.codes % 64, 0) << "block " << b;
          std::fill(want.begin(), want.end(), 0);
          if (r < rows) std::memcpy(want.data(), w.row(r) + b * block_bytes, size_t(block_bytes));
          std::memcpy(got.data() + scale_at, tile_p + at.scales + scale_bytes * (r % 16),
                      size_t(scale_bytes));
          std::memcpy(got.data() + 2, tile_p + at.scales + 32 + min_bytes * (r % 16),
                      size_t(min_bytes));
          for (int64_t v = 0; v < dwords; ++v) {
            const int64_t j = t == DType::kQ6_K ? kQ6_KRows16Order[size_t(v)] : v;
            std::memcpy(got.data() + codes_at + 4 * j, tile_p + at.codes + 4 * (v * 16 + r % 16),
                        4);
          }
          ASSERT_EQ(got, want) << "row " << r << " block " << b;
        }
        if (r < rows) {
          std::vector<uint8_t> row(row_bytes);
          Rows16Row(t, p.data(), k, r, row.data());
          ASSERT_EQ(0, std::memcmp(row.data(), w.row(r), row_bytes)) << "Rows16Row " << r;
        }
      }
    }
  }
}

TEST(MatmulRows16, SameValuesAsTheRowMajorRowsOnEveryTable) {
  const int64_t rows = 53, y_stride = rows + 3;
  const std::pair<int64_t, int64_t> ranges[] = {{0, rows}, {16, 32}, {5, 37}, {48, 53}, {52, 53}};
  const int64_t wide = (cpu::MatmulPanelBytes() + kQK_K - 1) / kQK_K * kQK_K + kQK_K;
  for (DType type : kRows16Types) {
    std::vector<int64_t> ks = InnerSizes(type);
    if (type == DType::kQ4_K) ks.push_back(wide);  // its kernel follows the driver's slices
    for (int64_t k : ks) {
      Weights w = MakeWeights(type, rows, k, 300 + static_cast<uint32_t>(k));
      std::vector<uint8_t> packed = Repacked(w);
      // The kernels load whole vectors from the tiles: keep them 64-byte aligned.
      void* aligned = nullptr;
      ASSERT_EQ(0, posix_memalign(&aligned, 64, packed.size()));
      std::memcpy(aligned, packed.data(), packed.size());
      std::vector<float> wrow(k);
      std::vector<float> wmax(rows);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(type, w.row(r), wrow.data(), k);
        for (float v : wrow) wmax[r] = std::max(wmax[r], std::fabs(v));
      }
      for (testing::Variant v : testing::AllVariants()) {
        testing::ScopedVariant use(v);
        // Q4_K's native kernel and every unpacking table give the row-major bits.
        const bool same_bits = type == DType::kQ4_K || !Rows16Preferred(type);
        // Q4_K's kernel picks its work by batch size: every count. The others: a decode, a
        // batch below and above the tokens fused per pass, and a ragged one.
        const std::vector<int64_t> counts = k == wide              ? std::vector<int64_t>{1, 9}
                                            : type == DType::kQ4_K ? TokenCounts()
                                                                   : std::vector<int64_t>{1, 3, 17};
        for (int64_t n_tok : counts) {
          SCOPED_TRACE(std::string(TypeName(type)) + " " + v->variant + " k=" + std::to_string(k) +
                       " n_tok=" + std::to_string(n_tok));
          Activations a = MakeActivations(type, n_tok, k, 400 + static_cast<uint32_t>(n_tok));
          std::vector<double> xabs(n_tok);
          for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t i = 0; i < k; ++i) xabs[t] += std::fabs(a.deq[t * k + i]);
          for (auto [rb, re] : ranges) {
            std::vector<float> ref(n_tok * y_stride, std::numeric_limits<float>::quiet_NaN());
            std::vector<float> got = ref;
            Matmul(Args(w, a, ref.data(), y_stride), rb, re);
            MatmulArgs m = Args(w, a, got.data(), y_stride);
            m.w = aligned;
            m.w_row_bytes = RowBytes(type, k);
            m.w_layout = WeightLayout::kRows16;
            Matmul(m, rb, re);
            for (int64_t i = 0; i < n_tok * y_stride; ++i) {
              const int64_t r = i % y_stride, t = i / y_stride;
              if (r < rb || r >= re) {
                ASSERT_TRUE(std::isnan(got[i])) << "wrote row " << r << " outside the range";
              } else if (same_bits) {
                ASSERT_EQ(0, std::memcmp(&got[i], &ref[i], sizeof(float)))
                    << "row " << r << " token " << t << " range [" << rb << "," << re
                    << "): " << got[i] << " vs " << ref[i];
              } else {
                ASSERT_NEAR(got[i], ref[i], 1e-5 * 3 * wmax[r] * xabs[t] + 1e-6)
                    << "row " << r << " token " << t << " range [" << rb << "," << re << ")";
              }
            }
            if (n_tok == 1 || rb != 5) continue;
            // Each token alone: the bits it got in the batch.
            for (int64_t t = 0; t < n_tok; ++t) {
              Activations one = a;
              one.n_tok = 1;
              one.q.assign(a.q.begin() + t * a.row_bytes, a.q.begin() + (t + 1) * a.row_bytes);
              std::vector<float> y(y_stride, std::numeric_limits<float>::quiet_NaN());
              MatmulArgs m1 = Args(w, one, y.data(), y_stride);
              m1.w = aligned;
              m1.w_row_bytes = RowBytes(type, k);
              m1.w_layout = WeightLayout::kRows16;
              Matmul(m1, rb, re);
              ASSERT_EQ(0, std::memcmp(y.data() + rb, got.data() + t * y_stride + rb,
                                       size_t(re - rb) * sizeof(float)))
                  << "token " << t << " alone";
            }
          }
        }
      }
      std::free(aligned);
    }
  }
}

TEST(MatmulRows16, ATypeWithoutTheLayoutGivesNaNRows) {
  EXPECT_FALSE(Rows16Supported(DType::kQ5_K));
  Weights w = MakeWeights(DType::kQ5_K, 16, 256, 9);
  Activations a = MakeActivations(DType::kQ5_K, 1, 256, 10);
  std::vector<float> y(16, 0.f);
  MatmulArgs m = Args(w, a, y.data(), 16);
  m.w_layout = WeightLayout::kRows16;
  Matmul(m, 0, 16);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

INSTANTIATE_TEST_SUITE_P(Isas, MatmulSimd, ::testing::ValuesIn(testing::SimdVariants()),
                         testing::VariantName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MatmulSimd);

}  // namespace
}  // namespace strata::kernels

namespace strata::kernels {
namespace {

TEST(Matmul, UnsupportedTypeOrPartialBlockGivesNaNRows) {
  std::vector<uint8_t> w(4096, 0);
  std::vector<uint8_t> x(4096, 0);
  std::vector<float> y(8, 1.f);
  MatmulArgs a{};
  a.wtype = DType::kIQ2_XXS;  // known to GGUF, no kernel here
  a.w = w.data();
  a.w_row_bytes = 66;
  a.k = 256;
  a.xq = x.data();
  a.xq_row_bytes = 64;
  a.n_tok = 2;
  a.y = y.data();
  a.y_stride = 4;
  Matmul(a, 1, 3);
  EXPECT_EQ(y[0], 1.f);
  EXPECT_TRUE(std::isnan(y[1]) && std::isnan(y[2]) && std::isnan(y[5]) && std::isnan(y[6]));
  EXPECT_EQ(y[3], 1.f);
  std::fill(y.begin(), y.end(), 1.f);
  a.wtype = DType::kQ4_K;
  a.k = 128;  // not a whole super-block
  Matmul(a, 0, 1);
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[4]));
  EXPECT_EQ(y[1], 1.f);
}

// The engine's workers call Matmul at the same time on disjoint row ranges; each call's
// activation panel is its own thread's.
TEST(Matmul, ConcurrentCallsOnDisjointRowsMatchOneCall) {
  // Q4_K at 9 tokens takes AVX-512's rows-in-lanes kernel and its per-thread accumulators.
  for (DType t : {DType::kQ4_1, DType::kQ4_K}) {
    const int64_t rows = 96, k = t == DType::kQ4_K ? 768 : 576, n_tok = t == DType::kQ4_K ? 9 : 5;
    for (testing::Variant v : testing::AllVariants()) {
      testing::ScopedVariant scoped(v);
      Weights w = MakeWeights(t, rows, k, 31);
      Activations x = MakeActivations(t, n_tok, k, 32);
      std::vector<float> one(rows * n_tok), split(rows * n_tok);
      Matmul(Args(w, x, one.data(), rows), 0, rows);
      std::vector<std::thread> threads;
      for (int64_t r0 = 0; r0 < rows; r0 += 32) {
        threads.emplace_back([&, r0] { Matmul(Args(w, x, split.data(), rows), r0, r0 + 32); });
      }
      for (std::thread& th : threads) th.join();
      EXPECT_EQ(one, split) << TypeName(t) << " " << v->variant;
    }
  }
}

}  // namespace
}  // namespace strata::kernels
