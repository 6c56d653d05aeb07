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
// Optional refinement (kv.refine): when Prepare(l+1, x_l) arrives, x_l is layer l's own
// input, so layer l's selection is made again from its exact query and the few groups the
// first guess missed are read before View(l); the guess still did most of the I/O early.
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
// Thread-compatible: the engine thread calls it as KvPolicy describes; the pool workers
// only read the spans.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "runtime/kv/adapters.h"
#include "runtime/kv/disk_kv_plan.h"
#include "runtime/kv/group_predictor.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "storage/block_store.h"

namespace strata {

class DiskKv final : public KvPolicy, public KvWindowedView, public KvTailEstimate {
 public:
  static Status Create(const Model& model, const DiskKvOptions& options, int32_t n_ctx,
                       int32_t max_sequences, ThreadPool* pool, std::unique_ptr<DiskKv>* out);
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
  KvCounters counters() const override;

  const DiskKvPlan& plan() const { return plan_; }
  const storage::BlockStore& store() const { return *store_; }
  // For benchmarks that run their own I/O on the store while no pass is in flight.
  storage::BlockStore& store_for_benchmarks() { return *store_; }

 private:
  struct Layer;
  struct Staging;
  struct Sequence;
  DiskKv(const Model& model, const DiskKvOptions& options, const KvShape& shape);

  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;
  Status CheckStoreFile() const;
  Status PrepareSparse(int32_t layer, const float* x, int64_t n_embd, bool refining);
  // Sequence j of the sparse rows picks its groups for `layer` and places them in its reuse
  // buffer; worker as in GroupPredictor::SelectGroups.
  void SelectForSequence(int32_t layer, size_t j, bool refining, int worker);
  Status Refine(int32_t layer, const float* x, int64_t n_embd);
  // Whether layer's groups are guessed early (from the previous layer's input) before its
  // refinement: not layer 1's, whose guess would come from the embedding alone, when it is
  // refined (the last layer is not: no call follows it).
  bool HasGuess(int32_t layer) const {
    return !(options_.refine && layer == 1 && shape_.n_layer > 2);
  }
  // Whether layer's selection is made again from its exact query (Prepare(layer + 1) refines
  // it: layers 1 .. n_layer - 2; layer 0's guess is already exact, and the last layer has no
  // later call).
  bool Refined(int32_t layer) const {
    return options_.refine && layer >= 1 && layer + 2 <= shape_.n_layer;
  }
  // Whether this is layer's first selection of the step (the guess, or a refinement with
  // no guess before it): it starts the step's read-through and counts reuse.
  bool FirstSelection(int32_t layer, bool refining) const { return !refining || !HasGuess(layer); }
  void AddLoads(int32_t layer, Sequence& s, bool refining);
  void AddReadback(int32_t layer, Sequence& s);
  // Index in reads_ of layer's guess and refinement batches.
  static size_t GuessReads(int32_t layer) { return 2 * size_t(layer); }
  static size_t RefineReads(int32_t layer) { return 2 * size_t(layer) + 1; }
  // Submits batch (an index in reads_) of `layer` if it holds requests; counts them.
  Status SubmitReads(int32_t layer, size_t batch);
  // Whether a refinement read of `layer` targets a slot the guess is still reading into.
  bool RefineOverlapsGuess(int32_t layer) const;
  // Waits for layer's reads (both batches); forgets slots whose read failed. Returns the
  // first error.
  Status SettleReads(int32_t layer);
  Status SettleBatch(int32_t layer, size_t batch);
  Status SettleDecodeWrites();
  void AppendDecode(int32_t layer, Sequence& s, const float* k, const float* v);
  // The per-group summary row (kv.group_summary) of group g from its full record.
  void SummarizeGroup(int32_t layer, const std::byte* record, int32_t g, uint8_t* klr,
                      uint16_t* spread);
  Status AppendExact(int32_t layer, Sequence& s, const float* k, const float* v);
  // What decode attention reads of a layer, in its view's order: fn(kind, group, where,
  // tokens) for the sink groups (where: sink record), the selection's placements and, with
  // kv.attend_resident, the other groups the slots hold (where: slot), then the recent and
  // rolling groups (where: ring record; the rolling one with the pass's new token).
  enum class Viewed { kSink, kSlot, kResident, kRing };
  template <typename Fn>
  void ForEachViewed(const Layer& L, int32_t p, Fn&& fn) const;
  void ViewDecode(int32_t layer, Sequence& s);
  // kv.attend_tail: layer's left-out share per query head after a selection on `worker`
  // that scored groups [n_sink, g_hi) (the sink groups before, the recent and rolling after).
  void TailRatios(int32_t layer, Sequence& s, int32_t n_sink, int32_t g_hi, int worker);
  // Where slot `slot` of layer's reuse buffer (persistent or read-through) lives.
  std::byte* SlotRecord(Sequence& s, int32_t layer, int32_t slot);
  // Window w of layer's exact view (the earlier records of the window, and after the last
  // one the pass's fresh tokens) into s.staging->view; reads ahead the window after it.
  Status ViewExact(int32_t layer, Sequence& s, int32_t w);
  // Carves an exact pass's staging out of the sequence's slot pool.
  Status PlanStaging(Sequence& s, int32_t n_new);
  uint64_t PassBytes(int32_t length, int32_t n_new) const;
  uint64_t PoolBytes() const;
  Status FinishExact(Sequence& s);
  uint64_t SequenceResident(const Sequence& s) const;
  // Registers the sequences' arenas with the store for fixed-buffer reads (no page pinning
  // per request); called between passes, with nothing in flight, when they changed.
  void RegisterArenas();
  void NoteMemory();

  const Model& model_;
  const DiskKvOptions options_;
  const KvShape shape_;
  int32_t max_sequences_ = 0;
  DiskKvPlan plan_;
  KvRecordLayout layout_;
  Adapters adapters_;
  std::unique_ptr<GroupPredictor> predictor_;
  std::unique_ptr<storage::BlockStore> store_;
  dev_t store_dev_ = 0;
  ino_t store_ino_ = 0;
  Status broken_;                // set once the store file is gone: every later pass fails with it
  bool arenas_changed_ = false;  // a sequence came or went: RegisterArenas at BeginBatch
  Status register_status_;       // why the arenas are not registered (first failure)

  SeqId next_id_ = 0;
  std::map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::vector<int32_t> free_regions_;

  // The pass in flight.
  std::vector<BatchSeq> batch_;
  std::vector<Sequence*> batch_seqs_;
  // Reads of each layer for all sequences, two batches per layer: [2l] the early guess
  // (and prefill readback), [2l+1] the refinement from the exact query.
  std::vector<std::unique_ptr<storage::IoBatch>> reads_;
  std::vector<uint8_t> reads_settled_;               // per batch of reads_, this pass
  std::unique_ptr<storage::IoBatch> decode_writes_;  // submitted at EndBatch
  std::vector<int32_t> sparse_rows_, sparse_pos_;
  std::vector<float> sparse_x_, q_lr_;
  // One selection's lists, per pool worker (sequences select side by side at batch > 1).
  struct Selection {
    std::vector<int32_t> favored;   // groups in memory, for the resident bonus
    std::vector<float> scores;      // the selection's scores (priorities with read-through)
    std::vector<int32_t> attended;  // TailRatios: the scored groups attention reads
    std::vector<GroupPredictor::TokenRun> outside;  // TailRatios: the other runs it reads
  };
  std::vector<Selection> selections_;
  ThreadPool* pool_ = nullptr;
  std::vector<float> group_keys_;  // one group's keys as F32 (SummarizeGroup)

  KvCounters c_;
  std::chrono::steady_clock::time_point pass_start_;
};

}  // namespace strata
