// PrefixTreeKv: KV as a prefix tree of fixed-size token blocks over a fast and a slow tier,
// the KV policy of step-wise beam search (DESIGN.md, "Locality-aware beam scheduling").
//
// A block holds block_tokens consecutive positions of one path, all layers' K and V as F16
// ([layer][K rows | V rows], each layer's piece padded to the slow tier's alignment so a
// single layer can be read alone). A sequence is the path of its blocks, root first. Forking
// shares every block (reference counts); the partly filled last block is copied when one of
// the sharers appends to it (copy on write), so full blocks are immutable and stored once.
// A block is freed when no sequence uses it.
//
// Blocks live in the fast tier (a hard byte budget, FastTier) and, once evicted, in the slow
// tier (SlowTier: the block store on disk, or RAM); a block is written at most once while it
// is unchanged, and nothing is lost on eviction. Two residency modes:
//   kWholeBlocks     every block of a batch's paths is in the fast tier during the pass. The
//                    beam scheduler makes a group resident with Pin (loads each shared block
//                    once) and may Prefetch the next group's blocks asynchronously.
//   kLayerStreaming  the token-by-token baseline: blocks that do not fit stay in the slow
//                    tier and are read layer by layer every pass into two staging areas
//                    carved from the same budget, layer l+1's reads starting (Prepare) while
//                    layer l computes. In this mode a view of layer l stays valid until
//                    Prepare(l + 2).
// With write_behind, blocks that fill up are written to the slow tier at once, overlapping
// the compute, so evicting them later costs no write.
//
// Threads: the engine thread only (see KvPolicy); I/O completes on the slow tier's threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kv/kv_policy.h"
#include "runtime/kv/tree/fast_tier.h"
#include "runtime/kv/tree/slow_tier.h"

namespace strata {

enum class KvResidency { kWholeBlocks, kLayerStreaming };

struct PrefixTreeKvOptions {
  int32_t block_tokens = 16;
  uint64_t fast_budget_bytes = 0;  // hard cap on fast-tier bytes (KV blocks and staging)
  int64_t max_blocks = 0;          // live blocks at most: sizes the slow tier
  int32_t max_sequences = 4096;
  bool write_behind = false;
  KvResidency residency = KvResidency::kWholeBlocks;
  // Where the fast tier lives: host RAM (null) or, with the CUDA backend, GPU memory; then the
  // slow tier must move device memory (pinned host RAM through the GPU) and Append takes
  // device pointers.
  TierMemory* memory = nullptr;
  // Non-null: the tree's blocks come from this fast tier's pool (buffers at least a block
  // large), shared with its other clients; fast_budget_bytes is then the tree's limit within
  // it, and memory is the pool's.
  const FastTier* share_fast = nullptr;
};

struct PrefixTreeCounters {
  uint64_t live_blocks = 0;    // now
  uint64_t shared_blocks = 0;  // now: used by more than one sequence
  uint64_t peak_live_blocks = 0;
  uint64_t block_bytes = 0;
  uint64_t fast_budget_bytes = 0;
  uint64_t fast_bytes_in_use = 0;  // now
  uint64_t peak_fast_bytes = 0;    // never above fast_budget_bytes
  uint64_t bytes_read = 0;         // slow -> fast
  uint64_t bytes_written = 0;      // fast -> slow
  uint64_t blocks_loaded = 0;      // whole blocks read back (Pin, BeginBatch, Prefetch)
  uint64_t blocks_prefetched = 0;  // of which started by Prefetch
  uint64_t blocks_written = 0;
  uint64_t layer_reads = 0;  // single-layer reads of streamed blocks
  uint64_t cow_copies = 0;
  double stall_seconds = 0;  // the engine thread waiting for the slow tier
};

class PrefixTreeKv final : public KvPolicy {
 public:
  using BlockId = int32_t;

  static Status Create(const KvShape& shape, const PrefixTreeKvOptions& options,
                       std::unique_ptr<SlowTier> slow, std::unique_ptr<PrefixTreeKv>* out);
  // Bytes of one block (all layers, K and V, pieces padded to `alignment`).
  static uint64_t BlockBytes(const KvShape& shape, int32_t block_tokens, uint32_t alignment);
  ~PrefixTreeKv() override;

  const char* name() const override { return "prefix_tree"; }
  const KvShape& shape() const override { return shape_; }
  Status AddSequence(SeqId* out) override;
  Status RemoveSequence(SeqId seq) override;
  Status ForkSequence(SeqId src, SeqId* out) override;
  int32_t Length(SeqId seq) const override;
  Status BeginBatch(std::span<const BatchSeq> batch) override;
  Status Prepare(int32_t layer, const float* x, int64_t n_embd) override;
  Status Append(int32_t layer, SeqId seq, const float* k, const float* v) override;
  Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override;
  Status EndBatch() override;
  void AbortBatch() override;
  KvCounters counters() const override;
  bool device_memory() const override { return fast_->memory()->device(); }

  // Scheduling (between batches). Not allowed while a batch is open.
  void set_residency(KvResidency r) { residency_ = r; }
  // Write-behind pays only when blocks will be evicted; the scheduler turns it on per step.
  void set_write_behind(bool on) { write_behind_ = on; }
  KvResidency residency() const { return residency_; }
  // Drops seq's tokens from position `length` on (between batches): blocks past it leave
  // its path, and a partly kept last block that other sequences share is copied first (they
  // keep theirs), so sharers of a partial block always agree on its tokens. Used to keep a
  // sequence at a step's end after a pass that also ran tokens generated ahead of it.
  Status Truncate(SeqId seq, int32_t length);
  // The blocks holding seq's tokens, root first.
  Status Path(SeqId seq, std::vector<BlockId>* out) const;
  // Fast buffers that appending n_new tokens to seq takes (new blocks, copy on write).
  int32_t NewBlocksFor(SeqId seq, int32_t n_new) const;
  // Makes every block of `seqs` resident and keeps it there until the next Pin or Unpin;
  // also keeps `reserve` buffers free for the blocks the group will add. Waits for the I/O
  // (counted as stall). ResourceExhausted when the group does not fit the budget.
  Status Pin(std::span<const SeqId> seqs, int32_t reserve);
  void Unpin();
  // While a group is pinned (between its passes): keeps `extra` more fast buffers free for
  // blocks it will add, e.g. a sequence forked from one of its own during the group. Only
  // buffers that are free beyond the reservation or hold blocks nobody pinned or holds count;
  // false, with nothing changed, when there are not that many.
  bool ReserveMore(int32_t extra);
  // Starts reading up to max_blocks of the blocks of `seqs` that are not resident, into
  // buffers that are free beyond the reservation or hold clean blocks nobody pinned.
  // Returns the number started through *started. Does not wait.
  Status Prefetch(std::span<const SeqId> seqs, int32_t max_blocks, int32_t* started);

  int32_t block_tokens() const { return options_.block_tokens; }
  uint64_t block_bytes() const { return block_bytes_; }
  int32_t fast_capacity_blocks() const { return fast_->capacity(); }
  // Moves the tree's limit within a shared pool (between batches, nothing pinned): a lower
  // limit evicts the least recently used blocks beyond it to the slow tier (writing the ones
  // it does not hold yet), so their buffers go back to the pool for its other clients.
  // ResourceExhausted when the blocks that cannot leave (prefetched, in flight) do not fit.
  Status SetFastLimit(int32_t blocks);
  int32_t fast_blocks_in_use() const { return fast_->in_use(); }
  const FastTier& fast_tier() const { return *fast_; }
  int32_t fast_free_blocks() const { return fast_->free_count(); }
  PrefixTreeCounters tree_counters() const;
  std::string slow_tier_description() const { return slow_->Describe(); }
  // Checks reference counts, tier accounting and paths against each other (tests).
  Status CheckInvariants() const;

 private:
  struct Block {
    int32_t pos0 = 0;
    int32_t n_tokens = 0;     // committed
    int32_t refs = 0;         // sequences whose path holds it; 0 = free
    int32_t buffer = -1;      // fast-tier buffer; -1 = only in the slow tier
    int64_t slot = -1;        // slow-tier slot, given at the first write
    bool slow_valid = false;  // the slow copy holds every committed token
    bool loading = false;     // io is a read into buffer
    bool hold = false;        // prefetched for the next group: not a victim until the next Pin
    uint32_t pin_epoch = 0;
    uint32_t batch_pin = 0;   // pinned by the open batch when == batch_stamp_
    uint32_t batch_mark = 0;  // on a path of the open batch when == batch_stamp_
    uint64_t last_use = 0;
    std::shared_ptr<TierTransfer> io;  // a read or a write-behind in flight
  };

  struct Sequence {
    std::vector<BlockId> path;
    int32_t length = 0;
    int32_t pending = 0;  // tokens of the open batch
  };

  PrefixTreeKv(const KvShape& shape, const PrefixTreeKvOptions& options);
  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;
  Status NewBlock(int32_t pos0, BlockId* out);
  void Ref(BlockId b);
  Status Unref(BlockId b);
  Status WaitIo(Block& b);
  // Frees at least `need` fast buffers by evicting unpinned blocks (clean first, then least
  // recently used); dirty victims are written first. `streamed` (layer streaming) grows as
  // batch blocks are evicted, and the staging they need is counted in.
  Status MakeRoom(int32_t need, bool streaming_batch);
  Status Load(const std::vector<BlockId>& blocks);
  Status WriteBlocks(const std::vector<BlockId>& blocks, bool wait);
  bool Pinned(const Block& b) const;
  bool Evictable(const Block& b) const;
  uint64_t SlotOffset(const Block& b) const;
  uint16_t* LayerK(std::byte* base, int32_t layer) const;
  Status StartStagingRead(int32_t layer);
  Status ReleaseStaging();
  int32_t CountStreamed() const;

  const KvShape shape_;
  const PrefixTreeKvOptions options_;
  KvResidency residency_;
  bool write_behind_;
  std::unique_ptr<SlowTier> slow_;
  std::unique_ptr<FastTier> fast_;
  uint64_t piece_stride_ = 0;  // bytes of one layer's piece in a block
  uint64_t block_bytes_ = 0;

  std::vector<Block> blocks_;
  std::vector<BlockId> free_blocks_;
  std::vector<int64_t> free_slots_;
  int64_t next_slot_ = 0;
  std::map<SeqId, Sequence> seqs_;
  SeqId next_seq_ = 0;
  uint32_t epoch_ = 1;        // blocks with pin_epoch == epoch_ are pinned
  uint32_t batch_stamp_ = 1;  // changes at every batch's start and end (see Block)
  uint64_t tick_ = 0;
  int32_t reserved_ = 0;
  bool pin_active_ = false;  // between a successful Pin and Unpin

  // The open batch.
  std::vector<BatchSeq> batch_;
  std::vector<BlockId> batch_new_;  // blocks created by BeginBatch (dropped on abort)
  std::map<SeqId, size_t> batch_index_;
  std::vector<std::vector<kernels::KvSpan>> views_;  // [batch index * n_layer + layer]
  // Layer streaming: streamed blocks, their index in the staging areas, the areas' buffers
  // and the reads filling them (area layer % 2).
  std::vector<BlockId> streamed_;
  std::vector<int32_t> stream_index_;  // per block id, -1 when not streamed
  std::vector<int32_t> staging_[2];
  std::unique_ptr<TierTransfer> staging_io_[2];
  int32_t staging_layer_[2] = {-1, -1};

  PrefixTreeCounters c_;
};

}  // namespace strata
