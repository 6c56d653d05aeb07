// AVX2 matmul for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; the
// super-block formats are avx2_matmul_k.cc). A group is two blocks: a register's low 128
// bits hold block 0 and its high 128 bits block 1, first 16 values in `lo`, last 16 in `hi`
// (two unaligned 16-byte loads skip the block headers).
#include "kernels/cpu/block_math.h"
#include "kernels/cpu/x86/avx2_common.h"
#include "kernels/cpu/x86/avx2_internal.h"
#include "kernels/cpu/x86/x86_matmul_driver.h"

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

// Panel from Q8_0 activations: lo, hi, dx, -2^kBiasShift * lane sums (the offset of
// unsigned codes: -8 for Q4_0, -16 for Q5_0; unused by the signed formats).
template <bool kTail, int kBiasShift = 3>
STRATA_INLINE void PrepQ8_0(const uint8_t* x, __m256i* out) {
  const __m256i lo = LoadPair<kTail>(x + 2, x + 36);
  const __m256i hi = LoadPair<kTail>(x + 18, x + 52);
  out[0] = lo;
  out[1] = hi;
  out[2] = _mm256_castps_si256(ScalePair<kTail>(x, x + 34));
  out[3] =
      _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(LaneSums(lo, hi), kBiasShift));
}

// The fifth bits of a Q5 group as 0x10 per byte: byte i of the low half is bit i of h0,
// of the high half bit i of h1 (16 bits each).
STRATA_INLINE __m256i Q5HighBits(uint32_t h0, uint32_t h1) {
  __m256i v =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(h0))),
                              _mm_set1_epi16(static_cast<short>(h1)), 1);
  // Bytes 0..7 of each half take the word's low byte, bytes 8..15 its high byte; then each
  // byte keeps the one bit that is its own.
  v = _mm256_shuffle_epi8(v, _mm256_set_epi64x(0x0101010101010101, 0, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}

// Codes 0..31 of a Q5 group: nibbles of qs (at qs0, qs1), fifth bits from the qh words.
template <bool kTail>
STRATA_INLINE void DecodeQ5Codes(const uint8_t* qs0, const uint8_t* qs1, const uint8_t* qh0,
                                 const uint8_t* qh1, __m256i* lo, __m256i* hi) {
  const __m256i qs = LoadPair<kTail>(qs0, qs1);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  uint32_t h0, h1 = 0;
  std::memcpy(&h0, qh0, 4);
  if constexpr (!kTail) std::memcpy(&h1, qh1, 4);
  *lo = _mm256_or_si256(_mm256_and_si256(qs, m4), Q5HighBits(h0 & 0xffff, h1 & 0xffff));
  *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m4),
                        Q5HighBits(h0 >> 16, h1 >> 16));
}

struct Q4_0Traits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 36;
  static constexpr int kActBlockBytes = 34, kPanelVecs = 4;
  struct W {
    __m256i lo, hi;
    __m256 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const __m256i qs = LoadPair<kTail>(p + 2, p + 20);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    w.lo = _mm256_and_si256(qs, m4);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
    w.d = ScalePair<kTail>(p, p + 18);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
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
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    w.lo = LoadPair<kTail>(p + 2, p + 36);
    w.hi = LoadPair<kTail>(p + 18, p + 52);
    w.d = ScalePair<kTail>(p, p + 34);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_0<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    const __m256i a = DotU8S8(_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(x[0], w.lo));
    const __m256i b = DotU8S8(_mm256_sign_epi8(w.hi, w.hi), _mm256_sign_epi8(x[1], w.hi));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(a, b)),
                           _mm256_mul_ps(w.d, _mm256_castsi256_ps(x[2])), acc);
  }
};

// Q5_0: as Q4_0 with codes 0..31 (pair sums below 2 * 31 * 127) and a -16 offset.
struct Q5_0Traits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 44;
  static constexpr int kActBlockBytes = 34, kPanelVecs = 4;
  using W = Q4_0Traits2::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    DecodeQ5Codes<kTail>(p + 6, p + 28, p + 2, p + 24, &w.lo, &w.hi);
    w.d = ScalePair<kTail>(p, p + 22);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_0<kTail, 4>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    return Q4_0Traits2::Dot(w, x, acc);
  }
};

// IQ4_NL: Q4_0's layout; the codes index the grid through vpshufb, and the signed grid
// values multiply like Q8_0's weights (|w| <= 127).
struct IQ4_NLTraits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 36;
  static constexpr int kActBlockBytes = 34, kPanelVecs = 4;
  using W = Q8_0Traits2::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const __m256i grid =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Grid)));
    const __m256i qs = LoadPair<kTail>(p + 2, p + 20);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    w.lo = _mm256_shuffle_epi8(grid, _mm256_and_si256(qs, m4));
    w.hi = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4));
    w.d = ScalePair<kTail>(p, p + 18);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
    PrepQ8_0<kTail>(x, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    return Q8_0Traits2::Dot(w, x, acc);
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
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const __m256i qs = LoadPair<kTail>(p + 4, p + 24);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    w.lo = _mm256_and_si256(qs, m4);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
    w.d = ScalePair<kTail>(p, p + 20);
    w.m = ScalePair<kTail>(p + 2, p + 22);
  }
  // Panel: lo, hi, dx, s/4 (each block's min term spread over its four lanes).
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m256i* out) {
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

// Q5_1: as Q4_1 with codes 0..31.
struct Q5_1Traits2 {
  static constexpr int kGroupElems = 64, kBlockElems = 32, kGroupBytes = 48;
  static constexpr int kActBlockBytes = 36, kPanelVecs = 4;
  using W = Q4_1Traits2::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    DecodeQ5Codes<kTail>(p + 8, p + 32, p + 4, p + 28, &w.lo, &w.hi);
    w.d = ScalePair<kTail>(p, p + 24);
    w.m = ScalePair<kTail>(p + 2, p + 26);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m256i* out) {
    Q4_1Traits2::Prep<kTail>(x, valid, out);
  }
  STRATA_INLINE static __m256 Dot(const W& w, const __m256i* x, __m256 acc) {
    return Q4_1Traits2::Dot(w, x, acc);
  }
};

}  // namespace

void Avx2MatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
      return MatmulQuantized<Avx2Vec, Q4_0Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ4_1:
      return MatmulQuantized<Avx2Vec, Q4_1Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ5_0:
      return MatmulQuantized<Avx2Vec, Q5_0Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ5_1:
      return MatmulQuantized<Avx2Vec, Q5_1Traits2, 4, 2, 4>(a, rb, re);
    case DType::kQ8_0:
      return MatmulQuantized<Avx2Vec, Q8_0Traits2, 4, 2, 4>(a, rb, re);
    case DType::kIQ4_NL:
      return MatmulQuantized<Avx2Vec, IQ4_NLTraits2, 4, 2, 4>(a, rb, re);
    default:
      return;
  }
}

}  // namespace strata::kernels::cpu
