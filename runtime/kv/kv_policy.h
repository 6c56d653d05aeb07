// KvPolicy: where the K and V of every (sequence, layer) live, behind one seam.
//
// The forward pass never knows where KV is kept. Per forward pass over a batch, the
// engine calls, from its own thread (never from pool workers):
//
//   BeginBatch(batch)                      which sequences get how many new tokens
//   Prepare(0, x0)                         before layer 0
//   for each layer l:
//     Prepare(l + 1, x_l)                  start loading layer l+1's KV (I/O) from the
//                                          hidden state entering layer l, so the I/O runs
//                                          while layer l computes
//     Append(l, seq, k, v) per sequence    new post-RoPE keys and values of layer l
//     View(l, seq) per sequence            the spans attention walks (waits for l's I/O)
//   EndBatch()                             the new tokens become part of the sequences
//
// A view stays valid until the next View of the same (layer, seq) or EndBatch; the pool
// workers read the spans concurrently while the engine thread does nothing to the policy.
// Policies: in-memory (one span per sequence), disk-backed sparse (reuse slots + loaded
// groups + rolling buffer), prefix tree (a beam is the path of its blocks).
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"

namespace strata {

class Model;

using SeqId = int32_t;

struct KvShape {
  int32_t n_layer = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  int32_t n_ctx = 0;                                    // most positions a sequence may hold
  int32_t row() const { return n_head_kv * head_dim; }  // K (or V) floats per token and layer
};

// One sequence's share of a forward batch: n_new tokens at positions pos0 .. pos0+n_new-1
// (pos0 equals the sequence's current length: KV is appended, never rewritten).
struct BatchSeq {
  SeqId seq = 0;
  int32_t pos0 = 0;
  int32_t n_new = 0;
};

// Counters a policy keeps; summed over its lifetime unless noted. Policies that do not
// move data leave the I/O fields at zero.
struct KvCounters {
  uint64_t bytes_read = 0;     // from the slow tier
  uint64_t bytes_written = 0;  // to the slow tier
  uint64_t reads_issued = 0;
  // Of reads_issued, a refinement's (disk policy): issued once a layer's input is known,
  // just before the layer attends, so they have little compute to hide under.
  uint64_t refine_reads_issued = 0;
  // Of reads_issued, those of each layer's selections (disk policy; empty for others): the
  // layers read unevenly (some miss far more than others), and a layer waits for its own.
  std::vector<uint64_t> layer_reads_issued;
  uint64_t groups_selected = 0;  // groups attention used that came from the slow tier path
  uint64_t reuse_hits = 0;       // selected groups already resident
  // Groups attention also read because they were still resident from earlier steps, not
  // selected this step (disk policy, kv.experimental.attend_resident).
  uint64_t resident_attended = 0;
  // Slot groups attention read: selected this step or still resident.
  uint64_t slot_groups_attended() const { return groups_selected + resident_attended; }
  // Selected groups read into a read-through slot (disk policy, kv.read_through): dropped
  // after their layer ran.
  uint64_t read_through_groups = 0;
  double io_wait_seconds = 0;   // time View spent waiting on I/O (not hidden by compute)
  double predict_seconds = 0;   // time spent choosing what to load
  uint64_t resident_bytes = 0;  // now: memory the policy holds for KV (all sequences)
  uint64_t peak_resident_bytes = 0;
  // The most any one sequence has held, and the per-sequence limit it must stay within
  // (0: the policy has no budget).
  uint64_t peak_sequence_resident_bytes = 0;
  uint64_t budget_bytes = 0;
  // Transient buffers outside the budget (e.g. a disk policy's prefill staging): now, peak.
  uint64_t staging_bytes = 0;
  uint64_t peak_staging_bytes = 0;
  uint64_t steps = 0;           // forward passes completed (BeginBatch .. EndBatch)
  double step_seconds = 0;      // wall time inside those passes
  uint64_t write_requests = 0;  // requests that wrote to the slow tier
};

// What a sparse view leaves out, as an estimate the forward pass adds to attention: query
// head h's output o_h over the view becomes (o_h + ratio[h] * mean_v[kv head of h]) /
// (1 + ratio[h]), i.e. the left-out keys get ratio[h] times the view's softmax mass and the
// mean value of all the sequence's tokens as theirs.
struct KvTail {
  const float* ratio = nullptr;   // [n_head]
  const float* mean_v = nullptr;  // [n_head_kv * head_dim]
};

// An optional capability of a policy (KvPolicy::windowed_view): a view too large for the
// memory the policy may use comes in windows. View returns the first; the keys of the whole
// view are the concatenation of all windows, each valid until the next call for the same
// (layer, sequence). A forward pass attends to each window and joins the results by their
// softmax denominators (the same result as one view, up to rounding in the join).
class KvWindowedView {
 public:
  virtual ~KvWindowedView() = default;
  // Windows still to come for (layer, seq) after the one handed out last (0: none).
  virtual int32_t MoreWindows(int32_t layer, SeqId seq) = 0;
  virtual Status NextWindow(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) = 0;
};

// An optional capability (KvPolicy::tail_estimate): after View(layer, seq) of a decode step,
// whether the view leaves keys out that attention should add by estimate (KvTail, valid as
// long as the view).
class KvTailEstimate {
 public:
  virtual ~KvTailEstimate() = default;
  virtual bool Tail(int32_t layer, SeqId seq, KvTail* out) = 0;
};

class KvPolicy {
 public:
  virtual ~KvPolicy() = default;
  virtual const char* name() const = 0;
  virtual const KvShape& shape() const = 0;

  // Sequences. Ids are chosen by the policy.
  virtual Status AddSequence(SeqId* out) = 0;
  virtual Status RemoveSequence(SeqId seq) = 0;
  // A new sequence that starts as a copy of `src` (beam search); NotSupported by default.
  virtual Status ForkSequence(SeqId src, SeqId* out);
  // Tokens stored for `seq` (committed by EndBatch).
  virtual int32_t Length(SeqId seq) const = 0;

  // One forward pass. BeginBatch checks capacity (context length, memory budget) and
  // fails without side effects when the batch does not fit.
  virtual Status BeginBatch(std::span<const BatchSeq> batch) = 0;
  // x: the hidden states entering layer `layer - 1` (or the embeddings for layer 0), one
  // row of n_embd floats per batch token, sequences in BeginBatch order (device memory when
  // device_memory()). Default: nothing.
  virtual Status Prepare(int32_t layer, const float* x, int64_t n_embd);
  // k, v: [n_new][n_head_kv * head_dim] floats (post-RoPE keys) for `seq` at `layer`; device
  // pointers when device_memory().
  virtual Status Append(int32_t layer, SeqId seq, const float* k, const float* v) = 0;
  // The spans for attention of `seq` at `layer`, including this batch's new tokens.
  virtual Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) = 0;
  virtual Status EndBatch() = 0;
  // Drops what BeginBatch and Append did when the forward pass fails midway.
  virtual void AbortBatch() = 0;
  // Waits for what earlier passes left running (a disk policy's record writes, which the
  // next BeginBatch would wait for), so that nothing of the policy runs between passes. A
  // caller that times the passes of several engines in turn ends each pass's time here,
  // where a pass that followed at once would have waited. Default: nothing is left running.
  virtual Status Settle() { return Status::OK(); }

  virtual KvCounters counters() const = 0;
  // True when the policy keeps KV in GPU memory: its views then hold device pointers and the
  // forward pass must run on that GPU (the CUDA backend).
  virtual bool device_memory() const { return false; }
  // True when a pass's only device work is the StoreF16 calls of its TierMemory and its views
  // follow from the host's state alone (no I/O, no copies): a GPU engine may then make every
  // layer's Append and View calls before it launches the pass, and replay a captured graph.
  virtual bool views_precomputable() const { return false; }
  // True when Prepare and Append take host pointers although the views hold device pointers
  // (a host policy seen from a GPU through DeviceViewKv): the GPU engine copies the hidden
  // states and the new K/V rows to the host before it calls them.
  virtual bool host_inputs() const { return false; }
  // Views in windows, or null (every view whole).
  virtual KvWindowedView* windowed_view() { return nullptr; }
  // Estimates of what sparse views leave out, or null (views leave nothing out).
  virtual KvTailEstimate* tail_estimate() { return nullptr; }
  // The most new tokens one pass may hand a sequence (the engine's batch is clamped to it).
  virtual int32_t max_pass_tokens() const { return INT32_MAX; }
};

}  // namespace strata
