// Element types of weights and activations, and their block layouts.
//
// The numeric values of DType are GGML's type ids as they appear in GGUF files, so a
// tensor's type field converts directly. Block layouts follow the GGUF format's published
// definitions (a block of 32 or 256 values with its scale(s)). Pure data; no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace strata::kernels {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

struct TypeInfo {
  DType type;
  const char* name;       // "Q4_1", as GGUF tools print it
  int32_t block_elems;    // values per block (1 for float types)
  int32_t block_bytes;    // bytes per block
  bool weight_supported;  // Matmul accepts it as a weight type
};

// nullptr when `raw` is not a type id this build knows (the GGUF reader reports it).
// Known is not the same as runnable: the table also names the published GGUF types that
// Strata has no kernels for (weight_supported false), so that errors can name them.
const TypeInfo* FindTypeInfo(uint32_t raw);
// Every known type, in ascending id order (a range; the header stays C++17 for nvcc).
struct TypeRange {
  const TypeInfo* first;
  const TypeInfo* last;
  const TypeInfo* begin() const { return first; }
  const TypeInfo* end() const { return last; }
  size_t size() const { return static_cast<size_t>(last - first); }
};
TypeRange KnownTypes();
const TypeInfo& GetTypeInfo(DType t);
inline const char* TypeName(DType t) { return GetTypeInfo(t).name; }
// Bytes taken by `n` values of type t; n must be a multiple of the block size.
size_t RowBytes(DType t, int64_t n);

constexpr int kQK = 32;     // values per block of the *_0/*_1 formats
constexpr int kQK_K = 256;  // values per super-block of the K formats

struct BlockQ4_0 {
  uint16_t d;      // F16 scale
  uint8_t qs[16];  // value i in low nibble of qs[i], value i+16 in high nibble; w = d*(q-8)
};
struct BlockQ4_1 {
  uint16_t d;      // F16 scale
  uint16_t m;      // F16 min; w = d*q + m
  uint8_t qs[16];  // nibble layout as Q4_0
};
struct BlockQ5_0 {
  uint16_t d;      // F16 scale; w = d*(q-16)
  uint8_t qh[4];   // bit i (little-endian 32-bit word) is the 5th bit of value i
  uint8_t qs[16];  // low 4 bits, nibble layout as Q4_0
};
struct BlockQ5_1 {
  uint16_t d;      // F16 scale
  uint16_t m;      // F16 min; w = d*q + m
  uint8_t qh[4];   // as Q5_0
  uint8_t qs[16];  // as Q5_0
};
// IQ4_NL: Q4_0's layout, but the 4-bit codes index a fixed non-uniform grid (kIQ4Grid).
struct BlockIQ4_NL {
  uint16_t d;      // F16 scale; w = d*kIQ4Grid[code]
  uint8_t qs[16];  // nibble layout as Q4_0
};
struct BlockQ8_0 {
  uint16_t d;  // F16 scale; w = d*q
  int8_t qs[32];
};
struct BlockQ8_1 {
  uint16_t d;  // F16 scale
  uint16_t s;  // F16 of d * sum(qs), used by the *_1 weight formats' min term
  int8_t qs[32];
};
struct BlockQ4_K {
  uint16_t d;          // F16 super-block scale of the 6-bit sub-block scales
  uint16_t dmin;       // F16 super-block scale of the 6-bit sub-block mins
  uint8_t scales[12];  // 8 scales + 8 mins, 6 bits each, packed
  uint8_t qs[128];     // 256 nibbles
};
// Q2_K: 16 sub-blocks of 16 values; w = d*sc*q - dmin*m with 4-bit sc and m per sub-block.
// Value 128h + 32s + l is bits 2s..2s+1 of qs[32h + l] (h 0..1, s 0..3, l 0..31).
struct BlockQ2_K {
  uint8_t scales[16];  // sub-block j: scale in the low nibble, min in the high nibble
  uint8_t qs[64];
  uint16_t d;     // F16 super-block scale of the sub-block scales
  uint16_t dmin;  // F16 super-block scale of the sub-block mins
};
// Q3_K: 16 sub-blocks of 16 values; w = d*(sc-32)*(q-4), q 0..7 with 6-bit sc.
// Value i's low two bits are placed as Q2_K's, its third bit is bit i/32 of hmask[i%32].
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];  // 16 6-bit scales: low nibbles in bytes 0..7, top bits in 8..11
  uint16_t d;          // F16 super-block scale
};
// Q5_K: Q4_K plus a fifth bit per value: bit j of qh[l] belongs to value 32j + l.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // packed as Q4_K's
  uint8_t qh[32];
  uint8_t qs[128];  // low 4 bits, nibbles placed as Q4_K's
};
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // 8-bit sub-block scales (16 values each)
  uint16_t d;         // F16 super-block scale
};
// IQ4_XS: 8 sub-blocks of 32 values with 6-bit signed scales; w = d*(ls-32)*kIQ4Grid[code].
// Sub-block j's codes are the nibbles of qs[16j..16j+15]: low ones values 0..15, high ones
// values 16..31 of the sub-block.
struct BlockIQ4_XS {
  uint16_t d;           // F16 super-block scale
  uint16_t scales_h;    // top two bits of ls for sub-block j at bits 2j..2j+1
  uint8_t scales_l[4];  // low four bits of ls: sub-block j in nibble j%2 of byte j/2
  uint8_t qs[128];
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sums of each group of 16 qs
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ8_K) == 292);

// The 16 values the IQ4_NL and IQ4_XS codes stand for (times the block's scale), as the
// GGUF format defines them: a grid denser near zero, where most weights are.
inline constexpr int8_t kIQ4Grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

// Portable IEEE half <-> float (round to nearest even). SIMD paths use F16C/NEON instead.
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
inline float BF16ToF32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace strata::kernels
