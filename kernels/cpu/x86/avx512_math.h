// Vector math for the AVX-512 kernels (internal; only included by files compiled with the
// AVX-512 flags).
#pragma once

#include <immintrin.h>

#include "kernels/cpu/x86/avx512_common.h"

namespace strata::kernels::cpu {
namespace {

// e^x for 16 floats, relative error ~2e-7 over the float range. x = n ln2 + r with
// |r| <= ln2/2 (ln2 split in two parts so n*ln2 is exact enough), e^r by its degree-6
// Taylor polynomial (truncation error r^7/7! < 1.3e-7 at |r| = 0.347), then scaled by 2^n
// with vscalefps, which also produces 0 and inf at the ends of the range.
STRATA_INLINE __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));  // keeps -inf from turning into NaN
  x = _mm512_min_ps(x, _mm512_set1_ps(89.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace
}  // namespace strata::kernels::cpu
