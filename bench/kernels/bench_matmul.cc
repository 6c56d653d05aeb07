// Matmul benchmarks: GEMV (decode, n_tok = 1) in GB/s of weight bytes, against a plain
// streaming read of the same bytes, and GEMM (prefill) in GFLOP/s, per ISA, single thread
// (plus a 2-thread GEMV that splits rows the way the engine does).
//
// "cold" rotates through copies of the matrix totalling 256 MB so every byte comes from DRAM;
// "hot" reuses one matrix (L2/L3 resident for the small SmolLM2 shapes).
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>

#include "bench_util.h"

namespace strata::kernels::bench {
namespace {

struct Shape {
  DType type;
  int64_t rows, k;
  const char* what;
};

// SmolLM2-135M-Instruct (Q4_1 layers, Q8_0 output head), Llama-3.2-1B's FFN, a
// Llama-7B-like layer and the long rows of 1B and 8B FFN down projections (a decode's
// activation panel grows with the row: 12-28 KiB at 8192-14336 values).
const Shape kShapes[] = {
    {DType::kQ4_1, 576, 576, "smollm2.q_o"},      {DType::kQ4_1, 192, 576, "smollm2.k_v"},
    {DType::kQ4_1, 1536, 576, "smollm2.gate_up"}, {DType::kQ4_1, 576, 1536, "smollm2.down"},
    {DType::kQ8_0, 49152, 576, "smollm2.output"}, {DType::kQ4_0, 1536, 576, "q4_0.gate_up"},
    {DType::kQ4_K, 4096, 4096, "llama.q4_k"},     {DType::kQ6_K, 4096, 4096, "llama.q6_k"},
    {DType::kQ4_0, 8192, 2048, "l1b.gate_up"},    {DType::kQ4_K, 8192, 2048, "l1b.gate_up"},
    {DType::kQ8_0, 8192, 2048, "l1b.gate_up"},    {DType::kF16, 1536, 576, "f16.gate_up"},
    {DType::kBF16, 1536, 576, "bf16.gate_up"},    {DType::kF32, 576, 576, "f32.q_o"},
    {DType::kQ4_K, 14336, 4096, "l8b.gate_up"},   {DType::kQ6_K, 4096, 14336, "l8b.down"},
    {DType::kQ6_K, 2048, 8192, "l1b.down"},       {DType::kQ8_0, 2048, 8192, "l1b.down"},
    {DType::kQ4_K, 4096, 14336, "l8b.down"},      {DType::kQ4_0, 4096, 14336, "l8b.down"},
    {DType::kQ4_K, 3072, 3072, "l3b.q_o"},        {DType::kQ4_K, 8192, 3072, "l3b.gate_up"},
    {DType::kQ4_K, 3072, 8192, "l3b.down"},       {DType::kQ6_K, 16384, 2048, "l1b.head_part"},
};

// Reads `n` bytes with wide independent accumulators, prefetching as far ahead as the
// decode kernels do: the ceiling a GEMV can reach.
uint64_t StreamRead(const uint8_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  size_t i = 0;
  for (; i + 8 <= n / 8; i += 8) {
    __builtin_prefetch(reinterpret_cast<const char*>(q + i) + kMatmulPrefetchBytes);
    a += q[i] ^ q[i + 4];
    b += q[i + 1] ^ q[i + 5];
    c += q[i + 2] ^ q[i + 6];
    d += q[i + 3] ^ q[i + 7];
  }
  return a + b + c + d;
}

void BM_StreamRead(benchmark::State& state, size_t matrix_bytes) {
  const int copies = ColdCopies(matrix_bytes);
  static std::unique_ptr<AlignedBytes> shared;  // built by thread 0, read by all
  if (state.thread_index() == 0) {
    shared = std::make_unique<AlignedBytes>(matrix_bytes * copies);
    std::memset(shared->data(), 1, shared->size);
  }
  // Each thread reads its share of every matrix, like the GEMV's row split.
  const size_t part = matrix_bytes / static_cast<size_t>(state.threads()) / 64 * 64;
  const size_t off = part * static_cast<size_t>(state.thread_index());
  int i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        StreamRead(shared->data() + static_cast<size_t>(i) * matrix_bytes + off, part));
    i = (i + 1) % copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * part));
  // Summed over threads and divided by the run's time: the machine-wide read rate.
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(part) / 1e9,
                         benchmark::Counter::kIsRate);
}

MatmulArgs ArgsFor(const WeightSet& w, int copy, const uint8_t* xq, size_t xq_row_bytes,
                   int64_t n_tok, float* y) {
  MatmulArgs a{};
  a.wtype = w.type;
  a.w = w.copy(copy);
  a.w_row_bytes = w.row_bytes;
  a.k = w.k;
  a.xq = xq;
  a.xq_row_bytes = xq_row_bytes;
  a.n_tok = n_tok;
  a.y = y;
  a.y_stride = w.rows;
  a.w_layout = w.layout;
  return a;
}

void BM_Gemv(benchmark::State& state, Shape s, Isa isa, bool cold, WeightLayout layout) {
  ForceIsa(isa);
  const size_t matrix_bytes = RowBytes(s.type, s.k) * s.rows;
  const int copies = cold ? ColdCopies(matrix_bytes) : 1;
  // One weight set shared by the benchmark's threads; built by thread 0.
  static std::unique_ptr<WeightSet> shared;
  if (state.thread_index() == 0)
    shared = std::make_unique<WeightSet>(s.type, s.rows, s.k, copies, layout);
  size_t xrb;
  std::vector<uint8_t> xq = MakeActivations(s.type, 1, s.k, &xrb);
  std::vector<float> y(s.rows);
  // Rows split in multiples of kMatmulRowAlign, as the engine's thread pool does.
  const int64_t per =
      (s.rows / state.threads() + kMatmulRowAlign - 1) / kMatmulRowAlign * kMatmulRowAlign;
  const int64_t rb = std::min<int64_t>(s.rows, per * state.thread_index());
  const int64_t re = std::min<int64_t>(s.rows, rb + per);
  int i = 0;
  for (auto _ : state) {
    Matmul(ArgsFor(*shared, i, xq.data(), xrb, 1, y.data()), rb, re);
    benchmark::ClobberMemory();
    i = (i + 1) % copies;
  }
  const double bytes = static_cast<double>(RowBytes(s.type, s.k) * (re - rb));
  state.SetBytesProcessed(static_cast<int64_t>(double(state.iterations()) * bytes));
  // Summed over threads and divided by the run's time: the machine-wide weight rate.
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * bytes / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_Gemm(benchmark::State& state, Shape s, Isa isa, int64_t n_tok, WeightLayout layout) {
  ForceIsa(isa);
  WeightSet w(s.type, s.rows, s.k, 1, layout);
  size_t xrb;
  std::vector<uint8_t> xq = MakeActivations(s.type, n_tok, s.k, &xrb);
  std::vector<float> y(s.rows * n_tok);
  for (auto _ : state) {
    Matmul(ArgsFor(w, 0, xq.data(), xrb, n_tok, y.data()), 0, s.rows);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * double(s.rows) * double(s.k) * double(n_tok) * double(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

// The file's layout, and the repacked one where the type and the ISA have a kernel for it
// (elsewhere kRows16 is unpacked to the row-major kernel: nothing to measure).
std::vector<WeightLayout> Layouts(DType t, Isa isa) {
  if (!Rows16Supported(t) || isa != Isa::kAvx512) return {WeightLayout::kRowMajor};
  return {WeightLayout::kRowMajor, WeightLayout::kRows16};
}
const char* LayoutTag(WeightLayout l) { return l == WeightLayout::kRows16 ? "+rows16" : ""; }

int Register() {
  for (const Shape& s : kShapes) {
    const size_t bytes = RowBytes(s.type, s.k) * s.rows;
    const std::string tag = std::string(TypeName(s.type)) + "/" + s.what + "/" +
                            std::to_string(s.rows) + "x" + std::to_string(s.k);
    benchmark::RegisterBenchmark(("StreamRead/" + tag + "/cold").c_str(), BM_StreamRead, bytes);
    benchmark::RegisterBenchmark(("StreamRead/" + tag + "/cold").c_str(), BM_StreamRead, bytes)
        ->UseRealTime()
        ->Threads(2);
    for (Isa isa : BenchIsas()) {
      for (WeightLayout layout : Layouts(s.type, isa)) {
        const std::string name = "Gemv/" + tag + "/" + IsaName(isa) + LayoutTag(layout);
        for (bool cold : {false, true}) {
          // Single-threaded runs report CPU time, so a core shared with other processes does
          // not distort them; the 2-thread run needs wall time.
          benchmark::RegisterBenchmark((name + (cold ? "/cold" : "/hot")).c_str(), BM_Gemv, s, isa,
                                       cold, layout);
          if (cold) {
            benchmark::RegisterBenchmark((name + "/cold").c_str(), BM_Gemv, s, isa, cold, layout)
                ->UseRealTime()
                ->Threads(2);
          }
        }
      }
    }
  }
  const Shape gemm_shapes[] = {kShapes[2],  kShapes[3],  kShapes[4],  kShapes[5],
                               kShapes[6],  kShapes[7],  kShapes[8],  kShapes[9],
                               kShapes[10], kShapes[11], kShapes[14], kShapes[15]};
  for (const Shape& s : gemm_shapes) {
    const int64_t rows = s.rows > 16384 ? 8192 : s.rows;  // the output head is a GEMV in use
    for (Isa isa : BenchIsas()) {
      // 2..8: beam-search groups and batched decode, where a ragged last tile costs most.
      for (int64_t n_tok : {2, 3, 5, 7, 8, 16, 64, 512}) {
        const bool large = s.rows * s.k > 32 * 1024 * 1024;  // weights past the L3 of most CPUs
        if (s.k >= 4096 && !large && (n_tok == 512 || n_tok < 8)) continue;
        if (large && n_tok < 64) continue;
        for (WeightLayout layout : Layouts(s.type, isa)) {
          const std::string name = std::string("Gemm/") + TypeName(s.type) + "/" + s.what + "/" +
                                   std::to_string(rows) + "x" + std::to_string(s.k) + "/" +
                                   IsaName(isa) + LayoutTag(layout) +
                                   "/n_tok:" + std::to_string(n_tok);
          benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, Shape{s.type, rows, s.k, s.what}, isa,
                                       n_tok, layout);
        }
      }
    }
  }
  return 0;
}

const int kRegistered = Register();

}  // namespace
}  // namespace strata::kernels::bench
