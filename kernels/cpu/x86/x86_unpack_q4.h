// Q4 score tiles on x86 (internal to kernels/cpu/, included by the AVX2 and AVX-512 files):
// one dimension's 8 bytes to the 16 tokens' signed integers. SSE2 only, internal linkage.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace strata::kernels::cpu {
namespace {

// Low nibbles are tokens 0-7, high nibbles tokens 8-15, each stored as integer + 8.
inline __attribute__((always_inline)) __m128i UnpackQ4x16(const uint8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  return _mm_sub_epi8(_mm_unpacklo_epi64(lo, hi), _mm_set1_epi8(8));
}

}  // namespace
}  // namespace strata::kernels::cpu
