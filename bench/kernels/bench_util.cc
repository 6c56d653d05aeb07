#include "bench_util.h"

#include <cstdlib>
#include <cstring>
#include <random>

namespace strata::kernels::bench {

AlignedBytes::AlignedBytes(size_t n)
    : size(n), p(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64)), std::free) {
  std::memset(p.get(), 0, n);
}

namespace {
size_t MatrixBytes(DType t, int64_t rows, int64_t k, WeightLayout l) {
  return l == WeightLayout::kRows16 ? Rows16Bytes(t, rows, k)
                                    : RowBytes(t, k) * static_cast<size_t>(rows);
}
}  // namespace

WeightSet::WeightSet(DType t, int64_t r, int64_t kk, int c, WeightLayout l)
    : type(t),
      rows(r),
      k(kk),
      row_bytes(RowBytes(t, kk)),
      matrix_bytes(MatrixBytes(t, r, kk, l)),
      copies(c),
      layout(l),
      bytes(MatrixBytes(t, r, kk, l) * static_cast<size_t>(c)) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<uint8_t> plain(row_bytes * static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    for (float& f : row) f = dist(rng);
    QuantizeRow(type, row.data(), plain.data() + static_cast<size_t>(i) * row_bytes, k);
  }
  if (layout == WeightLayout::kRows16) {
    RepackRows16(type, plain.data(), row_bytes, rows, k, bytes.data(), 0,
                 (rows + kRows16Tile - 1) / kRows16Tile);
  } else {
    std::memcpy(bytes.data(), plain.data(), plain.size());
  }
  for (int i = 1; i < copies; ++i)
    std::memcpy(bytes.data() + i * matrix_bytes, bytes.data(), matrix_bytes);
}

int ColdCopies(size_t matrix_bytes) {
  // 256 MB: eight times the 32 MB L3 of the EPYC these numbers were taken on.
  const size_t target = size_t{256} << 20;
  return static_cast<int>((target + matrix_bytes - 1) / matrix_bytes);
}

std::vector<uint8_t> MakeActivations(DType wtype, int64_t n_tok, int64_t k, size_t* row_bytes) {
  *row_bytes = RowBytes(ActivationType(wtype), k);
  std::vector<uint8_t> out(*row_bytes * static_cast<size_t>(n_tok));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(k));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (float& f : x) f = dist(rng);
    QuantizeActivations(wtype, x.data(), k, out.data() + static_cast<size_t>(t) * *row_bytes);
  }
  return out;
}

std::vector<Isa> BenchIsas() {
  std::vector<Isa> out;
  const char* s = std::getenv("STRATA_BENCH_SCALAR");
  const bool scalar = s != nullptr && *s == '1';
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kNeon, Isa::kScalar}) {
    if (!IsaSupported(isa)) continue;
    if (isa == Isa::kScalar && !out.empty() && !scalar) continue;
    out.push_back(isa);
  }
  return out;
}

}  // namespace strata::kernels::bench
