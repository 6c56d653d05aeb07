// The disk KV policy's per-sequence state (internal to runtime/kv/disk: disk_kv*.cc), shared by
// its parts:
//   * DiskKvStore (disk_kv_store.h) allocates a sequence's arena and carves it into the
//     pointers below, and moves records between them and the store file;
//   * DiskKvSelector (disk_kv_select.h) fills a layer's selection and placements;
//   * disk_kv_view.h turns a layer's state into the spans attention reads;
//   * DiskKv (disk_kv.h) runs the pass and owns the sequences.
// Plain data: same threading as DiskKv.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "runtime/kv/disk/reuse_buffer.h"
#include "storage/block_store.h"

namespace strata::disk_kv {

// Large contiguous transfers (prefill read-back and writes) go in pieces of this size so
// several run in parallel on the device's queues.
inline constexpr uint64_t kBulkRequestBytes = 512 * 1024;
// Tag of read-back requests; decode loads carry (region, first slot, count) instead.
inline constexpr uint64_t kReadbackTag = ~uint64_t{0};
inline uint64_t LoadTag(int32_t region, int32_t slot, int32_t count) {
  return (uint64_t(region) << 40) | (uint64_t(slot) << 20) | uint64_t(count);
}
// The slots [slot, slot + count) of a region that a decode load (not a read-back) fills.
struct LoadTarget {
  int32_t region, slot, count;
  bool Overlaps(const LoadTarget& o) const {
    return region == o.region && slot < o.slot + o.count && o.slot < slot + count;
  }
};
inline LoadTarget FromLoadTag(uint64_t tag) {
  return {int32_t(tag >> 40), int32_t((tag >> 20) & 0xFFFFF), int32_t(tag & 0xFFFFF)};
}

// When each layer's groups are selected in a decode step (kv.experimental.refine). Without
// refinement, Prepare(l + 1, x_l) guesses layer l + 1 from layer l's input. With it, that call also
// selects layer l again from its exact query, and the guess did most of the I/O early.
struct RefineSchedule {
  bool refine = false;
  int32_t n_layer = 0;
  // Whether layer's groups are guessed early: not layer 1's, whose guess would come from
  // the embedding alone, when it is refined (the last layer is not: no call follows it).
  bool HasGuess(int32_t layer) const { return !(refine && layer == 1 && n_layer > 2); }
  // Whether layer's selection is made again from its exact query: layers 1 .. n_layer - 2
  // (layer 0's guess is already exact, and the last layer has no later call).
  bool Refined(int32_t layer) const { return refine && layer >= 1 && layer + 2 <= n_layer; }
  // Whether this is layer's first selection of the step (the guess, or a refinement with no
  // guess before it): it starts the step's read-through and counts reuse.
  bool FirstSelection(int32_t layer, bool refining) const { return !refining || !HasGuess(layer); }
};

struct Layer {
  ReuseBuffer reuse;
  std::byte* slots = nullptr;  // C records
  std::byte* ring = nullptr;   // recent + 1 records: group g at g % (recent + 1)
  std::byte* sink = nullptr;   // sink records: group g at g
  std::byte* write = nullptr;  // one record: a full group waiting for EndBatch
  uint8_t* klr = nullptr;      // n_ctx tokens of rank values, tiled (kernels::ScoreTiles)
  uint16_t* spread = nullptr;  // a per-group summary's row spreads (GroupPredictor::RowSpread)
  int32_t write_group = -1;
  std::vector<int32_t> selected;
  std::vector<ReuseBuffer::Placement> placed;
  std::vector<kernels::KvSpan> view;
  // kv.experimental.attend_tail: the values' sum over committed tokens and over this pass's (F32,
  // [row]), their mean as of the last view, and each query head's left-out share (KvTail).
  std::vector<float> v_sum, v_new, v_mean, tail_ratio;
};

// A pass that attends exactly (prefill, or the reload-everything baseline) keeps its buffers
// inside the sequence's slot pool (its reuse slots are not used by such a pass, and are
// forgotten when it begins), so memory stays within the budget whatever the prefix length.
// The earlier records come back whole when two layers of them fit beside the pass's own
// buffers (layer l reads into readback[l % 2] while l - 1 computes), else in windows of
// window_records records: window 0 read ahead like the whole prefix, the later ones read one
// ahead of the window being attended, alternating between readback[2] and the layer's own.
struct Staging {
  std::byte* readback[3] = {};
  int32_t window_records = 0;  // records a readback buffer holds (the whole prefix, or less)
  int32_t windows = 1;         // windows a layer's earlier records come in
  std::byte* records[2] = {};  // by layer parity: the pass's new full groups
  storage::IoBatch writes[2];
  std::byte* ring = nullptr;    // [layer][recent + 1] records as they stand after the pass
  uint16_t* fresh_k = nullptr;  // [pos0 % G + n_new][row]: partial + new tokens, F16
  uint16_t* fresh_v = nullptr;
  std::vector<kernels::KvSpan> view;
  // The window being attended (of layer window_layer) and the read of the next one; whether
  // a later window has been read over window 0 (a second View of the layer reads it again).
  int32_t window_layer = -1, window = 0;
  bool window0_reused = false;
  storage::IoBatch window_read;
};

struct Sequence {
  int32_t id = -1;     // the policy's SeqId, for messages
  int32_t region = 0;  // which part of the store file holds its records
  int32_t length = 0;
  int32_t pending = 0;
  int32_t row = 0;  // its first row in the pass's x
  bool exact = false;
  Status lost;  // set when records could not be written: the sequence is unusable
  // Slots of every layer and the read-through buffers, one pool (an exact pass's staging),
  // then every layer's ring, sink and write records.
  storage::AlignedBuffer arena;
  size_t pool_bytes = 0;
  // The read-through buffers: 2 x T records after the layers' arenas; layer l uses the
  // half l % 2 (its reads land while layer l-1 runs, when layer l-2 is done with it).
  std::byte* transient = nullptr;
  int32_t transient_groups = 0;  // T
  uint32_t record_bytes = 0;
  void* klr_map = nullptr;
  size_t klr_map_bytes = 0;
  std::vector<Layer> layers;
  std::unique_ptr<Staging> staging;

  Sequence() = default;
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;
  ~Sequence() {
    if (klr_map) munmap(klr_map, klr_map_bytes);
  }

  // Where slot `slot` of layer's reuse buffer (persistent or read-through) lives.
  std::byte* SlotRecord(int32_t layer, int32_t slot) const {
    const Layer& L = layers[size_t(layer)];
    if (!L.reuse.is_transient(slot)) return L.slots + size_t(slot) * record_bytes;
    return transient +
           (size_t(layer % 2) * size_t(transient_groups) + size_t(slot - L.reuse.capacity())) *
               record_bytes;
  }
};

}  // namespace strata::disk_kv
