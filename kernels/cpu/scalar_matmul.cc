// Reference matmul: one dot product per (row, token) on the quantized blocks, integer sums
// within a block and float accumulation across blocks, exactly as the formats define them.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/block_math.h"
#include "kernels/cpu/scalar_internal.h"

namespace strata::kernels::cpu {
namespace {

float DotF32Row(const float* w, const float* x, int64_t k) {
  float s = 0.f;
  for (int64_t i = 0; i < k; ++i) s += w[i] * x[i];
  return s;
}

float DotF16Row(const uint16_t* w, const float* x, int64_t k) {
  float s = 0.f;
  for (int64_t i = 0; i < k; ++i) s += F16ToF32(w[i]) * x[i];
  return s;
}

float DotBF16Row(const uint16_t* w, const float* x, int64_t k) {
  float s = 0.f;
  for (int64_t i = 0; i < k; ++i) s += BF16ToF32(w[i]) * x[i];
  return s;
}

float DotQ4_0(const BlockQ4_0* w, const BlockQ8_0* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int i = 0; i < 16; ++i) {
      isum += ((w[b].qs[i] & 0xF) - 8) * x[b].qs[i];
      isum += ((w[b].qs[i] >> 4) - 8) * x[b].qs[i + 16];
    }
    s += F16ToF32(w[b].d) * F16ToF32(x[b].d) * static_cast<float>(isum);
  }
  return s;
}

float DotQ4_1(const BlockQ4_1* w, const BlockQ8_1* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int i = 0; i < 16; ++i) {
      isum += (w[b].qs[i] & 0xF) * x[b].qs[i];
      isum += (w[b].qs[i] >> 4) * x[b].qs[i + 16];
    }
    // sum((d q + m) * dx qx) = d dx sum(q qx) + m * (dx sum(qx)), the last factor being s.
    s += F16ToF32(w[b].d) * F16ToF32(x[b].d) * static_cast<float>(isum) +
         F16ToF32(w[b].m) * F16ToF32(x[b].s);
  }
  return s;
}

float DotQ5_0(const BlockQ5_0* w, const BlockQ8_0* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int q[32], isum = 0;
    Q5Codes(w[b].qh, w[b].qs, q);
    for (int i = 0; i < kQK; ++i) isum += (q[i] - 16) * x[b].qs[i];
    s += F16ToF32(w[b].d) * F16ToF32(x[b].d) * static_cast<float>(isum);
  }
  return s;
}

float DotQ5_1(const BlockQ5_1* w, const BlockQ8_1* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int q[32], isum = 0;
    Q5Codes(w[b].qh, w[b].qs, q);
    for (int i = 0; i < kQK; ++i) isum += q[i] * x[b].qs[i];
    s += F16ToF32(w[b].d) * F16ToF32(x[b].d) * static_cast<float>(isum) +
         F16ToF32(w[b].m) * F16ToF32(x[b].s);
  }
  return s;
}

float DotIQ4_NL(const BlockIQ4_NL* w, const BlockQ8_0* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int i = 0; i < 16; ++i) {
      isum += kIQ4Grid[w[b].qs[i] & 0xF] * x[b].qs[i];
      isum += kIQ4Grid[w[b].qs[i] >> 4] * x[b].qs[i + 16];
    }
    s += F16ToF32(w[b].d) * F16ToF32(x[b].d) * static_cast<float>(isum);
  }
  return s;
}

float DotQ8_0(const BlockQ8_0* w, const BlockQ8_0* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int i = 0; i < kQK; ++i) isum += w[b].qs[i] * x[b].qs[i];
    s += F16ToF32(w[b].d) * F16ToF32(x[b].d) * static_cast<float>(isum);
  }
  return s;
}

float DotQ4_K(const BlockQ4_K* w, const BlockQ8_K* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[8], mn[8];
    Q4KScalesMins(w[b].scales, sc, mn);
    int isum = 0, msum = 0;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = w[b].qs + 32 * c;
      const int8_t* xa = x[b].qs + 64 * c;
      int lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo += (q[l] & 0xF) * xa[l];
        hi += (q[l] >> 4) * xa[l + 32];
      }
      isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
    }
    for (int j = 0; j < 8; ++j) msum += mn[j] * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
    s += x[b].d * (F16ToF32(w[b].d) * static_cast<float>(isum) -
                   F16ToF32(w[b].dmin) * static_cast<float>(msum));
  }
  return s;
}

float DotQ2_K(const BlockQ2_K* w, const BlockQ8_K* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0, msum = 0;
    for (int j = 0; j < 16; ++j) {
      int sub = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) sub += K2BitCode(w[b].qs, i) * x[b].qs[i];
      isum += (w[b].scales[j] & 0xF) * sub;
      msum += (w[b].scales[j] >> 4) * x[b].bsums[j];
    }
    s += x[b].d * (F16ToF32(w[b].d) * static_cast<float>(isum) -
                   F16ToF32(w[b].dmin) * static_cast<float>(msum));
  }
  return s;
}

float DotQ3_K(const BlockQ3_K* w, const BlockQ8_K* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int sub = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        const int high = (w[b].hmask[i % 32] >> (i / 32)) & 1;
        sub += (K2BitCode(w[b].qs, i) - (high ? 0 : 4)) * x[b].qs[i];
      }
      isum += (Q3KScaleCode(w[b].scales, j) - 32) * sub;
    }
    s += F16ToF32(w[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}

float DotQ5_K(const BlockQ5_K* w, const BlockQ8_K* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, mn, sub = 0;
      Q4KScaleMin(w[b].scales, j, &sc, &mn);
      const uint8_t* q = w[b].qs + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        const int code = ((q[l] >> (4 * (j % 2))) & 0xF) | (((w[b].qh[l] >> j) & 1) << 4);
        sub += code * x[b].qs[32 * j + l];
      }
      isum += sc * sub;
      msum += mn * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
    }
    s += x[b].d * (F16ToF32(w[b].d) * static_cast<float>(isum) -
                   F16ToF32(w[b].dmin) * static_cast<float>(msum));
  }
  return s;
}

float DotIQ4_XS(const BlockIQ4_XS* w, const BlockQ8_K* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = w[b].qs + 16 * j;
      const int8_t* xs = x[b].qs + 32 * j;
      int sub = 0;
      for (int i = 0; i < 16; ++i) {
        sub += kIQ4Grid[q[i] & 0xF] * xs[i] + kIQ4Grid[q[i] >> 4] * xs[i + 16];
      }
      isum += (IQ4XSScaleCode(w[b], j) - 32) * sub;
    }
    s += F16ToF32(w[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}

float DotQ6_K(const BlockQ6_K* w, const BlockQ8_K* x, int64_t nb) {
  float s = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int sub = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) sub += (Q6KCode(w[b], i) - 32) * x[b].qs[i];
      isum += w[b].scales[j] * sub;
    }
    s += F16ToF32(w[b].d) * x[b].d * static_cast<float>(isum);
  }
  return s;
}

float DotRow(const MatmulArgs& a, const void* w, const void* x) {
  const int64_t k = a.k;
  switch (a.wtype) {
    case DType::kF32:
      return DotF32Row(static_cast<const float*>(w), static_cast<const float*>(x), k);
    case DType::kF16:
      return DotF16Row(static_cast<const uint16_t*>(w), static_cast<const float*>(x), k);
    case DType::kBF16:
      return DotBF16Row(static_cast<const uint16_t*>(w), static_cast<const float*>(x), k);
    case DType::kQ4_0:
      return DotQ4_0(static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(x), k / kQK);
    case DType::kQ4_1:
      return DotQ4_1(static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(x), k / kQK);
    case DType::kQ8_0:
      return DotQ8_0(static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(x), k / kQK);
    case DType::kQ4_K:
      return DotQ4_K(static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(x), k / kQK_K);
    case DType::kQ6_K:
      return DotQ6_K(static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(x), k / kQK_K);
    case DType::kQ5_0:
      return DotQ5_0(static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(x), k / kQK);
    case DType::kQ5_1:
      return DotQ5_1(static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(x), k / kQK);
    case DType::kIQ4_NL:
      return DotIQ4_NL(static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(x),
                       k / kQK);
    case DType::kQ2_K:
      return DotQ2_K(static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(x), k / kQK_K);
    case DType::kQ3_K:
      return DotQ3_K(static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(x), k / kQK_K);
    case DType::kQ5_K:
      return DotQ5_K(static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(x), k / kQK_K);
    case DType::kIQ4_XS:
      return DotIQ4_XS(static_cast<const BlockIQ4_XS*>(w), static_cast<const BlockQ8_K*>(x),
                       k / kQK_K);
    default:
      return 0.f;  // unsupported weight type: the engine checks weight_supported at load
  }
}

}  // namespace

void ScalarMatmul(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const uint8_t* x = static_cast<const uint8_t*>(a.xq);
  for (int64_t t = 0; t < a.n_tok; ++t) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      a.y[t * a.y_stride + r] = DotRow(a, w + r * a.w_row_bytes, x + t * a.xq_row_bytes);
    }
  }
}

void ScalarScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride) {
  constexpr int64_t T = kScoreTile;
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint16_t* tile = tiles + i * cols * T;
    for (int64_t q = 0; q < n_x; ++q) {
      float acc[T] = {};
      for (int64_t j = 0; j < cols; ++j) {
        const float xj = x[q * cols + j];
        for (int64_t t = 0; t < T; ++t) acc[t] += xj * F16ToF32(tile[j * T + t]);
      }
      std::copy(acc, acc + T, y + q * y_stride + (i - tile_begin) * T);
    }
  }
}

namespace {

// Token t's integer of dimension j in a Q8 or Q4 tile.
int QuantizedValue(ScoreType type, const uint8_t* tile, int64_t j, int64_t t) {
  constexpr int64_t T = kScoreTile;
  if (type == ScoreType::kQ8) return int8_t(tile[j * T + t]);
  const uint8_t b = tile[j * (T / 2) + t % (T / 2)];
  return (t < T / 2 ? b & 0x0F : b >> 4) - 8;
}

void ScoreQuantizedTiles(ScoreType type, const uint8_t* tiles, int64_t tile_begin, int64_t tile_end,
                         int64_t cols, const float* x, int64_t n_x, float* y, int64_t y_stride) {
  constexpr int64_t T = kScoreTile;
  const int64_t tile_bytes = ScoreTileBytes(type, cols);
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const uint8_t* tile = tiles + i * tile_bytes;
    uint16_t scale[T];
    std::memcpy(scale, tile + ScoreValueBytes(type, cols), sizeof(scale));
    for (int64_t q = 0; q < n_x; ++q) {
      float acc[T] = {};
      for (int64_t j = 0; j < cols; ++j) {
        const float xj = x[q * cols + j];
        for (int64_t t = 0; t < T; ++t) acc[t] += xj * float(QuantizedValue(type, tile, j, t));
      }
      float* yo = y + q * y_stride + (i - tile_begin) * T;
      for (int64_t t = 0; t < T; ++t) yo[t] = acc[t] * F16ToF32(scale[t]);
    }
  }
}

}  // namespace

void ScalarScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreQuantizedTiles(ScoreType::kQ8, tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

void ScalarScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride) {
  ScoreQuantizedTiles(ScoreType::kQ4, tiles, tile_begin, tile_end, cols, x, n_x, y, y_stride);
}

}  // namespace strata::kernels::cpu
