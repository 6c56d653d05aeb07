// The per-ISA function table behind the public kernels (kernels.h) and the entry points of
// each ISA's translation unit. Internal to kernels/ and its tests.
//
// Each ISA file (compiled with its own -m flags) fills a table starting from the scalar one
// and replaces what it accelerates, so a missing SIMD variant silently means "scalar", never
// a crash. The tables are immutable after construction; dispatch.cc picks one at start-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kernels.h"

namespace strata::kernels::cpu {

// The calling thread's activation panel for the x86 matmul driver: MatmulPanelBytes() bytes,
// 64-byte aligned, allocated by the thread's first call and kept while the thread lives
// (the engine's pool keeps its threads), one per thread whichever ISA's file asks.
//
// Its size is half the core's L2 (64 KiB to 1 MiB; 512 KiB where the size is unknown).
// Every panel of tokens walks all the thread's rows, so a matrix larger than the
// last-level cache streams from DRAM once per panel: a panel holding few tokens (64 KiB
// held 8 tokens of a 14336-wide Q6_K row) makes the prefill of such a matrix a stream bound
// by bandwidth, and half the L2 leaves the other half to the tile's weight rows.
int64_t MatmulPanelBytes();
// A token's panel larger than this sends decode's weight prefetches to L2 instead of L1
// (kMatmulPrefetchBytes): a quarter of the core's L1 data cache (32 KiB where unknown).
int64_t MatmulPrefetchToL2PanelBytes();
void* ThreadMatmulPanel();

struct KernelTable {
  Isa isa;
  const char* variant;  // human-readable detail, e.g. "neon+dotprod"
  void (*quantize_activations)(DType weight, const float* x, int64_t n, void* out);
  void (*matmul)(const MatmulArgs& a, int64_t row_begin, int64_t row_end);
  // Weights in the kRows16 layout, for the types whose bit (1 << DType) is set in
  // matmul_rows16_types; dispatch unpacks the others 16 rows at a time into the row-major
  // layout for `matmul`, which gives the same bits.
  void (*matmul_rows16)(const MatmulArgs& a, int64_t row_begin, int64_t row_end);
  uint32_t matmul_rows16_types;
  void (*dequantize_row)(DType t, const void* src, float* dst, int64_t n);
  void (*rms_norm)(const float* x, const float* weight, float* y, int64_t n, float eps);
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
  void (*add)(float* y, const float* x, int64_t n);
  // x = softmax(x); returns the log of the denominator, max(x) + log(sum(exp(x - max))).
  float (*softmax)(float* x, int64_t n);
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  void (*rows_times_matrix)(const float* x, int64_t n, int64_t k, const float* a, int64_t r,
                            float* y);
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  // n_rows rows of Q8_0 blocks (`stride` bytes apart, the first at `first`), row_values
  // values each (a multiple of 32), to F16: dst[r * row_values + i] = F16(d * q), rounded to
  // nearest even like f32_to_f16.
  void (*q8_0_rows_to_f16)(const uint8_t* first, int64_t stride, int32_t n_rows, int32_t row_values,
                           uint16_t* dst);
  void (*rope)(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_sin,
               RopeLayout layout);
  void (*attention)(const AttentionArgs& a);
  void (*score_tiles_f16)(const uint16_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                          const float* x, int64_t n_x, float* y, int64_t y_stride);
  void (*score_tiles_q8)(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride);
  void (*score_tiles_q4)(const uint8_t* tiles, int64_t tile_begin, int64_t tile_end, int64_t cols,
                         const float* x, int64_t n_x, float* y, int64_t y_stride);
};

// The reference: plain C++, every operation, every type.
const KernelTable& ScalarKernels();

// nullptr when the build does not contain the ISA. Callers check the CPU first: calling
// into a table the CPU cannot run is an illegal instruction.
const KernelTable* Avx2Kernels();
const KernelTable* Avx512Kernels();
// `dotprod` selects the SDOT (Armv8.2 dot product) matmul; false gives the plain-NEON path
// that every Armv8 CPU runs.
const KernelTable* NeonKernels(bool dotprod);

// CPU feature probes used by dispatch and by tests that want to reach a specific path.
bool CpuHasAvx2();
bool CpuHasAvx512();
bool CpuHasNeonDotprod();

// Every table this CPU and build can run, scalar first, both NEON flavours where they apply
// (tests and benchmarks reach each code path through these).
std::vector<const KernelTable*> RunnableTables();
// The table the public entry points use, and a switch for tests (not thread-safe with
// respect to running kernels, like ForceIsa).
const KernelTable* ActiveTable();
void SetActiveTable(const KernelTable* t);

// Keys per chunk of the attention kernels' online softmax. Part of the scratch size
// contract (AttentionScratchFloats), so every ISA uses the same value.
constexpr int kAttnChunk = 32;

}  // namespace strata::kernels::cpu
