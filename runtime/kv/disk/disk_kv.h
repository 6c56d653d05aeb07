// DiskKv: the disk-backed sparse KV policy (KVSwap). The full K and V of every layer live
// in a block store on disk as group records; memory holds only the low-rank key summary
// K_lr, a rolling group of the newest tokens (plus an optional recent window), the sink
// groups and C reuse slots per layer, all inside a fixed per-sequence budget (DiskKvPlan).
//
// Decode (one new token per sequence): Prepare(l+1, x_l), called as layer l starts,
// predicts layer l+1's top M groups from x_l (GroupPredictor), keeps the ones already in
// the reuse buffer, and submits reads for the others into their slots, for all sequences
// of the batch in one submission, adjacent groups in adjacent slots coalesced into one
// request; View(l+1) waits for them, so the I/O runs under layer l's compute. Attention
// then walks sink + selected + recent + rolling spans. A group that fills up is written
// at EndBatch (one submission) and projected into K_lr when its tokens arrive.
//
// Layer 0 has no previous layer: Prepare(0, x0) predicts from the embeddings, which are
// layer 0's real input, so its query is exact (only the low-rank approximation remains)
// but its reads are not overlapped with compute; the reuse buffer serves most of them.
//
// Optional refinement (kv.experimental.refine): when Prepare(l+1, x_l) arrives, x_l is layer l's
// own input, so layer l's selection is made again from its exact query and the few groups the first
// guess missed are read before View(l); the guess still did most of the I/O early.
//
// Prefill (a pass with more than one new token for a sequence) attends exactly: Prepare
// reads each layer's earlier records back into staging (one or a few large requests, also
// overlapped with the previous layer), new full groups are written as they arrive. The
// staging lives in the sequence's slot pool, inside its budget: when two layers of earlier
// records do not fit there, they come in windows (KvWindowedView) that the forward pass
// attends one after another and joins by their softmax denominators. A pass too large for
// the pool is refused with the most it can take (max_pass_tokens, which the engine uses).
//
// Append without Prepare/View is allowed (importing KV computed elsewhere, e.g. benchmarks
// replaying a prefix). If the store file disappears (its directory removed) or a write
// fails, the next pass fails with an error naming it; a sequence whose records were lost
// refuses further passes.
//
// Parts (each owns what its header says): DiskKvStore, the store file, the sequences'
// memory and the step's I/O; DiskKvSelector, the predictor and what each layer reads;
// disk_kv_view.h, the spans attention walks; DiskKv itself runs the pass (the KvPolicy
// calls, the exact passes of disk_kv_prefill.cc, counters and memory accounting).
//
// Thread-compatible: the engine thread calls it as KvPolicy describes; the pool workers
// only read the spans (and select, one sequence each, inside Prepare).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_select.h"
#include "runtime/kv/disk/disk_kv_state.h"
#include "runtime/kv/disk/disk_kv_store.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "storage/block_store.h"

namespace strata {

class DiskKv final : public KvPolicy, public KvWindowedView, public KvTailEstimate {
 public:
  static Status Create(const Model& model, const DiskKvOptions& options, int32_t n_ctx,
                       int32_t max_sequences, ThreadPool* pool, std::unique_ptr<DiskKv>* out,
                       const DiskKvHooks& hooks = {});
  ~DiskKv() override;

  const char* name() const override { return "disk"; }
  const KvShape& shape() const override { return shape_; }
  Status AddSequence(SeqId* out) override;
  Status RemoveSequence(SeqId seq) override;
  int32_t Length(SeqId seq) const override;
  Status BeginBatch(std::span<const BatchSeq> batch) override;
  Status Prepare(int32_t layer, const float* x, int64_t n_embd) override;
  Status Append(int32_t layer, SeqId seq, const float* k, const float* v) override;
  Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override;
  bool Tail(int32_t layer, SeqId seq, KvTail* out) override;
  KvWindowedView* windowed_view() override { return this; }
  KvTailEstimate* tail_estimate() override { return plan_.tail ? this : nullptr; }
  int32_t MoreWindows(int32_t layer, SeqId seq) override;
  Status NextWindow(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override;
  int32_t max_pass_tokens() const override;
  Status EndBatch() override;
  void AbortBatch() override;
  Status Settle() override;
  KvCounters counters() const override;

  const DiskKvPlan& plan() const { return plan_; }
  const storage::BlockStore& store() const { return store_->block_store(); }
  // For benchmarks that run their own I/O on the store while no pass is in flight.
  storage::BlockStore& store_for_benchmarks() { return store_->block_store(); }

 private:
  using Sequence = disk_kv::Sequence;
  using Layer = disk_kv::Layer;
  using Staging = disk_kv::Staging;
  DiskKv(const Model& model, const DiskKvOptions& options, const KvShape& shape);

  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;
  // The early guess of layer's groups (refining = false), or its selection again from the
  // exact query; the placements that need a load join the layer's reads.
  Status Select(int32_t layer, const float* x, int64_t n_embd, bool refining);
  Status Refine(int32_t layer, const float* x, int64_t n_embd);
  void AppendDecode(int32_t layer, Sequence& s, const float* k, const float* v);

  // Exact passes (disk_kv_prefill.cc): prefill, and the reload-everything baseline.
  void AddReadback(int32_t layer, Sequence& s);
  Status AppendExact(int32_t layer, Sequence& s, const float* k, const float* v);
  // Window w of layer's exact view (the earlier records of the window, and after the last
  // one the pass's fresh tokens) into s.staging->view; reads ahead the window after it.
  Status ViewExact(int32_t layer, Sequence& s, int32_t w);
  // Carves an exact pass's staging out of the sequence's slot pool.
  Status PlanStaging(Sequence& s, int32_t n_new);
  uint64_t PassBytes(int32_t length, int32_t n_new) const;
  uint64_t PoolBytes() const;
  Status FinishExact(Sequence& s);
  // Waits for the I/O of s's exact-pass staging (its own batches).
  void WaitStaging(Sequence& s);

  uint64_t SequenceResident(const Sequence& s) const;
  void NoteMemory();

  const Model& model_;
  const DiskKvOptions options_;
  std::function<void(int32_t, SeqId, std::span<const kernels::KvSpan>)> on_decode_view_;
  const KvShape shape_;
  int32_t max_sequences_ = 0;
  DiskKvPlan plan_;
  KvRecordLayout layout_;
  Adapters adapters_;
  KvCounters c_;
  std::chrono::steady_clock::time_point pass_start_;

  SeqId next_id_ = 0;
  std::map<SeqId, std::unique_ptr<Sequence>> seqs_;
  // After seqs_: destroyed first, it waits for the I/O into their buffers.
  std::unique_ptr<DiskKvSelector> selector_;
  std::unique_ptr<DiskKvStore> store_;

  // The pass in flight.
  std::vector<BatchSeq> batch_;
  std::vector<Sequence*> batch_seqs_;
  std::vector<Sequence*> selected_;  // the sequences one selection chose groups for
};

}  // namespace strata
