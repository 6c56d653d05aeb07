// The scalar reference functions that make up ScalarKernels(), shared between the
// scalar_*.cc files (internal to kernels/).
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

void ScalarQuantizeActivations(DType weight, const float* x, int64_t n, void* out);
void ScalarDequantizeRow(DType t, const void* src, float* dst, int64_t n);
void ScalarMatmul(const MatmulArgs& a, int64_t row_begin, int64_t row_end);
void ScalarMatVecF16(const uint16_t* a, int64_t rows, int64_t cols, int64_t row_stride,
                     const float* x, float* y);
void ScalarAttention(const AttentionArgs& a);

}  // namespace strata::kernels::cpu
