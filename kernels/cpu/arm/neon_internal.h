// Entry points of the NEON kernel files, assembled into the tables by neon.cc (internal to
// kernels/cpu/).
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

// Every quantized weight format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K, IQ4_XS) with widening multiplies (every Armv8-A CPU).
void NeonMatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re);
// The same with SDOT; only after CpuHasNeonDotprod().
void NeonMatmulQuantizedDotprod(const MatmulArgs& a, int64_t rb, int64_t re);
void NeonMatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re);
void NeonScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                       const float* x, int64_t n_x, float* y, int64_t y_stride);
void NeonScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride);
void NeonScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride);
void NeonAttention(const AttentionArgs& a);

}  // namespace strata::kernels::cpu
