// Synthetic models: tiny random Llama / Qwen2 / Qwen3 GGUF files with a small trained
// vocabulary, so engine, KV and tuner tests run without the real model.
//
// Deterministic: the same spec (seed included) gives byte-identical files. Weights are
// uniform random in [-1/sqrt(cols), 1/sqrt(cols)] (norms near 1), quantized types get
// random quants with finite scales of the same magnitude. The vocabulary is byte-level BPE
// ("gpt2", SmolLM2-like specials and a ChatML template) or SentencePiece ("llama", Llama 2
// specials, <0xXX> byte tokens, an [INST] template), with merges learned from a built-in
// English paragraph up to n_vocab. For tests and tools only; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "kernels/types.h"
#include "runtime/model/gguf_writer.h"

namespace strata {

struct SyntheticModelSpec {
  std::string arch = "llama";  // "llama", "qwen2" (Q/K/V biases), "qwen3" (Q/K norms)
  int32_t n_vocab = 384;       // >= 259 for "gpt2", >= 262 for "llama"
  int32_t n_embd = 64;
  int32_t n_layer = 2;
  int32_t n_head = 4;
  int32_t n_head_kv = 2;
  int32_t head_dim = 0;  // 0: n_embd / n_head (key_length is written when set)
  int32_t n_ff = 128;
  int32_t n_ctx_train = 512;
  float rms_eps = 1e-5f;
  float rope_base = 10000.f;
  int32_t rope_dim = 0;            // 0: head_dim
  float rope_linear_factor = 0.f;  // > 0 writes rope.scaling.type "linear" and the factor
  float rope_yarn_factor = 0.f;    // > 0 writes rope.scaling.type "yarn", the factor and
  int32_t rope_yarn_orig_ctx = 0;  // original_context_length (when > 0)
  bool rope_freqs = false;         // writes rope_freqs.weight (Llama 3.1 style factors)
  bool tied_output = false;        // no output.weight
  kernels::DType weight_type = kernels::DType::kF32;  // attention and FFN matrices
  kernels::DType embd_type = kernels::DType::kF32;    // token_embd.weight
  kernels::DType output_type = kernels::DType::kF32;  // output.weight
  std::string tokenizer = "gpt2";                     // "gpt2" or "llama"
  std::string pre = "smollm";                         // tokenizer.ggml.pre for "gpt2"
  uint64_t seed = 1;
};

// Adds the metadata, vocabulary and tensors of `spec` to an empty writer.
Status BuildSyntheticModel(const SyntheticModelSpec& spec, GgufWriter* writer);
// The same file written to `path`, each tensor made as it is written: the writer holds one
// tensor at a time, so models larger than memory can be written.
Status WriteSyntheticModel(const SyntheticModelSpec& spec, const std::string& path);

// The text the synthetic vocabularies are trained on (encodes to few tokens).
const char* SyntheticTrainingText();

}  // namespace strata
