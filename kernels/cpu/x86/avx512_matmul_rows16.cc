// AVX-512 VNNI matmul for Q4_0, Q4_1, Q8_0 and Q6_K weights in the kRows16 layout (kernels.h),
// with the rows in the lanes, and the entry point for every kRows16 type.
//
// The row-major kernels (avx512_matmul_q.cc, avx512_matmul_k.cc) put a block's values in
// the lanes and pay, per (row, token), float work per lane and a lane reduction at the end.
// Here one vector holds a dword of the same block of 16 rows, so each of a token's four
// activation bytes is broadcast against 16 rows at once, and the block's scale, its integer
// sum's conversion and its multiply-add are paid once per 16 rows. A block is summed exactly
// in integers (the codes' unsigned offset folded in through the activations' block sums) and
// added to the row's float sum in block order, one multiply-add per block: a token gets the
// same bits whatever batch it is in, and the same value as the row-major kernels up to
// float rounding (they add per-lane partial sums in another order).
//
// Q4_0: 4 code vectors per block, low and high nibbles against the activations' two halves.
// Q4_1: the same codes with no offset, and a second vector of the 16 rows' mins, times the
// Q8_1 activations' d * sum(x): a second multiply-add per block.
// Q8_0: 8 code vectors, made unsigned by flipping the sign bit (+128, undone by -128 * sum x).
// Q6_K: 52 vectors per super-block (ql, qh, the 16 signed sub-block scales); a 16-value
// sub-block's sum reaches 17 bits, more than the 16-bit words vpdpwssd could scale, so each
// is scaled with a 32-bit multiply.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/x86/avx512_internal.h"
#include "kernels/cpu/x86/avx512_rows16.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kRows = 16;

STRATA_INLINE __m512i Broadcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

STRATA_INLINE __m512 Scales16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Per (token, block) of Q8_0 activations: the scale and the codes' offset correction.
struct TokenQ8_0 {
  float dx;
  int32_t bias;  // offset * sum(x)
};

template <int kOffset>
STRATA_INLINE void PrepQ8_0(const uint8_t* p, TokenQ8_0* t) {
  const BlockQ8_0& b = *reinterpret_cast<const BlockQ8_0*>(p);
  int32_t s = 0;
  for (int i = 0; i < 32; ++i) s += b.qs[i];
  t->dx = _cvtsh_ss(b.d);
  t->bias = kOffset * s;
}

// acc[t] += dw * dx * (bias + sum_j code[j] . x[4j..4j+3] (+ x[16+..] for Q4_0's highs)).
template <int T, int kCodes, int kSecondHalf>
STRATA_INLINE void DotQ8_0(const __m512i* c, __m512 dw, const uint8_t* x, size_t x_stride,
                           const TokenQ8_0* tok, int64_t tok_stride, __m512* acc) {
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const int8_t* q = reinterpret_cast<const BlockQ8_0*>(x + t * x_stride)->qs;
    const TokenQ8_0& k = tok[t * tok_stride];
    __m512i i = _mm512_set1_epi32(k.bias);
#pragma GCC unroll 8
    for (int j = 0; j < kCodes; ++j) i = _mm512_dpbusd_epi32(i, c[j], Broadcast4(q + 4 * j));
    if constexpr (kSecondHalf) {
#pragma GCC unroll 4
      for (int j = 0; j < kCodes; ++j)
        i = _mm512_dpbusd_epi32(i, c[kCodes + j], Broadcast4(q + 16 + 4 * j));
    }
    acc[t] =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(k.dx)), acc[t]);
  }
}

// A 32-value block of 4-bit codes (Q4_0, Q4_1) as eight code vectors, unsigned: the low
// nibbles (values 4j..4j+3 of each row) first, then the high nibbles (16 + 4j..).
STRATA_INLINE void SplitNibbles(const __m512i* v, __m512i c[8]) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i raw = _mm512_load_si512(v + j);
    c[j] = _mm512_and_si512(raw, m4);
    c[4 + j] = _mm512_and_si512(_mm512_srli_epi32(raw, 4), m4);
  }
}

struct Q4_0Rows16 {
  static constexpr int kBlockElems = 32, kBlockBytes = sizeof(BlockQ4_0), kDwords = 4;
  static constexpr int kActBlockBytes = sizeof(BlockQ8_0), kFused = 8;
  using Token = TokenQ8_0;
  static void Prep(const uint8_t* x, Token* t) { PrepQ8_0<-8>(x, t); }
  template <int T>
  STRATA_INLINE static void Dot(const __m512i* v, const uint8_t* scales, const uint8_t* x,
                                size_t x_stride, const Token* tok, int64_t tok_stride, __m512* acc,
                                Ahead ahead) {
    PrefetchAhead(v, 0, kDwords, ahead);
    __m512i c[8];
    SplitNibbles(v, c);
    DotQ8_0<T, 4, true>(c, Scales16(scales), x, x_stride, tok, tok_stride, acc);
  }
};

// Q4_1: Q4_0's code vectors, unsigned as they are; per (token, block) the scale and the
// block's d * sum(x) from the Q8_1 activations, which the min vector multiplies.
struct TokenQ8_1 {
  float dx, sx;
};

struct Q4_1Rows16 {
  static constexpr int kBlockElems = 32, kBlockBytes = sizeof(BlockQ4_1), kDwords = 4;
  static constexpr int kActBlockBytes = sizeof(BlockQ8_1), kFused = 8;
  using Token = TokenQ8_1;
  static void Prep(const uint8_t* x, Token* t) {
    const BlockQ8_1& b = *reinterpret_cast<const BlockQ8_1*>(x);
    t->dx = _cvtsh_ss(b.d);
    t->sx = _cvtsh_ss(b.s);
  }
  template <int T>
  STRATA_INLINE static void Dot(const __m512i* v, const uint8_t* scales, const uint8_t* x,
                                size_t x_stride, const Token* tok, int64_t tok_stride, __m512* acc,
                                Ahead ahead) {
    PrefetchAhead(v, 0, kDwords, ahead);
    __m512i c[8];
    SplitNibbles(v, c);
    const __m512 dw = Scales16(scales), mw = Scales16(scales + 2 * kRows);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const int8_t* q = reinterpret_cast<const BlockQ8_1*>(x + t * x_stride)->qs;
      const TokenQ8_1& k = tok[t * tok_stride];
      __m512i i = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        i = _mm512_dpbusd_epi32(i, c[j], Broadcast4(q + 4 * (j & 3) + 16 * (j >> 2)));
      acc[t] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(k.dx)), acc[t]);
      acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(k.sx), acc[t]);
    }
  }
};

struct Q8_0Rows16 {
  static constexpr int kBlockElems = 32, kBlockBytes = sizeof(BlockQ8_0), kDwords = 8;
  static constexpr int kActBlockBytes = sizeof(BlockQ8_0), kFused = 8;
  using Token = TokenQ8_0;
  static void Prep(const uint8_t* x, Token* t) { PrepQ8_0<-128>(x, t); }
  template <int T>
  STRATA_INLINE static void Dot(const __m512i* v, const uint8_t* scales, const uint8_t* x,
                                size_t x_stride, const Token* tok, int64_t tok_stride, __m512* acc,
                                Ahead ahead) {
    PrefetchAhead(v, 0, kDwords, ahead);
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i c[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) c[j] = _mm512_xor_si512(_mm512_load_si512(v + j), sign);
    DotQ8_0<T, 8, false>(c, Scales16(scales), x, x_stride, tok, tok_stride, acc);
  }
};

// Q6_K: per (token, super-block) the scale and -32 * each 16-value sum, the codes' offset.
struct TokenQ8_K {
  float dx;
  int32_t bias[16];
};

struct Q6_KRows16 {
  static constexpr int kBlockElems = 256, kBlockBytes = sizeof(BlockQ6_K), kDwords = 52;
  static constexpr int kActBlockBytes = sizeof(BlockQ8_K), kFused = 4;
  using Token = TokenQ8_K;
  static void Prep(const uint8_t* x, Token* t) {
    const BlockQ8_K& b = *reinterpret_cast<const BlockQ8_K*>(x);
    t->dx = b.d;
    for (int s = 0; s < 16; ++s) t->bias[s] = -32 * b.bsums[s];
  }
  // A block's vectors in kQ6_KRows16Order: 0..3 the scales, then per quarter (half n,
  // group gq) twelve: ql dwords of values 128n + 16gq + 4i.. (low nibbles; high nibbles
  // + 64), of those + 32 (+ 96), and their qh dwords (the two high bits of the four values in
  // bits 0-1, 2-3, 4-5, 6-7).
  template <int T>
  STRATA_INLINE static void Dot(const __m512i* v, const uint8_t* scales, const uint8_t* x,
                                size_t x_stride, const Token* tok, int64_t tok_stride, __m512* acc,
                                Ahead ahead) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512i tot[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) tot[t] = _mm512_setzero_si512();
    PrefetchAhead(v, 0, 4, ahead);
#pragma GCC unroll 1
    for (int n = 0; n < 2; ++n) {
#pragma GCC unroll 1
      for (int gq = 0; gq < 2; ++gq) {
        // Values 128n + 32 * kind + 16 * gq + 4i.. : sub-block s = 8n + 2 * kind + gq.
        const __m512i* w = v + 4 + 12 * (2 * n + gq);
        PrefetchAhead(w, 0, 12, ahead);
        __m512i c[4][4], sc[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512i a = _mm512_load_si512(w + i);
          const __m512i b = _mm512_load_si512(w + 4 + i);
          const __m512i h = _mm512_load_si512(w + 8 + i);
          // (low & m4) | high: 0xEC is the truth table of (a & c) | b.
          c[0][i] = _mm512_ternarylogic_epi32(a, _mm512_and_si512(_mm512_slli_epi32(h, 4), m30), m4,
                                              0xEC);
          c[1][i] = _mm512_ternarylogic_epi32(b, _mm512_and_si512(_mm512_slli_epi32(h, 2), m30), m4,
                                              0xEC);
          c[2][i] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 4), _mm512_and_si512(h, m30), m4,
                                              0xEC);
          c[3][i] = _mm512_ternarylogic_epi32(
              _mm512_srli_epi32(b, 4), _mm512_and_si512(_mm512_srli_epi32(h, 2), m30), m4, 0xEC);
        }
#pragma GCC unroll 4
        for (int kind = 0; kind < 4; ++kind) {
          const int s = 8 * n + 2 * kind + gq;  // byte s % 4 of scale dword s / 4
          const __m512i u = _mm512_load_si512(v + s / 4);
          sc[kind] = _mm512_srai_epi32(_mm512_slli_epi32(u, 24 - 8 * (s % 4)), 24);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const int8_t* q =
              reinterpret_cast<const BlockQ8_K*>(x + t * x_stride)->qs + 128 * n + 16 * gq;
          const TokenQ8_K& k = tok[t * tok_stride];
#pragma GCC unroll 4
          for (int kind = 0; kind < 4; ++kind) {
            __m512i i = _mm512_set1_epi32(k.bias[8 * n + 2 * kind + gq]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
              i = _mm512_dpbusd_epi32(i, c[kind][j], Broadcast4(q + 32 * kind + 4 * j));
            tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(i, sc[kind]));
          }
        }
      }
    }
    const __m512 dw = Scales16(scales);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(tok[t * tok_stride].dx));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), s, acc[t]);
    }
  }
};

// One tile's rows for T tokens: every block in order, then the masked store.
template <typename R, int T>
STRATA_INLINE void DotTile(const uint8_t* tile, int64_t nb, const uint8_t* x, size_t x_stride,
                           const typename R::Token* tok, float* y, int64_t y_stride,
                           __mmask16 valid, Ahead ahead) {
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Rows16Block at = Rows16BlockOffsets(R::kBlockBytes, R::kDwords, nb, b);
    R::template Dot<T>(reinterpret_cast<const __m512i*>(tile + at.codes), tile + at.scales,
                       x + b * R::kActBlockBytes, x_stride, tok + b, nb, acc, ahead);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * y_stride, valid, acc[t]);
}

template <typename R, int T>
STRATA_INLINE void DotTileUpTo(int nt, const uint8_t* tile, int64_t nb, const uint8_t* x,
                               size_t x_stride, const typename R::Token* tok, float* y,
                               int64_t y_stride, __mmask16 valid, Ahead ahead) {
  if constexpr (T > 1) {
    if (nt < T)
      return DotTileUpTo<R, T - 1>(nt, tile, nb, x, x_stride, tok, y, y_stride, valid, ahead);
  }
  DotTile<R, T>(tile, nb, x, x_stride, tok, y, y_stride, valid, ahead);
}

template <typename R>
void MatmulRows16(const MatmulArgs& a, int64_t rb, int64_t re) {
  const int64_t nb = a.k / R::kBlockElems;
  const size_t tile_bytes = Rows16TileBytes(a.wtype, a.k);
  const auto* xq = static_cast<const uint8_t*>(a.xq);
  // The activations' per-block terms, once per call rather than once per tile.
  static thread_local std::vector<typename R::Token> tokens;
  tokens.resize(static_cast<size_t>(a.n_tok * nb));
  for (int64_t t = 0; t < a.n_tok; ++t)
    for (int64_t b = 0; b < nb; ++b)
      R::Prep(xq + t * a.xq_row_bytes + b * R::kActBlockBytes, &tokens[size_t(t * nb + b)]);
  const Ahead ahead = Rows16Ahead(a.n_tok, nb * R::kActBlockBytes);
  for (int64_t r0 = rb / kRows * kRows; r0 < re; r0 += kRows) {
    const int lo = static_cast<int>(std::max<int64_t>(rb - r0, 0));
    const int nr = static_cast<int>(std::min<int64_t>(kRows, re - r0));
    const __mmask16 valid = static_cast<__mmask16>(((1u << nr) - 1) & ~((1u << lo) - 1));
    const uint8_t* tile = static_cast<const uint8_t*>(a.w) + size_t(r0 / kRows) * tile_bytes;
    for (int64_t t0 = 0; t0 < a.n_tok; t0 += R::kFused) {
      const int nt = static_cast<int>(std::min<int64_t>(R::kFused, a.n_tok - t0));
      DotTileUpTo<R, R::kFused>(nt, tile, nb, xq + t0 * a.xq_row_bytes, a.xq_row_bytes,
                                tokens.data() + t0 * nb, a.y + t0 * a.y_stride + r0, a.y_stride,
                                valid, ahead);
    }
  }
}

}  // namespace

void Avx512MatmulRows16(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
      return MatmulRows16<Q4_0Rows16>(a, rb, re);
    case DType::kQ4_1:
      return MatmulRows16<Q4_1Rows16>(a, rb, re);
    case DType::kQ8_0:
      return MatmulRows16<Q8_0Rows16>(a, rb, re);
    case DType::kQ4_K:
      return Avx512MatmulQ4_KRows16(a, rb, re);
    case DType::kQ6_K:
      return MatmulRows16<Q6_KRows16>(a, rb, re);
    default:
      return;  // dispatch sends only kAvx512Rows16Types
  }
}

}  // namespace strata::kernels::cpu
