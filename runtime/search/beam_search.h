// Step-wise beam search with a verifier, over a prefix-tree KV cache that spans a fast tier
// with a hard byte budget and a slow tier (DESIGN.md, "Locality-aware beam scheduling").
//
// A step is step_tokens tokens, or ends after the token that completes step_delimiter (at
// most step_tokens then). Every step, n_beams beams generate one step each; the verifier
// scores the step, a beam's score is the mean of its step scores, and the best
// n_beams / beam_width unfinished beams each fork beam_width children for the next step
// (step 0 forks n_beams children of the prompt). A beam finishes at EOS or max_tokens; the
// search ends when no beam is left or after max_steps (the rest finish as "step_limit").
// The result is every finished beam, best first.
//
// Expansion is stochastic (the sampling chain of sampler.h, one generator per beam seeded
// from the search seed and the beam's identity) or greedy (temperature 0: child j of a
// beam starts its step with the j-th most likely token, then takes the argmax). Neither a
// beam's tokens nor its logits depend on which beams share its batch, so with the same seed
// the ranked results are identical under every schedule and budget (tested).
//
// Threads: RunBeamSearch uses the calling thread and a pool of n_threads workers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/engine/sampler.h"
#include "runtime/kv/tree/prefix_tree_kv.h"
#include "runtime/model/model.h"
#include "runtime/search/beam_scheduler.h"
#include "runtime/search/verifier.h"
#include "storage/slow_disk.h"

namespace strata {

struct BeamSearchParams {
  int32_t n_beams = 8;     // beams generating in every step
  int32_t beam_width = 2;  // children of every kept beam; n_beams / beam_width are kept
  int32_t step_tokens = 32;
  std::string step_delimiter;  // empty: fixed-length steps
  int32_t max_tokens = 256;    // generated tokens per path at most
  int32_t max_steps = 0;       // 0: until every path finished
  SamplingParams sampling;     // temperature 0 = greedy; seed seeds every beam
  bool ignore_eos = false;
  BeamSchedule schedule = BeamSchedule::kBalanced;
  // Speculative beam extension, > 0 to turn it on: a beam that ends its step while others of
  // its group still generate continues, in the slot it frees, as its first child would begin
  // the next step, for up to this fraction of the mean step length so far (at least one
  // token). The tokens are kept when the beam is selected (its first child starts with them)
  // and dropped otherwise; results are identical either way. Grouped schedules only.
  float speculate = 0.0f;
  uint64_t fast_budget_bytes = 0;  // fast-tier KV bytes; 0 = everything fits
  // With a verifier that keeps KV (a scorer model) and a fast-tier budget, the budget holds
  // both models' KV: the two run in turn, and the one that is not running keeps what does
  // not fit its share in the slow tier until it runs again. < 0: before each phase a cost
  // model picks the running model's share (a pass costs a fixed part, its weight reads, and
  // a part per token, both fitted on the search's own passes; the groups or passes a share
  // allows; the blocks the split moves, at the measured I/O cost); in [0, 1]: the
  // verifier's fixed share in both phases (0.5: an even split). Each model keeps at least
  // one beam's working set.
  float verifier_share = -1.f;
  int32_t block_tokens = 16;
  int32_t n_threads = 0;  // 0 = one per core
  // The slow tier: the block store in slow_dir (default $TMPDIR, else /tmp), or RAM.
  std::string slow_dir;
  bool slow_in_ram = false;
  storage::SlowDiskOptions slow_disk;  // bandwidth/latency emulation of the block store
  // >= 0: run on this CUDA GPU. The fast tier is then the GPU's memory and the slow tier
  // pinned host RAM moved by the GPU (a desktop GPU's PCIe host tier; slow_dir, slow_in_ram
  // and slow_disk do not apply), or, with gpu_slow_on_disk, the block store in slow_dir
  // staged through pinned host RAM (a Jetson's NVMe or eMMC; slow_disk applies). -1: on the
  // CPU.
  int32_t cuda_device = -1;
  bool gpu_slow_on_disk = false;
};

enum class BeamStop { kEndOfGeneration, kMaxTokens, kStepLimit };
const char* BeamStopName(BeamStop s);  // "eos", "max_tokens", "step_limit"

struct BeamResult {
  uint64_t beam_id = 0;
  std::vector<int32_t> tokens;  // generated (EOS not included)
  std::string text;
  double score = 0;  // mean of the verifier's step scores
  int32_t steps = 0;
  BeamStop stop = BeamStop::kMaxTokens;
};

struct BeamSearchStats {
  int32_t prompt_tokens = 0;
  int32_t steps = 0;
  int64_t rounds = 0;            // groups run, summed over steps
  int32_t max_step_rounds = 0;   // most groups in one step
  int64_t generated_tokens = 0;  // speculative ones included
  int64_t forward_passes = 0;
  int64_t finished_tokens = 0;  // tokens of the returned beams: goodput is this per second
  // Batch slots: a group's beams times its passes, and how many of them had nothing to run
  // (their beam had ended its step while others of the group went on).
  int64_t slot_passes = 0, idle_slot_passes = 0;
  int64_t speculative_tokens = 0;       // generated ahead into a beam's next step
  int64_t speculative_tokens_kept = 0;  // of which a selected beam's first child kept
  // Speculative tokens the verifier ran in their parent's scoring pass (a scorer model does),
  // and tokens whose scoring a child took over from there (a sibling of the speculative child
  // whose step begins with the same tokens takes them too, so this may exceed the first).
  int64_t verifier_ahead_tokens = 0, verifier_ahead_reused = 0;
  double seconds = 0;  // prompt prefill to the last score
  double prefill_seconds = 0;
  double score_seconds = 0;
  uint64_t peak_shared_blocks = 0;  // blocks used by more than one beam, at a step's start
  uint64_t peak_tree_bytes = 0;     // distinct KV bytes of the tree at its largest
  int32_t fast_capacity_blocks = 0;
  PrefixTreeCounters kv;  // bytes moved, stall, fast-tier peak (after the search ends)
  // With the budget shared by a scorer model: its tree's counters, both trees' peak, and the
  // mean share of the budget the generator had in its phases and the verifier in its.
  bool shared_budget = false;
  PrefixTreeCounters verifier_kv;
  uint64_t peak_fast_bytes_total = 0;
  double generator_phase_share = 0, verifier_phase_share = 0;
  double generator_seconds = 0;  // in the generator's phases (its passes and its I/O)
  std::string slow_tier;
  std::string verifier;
};

// "auto" (-1: the cost model's split) or a share in [0, 1]; the error names the text.
Status ParseVerifierShare(const std::string& text, float* out);

// Range checks naming the parameter, its value and the limit; the budget check names the
// minimum (one beam's working set, or for the token-by-token schedule what its staging needs).
Status ValidateBeamSearchParams(const BeamSearchParams& p, const HParams& hp,
                                int32_t prompt_tokens);
// Fast-tier bytes one beam's working set takes: its whole path at max_tokens.
uint64_t MinFastBudgetBytes(const BeamSearchParams& p, const HParams& hp, int32_t prompt_tokens);
// KV bytes of the prompt plus n_beams paths of max_tokens (the prompt stored once): what the
// search holds when beams share only the prompt. Benchmarks set budgets as a share of it.
uint64_t SearchKvBytes(const BeamSearchParams& p, const HParams& hp, int32_t prompt_tokens);

// The prompt's tokens: raw text (special tokens parsed, BOS as the model wants), or with
// chat a user message rendered by the model's chat template.
Status EncodeBeamPrompt(const Model& model, std::string_view text, bool chat,
                        std::vector<int32_t>* out);

// verifier: null = MeanLogProbVerifier. On error every beam's KV is released before
// returning and stats (if given) still describe the search up to the failure.
Status RunBeamSearch(const Model& model, std::span<const int32_t> prompt, const BeamSearchParams& p,
                     Verifier* verifier, std::vector<BeamResult>* results, BeamSearchStats* stats);

}  // namespace strata
