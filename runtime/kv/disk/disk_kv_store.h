// DiskKvStore: the disk KV policy's record store and arenas (internal to runtime/kv/disk).
//
// Owns the block store file that holds every sequence's group records (one region of
// KvRecordLayout::sequence_bytes() per sequence), its identity (a store file that vanishes
// from under the process is detected, and every later pass fails), the regions free for new
// sequences, each sequence's memory (its arena of slots, ring, sink and write records, and
// its key-summary mapping, carved as DiskKvPlan says), the registration of those arenas for
// fixed-buffer reads, and the decode step's I/O: two read batches per layer (the early guess
// with any prefill read-back, and the refinement) and the group records written at the
// step's end. It counts that I/O into the policy's KvCounters.
//
// It does not decide what to read (DiskKvSelector) or how attention sees the records
// (disk_kv_view.h). Same threading as DiskKv.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_state.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_policy.h"
#include "storage/block_store.h"

namespace strata {

class DiskKvStore {
 public:
  // The block size of the device behind options.dir (records are padded to it), from a small
  // probe store; fails early, with the store's message, on a bad directory.
  static Status ProbeBlockSize(const DiskKvOptions& options, uint32_t* block);
  // A temporary store file of `block`-byte blocks for max_sequences regions of the plan's
  // layout. counters must outlive the store.
  static Status Open(const DiskKvOptions& options, const DiskKvPlan& plan, const KvShape& shape,
                     int32_t max_sequences, uint32_t block, KvCounters* counters,
                     std::unique_ptr<DiskKvStore>* out, const DiskKvHooks& hooks = {});
  // Waits for the reads and writes this store issued (not the prefill staging's own).
  ~DiskKvStore();
  DiskKvStore(const DiskKvStore&) = delete;
  DiskKvStore& operator=(const DiskKvStore&) = delete;

  // A new sequence's memory in a free region; n_head sizes the left-out share per query
  // head (kv.experimental.attend_tail). ResourceExhausted when every region is taken.
  Status NewSequence(int32_t n_head, std::unique_ptr<disk_kv::Sequence>* out);
  // Returns s's region once nothing is in flight into or out of its buffers; s may then be
  // freed.
  void ReleaseSequence(const disk_kv::Sequence& s);

  // Fails once the store file is gone (its directory removed), and on every call after.
  Status CheckFile();
  // Registers the arenas with the store for fixed-buffer reads (no page pinning per
  // request) when sequences came or went; only with nothing in flight. A failure (e.g.
  // RLIMIT_MEMLOCK) is remembered, not raised: unregistered reads only cost more per request.
  void RegisterArenas();

  // The decode step's reads: batch GuessReads(l) holds layer l's early guess and any prefill
  // read-back, RefineReads(l) the refinement from its exact query.
  static size_t GuessReads(int32_t layer) { return 2 * size_t(layer); }
  static size_t RefineReads(int32_t layer) { return 2 * size_t(layer) + 1; }
  storage::IoBatch& reads(size_t batch) { return *reads_[batch]; }
  bool settled(size_t batch) const { return reads_settled_[batch] != 0; }
  // Adds reads of layer's placements in s that need a load to the batch, adjacent groups in
  // adjacent slots as one request; counts groups selected and reuse hits when `first`.
  void AddLoads(int32_t layer, disk_kv::Sequence& s, size_t batch, bool first);
  // Submits a batch if it holds requests; on_read_submit sees it.
  Status SubmitReads(int32_t layer, size_t batch);
  // Waits for a batch; the slots of loads that failed are forgotten so no stale record is
  // attended. Returns the batch's first error.
  Status SettleReads(int32_t layer, size_t batch);
  // Waits for both batches of a layer.
  Status SettleLayer(int32_t layer);
  // Marks every batch settled (between passes, when all were waited for).
  void ForgetSettled();
  // Whether a refinement read of `layer` targets a slot the guess is still reading into.
  bool RefineOverlapsGuess(int32_t layer) const;

  // The group records that filled up in a decode step (each layer's write record), written
  // in one submission at the step's end and waited for at the next step's start, so the
  // writes overlap the output head and sampling. A sequence whose write failed is marked
  // lost (it cannot attend correctly again).
  Status SubmitDecodeWrites(std::span<disk_kv::Sequence* const> batch);
  Status SettleDecodeWrites();

  // Prefill staging's own batches (their buffers live in the sequence's pool), counted.
  Status SubmitStaging(storage::IoBatch& batch, const char* what);
  Status WaitStaging(storage::IoBatch& batch, const char* what);

  const storage::BlockStore& block_store() const { return *store_; }
  storage::BlockStore& block_store() { return *store_; }

 private:
  DiskKvStore(const DiskKvOptions& options, const DiskKvHooks& hooks, const DiskKvPlan& plan,
              const KvShape& shape, KvCounters* counters);

  const DiskKvOptions options_;
  const DiskKvHooks hooks_;
  const DiskKvPlan plan_;
  const KvShape shape_;
  const KvRecordLayout& layout_;
  KvCounters* c_;
  std::unique_ptr<storage::BlockStore> store_;
  dev_t store_dev_ = 0;
  ino_t store_ino_ = 0;
  Status broken_;           // set once the store file is gone: every later pass fails with it
  Status register_status_;  // why the arenas are not registered (first failure)
  std::vector<int32_t> free_regions_;
  std::vector<disk_kv::Sequence*> by_region_;  // who holds each region (null: free)
  bool arenas_changed_ = false;                // a sequence came or went since registering
  std::vector<std::unique_ptr<storage::IoBatch>> reads_;
  std::vector<uint8_t> reads_settled_;  // per batch of reads_, this pass
  storage::IoBatch decode_writes_;
};

}  // namespace strata
