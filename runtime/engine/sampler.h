// Sampler: picks the next token from a row of logits.
//
// The chain, in order: repetition penalty over the last `repeat_last_n` tokens, top-k,
// temperature, softmax, top-p (nucleus), min-p, then a draw from a seeded RNG. A
// temperature of 0 means greedy (argmax of the penalized logits; ties go to the lowest
// id). Deterministic for a given seed and inputs. One sampler per sequence; not
// thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/engine/options.h"

namespace strata {

// Range checks with messages that name the parameter, its value and the limit.
Status ValidateSamplingParams(const SamplingParams& p);

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);
  // `history`: the sequence's tokens so far (prompt and generated), for the penalty.
  int32_t Sample(const float* logits, std::span<const int32_t> history);
  // The probability the last Sample's distribution gave the chosen token (1 for greedy).
  float last_probability() const { return last_p_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  SamplingParams p_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<Candidate> cand_, top_;
  std::vector<float> probs_;
  float last_p_ = 1.f;
};

// Index of the largest value; ties go to the lowest index.
int32_t ArgMax(const float* x, int32_t n);

}  // namespace strata
