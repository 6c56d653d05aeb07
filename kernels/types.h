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
  kBF16 = 30,
};

struct TypeInfo {
  DType type;
  const char* name;       // "Q4_1", as GGUF tools print it
  int32_t block_elems;    // values per block (1 for float types)
  int32_t block_bytes;    // bytes per block
  bool weight_supported;  // Matmul accepts it as a weight type
};

// nullptr when `raw` is not a type id this build knows (the GGUF reader reports it).
const TypeInfo* FindTypeInfo(uint32_t raw);
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
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // 8-bit sub-block scales (16 values each)
  uint16_t d;         // F16 super-block scale
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sums of each group of 16 qs
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

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
