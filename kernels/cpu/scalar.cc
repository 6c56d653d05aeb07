// The scalar reference table: element-wise ops, RoPE and top-k here; quantization, matmul
// and attention in scalar_quant.cc, scalar_matmul.cc and scalar_attention.cc.
#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/scalar_internal.h"

namespace strata::kernels {
namespace cpu {
namespace {

void RmsNormRef(const float* x, const float* weight, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  double ss = 0.0;  // double: the reference should not lose bits on long rows
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (weight != nullptr ? weight[i] : 1.f);
}

void SwiGluRef(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void AddRef(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

float SoftmaxRef(float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::fmax(m, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  return m + static_cast<float>(std::log(sum));
}

float DotRef(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(s);
}

void RowsTimesMatrixRef(const float* x, int64_t n, int64_t k, const float* a, int64_t r, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y + t * r;
    std::fill(yt, yt + r, 0.0f);
    for (int64_t i = 0; i < k; ++i) {
      const float xi = x[t * k + i];
      const float* ai = a + i * r;
      for (int64_t j = 0; j < r; ++j) yt[j] = std::fma(xi, ai[j], yt[j]);
    }
  }
}

void F32ToF16Ref(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F32ToF16(src[i]);
}

void F16ToF32Ref(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

void Q8_0RowsToF16Ref(const uint8_t* first, int64_t stride, int32_t n_rows, int32_t row_values,
                      uint16_t* dst) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(first + r * stride);
    for (int32_t i = 0; i < row_values; i += 32, ++b) {
      const float d = F16ToF32(b->d);
      for (int j = 0; j < 32; ++j) *dst++ = F32ToF16(d * float(b->qs[j]));
    }
  }
}

void RopeRef(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_sin,
             RopeLayout layout) {
  const int half = rot_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const int i0 = layout == RopeLayout::kNormal ? 2 * i : i;
      const int i1 = layout == RopeLayout::kNormal ? 2 * i + 1 : i + half;
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float a = v[i0], b = v[i1];
      v[i0] = a * c - b * s;
      v[i1] = a * s + b * c;
    }
  }
}

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table = {
      Isa::kScalar,
      "scalar",
      ScalarQuantizeActivations,
      ScalarMatmul,
      nullptr,  // matmul_rows16: dispatch unpacks the tiles for ScalarMatmul
      0,        // matmul_rows16_types
      ScalarDequantizeRow,
      RmsNormRef,
      SwiGluRef,
      AddRef,
      SoftmaxRef,
      DotRef,
      RowsTimesMatrixRef,
      F32ToF16Ref,
      F16ToF32Ref,
      Q8_0RowsToF16Ref,
      RopeRef,
      ScalarAttention,
      ScalarScoreTilesF16,
      ScalarScoreTilesQ8,
      ScalarScoreTilesQ4,
  };
  return table;
}

}  // namespace cpu

namespace {

// Order for top-k: larger value first, equal values by lower index; NaN ranks below
// everything so a poisoned score never displaces a real one.
inline bool Before(const float* x, int32_t a, int32_t b) {
  const float va = x[a], vb = x[b];
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return a < b;
}

// Min-heap on Before: the root is the entry that ranks last among those kept.
void SiftDown(const float* x, int32_t* h, int64_t n, int64_t i) {
  for (;;) {
    int64_t worst = i;
    const int64_t l = 2 * i + 1, r = l + 1;
    if (l < n && Before(x, h[worst], h[l])) worst = l;
    if (r < n && Before(x, h[worst], h[r])) worst = r;
    if (worst == i) return;
    std::swap(h[i], h[worst]);
    i = worst;
  }
}

}  // namespace

void TopK(const float* x, int64_t n, int64_t k, int32_t* idx_out) {
  k = std::min(k, n);
  if (k <= 0) return;
  // Heap of the k best so far inside idx_out itself: no allocation, O(n log k).
  for (int64_t i = 0; i < k; ++i) idx_out[i] = static_cast<int32_t>(i);
  for (int64_t i = k / 2 - 1; i >= 0; --i) SiftDown(x, idx_out, k, i);
  for (int64_t i = k; i < n; ++i) {
    if (Before(x, static_cast<int32_t>(i), idx_out[0])) {
      idx_out[0] = static_cast<int32_t>(i);
      SiftDown(x, idx_out, k, 0);
    }
  }
  // Heap sort: repeatedly move the worst kept entry to the back.
  for (int64_t end = k - 1; end > 0; --end) {
    std::swap(idx_out[0], idx_out[end]);
    SiftDown(x, idx_out, end, 0);
  }
}

}  // namespace strata::kernels
