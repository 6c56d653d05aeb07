// AVX-512 VNNI matmul for the 32-value block formats: Q4_0, Q5_0, Q8_0 and IQ4_NL (with
// Q8_0 activations), Q4_1 and Q5_1 (with Q8_1 activations).
//
// A group is 4 blocks (128 values). Weights unpack to two registers: `lo` holds the first
// 16 values of each block (bytes 16b..16b+15 for block b), `hi` the last 16, so one
// vpdpbusd lane (4 bytes) never mixes blocks and lanes 4b..4b+3 carry block b. The panel
// stores the activations in the same order plus, per lane, the block's scale and a
// correction term, so a (row, token, group) costs two vpdpbusd, one convert and two or three
// float ops. vpdpbusd multiplies unsigned by signed bytes: Q4 codes are unsigned (0..15)
// and their -8 offset is folded into the correction (Q5 codes 0..31 and -16 alike); signed
// Q8_0 weights are biased by +128 (xor 0x80) with -128*sum(x) as correction, and IQ4_NL's
// codes look up their grid value plus 128 directly.
#include "kernels/cpu/x86/avx512_common.h"
#include "kernels/cpu/x86/x86_matmul_driver.h"

namespace strata::kernels::cpu {
namespace {

// Byte indices for vpermt2b / word indices for vpermt2w, built at compile time.
struct Idx64 {
  alignas(64) uint8_t b[64];
};
struct Idx32w {
  alignas(64) uint16_t w[32];
};

// Output byte 16b + i <- table byte base + stride * b + i, with block 3 optionally taken
// from the second table (second load starting at `second_off`).
constexpr Idx64 BlockHalves(int stride, int first, int second_off) {
  Idx64 r{};
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < 16; ++i) {
      int src = first + stride * b + i;
      if (src >= 64 && second_off > 0) src = 64 + (src - second_off);
      r.b[16 * b + i] = static_cast<uint8_t>(src);
    }
  }
  return r;
}

// Word lanes 0..15 <- word (stride_w * b + off_a) four times per block; lanes 16..31 <- the
// same with off_b.
constexpr Idx32w BlockWords(int stride_w, int off_a, int off_b) {
  Idx32w r{};
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < 4; ++i) {
      r.w[4 * b + i] = static_cast<uint16_t>(stride_w * b + off_a);
      r.w[16 + 4 * b + i] = static_cast<uint16_t>(stride_w * b + off_b);
    }
  }
  return r;
}

// Byte offsets to indices into a pair of 64-byte loads, the second one starting at byte
// `second_off` (0: no second load).
constexpr int ByteSource(int src, int second_off) {
  return src >= 64 && second_off > 0 ? 64 + (src - second_off) : src;
}

// Word lanes as BlockWords, from byte offsets that may reach into a second load.
constexpr Idx32w BlockWords2(int stride, int off_a, int off_b, int second_off) {
  Idx32w r{};
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < 4; ++i) {
      r.w[4 * b + i] = static_cast<uint16_t>(ByteSource(stride * b + off_a, second_off) / 2);
      r.w[16 + 4 * b + i] = static_cast<uint16_t>(ByteSource(stride * b + off_b, second_off) / 2);
    }
  }
  return r;
}

// Output byte 16b + i <- the byte of block b's qh word that holds bit i of its half at
// `first` (the low 16 bits at qh, the high 16 at qh + 2).
constexpr Idx64 BitBytes(int stride, int first, int second_off) {
  Idx64 r{};
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < 16; ++i) {
      r.b[16 * b + i] = static_cast<uint8_t>(ByteSource(first + stride * b + i / 8, second_off));
    }
  }
  return r;
}

// Q8_0 (34-byte blocks): lo from bytes [0,128) (two loads), hi from [8,136) (two loads).
constexpr Idx64 kQ8_0Lo = BlockHalves(34, 2, 0);
constexpr Idx64 kQ8_0Hi = BlockHalves(34, 18 - 8, 0);
constexpr Idx32w kQ8_0D = BlockWords(17, 0, 0);
// Q8_1 (36-byte blocks): lo from [0,128), hi from [16,144); d and s from [0,128).
constexpr Idx64 kQ8_1Half = BlockHalves(36, 4, 0);
constexpr Idx32w kQ8_1DS = BlockWords(18, 0, 1);
// Q4_0 (18-byte blocks): one load at 0, one at 8 (for block 3's bytes 56..71).
constexpr Idx64 kQ4_0Qs = BlockHalves(18, 2, 8);
constexpr Idx32w kQ4_0D = BlockWords(9, 0, 0);
// Q4_1 (20-byte blocks): one load at 0, one at 16 (block 3's bytes 64..79).
constexpr Idx64 kQ4_1Qs = BlockHalves(20, 4, 16);
constexpr Idx32w kQ4_1DM = BlockWords(10, 0, 1);
// Q5_0 (22-byte blocks): one load at 0, one at 24 (block 3's bytes 64..87).
constexpr Idx64 kQ5_0Qs = BlockHalves(22, 6, 24);
constexpr Idx64 kQ5_0HighLo = BitBytes(22, 2, 24);
constexpr Idx64 kQ5_0HighHi = BitBytes(22, 4, 24);
constexpr Idx32w kQ5_0D = BlockWords2(22, 0, 0, 24);
// Q5_1 (24-byte blocks): one load at 0, one at 32 (block 3's bytes 64..95).
constexpr Idx64 kQ5_1Qs = BlockHalves(24, 8, 32);
constexpr Idx64 kQ5_1HighLo = BitBytes(24, 4, 32);
constexpr Idx64 kQ5_1HighHi = BitBytes(24, 6, 32);
constexpr Idx32w kQ5_1DM = BlockWords2(24, 0, 2, 32);

STRATA_INLINE __m512i Idx(const Idx64& i) { return _mm512_load_si512(i.b); }
STRATA_INLINE __m512i Idx(const Idx32w& i) { return _mm512_load_si512(i.w); }

template <bool kTail>
STRATA_INLINE __m512i Load(const uint8_t* p, int64_t off, int64_t valid) {
  if constexpr (kTail) return LoadBytes(p, off, valid);
  return _mm512_loadu_si512(p + off);
}

// Sum of the 8 activation bytes feeding each dword lane of a lo/hi pair.
STRATA_INLINE __m512i LaneSums(__m512i lo, __m512i hi) {
  const __m512i ones = _mm512_set1_epi8(1);
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, lo), ones, hi);
}

// Panel from Q8_0 activations: lo, hi, dx per lane, and bias * lane sum (int32), where the
// bias undoes the weights' unsigned offset (-8 for Q4_0, -128 for biased Q8_0).
template <bool kTail, int kBiasShift>
STRATA_INLINE void PrepQ8_0(const uint8_t* x, int64_t valid, __m512i* out) {
  const __m512i z0 = Load<kTail>(x, 0, valid), z1 = Load<kTail>(x, 64, valid);
  const __m512i s0 = Load<kTail>(x, 8, valid), s1 = Load<kTail>(x, 72, valid);
  const __m512i lo = _mm512_permutex2var_epi8(z0, Idx(kQ8_0Lo), z1);
  const __m512i hi = _mm512_permutex2var_epi8(s0, Idx(kQ8_0Hi), s1);
  const __m512i d = _mm512_permutex2var_epi16(z0, Idx(kQ8_0D), z1);
  out[0] = lo;
  out[1] = hi;
  out[2] = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(d)));
  out[3] =
      _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(LaneSums(lo, hi), kBiasShift));
}

struct Q4_0Traits {
  static constexpr int kGroupElems = 128, kBlockElems = 32, kBlockBytes = 18;
  static constexpr int kGroupBytes = 4 * kBlockBytes, kActBlockBytes = 34, kPanelVecs = 4;
  struct W {
    __m512i lo, hi;
    __m512 d;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t valid, W& w) {
    const __m512i z0 = Load<kTail>(p, 0, valid), z1 = Load<kTail>(p, 8, valid);
    const __m512i qs = _mm512_permutex2var_epi8(z0, Idx(kQ4_0Qs), z1);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    w.lo = _mm512_and_si512(qs, m4);
    w.hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(Idx(kQ4_0D), z0)));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    PrepQ8_0<kTail, 3>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    __m512i i = _mm512_dpbusd_epi32(_mm512_load_si512(x + 3), w.lo, _mm512_load_si512(x));
    i = _mm512_dpbusd_epi32(i, w.hi, _mm512_load_si512(x + 1));
    const __m512 s = _mm512_mul_ps(w.d, _mm512_castsi512_ps(_mm512_load_si512(x + 2)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc);
  }
};

// Adds 16 to every code whose fifth bit is set; `bits` holds, in byte 16b + i, the qh byte
// with that code's bit at position i % 8.
STRATA_INLINE __m512i AddFifthBits(__m512i codes, __m512i bits) {
  const __mmask64 set = _mm512_test_epi8_mask(bits, _mm512_set1_epi64(0x8040201008040201ll));
  return _mm512_mask_add_epi8(codes, set, codes, _mm512_set1_epi8(16));
}

// The Q5 codes (0..31) of a group from its two loads.
STRATA_INLINE void Q5Codes(__m512i z0, __m512i z1, const Idx64& qs, const Idx64& high_lo,
                           const Idx64& high_hi, __m512i* lo, __m512i* hi) {
  const __m512i q = _mm512_permutex2var_epi8(z0, Idx(qs), z1);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  *lo = AddFifthBits(_mm512_and_si512(q, m4), _mm512_permutex2var_epi8(z0, Idx(high_lo), z1));
  *hi = AddFifthBits(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4),
                     _mm512_permutex2var_epi8(z0, Idx(high_hi), z1));
}

struct Q5_0Traits {
  static constexpr int kGroupElems = 128, kBlockElems = 32, kBlockBytes = 22;
  static constexpr int kGroupBytes = 4 * kBlockBytes, kActBlockBytes = 34, kPanelVecs = 4;
  using W = Q4_0Traits::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t valid, W& w) {
    const __m512i z0 = Load<kTail>(p, 0, valid), z1 = Load<kTail>(p, 24, valid);
    Q5Codes(z0, z1, kQ5_0Qs, kQ5_0HighLo, kQ5_0HighHi, &w.lo, &w.hi);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, Idx(kQ5_0D), z1)));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    PrepQ8_0<kTail, 4>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q4_0Traits::Dot(w, x, acc);
  }
};

// IQ4_NL: Q4_0's layout; each code looks up its grid value + 128 (1..241, unsigned for
// vpdpbusd), and the panel's correction takes the 128 back off, as for biased Q8_0.
struct IQ4_NLTraits {
  static constexpr int kGroupElems = 128, kBlockElems = 32, kBlockBytes = 18;
  static constexpr int kGroupBytes = 4 * kBlockBytes, kActBlockBytes = 34, kPanelVecs = 4;
  using W = Q4_0Traits::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t valid, W& w) {
    Q4_0Traits::Decode<kTail>(p, valid, w);
    const __m512i grid = _mm512_xor_si512(
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Grid))),
        _mm512_set1_epi8(static_cast<char>(0x80)));
    w.lo = _mm512_shuffle_epi8(grid, w.lo);
    w.hi = _mm512_shuffle_epi8(grid, w.hi);
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    PrepQ8_0<kTail, 7>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q4_0Traits::Dot(w, x, acc);
  }
};

struct Q8_0Traits {
  static constexpr int kGroupElems = 128, kBlockElems = 32, kBlockBytes = 34;
  static constexpr int kGroupBytes = 4 * kBlockBytes, kActBlockBytes = 34, kPanelVecs = 4;
  using W = Q4_0Traits::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t valid, W& w) {
    const __m512i z0 = Load<kTail>(p, 0, valid), z1 = Load<kTail>(p, 64, valid);
    const __m512i s0 = Load<kTail>(p, 8, valid), s1 = Load<kTail>(p, 72, valid);
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    w.lo = _mm512_xor_si512(_mm512_permutex2var_epi8(z0, Idx(kQ8_0Lo), z1), bias);
    w.hi = _mm512_xor_si512(_mm512_permutex2var_epi8(s0, Idx(kQ8_0Hi), s1), bias);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, Idx(kQ8_0D), z1)));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    PrepQ8_0<kTail, 7>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q4_0Traits::Dot(w, x, acc);
  }
};

struct Q4_1Traits {
  static constexpr int kGroupElems = 128, kBlockElems = 32, kBlockBytes = 20;
  static constexpr int kGroupBytes = 4 * kBlockBytes, kActBlockBytes = 36, kPanelVecs = 4;
  struct W {
    __m512i lo, hi;
    __m512 d, m;
  };
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t valid, W& w) {
    const __m512i z0 = Load<kTail>(p, 0, valid), z1 = Load<kTail>(p, 16, valid);
    const __m512i qs = _mm512_permutex2var_epi8(z0, Idx(kQ4_1Qs), z1);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    w.lo = _mm512_and_si512(qs, m4);
    w.hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
    const __m512i dm = _mm512_permutexvar_epi16(Idx(kQ4_1DM), z0);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
    w.m = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1));
  }
  // Panel: lo, hi, dx per lane, s/4 per lane (each block's min term m*s spread over its
  // four lanes).
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    const __m512i z0 = Load<kTail>(x, 0, valid), z1 = Load<kTail>(x, 64, valid);
    const __m512i s0 = Load<kTail>(x, 16, valid), s1 = Load<kTail>(x, 80, valid);
    out[0] = _mm512_permutex2var_epi8(z0, Idx(kQ8_1Half), z1);
    out[1] = _mm512_permutex2var_epi8(s0, Idx(kQ8_1Half), s1);
    const __m512i ds = _mm512_permutex2var_epi16(z0, Idx(kQ8_1DS), z1);
    out[2] = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(ds)));
    out[3] = _mm512_castps_si512(
        _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(ds, 1)), _mm512_set1_ps(0.25f)));
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.lo, _mm512_load_si512(x));
    i = _mm512_dpbusd_epi32(i, w.hi, _mm512_load_si512(x + 1));
    const __m512 s = _mm512_mul_ps(w.d, _mm512_castsi512_ps(_mm512_load_si512(x + 2)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc);
    return _mm512_fmadd_ps(w.m, _mm512_castsi512_ps(_mm512_load_si512(x + 3)), acc);
  }
};

struct Q5_1Traits {
  static constexpr int kGroupElems = 128, kBlockElems = 32, kBlockBytes = 24;
  static constexpr int kGroupBytes = 4 * kBlockBytes, kActBlockBytes = 36, kPanelVecs = 4;
  using W = Q4_1Traits::W;
  template <bool kTail>
  STRATA_INLINE static void Decode(const uint8_t* p, int64_t valid, W& w) {
    const __m512i z0 = Load<kTail>(p, 0, valid), z1 = Load<kTail>(p, 32, valid);
    Q5Codes(z0, z1, kQ5_1Qs, kQ5_1HighLo, kQ5_1HighHi, &w.lo, &w.hi);
    const __m512i dm = _mm512_permutex2var_epi16(z0, Idx(kQ5_1DM), z1);
    w.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
    w.m = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1));
  }
  template <bool kTail>
  STRATA_INLINE static void Prep(const uint8_t* x, int64_t valid, __m512i* out) {
    Q4_1Traits::Prep<kTail>(x, valid, out);
  }
  STRATA_INLINE static __m512 Dot(const W& w, const __m512i* x, __m512 acc) {
    return Q4_1Traits::Dot(w, x, acc);
  }
};

}  // namespace

void Avx512MatmulQ4_0(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q4_0Traits, 8, 4, 4>(a, rb, re);
}
void Avx512MatmulQ4_1(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q4_1Traits, 8, 3, 4>(a, rb, re);
}
void Avx512MatmulQ8_0(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q8_0Traits, 8, 4, 4>(a, rb, re);
}
void Avx512MatmulQ5_0(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q5_0Traits, 8, 4, 4>(a, rb, re);
}
void Avx512MatmulQ5_1(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, Q5_1Traits, 8, 3, 4>(a, rb, re);
}
void Avx512MatmulIQ4_NL(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantized<Avx512Vec, IQ4_NLTraits, 8, 4, 4>(a, rb, re);
}

}  // namespace strata::kernels::cpu
