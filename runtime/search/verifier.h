// Verifiers: how step-wise beam search scores a beam's newest step (higher is better).
//
//   MeanLogProbVerifier  the generator's own mean log-probability of the step's tokens
//   ModelVerifier        a second GGUF model (same vocabulary): its mean log-likelihood of
//                        the step given the prompt and the path, computed as a prefill over
//                        the step's tokens on top of the path it already holds (its own
//                        prefix tree, so a beam's children share their parent's KV)
//   CallbackVerifier     the application's function (the C API's scorer callback)
//
// The search calls Begin once, then ScoreStep once per step with every beam that generated
// in it, and Forget for beams that will never be extended (pruned, finished, or parents whose
// children were scored). Candidates come in a deterministic order; scores must depend only
// on a candidate, never on the others in the call, so results do not depend on scheduling.
// With speculation a candidate also carries the tokens its first child generated ahead:
// ModelVerifier runs them in the same pass as the step (its engine is pass-invariant, so the
// step's scores do not change) and the child's scoring starts after them.
//
// Threads: the search's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/tree/fast_tier.h"
#include "runtime/kv/tree/prefix_tree_kv.h"
#include "runtime/kv/tree/slow_tier.h"
#include "runtime/model/model.h"

namespace strata {

struct StepCandidate {
  uint64_t beam_id = 0;
  uint64_t parent_id = 0;  // the beam this one was forked from (the root for step 0)
  int32_t step = 0;        // 0-based
  std::span<const int32_t> prompt;
  std::span<const int32_t> path_tokens;  // generated before this step
  std::span<const int32_t> step_tokens;  // generated in this step (an ending EOS included)
  std::span<const float> step_logprobs;  // the generator's log p of each step token
  std::string_view text;                 // all generated text of the beam, this step's last
  bool final = false;                    // the beam ends with this step
  // Tokens the beam's first child already generated into the next step (speculative beam
  // extension), empty if none. A verifier may run them in this step's pass and take that
  // work over when the child's step, which begins with them, is scored; the scores must be
  // those it would give without them.
  std::span<const int32_t> ahead;
};

// Speculative tokens a verifier ran in their parent's scoring pass, and tokens whose scoring
// a child took over from there (every child whose step begins with them does).
struct VerifierAheadCounters {
  int64_t run = 0;
  int64_t reused = 0;
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  virtual const char* name() const = 0;
  // Before the first step; root_id is the parent_id of step 0's candidates.
  virtual Status Begin(std::span<const int32_t> prompt, uint64_t root_id);
  virtual Status ScoreStep(std::span<const StepCandidate> cands, std::vector<double>* scores) = 0;
  virtual void Forget(uint64_t beam_id);
  // After the search (also after a failure): drops all per-beam state.
  virtual void End();

  // A verifier that keeps KV of its own (a scorer model) can hold it in the search's tiers,
  // so that one fast-tier budget serves both models (beam_search.h, verifier_share).
  // Bytes of one block of block_tokens tokens aligned to `alignment`; 0: it keeps no KV.
  virtual uint64_t KvBlockBytes(int32_t block_tokens, uint32_t alignment) const;
  using SlowTierFactory = std::function<Status(uint64_t bytes, std::unique_ptr<SlowTier>*)>;
  // Before Begin. With `shared`, its KV becomes a client of shared's pool with a limit of
  // limit_blocks buffers, over a slow tier from make_slow; null: its own memory, where
  // everything fits (the default).
  virtual Status PlaceKv(const FastTier* shared, int32_t limit_blocks, int32_t block_tokens,
                         const SlowTierFactory& make_slow);
  // Its KV when placed in shared tiers (the search moves its limit), else null.
  virtual PrefixTreeKv* shared_kv() { return nullptr; }
  // Bytes of weights one of its passes reads (the memory side of its cost), 0 if none.
  virtual uint64_t weight_bytes() const { return 0; }
  // Since Begin.
  virtual VerifierAheadCounters ahead_counters() const { return {}; }
};

class MeanLogProbVerifier final : public Verifier {
 public:
  const char* name() const override { return "mean_logprob"; }
  Status ScoreStep(std::span<const StepCandidate> cands, std::vector<double>* scores) override;
};

// fn returns the score of one candidate, or an error that ends the search.
class CallbackVerifier final : public Verifier {
 public:
  using Fn = std::function<Status(const StepCandidate&, double*)>;
  explicit CallbackVerifier(Fn fn) : fn_(std::move(fn)) {}
  const char* name() const override { return "callback"; }
  Status ScoreStep(std::span<const StepCandidate> cands, std::vector<double>* scores) override;

 private:
  Fn fn_;
};

class ModelVerifier final : public Verifier {
 public:
  // `scorer` must use the generator's vocabulary (checked: size and every token's bytes).
  // n_ctx: the longest prompt + path it will see.
  static Status Create(const Model& scorer, const Model& generator, int32_t n_threads,
                       int32_t n_ctx, int32_t max_beams, std::unique_ptr<ModelVerifier>* out);
  // Loads the scorer model at `path` (kept in *scorer, which must outlive *out) and sizes
  // its context for a search of `max_tokens` after a prompt of `prompt_tokens`: what the
  // command and the C API both do with a scorer model's path.
  static Status Load(const std::string& path, const Model& generator, int32_t n_threads,
                     size_t prompt_tokens, int32_t max_tokens, int32_t max_beams,
                     std::unique_ptr<Model>* scorer, std::unique_ptr<ModelVerifier>* out);
  ~ModelVerifier() override;
  const char* name() const override { return "model"; }
  Status Begin(std::span<const int32_t> prompt, uint64_t root_id) override;
  Status ScoreStep(std::span<const StepCandidate> cands, std::vector<double>* scores) override;
  void Forget(uint64_t beam_id) override;
  void End() override;
  uint64_t KvBlockBytes(int32_t block_tokens, uint32_t alignment) const override;
  Status PlaceKv(const FastTier* shared, int32_t limit_blocks, int32_t block_tokens,
                 const SlowTierFactory& make_slow) override;
  PrefixTreeKv* shared_kv() override { return shared_ ? kv_ : nullptr; }
  uint64_t weight_bytes() const override { return scorer_->weight_bytes(); }
  VerifierAheadCounters ahead_counters() const override { return ahead_counters_; }

 private:
  struct Held {
    SeqId seq = -1;
    std::vector<float> next_logits;  // after the path's last token
  };
  // A beam's path plus the tokens its first child generated ahead, run in the beam's
  // scoring pass: the child's scoring forks it and continues after them.
  struct Ahead {
    Held held;  // after the last ahead token
    std::vector<int32_t> tokens;
    double sum = 0;  // the ahead tokens' log-likelihoods, summed in order
  };
  void DropAhead(uint64_t beam_id);
  ModelVerifier() = default;
  int32_t MaxSequences() const;
  // Blocks the tree may hold: every beam's path and its children's while they are scored.
  int64_t MaxBlocks(int32_t block_tokens) const;
  // (Re)builds the engine over a prefix tree with these options and slow tier.
  Status Build(const PrefixTreeKvOptions& ko, std::unique_ptr<SlowTier> slow);
  const Model* scorer_ = nullptr;
  int32_t n_threads_ = 0, n_ctx_ = 0, max_beams_ = 0;
  bool shared_ = false;
  PrefixTreeKv* kv_ = nullptr;
  std::unique_ptr<Engine> engine_;
  int32_t n_vocab_ = 0;
  std::map<uint64_t, Held> held_;
  std::map<uint64_t, Ahead> ahead_;  // by the beam whose child generated ahead
  VerifierAheadCounters ahead_counters_;
  std::vector<float> scratch_;
};

// log p(token) under a row of logits (softmax at temperature 1), through the vectorized
// softmax kernel on a copy in `scratch`: a scalar exp over a 49k vocabulary costs more than
// a small model's decode step per token.
double TokenLogProb(const float* logits, int32_t n_vocab, int32_t token,
                    std::vector<float>* scratch);

}  // namespace strata
