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

// The same eight scales and eight mins as four little-endian words (bytes: scales 0..7, then
// mins 0..7), computed with word-wide bit operations for the SIMD decoders, which can move
// them into a vector register without a store/reload.
[[maybe_unused]] inline void Q4KScalesMinsWords(const uint8_t* s, uint32_t out[4]) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, s, 4);
  std::memcpy(&u1, s + 4, 4);
  std::memcpy(&u2, s + 8, 4);
  out[0] = u0 & 0x3f3f3f3fu;
  out[1] = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
  out[2] = u1 & 0x3f3f3f3fu;
  out[3] = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
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

}  // namespace
}  // namespace strata::kernels::cpu
