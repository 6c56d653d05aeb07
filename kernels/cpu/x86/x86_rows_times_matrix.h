// x[n][k] times a[k][r] for both x86 ISAs (internal; included by avx2.cc and avx512.cc,
// each compiled with its own ISA flags, so everything has internal linkage). V is Avx2Vec or
// Avx512Vec: registers, lane masks, masked loads and stores, fused multiply-add.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {
namespace {

// NT rows of x share each load of a's row: NT independent chains of fused multiply-adds
// keep both FMA units busy, where one row alone waits on each add's latency.
template <class V, int NT>
STRATA_INLINE void RowsTimesColumns(const float* x, int64_t k, const float* a, int64_t r,
                                    typename V::Mask m, float* y) {
  typename V::F acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = V::Zero();
  for (int64_t i = 0; i < k; ++i) {
    const typename V::F ai = V::Load(a + i * r, m);
    for (int t = 0; t < NT; ++t) acc[t] = V::Fma(V::Broadcast(x[t * k + i]), ai, acc[t]);
  }
  for (int t = 0; t < NT; ++t) V::Store(y + t * r, m, acc[t]);
}

// The rows past the last full eight: NT of them, or fewer.
template <class V, int NT>
STRATA_INLINE void RowsTimesColumnsUpTo(int nt, const float* x, int64_t k, const float* a,
                                        int64_t r, typename V::Mask m, float* y) {
  if constexpr (NT > 0) {
    if (nt == NT) return RowsTimesColumns<V, NT>(x, k, a, r, m, y);
    RowsTimesColumnsUpTo<V, NT - 1>(nt, x, k, a, r, m, y);
  }
}

// Columns a vector at a time, the last masked; rows eight at a time. Each sum runs in order
// of i with one fused multiply-add a term: the scalar reference's bits.
template <class V>
void RowsTimesMatrixX86(const float* x, int64_t n, int64_t k, const float* a, int64_t r, float* y) {
  constexpr int kRows = 8;
  for (int64_t j = 0; j < r; j += V::kLanes) {
    const typename V::Mask m = V::FirstLanes(r - j);
    int64_t t = 0;
    for (; t + kRows <= n; t += kRows)
      RowsTimesColumns<V, kRows>(x + t * k, k, a + j, r, m, y + t * r + j);
    RowsTimesColumnsUpTo<V, kRows - 1>(int(n - t), x + t * k, k, a + j, r, m, y + t * r + j);
  }
}

}  // namespace
}  // namespace strata::kernels::cpu
