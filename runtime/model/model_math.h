// The arithmetic of a Llama-family attention input that more than one part of the runtime
// applies: RoPE's frequencies and tables, and what follows the Q/K/V projections (biases,
// per-head Q/K norms, RoPE). The forward pass and the disk policy's group predictor (which
// projects queries of the next layer ahead of time) both call these, so the predictor's
// queries are the forward pass's by construction, not by keeping two copies in step.
#ifndef STRATA_RUNTIME_MODEL_MODEL_MATH_H_
#define STRATA_RUNTIME_MODEL_MODEL_MATH_H_

#include <cstdint>
#include <vector>

#include "runtime/model/model.h"

namespace strata {

// RoPE's inverse frequencies, one per rotated pair, with the model's scaling and frequency
// factors: theta_i(pos) = pos * inv_freq[i].
std::vector<float> RopeInverseFrequencies(const Model& model);
// The same from the hyperparameters and the optional per-pair factors (rope_dim / 2 values).
std::vector<float> RopeInverseFrequencies(const HParams& hp, const float* factors);

// The scale of the attention logits q.k: 1/sqrt(head_dim), times YaRN's attention factor
// squared (it scales q and k alike).
float AttentionScale(const HParams& hp);

// cos and sin of theta_i(pos) interleaved, rope_dim values, the table kernels::RopeApply
// takes. Angles in double: positions reach 10^5 and more.
void RopeCosSin(const std::vector<float>& inv_freq, int32_t pos, float* cos_sin);

// One token after its projections: adds the biases, normalizes each head of q and k where
// the model has Q/K norms, and rotates q and k by cos_sin. k and v may be null (a query
// alone, as the predictor makes).
void FinishQkv(const HParams& hp, const LayerWeights& L, const float* cos_sin, float* q, float* k,
               float* v);

}  // namespace strata

#endif  // STRATA_RUNTIME_MODEL_MODEL_MATH_H_
