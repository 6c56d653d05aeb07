// ReuseBuffer: the slot table of one (sequence, layer) of the disk-backed policy: which
// group record each of C memory slots holds, and which slot a newly selected group goes to.
//
// Consecutive tokens select mostly the same groups (KVSwap's observation), so a group loaded
// for one step is kept for later steps until its slot is needed. Each step, Resolve takes
// the step's selection: groups already held are hits; every other group gets a slot whose
// group was not selected this step, chosen by the replacement policy (FIFO, LRU or
// frequency-aware). Victim slots are handed to the missing groups in ascending slot order,
// so groups adjacent on disk tend to land in adjacent slots and can be read in one request.
// The table only tracks ids; the memory of the slots belongs to the caller.
//
// Read-through slots (`transient`, T): a step may select up to C + T groups. Misses that
// find no persistent victim (a slot not selected this step) go to one of T read-through
// slots, which hold a group only for the rest of the step: the caller keeps their memory
// in a buffer that later layers reuse, and calls ForgetTransient before each step's first
// Resolve. Given priorities, the misses that get persistent slots are the highest ranked
// (the likeliest to be chosen again next step); the rest are read through.
//
// Thread-compatible: one owner (the engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/kv/kv_options.h"

namespace strata {

class ReuseBuffer {
 public:
  struct Placement {
    int32_t group;
    int32_t slot;
    bool load;  // the slot does not hold the group yet: read it from disk
  };

  ReuseBuffer() = default;
  ReuseBuffer(int32_t capacity, ReusePolicy policy, int32_t transient = 0);

  // Persistent slots (C): slot ids [0, C). Read-through slots are [C, C + T).
  int32_t capacity() const { return capacity_; }
  int32_t transient() const { return int32_t(slots_.size()) - capacity_; }
  int32_t size() const { return int32_t(slots_.size()); }
  bool is_transient(int32_t slot) const { return slot >= capacity_; }
  // Places this step's selection (ascending, distinct, at most size() groups) in ascending
  // group order. Slots of the selection stay pinned until the next Resolve. `priority`
  // (empty, or one value per selected group; higher first) decides which misses get the
  // persistent slots when there are fewer free ones than misses.
  void Resolve(std::span<const int32_t> selected, std::vector<Placement>* out,
               std::span<const float> priority = {});
  // The read-through slots' groups are gone (their memory was reused).
  void ForgetTransient();
  // The slot does not hold its group after all (its read failed or was abandoned).
  void Invalidate(int32_t slot);
  // Forgets every group (the sequence was removed or rewound).
  void Clear();
  // The group slot i holds, or -1.
  int32_t group_of(int32_t slot) const { return slots_[size_t(slot)].group; }
  // Whether the last Resolve placed a group in slot i (a hit or a load).
  bool placed_last(int32_t slot) const { return slots_[size_t(slot)].last_used == step_; }
  // Memory of the table itself (counted in the policy's resident bytes) for `slots` slots,
  // persistent and read-through (`read_through`: whether there are any).
  static uint64_t TableBytes(int32_t slots, bool read_through = false);

 private:
  struct Slot {
    int32_t group = -1;
    uint32_t uses = 0;       // selections since loaded, halved every capacity() steps (LFU)
    uint64_t loaded = 0;     // step it was loaded (FIFO)
    uint64_t last_used = 0;  // step it was last selected (LRU); pinned while it is this step
  };
  // Sort key of a candidate victim under the policy: the smallest is evicted first.
  bool EvictBefore(const Slot& a, int32_t ia, const Slot& b, int32_t ib) const;

  // Hands free slots (ascending) to the misses out[missing_[i]] for which take[i] is set
  // (take null: every miss).
  void Assign(std::vector<Placement>& out, std::span<const int32_t> free_slots,
              const uint8_t* take);
  void IndexGroups();
  // take_[i] = whether missing_[i] is among the k misses of highest priority.
  void MarkBest(size_t k, std::span<const float> priority);

  ReusePolicy policy_ = ReusePolicy::kLru;
  int32_t capacity_ = 0;
  std::vector<Slot> slots_;
  std::vector<int32_t> by_group_;  // slot indices that hold a group, ascending by group
  uint64_t step_ = 0;
  // Scratch.
  std::vector<int32_t> victims_;
  std::vector<int32_t> missing_;  // indices in Resolve's out
  std::vector<int32_t> order_;    // with read-through slots only
  std::vector<uint8_t> take_;
};

}  // namespace strata
