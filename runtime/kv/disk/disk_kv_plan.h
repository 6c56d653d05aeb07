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
// Not in the budget: the predictor's scratch, shared by all sequences. A pass over n > 1 new
// tokens (prefill) stages the earlier records it reads back for exact attention in the
// memory of the reuse slots, so it stays inside the budget too (see DiskKv).
//
// A plain value; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/disk/kv_record_layout.h"
#include "runtime/kv/kv_options.h"

namespace strata {

// The paper's memory ratio against an all-in-memory server, used when no budget is given.
constexpr int32_t kDefaultBudgetDivisor = 13;

// The tiles a key summary of type t is stored in.
constexpr kernels::ScoreType ScoreTypeOf(KeySummaryType t) {
  return t == KeySummaryType::kQ8   ? kernels::ScoreType::kQ8
         : t == KeySummaryType::kQ4 ? kernels::ScoreType::kQ4
                                    : kernels::ScoreType::kF16;
}

struct DiskKvPlan {
  KvRecordLayout layout;
  int32_t n_ctx = 0;
  int32_t rank = 0;
  int32_t ratio = 0;
  bool ratio_auto = false;  // kv.ratio was 0: AutoRatio chose it
  KeySummaryType summary_type = KeySummaryType::kF16;
  // K_lr holds one row per group (the mean of its keys) instead of one per token
  // (kv.group_summary); group_summary_auto: chosen by the plan (auto at a tight budget).
  bool group_summary = false;
  bool group_summary_auto = false;
  int32_t groups_per_step = 0;  // M
  int32_t reuse_slots = 0;      // C
  // T: read-through slots (kv.read_through). A layer may attend up to C_l + T groups; the
  // misses that find no free persistent slot are read into one of two buffers of T records
  // shared by all layers (layer l uses l % 2) and dropped after the layer ran.
  // transient_auto: chosen by the plan (auto at a tight budget, see kReadThroughTokens).
  int32_t transient_groups = 0;
  bool transient_auto = false;
  int32_t transient_span =
      1;  // kv.experimental.read_through_span: read-through groups come in spans of it
  int32_t sink_groups = 0;
  int32_t recent_groups = 0;
  // Per layer M and C. Uniform (every layer M and C) unless `calibrated`: then spread by the
  // adapters' attention profile, summing to at most L*M and L*C.
  std::vector<int32_t> layer_groups, layer_slots;
  bool calibrated = false;
  // kv.experimental.attend_tail in effect (it needs per-head scores and a per-token summary).
  bool tail = false;
  // Per layer resident bonus: kv.experimental.resident_bonus, or kv.experimental.dispersed_bonus on
  // the layers DispersedLayers finds at M*G tokens (listed in dispersed_layers).
  std::vector<float> layer_bonus;
  std::vector<int32_t> dispersed_layers;
  // The budget's slots hold fewer than kTightSlotTokens tokens per layer (uniform C * G)
  // and not the whole context: kv.calibrated_layers auto then spreads them over the layers,
  // and kv.group_summary auto takes a per-group summary.
  bool tight = false;
  std::string uniform_reason;  // why not calibrated although asked for ("" otherwise)
  // Bytes per sequence at a full context.
  uint64_t klr_bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t ring_bytes = 0;  // rolling group + recent window
  uint64_t sink_bytes = 0;
  uint64_t write_bytes = 0;
  uint64_t transient_bytes = 0;  // the two read-through buffers
  uint64_t table_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t full_cache_bytes = 0;  // F16 K+V of n_ctx tokens, all layers (memory policy)

  uint64_t total_bytes() const {
    return klr_bytes + slot_bytes + ring_bytes + sink_bytes + write_bytes + transient_bytes +
           table_bytes;
  }
  // Records per layer that ring, sink and write staging hold in one arena with the slots.
  int32_t ring_records() const { return recent_groups + 1; }
  int32_t arena_records(int32_t layer) const {
    return layer_slots[size_t(layer)] + ring_records() + sink_groups + 1;
  }
  // Records of the read-through buffers, once per sequence after the layers' arenas.
  int32_t transient_records() const { return 2 * transient_groups; }
  kernels::ScoreType summary_score_type() const { return ScoreTypeOf(summary_type); }
  // Rows of K_lr for a sequence of n tokens: one per token, or one per complete group.
  int64_t SummaryRows(int64_t n) const { return group_summary ? n / layout.group_size : n; }
  // Tokens one K_lr row stands for: what the predictor takes a group's rows to be.
  int32_t summary_group_size() const { return group_summary ? 1 : layout.group_size; }
  // One line: "G=4 sigma=16 (rank 12, f16) M=100 C=125 sink=1 recent=0 f16 records of 3072 B:
  // 14.2 MiB of a 14.5 MiB budget ... (K_lr ...)".
  std::string Describe() const;
};

// G when kv.group_size is 0: of kAutoGroupMin..kAutoGroupMax (the paper's 4 to 8), the one
// whose records fill the store's blocks best (the smaller on a tie). Padding is memory and
// bandwidth spent on nothing: SmolLM2-135M's Q8_0 records take 1632 of 2048 bytes at G = 4
// and 2040 at G = 5, so G = 5 attends to 25% more tokens in the same slots.
constexpr int32_t kAutoGroupMin = 4, kAutoGroupMax = 8;
int32_t AutoGroupSize(const KvShape& shape, uint32_t block_size, kernels::KvType type);

// A layer's attention is dispersed when the profile's error at the same selected tokens is
// at least this many times the median layer's: on SmolLM2-135M layers 0-2 (0.14-0.22 at
// 615 tokens, against a median of 0.049; the next, layer 7, 0.10).
constexpr double kDispersedErrorRatio = 2.5;
// The layers whose profile error at `tokens` selected tokens is at least kDispersedErrorRatio
// times the median layer's (none where the median is 0 or the profile does not cover
// n_layer layers), ascending.
std::vector<int32_t> DispersedLayers(const AttentionProfile& profile, int32_t n_layer,
                                     double tokens);

// Below this many slot tokens per layer (the paper's M*G ~ 400) a budget is tight: 1/34 of
// SmolLM2-135M's cache (52 slots of 5 tokens with a per-token summary) is, 1/13 (123
// slots) is not.
constexpr int32_t kTightSlotTokens = 400;

// kv.read_through auto: at a tight budget, the fewest read-through slots T for which the
// layers attend M = C + T groups of at least this many tokens (each T costs two records of
// memory where a persistent slot costs one per layer, and T*L record reads a step).
constexpr int32_t kReadThroughTokens = 500;

// The share of the budget an automatically chosen key summary may take at most: the rest
// is reuse slots. At 1/13 of SmolLM2-135M's cache sigma 4's summary takes 44% and beat
// sigma 8 (more slots, coarser ranking) by 2.7 points of perplexity; at 1/34 a per-token
// sigma 4 does not fit, 8 takes 62% and 16 35%, and 16 beat both 8 and 32; a per-group
// sigma 4 takes 25% there with its spreads (bench_kv_quality).
constexpr double kAutoSummaryShare = 0.5;
// kv.ratio when it is 0: of `available` (the ratios the adapters hold; empty: those
// `strata calibrate` makes by default, 4, 8, 16, 32), the smallest whose key summary takes at
// most kAutoSummaryShare of the budget (o.budget_bytes, 0 = the default); the largest when
// none does (the plan then refuses a budget that still cannot hold it, naming the minimum).
// row_tokens: tokens per summary row (1, or G for a per-group summary).
int32_t AutoRatio(const KvShape& shape, const DiskKvOptions& o,
                  std::span<const int32_t> available = {}, int32_t row_tokens = 1);

// block_size: the store's request alignment (records are padded to it). profile: the
// adapters' attention profile, used when o.calibrated_layers (null or empty: uniform).
// ratios: those the adapters hold, for an automatic kv.ratio (see AutoRatio). n_head: the
// model's query heads, for kv.experimental.attend_tail's tables (0: as many as KV heads).
// kv.group_summary auto plans a per-token summary first and takes a per-group one where
// that plan is tight or does not fit.
Status PlanDiskKv(const KvShape& shape, const DiskKvOptions& o, uint32_t block_size,
                  DiskKvPlan* out, const AttentionProfile* profile = nullptr,
                  std::span<const int32_t> ratios = {}, int32_t n_head = 0);

// L*m groups spread over the layers so that the summed missed attention share of the
// profile is least: greedy on the gain of one more group, each layer between max(1, m/4)
// and max_groups. Exposed for tests.
std::vector<int32_t> SpreadGroups(const AttentionProfile& profile, int32_t n_layer, int32_t m,
                                  int32_t group_size, int32_t max_groups);

}  // namespace strata
