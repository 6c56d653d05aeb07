// The scalar reference functions that make up ScalarKernels(), shared between the
// scalar_*.cc files (internal to kernels/).
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

void ScalarQuantizeActivations(DType weight, const float* x, int64_t n, void* out);
void ScalarDequantizeRow(DType t, const void* src, float* dst, int64_t n);
void ScalarMatmul(const MatmulArgs& a, int64_t row_begin, int64_t row_end);
void ScalarScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride);
void ScalarScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride);
void ScalarScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride);
void ScalarAttention(const AttentionArgs& a);

}  // namespace strata::kernels::cpu
