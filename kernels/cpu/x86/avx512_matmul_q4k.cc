// AVX-512 VNNI matmul for Q4_K with the rows in the lanes.
//
// The other formats put a weight group's values in the lanes and pay, per (row, token,
// super-block), a widening multiply, a scale multiply-add for every 64 values and a float
// tail. Here 16 rows share each vector: a super-block of 16 rows is decoded once into
// vectors whose lane r holds four codes of row r, and each token's four activation bytes are
// broadcast against them, so one vpdpbusd does 64 multiply-adds for 16 rows and the scales,
// mins and float work are paid once per 16 rows. Per (16 rows, token, super-block): 64
// vpdpbusd over 16-value halves of the sub-blocks (whose sums fit 16 bits), 16 vpdpwssd
// applying the 6-bit scales, 8 vpdpwssd for the mins against the Q8_K block sums, and two
// float multiply-adds; about half the operations of the values-in-lanes dot.
//
// Decoding costs a 16 x 16 transpose of the codes and four gathers of the block headers per
// 16 rows: a one-token GEMV paying it alone ran at half the values-in-lanes speed, so batches
// of fewer than kMinTokens tokens (decode, small beam groups) take the values-in-lanes
// driver. Both sum a (row, token)'s super-block exactly in integers, sum_s sc_s * (q . x)_s
// and sum_s m_s * bsum_s, before the same two float multiply-adds (d * dx, -dmin * dx), in
// the same slices of k: a token gets the same bits alone or in a prefill. That exactness
// costs the values-in-lanes dot a lane reduction per super-block (Q4_KExactTraits).
//
// Weights repacked in the kRows16 layout (kernels.h) are already transposed: a tile's
// super-block is 36 vectors loaded as they are, so the rows-in-lanes kernel serves every
// batch, decode included, at about twice the one-token arithmetic rate of the values-in-lanes
// dot and with no transposes or gathers in a prefill; the same integer sums and float steps
// give the same bits as the file's layout.
#include <cstring>
#include <vector>

#include "kernels/cpu/x86/avx512_common.h"
#include "kernels/cpu/x86/avx512_internal.h"
#include "kernels/cpu/x86/avx512_rows16.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kRows = 16;
constexpr int kTokens =
    8;  // a token tile: its 8 sums and a sub-block's 8 code vectors in registers
// Fewer tokens take the values-in-lanes driver: decoding 16 rows at once (transposes,
// gathers) costs more than the dot products it saves until several tokens share it.
constexpr int64_t kMinTokens = 8;
// Tokens per pass over a kRows16 super-block's codes: their sums, the eight code vectors and
// their nibbles stay in the 32 vector registers.
constexpr int kFusedTokens = 7;

// Index tables of the transpose's four butterfly stages: stage h swaps bit h of the vector
// index with bit h of the lane index, pairing vectors i and i + 2^h.
struct TransposeIdx {
  alignas(64) int32_t lo[4][16];
  alignas(64) int32_t hi[4][16];
};
constexpr TransposeIdx MakeTransposeIdx() {
  TransposeIdx t{};
  for (int h = 0; h < 4; ++h) {
    const int d = 1 << h;
    for (int c = 0; c < 16; ++c) {
      const bool bit = (c & d) != 0;
      t.lo[h][c] = bit ? 16 + c - d : c;  // lane c of vector i
      t.hi[h][c] = bit ? 16 + c : c + d;  // lane c of vector i + d
    }
  }
  return t;
}
constexpr TransposeIdx kTransposeIdx = MakeTransposeIdx();

// r[i] lane c <- r[c] lane i.
STRATA_INLINE void Transpose16(__m512i* r) {
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h) {
    const int d = 1 << h;
    const __m512i lo = _mm512_load_si512(kTransposeIdx.lo[h]);
    const __m512i hi = _mm512_load_si512(kTransposeIdx.hi[h]);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i & d) continue;
      const __m512i a = r[i], b = r[i + d];
      r[i] = _mm512_permutex2var_epi32(a, lo, b);
      r[i + d] = _mm512_permutex2var_epi32(a, hi, b);
    }
  }
}

// A super-block's scales of 16 rows, lane r = row r.
struct Header {
  __m512i scale[8];  // the sub-block's 6-bit scale (high word zero: vpdpwssd ignores it)
  __m512i min2[8];   // the sub-block's 6-bit min in both words (pairs of 16-value bsums)
  __m512 d, neg_dmin;
};
// One super-block of 16 rows, lane r = row r.
struct Decoded : Header {
  __m512i code[8][8];  // [sub-block][values 4g..4g+3]: four codes, one byte each
};

STRATA_INLINE __m512i Byte(__m512i v, int shift, int mask) {
  return _mm512_and_si512(_mm512_srli_epi32(v, shift), _mm512_set1_epi32(mask));
}

// The 16 rows' header dwords (d | dmin << 16, then the 12 packed scale bytes u0, u1, u2),
// lane r = row r, into scales, mins and the two float factors.
STRATA_INLINE void DecodeHeader(__m512i hdr, __m512i u0, __m512i u1, __m512i u2, Header& w) {
  // Sub-block j < 4: scale = byte j of u0, min = byte j of u1 (low 6 bits). j = 4 + k: the
  // low nibble (scale) or high nibble (min) of byte k of u2, with the top two bits of byte k
  // of u0 (scale) or u1 (min) above it.
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    w.scale[k] = Byte(u0, 8 * k, 63);
    const __m512i m = Byte(u1, 8 * k, 63);
    w.min2[k] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
    w.scale[4 + k] =
        _mm512_or_si512(Byte(u2, 8 * k, 15), _mm512_slli_epi32(Byte(u0, 8 * k + 6, 3), 4));
    const __m512i mh =
        _mm512_or_si512(Byte(u2, 8 * k + 4, 15), _mm512_slli_epi32(Byte(u1, 8 * k + 6, 3), 4));
    w.min2[4 + k] = _mm512_or_si512(mh, _mm512_slli_epi32(mh, 16));
  }
  w.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
  w.neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(),
                             _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16))));
}

// Half h of the codes (qs bytes 64h..64h+63) with t[v] lane r = dword v of row r's half:
// values 4(v % 8)..+3 of sub-blocks 4h + 2(v / 8) (low nibbles) and + 1 (high nibbles).
STRATA_INLINE void SplitCodes(const __m512i* t, int h, Decoded& w) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    w.code[4 * h][g] = _mm512_and_si512(t[g], m4);
    w.code[4 * h + 1][g] = _mm512_and_si512(_mm512_srli_epi32(t[g], 4), m4);
    w.code[4 * h + 2][g] = _mm512_and_si512(t[8 + g], m4);
    w.code[4 * h + 3][g] = _mm512_and_si512(_mm512_srli_epi32(t[8 + g], 4), m4);
  }
}

// Row-major: `block` points at this super-block of the tile's first row; `off` (64-byte
// aligned) holds the 16 rows' byte offsets from it (ragged tiles repeat their last row).
STRATA_INLINE void Decode(const uint8_t* block, const int32_t* off, Decoded& w) {
  const __m512i offsets = _mm512_load_si512(off);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512i t[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) t[r] = _mm512_loadu_si512(block + off[r] + 16 + 64 * h);
    Transpose16(t);
    SplitCodes(t, h, w);
  }
  DecodeHeader(_mm512_i32gather_epi32(offsets, block, 1),
               _mm512_i32gather_epi32(offsets, block + 4, 1),
               _mm512_i32gather_epi32(offsets, block + 8, 1),
               _mm512_i32gather_epi32(offsets, block + 12, 1), w);
}

STRATA_INLINE __m512i Broadcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// sum[t] += sc * (codes . x[t]) over sub-block s, the codes as in Decoded::code[s]: four
// 4-value groups a 16-value half (whose sums fit the 16 bits vpdpwssd scales).
template <int T>
STRATA_INLINE void SubBlockDots(const __m512i* c, __m512i sc, const BlockQ8_K* const* x, int s,
                                __m512i* sum) {
  const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const int8_t* q = x[t]->qs + 32 * s;
    __m512i lo = _mm512_dpbusd_epi32(zero, c[0], Broadcast4(q));
    __m512i hi = _mm512_dpbusd_epi32(zero, c[4], Broadcast4(q + 16));
#pragma GCC unroll 3
    for (int g = 1; g < 4; ++g) {
      lo = _mm512_dpbusd_epi32(lo, c[g], Broadcast4(q + 4 * g));
      hi = _mm512_dpbusd_epi32(hi, c[4 + g], Broadcast4(q + 16 + 4 * g));
    }
    sum[t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sum[t], lo, sc), hi, sc);
  }
}

// acc[t] += d * dx * sum[t] - dmin * dx * (mins . bsums): the super-block's two float steps,
// the only ones, so both layouts give a token the same bits.
template <int T>
STRATA_INLINE void Finish(const Header& w, const BlockQ8_K* const* x, const __m512i* sum,
                          __m512* acc) {
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    __m512i m = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s)
      m = _mm512_dpwssd_epi32(m, w.min2[s], Broadcast4(x[t]->bsums + 2 * s));
    const __m512 dx = _mm512_set1_ps(x[t]->d);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_mul_ps(w.d, dx), acc[t]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(w.neg_dmin, dx), acc[t]);
  }
}

// acc[t] (lane = row) += this super-block's dot for T tokens; x[t] is token t's Q8_K block.
template <int T>
STRATA_INLINE void DotTokens(const Decoded& w, const BlockQ8_K* const* x, __m512* acc) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i sum[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) sum[t] = zero;
#pragma GCC unroll 1
  for (int s = 0; s < 8; ++s) SubBlockDots<T>(w.code[s], w.scale[s], x, s, sum);
  Finish<T>(w, x, sum, acc);
}

template <int T>
STRATA_INLINE void DotTokensUpTo(int nt, const Decoded& w, const BlockQ8_K* const* x, __m512* acc) {
  if constexpr (T > 1) {
    if (nt < T) return DotTokensUpTo<T - 1>(nt, w, x, acc);
  }
  DotTokens<T>(w, x, acc);
}

// kRows16: the codes go from the loaded vectors straight into the products, eight vectors
// (two sub-blocks) at a time, with no transpose and no Decoded in memory; the same integer
// sums and the same two float multiply-adds as DotTokens. Splitting the nibbles again for
// every kFusedTokens tokens costs less than storing and reloading a Decoded: from 8 to 512
// tokens this ran as fast or faster than decoding once per super-block.
template <int T>
STRATA_INLINE void DotRows16(const __m512i* v, const BlockQ8_K* const* x, __m512* acc,
                             Ahead ahead) {
  PrefetchAhead(v, 0, 4, ahead);
  Header hd;
  DecodeHeader(_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
               _mm512_load_si512(v + 3), hd);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512i sum[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) sum[t] = zero;
#pragma GCC unroll 1
  for (int p = 0; p < 4; ++p) {
    // Vectors 4 + 8p .. +7: low nibbles sub-block 2p, high nibbles 2p + 1.
    __m512i raw[8];
    PrefetchAhead(v, 4 + 8 * p, 8, ahead);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) raw[g] = _mm512_load_si512(v + 4 + 8 * p + g);
#pragma GCC unroll 2
    for (int nib = 0; nib < 2; ++nib) {
      const int s = 2 * p + nib;
      __m512i c[8];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g)
        c[g] = _mm512_and_si512(nib ? _mm512_srli_epi32(raw[g], 4) : raw[g], m4);
      SubBlockDots<T>(c, hd.scale[s], x, s, sum);
    }
  }
  Finish<T>(hd, x, sum, acc);
}

template <int T>
STRATA_INLINE void DotRows16UpTo(int nt, const __m512i* v, const BlockQ8_K* const* x, __m512* acc,
                                 Ahead ahead) {
  if constexpr (T > 1) {
    if (nt < T) return DotRows16UpTo<T - 1>(nt, v, x, acc, ahead);
  }
  DotRows16<T>(v, x, acc, ahead);
}

// Bytes of one super-block of a 16-row tile (both layouts hold the same bytes).
constexpr int64_t kTileBlockBytes = kRows * int64_t{sizeof(BlockQ4_K)};

template <bool kRows16Layout>
void MatmulRowsInLanes(const MatmulArgs& a, int64_t rb, int64_t re) {
  const int64_t n_sb = a.k / kQK_K;
  // The values-in-lanes driver's slices of k: each slice's sums are added to y in turn.
  const int64_t slice = Avx512Q4_KSliceGroups(n_sb);
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const uint8_t* xq = static_cast<const uint8_t*>(a.xq);
  const Ahead ahead = Rows16Ahead(a.n_tok, n_sb * int64_t{sizeof(BlockQ8_K)});
  // One accumulator vector per token for the 16 rows in flight; kept by the thread.
  struct Lanes {
    __m512 v;
  };
  static thread_local std::vector<Lanes> lanes;
  if (lanes.size() < static_cast<size_t>(a.n_tok)) lanes.resize(static_cast<size_t>(a.n_tok));
  __m512* const acc = &lanes.data()->v;
  // kRows16 tiles start at multiples of 16 rows; a row-major tile starts where asked.
  const int64_t first = kRows16Layout ? rb / kRows * kRows : rb;
  for (int64_t r0 = first; r0 < re; r0 += kRows) {
    const int lo = static_cast<int>(std::max<int64_t>(rb - r0, 0));
    const int nr = static_cast<int>(std::min<int64_t>(kRows, re - r0));
    const __mmask16 valid = static_cast<__mmask16>(((1u << nr) - 1) & ~((1u << lo) - 1));
    alignas(64) int32_t off[kRows];
    const uint8_t* tile;
    if constexpr (kRows16Layout) {
      tile = w + r0 / kRows * n_sb * kTileBlockBytes;
    } else {
      for (int r = 0; r < kRows; ++r)
        off[r] = static_cast<int32_t>(std::min(r, nr - 1) * a.w_row_bytes);
      tile = w + r0 * a.w_row_bytes;
    }
    for (int64_t sb0 = 0; sb0 < n_sb; sb0 += slice) {
      for (int64_t t = 0; t < a.n_tok; ++t) acc[t] = _mm512_setzero_ps();
      for (int64_t sb = sb0; sb < std::min(n_sb, sb0 + slice); ++sb) {
        const BlockQ8_K* x[kTokens];
        if constexpr (kRows16Layout) {
          const uint8_t* blk = tile + sb * kTileBlockBytes;
          for (int64_t t0 = 0; t0 < a.n_tok; t0 += kFusedTokens) {
            const int nt = static_cast<int>(std::min<int64_t>(kFusedTokens, a.n_tok - t0));
            for (int t = 0; t < nt; ++t)
              x[t] = reinterpret_cast<const BlockQ8_K*>(xq + (t0 + t) * a.xq_row_bytes) + sb;
            DotRows16UpTo<kFusedTokens>(nt, reinterpret_cast<const __m512i*>(blk), x, acc + t0,
                                        ahead);
          }
        } else {
          Decoded dec;
          Decode(tile + sb * int64_t{sizeof(BlockQ4_K)}, off, dec);
          for (int64_t t0 = 0; t0 < a.n_tok; t0 += kTokens) {
            const int nt = static_cast<int>(std::min<int64_t>(kTokens, a.n_tok - t0));
            for (int t = 0; t < nt; ++t)
              x[t] = reinterpret_cast<const BlockQ8_K*>(xq + (t0 + t) * a.xq_row_bytes) + sb;
            DotTokensUpTo<kTokens>(nt, dec, x, acc + t0);
          }
        }
      }
      for (int64_t t = 0; t < a.n_tok; ++t) {
        float* y = a.y + t * a.y_stride + r0;
        const __m512 prev = sb0 > 0 ? _mm512_maskz_loadu_ps(valid, y) : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(y, valid, sb0 > 0 ? _mm512_add_ps(prev, acc[t]) : acc[t]);
      }
    }
  }
}

}  // namespace

void Avx512MatmulQ4_K(const MatmulArgs& a, int64_t rb, int64_t re) {
  if (a.n_tok < kMinTokens) return Avx512MatmulQ4_KValuesInLanes(a, rb, re);
  MatmulRowsInLanes<false>(a, rb, re);
}

void Avx512MatmulQ4_KRows16(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulRowsInLanes<true>(a, rb, re);
}

}  // namespace strata::kernels::cpu
