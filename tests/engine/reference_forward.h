// A deliberately plain forward pass for tests: weights dequantized to float once,
// double-precision accumulation, full causal softmax, RoPE from the formula. It shares no
// code with the engine's forward pass except the model binding and DequantizeRow, so the
// engine (tiling, threading, spans, online softmax, activation quantization) is checked
// against an independent computation.
#pragma once

#include <vector>

#include "runtime/model/model.h"

namespace strata::testing {

// Logits [n_tokens][n_vocab] for `tokens` at positions 0..n-1.
std::vector<std::vector<float>> ReferenceLogits(const Model& model,
                                                const std::vector<int32_t>& tokens);

}  // namespace strata::testing
