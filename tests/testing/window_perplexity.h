// The quantity the perplexity fixtures of tests/golden/ hold for llama.cpp, computed on
// Strata's engine: a window of tokens prefilled as one sequence, every token after the first
// scored from the logits of the one before it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/engine/engine.h"

namespace strata::testing {

// The window's negative log-likelihood (natural log, summed over its tokens but the first)
// in *nll; the engine must hold a free sequence of the window's length.
inline ::testing::AssertionResult WindowNll(Engine& engine, std::span<const int32_t> tok,
                                            size_t n_vocab, double* nll) {
  SeqId seq;
  Status s = engine.NewSequence(&seq);
  if (!s.ok()) return ::testing::AssertionFailure() << s.ToString();
  std::vector<float> logits;
  s = engine.Prefill(seq, tok, &logits, true);
  if (Status r = engine.RemoveSequence(seq); s.ok()) s = r;
  if (!s.ok()) return ::testing::AssertionFailure() << s.ToString();
  *nll = 0;
  for (size_t i = 0; i + 1 < tok.size(); ++i) {
    const float* row = logits.data() + i * n_vocab;
    const float mx = *std::max_element(row, row + n_vocab);
    double z = 0;
    for (size_t v = 0; v < n_vocab; ++v) z += std::exp(double(row[v] - mx));
    *nll -= double(row[tok[i + 1]] - mx) - std::log(z);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
