// Model: a GGUF file mapped into memory, its hyper-parameters, its weights bound to the
// tensors of the Llama family's layout, and its tokenizer.
//
// Loading validates everything the forward pass relies on (architecture, every tensor's
// presence, type and shape), so the engine can use the weights without further checks.
// A loaded Model is immutable and safe to share between threads and engines.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/gguf.h"
#include "runtime/model/tokenizer.h"

namespace strata {

class ThreadPool;

enum class Arch { kLlama, kQwen2, kQwen3 };

struct HParams {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // general.architecture
  std::string name;       // general.name, if present
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;  // <arch>.context_length
  int32_t n_embd = 0;
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;  // <arch>.attention.key_length, else n_embd / n_head
  int32_t n_ff = 0;
  float rms_eps = 1e-5f;
  // RoPE: theta_i = pos * freq_scale * rope_base^(-2i/rope_dim) / freq_factor_i.
  float rope_base = 10000.f;
  float rope_freq_scale = 1.f;  // 1/factor for linear and YaRN scaling
  // YaRN (rope.scaling.type "yarn"): dimensions that turn more than beta_fast times over the
  // original context keep their frequency, those turning fewer than beta_slow times are
  // interpolated by freq_scale, a linear ramp between; attention logits are scaled by
  // rope_attn_factor^2 (q and k each by (1 + 0.1 ln factor) * rope.scaling.attn_factor).
  bool rope_yarn = false;
  int32_t rope_orig_ctx = 0;  // rope.scaling.original_context_length (else context_length)
  float rope_yarn_beta_fast = 32.f;
  float rope_yarn_beta_slow = 1.f;
  float rope_attn_factor = 1.f;
  int32_t rope_dim = 0;  // dims rotated per head (<= head_dim)
  kernels::RopeLayout rope_layout = kernels::RopeLayout::kNormal;  // NeoX for qwen2/qwen3
  bool has_qk_norm = false;   // qwen3: RMSNorm on each Q and K head
  bool has_qkv_bias = false;  // qwen2: biases on Q, K, V
  bool tied_output = false;   // no output.weight: logits use token_embd

  int32_t n_rep() const { return n_head / n_head_kv; }
  // Bytes of K+V per token for all layers when stored as F16.
  int64_t kv_bytes_per_token_f16() const { return int64_t(n_layer) * 2 * n_head_kv * head_dim * 2; }
};

// A view of one tensor inside the mapped file. data == nullptr means "absent" for the
// optional tensors (biases, Q/K norms, rope frequency factors).
struct TensorRef {
  kernels::DType type = kernels::DType::kF32;
  const void* data = nullptr;
  int64_t cols = 0;      // ne[0]: the contiguous dimension (k of a matmul)
  int64_t rows = 1;      // ne[1] (product of the remaining dims)
  size_t row_bytes = 0;  // RowBytes(type, cols)
  // kRows16: `data` is the repacked copy (Model::cpu_weights), not the file's rows.
  kernels::WeightLayout layout = kernels::WeightLayout::kRowMajor;
  bool present() const { return data != nullptr; }
  const float* f32() const { return static_cast<const float*>(data); }
};

struct LayerWeights {
  TensorRef attn_norm;             // F32 [n_embd]
  TensorRef wq, wk, wv, wo;        // [n_head*hd, n_embd], [n_kv*hd, n_embd] x2, [n_embd, n_head*hd]
  TensorRef bq, bk, bv;            // optional F32 biases (qwen2)
  TensorRef q_norm, k_norm;        // optional F32 [head_dim] (qwen3)
  TensorRef ffn_norm;              // F32 [n_embd]
  TensorRef w_gate, w_up, w_down;  // [n_ff, n_embd] x2, [n_embd, n_ff]
};

struct ModelWeights {
  TensorRef tok_embd;     // [n_vocab, n_embd]
  TensorRef output_norm;  // F32 [n_embd]
  TensorRef output;       // [n_vocab, n_embd]; equals tok_embd when tied
  TensorRef rope_freqs;   // optional F32 [rope_dim/2] frequency factors (Llama 3.1)
  std::vector<LayerWeights> layers;
};

class Model {
 public:
  // Maps and validates `path`. Errors name the file and the offending field or tensor.
  static Status Load(const std::string& path, std::unique_ptr<Model>* out);
  // The same checks on a file already opened (GgufFile::FromMemory for fuzzing and tests);
  // the Model takes ownership.
  static Status FromGguf(std::unique_ptr<GgufFile> gguf, std::unique_ptr<Model>* out);
  ~Model();

  const std::string& path() const { return path_; }
  const HParams& hparams() const { return hparams_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& gguf() const { return *gguf_; }
  ChatTemplateKind chat_template() const { return chat_template_; }
  // The system prompt the model's template injects when a chat has none (SmolLM2's
  // "You are a helpful AI assistant named SmolLM, ..."); "" when it injects none. Pass it
  // as ApplyChatTemplate's default_system to reproduce the template exactly.
  const std::string& default_system_prompt() const { return default_system_prompt_; }
  // A stable 64-bit identity of the model (architecture, hyper-parameters, tensor table
  // and a sample of weight bytes) that side files (adapters) record so a mismatch is
  // caught at start-up. Printed as 16 hex digits by identity_hex(). FNV-1a 64 over a
  // versioned tag, the architecture name, the hyper-parameters, and for every tensor in
  // file order its name, type, shape and 64 bytes each from its start, middle and end.
  uint64_t identity() const { return identity_; }
  std::string identity_hex() const;
  // Total bytes of all weight tensors.
  uint64_t weight_bytes() const { return weight_bytes_; }

  // The weights as the CPU forward pass multiplies them: weights() until
  // PrepareCpuWeights ran; after it, the matrices whose type has a faster layout on this
  // CPU (kernels::Rows16Preferred: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K on AVX-512), a tied head and
  // embedding included, point at repacked copies; the same values up to float rounding
  // (kernels.h). The GPU backend reads weights().
  const ModelWeights& cpu_weights() const;
  // Repacks those matrices, once (later calls return at once; thread-safe), and drops the
  // file pages they were read from, so resident memory holds one copy of each weight: the
  // copies are anonymous memory the kernel can no longer evict and re-read from the file,
  // which is what the faster decode costs on a device short of memory. `pool` (may be
  // null) shares the work.
  Status PrepareCpuWeights(ThreadPool* pool) const;
  // Bytes of the repacked copies (0 before PrepareCpuWeights or when none was made).
  uint64_t repacked_bytes() const { return repacked_bytes_.load(std::memory_order_acquire); }

 private:
  Model() = default;
  std::string path_;
  HParams hparams_;
  ModelWeights weights_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplateKind chat_template_ = ChatTemplateKind::kNone;
  std::string default_system_prompt_;
  uint64_t identity_ = 0;
  uint64_t weight_bytes_ = 0;
  // PrepareCpuWeights: the weights with repacked matrices, and the memory holding them.
  mutable std::mutex repack_mu_;
  mutable std::unique_ptr<ModelWeights> cpu_weights_;
  mutable std::atomic<const ModelWeights*> cpu_view_{nullptr};
  mutable void* repacked_ = nullptr;
  mutable std::atomic<uint64_t> repacked_bytes_{0};
  mutable std::vector<float> cpu_vectors_;  // the F32 vectors cpu_weights() points at
};

}  // namespace strata
