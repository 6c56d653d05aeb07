// GroupPredictor: the disk-backed policy's guess of which key groups a layer's attention
// will need, made before that layer runs (KVSwap's grouped prediction).
//
// From the residual stream entering layer l-1 it builds an approximate query for layer l
// (layer l's attention norm, Wq, bias/Q-norm and RoPE, the same math as the forward pass),
// projects each query head through the rows of the layer's adapter A that belong to the
// head's KV head (q_lr . K_lr approximates q_h . k_g), scores the low-rank key summary K_lr,
// takes each group's best token and combines the heads (GroupScoring), and returns the top
// M groups.
// It also makes K_lr rows from new keys (K_lr = K * A).
//
// Owns scratch sized at Create; uses the engine's thread pool for the matmuls. Call from the
// engine thread only, one call at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/kv_options.h"

namespace strata {

class Model;
class ThreadPool;

// The spread of a per-group summary's rows (ProjectGroup) and its weight in a group's score:
// a row scores q.mean + weight * |q| * spread, between the mean key's score (weight 0) and
// an upper bound on its best token's (weight 1, Cauchy-Schwarz).
struct RowSpread {
  const uint16_t* f16 = nullptr;  // one F16 per summary row; null: scores are q.row alone
  float weight = 0.0f;
};

class GroupPredictor {
 public:
  // Below this many summary rows a selection scores on the engine thread alone; from it on,
  // over the pool in chunks. A pool job costs a few microseconds, scoring a thousand rows
  // tens (measured: a 4096-token context's selection took 1.6x longer on one core of two
  // than the pool's rate priced it, when this was 4096 and its rows fell just short).
  static constexpr int64_t kParallelRows = 1024;

  // max_rows: most tokens LowRankQueries takes at once; n_ctx: most K_lr rows scored;
  // type: how K_lr stores its values.
  static Status Create(const Model& model, const AdapterSet& set, GroupScoring scoring,
                       kernels::ScoreType type, int32_t n_ctx, int32_t max_rows, ThreadPool* pool,
                       std::unique_ptr<GroupPredictor>* out);
  ~GroupPredictor();

  int32_t rank() const { return rank_; }
  int32_t n_head() const { return n_head_; }

  // K_lr rows of n keys of `layer` at positions [p0, p0 + n): k is [n][row] F32; the rows
  // go into `klr`, the layer's summary in tiles of the predictor's type (kernels::ScoreTiles),
  // which must hold KlrBytes(p0 + n, ...).
  void ProjectKeys(int32_t layer, const float* k, int64_t n, int64_t p0, uint8_t* klr);
  // The summary row of a whole group (kv.group_summary): n keys ([n][row] F32) projected
  // like ProjectKeys, their mean stored as row `row` of the layer's summary, and the largest
  // distance of a key's projection from that mean as spread[row] (F16; see RowSpread).
  void ProjectGroup(int32_t layer, const float* k, int32_t n, int64_t row, uint8_t* klr,
                    uint16_t* spread);
  // Bytes of the spreads of n rows (whole tiles, like the summary).
  static uint64_t SpreadBytes(int64_t n);
  // Bytes of one layer's summary of n rows with, per_group, its spreads.
  static uint64_t SummaryBytes(int64_t n, int32_t rank, kernels::ScoreType type, bool per_group) {
    return KlrBytes(n, rank, type) + (per_group ? SpreadBytes(n) : 0);
  }
  // Rows a tiled summary of n rows (tokens, or groups) takes room for (whole tiles).
  static int64_t KlrTokens(int64_t n);
  // Bytes of one layer's summary of n rows at `rank`.
  static uint64_t KlrBytes(int64_t n, int32_t rank, kernels::ScoreType type);

  // Approximate low-rank queries of `layer` for n rows of x (n_embd floats each, the
  // residual stream entering layer-1) at the given positions: out is [n][n_head][rank].
  void LowRankQueries(int32_t layer, const float* x, int64_t n, const int32_t* positions,
                      float* out);

  // The M best groups among groups [g0, g1) for one token's q_lr ([n_head][rank]) scored
  // against the layer's tiled summary `klr`. Writes min(M, g1-g0) group ids, ascending.
  // Groups in `favored` (e.g. those already in memory; any order, ids outside [g0, g1)
  // ignored) have their score s raised first: to s + bonus * s where s >= 0, to
  // s / (1 + bonus) where it is negative (raw sums), so the raise never reorders by sign. `spread`:
  // a per-group summary's row spreads (group_size is then 1). `scores`, if given, gets each chosen
  // group's score (with the bonus), in the order of `out`: the caller's priority among them.
  // worker < 0: called from the engine thread, the scoring spread over the pool. worker >= 0:
  // called from inside a pool job as that worker (ThreadPool::Run's `worker`), scored on it
  // alone with its own scratch, so that several sequences' selections run side by side;
  // the result is the same either way.
  void SelectGroups(const float* q_lr, const uint8_t* klr, int32_t g0, int32_t g1,
                    int32_t group_size, int32_t m, std::vector<int32_t>* out,
                    std::span<const int32_t> favored = {}, float bonus = 0.0f,
                    RowSpread spread = {}, std::vector<float>* scores = nullptr, int worker = -1);

  // Read-through in spans (kv.experimental.read_through_span): after a SelectGroups on `worker`
  // that returned M groups in `out` (with their `scores`), keeps the `keep` best of them and
  // refills the other M - keep from spans of `span` groups of [g0, g1), counted from g0: the spans
  // whose unselected groups carry the most predicted attention (softmax scoring: the sum of
  // their shares; otherwise their best score), every unselected group of a span taken (the
  // last span only its best). Read-through groups are read a step at a time, so a span
  // costs the device one request where scattered groups cost one each. `out` stays
  // ascending with `scores` in its order; nothing changes where span <= 1 or keep >= M.
  void SpanReadThrough(int32_t g0, int32_t g1, int32_t keep, int32_t span,
                       std::vector<int32_t>* out, std::vector<float>* scores, int worker = -1);

  // The attention a selection leaves out, per query head (kv.experimental.attend_tail): after a
  // SelectGroups on `worker` that scored groups [g0, g1) (softmax scoring, a per-token
  // summary), with `attended` the groups of that range attention reads
  // (each once) and `outside` the other runs of tokens it reads (sink, recent and rolling
  // groups; each run counts as one group), writes
  //   ratio[h] = sum over left-out groups of exp(s_hg) / sum over attended groups and runs
  //              of exp(s_hg),
  // s_hg being head h's best low-rank score among the group's tokens, the estimate the
  // selection ranked by. The forward pass then gives the left-out keys that share of the
  // attention, with the mean value as theirs.
  struct TokenRun {
    int64_t begin = 0, end = 0;
  };
  // Visits only the attended groups (the shares sum to 1) and scores the outside runs.
  void TailRatios(const uint8_t* klr, int32_t g0, int32_t g1, std::span<const int32_t> attended,
                  std::span<const TokenRun> outside, int worker, float* ratio);

  // Sizes the scoring scratch for summaries of `group_size` tokens a row; SelectGroups does
  // it from the engine thread, and a caller that selects from pool workers first (worker >=
  // 0) must have done it.
  void ReserveGroupSize(int32_t group_size);

  // Bytes of scratch and adapter copies (shared by all sequences).
  uint64_t scratch_bytes() const;

 private:
  GroupPredictor(const Model& model, const AdapterSet& set, GroupScoring scoring,
                 kernels::ScoreType type, ThreadPool* pool);
  // out[t][0..rank) = k[t] ([row] F32) through the layer's adapter, for t < n (at most
  // kProjectRows): one small matrix product, not a projection a key.
  void ProjectRows(int32_t layer, const float* k, int64_t n, float* out) const;
  static constexpr int64_t kProjectRows = 32;
  // Tokens a scoring task takes for rows of `group_size` tokens (whole tiles and groups).
  static int64_t ChunkTokens(int32_t group_size);
  // One selection's scratch; one per pool worker (SelectGroups' `worker`).
  struct Scores {
    std::vector<float> token, group, q;
    // Each head's group maxima: [head][heads_stride]; after softmax scoring each head's
    // shares, log_norm[h] the log of head h's denominator (share = exp(max - log_norm)).
    std::vector<float> heads, log_norm;
    std::vector<float> runs, run_mass;  // TailRatios' token scores and per-head masses
    std::vector<float> span;            // SpanReadThrough's span weights
    std::vector<int32_t> order;         // SpanReadThrough's ranking
    std::vector<uint8_t> chosen;        // SpanReadThrough's selection, one flag a group
  };
  // sc.group[g - g0] for groups [g0, g1) of klr; worker as in SelectGroups.
  void ScoreGroups(Scores& sc, const float* q_lr, const uint8_t* klr, int32_t g0, int32_t g1,
                   int32_t group_size, RowSpread spread, int worker);

  const Model& model_;
  const AdapterSet& set_;
  const GroupScoring scoring_;
  const kernels::ScoreType type_;
  ThreadPool* pool_;
  int32_t rank_ = 0, n_head_ = 0, n_rep_ = 0, head_dim_ = 0, row_ = 0, n_embd_ = 0;
  float scale_ = 1;
  std::vector<float> inv_freq_;  // per rotated pair, as the forward pass computes it

  // Scratch.
  std::vector<float> xn_, q_, cos_sin_, key_acc_, key_mean_, key_row_;
  // Token scores of one scoring task, per pool worker: [worker][head][chunk_scores_stride_].
  std::vector<float> chunk_scores_;
  int64_t chunk_scores_stride_ = 0;
  // Per pool worker (only [0] when a batch never holds two rows).
  std::vector<Scores> scores_;
  int64_t heads_stride_ = 0;
  std::vector<uint8_t> xq_;
};

}  // namespace strata
