// Element-wise ops, RoPE, conversions, ScoreTiles (F16, Q8, Q4) and TopK on every ISA, against
// direct formulas computed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

using testing::GaussianFloats;

class OpsIsa : public ::testing::TestWithParam<testing::Variant> {
 protected:
  void SetUp() override { cpu::SetActiveTable(GetParam()); }
  void TearDown() override { cpu::SetActiveTable(saved_); }
  testing::Variant saved_ = cpu::ActiveTable();
};

// Lengths around the vector widths (4, 8, 16 floats) and their multiples.
const int64_t kLengths[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 576, 1000};

TEST_P(OpsIsa, RmsNorm) {
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> x = GaussianFloats(n, 1, 3.f), w = GaussianFloats(n, 2);
    std::vector<float> y(n), y2(n), inplace = x;
    RmsNorm(x.data(), w.data(), y.data(), n, 1e-5f);
    RmsNorm(x.data(), nullptr, y2.data(), n, 1e-5f);
    RmsNorm(inplace.data(), w.data(), inplace.data(), n, 1e-5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = n ? 1.0 / std::sqrt(ss / double(n) + 1e-5) : 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y[i], x[i] * inv * w[i], 2e-6 * (1 + std::fabs(x[i] * inv * w[i])));
      EXPECT_NEAR(y2[i], x[i] * inv, 2e-6 * (1 + std::fabs(x[i] * inv)));
      EXPECT_EQ(inplace[i], y[i]);
    }
  }
}

TEST_P(OpsIsa, SwiGluAndAdd) {
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> g = GaussianFloats(n, 3, 4.f), u = GaussianFloats(n, 4);
    if (n > 2) {
      g[0] = -100.f;  // exp overflow side: silu -> -0
      g[1] = 100.f;
    }
    std::vector<float> out(n), alias = g;
    SwiGlu(g.data(), u.data(), out.data(), n);
    SwiGlu(alias.data(), u.data(), alias.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
      EXPECT_NEAR(out[i], ref, 2e-6 * (1 + std::fabs(ref))) << i;
      EXPECT_EQ(alias[i], out[i]);
    }
    std::vector<float> y = GaussianFloats(n, 5), y0 = y;
    Add(y.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], y0[i] + u[i]);
  }
}

TEST_P(OpsIsa, Softmax) {
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> x = GaussianFloats(n, 6, 10.f), ref = x;
    if (n > 3) x[2] = ref[2] = -std::numeric_limits<float>::infinity();  // a masked entry
    double m = -1e300, sum = 0;
    for (float v : ref) m = std::max(m, double(v));
    for (float v : ref) sum += std::exp(v - m);
    const float lse = SoftmaxInPlace(x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(x[i], std::exp(ref[i] - m) / sum, 1e-6) << i;
    }
    // The log of the denominator.
    if (n > 0) {
      EXPECT_NEAR(lse, m + std::log(sum), 1e-5 * (1 + std::fabs(m))) << n;
    }
  }
  std::vector<float> none;
  EXPECT_EQ(SoftmaxInPlace(none.data(), 0), -std::numeric_limits<float>::infinity());
}

TEST_P(OpsIsa, DotF32) {
  for (int64_t n : kLengths) {
    std::vector<float> a = GaussianFloats(n, 7), b = GaussianFloats(n, 8);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double(a[i]) * b[i];
      mag += std::fabs(double(a[i]) * b[i]);
    }
    EXPECT_NEAR(DotF32(a.data(), b.data(), n), ref, 1e-6 * mag + 1e-7) << n;
  }
}

// Every ISA sums in order of i with one fused multiply-add a term, so the bits are the
// scalar reference's; row counts around the 8-row tiles, column counts around the lanes.
TEST_P(OpsIsa, RowsTimesMatrixMatchesScalarBitForBit) {
  for (int64_t n : {1, 3, 8, 9, 17, 32}) {
    for (int64_t r : {1, 6, 8, 12, 16, 17, 24, 48}) {
      for (int64_t k : {1, 7, 64, 192}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " r " << r << " k " << k);
        const std::vector<float> x = GaussianFloats(n * k, 11), a = GaussianFloats(k * r, 12);
        std::vector<float> y(size_t(n * r) + 1, -1.0f), want(size_t(n * r));
        RowsTimesMatrix(x.data(), n, k, a.data(), r, y.data());
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t j = 0; j < r; ++j) {
            float acc = 0.0f;
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < k; ++i) {
              acc = std::fma(x[size_t(t * k + i)], a[size_t(i * r + j)], acc);
              ref += double(x[size_t(t * k + i)]) * a[size_t(i * r + j)];
              mag += std::fabs(double(x[size_t(t * k + i)]) * a[size_t(i * r + j)]);
            }
            want[size_t(t * r + j)] = acc;
            ASSERT_NEAR(y[size_t(t * r + j)], ref, 1e-5 * mag + 1e-7) << t << ", " << j;
          }
        }
        EXPECT_EQ(0, std::memcmp(y.data(), want.data(), want.size() * sizeof(float)));
        EXPECT_EQ(y.back(), -1.0f) << "wrote past n x r";
      }
    }
  }
}

TEST_P(OpsIsa, HalfRowConversionsMatchScalarBitForBit) {
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    std::vector<float> x = GaussianFloats(n, 9, 100.f);
    if (n > 5) {
      x[0] = 1e-6f;    // subnormal half
      x[1] = 70000.f;  // overflow to inf
      x[2] = -0.f;
      x[3] = std::numeric_limits<float>::infinity();
      x[4] = 1.f + std::ldexp(1.f, -11);  // tie
    }
    std::vector<uint16_t> h(n);
    std::vector<float> back(n);
    F32ToF16Row(x.data(), h.data(), n);
    F16ToF32Row(h.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], F32ToF16(x[i])) << i;
      ASSERT_EQ(back[i], F16ToF32(h[i])) << i;
    }
  }
}

// Q8_0 rows to F16 (how attention reads Q8_0 KV): each value d * q rounded once to the
// nearest half, with rows `stride` bytes apart; the same bits on every ISA.
TEST_P(OpsIsa, Q8_0RowsToF16MatchTheFormula) {
  constexpr int32_t kValues = 64, kRows = 5;
  constexpr int64_t kStride = 3 * int64_t(sizeof(BlockQ8_0)) + 6;  // a row, padding, unaligned
  std::vector<uint8_t> bytes(size_t(kRows * kStride));
  const std::vector<float> scales = GaussianFloats(kRows * 2, 21, 0.05f);
  const std::vector<float> values = GaussianFloats(kRows * kValues, 22, 60.f);
  for (int32_t r = 0; r < kRows; ++r)
    for (int32_t b = 0; b < kValues / 32; ++b) {
      BlockQ8_0 blk;
      // Extremes in the first rows: the largest scales and -128 / 127.
      blk.d = F32ToF16(r == 0 ? 65504.f : scales[size_t(r * 2 + b)]);
      for (int j = 0; j < 32; ++j)
        blk.qs[j] = int8_t(std::clamp(int(values[size_t(r * kValues + b * 32 + j)]), -128, 127));
      if (r == 1) blk.qs[0] = -128, blk.qs[1] = 127;
      std::memcpy(bytes.data() + r * kStride + b * sizeof(BlockQ8_0), &blk, sizeof(blk));
    }
  std::vector<uint16_t> got(size_t(kRows * kValues), 0xFFFF);
  cpu::ActiveTable()->q8_0_rows_to_f16(bytes.data(), kStride, kRows, kValues, got.data());
  for (int32_t r = 0; r < kRows; ++r)
    for (int32_t i = 0; i < kValues; ++i) {
      BlockQ8_0 blk;
      std::memcpy(&blk, bytes.data() + r * kStride + (i / 32) * sizeof(BlockQ8_0), sizeof(blk));
      const uint16_t want = F32ToF16(F16ToF32(blk.d) * float(blk.qs[i % 32]));
      ASSERT_EQ(got[size_t(r * kValues + i)], want) << "row " << r << " value " << i;
    }
}

TEST_P(OpsIsa, RopeBothLayoutsMatchTheFormula) {
  struct Shape {
    int heads, head_dim, rot_dim;
  };
  for (Shape s : {Shape{9, 64, 64}, Shape{3, 128, 128}, Shape{2, 64, 32}, Shape{4, 80, 80},
                  Shape{1, 16, 8}}) {
    for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
      SCOPED_TRACE(::testing::Message() << s.heads << "x" << s.head_dim << " rot " << s.rot_dim
                                        << (layout == RopeLayout::kNeox ? " neox" : " normal"));
      const int pos = 37;
      std::vector<float> cs(s.rot_dim);
      for (int i = 0; i < s.rot_dim / 2; ++i) {
        const double theta = pos * std::pow(10000.0, -2.0 * i / s.rot_dim);
        cs[2 * i] = float(std::cos(theta));
        cs[2 * i + 1] = float(std::sin(theta));
      }
      std::vector<float> x = GaussianFloats(size_t(s.heads) * s.head_dim, 10), y = x;
      RopeApply(y.data(), s.heads, s.head_dim, s.rot_dim, cs.data(), layout);
      for (int h = 0; h < s.heads; ++h) {
        const float* a = x.data() + h * s.head_dim;
        const float* b = y.data() + h * s.head_dim;
        for (int i = 0; i < s.rot_dim / 2; ++i) {
          const int i0 = layout == RopeLayout::kNormal ? 2 * i : i;
          const int i1 = layout == RopeLayout::kNormal ? 2 * i + 1 : i + s.rot_dim / 2;
          const double c = cs[2 * i], sn = cs[2 * i + 1];
          EXPECT_NEAR(b[i0], a[i0] * c - a[i1] * sn, 1e-6);
          EXPECT_NEAR(b[i1], a[i0] * sn + a[i1] * c, 1e-6);
        }
        for (int d = s.rot_dim; d < s.head_dim; ++d) EXPECT_EQ(b[d], a[d]);
      }
    }
  }
}

TEST_P(OpsIsa, ScoreTilesF16) {
  constexpr int64_t T = kScoreTile;
  for (int64_t cols : {1, 6, 12, 24, 64}) {
    for (int64_t n_x : {1, 3, 4, 9, 13}) {
      SCOPED_TRACE(::testing::Message() << cols << " cols, " << n_x << " queries");
      const int64_t n_tiles = 5, tb = 1, te = 4, stride = (te - tb) * T + 3;
      // Tokens written through TiledIndex, so the test also pins the layout.
      const std::vector<float> keys = GaussianFloats(n_tiles * T * cols, 21);
      std::vector<uint16_t> tiles(size_t(n_tiles * T * cols));
      for (int64_t t = 0; t < n_tiles * T; ++t)
        for (int64_t j = 0; j < cols; ++j)
          tiles[size_t(TiledIndex(t, j, cols))] = F32ToF16(keys[size_t(t * cols + j)]);
      const std::vector<float> x = GaussianFloats(n_x * cols, 22);
      std::vector<float> y(size_t(n_x * stride), 42.f);
      ScoreTiles(ScoreType::kF16, tiles.data(), tb, te, cols, x.data(), n_x, y.data(), stride);
      for (int64_t q = 0; q < n_x; ++q) {
        for (int64_t t = tb * T; t < te * T; ++t) {
          double ref = 0, mag = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const double p =
                double(F16ToF32(F32ToF16(keys[size_t(t * cols + j)]))) * x[q * cols + j];
            ref += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(y[size_t(q * stride + t - tb * T)], ref, 1e-6 * mag + 1e-7) << q << " " << t;
        }
        for (int64_t c = (te - tb) * T; c < stride; ++c) EXPECT_EQ(y[size_t(q * stride + c)], 42.f);
      }
    }
  }
}

// Token t's value j as Q8 or Q4 tiles hold it, read from the documented layout.
double StoredQuantized(ScoreType type, const uint8_t* tiles, int64_t t, int64_t j, int64_t cols) {
  constexpr int64_t T = kScoreTile;
  const uint8_t* tile = tiles + (t / T) * ScoreTileBytes(type, cols);
  uint16_t h;
  std::memcpy(&h, tile + ScoreValueBytes(type, cols) + (t % T) * 2, 2);
  int v;
  if (type == ScoreType::kQ8) {
    v = int8_t(tile[j * T + t % T]);
  } else {
    const uint8_t b = tile[j * (T / 2) + t % (T / 2)];
    v = (t % T < T / 2 ? b & 0x0F : b >> 4) - 8;
  }
  return double(v) * F16ToF32(h);
}

// Q8 and Q4 tiles written through StoreScoreRow: each value within half a step (row max / 127
// or / 7) of the original, and the kernels' scores equal to the stored values' dot products.
TEST_P(OpsIsa, ScoreTilesQuantized) {
  constexpr int64_t T = kScoreTile;
  for (ScoreType type : {ScoreType::kQ8, ScoreType::kQ4}) {
    const double levels = type == ScoreType::kQ8 ? 127 : 7;
    for (int64_t cols : {1, 6, 12, 24, 48, 64}) {
      for (int64_t n_x : {1, 3, 4, 9, 13}) {
        SCOPED_TRACE(::testing::Message() << (type == ScoreType::kQ8 ? "q8, " : "q4, ") << cols
                                          << " cols, " << n_x << " queries");
        const int64_t n_tiles = 5, tb = 1, te = 4, stride = (te - tb) * T + 3;
        std::vector<float> keys = GaussianFloats(n_tiles * T * cols, 23);
        for (int64_t j = 0; j < cols; ++j) keys[size_t(5 * cols + j)] = 0.0f;  // all-zero row
        keys[size_t(6 * cols)] = 1e3f;  // one outlier: the rest of its row rounds coarsely
        const int64_t tile_bytes = ScoreTileBytes(type, cols);
        ASSERT_EQ(tile_bytes, T * cols / (type == ScoreType::kQ8 ? 1 : 2) + 2 * T);
        std::vector<uint8_t> tiles(size_t(n_tiles * tile_bytes), 0xA5);
        // Written out of order: a token's nibbles must not disturb its neighbours'.
        for (int64_t t = n_tiles * T - 1; t >= 0; t -= 2)
          StoreScoreRow(type, keys.data() + t * cols, cols, t, tiles.data());
        for (int64_t t = 0; t < n_tiles * T; t += 2)
          StoreScoreRow(type, keys.data() + t * cols, cols, t, tiles.data());
        std::vector<double> stored(keys.size());
        for (int64_t t = 0; t < n_tiles * T; ++t) {
          double amax = 0;
          for (int64_t j = 0; j < cols; ++j)
            amax = std::max(amax, std::fabs(double(keys[size_t(t * cols + j)])));
          for (int64_t j = 0; j < cols; ++j) {
            const double v = StoredQuantized(type, tiles.data(), t, j, cols);
            stored[size_t(t * cols + j)] = v;
            EXPECT_LE(std::fabs(v - keys[size_t(t * cols + j)]), amax / (2 * levels) * 1.002)
                << "token " << t << " dim " << j;
          }
        }
        const std::vector<float> x = GaussianFloats(n_x * cols, 24);
        std::vector<float> y(size_t(n_x * stride), 42.f);
        ScoreTiles(type, tiles.data(), tb, te, cols, x.data(), n_x, y.data(), stride);
        for (int64_t q = 0; q < n_x; ++q) {
          // A Q4 kernel may round the query to int8 against its largest magnitude (the
          // AVX-512 one does, to multiply in integers): then its scores are that query's.
          double amax = 0;
          for (int64_t j = 0; j < cols; ++j)
            amax = std::max(amax, std::fabs(double(x[q * cols + j])));
          std::vector<double> xr(static_cast<size_t>(cols));
          for (int64_t j = 0; j < cols; ++j)
            xr[size_t(j)] = std::nearbyint(double(x[q * cols + j]) * 127 / amax) * amax / 127;
          for (int64_t t = tb * T; t < te * T; ++t) {
            double ref = 0, ref_rounded = 0, mag = 0;
            for (int64_t j = 0; j < cols; ++j) {
              const double p = stored[size_t(t * cols + j)] * x[q * cols + j];
              ref += p;
              ref_rounded += stored[size_t(t * cols + j)] * xr[size_t(j)];
              mag += std::fabs(p);
            }
            const double got = y[size_t(q * stride + t - tb * T)], tol = 1e-6 * mag + 1e-7;
            if (type == ScoreType::kQ4 && std::fabs(got - ref) > tol)
              EXPECT_NEAR(got, ref_rounded, tol) << q << " " << t;
            else
              EXPECT_NEAR(got, ref, tol) << q << " " << t;
          }
          for (int64_t c = (te - tb) * T; c < stride; ++c)
            EXPECT_EQ(y[size_t(q * stride + c)], 42.f);
        }
      }
    }
  }
}

// A row that is not finite scores NaN (ranked last by selection), never a finite guess.
TEST(ScoreTilesQuantized, NonFiniteRowScoresNaN) {
  constexpr int64_t cols = 8;
  for (ScoreType type : {ScoreType::kQ8, ScoreType::kQ4}) {
    SCOPED_TRACE(type == ScoreType::kQ8 ? "q8" : "q4");
    std::vector<uint8_t> tiles(size_t(ScoreTileBytes(type, cols)));
    std::vector<float> row(cols, 1.0f);
    for (int64_t t = 0; t < kScoreTile; ++t) StoreScoreRow(type, row.data(), cols, t, tiles.data());
    row[3] = std::nanf("");
    StoreScoreRow(type, row.data(), cols, 2, tiles.data());
    row[3] = INFINITY;
    StoreScoreRow(type, row.data(), cols, 4, tiles.data());
    row[3] = 1e7f;  // finite, but its scale (1e7 / 127 or / 7) is past F16's range
    StoreScoreRow(type, row.data(), cols, 6, tiles.data());
    const std::vector<float> x(cols, 1.0f);
    std::vector<float> y(kScoreTile);
    ScoreTiles(type, tiles.data(), 0, 1, cols, x.data(), 1, y.data(), kScoreTile);
    for (int64_t t = 0; t < kScoreTile; ++t) {
      if (t == 2 || t == 4 || t == 6)
        EXPECT_TRUE(std::isnan(y[size_t(t)])) << t;
      else
        EXPECT_NEAR(y[size_t(t)], 8.0f, 8.0f / 14) << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, OpsIsa, ::testing::ValuesIn(testing::AllVariants()),
                         testing::VariantName);

TEST(TopK, OrdersByValueThenIndex) {
  const std::vector<float> x = {1.f, 5.f, 3.f, 5.f, -2.f, 7.f, 3.f, std::nanf(""), 0.f};
  std::vector<int32_t> idx(5, -1);
  TopK(x.data(), int64_t(x.size()), 5, idx.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{5, 1, 3, 2, 6}));
  std::vector<int32_t> all(12, -1);
  TopK(x.data(), int64_t(x.size()), 12, all.data());  // k > n: writes n
  EXPECT_EQ(std::vector<int32_t>(all.begin(), all.begin() + 9),
            (std::vector<int32_t>{5, 1, 3, 2, 6, 0, 8, 4, 7}));
  EXPECT_EQ(all[9], -1);
  TopK(x.data(), int64_t(x.size()), 0, all.data());
  TopK(x.data(), 0, 3, all.data());
  EXPECT_EQ(all[0], 5);  // untouched
}

TEST(TopK, MatchesStableSortOnRandomData) {
  for (int64_t n : {1, 10, 1000}) {
    for (int64_t k : {1, 7, 64}) {
      std::vector<float> x = GaussianFloats(n, uint32_t(n + k));
      for (int64_t i = 0; i < n; i += 3) x[i] = std::round(x[i]);  // plenty of ties
      std::vector<int32_t> ref(n);
      std::iota(ref.begin(), ref.end(), 0);
      std::stable_sort(ref.begin(), ref.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      ref.resize(std::min(n, k));
      std::vector<int32_t> got(ref.size());
      TopK(x.data(), n, k, got.data());
      EXPECT_EQ(got, ref) << n << " " << k;
    }
  }
}

}  // namespace
}  // namespace strata::kernels
