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
    case DType::kQ8_0:
      return QuantMatmul<Q8_0N<P>>(a, rb, re);
    case DType::kQ4_K:
      return QuantMatmul<Q4_KN<P>>(a, rb, re);
    case DType::kQ6_K:
      return QuantMatmul<Q6_KN<P>>(a, rb, re);
    default:
      return;
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
