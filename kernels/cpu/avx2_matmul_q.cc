// AVX2 matmul for the quantized formats. A group of the 32-value formats is two blocks: a
// register's low 128 bits hold block 0 and its high 128 bits block 1, first 16 values in
// `lo`, last 16 in `hi` (two unaligned 16-byte loads skip the block headers). The K formats
// use one super-block per group with the decoded codes and scale vectors kept in a small
// stack record (16 registers cannot hold them).
#include "kernels/cpu/avx2_internal.h"
#include "kernels/cpu/avx2_matmul_driver.h"
#include "kernels/cpu/block_math.h"

namespace strata::kernels::cpu {
namespace {

template <bool kTail>
STRATA_INLINE __m256i LoadPair(const uint8_t* p0, const uint8_t* p1) {
  if constexpr (kTail) {
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
  } else {
    return Load2x128(p0, p1);
  }
}

template <bool kTail>
STRATA_INLINE __m256 ScalePair(const uint8_t* p0, const uint8_t* p1, float mul = 1.f) {
  return Halves(HalfToFloat(LoadU16(p0)) * mul, kTail ? 0.f : HalfToFloat(LoadU16(p1)) * mul);
}

// Lane sums of the 8 activation bytes behind each dword of a lo/hi pair.
STRATA_INLINE __m256i LaneSums(__m256i lo, __m256i hi) {
  const __m256i ones = _mm256_set1_epi8(1);
  return _mm256_madd_epi16(
      _mm256_add_epi16(_mm256_maddubs_epi16(ones, lo), _mm256_maddubs_epi16(ones, hi)),
      _mm256_set1_epi16(1));
}

// Panel from Q8_0 activations: lo, hi, dx, -8 * lane sums (for Q4_0's offset).
template <bool kTail>
STRATA_INLINE void PrepQ8_0(const uint8_t* x, __m256i* out) {
  const __m256i lo = LoadPair<kTail>(x + 2, x + 36);
  const __m256i hi = LoadPair<kTail>(x + 18, x + 52);
  out[0] = lo;
  out[1] = hi;
  out[2] = _mm256_castps_si256(ScalePair<kTail>(x, x + 34));
  out[3] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(LaneSums(lo, hi), 3));
}

struct Q4_0Traits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 36;
  static constexpr int kActBlockBytes = 34, kPanelVecs = 4;
  struct W {
    __m256i lo, hi;
    __m256 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, W& w) {
    const __m256i qs = LoadPair<kTail>(p + 2, p + 20);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    w.lo = _mm256_and_si256(qs, m4);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
    w.d = ScalePair<kTail>(p, p + 18);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, __m256i* out) {
    PrepQ8_0<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    // Pair sums stay below 2 * 15 * 127, so both halves add in 16 bits.
    const __m256i p =
        _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, x[0]), _mm256_maddubs_epi16(w.hi, x[1]));
    const __m256i i = _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), x[3]);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[2])),
                           acc);
  }
};

// Signed weights: |w| times x with w's sign (vpsignb), so vpmaddubsw sees u8 x s8 with pair
// sums below 2 * 128 * 127.
struct Q8_0Traits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 68;
  static constexpr int kActBlockBytes = 34, kPanelVecs = 4;
  struct W {
    __m256i lo, hi;
    __m256 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, W& w) {
    w.lo = LoadPair<kTail>(p + 2, p + 36);
    w.hi = LoadPair<kTail>(p + 18, p + 52);
    w.d = ScalePair<kTail>(p, p + 34);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, __m256i* out) {
    PrepQ8_0<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    const __m256i a = DotU8S8(_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(x[0], w.lo));
    const __m256i b = DotU8S8(_mm256_sign_epi8(w.hi, w.hi), _mm256_sign_epi8(x[1], w.hi));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(a, b)),
                           _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[2])), acc);
  }
};

struct Q4_1Traits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 40;
  static constexpr int kActBlockBytes = 36, kPanelVecs = 4;
  struct W {
    __m256i lo, hi;
    __m256 d, m;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, W& w) {
    const __m256i qs = LoadPair<kTail>(p + 4, p + 24);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    w.lo = _mm256_and_si256(qs, m4);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
    w.d = ScalePair<kTail>(p, p + 20);
    w.m = ScalePair<kTail>(p + 2, p + 22);
  }
  // Panel: lo, hi, dx, s/4 (each block's min term spread over its four lanes).
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, __m256i* out) {
    out[0] = LoadPair<kTail>(x + 4, x + 40);
    out[1] = LoadPair<kTail>(x + 20, x + 56);
    out[2] = _mm256_castps_si256(ScalePair<kTail>(x, x + 36));
    out[3] = _mm256_castps_si256(ScalePair<kTail>(x + 2, x + 38, 0.25f));
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    const __m256i p =
        _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, x[0]), _mm256_maddubs_epi16(w.hi, x[1]));
    const __m256i i = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    acc =
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[2])), acc);
    return _mm256_fmadd_ps(w.m, _mm256_castsi256_ps(x[3]), acc);
  }
};

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
  STRATA_INLINE static void Decode(const uint8_t* p, W& w) {
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
  STRATA_INLINE static void Prep(const uint8_t* x, __m256i* out) {
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
  STRATA_INLINE static void Decode(const uint8_t* p, W& w) {
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
  STRATA_INLINE static void Prep(const uint8_t* x, __m256i* out) {
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

}  // namespace

void Avx2MatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
      return MatmulQuantized2<Q4_0Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ4_1:
      return MatmulQuantized2<Q4_1Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ8_0:
      return MatmulQuantized2<Q8_0Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ4_K:
      return MatmulQuantized2<Q4_KTraits2, 4, 2, 4>(a, rb, re);
    case DType::kQ6_K:
      return MatmulQuantized2<Q6_KTraits2, 4, 2, 4>(a, rb, re);
    default:
      return;
  }
}

}  // namespace strata::kernels::cpu
