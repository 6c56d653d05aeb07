// Small helpers on the GGUF block layouts shared by the scalar reference and the SIMD
// variants (internal to kernels/). Everything here has internal linkage on purpose: the
// per-ISA files are compiled with different -m flags, and a shared out-of-line copy of an
// inline function could otherwise end up holding AVX-512 code that a scalar caller runs.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/types.h"

namespace strata::kernels::cpu {
namespace {

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block. The first four
// pairs sit in the low 6 bits of bytes 0..7; the last four keep their low nibbles in
// bytes 8..11 and their top two bits in the spare high bits of bytes 0..7.
[[maybe_unused]] inline void Q4KScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// All eight scales and mins of a Q4_K super-block at once.
[[maybe_unused]] inline void Q4KScalesMins(const uint8_t* s, uint8_t scales[8], uint8_t mins[8]) {
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    Q4KScaleMin(s, j, &sc, &mn);
    scales[j] = static_cast<uint8_t>(sc);
    mins[j] = static_cast<uint8_t>(mn);
  }
}

// Value i (0..255) of a Q6_K super-block as its unsigned 6-bit code (weight = d*sc*(q-32)).
// Each half of 128 values uses 64 bytes of ql (low nibbles for values l and l+32, high
// nibbles for l+64 and l+96) and 32 bytes of qh (2 bits for each of those four values).
[[maybe_unused]] inline int Q6KCode(const BlockQ6_K& b, int i) {
  const int half = i / 128, r = i % 128;
  const int quarter = r / 32, l = r % 32;
  const uint8_t ql = b.ql[64 * half + l + (quarter & 1) * 32];
  const int low = (quarter < 2) ? (ql & 0xF) : (ql >> 4);
  const int high = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
  return low | (high << 4);
}

// Unsigned 6-bit code (scale + 32) of sub-block j (0..15) of a Q3_K super-block: its low
// nibble is the low (j < 8) or high (j >= 8) nibble of byte j % 8, its top two bits are bits
// 2*(j/4)..+1 of byte 8 + j % 4.
[[maybe_unused]] inline int Q3KScaleCode(const uint8_t* s, int j) {
  const int low = (j < 8 ? s[j] : s[j - 8] >> 4) & 0xF;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | (high << 4);
}

// The same 16 codes as four little-endian words (byte j of the 16 = sub-block j), built with
// word-wide bit operations for the SIMD decoders.
[[maybe_unused]] inline void Q3KScaleCodesWords(const uint8_t* s, uint32_t out[4]) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, s, 4);
  std::memcpy(&u1, s + 4, 4);
  std::memcpy(&u2, s + 8, 4);
  out[0] = (u0 & 0x0f0f0f0fu) | ((u2 & 0x03030303u) << 4);
  out[1] = (u1 & 0x0f0f0f0fu) | (((u2 >> 2) & 0x03030303u) << 4);
  out[2] = ((u0 >> 4) & 0x0f0f0f0fu) | (((u2 >> 4) & 0x03030303u) << 4);
  out[3] = ((u1 >> 4) & 0x0f0f0f0fu) | (((u2 >> 6) & 0x03030303u) << 4);
}

// Value i (0..255) of a Q2_K or Q3_K super-block: its two low bits, bits 2s..2s+1 of
// qs[32h + l] for i = 128h + 32s + l.
[[maybe_unused]] inline int K2BitCode(const uint8_t* qs, int i) {
  return (qs[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
}

// Unsigned 6-bit code (scale + 32) of sub-block j (0..7) of an IQ4_XS super-block.
[[maybe_unused]] inline int IQ4XSScaleCode(const BlockIQ4_XS& b, int j) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

// The 5-bit codes (0..31) of a Q5_0 / Q5_1 block: value i's low four bits are placed as
// Q4_0's, its fifth is bit i of the little-endian qh word.
[[maybe_unused]] inline void Q5Codes(const uint8_t qh[4], const uint8_t qs[16], int q[32]) {
  for (int i = 0; i < 16; ++i) {
    q[i] = (qs[i] & 0xF) | (((qh[i / 8] >> (i % 8)) & 1) << 4);
    q[i + 16] = (qs[i] >> 4) | (((qh[2 + i / 8] >> (i % 8)) & 1) << 4);
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
