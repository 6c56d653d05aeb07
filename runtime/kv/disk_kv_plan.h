// DiskKvPlan: how the disk-backed policy spends its per-sequence memory budget, decided once
// from the options and the model's shape before anything is allocated.
//
// Per sequence the policy holds, for every layer: the low-rank key summary K_lr (sized for
// the whole context), the rolling group (newest tokens, not yet a full group) plus the
// recent window, the sink groups, one record of write staging, C reuse slots (where selected
// groups are read to) and the small tables that map groups to slots and spans. Everything
// but the reuse slots is fixed by (G, sigma, sink, recent, context); the slots take what is
// left. The plan refuses a budget below its minimum (the fixed part plus M slots per layer)
// and says what that minimum is.
//
// Not in the budget: transient prefill staging (a pass over n>1 new tokens reads each
// layer's earlier records back for exact attention, see DiskKv) and the predictor's scratch,
// shared by all sequences. Both are reported by the counters.
//
// A plain value; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "runtime/kv/kv_options.h"
#include "runtime/kv/kv_record_layout.h"

namespace strata {

// KVSwap's default of about 400 selected tokens per layer and step (M*G ~ 400).
constexpr int32_t kDefaultSelectedTokens = 400;
// The paper's memory ratio against an all-in-memory server, used when no budget is given.
constexpr int32_t kDefaultBudgetDivisor = 13;

struct DiskKvPlan {
  KvRecordLayout layout;
  int32_t n_ctx = 0;
  int32_t rank = 0;
  int32_t ratio = 0;
  int32_t groups_per_step = 0;  // M
  int32_t reuse_slots = 0;      // C
  int32_t sink_groups = 0;
  int32_t recent_groups = 0;
  // Bytes per sequence at a full context.
  uint64_t klr_bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t ring_bytes = 0;  // rolling group + recent window
  uint64_t sink_bytes = 0;
  uint64_t write_bytes = 0;
  uint64_t table_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t full_cache_bytes = 0;  // F16 K+V of n_ctx tokens, all layers (memory policy)

  uint64_t total_bytes() const {
    return klr_bytes + slot_bytes + ring_bytes + sink_bytes + write_bytes + table_bytes;
  }
  // Records per layer that ring, sink and write staging hold in one arena with the slots.
  int32_t ring_records() const { return recent_groups + 1; }
  int32_t arena_records_per_layer() const { return reuse_slots + ring_records() + sink_groups + 1; }
  // One line: "G=4 sigma=16 (rank 12) M=100 C=125 sink=1 recent=0 f16 records of 3072 B:
  // 14.2 MiB of a 14.5 MiB budget ... (K_lr ...)".
  std::string Describe() const;
};

// block_size: the store's request alignment (records are padded to it).
Status PlanDiskKv(const KvShape& shape, const DiskKvOptions& o, uint32_t block_size,
                  DiskKvPlan* out);

}  // namespace strata
