// What the AVX-512 kRows16 kernels share (internal to kernels/cpu/; AVX-512 files only).
#pragma once

#include <xmmintrin.h>

#include <cstdint>
#include <cstdlib>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/x86/avx512_common.h"
#include "kernels/kernels.h"

namespace strata::kernels::cpu {
namespace {

// Decode streams each tile's bytes once: the vectors kMatmulPrefetchBytes ahead are asked
// for as the kernel loads each set of them, into L2 when the token's activations (reread by
// every tile) would not keep their place in L1. Asking for a block's lines all at once cost
// a tenth of the arithmetic rate from cache; spread over the loads, a few percent.
enum class Ahead { kNone, kL1, kL2 };

// Only a decode streams its weights once; a batch's reuse keeps them in cache.
STRATA_INLINE Ahead Rows16Ahead(int64_t n_tok, int64_t token_panel_bytes) {
  if (n_tok > 1) return Ahead::kNone;
  return token_panel_bytes > MatmulPrefetchToL2PanelBytes() ? Ahead::kL2 : Ahead::kL1;
}

// Prefetches the n vectors after v[first] + kMatmulPrefetchBytes.
STRATA_INLINE void PrefetchAhead(const __m512i* v, int first, int n, Ahead ahead) {
  if (ahead == Ahead::kNone) return;
  const char* p = reinterpret_cast<const char*>(v + first) + kMatmulPrefetchBytes;
  for (int i = 0; i < n; ++i) {
    if (ahead == Ahead::kL1) {
      _mm_prefetch(p + 64 * i, _MM_HINT_T0);
    } else {
      _mm_prefetch(p + 64 * i, _MM_HINT_T1);
    }
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
