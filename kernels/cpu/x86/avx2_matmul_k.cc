// AVX2 matmul for the super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) with Q8_K
// activations. A group is one super-block; its decoded code vectors (32 values each, in the
// order the panel holds the activations) and scale vectors are kept in a small stack record,
// since 16 registers cannot hold them. Unsigned codes go through vpmaddubsw into 16-bit pair
// sums and vpmaddwd applies the sub-block scales; offsets and mins use the Q8_K block sums.
#include "kernels/cpu/block_math.h"
#include "kernels/cpu/x86/avx2_common.h"
#include "kernels/cpu/x86/avx2_internal.h"
#include "kernels/cpu/x86/x86_matmul_driver.h"

namespace strata::kernels::cpu {
namespace {

// Panel of a Q8_K block: the 256 activations in order (8 registers), the 16 block sums, the
// scale broadcast.
template <bool kTail>
STRATA_INLINE void PrepQ8_K(const uint8_t* x, __m256i* out) {
  const BlockQ8_K& b = *reinterpret_cast<const BlockQ8_K*>(x);
  for (int j = 0; j < 8; ++j)
    out[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * j));
  out[8] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
  out[9] = _mm256_castps_si256(_mm256_set1_ps(b.d));
}

// Q4_K: code vector j (32 values, sub-block j) is the low (even j) or high (odd j) nibbles of
// qs bytes 32*(j/2) .. +31; its scale multiplies the 16-bit pair sums through vpmaddwd.
struct Q4_KTraits2 {
  static constexpr int kGroupElems = 256, kBlockElems = 256, kGroupBytes = sizeof(BlockQ4_K);
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kPanelVecs = 10;
  struct W {
    __m256i code[8];
    __m256i scale[8];
    __m256i mins;  // m_j for bsums 2j and 2j+1
    __m256 d, neg_dmin;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ4_K& b = *reinterpret_cast<const BlockQ4_K*>(p);
    uint8_t sc[8], mn[8];
    Q4KScalesMins(b.scales, sc, mn);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      w.code[2 * c] = _mm256_and_si256(q, m4);
      w.code[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    for (int j = 0; j < 8; ++j) w.scale[j] = _mm256_set1_epi16(sc[j]);
    w.mins = _mm256_setr_epi16(mn[0], mn[0], mn[1], mn[1], mn[2], mn[2], mn[3], mn[3], mn[4], mn[4],
                               mn[5], mn[5], mn[6], mn[6], mn[7], mn[7]);
    w.d = _mm256_set1_ps(HalfToFloat(b.d));
    w.neg_dmin = _mm256_set1_ps(-HalfToFloat(b.dmin));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_K<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    __m256i i = _mm256_madd_epi16(_mm256_maddubs_epi16(w.code[0], x[0]), w.scale[0]);
    for (int j = 1; j < 8; ++j) {
      i = _mm256_add_epi32(i, _mm256_madd_epi16(_mm256_maddubs_epi16(w.code[j], x[j]), w.scale[j]));
    }
    const __m256i mins = _mm256_madd_epi16(w.mins, x[8]);
    const __m256 dx = _mm256_castsi256_ps(x[9]);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, dx), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(w.neg_dmin, dx), acc);
  }
};

// Q6_K: code vector j is values 32j..32j+31 in order, covering 16-value sub-blocks 2j and
// 2j+1; the -32 offset is applied through the block sums.
struct Q6_KTraits2 {
  static constexpr int kGroupElems = 256, kBlockElems = 256, kGroupBytes = sizeof(BlockQ6_K);
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kPanelVecs = 10;
  struct W {
    __m256i code[8];
    __m256i scale[8];
    __m256i offset;  // -32 * scale_j for bsum j
    __m256 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(p);
    const __m256i low4 = _mm256_set1_epi8(0x0f), high2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      // qh bits 2s..2s+1 of each byte land in bits 4..5 (16-bit shifts; the mask drops
      // what crossed a byte boundary).
      w.code[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), high2));
      w.code[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), high2));
      w.code[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                          _mm256_and_si256(qh, high2));
      w.code[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), high2));
    }
    for (int j = 0; j < 8; ++j) {
      const __m128i lo = _mm_set1_epi16(b.scales[2 * j]), hi = _mm_set1_epi16(b.scales[2 * j + 1]);
      w.scale[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    }
    const __m256i s16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    w.offset = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), s16), 5);
    w.d = _mm256_set1_ps(HalfToFloat(b.d));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_K<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    __m256i i = _mm256_madd_epi16(w.offset, x[8]);
    for (int j = 0; j < 8; ++j) {
      i = _mm256_add_epi32(i, _mm256_madd_epi16(_mm256_maddubs_epi16(w.code[j], x[j]), w.scale[j]));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[9])),
                           acc);
  }
};

// [a x8 words | b x8 words]: the scales of two 16-value sub-blocks of a code vector.
STRATA_INLINE __m256i WordHalves(int a, int b) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(a))),
                                 _mm_set1_epi16(static_cast<short>(b)), 1);
}

// Bit `from` of every byte moved to bit `to` (the rest of the byte is garbage): 16-bit
// shifts, which only move bits within their byte for the distances used here.
template <int kFrom, int kTo>
STRATA_INLINE __m256i MoveBit(__m256i v) {
  if constexpr (kTo >= kFrom)
    return _mm256_slli_epi16(v, kTo - kFrom);
  else
    return _mm256_srli_epi16(v, kFrom - kTo);
}

// Q2_K: code vector c (values 32c..32c+31) is bits 2s..2s+1 of qs bytes 32h..32h+31 for
// c = 4h + s; it covers sub-blocks 2c and 2c+1. Codes 0..3, then Q4_K's arithmetic (the
// scale vectors change every 16 values instead of 32, the mins per 16-value block sum).
struct Q2_KTraits2 {
  static constexpr int kGroupElems = 256, kBlockElems = 256, kGroupBytes = sizeof(BlockQ2_K);
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kPanelVecs = 10;
  using W = Q4_KTraits2::W;  // mins: the 4-bit min of bsum j's sub-block
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ2_K& b = *reinterpret_cast<const BlockQ2_K*>(p);
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
      w.code[4 * h + 0] = _mm256_and_si256(q, m2);
      w.code[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m2);
      w.code[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m2);
      w.code[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m2);
    }
    for (int c = 0; c < 8; ++c)
      w.scale[c] = WordHalves(b.scales[2 * c] & 0xF, b.scales[2 * c + 1] & 0xF);
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    w.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f)));
    w.d = _mm256_set1_ps(HalfToFloat(b.d));
    w.neg_dmin = _mm256_set1_ps(-HalfToFloat(b.dmin));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_K<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    return Q4_KTraits2::Dot(w, x, acc);
  }
};

// Q3_K: Q2_K's two low bits plus bit c of hmask as the third, an unsigned code u = q + 4
// (0..7); the -4 goes through the block sums, and the 6-bit scales are signed.
struct Q3_KTraits2 {
  static constexpr int kGroupElems = 256, kBlockElems = 256, kGroupBytes = sizeof(BlockQ3_K);
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kPanelVecs = 10;
  struct W {
    __m256i code[8];
    __m256i scale[8];
    __m256i offset;  // -4 * scale_j for bsum j
    __m256 d;
  };
  template <int c>
  STRATA_INLINE static __m256i Code(__m256i q, __m256i hm) {
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), _mm256_set1_epi8(3));
    return _mm256_or_si256(low, _mm256_and_si256(MoveBit<c, 2>(hm), _mm256_set1_epi8(4)));
  }
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(p);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
    const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32));
    w.code[0] = Code<0>(q0, hm);
    w.code[1] = Code<1>(q0, hm);
    w.code[2] = Code<2>(q0, hm);
    w.code[3] = Code<3>(q0, hm);
    w.code[4] = Code<4>(q1, hm);
    w.code[5] = Code<5>(q1, hm);
    w.code[6] = Code<6>(q1, hm);
    w.code[7] = Code<7>(q1, hm);
    uint32_t words[4];
    Q3KScaleCodesWords(b.scales, words);
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words));
    alignas(16) int8_t sc[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), _mm_sub_epi8(codes, _mm_set1_epi8(32)));
    for (int c = 0; c < 8; ++c) w.scale[c] = WordHalves(sc[2 * c], sc[2 * c + 1]);
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)));
    w.offset = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), s16), 2);
    w.d = _mm256_set1_ps(HalfToFloat(b.d));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_K<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    __m256i i = _mm256_madd_epi16(w.offset, x[8]);
    for (int c = 0; c < 8; ++c) {
      i = _mm256_add_epi32(i, _mm256_madd_epi16(_mm256_maddubs_epi16(w.code[c], x[c]), w.scale[c]));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[9])),
                           acc);
  }
};

// Q5_K: Q4_K's code vectors with bit j of qh as the fifth bit of sub-block j (codes 0..31,
// pair sums below 2 * 31 * 127).
struct Q5_KTraits2 {
  static constexpr int kGroupElems = 256, kBlockElems = 256, kGroupBytes = sizeof(BlockQ5_K);
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kPanelVecs = 10;
  using W = Q4_KTraits2::W;
  template <int j>
  STRATA_INLINE static __m256i High(__m256i qh) {
    return _mm256_and_si256(MoveBit<j, 4>(qh), _mm256_set1_epi8(0x10));
  }
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(p);
    uint8_t sc[8], mn[8];
    Q4KScalesMins(b.scales, sc, mn);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    const __m256i high[8] = {High<0>(qh), High<1>(qh), High<2>(qh), High<3>(qh),
                             High<4>(qh), High<5>(qh), High<6>(qh), High<7>(qh)};
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      w.code[2 * c] = _mm256_or_si256(_mm256_and_si256(q, m4), high[2 * c]);
      w.code[2 * c + 1] =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), high[2 * c + 1]);
    }
    for (int j = 0; j < 8; ++j) w.scale[j] = _mm256_set1_epi16(sc[j]);
    w.mins = _mm256_setr_epi16(mn[0], mn[0], mn[1], mn[1], mn[2], mn[2], mn[3], mn[3], mn[4], mn[4],
                               mn[5], mn[5], mn[6], mn[6], mn[7], mn[7]);
    w.d = _mm256_set1_ps(HalfToFloat(b.d));
    w.neg_dmin = _mm256_set1_ps(-HalfToFloat(b.dmin));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_K<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    return Q4_KTraits2::Dot(w, x, acc);
  }
};

// IQ4_XS: code vector j is sub-block j (low nibbles of qs[16j..16j+15], then their high
// nibbles), looked up in the grid with vpshufb. The grid is signed, so the products go
// through |w| and x with w's sign (as Q8_0; pair sums below 2 * 127 * 127).
struct IQ4_XSTraits2 {
  static constexpr int kGroupElems = 256, kBlockElems = 256, kGroupBytes = sizeof(BlockIQ4_XS);
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kPanelVecs = 10;
  struct W {
    __m256i value[8];  // grid values (sign source)
    __m256i abs[8];    // their magnitudes
    __m256i scale[8];  // ls - 32 of sub-block j in every word
    __m256 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockIQ4_XS& b = *reinterpret_cast<const BlockIQ4_XS*>(p);
    const __m256i grid =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Grid)));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int j = 0; j < 8; ++j) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * j));
      const __m256i codes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(q, m4)),
                                                    _mm_and_si128(_mm_srli_epi16(q, 4), m4), 1);
      w.value[j] = _mm256_shuffle_epi8(grid, codes);
      w.abs[j] = _mm256_abs_epi8(w.value[j]);
      w.scale[j] = _mm256_set1_epi16(static_cast<short>(IQ4XSScaleCode(b, j) - 32));
    }
    w.d = _mm256_set1_ps(HalfToFloat(b.d));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_K<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    __m256i i = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i p = _mm256_maddubs_epi16(w.abs[j], _mm256_sign_epi8(x[j], w.value[j]));
      i = _mm256_add_epi32(i, _mm256_madd_epi16(p, w.scale[j]));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[9])),
                           acc);
  }
};

}  // namespace

void Avx2MatmulSuperBlocks(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ2_K:
      return MatmulQuantized<Avx2Vec, Q2_KTraits2, 4, 2, 4>(a, rb, re);
    case DType::kQ3_K:
      return MatmulQuantized<Avx2Vec, Q3_KTraits2, 4, 2, 4>(a, rb, re);
    case DType::kQ4_K:
      return MatmulQuantized<Avx2Vec, Q4_KTraits2, 4, 2, 4>(a, rb, re);
    case DType::kQ5_K:
      return MatmulQuantized<Avx2Vec, Q5_KTraits2, 4, 2, 4>(a, rb, re);
    case DType::kQ6_K:
      return MatmulQuantized<Avx2Vec, Q6_KTraits2, 4, 2, 4>(a, rb, re);
    case DType::kIQ4_XS:
      return MatmulQuantized<Avx2Vec, IQ4_XSTraits2, 4, 2, 4>(a, rb, re);
    default:
      return;
  }
}

}  // namespace strata::kernels::cpu
