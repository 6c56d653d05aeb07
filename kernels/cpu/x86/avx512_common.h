// Helpers shared by the AVX-512 kernel files (internal to kernels/cpu/). Only included by
// files compiled with the AVX-512 flags; everything has internal linkage so no AVX-512 code
// can be picked by the linker for a caller in another translation unit.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace strata::kernels::cpu {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

// Horizontal sums of N vectors (N = 1, 2, 4, 8 or 16): lane j of the result is the sum of
// v[j]'s 16 lanes; lanes >= N are unspecified. A transpose-and-add tree costs about three
// instructions per input vector instead of a full reduction each.
template <int N>
STRATA_INLINE __m512 ReduceLanes(const __m512* v) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8 || N == 16);
  if constexpr (N == 1) {
    return _mm512_set1_ps(_mm512_reduce_add_ps(v[0]));
  } else {
    // Level 1: pairs. Per 128-bit chunk [a0+a2, b0+b2, a1+a3, b1+b3].
    __m512 l1[N / 2];
    for (int i = 0; i < N / 2; ++i) {
      const __m512 a = v[2 * i], b = v[2 * i + 1];
      l1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    if constexpr (N == 2) {
      // Per chunk [a, b, a, b] partials: fold the pairs, then the four chunks.
      __m512 t = _mm512_add_ps(l1[0], _mm512_permute_ps(l1[0], 0x4e));  // [a b a b] -> sums
      __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
      __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      return _mm512_castps128_ps512(q);  // lanes 0, 1
    } else {
      // Level 2: per 128-bit chunk [a, b, c, d] partial sums of four vectors.
      __m512 l2[N / 4];
      for (int i = 0; i < N / 4; ++i) {
        const __m512d a = _mm512_castps_pd(l1[2 * i]), b = _mm512_castps_pd(l1[2 * i + 1]);
        l2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
      }
      if constexpr (N == 4) {
        __m256 h = _mm256_add_ps(_mm512_castps512_ps256(l2[0]), _mm512_extractf32x8_ps(l2[0], 1));
        __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        return _mm512_castps128_ps512(q);
      } else {
        // Level 3: chunks [A.c0+A.c1, A.c2+A.c3, B.c0+B.c1, B.c2+B.c3].
        __m512 l3[N / 8];
        for (int i = 0; i < N / 8; ++i) {
          const __m512 a = l2[2 * i], b = l2[2 * i + 1];
          l3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
        }
        if constexpr (N == 8) {
          const __m512 r =
              _mm512_add_ps(_mm512_shuffle_f32x4(l3[0], l3[0], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(l3[0], l3[0], _MM_SHUFFLE(3, 1, 3, 1)));
          return r;  // lanes 0..7
        } else {
          return _mm512_add_ps(_mm512_shuffle_f32x4(l3[0], l3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(l3[0], l3[1], _MM_SHUFFLE(3, 1, 3, 1)));
        }
      }
    }
  }
}

// Mask of the first n (0..64) bytes / (0..16) dwords.
STRATA_INLINE __mmask64 ByteMask(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : n <= 0 ? __mmask64{0} : (__mmask64{1} << n) - 1;
}
STRATA_INLINE __mmask16 LaneMask(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// The AVX-512 registers as the x86 drivers see them (x86_matmul_driver.h,
// x86_rows_times_matrix.h).
struct Avx512Vec {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static constexpr int kRegs = 32;  // vector registers: tile shapes follow them
  STRATA_INLINE static F Zero() { return _mm512_setzero_ps(); }
  template <int N>
  STRATA_INLINE static F Sum(const F* v) {
    return ReduceLanes<N>(v);
  }
  STRATA_INLINE static void StoreSums(float* out, F v) { _mm512_store_ps(out, v); }
  // The first n (clamped to 0..16) lanes of a row, for loops whose last step is partial.
  using Mask = __mmask16;
  STRATA_INLINE static Mask FirstLanes(int64_t n) { return LaneMask(n); }
  STRATA_INLINE static F Load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  STRATA_INLINE static void Store(float* p, Mask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
  STRATA_INLINE static F Broadcast(float x) { return _mm512_set1_ps(x); }
  STRATA_INLINE static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
};

// Bytes [off, off + 64) of a region of `valid` readable bytes, zero beyond it.
STRATA_INLINE __m512i LoadBytes(const uint8_t* base, int64_t off, int64_t valid) {
  if (off + 64 <= valid) return _mm512_loadu_si512(base + off);
  return _mm512_maskz_loadu_epi8(ByteMask(valid - off), base + off);
}

STRATA_INLINE __m512 F16x16ToF32(__m256i h) { return _mm512_cvtph_ps(h); }

}  // namespace
}  // namespace strata::kernels::cpu
