// Attention benchmarks: decode over 8K cached keys (GB/s of the K and V bytes one KV head
// reads) and a causal prefill block (GFLOP/s), per ISA, single thread.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"

namespace strata::kernels::bench {
namespace {

struct AttnShape {
  int head_dim, n_rep, n_kv_heads, n_keys, n_q, span_len;
  const char* what;
};

void BM_Attention(benchmark::State& state, AttnShape s, Isa isa) {
  ForceIsa(isa);
  const int stride = s.n_kv_heads * s.head_dim;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> k(static_cast<size_t>(s.n_keys) * stride), v(k.size());
  for (auto& h : k) h = F32ToF16(dist(rng));
  for (auto& h : v) h = F32ToF16(dist(rng));
  std::vector<KvSpan> spans;
  for (int p = 0; p < s.n_keys; p += s.span_len) {
    const int n = std::min(s.span_len, s.n_keys - p);
    spans.push_back({k.data() + static_cast<size_t>(p) * stride,
                     v.data() + static_cast<size_t>(p) * stride, n, p, stride});
  }
  std::vector<float> q(static_cast<size_t>(s.n_q) * s.n_rep * s.head_dim);
  for (float& f : q) f = dist(rng);
  std::vector<float> out(q.size()), scratch(AttentionScratchFloats(s.n_q, s.n_rep, s.head_dim));
  AttentionArgs a{q.data(),
                  s.n_q,
                  s.n_rep * s.head_dim,
                  s.n_keys - s.n_q,
                  s.n_rep,
                  s.head_dim,
                  0,
                  spans.data(),
                  static_cast<int32_t>(spans.size()),
                  1.f / std::sqrt(static_cast<float>(s.head_dim)),
                  out.data(),
                  s.n_rep * s.head_dim,
                  scratch.data()};
  for (auto _ : state) {
    AttentionOverSpans(a);
    benchmark::ClobberMemory();
  }
  const double kv_bytes = 2.0 * s.n_keys * s.head_dim * sizeof(uint16_t);
  state.SetBytesProcessed(static_cast<int64_t>(kv_bytes * double(state.iterations())));
  // Visible (query, key) pairs times 4 flops per dim (QK^T and PV multiply-adds).
  double pairs = 0;
  for (int t = 0; t < s.n_q; ++t) pairs += s.n_keys - s.n_q + t + 1;
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * pairs * s.n_rep * s.head_dim * double(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}

int Register() {
  const AttnShape shapes[] = {
      {64, 3, 3, 8192, 1, 8192, "decode.smollm2.8k.one_span"},
      {64, 3, 3, 8192, 1, 128, "decode.smollm2.8k.spans128"},
      // A disk KV view's groups (G = 4, 16), or a prefix tree's 16-token blocks.
      {64, 3, 3, 8192, 1, 4, "decode.smollm2.8k.spans4"},
      {64, 3, 3, 8192, 1, 16, "decode.smollm2.8k.spans16"},
      {128, 4, 8, 8192, 1, 8192, "decode.llama.8k"},
      {64, 3, 3, 512, 512, 512, "prefill.smollm2.512"},
      // A scorer model's pass over a prefix tree's 16-token blocks.
      {64, 3, 3, 512, 512, 16, "prefill.smollm2.512.spans16"},
      {128, 4, 8, 512, 64, 512, "prefill.llama.64of512"},
  };
  for (const AttnShape& s : shapes) {
    for (Isa isa : BenchIsas()) {
      benchmark::RegisterBenchmark(
          (std::string("Attention/") + s.what + "/D" + std::to_string(s.head_dim) + "/n_rep" +
           std::to_string(s.n_rep) + "/" + IsaName(isa))
              .c_str(),
          BM_Attention, s, isa);
    }
  }
  return 0;
}

const int kRegistered = Register();

}  // namespace
}  // namespace strata::kernels::bench
