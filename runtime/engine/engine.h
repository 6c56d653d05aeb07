// Engine: a model bound to a thread pool, a KV policy and a forward pass; runs batches of
// tokens for one or more sequences and generates text.
//
// An Engine belongs to one thread at a time (the caller's): every method runs the forward
// pass on that thread and the pool's workers. Several engines may share one Model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/forward_cuda.h"
#include "runtime/engine/options.h"
#include "runtime/engine/sampler.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "runtime/model/model.h"

namespace strata {

class CudaDevice;

Status ValidateEngineOptions(const EngineOptions& o, const HParams& hp);

enum class StopReason { kNone, kMaxTokens, kEndOfGeneration, kStopString, kCallback, kContextFull };
const char* StopReasonName(StopReason r);

// Called for each generated token with the text it completes: whole UTF-8 characters
// only, and text that might begin a stop string is held back until it is known not to.
// Return false to stop generating.
using TokenCallback = std::function<bool(int32_t token, std::string_view text)>;

// Counters of one Generate call (or summed, for Engine::totals()).
struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t decode_tokens = 0;  // tokens evaluated by decode passes (the last sampled is not)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double sample_seconds = 0;
  ForwardTimes forward;  // during this call
  KvCounters kv;         // the policy's counters at the end of the call
  int64_t peak_rss_bytes = 0;
};

struct GenerationRequest {
  SeqId seq = 0;                // a sequence of the engine's policy (usually empty)
  std::vector<int32_t> prompt;  // appended to the sequence before generating
  GenerateParams params;
  TokenCallback on_token;  // may be empty
  // Results.
  std::vector<int32_t> tokens;
  std::string text;
  StopReason stop_reason = StopReason::kNone;
};

class Engine {
 public:
  static Status Create(const Model& model, const EngineOptions& options,
                       std::unique_ptr<Engine>* out);
  // With a KV policy the caller built (options.kv is then ignored). The policy's shape must
  // match the model; its n_ctx becomes the engine's context length.
  static Status Create(const Model& model, const EngineOptions& options,
                       std::unique_ptr<KvPolicy> kv, std::unique_ptr<Engine>* out);
  ~Engine();

  const Model& model() const { return model_; }
  const EngineOptions& options() const { return options_; }
  KvPolicy& kv() { return *kv_; }
  const KvPolicy& kv() const { return *kv_; }
  ThreadPool& pool() { return *pool_; }

  Status NewSequence(SeqId* seq) { return kv_->AddSequence(seq); }
  Status RemoveSequence(SeqId seq) { return kv_->RemoveSequence(seq); }

  // One forward pass (at most n_batch tokens).
  Status Evaluate(const ForwardBatch& batch, std::vector<float>* logits);
  // Appends `tokens` to `seq` in passes of n_batch tokens. logits: the last token's row,
  // or every token's rows when all_logits (n_tokens x n_vocab).
  Status Prefill(SeqId seq, std::span<const int32_t> tokens, std::vector<float>* logits,
                 bool all_logits = false);
  // Generates for every request, decoding the sequences together (one batch per step).
  Status Generate(std::span<GenerationRequest> requests, GenerationStats* stats);

  const ForwardTimes& forward_times() const { return forward_->times(); }
  const ForwardPass& forward() const { return *forward_; }

 private:
  Engine(const Model& model, const EngineOptions& options);
  const Model& model_;
  EngineOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvPolicy> kv_;
  std::unique_ptr<ForwardPass> forward_;
};

// Peak resident set size of this process so far (bytes).
int64_t PeakRssBytes();
// Resident set size of this process now (bytes); 0 where /proc is not readable.
int64_t CurrentRssBytes();

}  // namespace strata
