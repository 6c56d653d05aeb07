// Forward: the transformer forward pass of the Llama family over a batch of tokens.
//
// Reads top to bottom like the model: embedding, then per layer RMSNorm -> Q,K,V -> RoPE
// -> KV policy -> attention over the policy's view -> output projection -> residual ->
// RMSNorm -> SwiGLU FFN -> residual, then the final norm and the output head. All the
// arithmetic is in named kernels; this file only sequences them and splits them over the
// thread pool. Owns its scratch buffers, sized for max_tokens tokens per pass.
//
// Not thread-safe: one Run at a time (the engine's thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "runtime/kv/kv_policy.h"
#include "runtime/model/model.h"

namespace strata {

// The tokens of one forward pass. Tokens are grouped by sequence in `seqs` order:
// seqs[0].n_new tokens of the first sequence, then the second's, ...
struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<BatchSeq> seqs;
  std::vector<uint8_t> want_logits;  // per token; logits rows come out in token order

  void Clear() {
    tokens.clear();
    seqs.clear();
    want_logits.clear();
  }
  // Appends `ids` for `seq` starting at position pos0; logits for the last one only, or for
  // all of them.
  void Add(SeqId seq, int32_t pos0, std::span<const int32_t> ids, bool all_logits = false);
  int64_t n_outputs() const;
};

// Time spent in each part of the pass, summed over calls (seconds).
struct ForwardTimes {
  double matmul = 0, attention = 0, kv = 0, other = 0;
  double kv_prepare = 0;  // the part of kv spent in KvPolicy::Prepare (prediction, reads issued)
};

// A forward pass on some backend: the CPU (Forward, below) or a CUDA GPU
// (forward_cuda.h). Not thread-safe: one Run at a time.
class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  virtual int32_t max_tokens() const = 0;
  // Runs the batch through the model, storing its K/V in the policy. `logits` receives
  // n_outputs() rows of n_vocab floats. On error the policy's batch is aborted.
  virtual Status Run(const ForwardBatch& batch, std::vector<float>* logits) = 0;
  virtual const ForwardTimes& times() const = 0;
  // Bytes of accelerator memory the pass holds (weights and scratch), and of that the
  // weights' share; 0 on the CPU.
  virtual uint64_t device_bytes() const { return 0; }
  virtual uint64_t device_weight_bytes() const { return 0; }
  // How the pass runs, for --stats and benchmarks ("cpu", "cuda: graphs, weights device").
  virtual std::string description() const { return "cpu"; }
};

// What every backend checks before a pass: not empty, within max_tokens, token ids inside
// the vocabulary, sequence counts consistent.
Status CheckForwardBatch(const ForwardBatch& batch, int64_t max_tokens, int32_t n_vocab);

// How many parts the CPU pass splits one decoding sequence's attention over a view of
// view_tokens tokens into (parts run on separate threads and are merged by their
// log-sum-exp): enough to keep threads busy at batch 1, few enough that merging stays cheap.
int32_t DecodeAttentionParts(int64_t view_tokens);

class Forward final : public ForwardPass {
 public:
  // pass_invariant: see EngineOptions.
  Forward(const Model& model, KvPolicy* kv, ThreadPool* pool, int32_t max_tokens,
          bool pass_invariant = false);

  int32_t max_tokens() const override { return max_tokens_; }
  Status Run(const ForwardBatch& batch, std::vector<float>* logits) override;
  const ForwardTimes& times() const override { return times_; }

 private:
  struct MatmulJob {
    const TensorRef* w;
    float* y;  // [n_tok][w->rows]
  };
  struct MatmulPiece {
    const MatmulJob* job;
    int64_t r0, r1;
  };
  Status RunLayers(const ForwardBatch& batch, int64_t n_tok);
  void Attention(const ForwardBatch& batch, int32_t layer,
                 const std::vector<std::span<const kernels::KvSpan>>& views);
  // Adds what the policy's views left out, by its estimate (KvPolicy::Tail), to the
  // decoding sequences' attention outputs.
  void AttendTail(const ForwardBatch& batch, int32_t layer);
  // Attention of batch sequence s (its tokens from row t0) over a view that comes in
  // windows (KvWindowedView): `first` and `more` further windows, joined by their softmax
  // denominators.
  Status AttendWindows(const ForwardBatch& batch, int32_t layer, size_t s, int64_t t0,
                       std::span<const kernels::KvSpan> first, int32_t more,
                       KvWindowedView* windows);
  // y_j = W_j x for all jobs, sharing one conversion of x (all W_j must have the same
  // activation type). x: [n_tok][k].
  void Matmul(std::span<const MatmulJob> jobs, const float* x, int64_t n_tok);
  void RmsNormRows(const float* x, const TensorRef& w, float* y, int64_t n_tok);
  void ComputeRopeTable(const ForwardBatch& batch);

  const Model& model_;
  const HParams& hp_;
  KvPolicy* kv_;
  ThreadPool* pool_;
  const int32_t max_tokens_;
  const bool pass_invariant_;
  std::vector<float> inv_freq_;  // per rotated pair, with scaling and frequency factors

  // Scratch, [max_tokens][...].
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, rope_;
  std::vector<uint8_t> xq_;
  std::vector<std::vector<float>> attn_scratch_;  // per worker
  // Decode views split into parts (see Attention): spans and part boundaries per sequence,
  // and the parts' outputs and softmax denominators.
  std::vector<std::vector<kernels::KvSpan>> split_spans_;
  std::vector<std::vector<int32_t>> split_cuts_;
  std::vector<float> part_out_, part_lse_;
  // Windowed views: a window's outputs and denominators, and the running join.
  std::vector<float> win_out_, win_lse_, acc_out_, acc_lse_;
  std::vector<MatmulPiece> pieces_;
  ForwardTimes times_;
};

}  // namespace strata
