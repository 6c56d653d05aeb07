// The NEON matmul, written once over a dot-product policy (internal; included by
// neon_matmul.cc with widening multiplies, every Armv8 CPU, and by neon_matmul_dotprod.cc
// with SDOT, Armv8.2+dotprod).
//
// Blocks are processed in their GGUF layout, no panel: a register tile of R rows x T tokens
// keeps one int32x4 or float32x4 accumulator per pair; per 32-value block the weight codes
// are widened to signed bytes once per row and dotted with each token's bytes (Policy::Dot
// adds the 16 products of two int8x16 to an int32x4, four per lane).
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/block_math.h"
#include "kernels/kernels.h"

namespace strata::kernels::cpu {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

STRATA_INLINE float H2F(uint16_t h) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

template <class P>
struct Q4_0N {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kActBlockBytes = 34;
  struct W {
    int8x16_t lo, hi;
    float d;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const uint8x16_t qs = vld1q_u8(p + 2);
    const int8x16_t eight = vdupq_n_s8(8);
    w.lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(qs, vdupq_n_u8(0x0f))), eight);
    w.hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(qs, 4)), eight);
    w.d = H2F(LoadU16(p));
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* x) {
    int32x4_t i = P::Dot(vdupq_n_s32(0), w.lo, vld1q_s8(reinterpret_cast<const int8_t*>(x + 2)));
    i = P::Dot(i, w.hi, vld1q_s8(reinterpret_cast<const int8_t*>(x + 18)));
    return w.d * H2F(LoadU16(x)) * static_cast<float>(vaddvq_s32(i));
  }
  static STRATA_INLINE uint16_t LoadU16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
};

template <class P>
struct Q4_1N {
  static constexpr int kBlockElems = 32, kBlockBytes = 20, kActBlockBytes = 36;
  struct W {
    int8x16_t lo, hi;
    float d, m;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const uint8x16_t qs = vld1q_u8(p + 4);
    w.lo = vreinterpretq_s8_u8(vandq_u8(qs, vdupq_n_u8(0x0f)));
    w.hi = vreinterpretq_s8_u8(vshrq_n_u8(qs, 4));
    w.d = H2F(Q4_0N<P>::LoadU16(p));
    w.m = H2F(Q4_0N<P>::LoadU16(p + 2));
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* x) {
    int32x4_t i = P::Dot(vdupq_n_s32(0), w.lo, vld1q_s8(reinterpret_cast<const int8_t*>(x + 4)));
    i = P::Dot(i, w.hi, vld1q_s8(reinterpret_cast<const int8_t*>(x + 20)));
    return w.d * H2F(Q4_0N<P>::LoadU16(x)) * static_cast<float>(vaddvq_s32(i)) +
           w.m * H2F(Q4_0N<P>::LoadU16(x + 2));
  }
};

// 0x10 in every byte whose bit is set among 16 bits (low byte for bytes 0..7): Q5's fifth bits.
STRATA_INLINE uint8x16_t FifthBits(uint16_t bits) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t v = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)),
                                   vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  return vandq_u8(vtstq_u8(v, vld1q_u8(kBit)), vdupq_n_u8(0x10));
}

// Q5 codes 0..31 of one block (qs at `qs`, the little-endian qh word at `qh`).
STRATA_INLINE void Q5CodeVectors(const uint8_t* qs, const uint8_t* qh, uint8x16_t* lo,
                                 uint8x16_t* hi) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  const uint8x16_t q = vld1q_u8(qs);
  *lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), FifthBits(static_cast<uint16_t>(h)));
  *hi = vorrq_u8(vshrq_n_u8(q, 4), FifthBits(static_cast<uint16_t>(h >> 16)));
}

// Q5_0: codes minus 16 are signed bytes; otherwise Q4_0.
template <class P>
struct Q5_0N {
  static constexpr int kBlockElems = 32, kBlockBytes = 22, kActBlockBytes = 34;
  using W = typename Q4_0N<P>::W;
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    uint8x16_t lo, hi;
    Q5CodeVectors(p + 6, p + 2, &lo, &hi);
    const int8x16_t sixteen = vdupq_n_s8(16);
    w.lo = vsubq_s8(vreinterpretq_s8_u8(lo), sixteen);
    w.hi = vsubq_s8(vreinterpretq_s8_u8(hi), sixteen);
    w.d = H2F(Q4_0N<P>::LoadU16(p));
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* x) { return Q4_0N<P>::Dot(w, x); }
};

// IQ4_NL: Q4_0's layout with the codes looked up in the (signed) grid.
template <class P>
struct IQ4_NLN {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kActBlockBytes = 34;
  using W = typename Q4_0N<P>::W;
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const int8x16_t grid = vld1q_s8(kIQ4Grid);
    const uint8x16_t qs = vld1q_u8(p + 2);
    w.lo = vqtbl1q_s8(grid, vandq_u8(qs, vdupq_n_u8(0x0f)));
    w.hi = vqtbl1q_s8(grid, vshrq_n_u8(qs, 4));
    w.d = H2F(Q4_0N<P>::LoadU16(p));
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* x) { return Q4_0N<P>::Dot(w, x); }
};

template <class P>
struct Q8_0N {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kActBlockBytes = 34;
  struct W {
    int8x16_t lo, hi;
    float d;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    w.lo = vld1q_s8(reinterpret_cast<const int8_t*>(p + 2));
    w.hi = vld1q_s8(reinterpret_cast<const int8_t*>(p + 18));
    w.d = H2F(Q4_0N<P>::LoadU16(p));
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* x) {
    int32x4_t i = P::Dot(vdupq_n_s32(0), w.lo, vld1q_s8(reinterpret_cast<const int8_t*>(x + 2)));
    i = P::Dot(i, w.hi, vld1q_s8(reinterpret_cast<const int8_t*>(x + 18)));
    return w.d * H2F(Q4_0N<P>::LoadU16(x)) * static_cast<float>(vaddvq_s32(i));
  }
};

// Q5_1: codes 0..31 (signed bytes too); otherwise Q4_1.
template <class P>
struct Q5_1N {
  static constexpr int kBlockElems = 32, kBlockBytes = 24, kActBlockBytes = 36;
  using W = typename Q4_1N<P>::W;
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    uint8x16_t lo, hi;
    Q5CodeVectors(p + 8, p + 4, &lo, &hi);
    w.lo = vreinterpretq_s8_u8(lo);
    w.hi = vreinterpretq_s8_u8(hi);
    w.d = H2F(Q4_0N<P>::LoadU16(p));
    w.m = H2F(Q4_0N<P>::LoadU16(p + 2));
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* x) { return Q4_1N<P>::Dot(w, x); }
};

// Q4_K: per 32-value sub-block an integer dot (codes 0..15 fit signed bytes), scaled by its
// 6-bit scale into an int32x4; the mins term uses the activation block sums.
template <class P>
struct Q4_KN {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockQ4_K),
                       kActBlockBytes = sizeof(BlockQ8_K);
  struct W {
    int8x16_t code[16];  // sub-block j: code[2j], code[2j+1]
    uint8_t sc[8], mn[8];
    float d, dmin;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const BlockQ4_K& b = *reinterpret_cast<const BlockQ4_K*>(p);
    Q4KScalesMins(b.scales, w.sc, w.mn);
    for (int c = 0; c < 4; ++c) {
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t q = vld1q_u8(b.qs + 32 * c + 16 * h);
        w.code[4 * c + h] = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
        w.code[4 * c + 2 + h] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
      }
    }
    w.d = H2F(b.d);
    w.dmin = H2F(b.dmin);
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* xp) {
    const BlockQ8_K& x = *reinterpret_cast<const BlockQ8_K*>(xp);
    int32x4_t acc = vdupq_n_s32(0);
    for (int j = 0; j < 8; ++j) {
      int32x4_t s = P::Dot(vdupq_n_s32(0), w.code[2 * j], vld1q_s8(x.qs + 32 * j));
      s = P::Dot(s, w.code[2 * j + 1], vld1q_s8(x.qs + 32 * j + 16));
      acc = vmlaq_n_s32(acc, s, w.sc[j]);
    }
    int msum = 0;
    for (int j = 0; j < 8; ++j) msum += w.mn[j] * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
    return x.d * (w.d * static_cast<float>(vaddvq_s32(acc)) - w.dmin * static_cast<float>(msum));
  }
};

// Q5_K: Q4_K's codes plus bit j of qh byte l as the fifth bit of value l of sub-block j.
template <class P>
struct Q5_KN {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockQ5_K),
                       kActBlockBytes = sizeof(BlockQ8_K);
  using W = typename Q4_KN<P>::W;
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(p);
    Q4KScalesMins(b.scales, w.sc, w.mn);
    const uint8x16_t qh[2] = {vld1q_u8(b.qh), vld1q_u8(b.qh + 16)};
    const uint8x16_t bit4 = vdupq_n_u8(0x10);
    for (int c = 0; c < 4; ++c) {
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t q = vld1q_u8(b.qs + 32 * c + 16 * h);
        // Sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles), values 16h..16h+15.
        const uint8x16_t h0 = vandq_u8(vtstq_u8(qh[h], vdupq_n_u8(uint8_t(1u << (2 * c)))), bit4);
        const uint8x16_t h1 =
            vandq_u8(vtstq_u8(qh[h], vdupq_n_u8(uint8_t(1u << (2 * c + 1)))), bit4);
        w.code[4 * c + h] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), h0));
        w.code[4 * c + 2 + h] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), h1));
      }
    }
    w.d = H2F(b.d);
    w.dmin = H2F(b.dmin);
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* xp) { return Q4_KN<P>::Dot(w, xp); }
};

// Q2_K and Q3_K: the two low bits of the 16 values of sub-block j (values 16j..16j+15),
// bits 2s..2s+1 of qs bytes 32h + 16*(j%2) .. +15 for j/2 = 4h + s.
STRATA_INLINE void TwoBitCodes(const uint8_t* qs, uint8x16_t code[16]) {
  const uint8x16_t m2 = vdupq_n_u8(3);
  for (int h = 0; h < 2; ++h) {
    for (int half = 0; half < 2; ++half) {
      const uint8x16_t q = vld1q_u8(qs + 32 * h + 16 * half);
      code[8 * h + 0 + half] = vandq_u8(q, m2);
      code[8 * h + 2 + half] = vandq_u8(vshrq_n_u8(q, 2), m2);
      code[8 * h + 4 + half] = vandq_u8(vshrq_n_u8(q, 4), m2);
      code[8 * h + 6 + half] = vshrq_n_u8(q, 6);
    }
  }
}

// Q2_K: codes 0..3 with a 4-bit scale and min per 16 values; the mins use the block sums.
template <class P>
struct Q2_KN {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockQ2_K),
                       kActBlockBytes = sizeof(BlockQ8_K);
  struct W {
    int8x16_t code[16];  // values 16j..16j+15
    uint8_t sc[16], mn[16];
    float d, dmin;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const BlockQ2_K& b = *reinterpret_cast<const BlockQ2_K*>(p);
    uint8x16_t code[16];
    TwoBitCodes(b.qs, code);
    for (int j = 0; j < 16; ++j) w.code[j] = vreinterpretq_s8_u8(code[j]);
    const uint8x16_t s = vld1q_u8(b.scales);
    vst1q_u8(w.sc, vandq_u8(s, vdupq_n_u8(0x0f)));
    vst1q_u8(w.mn, vshrq_n_u8(s, 4));
    w.d = H2F(b.d);
    w.dmin = H2F(b.dmin);
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* xp) {
    const BlockQ8_K& x = *reinterpret_cast<const BlockQ8_K*>(xp);
    int32x4_t acc = vdupq_n_s32(0);
    for (int j = 0; j < 16; ++j) {
      acc = vmlaq_n_s32(acc, P::Dot(vdupq_n_s32(0), w.code[j], vld1q_s8(x.qs + 16 * j)), w.sc[j]);
    }
    int msum = 0;
    for (int j = 0; j < 16; ++j) msum += w.mn[j] * x.bsums[j];
    return x.d * (w.d * static_cast<float>(vaddvq_s32(acc)) - w.dmin * static_cast<float>(msum));
  }
};

// Q3_K: Q2_K's two bits plus the hmask bit (bit j/2 of hmask bytes 16*(j%2) .. +15 for
// sub-block j), minus 4 as signed bytes; signed 6-bit scales per 16 values.
template <class P>
struct Q3_KN {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockQ3_K),
                       kActBlockBytes = sizeof(BlockQ8_K);
  struct W {
    int8x16_t code[16];  // values 16j..16j+15
    int8_t sc[16];
    float d;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(p);
    uint8x16_t code[16];
    TwoBitCodes(b.qs, code);
    const uint8x16_t hm[2] = {vld1q_u8(b.hmask), vld1q_u8(b.hmask + 16)};
    const int8x16_t four = vdupq_n_s8(4);
    for (int j = 0; j < 16; ++j) {
      const uint8x16_t high =
          vandq_u8(vtstq_u8(hm[j % 2], vdupq_n_u8(uint8_t(1u << (j / 2)))), vdupq_n_u8(4));
      w.code[j] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(code[j], high)), four);
    }
    uint32_t words[4];
    Q3KScaleCodesWords(b.scales, words);
    vst1q_s8(w.sc, vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(words)), vdupq_n_s8(32)));
    w.d = H2F(b.d);
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* xp) {
    const BlockQ8_K& x = *reinterpret_cast<const BlockQ8_K*>(xp);
    int32x4_t acc = vdupq_n_s32(0);
    for (int j = 0; j < 16; ++j) {
      acc = vmlaq_n_s32(acc, P::Dot(vdupq_n_s32(0), w.code[j], vld1q_s8(x.qs + 16 * j)), w.sc[j]);
    }
    return x.d * w.d * static_cast<float>(vaddvq_s32(acc));
  }
};

// IQ4_XS: sub-block j is the low then the high nibbles of qs[16j..16j+15], looked up in
// the signed grid; one signed 6-bit scale per 32 values.
template <class P>
struct IQ4_XSN {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockIQ4_XS),
                       kActBlockBytes = sizeof(BlockQ8_K);
  struct W {
    int8x16_t code[16];  // values 16i..16i+15
    int sc[8];
    float d;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const BlockIQ4_XS& b = *reinterpret_cast<const BlockIQ4_XS*>(p);
    const int8x16_t grid = vld1q_s8(kIQ4Grid);
    for (int j = 0; j < 8; ++j) {
      const uint8x16_t q = vld1q_u8(b.qs + 16 * j);
      w.code[2 * j] = vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(0x0f)));
      w.code[2 * j + 1] = vqtbl1q_s8(grid, vshrq_n_u8(q, 4));
      w.sc[j] = IQ4XSScaleCode(b, j) - 32;
    }
    w.d = H2F(b.d);
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* xp) {
    const BlockQ8_K& x = *reinterpret_cast<const BlockQ8_K*>(xp);
    int32x4_t acc = vdupq_n_s32(0);
    for (int j = 0; j < 8; ++j) {
      int32x4_t s = P::Dot(vdupq_n_s32(0), w.code[2 * j], vld1q_s8(x.qs + 32 * j));
      s = P::Dot(s, w.code[2 * j + 1], vld1q_s8(x.qs + 32 * j + 16));
      acc = vmlaq_n_s32(acc, s, w.sc[j]);
    }
    return x.d * w.d * static_cast<float>(vaddvq_s32(acc));
  }
};

// Q6_K: codes minus 32 are signed bytes; one int8 scale per 16 values.
template <class P>
struct Q6_KN {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockQ6_K),
                       kActBlockBytes = sizeof(BlockQ8_K);
  struct W {
    int8x16_t code[16];  // values 16i..16i+15
    int8_t sc[16];
    float d;
  };
  static STRATA_INLINE void Decode(const uint8_t* p, W& w) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(p);
    const uint8x16_t low4 = vdupq_n_u8(0x0f), high2 = vdupq_n_u8(0x30);
    const int8x16_t m32 = vdupq_n_s8(32);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 2; ++s) {  // which 16 of the 32 bytes
        const uint8x16_t ql0 = vld1q_u8(b.ql + 64 * h + 16 * s);
        const uint8x16_t ql1 = vld1q_u8(b.ql + 64 * h + 32 + 16 * s);
        const uint8x16_t qh = vld1q_u8(b.qh + 32 * h + 16 * s);
        const uint8x16_t c0 = vorrq_u8(vandq_u8(ql0, low4), vandq_u8(vshlq_n_u8(qh, 4), high2));
        const uint8x16_t c1 = vorrq_u8(vandq_u8(ql1, low4), vandq_u8(vshlq_n_u8(qh, 2), high2));
        const uint8x16_t c2 = vorrq_u8(vshrq_n_u8(ql0, 4), vandq_u8(qh, high2));
        const uint8x16_t c3 = vorrq_u8(vshrq_n_u8(ql1, 4), vandq_u8(vshrq_n_u8(qh, 2), high2));
        // Values 128h + 32q + 16s + (0..15) for quarter q.
        w.code[8 * h + 0 + s] = vsubq_s8(vreinterpretq_s8_u8(c0), m32);
        w.code[8 * h + 2 + s] = vsubq_s8(vreinterpretq_s8_u8(c1), m32);
        w.code[8 * h + 4 + s] = vsubq_s8(vreinterpretq_s8_u8(c2), m32);
        w.code[8 * h + 6 + s] = vsubq_s8(vreinterpretq_s8_u8(c3), m32);
      }
    }
    std::memcpy(w.sc, b.scales, 16);
    w.d = H2F(b.d);
  }
  static STRATA_INLINE float Dot(const W& w, const uint8_t* xp) {
    const BlockQ8_K& x = *reinterpret_cast<const BlockQ8_K*>(xp);
    int32x4_t acc = vdupq_n_s32(0);
    for (int i = 0; i < 16; ++i) {
      acc = vmlaq_n_s32(acc, P::Dot(vdupq_n_s32(0), w.code[i], vld1q_s8(x.qs + 16 * i)), w.sc[i]);
    }
    return x.d * w.d * static_cast<float>(vaddvq_s32(acc));
  }
};

// R rows x T tokens over all blocks; block sums are accumulated in float per pair.
template <class Tr, int R, int T>
void QuantTiles(const MatmulArgs& a, int64_t rb, int64_t re) {
  const int64_t nb = a.k / Tr::kBlockElems;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const uint8_t* x = static_cast<const uint8_t*>(a.xq);
  for (int64_t t0 = 0; t0 < a.n_tok; t0 += T) {
    const int nt = static_cast<int>(std::min<int64_t>(T, a.n_tok - t0));
    const uint8_t* xs[T];
    for (int t = 0; t < T; ++t) xs[t] = x + (t0 + std::min(t, nt - 1)) * a.xq_row_bytes;
    for (int64_t r0 = rb; r0 < re; r0 += R) {
      const int nr = static_cast<int>(std::min<int64_t>(R, re - r0));
      float acc[R][T] = {};
      for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + (r0 + r) * a.w_row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
          typename Tr::W wd;
          Tr::Decode(row + b * Tr::kBlockBytes, wd);
          for (int t = 0; t < T; ++t) acc[r][t] += Tr::Dot(wd, xs[t] + b * Tr::kActBlockBytes);
        }
      }
      for (int t = 0; t < nt; ++t) {
        for (int r = 0; r < nr; ++r) a.y[(t0 + t) * a.y_stride + r0 + r] = acc[r][t];
      }
    }
  }
}

template <class Tr>
void QuantMatmul(const MatmulArgs& a, int64_t rb, int64_t re) {
  if (a.n_tok == 1) {
    QuantTiles<Tr, 1, 1>(a, rb, re);
  } else {
    QuantTiles<Tr, 1, 4>(a, rb, re);
  }
}

template <class P>
void MatmulQuantizedNeon(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
      return QuantMatmul<Q4_0N<P>>(a, rb, re);
    case DType::kQ4_1:
      return QuantMatmul<Q4_1N<P>>(a, rb, re);
    case DType::kQ5_0:
      return QuantMatmul<Q5_0N<P>>(a, rb, re);
    case DType::kQ5_1:
      return QuantMatmul<Q5_1N<P>>(a, rb, re);
    case DType::kQ8_0:
      return QuantMatmul<Q8_0N<P>>(a, rb, re);
    case DType::kIQ4_NL:
      return QuantMatmul<IQ4_NLN<P>>(a, rb, re);
    case DType::kQ2_K:
      return QuantMatmul<Q2_KN<P>>(a, rb, re);
    case DType::kQ3_K:
      return QuantMatmul<Q3_KN<P>>(a, rb, re);
    case DType::kQ4_K:
      return QuantMatmul<Q4_KN<P>>(a, rb, re);
    case DType::kQ5_K:
      return QuantMatmul<Q5_KN<P>>(a, rb, re);
    case DType::kQ6_K:
      return QuantMatmul<Q6_KN<P>>(a, rb, re);
    case DType::kIQ4_XS:
      return QuantMatmul<IQ4_XSN<P>>(a, rb, re);
    default:
      return;
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
