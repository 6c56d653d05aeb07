// AVX2 + FMA + F16C kernel table (x86-64 CPUs from 2013 on): matmul (avx2_matmul_*.cc),
// attention (avx2_attention.cc); activation quantization and element-wise ops here, with
// the last n % 8 elements done by the scalar formulas.
#include <cmath>
#include <cstring>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/x86/avx2_common.h"
#include "kernels/cpu/x86/avx2_internal.h"
#include "kernels/cpu/x86/x86_rows_times_matrix.h"

namespace strata::kernels::cpu {
namespace {

void Matmul(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kIQ4_NL:
      return Avx2MatmulQuantized(a, rb, re);
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS:
      return Avx2MatmulSuperBlocks(a, rb, re);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return Avx2MatmulFloat(a, rb, re);
    default:
      return ScalarKernels().matmul(a, rb, re);
  }
}

STRATA_INLINE float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

STRATA_INLINE float HSum(__m256 v) { return _mm256_cvtss_f32(ReduceLanes8<1>(&v)); }

STRATA_INLINE int HSumI(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

STRATA_INLINE __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v); }

// Four vectors of 8 int32 (|q| <= 127) to 32 int8 in order.
STRATA_INLINE __m256i PackToBytes(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
  // The packs interleave 128-bit lanes: dword order 0 4 1 5 2 6 3 7 restores it.
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Byte-identical to the scalar reference: amax / 127, 1 / d, round half to even.
void QuantizeActivations(DType weight, const float* x, int64_t n, void* out) {
  const DType at = ActivationType(weight);
  if (at == DType::kQ8_0 || at == DType::kQ8_1) {
    const bool with_sum = at == DType::kQ8_1;
    uint8_t* o = static_cast<uint8_t*>(out);
    const size_t block_bytes = with_sum ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
    for (int64_t b = 0; b < n / kQK; ++b, x += kQK, o += block_bytes) {
      __m256 v[4];
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, Abs(v[i]));
      }
      const float d = HMax(m) / 127.f;
      const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
      const uint16_t dh = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
      std::memcpy(o, &dh, 2);
      const __m256i bytes = PackToBytes(q[0], q[1], q[2], q[3]);
      if (with_sum) {
        const int sum =
            HSumI(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        const uint16_t sh = static_cast<uint16_t>(
            _cvtss_sh(_cvtsh_ss(dh) * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT));
        std::memcpy(o + 2, &sh, 2);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 4), bytes);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2), bytes);
      }
    }
    return;
  }
  if (at == DType::kQ8_K) {
    BlockQ8_K* o = static_cast<BlockQ8_K*>(out);
    for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < kQK_K; i += 8) m = _mm256_max_ps(m, Abs(_mm256_loadu_ps(x + i)));
      const float d = HMax(m) / 127.f;
      const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
      o[b].d = d;
      const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
      for (int g = 0; g < kQK_K; g += 32) {
        __m256i q[4];
        for (int i = 0; i < 4; ++i) {
          q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + g + 8 * i), id));
          q[i] = _mm256_max_epi32(_mm256_min_epi32(q[i], hi), lo);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[b].qs + g),
                            PackToBytes(q[0], q[1], q[2], q[3]));
        o[b].bsums[g / 16] = static_cast<int16_t>(HSumI(_mm256_add_epi32(q[0], q[1])));
        o[b].bsums[g / 16 + 1] = static_cast<int16_t>(HSumI(_mm256_add_epi32(q[2], q[3])));
      }
    }
    return;
  }
  ScalarKernels().quantize_activations(weight, x, n, out);
}

void RmsNorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_fmadd_ps(a, a, s0);
    s1 = _mm256_fmadd_ps(b, b, s1);
  }
  float ss = HSum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
    if (weight != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(weight + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) y[i] = x[i] * scale * (weight != nullptr ? weight[i] : 1.f);
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void Add(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) y[i] += x[i];
}

float Softmax(float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  float m = HMax(mx);
  for (; i < n; ++i) m = std::fmax(m, x[i]);
  const __m256 vm = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float s = HSum(sum);
  for (; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
  const float inv = 1.f / s;
  const __m256 vi = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
  for (; i < n; ++i) x[i] *= inv;
  return m + std::log(s);
}

float Dot(const float* a, const float* b, int64_t n) {
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) {
      s[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), s[j]);
    }
  }
  for (; i + 8 <= n; i += 8)
    s[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s[0]);
  float r = HSum(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void F32ToF16Row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = F32ToF16(src[i]);
}

void F16ToF32Row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

void Q8_0RowsToF16(const uint8_t* first, int64_t stride, int32_t n_rows, int32_t row_values,
                   uint16_t* dst) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(first + r * stride);
    for (int32_t i = 0; i < row_values; i += 32, ++b, dst += 32) {
      const __m256 d = _mm256_set1_ps(HalfToFloat(b->d));
      for (int e = 0; e < 4; ++e) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + 8 * e));
        const __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8 * e),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      }
    }
  }
}

void Rope(float* x, int n_heads, int head_dim, int rot_dim, const float* cs, RopeLayout layout) {
  const int half = rot_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    int i = 0;
    if (layout == RopeLayout::kNormal) {
      for (; i + 8 <= rot_dim; i += 8) {
        const __m256 a = _mm256_loadu_ps(v + i), c = _mm256_loadu_ps(cs + i);
        const __m256 swapped = _mm256_permute_ps(a, 0xB1);
        _mm256_storeu_ps(v + i, _mm256_fmaddsub_ps(a, _mm256_moveldup_ps(c),
                                                   _mm256_mul_ps(swapped, _mm256_movehdup_ps(c))));
      }
      for (; i < rot_dim; i += 2) {
        const float a = v[i], b = v[i + 1], c = cs[i], s = cs[i + 1];
        v[i] = a * c - b * s;
        v[i + 1] = a * s + b * c;
      }
    } else {
      for (; i + 8 <= half; i += 8) {
        const __m256 p0 = _mm256_loadu_ps(cs + 2 * i), p1 = _mm256_loadu_ps(cs + 2 * i + 8);
        const __m256 c = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(p0, p1, 0x88)), 0xD8));
        const __m256 s = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(p0, p1, 0xDD)), 0xD8));
        const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c)));
      }
      for (; i < half; ++i) {
        const float a = v[i], b = v[i + half], c = cs[2 * i], s = cs[2 * i + 1];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
    }
  }
}

}  // namespace

const KernelTable* Avx2Kernels() {
  static const KernelTable table = [] {
    KernelTable t = ScalarKernels();
    t.isa = Isa::kAvx2;
    t.variant = "avx2";
    t.quantize_activations = QuantizeActivations;
    t.matmul = Matmul;
    t.rms_norm = RmsNorm;
    t.swiglu = SwiGlu;
    t.add = Add;
    t.softmax = Softmax;
    t.dot_f32 = Dot;
    t.rows_times_matrix = RowsTimesMatrixX86<Avx2Vec>;
    t.f32_to_f16 = F32ToF16Row;
    t.f16_to_f32 = F16ToF32Row;
    t.q8_0_rows_to_f16 = Q8_0RowsToF16;
    t.rope = Rope;
    t.score_tiles_f16 = Avx2ScoreTilesF16;
    t.score_tiles_q8 = Avx2ScoreTilesQ8;
    t.score_tiles_q4 = Avx2ScoreTilesQ4;
    t.attention = Avx2Attention;
    return t;
  }();
  return &table;
}

}  // namespace strata::kernels::cpu
