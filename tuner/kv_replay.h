// Evaluation text and replayed KV prefixes, for the tuner's quality runs and the KV
// benchmarks: the tokens of the part of a text that calibration did not see, a capture of a
// prefix's post-RoPE K/V computed once with the memory policy (cached on disk), and replaying
// a captured prefix into any policy.
//
// Why a capture: quality and speed runs need the same long prefixes under many policies.
// Prefill is exact under every policy (the disk policy reads earlier records back for it),
// so the K/V a prefix leaves behind does not depend on the policy; computing it once and
// appending it through the KvPolicy interface gives every policy the state its own prefill
// would, at a fraction of the cost.
//
// Single-threaded (the caller's thread), apart from the engine's own pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "runtime/model/model.h"

namespace strata {

// Tokens of the part of `text_path` after the first `skip_fraction` of its bytes (cut at a
// line end): the evaluation half when calibration used the first half.
Status EvaluationTokens(const Model& model, const std::string& text_path, double skip_fraction,
                        std::vector<int32_t>* out);

// F16 K and V of every layer for n tokens at positions 0..n-1: data is [layer][K|V][n][row].
struct KvCapture {
  int32_t n_layer = 0;
  int32_t row = 0;
  int32_t n_tokens = 0;
  std::vector<uint16_t> data;
  const uint16_t* k(int32_t layer) const {
    return data.data() + (size_t(2 * layer) * n_tokens) * row;
  }
  const uint16_t* v(int32_t layer) const { return k(layer) + size_t(n_tokens) * row; }
};

// Full KV of one sequence at `context` tokens, in bytes (F16 K and V of every layer).
uint64_t FullKvBytes(const HParams& hp, int32_t context);

// Computes the capture of `tokens` with the memory policy (`threads` workers, a context of
// n_ctx tokens or of the tokens, whichever is more). With `engine` given, the engine that
// computed it is handed over too, `*seq` holding the tokens, so a caller can go on decoding
// with full KV.
Status CaptureKv(const Model& model, std::span<const int32_t> tokens, int32_t threads,
                 int32_t n_ctx, KvCapture* out, std::unique_ptr<Engine>* engine = nullptr,
                 SeqId* seq = nullptr);

// Loads the capture of `tokens` from cache_dir, or computes it (memory policy, `threads`
// workers) and stores it there (mode 0600, with a checksum: tuner/work_file.h). *computed
// tells which. A stored capture cut short or damaged is reported to `log` (optional) and
// computed again.
Status LoadOrCapture(const Model& model, std::span<const int32_t> tokens,
                     const std::string& cache_dir, int32_t threads, KvCapture* out, bool* computed,
                     const std::function<void(const std::string&)>& log = nullptr);

// An engine for the tuner's runs: `threads` workers, n_ctx tokens, up to max_sequences
// sequences, full KV in memory or the disk policy `disk` (when not null), on the CPU or the
// CUDA device of that ordinal.
Status CreateRunEngine(const Model& model, int32_t threads, int32_t n_ctx, int32_t max_sequences,
                       const DiskKvOptions* disk, std::unique_ptr<Engine>* out,
                       int32_t cuda_device = -1);

// Decode steps after a replayed prefix before a disk plan's reads settle: the first loads
// the slots the replay left empty, and where a plan re-selects fewer groups a step (M) than
// its slots hold, the stale picks of that load are replaced over the next several steps,
// each reading more than a long generation's steps do. The quality windows count a plan's
// reads after them, and the check and fitting runs time and count the steps after them, so
// the cost model is fitted, fed and judged on the reads a long generation makes.
constexpr int32_t kSettleSteps = 8;

// Appends the first n tokens of cap to the empty sequence seq through Append calls, in as
// few passes as the policy takes (KvPolicy::max_pass_tokens).
Status ReplayPrefix(KvPolicy& kv, SeqId seq, const KvCapture& cap, int32_t n);

// Window w of a text: its capture and where its tokens begin in the text's tokens.
using WindowSource =
    std::function<Status(int32_t w, std::shared_ptr<const KvCapture>* capture, size_t* begin)>;

// Makes `batch` new sequences of e, sequence i holding the first n tokens of window
// i mod min(batch, windows), and sets each one's window begin in *begins. One capture is
// loaded at a time: the sequences of a window replay it, then it goes.
Status ReplayWindows(Engine& e, int32_t batch, int32_t windows, const WindowSource& source,
                     int32_t n, std::vector<SeqId>* seqs, std::vector<size_t>* begins);

}  // namespace strata
