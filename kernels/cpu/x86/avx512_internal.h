// Entry points of the AVX-512 kernel files, assembled into the table by avx512.cc
// (internal to kernels/cpu/). Callable only after CpuHasAvx512().
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

void Avx512MatmulQ4_0(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ4_1(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ8_0(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ5_0(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ5_1(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulIQ4_NL(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ2_K(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ3_K(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ4_K(const MatmulArgs& a, int64_t rb, int64_t re);
// Q4_K's two layouts (avx512_matmul_q4k.cc picks by batch): values in the lanes through the
// shared driver (few tokens, where decoding 16 rows at once does not pay), and the slices of
// k that driver sums in, which the rows-in-lanes kernel follows so both give the same bits.
// Weights in the kRows16 layout (kernels.h), any number of tokens: Q4_K
// (avx512_matmul_q4k.cc), Q4_0, Q4_1, Q8_0 and Q6_K (avx512_matmul_rows16.cc).
void Avx512MatmulQ4_KRows16(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulRows16(const MatmulArgs& a, int64_t rb, int64_t re);
constexpr uint32_t kAvx512Rows16Types =
    1u << static_cast<uint32_t>(DType::kQ4_0) | 1u << static_cast<uint32_t>(DType::kQ4_1) |
    1u << static_cast<uint32_t>(DType::kQ8_0) | 1u << static_cast<uint32_t>(DType::kQ4_K) |
    1u << static_cast<uint32_t>(DType::kQ6_K);
void Avx512MatmulQ4_KValuesInLanes(const MatmulArgs& a, int64_t rb, int64_t re);
int64_t Avx512Q4_KSliceGroups(int64_t n_groups);
void Avx512MatmulQ5_K(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulQ6_K(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulIQ4_XS(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512MatmulFloat(const MatmulArgs& a, int64_t rb, int64_t re);
void Avx512ScoreTilesF16(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride);
void Avx512ScoreTilesQ8(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride);
void Avx512ScoreTilesQ4(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                        const float* x, int64_t n_x, float* y, int64_t y_stride);
void Avx512QuantizeActivations(DType weight, const float* x, int64_t n, void* out);
void Avx512Attention(const AttentionArgs& a);

}  // namespace strata::kernels::cpu
