// Shared set-up for the kernel benchmarks: random weights of any type, spread over enough
// copies to defeat the caches when a "cold" (DRAM-bound) measurement is wanted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace strata::kernels::bench {

// 64-byte aligned, zero-initialised bytes.
struct AlignedBytes {
  explicit AlignedBytes(size_t n);
  uint8_t* data() { return p.get(); }
  const uint8_t* data() const { return p.get(); }
  size_t size;
  std::unique_ptr<uint8_t, void (*)(void*)> p;
};

// `copies` copies of a [rows][k] weight matrix of `type`, back to back.
struct WeightSet {
  // kRows16: every copy repacked (rows a multiple of 16).
  WeightSet(DType type, int64_t rows, int64_t k, int copies,
            WeightLayout layout = WeightLayout::kRowMajor);
  const uint8_t* copy(int i) const { return bytes.data() + static_cast<size_t>(i) * matrix_bytes; }
  DType type;
  int64_t rows, k;
  size_t row_bytes, matrix_bytes;
  int copies;
  WeightLayout layout;
  AlignedBytes bytes;
};

// How many copies make the set exceed the last-level cache several times over.
int ColdCopies(size_t matrix_bytes);

// Activations for n_tok tokens quantized for `wtype`.
std::vector<uint8_t> MakeActivations(DType wtype, int64_t n_tok, int64_t k, size_t* row_bytes);

// "avx512", "avx2", ... for every ISA this machine supports (scalar excluded when SIMD exists,
// unless STRATA_BENCH_SCALAR=1).
std::vector<Isa> BenchIsas();

}  // namespace strata::kernels::bench
