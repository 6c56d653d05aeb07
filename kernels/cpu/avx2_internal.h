// Entry points of the AVX2 kernel files, assembled into the table by avx2.cc (internal to
// kernels/cpu/). Callable only after CpuHasAvx2().
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

// Q4_0, Q4_1, Q8_0, Q4_K, Q6_K.
void Avx2MatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re);
// F32, F16, BF16 weights with F32 activations.
void Avx2MatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx2MatVecF16(const uint16_t* a, int64_t rows, int64_t cols, int64_t row_stride,
                   const float* x, float* y);
void Avx2Attention(const AttentionArgs& a);

}  // namespace strata::kernels::cpu
