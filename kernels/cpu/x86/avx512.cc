// AVX-512 (F, BW, VL, DQ, VNNI, VBMI) kernel table: matmul per weight format (the
// avx512_matmul_*.cc files), attention (avx512_attention.cc); activation quantization and
// the element-wise ops here.
#include <cmath>
#include <cstring>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/x86/avx512_internal.h"
#include "kernels/cpu/x86/avx512_math.h"
#include "kernels/cpu/x86/x86_rows_times_matrix.h"

namespace strata::kernels::cpu {
namespace {

void Matmul(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
      return Avx512MatmulQ4_0(a, rb, re);
    case DType::kQ4_1:
      return Avx512MatmulQ4_1(a, rb, re);
    case DType::kQ8_0:
      return Avx512MatmulQ8_0(a, rb, re);
    case DType::kQ5_0:
      return Avx512MatmulQ5_0(a, rb, re);
    case DType::kQ5_1:
      return Avx512MatmulQ5_1(a, rb, re);
    case DType::kIQ4_NL:
      return Avx512MatmulIQ4_NL(a, rb, re);
    case DType::kQ2_K:
      return Avx512MatmulQ2_K(a, rb, re);
    case DType::kQ3_K:
      return Avx512MatmulQ3_K(a, rb, re);
    case DType::kQ4_K:
      return Avx512MatmulQ4_K(a, rb, re);
    case DType::kQ5_K:
      return Avx512MatmulQ5_K(a, rb, re);
    case DType::kQ6_K:
      return Avx512MatmulQ6_K(a, rb, re);
    case DType::kIQ4_XS:
      return Avx512MatmulIQ4_XS(a, rb, re);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return Avx512MatmulFloat(a, rb, re);
    default:
      return ScalarKernels().matmul(a, rb, re);
  }
}

// ---- Activation quantization: byte-identical to the scalar reference (same operations:
// amax / 127, 1 / d, round half to even, F16 by round to nearest even). ----

STRATA_INLINE float AbsMax32(const float* x, __m512* v0, __m512* v1) {
  *v0 = _mm512_loadu_ps(x);
  *v1 = _mm512_loadu_ps(x + 16);
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(*v0), _mm512_abs_ps(*v1)));
}

// 32 floats times id, rounded to int8 (|x * id| <= 127 by construction).
STRATA_INLINE __m256i Round32(__m512 v0, __m512 v1, __m512 id) {
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(q0)),
                                 _mm512_cvtsepi32_epi8(q1), 1);
}

STRATA_INLINE uint16_t ToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

void QuantizeActivations(DType weight, const float* x, int64_t n, void* out) {
  const DType at = ActivationType(weight);
  if (at == DType::kQ8_0 || at == DType::kQ8_1) {
    const bool with_sum = at == DType::kQ8_1;
    uint8_t* o = static_cast<uint8_t*>(out);
    const size_t block_bytes = with_sum ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
    for (int64_t b = 0; b < n / kQK; ++b, x += kQK, o += block_bytes) {
      __m512 v0, v1;
      const float d = AbsMax32(x, &v0, &v1) / 127.f;
      const float id = d != 0.f ? 1.f / d : 0.f;
      const __m256i q = Round32(v0, v1, _mm512_set1_ps(id));
      const uint16_t dh = ToHalf(d);
      std::memcpy(o, &dh, 2);
      if (with_sum) {
        const __m512i s16 = _mm512_cvtepi8_epi16(q);
        const int sum = _mm512_reduce_add_epi32(_mm512_madd_epi16(s16, _mm512_set1_epi16(1)));
        const uint16_t sh = ToHalf(_cvtsh_ss(dh) * static_cast<float>(sum));
        std::memcpy(o + 2, &sh, 2);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 4), q);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2), q);
      }
    }
    return;
  }
  if (at == DType::kQ8_K) {
    BlockQ8_K* o = static_cast<BlockQ8_K*>(out);
    for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
      __m512 m = _mm512_setzero_ps();
      for (int i = 0; i < kQK_K; i += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
      const float d = _mm512_reduce_max_ps(m) / 127.f;
      const float id = d != 0.f ? 1.f / d : 0.f;
      const __m512 vid = _mm512_set1_ps(id);
      o[b].d = d;
      for (int g = 0; g < kQK_K / 16; ++g) {
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * g), vid));
        q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o[b].qs + 16 * g), _mm512_cvtepi32_epi8(q));
        o[b].bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
      }
    }
    return;
  }
  ScalarKernels().quantize_activations(weight, x, n, out);
}

// ---- Element-wise ----

void RmsNorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  if (n <= 0) return;
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    s0 = _mm512_fmadd_ps(a, a, s0);
    s1 = _mm512_fmadd_ps(b, b, s1);
  }
  for (; i < n; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(LaneMask(n - i), x + i);
    s0 = _mm512_fmadd_ps(a, a, s0);
  }
  const float ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  const __m512 scale = _mm512_set1_ps(1.f / std::sqrt(ss / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 m = LaneMask(n - i);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
    if (weight != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = LaneMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void Add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = LaneMask(n - i);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

float Softmax(float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), LaneMask(n - i), x + i));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = LaneMask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m)));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float s = _mm512_reduce_add_ps(sum);
  const __m512 inv = _mm512_set1_ps(1.f / s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = LaneMask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
  return _mm512_cvtss_f32(m) + std::log(s);
}

float Dot(const float* a, const float* b, int64_t n) {
  __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 4; ++j) {
      s[j] =
          _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * j), _mm512_loadu_ps(b + i + 16 * j), s[j]);
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 m = LaneMask(n - i);
    s[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s[0]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
}

void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = LaneMask(n - i);
    _mm256_mask_storeu_epi16(dst + i, m,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = LaneMask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

void Q8_0RowsToF16(const uint8_t* first, int64_t stride, int32_t n_rows, int32_t row_values,
                   uint16_t* dst) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(first + r * stride);
    for (int32_t i = 0; i < row_values; i += 32, ++b, dst += 32) {
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
      for (int h = 0; h < 2; ++h) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16 * h));
        const __m512 v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * h),
                            _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
    }
  }
}

void Rope(float* x, int n_heads, int head_dim, int rot_dim, const float* cs, RopeLayout layout) {
  const int half = rot_dim / 2;
  // (c, s) pairs de-interleaved into cos and sin vectors for the NeoX layout.
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    if (layout == RopeLayout::kNormal) {
      for (int i = 0; i < rot_dim; i += 16) {
        const __mmask16 m = LaneMask(rot_dim - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, v + i);
        const __m512 c = _mm512_maskz_loadu_ps(m, cs + i);  // c0 s0 c1 s1 ...
        const __m512 cc = _mm512_moveldup_ps(c), ss = _mm512_movehdup_ps(c);
        const __m512 swapped = _mm512_permute_ps(a, 0xB1);  // b0 a0 b1 a1 ...
        // even lanes a*c - b*s, odd lanes b*c + a*s
        _mm512_mask_storeu_ps(v + i, m, _mm512_fmaddsub_ps(a, cc, _mm512_mul_ps(swapped, ss)));
      }
    } else {
      for (int i = 0; i < half; i += 16) {
        const __mmask16 m = LaneMask(half - i);
        const __mmask16 m0 = LaneMask(2 * (half - i)), m1 = LaneMask(2 * (half - i) - 16);
        const __m512 p0 = _mm512_maskz_loadu_ps(m0, cs + 2 * i);
        const __m512 p1 = _mm512_maskz_loadu_ps(m1, cs + 2 * i + 16);
        const __m512 c = _mm512_permutex2var_ps(p0, even, p1);
        const __m512 s = _mm512_permutex2var_ps(p0, odd, p1);
        const __m512 a = _mm512_maskz_loadu_ps(m, v + i);
        const __m512 b = _mm512_maskz_loadu_ps(m, v + i + half);
        _mm512_mask_storeu_ps(v + i, m, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
        _mm512_mask_storeu_ps(v + i + half, m, _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c)));
      }
    }
  }
}

}  // namespace

const KernelTable* Avx512Kernels() {
  static const KernelTable table = [] {
    KernelTable t = ScalarKernels();
    t.isa = Isa::kAvx512;
    t.variant = "avx512";
    t.quantize_activations = QuantizeActivations;
    t.matmul = Matmul;
    t.matmul_rows16 = Avx512MatmulRows16;
    t.matmul_rows16_types = kAvx512Rows16Types;
    t.rms_norm = RmsNorm;
    t.swiglu = SwiGlu;
    t.add = Add;
    t.softmax = Softmax;
    t.dot_f32 = Dot;
    t.rows_times_matrix = RowsTimesMatrixX86<Avx512Vec>;
    t.f32_to_f16 = F32ToF16;
    t.f16_to_f32 = F16ToF32;
    t.q8_0_rows_to_f16 = Q8_0RowsToF16;
    t.rope = Rope;
    t.score_tiles_f16 = Avx512ScoreTilesF16;
    t.score_tiles_q8 = Avx512ScoreTilesQ8;
    t.score_tiles_q4 = Avx512ScoreTilesQ4;
    t.attention = Avx512Attention;
    return t;
  }();
  return &table;
}

}  // namespace strata::kernels::cpu
