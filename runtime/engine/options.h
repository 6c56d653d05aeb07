// The settings an engine is made with and a generation runs with, as plain data: what
// strata.yaml (runtime/config) fills in and the engine reads. No behaviour here but the
// names of the GPU weight placements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/kv/kv_options.h"

namespace strata {

class CudaDevice;

struct SamplingParams {
  float temperature = 0.8f;     // 0 = greedy
  int32_t top_k = 40;           // 0 = off
  float top_p = 0.95f;          // 1 = off
  float min_p = 0.05f;          // 0 = off
  float repeat_penalty = 1.0f;  // 1 = off; >1 discourages repeats
  int32_t repeat_last_n = 64;   // tokens of history the penalty looks at
  uint64_t seed = 0;
};

struct GenerateParams {
  int32_t max_tokens = 128;  // new tokens at most; 0 = until the context is full
  SamplingParams sampling;
  std::vector<std::string> stop;  // generation ends before the first of these strings
  bool ignore_eos = false;
};

// Where a GPU reads the weights: auto (mapped on an integrated GPU), a copy in GPU memory, or
// in place from the model file's mapping pinned for the GPU.
enum class GpuWeights { kAuto, kDevice, kMapped };
const char* GpuWeightsName(GpuWeights w);
// "auto", "device", "mapped".
Status ParseGpuWeights(const std::string& text, GpuWeights* out);

// How the forward pass runs on a GPU (runtime/engine/forward_cuda.h).
struct CudaForwardOptions {
  bool batch_invariant = false;            // every batch through the batch-invariant path
  bool graphs = true;                      // capture decode steps (where the policy allows)
  GpuWeights weights = GpuWeights::kAuto;  // auto: mapped on an integrated GPU
};

struct EngineOptions {
  int32_t n_threads = 0;      // 0 = one per available core
  int32_t n_ctx = 0;          // 0 = the model's training context
  int32_t n_batch = 512;      // most tokens per forward pass (prefill is chunked by it)
  int32_t max_sequences = 1;  // sequences that may exist at once (batch decode, beams)
  // A token's logits do not depend on where its pass begins or how many tokens the pass
  // holds, to the bit (CPU): a one-token pass's attention is then not cut into parts by
  // context for the threads. A scorer that verifies a step together with the tokens
  // generated ahead of it needs this to give the scores it gives the step alone; decode at
  // batch 1 over a long context is slower with it.
  bool pass_invariant = false;
  // CPU: multiply Q4_0, Q4_1, Q8_0, Q4_K and Q6_K matrices from a copy repacked for the active
  // kernels where they have such a layout (Model::PrepareCpuWeights: AVX-512), about twice
  // the arithmetic rate of the file's layout; the same value up to float rounding (Q4_K:
  // the same bits), and either way a token's result does not depend on its batch. The copy
  // replaces the file's pages in resident memory but, unlike them, cannot be evicted under
  // memory pressure; false keeps the mapping.
  bool repack_weights = true;
  KvOptions kv;
  // >= 0: run the forward pass on this CUDA GPU (config key `device`, `--device`); the
  // engine opens it unless `cuda` is set. KV then lives in the GPU's memory (memory policy).
  int32_t cuda_device = -1;
  // An already open GPU (a policy passed to Create must keep its KV in its memory).
  std::shared_ptr<CudaDevice> cuda;
  // How the forward pass runs there (weight placement, decode graphs, batch invariance).
  CudaForwardOptions gpu;
};

}  // namespace strata
