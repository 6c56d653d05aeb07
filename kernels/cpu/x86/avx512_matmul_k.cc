// AVX-512 VNNI matmul for the super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)
// with Q8_K activations.
//
// A group is one 256-value super-block. Codes are unsigned (Q2_K 0..3, Q3_K 0..7 after its
// offset, Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), so vpmaddubsw multiplies them with the
// signed activations into 16-bit pair sums without saturation (at most 2*63*127), and
// vpdpwssd applies the per-sub-block scales in the same step that widens to 32 bits. The
// mins and offsets only need the Q8_K block sums (bsums), one vpmaddwd per (row, token,
// super-block). IQ4_XS's grid values are signed up to 127, so it takes vpdpbusd on the
// grid value + 128 instead, with per-lane float scales.
#include "kernels/cpu/block_math.h"
#include "kernels/cpu/x86/avx512_common.h"
#include "kernels/cpu/x86/x86_matmul_driver.h"

namespace strata::kernels::cpu {
namespace {

struct Idx32w {
  alignas(64) uint16_t w[32];
};

// Word lane i <- word (i / run) * step + first for the scale vectors.
constexpr Idx32w Runs(int run, int first, int step, int count) {
  Idx32w r{};
  for (int i = 0; i < 32; ++i)
    r.w[i] = static_cast<uint16_t>(i / run < count ? first + (i / run) * step : 31);
  return r;
}

STRATA_INLINE __m512i Load(const Idx32w& i) { return _mm512_load_si512(i.w); }

STRATA_INLINE __m512 BroadcastF16(uint16_t h) { return _mm512_set1_ps(_cvtsh_ss(h)); }

// Panel from a Q8_K block: four 64-byte activation vectors in the order of the weight
// codes, the 16 block sums (upper half zero) and the scale broadcast.
STRATA_INLINE void StoreBsumsAndScale(const BlockQ8_K& b, __m512i* out) {
  out[4] = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums)));
  out[5] = _mm512_castps_si512(_mm512_set1_ps(b.d));
}

STRATA_INLINE __m512i Join(const int8_t* lo, const int8_t* hi) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
}

// The eight 6-bit scales and eight mins of a Q4_K / Q5_K super-block as bytes 0..7 and
// 8..15, unpacked with word-wide bit operations on the four words of one vector register
// (scalar words moved into a vector cost a decode step as much as its dot products).
// Reads 16 bytes: the 4 after the 12 scale bytes are the block's own codes, unused.
STRATA_INLINE __m128i Q4KScalesMins(const uint8_t* scales) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));  // u0 u1 u2 -
  const __m128i p = _mm_srlv_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(2, 1, 2, 0)),
                                   _mm_setr_epi32(0, 0, 0, 4));  // u0 u2 u1 u2>>4
  const __m128i q = _mm_srli_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(1, 1, 0, 0)), 2);
  const __m128i lo =
      _mm_and_si128(p, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i hi = _mm_and_si128(q, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(lo, hi);
}

// Q4_K: code vector j holds two sub-blocks (nibbles of qs bytes 64*(j/2) .. +63), so the
// activations are paired the same way: [0..31 | 64..95], [32..63 | 96..127], ... Its scale
// vector is sub-block a's scale in the words of the lower 256 bits and b's in the upper,
// (a, b) = (0, 2), (1, 3), (4, 6), (5, 7): one in-lane byte shuffle of the 16 scale and min
// bytes broadcast to every 128-bit lane, each word's high byte zeroed by index 0x80 (a
// cross-lane word permute of the widened bytes cost a decode step more).
struct Idx64b {
  alignas(64) uint8_t b[64];
};
constexpr Idx64b Q4KScaleShuffle(int a, int b) {
  Idx64b r{};
  for (int i = 0; i < 64; ++i) r.b[i] = i % 2 ? 0x80 : static_cast<uint8_t>(i < 32 ? a : b);
  return r;
}
constexpr Idx64b kQ4KScale[4] = {Q4KScaleShuffle(0, 2), Q4KScaleShuffle(1, 3),
                                 Q4KScaleShuffle(4, 6), Q4KScaleShuffle(5, 7)};
STRATA_INLINE void Q4KScaleVectors(__m128i sm, __m512i* scale) {
  const __m512i all = _mm512_broadcast_i32x4(sm);
  for (int j = 0; j < 4; ++j)
    scale[j] = _mm512_shuffle_epi8(all, _mm512_load_si512(kQ4KScale[j].b));
}

// The min term of the formats with mins (Q4_K, Q5_K, Q2_K), -dmin * sum_s m_s * sum(x of
// sub-block s), is a dot product of at most 16 floats per super-block: the weights'
// -dmin * m_s (W::min_f) against the panel's dx * (the sub-block's activation sum, panel
// vector 4), one multiply-add where integer sums, a conversion and two scalings were.
// `mins` holds m_s in its bytes 0..15 (zero past the format's sub-blocks).
STRATA_INLINE __m512 MinTerms(__m128i mins, uint16_t dmin) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mins)),
                       _mm512_sub_ps(_mm512_setzero_ps(), BroadcastF16(dmin)));
}
// The same for the eight 32-value sub-blocks of Q4_K and Q5_K, on 256-bit registers: a
// 512-bit operation costs two of the halves' on CPUs that split them (Zen 4), and a decode
// step is bound by such operations, not by its loads.
STRATA_INLINE __m512 MinTerms8(__m128i mins, uint16_t dmin) {
  const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins));
  return _mm512_zextps256_ps512(_mm256_mul_ps(m, _mm256_set1_ps(-_cvtsh_ss(dmin))));
}
// Panel vector 4 for MinTerms: dx * each sub-block's activation sum, from 16-value bsums,
// summed in pairs for 32-value sub-blocks (Q4_K, Q5_K) or as they are (Q2_K).
template <bool kPairs>
STRATA_INLINE __m512i SubBlockSums(const BlockQ8_K& b) {
  const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
  __m512 sums;
  if constexpr (kPairs) {
    sums = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, _mm256_set1_epi16(1))));
  } else {
    sums = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(bs));
  }
  return _mm512_castps_si512(_mm512_mul_ps(sums, _mm512_set1_ps(b.d)));
}

// What Q5_K and Q2_K share with Q4_K's layout: the decoded weights (code and scale vectors,
// d, the mins' floats), the paired activation panel and the dot that adds the mins as
// floats. Q4_K itself sums exactly (Q4_KExactTraits) to match its rows-in-lanes kernel.
struct Q4KLayout {
  struct W {
    __m512i code[4], scale[4];
    __m512 d, min_f;  // min_f: MinTerms
  };
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m512i* out) {
    const BlockQ8_K& b = *reinterpret_cast<const BlockQ8_K*>(x);
    out[0] = Join(b.qs, b.qs + 64);
    out[1] = Join(b.qs + 32, b.qs + 96);
    out[2] = Join(b.qs + 128, b.qs + 192);
    out[3] = Join(b.qs + 160, b.qs + 224);
    StoreBsumsAndScale(b, out);
    out[4] = SubBlockSums<true>(b);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    __m512i i =
        _mm512_madd_epi16(_mm512_maddubs_epi16(w.code[0], _mm512_load_si512(x)), w.scale[0]);
    for (int j = 1; j < 4; ++j) {
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(w.code[j], _mm512_load_si512(x + j)),
                              w.scale[j]);
    }
    const __m512 dx = _mm512_castsi512_ps(_mm512_load_si512(x + 5));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(w.d, dx), acc);
    return _mm512_fmadd_ps(w.min_f, _mm512_castsi512_ps(_mm512_load_si512(x + 4)), acc);
  }
};

// Q4_K summed exactly per super-block, for Avx512MatmulQ4_K's rows-in-lanes kernel to match
// bit for bit: the integer dot (sum_s sc_s * (q . x)_s, every lane added) and the mins
// (sum_s m_s * bsum_s) are whole before two scalar multiply-adds, d * dx and -dmin * dx, on
// the (row, token)'s sum in lane 0 (the other lanes stay zero, so the driver's lane sum
// returns it unchanged).
struct Q4_KExactTraits {
  static constexpr int kGroupElems = 256, kBlockElems = 256;
  static constexpr int kGroupBytes = sizeof(BlockQ4_K), kActBlockBytes = sizeof(BlockQ8_K);
  static constexpr int kPanelVecs = 6;
  struct W {
    __m512i code[4], scale[4];
    __m128i mins;   // the 8 mins as words
    __m128 d_dmin;  // d, 0, -dmin, 0
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ4_K& b = *reinterpret_cast<const BlockQ4_K*>(p);
    const __m128i sm = Q4KScalesMins(b.scales);
    Q4KScaleVectors(sm, w.scale);
    w.mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i q0 = _mm512_loadu_si512(b.qs), q1 = _mm512_loadu_si512(b.qs + 64);
    w.code[0] = _mm512_and_si512(q0, m4);
    w.code[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
    w.code[2] = _mm512_and_si512(q1, m4);
    w.code[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
    w.d_dmin = _mm_setr_ps(_cvtsh_ss(b.d), 0.f, -_cvtsh_ss(b.dmin), 0.f);
  }
  // Panel: Q4_K's four activation vectors, then the eight 32-value block sums as words and
  // the block scale.
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m512i* out) {
    const BlockQ8_K& b = *reinterpret_cast<const BlockQ8_K*>(x);
    out[0] = Join(b.qs, b.qs + 64);
    out[1] = Join(b.qs + 32, b.qs + 96);
    out[2] = Join(b.qs + 128, b.qs + 192);
    out[3] = Join(b.qs + 160, b.qs + 224);
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
    // Adjacent pairs: quadword 0 of each 128-bit half holds four 32-value sums.
    const __m256i pairs = _mm256_permute4x64_epi64(_mm256_hadd_epi16(bs, bs), 0x08);
    out[4] = _mm512_zextsi128_si512(_mm256_castsi256_si128(pairs));
    out[5] = _mm512_castps_si512(_mm512_set1_ps(b.d));
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    __m512i i =
        _mm512_madd_epi16(_mm512_maddubs_epi16(w.code[0], _mm512_load_si512(x)), w.scale[0]);
    for (int j = 1; j < 4; ++j) {
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(w.code[j], _mm512_load_si512(x + j)),
                              w.scale[j]);
    }
    // Lanes 0..3 of the dot and of the mins' products, reduced together: I in lane 0, M in
    // lane 2, converted and scaled without leaving the vector registers.
    const __m256i i8 = _mm256_add_epi32(_mm512_castsi512_si256(i), _mm512_extracti64x4_epi64(i, 1));
    const __m128i i4 = _mm_add_epi32(_mm256_castsi256_si128(i8), _mm256_extracti128_si256(i8, 1));
    const __m128i m4 =
        _mm_madd_epi16(w.mins, _mm_load_si128(reinterpret_cast<const __m128i*>(x + 4)));
    const __m128i s = _mm_add_epi32(_mm_unpacklo_epi64(i4, m4), _mm_unpackhi_epi64(i4, m4));
    const __m128 f =
        _mm_cvtepi32_ps(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
    const __m128 dx = _mm512_castps512_ps128(_mm512_castsi512_ps(_mm512_load_si512(x + 5)));
    const __m128 scale = _mm_mul_ps(w.d_dmin, dx);  // lane 0: d * dx, lane 2: -dmin * dx
    __m128 a = _mm_fmadd_ss(f, scale, _mm512_castps512_ps128(acc));
    a = _mm_fmadd_ss(_mm_movehl_ps(f, f), _mm_movehl_ps(scale, scale), a);
    return _mm512_zextps128_ps512(_mm_move_ss(_mm_setzero_ps(), a));  // lanes 1..3 held f's
  }
};

// Q5_K: Q4_K's code vectors plus a fifth bit. Code vector j holds sub-blocks (0, 2), (1, 3),
// (4, 6) or (5, 7) in its halves, and bit s of qh byte l belongs to value l of sub-block s,
// so both halves read the same 32 qh bytes; rotating a dword left by 4 - s (mod 32) brings
// each byte's bit s to position 4 without leaving the byte.
struct Q5_KTraits {
  static constexpr int kGroupElems = 256, kBlockElems = 256;
  static constexpr int kGroupBytes = sizeof(BlockQ5_K), kActBlockBytes = sizeof(BlockQ8_K);
  static constexpr int kPanelVecs = 6;
  using W = Q4KLayout::W;
  STRATA_INLINE static __m512i Rotations(int lo, int hi) {
    return _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
  }
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(p);
    const __m128i sm = Q4KScalesMins(b.scales);
    Q4KScaleVectors(sm, w.scale);
    w.min_f = MinTerms8(_mm_srli_si128(sm, 8), b.dmin);
    const __m512i m4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
    const __m512i q0 = _mm512_loadu_si512(b.qs), q1 = _mm512_loadu_si512(b.qs + 64);
    const __m512i nib[4] = {q0, _mm512_srli_epi16(q0, 4), q1, _mm512_srli_epi16(q1, 4)};
    const __m512i rot[4] = {Rotations(4, 2), Rotations(3, 1), Rotations(0, 30), Rotations(31, 29)};
    for (int j = 0; j < 4; ++j) {
      const __m512i high = _mm512_and_si512(_mm512_rolv_epi32(qh, rot[j]), bit4);
      w.code[j] = _mm512_ternarylogic_epi32(nib[j], high, m4, 0xEC);  // (a & m4) | high
    }
    w.d = BroadcastF16(b.d);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    Q4KLayout::Prep<kTail>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q4KLayout::Dot(w, x, acc);
  }
};

// Q6_K: code vector j is values 64j..64j+63 in order; its four 16-value sub-blocks take
// scales 4j..4j+3, one per run of 8 words.
constexpr Idx32w kQ6KScale[4] = {Runs(8, 0, 1, 4), Runs(8, 4, 1, 4), Runs(8, 8, 1, 4),
                                 Runs(8, 12, 1, 4)};

struct Q6_KTraits {
  static constexpr int kGroupElems = 256, kBlockElems = 256;
  static constexpr int kGroupBytes = sizeof(BlockQ6_K), kActBlockBytes = sizeof(BlockQ8_K);
  static constexpr int kPanelVecs = 6;
  struct W {
    __m512i code[4], scale[4], offset;  // offset: -32 * scales, for the bsums correction
    __m512 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(p);
    const __m512i low4 = _mm512_set1_epi8(0x0f), high2 = _mm512_set1_epi8(0x30);
    // qh bits 2s..2s+1 of each byte move to bits 4..5 by rotating its dword left by 4 - 2s:
    // s = 0 / 1 for the first code vector of a half, s = 2 / 3 for the second.
    const __m512i rot_a = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i rot_b = _mm512_set_epi32(30, 30, 30, 30, 30, 30, 30, 30, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      const __m512i ha = _mm512_and_si512(_mm512_rolv_epi32(qh, rot_a), high2);
      const __m512i hb = _mm512_and_si512(_mm512_rolv_epi32(qh, rot_b), high2);
      // (a & low4) | b: 0xEC is the truth table of that function of (a, b, c).
      w.code[2 * h] = _mm512_ternarylogic_epi32(ql, ha, low4, 0xEC);
      w.code[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), hb, low4, 0xEC);
    }
    const __m512i s16 = _mm512_zextsi256_si512(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))));
    for (int j = 0; j < 4; ++j) w.scale[j] = _mm512_permutexvar_epi16(Load(kQ6KScale[j]), s16);
    w.offset = _mm512_slli_epi16(_mm512_sub_epi16(_mm512_setzero_si512(), s16), 5);
    w.d = BroadcastF16(b.d);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m512i* out) {
    const BlockQ8_K& b = *reinterpret_cast<const BlockQ8_K*>(x);
    for (int j = 0; j < 4; ++j) out[j] = _mm512_loadu_si512(b.qs + 64 * j);
    StoreBsumsAndScale(b, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    __m512i i = _mm512_madd_epi16(w.offset, _mm512_load_si512(x + 4));
    for (int j = 0; j < 4; ++j) {
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(w.code[j], _mm512_load_si512(x + j)),
                              w.scale[j]);
    }
    const __m512 dx = _mm512_castsi512_ps(_mm512_load_si512(x + 5));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(w.d, dx), acc);
  }
};

// Q2_K and Q3_K: code vector j is values 64j..64j+63 in order (the Q6_K panel), i.e. the
// two 32-value chunks c = 2j, 2j+1, each bits 2s..2s+1 of qs bytes 32h..32h+31 for
// c = 4h + s. Both halves read the same 32 qs bytes, shifted by 2s and 2s + 2.
STRATA_INLINE __m512i TwoBitCodes(const uint8_t* qs, int j) {
  const __m512i q = _mm512_broadcast_i64x4(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2))));
  const int lo = 4 * (j % 2) * 0x10001, hi = lo + 2 * 0x10001;  // per word: 2s, 2s + 2
  const __m512i shifts =
      _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
  return _mm512_and_si512(_mm512_srlv_epi16(q, shifts), _mm512_set1_epi8(3));
}

// Q2_K: 4-bit scales and mins per 16-value sub-block, code vector j taking scales 4j..4j+3
// (the Q6_K scale runs); the rest is Q4_K's arithmetic.
struct Q2_KTraits {
  static constexpr int kGroupElems = 256, kBlockElems = 256;
  static constexpr int kGroupBytes = sizeof(BlockQ2_K), kActBlockBytes = sizeof(BlockQ8_K);
  static constexpr int kPanelVecs = 6;
  using W = Q4KLayout::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ2_K& b = *reinterpret_cast<const BlockQ2_K*>(p);
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m512i sc16 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)));
    for (int j = 0; j < 4; ++j) w.scale[j] = _mm512_permutexvar_epi16(Load(kQ6KScale[j]), sc16);
    w.min_f = MinTerms(_mm_and_si128(_mm_srli_epi16(s, 4), m4), b.dmin);
    for (int j = 0; j < 4; ++j) w.code[j] = TwoBitCodes(b.qs, j);
    w.d = BroadcastF16(b.d);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    Q6_KTraits::Prep<kTail>(x, valid, out);
    out[4] = SubBlockSums<false>(*reinterpret_cast<const BlockQ8_K*>(x));
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q4KLayout::Dot(w, x, acc);
  }
};

// Q3_K: Q2_K's two bits plus bit c of the hmask bytes as the third, an unsigned code q + 4
// (0..7); the -4 goes through the bsums with the signed 6-bit scales, as Q6_K's -32 does.
// Rotating a dword left by 2 - c (mod 32) brings each byte's bit c to position 2.
struct Q3_KTraits {
  static constexpr int kGroupElems = 256, kBlockElems = 256;
  static constexpr int kGroupBytes = sizeof(BlockQ3_K), kActBlockBytes = sizeof(BlockQ8_K);
  static constexpr int kPanelVecs = 6;
  using W = Q6_KTraits::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(p);
    const __m512i hm =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask)));
    const __m512i m2 = _mm512_set1_epi8(3), bit2 = _mm512_set1_epi8(4);
    for (int j = 0; j < 4; ++j) {
      const int lo = (2 - 2 * j) & 31, hi = (1 - 2 * j) & 31;
      const __m512i rot =
          _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
      const __m512i high = _mm512_and_si512(_mm512_rolv_epi32(hm, rot), bit2);
      w.code[j] = _mm512_ternarylogic_epi32(TwoBitCodes(b.qs, j), high, m2, 0xEC);
    }
    uint32_t words[4];
    Q3KScaleCodesWords(b.scales, words);
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words));
    const __m512i s16 =
        _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(_mm_sub_epi8(codes, _mm_set1_epi8(32))));
    for (int j = 0; j < 4; ++j) w.scale[j] = _mm512_permutexvar_epi16(Load(kQ6KScale[j]), s16);
    w.offset = _mm512_slli_epi16(_mm512_sub_epi16(_mm512_setzero_si512(), s16), 2);
    w.d = BroadcastF16(b.d);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    Q6_KTraits::Prep<kTail>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q6_KTraits::Dot(w, x, acc);
  }
};

// IQ4_XS: code vectors are the low and high nibbles of qs bytes 0..63 and 64..127, so
// 128-bit chunk k of vector 0 is the first half of sub-block k and of vector 1 its second
// half (sub-blocks 4..7 in vectors 2, 3); the panel holds the activations in that order.
// Codes look up grid value + 128 (vpdpbusd takes unsigned weights); the panel's per-lane
// correction is -128 * the lane's activation sum. Each dword lane stays within one
// sub-block, so the scales apply per lane in float.
struct IQ4_XSTraits {
  static constexpr int kGroupElems = 256, kBlockElems = 256;
  static constexpr int kGroupBytes = sizeof(BlockIQ4_XS), kActBlockBytes = sizeof(BlockQ8_K);
  static constexpr int kPanelVecs = 7;
  struct W {
    __m512i code[4];
    __m512 scale[2];  // d * (ls - 32) of each lane's sub-block: 0..3, then 4..7
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t, W& w) {
    const BlockIQ4_XS& b = *reinterpret_cast<const BlockIQ4_XS*>(p);
    const __m512i grid = _mm512_xor_si512(
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Grid))),
        _mm512_set1_epi8(static_cast<char>(0x80)));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_loadu_si512(b.qs + 64 * h);
      w.code[2 * h] = _mm512_shuffle_epi8(grid, _mm512_and_si512(q, m4));
      w.code[2 * h + 1] = _mm512_shuffle_epi8(grid, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
    }
    alignas(32) float ls[8];
    for (int j = 0; j < 8; ++j) ls[j] = static_cast<float>(IQ4XSScaleCode(b, j) - 32);
    const __m512 s = _mm512_mul_ps(_mm512_castps256_ps512(_mm256_load_ps(ls)), BroadcastF16(b.d));
    const __m512i lane = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2);
    w.scale[0] = _mm512_permutexvar_ps(lane, s);
    w.scale[1] = _mm512_permutexvar_ps(_mm512_add_epi32(lane, _mm512_set1_epi32(4)), s);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t, __m512i* out) {
    const BlockQ8_K& b = *reinterpret_cast<const BlockQ8_K*>(x);
    // Quadwords of two 64-byte loads: [a0 a1 a4 a5 b0 b1 b4 b5] and [a2 a3 a6 a7 b2 b3 b6 b7].
    const __m512i first = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);
    const __m512i second = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
    const __m512i ones = _mm512_set1_epi8(1);
    for (int h = 0; h < 2; ++h) {
      const __m512i a = _mm512_loadu_si512(b.qs + 128 * h),
                    c = _mm512_loadu_si512(b.qs + 128 * h + 64);
      out[2 * h] = _mm512_permutex2var_epi64(a, first, c);
      out[2 * h + 1] = _mm512_permutex2var_epi64(a, second, c);
      const __m512i sums = _mm512_dpbusd_epi32(
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, out[2 * h]), ones, out[2 * h + 1]);
      out[4 + h] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 7));
    }
    out[6] = _mm512_castps_si512(_mm512_set1_ps(b.d));
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    const __m512 dx = _mm512_castsi512_ps(_mm512_load_si512(x + 6));
    for (int h = 0; h < 2; ++h) {
      __m512i i = _mm512_dpbusd_epi32(_mm512_load_si512(x + 4 + h), w.code[2 * h],
                                      _mm512_load_si512(x + 2 * h));
      i = _mm512_dpbusd_epi32(i, w.code[2 * h + 1], _mm512_load_si512(x + 2 * h + 1));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(w.scale[h], dx), acc);
    }
    return acc;
  }
};

}  // namespace

void Avx512MatmulQ4_KValuesInLanes(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q4_KExactTraits, 8, 2, 8>(a, rb, re);
}
int64_t Avx512Q4_KSliceGroups(int64_t n_groups) {
  return SliceGroups(n_groups, Q4_KExactTraits::kPanelVecs * int64_t{sizeof(__m512i)}, 8);
}
void Avx512MatmulQ6_K(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q6_KTraits, 8, 2, 4>(a, rb, re);
}
void Avx512MatmulQ2_K(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q2_KTraits, 8, 2, 4>(a, rb, re);
}
void Avx512MatmulQ3_K(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q3_KTraits, 8, 2, 4>(a, rb, re);
}
void Avx512MatmulQ5_K(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q5_KTraits, 8, 2, 4>(a, rb, re);
}
void Avx512MatmulIQ4_XS(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, IQ4_XSTraits, 8, 2, 4>(a, rb, re);
}

}  // namespace strata::kernels::cpu
