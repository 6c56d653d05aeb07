// Entry points of the AVX2 kernel files, assembled into the table by avx2.cc (internal to
// kernels/cpu/). Callable only after CpuHasAvx2().
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

// The 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL.
void Avx2MatmulQuantized(const MatmulArgs& a, int64_t rb, int64_t re);
// The 256-value super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.
void Avx2MatmulSuperBlocks(const MatmulArgs& a, int64_t rb, int64_t re);
// F32, F16, BF16 weights with F32 activations.
void Avx2MatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx2ScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                       const float* x, int64_t n_x, float* y, int64_t y_stride);
void Avx2ScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride);
void Avx2ScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                      const float* x, int64_t n_x, float* y, int64_t y_stride);
void Avx2Attention(const AttentionArgs& a);

}  // namespace strata::kernels::cpu
