// Helpers shared by the AVX2 kernel files (internal; only included by files compiled with
// -mavx2 -mfma -mf16c). Internal linkage throughout, for the same reason as
// avx512_common.h: no AVX2 code may be shared with a scalar caller through the linker.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace strata::kernels::cpu {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

// Horizontal sums of N (1, 2, 4 or 8) vectors: lane j of the result is the sum of v[j].
template <int N>
STRATA_INLINE __m256 ReduceLanes8(const __m256* v) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8);
  if constexpr (N == 1) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v[0]), _mm256_extractf128_ps(v[0], 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm256_castps128_ps256(s);
  } else {
    // Level 1 per 128-bit half: [a0+a2, b0+b2, a1+a3, b1+b3].
    __m256 l1[N / 2];
    for (int i = 0; i < N / 2; ++i) {
      l1[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                            _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    }
    if constexpr (N == 2) {
      const __m256 t = _mm256_add_ps(l1[0], _mm256_permute_ps(l1[0], 0x4e));
      return _mm256_castps128_ps256(
          _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
    } else {
      // Level 2 per half: [a, b, c, d] partials.
      __m256 l2[N / 4];
      for (int i = 0; i < N / 4; ++i) {
        const __m256d a = _mm256_castps_pd(l1[2 * i]), b = _mm256_castps_pd(l1[2 * i + 1]);
        l2[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                              _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
      }
      if constexpr (N == 4) {
        return _mm256_castps128_ps256(
            _mm_add_ps(_mm256_castps256_ps128(l2[0]), _mm256_extractf128_ps(l2[0], 1)));
      } else {
        return _mm256_add_ps(_mm256_permute2f128_ps(l2[0], l2[1], 0x20),
                             _mm256_permute2f128_ps(l2[0], l2[1], 0x31));
      }
    }
  }
}

// The AVX2 registers as the x86 drivers see them (x86_matmul_driver.h,
// x86_rows_times_matrix.h).
struct Avx2Vec {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static constexpr int kRegs = 16;  // vector registers: tile shapes follow them
  STRATA_INLINE static F Zero() { return _mm256_setzero_ps(); }
  template <int N>
  STRATA_INLINE static F Sum(const F* v) {
    return ReduceLanes8<N>(v);
  }
  STRATA_INLINE static void StoreSums(float* out, F v) { _mm256_store_ps(out, v); }
  // The first n (clamped to 0..8) lanes of a row, for loops whose last step is partial.
  using Mask = __m256i;
  STRATA_INLINE static Mask FirstLanes(int64_t n) {
    const int c = int(n < 0 ? 0 : n > kLanes ? kLanes : n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  STRATA_INLINE static F Load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  STRATA_INLINE static void Store(float* p, Mask m, F v) { _mm256_maskstore_ps(p, m, v); }
  STRATA_INLINE static F Broadcast(float x) { return _mm256_set1_ps(x); }
  STRATA_INLINE static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
};

STRATA_INLINE float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
STRATA_INLINE uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Two 16-byte loads into one register: p0 to the low half, p1 to the high half.
STRATA_INLINE __m256i Load2x128(const uint8_t* p0, const uint8_t* p1) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
}

// [a x4, b x4]
STRATA_INLINE __m256 Halves(float a, float b) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(a)), _mm_set1_ps(b), 1);
}

// Sum of u8 x s8 products per dword lane (pairs summed in 16 bits: callers keep
// 2 * |u| * |s| <= 32767).
STRATA_INLINE __m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// e^x for 8 floats (same range reduction and polynomial as the AVX-512 Exp); 2^n is built
// in the exponent field, with x clamped so n stays a normal exponent and very negative x
// (and -inf) returning exactly 0.
STRATA_INLINE __m256 Exp8(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace
}  // namespace strata::kernels::cpu
