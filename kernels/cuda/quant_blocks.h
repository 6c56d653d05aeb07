// The block arithmetic of the GPU's quantized matmuls, for one unit of a weight row at a time:
// decoding GGUF blocks in place (no repacking, so the same bytes serve a discrete GPU's copy
// and a unified-memory board's mapping of the file) and dotting them with activations
// quantized to 8-bit integers, four products per dp4a.
//
// Everything here is a plain function of its inputs, compiled for the device by the CUDA
// kernels and for the host by the tests, which check each type's decoding and dot products
// against the CPU's scalar reference on machines without a GPU. On the host dp4a and the
// byte-wise subtraction are emulated bit for bit.
//
// Activations: a row of k floats becomes k int8 values and, per block of 32, the scale d
// (value = q * d) and s = d * sum(q), which the formats with an offset (Q4_0's -8, Q4_1's
// min, Q4_K's mins) need to fold their offset into one multiply per block.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/types.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif
#ifdef __CUDA_ARCH__
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_UNROLL
#endif

namespace strata::kernels::cuda::q {

// Per block of 32 activations: the scale and the scaled sum of the integers.
struct alignas(8) ActScale {
  float d;
  float s;
};
constexpr int kActBlock = 32;

STRATA_HD float Half(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return F16ToF32(h);
#endif
}

// Unaligned-safe loads of little-endian fields: p must be 2-byte aligned for Load16 and
// Load16x2 (the blocks of Q4_0, Q8_0 and Q6_K are 18, 34 and 210 bytes), 4-byte aligned for
// Load32.
STRATA_HD uint16_t Load16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned short*>(p));
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}
STRATA_HD uint32_t Load16x2(const uint8_t* p) {
  return uint32_t(Load16(p)) | (uint32_t(Load16(p + 2)) << 16);
}
STRATA_HD uint32_t Load32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned int*>(p));
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// Eight int8 activations' words (32 bytes, 16-byte aligned). Ordinary loads, not the
// read-only path: activations are written by the kernel before, which may still be running
// when this one starts (kernels/cuda/launch.cuh).
STRATA_HD void LoadAct8(const int8_t* p, int* w) {
#ifdef __CUDA_ARCH__
  const int4 a = reinterpret_cast<const int4*>(p)[0];
  const int4 b = reinterpret_cast<const int4*>(p)[1];
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
  w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
#else
  std::memcpy(w, p, 32);
#endif
}

// c + sum of the four signed byte products of a and b.
STRATA_HD int Dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i)
    c += int(int8_t(uint32_t(a) >> (8 * i))) * int(int8_t(uint32_t(b) >> (8 * i)));
  return c;
#endif
}
// Byte-wise a - b, each byte wrapping on its own.
STRATA_HD int Vsub4(int a, int b) {
#ifdef __CUDA_ARCH__
  return int(__vsub4(unsigned(a), unsigned(b)));
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t x = (uint32_t(a) >> (8 * i)) & 0xffu, y = (uint32_t(b) >> (8 * i)) & 0xffu;
    r |= ((x - y) & 0xffu) << (8 * i);
  }
  return int(r);
#endif
}

// One activation's integer in a block whose largest magnitude is amax: q = round(x / d) with
// d = amax / 127 (ties to even). The GPU quantizes a block with one warp (a lane per value)
// and these formulas; QuantizeActBlock is the same on one thread.
STRATA_HD float ActScaleOf(float amax) { return amax / 127.0f; }
STRATA_HD int ActQuant(float x, float d) {
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  return int(rintf(x * id));
}
STRATA_HD void QuantizeActBlock(const float* x, int8_t* q, ActScale* s) {
  float amax = 0.0f;
  for (int i = 0; i < kActBlock; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float d = ActScaleOf(amax);
  int sum = 0;
  for (int i = 0; i < kActBlock; ++i) {
    q[i] = int8_t(ActQuant(x[i], d));
    sum += q[i];
  }
  *s = {d, d * float(sum)};
}

// Q4_K's 6-bit scale and min of sub-block j (0..7), as packed in its 12 scale bytes.
STRATA_HD void Q4KScaleMin(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Each type: kBlockElems / kBlockBytes (the GGUF block), kUnit (weights one lane takes at a
// time: one block, or a part of a super-block; unit u's activations are values [u * kUnit,
// (u + 1) * kUnit) and their kUnit / 32 scales), W (a unit's weights as the dot products
// take them), Load (a unit's W from its row), Acc (W's dot product with one token's unit of
// activations, added to acc) and Dequant (the unit's weights as floats). UnitDot adds Dot,
// the unit's partial dot products with nt <= NT activation rows.
//
// The GEMV loads a unit's activations once for all the rows it sums at once, so Acc takes
// them loaded: kUnit / 4 words of four int8 values, and the scales.

// Loads one token's activations of unit u: x gets kUnit / 4 words, a the kUnit / 32 scales.
template <int kUnit>
STRATA_HD void LoadUnitActs(const int8_t* xq, const ActScale* xs, int64_t u, int* x, ActScale* a) {
  STRATA_UNROLL
  for (int i = 0; i < kUnit / 32; ++i) {
    LoadAct8(xq + u * kUnit + 32 * i, x + 8 * i);
    a[i] = xs[u * (kUnit / 32) + i];
  }
}

// The low and high nibbles of four bytes, each as a byte of its own.
STRATA_HD void SplitNibbles(uint32_t v, int* lo, int* hi) {
  *lo = int(v & 0x0F0F0F0Fu);
  *hi = int((v >> 4) & 0x0F0F0F0Fu);
}
// A 32-value block whose values 0-15 are lo's bytes and 16-31 hi's, dotted with x (8 words).
STRATA_HD int DotNibbles32(const int* lo, const int* hi, const int* x) {
  int s = 0;
  for (int i = 0; i < 4; ++i) s = Dp4a(hi[i], x[4 + i], Dp4a(lo[i], x[i], s));
  return s;
}

template <class B>
struct UnitDot {
  // acc[t] += the unit's dot product with token t (t < nt; acc[t] for t >= nt untouched). xq /
  // xs point at the first of the rows, k values (and k / 32 scales) apart.
  template <int NT>
  STRATA_HD static void Dot(const uint8_t* row, int64_t u, const int8_t* xq, const ActScale* xs,
                            int64_t k, int nt, float* acc) {
    const typename B::W w = B::Load(row, u);
    STRATA_UNROLL
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      int x[B::kUnit / 4];
      ActScale a[B::kUnit / 32];
      LoadUnitActs<B::kUnit>(xq + t * k, xs + t * (k / 32), u, x, a);
      B::Acc(w, x, a, &acc[t]);
    }
  }
};

struct Q4_0 : UnitDot<Q4_0> {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kUnit = 32;
  struct W {
    float d;
    int lo[4], hi[4];
  };
  STRATA_HD static W Load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + u * kBlockBytes;
    W w;
    w.d = Half(Load16(b));
    for (int i = 0; i < 4; ++i) SplitNibbles(Load16x2(b + 2 + 4 * i), &w.lo[i], &w.hi[i]);
    return w;
  }
  STRATA_HD static void Acc(const W& w, const int* x, const ActScale* a, float* acc) {
    const int s = DotNibbles32(w.lo, w.hi, x);
    // sum((q - 8) * x) = d_x * sum(q * xq) - 8 * s_x.
    *acc = fmaf(w.d, fmaf(a[0].d, float(s), -8.0f * a[0].s), *acc);
  }
  STRATA_HD static void Dequant(const uint8_t* row, int64_t u, float* out) {
    const uint8_t* b = row + u * kBlockBytes;
    const float d = Half(Load16(b));
    for (int i = 0; i < 16; ++i) {
      const int v = b[2 + i];
      out[i] = d * float((v & 0xF) - 8);
      out[i + 16] = d * float((v >> 4) - 8);
    }
  }
};

struct Q4_1 : UnitDot<Q4_1> {
  static constexpr int kBlockElems = 32, kBlockBytes = 20, kUnit = 32;
  struct W {
    float d, m;
    int lo[4], hi[4];
  };
  STRATA_HD static W Load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + u * kBlockBytes;
    W w;
    w.d = Half(Load16(b));
    w.m = Half(Load16(b + 2));
    for (int i = 0; i < 4; ++i) SplitNibbles(Load32(b + 4 + 4 * i), &w.lo[i], &w.hi[i]);
    return w;
  }
  STRATA_HD static void Acc(const W& w, const int* x, const ActScale* a, float* acc) {
    const int s = DotNibbles32(w.lo, w.hi, x);
    // sum((d q + m) x) = d d_x sum(q xq) + m s_x.
    *acc = fmaf(w.d * a[0].d, float(s), fmaf(w.m, a[0].s, *acc));
  }
  STRATA_HD static void Dequant(const uint8_t* row, int64_t u, float* out) {
    const uint8_t* b = row + u * kBlockBytes;
    const float d = Half(Load16(b)), m = Half(Load16(b + 2));
    for (int i = 0; i < 16; ++i) {
      const int v = b[4 + i];
      out[i] = d * float(v & 0xF) + m;
      out[i + 16] = d * float(v >> 4) + m;
    }
  }
};

struct Q8_0 : UnitDot<Q8_0> {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kUnit = 32;
  struct W {
    float d;
    int q[8];
  };
  STRATA_HD static W Load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + u * kBlockBytes;
    W w;
    w.d = Half(Load16(b));
    for (int i = 0; i < 8; ++i) w.q[i] = int(Load16x2(b + 2 + 4 * i));
    return w;
  }
  STRATA_HD static void Acc(const W& w, const int* x, const ActScale* a, float* acc) {
    int s = 0;
    for (int i = 0; i < 8; ++i) s = Dp4a(w.q[i], x[i], s);
    *acc = fmaf(w.d * a[0].d, float(s), *acc);
  }
  STRATA_HD static void Dequant(const uint8_t* row, int64_t u, float* out) {
    const uint8_t* b = row + u * kBlockBytes;
    const float d = Half(Load16(b));
    for (int i = 0; i < 32; ++i) out[i] = d * float(int8_t(b[2 + i]));
  }
};

// Q4_K: super-blocks of 256 (d, dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes of
// nibbles). A unit is 64 weights: 32 bytes whose low nibbles are sub-block 2c and high
// nibbles sub-block 2c + 1.
struct Q4_K : UnitDot<Q4_K> {
  static constexpr int kBlockElems = 256, kBlockBytes = 144, kUnit = 64;
  struct W {
    float d, dmin;
    int sc0, m0, sc1, m1;
    int lo[8], hi[8];
  };
  STRATA_HD static W Load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 4) * kBlockBytes;
    const int c = int(u % 4);
    W w;
    w.d = Half(Load16(b));
    w.dmin = Half(Load16(b + 2));
    Q4KScaleMin(b + 4, 2 * c, &w.sc0, &w.m0);
    Q4KScaleMin(b + 4, 2 * c + 1, &w.sc1, &w.m1);
    for (int i = 0; i < 8; ++i) SplitNibbles(Load32(b + 16 + 32 * c + 4 * i), &w.lo[i], &w.hi[i]);
    return w;
  }
  STRATA_HD static void Acc(const W& w, const int* x, const ActScale* a, float* acc) {
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 8; ++i) {
      s0 = Dp4a(w.lo[i], x[i], s0);
      s1 = Dp4a(w.hi[i], x[8 + i], s1);
    }
    // sum((d sc q - dmin m) x) over both sub-blocks.
    const float dot = fmaf(float(w.sc0) * a[0].d, float(s0), float(w.sc1) * a[1].d * float(s1));
    const float off = fmaf(float(w.m0), a[0].s, float(w.m1) * a[1].s);
    *acc = fmaf(w.d, dot, fmaf(-w.dmin, off, *acc));
  }
  STRATA_HD static void Dequant(const uint8_t* row, int64_t u, float* out) {
    const uint8_t* b = row + (u / 4) * kBlockBytes;
    const int c = int(u % 4);
    const float d = Half(Load16(b)), dmin = Half(Load16(b + 2));
    int sc0, m0, sc1, m1;
    Q4KScaleMin(b + 4, 2 * c, &sc0, &m0);
    Q4KScaleMin(b + 4, 2 * c + 1, &sc1, &m1);
    const uint8_t* q = b + 16 + 32 * c;
    for (int l = 0; l < 32; ++l) {
      out[l] = d * float(sc0) * float(q[l] & 0xF) - dmin * float(m0);
      out[32 + l] = d * float(sc1) * float(q[l] >> 4) - dmin * float(m1);
    }
  }
};

// Q6_K: super-blocks of 256 (128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales
// of 16 values each, d). A unit is one half (128 weights): value 32i + l of half n takes the
// low (i < 2) or high nibble of ql[64n + 32(i & 1) + l], bits 2i of qh[32n + l], minus 32, and
// scale 8n + 2i + l / 16.
struct Q6_K : UnitDot<Q6_K> {
  static constexpr int kBlockElems = 256, kBlockBytes = 210, kUnit = 128;
  struct W {
    float d;
    uint32_t lw[16], hw[8];
    float scale[8];
  };
  STRATA_HD static W Load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 2) * kBlockBytes;
    const int n = int(u % 2);
    const uint8_t* ql = b + 64 * n;
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
    W w;
    w.d = Half(Load16(b + 208));
    for (int i = 0; i < 16; ++i) w.lw[i] = Load16x2(ql + 4 * i);
    for (int i = 0; i < 8; ++i) w.hw[i] = Load16x2(qh + 4 * i);
    for (int i = 0; i < 8; ++i) w.scale[i] = float(sc[i]);
    return w;
  }
  STRATA_HD static void Acc(const W& w, const int* x, const ActScale* a, float* acc) {
    float dot = 0.0f;
    for (int i = 0; i < 4; ++i) {
      int sa = 0, sb = 0;
      for (int j = 0; j < 8; ++j) {
        const uint32_t l = w.lw[8 * (i & 1) + j];
        const uint32_t nib = (i < 2 ? l : l >> 4) & 0x0F0F0F0Fu;
        const uint32_t top = ((w.hw[j] >> (2 * i)) & 0x03030303u) << 4;
        const int v = Vsub4(int(nib | top), 0x20202020);
        if (j < 4)
          sa = Dp4a(v, x[8 * i + j], sa);
        else
          sb = Dp4a(v, x[8 * i + j], sb);
      }
      dot = fmaf(a[i].d, fmaf(w.scale[2 * i], float(sa), w.scale[2 * i + 1] * float(sb)), dot);
    }
    *acc = fmaf(w.d, dot, *acc);
  }
  STRATA_HD static void Dequant(const uint8_t* row, int64_t u, float* out) {
    const uint8_t* b = row + (u / 2) * kBlockBytes;
    const int n = int(u % 2);
    const uint8_t* ql = b + 64 * n;
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
    const float d = Half(Load16(b + 208));
    for (int i = 0; i < 4; ++i)
      for (int l = 0; l < 32; ++l) {
        const int lowq = ql[32 * (i & 1) + l];
        const int nib = i < 2 ? (lowq & 0xF) : (lowq >> 4);
        const int v = (nib | (((qh[l] >> (2 * i)) & 3) << 4)) - 32;
        out[32 * i + l] = d * float(sc[2 * i + l / 16]) * float(v);
      }
  }
};

}  // namespace strata::kernels::cuda::q
