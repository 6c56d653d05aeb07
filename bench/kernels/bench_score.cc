// Low-rank key scoring (the disk KV policy's group prediction): n_q queries against the
// tiled summary (F16 or Q8) of an 8K context, per ISA, single thread. Reports summary bytes
// read per second and multiply-adds per second.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "bench_util.h"

namespace strata::kernels::bench {
namespace {

void BM_ScoreTiles(benchmark::State& state, ScoreType type, int64_t n_tokens, int64_t rank,
                   int64_t n_q, Isa isa) {
  ForceIsa(isa);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint8_t> tiles(size_t(n_tokens / kScoreTile * ScoreTileBytes(type, rank)));
  std::vector<float> row(static_cast<size_t>(rank));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (float& f : row) f = dist(rng);
    StoreScoreRow(type, row.data(), rank, t, tiles.data());
  }
  std::vector<float> x(static_cast<size_t>(n_q * rank)), y(static_cast<size_t>(n_q * n_tokens));
  for (float& f : x) f = dist(rng);
  for (auto _ : state) {
    ScoreTiles(type, tiles.data(), 0, n_tokens / kScoreTile, rank, x.data(), n_q, y.data(),
               n_tokens);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(tiles.size()) * state.iterations());
  state.counters["GMAC/s"] =
      benchmark::Counter(double(n_tokens * rank * n_q) * double(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}

int Register() {
  // SmolLM2-135M at sigma 4/8/16/32 (rank 48/24/12/6), its 9 query heads or their sum.
  for (ScoreType type : {ScoreType::kF16, ScoreType::kQ8, ScoreType::kQ4})
    for (int64_t rank : {6, 12, 24, 48})
      for (int64_t n_q : {1, 9})
        for (Isa isa : BenchIsas())
          benchmark::RegisterBenchmark((std::string("ScoreTiles/") +
                                        (type == ScoreType::kQ8   ? "q8"
                                         : type == ScoreType::kQ4 ? "q4"
                                                                  : "f16") +
                                        "/smollm2.8k/rank" + std::to_string(rank) + "/q" +
                                        std::to_string(n_q) + "/" + IsaName(isa))
                                           .c_str(),
                                       BM_ScoreTiles, type, 8192, rank, n_q, isa);
  return 0;
}

const int kRegistered = Register();

}  // namespace
}  // namespace strata::kernels::bench
