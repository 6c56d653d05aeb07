// KvOptions: which KV policy an engine uses and its parameters (strata.yaml's `kv:`
// section and the C API's KV fields map onto this struct).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "runtime/kv/kv_policy.h"

namespace strata {
namespace storage {
class FaultInjector;
class IoBatch;
}  // namespace storage

class Model;
class ThreadPool;

enum class KvPolicyKind { kMemory, kDisk };
const char* KvPolicyKindName(KvPolicyKind kind);
// "memory" -> kMemory, "disk" -> kDisk; the error lists the accepted names.
Status ParseKvPolicyKind(const std::string& name, KvPolicyKind* out);

// Which loaded group a full reuse buffer gives up for a new one.
enum class ReusePolicy {
  kFifo,  // the group loaded longest ago (KVSwap's choice)
  kLru,   // the group selected longest ago
  kLfu,   // the group selected least often (counts halve every C steps, so old fame fades)
};
const char* ReusePolicyName(ReusePolicy p);
Status ParseReusePolicy(const std::string& name, ReusePolicy* out);

// How per-head low-rank scores become one score per group.
enum class GroupScoring {
  kSoftmax,  // per head, each group's best token through a softmax over groups, summed over
             // heads: a group counts when any token matters to any head, and no head's logit
             // scale drowns the others
  kSum,      // raw scores summed over heads, max per group (one matrix-vector product)
};
const char* GroupScoringName(GroupScoring s);
Status ParseGroupScoring(const std::string& name, GroupScoring* out);

// A switch whose default the disk policy's plan decides (see DiskKvPlan's tight budgets).
enum class AutoSwitch { kAuto, kOff, kOn };
const char* AutoSwitchName(AutoSwitch s);  // "auto", "false", "true"
// "auto"; "true", "on", "yes", "1"; "false", "off", "no", "0". The error lists them.
Status ParseAutoSwitch(const std::string& name, AutoSwitch* out);

// How group records store K and V, on disk and in the reuse slots.
enum class KvRecordType {
  kAuto,  // Q8_0 where the head dimension is a multiple of 32 (Q8_0's block), else F16
  kF16,
  kQ8_0,  // 34 bytes per 32 values: 1.9x the tokens of F16 in the same slot memory
};
const char* KvRecordTypeName(KvRecordType t);
// "auto", "f16", "q8_0"; the error lists the accepted names.
Status ParseKvRecordType(const std::string& name, KvRecordType* out);

// How the low-rank key summary K_lr stores its values (kernels::ScoreType).
enum class KeySummaryType {
  kF16,  // 2 bytes a value (the paper's choice)
  kQ8,   // 1 byte a value plus an F16 scale per token: twice the rank in ~the same memory
  kQ4,   // half a byte a value plus the scale: four times the rank in ~the same memory
};
const char* KeySummaryTypeName(KeySummaryType t);
// "f16", "q8", "q4"; the error lists the accepted names.
Status ParseKeySummaryType(const std::string& name, KeySummaryType* out);

// The disk-backed sparse policy (KVSwap): the full KV on disk in group records, a low-rank
// key summary and a few loaded groups in memory. Defaults follow the paper (M*G ~ 400,
// G = 4 on NVMe) unless a measurement here says otherwise (see bench/kv). In strata.yaml
// the research settings (those neither the defaults' rules nor `strata tune` change: the
// read-through span, sink and recent groups, the bonuses, the tail estimate's settings,
// the group spread, the reuse order, the summary type, scoring, refine, attend_resident)
// are keys of kv.experimental; the rest are keys of kv.
struct DiskKvOptions {
  std::string dir = "/var/tmp";  // directory of the KV store file (deleted on close)
  // Adapters file from `strata calibrate`; "" = the model's path with ".gguf" replaced by
  // ".adapters".
  std::string adapters;
  // G: tokens per group record; 0 = the G in 4..8 whose records fill the store's blocks
  // best (AutoGroupSize; 5 for SmolLM2-135M's Q8_0 records, 4 for F16 ones).
  int32_t group_size = 0;
  // Q8_0 records hold 1.9x the tokens of F16 in the same budget and read half the bytes;
  // on SmolLM2-135M at 1/13 of the cache that is worth more than the quantization costs
  // (bench_kv_quality; numbers in docs/experiments/disk-kv-quality.md).
  KvRecordType record_type = KvRecordType::kAuto;
  // sigma = n_head_kv*head_dim / rank of the key summary, and the summary's value type.
  // The rank decides how well the summary ranks groups; at a fixed budget Q4 at sigma 4
  // takes 1.08x the memory of F16 at sigma 16 and, on SmolLM2-135M at 1/13 of the cache,
  // cuts the perplexity loss against full KV by about 3x (bench_kv_quality; numbers in
  // docs/experiments/disk-kv-quality.md). The adapters must hold the ratio (`strata calibrate
  // --ratios`). 0 = auto: the smallest ratio the adapters hold whose K_lr takes at most half the
  // budget (AutoRatio: 4 at 1/13 of SmolLM2-135M's cache; at 1/34, where a per-token sigma 4 alone
  // would not fit, 16 per token (best of 8, 16 and 32) or, the default there, 4 per group).
  int32_t ratio = 0;
  KeySummaryType summary_type = KeySummaryType::kQ4;
  // One K_lr row per group (the summary of the mean of its G keys) instead of one per token:
  // G times less summary memory and scoring, for a coarser ranking (a group scores as its
  // mean key, not its best token). Auto: on where the budget is tight (DiskKvPlan::tight),
  // where the memory it frees buys more slots than the ranking loses: on SmolLM2-135M at
  // 1/34 of the cache sigma 4 per group (1.32 MiB with the spreads, 61 slots) gives +9.51%
  // perplexity against full KV over 16 windows where sigma 16 per token (1.88 MiB, 52
  // slots) gave +15.3%
  // (bench_kv_quality; docs/experiments/disk-kv-tight-budget.md); at 1/13 per-token rows rank
  // better for the budget.
  AutoSwitch group_summary = AutoSwitch::kAuto;
  // With a per-group summary a group scores q.mean + group_spread * |q| * spread, spread
  // being the largest distance of one of its keys from the mean (in the summary's space): 0
  // ranks by the mean key alone, 1 by an upper bound on the group's best token. At 1/34 of
  // SmolLM2-135M's cache (4 windows): 0 +15.4%, 0.125 +13.7%, 0.25 +13.6%, 0.5 +15.7%.
  float group_spread = 0.25f;
  // M: groups selected (and read where not held) per layer and step; 0 = C (+ T), every slot
  // chosen afresh each step. The paper's M*G ~ 400 (M = 80 at G = 5) leaves the other C - M
  // slots to stale picks of earlier steps; on SmolLM2-135M at 1/13 of the cache M = C with
  // a resident bonus of 3 loses 2.8% perplexity against full KV where M = 80 lost 3.25%,
  // reading 1.2x as much (bench_kv_quality / bench_kv_speed; numbers in
  // docs/experiments/disk-kv-quality.md).
  int32_t groups_per_step = 0;
  int32_t reuse_slots = 0;  // C: loaded groups kept per layer; 0 = all the budget allows
  // T: read-through slots. A layer's selection may exceed its C slots by up to T groups,
  // which are read into a buffer the layers share (two of T records per sequence, by layer
  // parity) and dropped once the layer ran: T more attended groups cost the budget 2*T
  // records where persistent slots would cost L*T, and cost T*L record reads a step.
  // -1 = auto: at a tight budget (DiskKvPlan::tight) with M and C left to the plan, the
  // fewest T (at most C) for which M*G reaches kReadThroughTokens (500); else 0. On
  // SmolLM2-135M at 1/34 of the cache auto is M = 100, C = 56, T = 44: +6.05% perplexity
  // against full KV over 16 windows where the 61 slots alone gave +9.51% (bench_kv_quality;
  // docs/experiments/disk-kv-tight-budget.md).
  int32_t read_through = -1;
  // Read-through in spans of this many adjacent groups (1 = single groups, the best
  // ranked): with T > 0, the layer's C best groups take the persistent slots and the T
  // read-through groups are refilled from aligned spans of S groups, those whose groups
  // outside the C carry the most predicted attention, so that a span travels in one request.
  // Read-through is re-read every step and the device is bound by requests (see
  // docs/experiments/disk-kv-quality.md, "read-through in spans").
  int32_t read_through_span = 1;
  // Spread M and C over the layers by the adapters' attention profile (layers that spread
  // their attention wider get more groups; the totals stay L*M and L*C) when the adapters
  // have one; off, or without a profile, every layer gets M and C. Auto: on where the budget
  // is tight (DiskKvPlan::tight). On SmolLM2-135M it buys 1.7 points of perplexity at 1/34
  // of the cache (4 windows) but nothing at 1/13, where it costs 15% of the batch-1 decode
  // speed (more reads in the first layers).
  AutoSwitch calibrated_layers = AutoSwitch::kAuto;
  // Resident bytes per sequence (key summary, rolling/recent/sink records, reuse slots,
  // tables); 0 = 1/13 of the full F16 cache at the context length (the paper's ratio).
  int64_t budget_bytes = 0;
  int32_t sink_groups = 1;    // leading groups always resident (attention sink)
  int32_t recent_groups = 0;  // newest full groups always resident, besides the rolling one
  ReusePolicy reuse = ReusePolicy::kLru;
  GroupScoring scoring = GroupScoring::kSoftmax;
  std::string backend = "auto";  // block store backend: auto, io_uring or pread
  int32_t queue_depth = 64;      // most reads in the block store at once
  bool emulate_emmc = false;     // cap the store at eMMC speed (storage's slow-disk emulation)
  // Re-select each layer's groups from its exact query once its input is known, reading
  // what the early guess (from the previous layer's input) missed; see DiskKv. On by
  // default: on SmolLM2-135M at 1/13 of the cache it cut the perplexity increase from +38%
  // to +9% (bench_kv_quality, 2 windows x 256 tokens). With it on, layer 1 is not guessed
  // at all (its guess would come from the embedding alone): its refinement selects it.
  bool refine = true;
  // Attention also reads the groups the reuse buffer still holds from earlier steps, not only
  // this step's selection: they are in memory already, so more of the context is attended
  // at no I/O. Measured in bench_kv_quality (numbers in docs/experiments/disk-kv-quality.md).
  bool attend_resident = true;
  // Attention also gives the keys it leaves out their estimated share: each query head's
  // mass of the left-out groups against the attended ones, from the selection's own
  // low-rank scores (GroupPredictor::TailRatios), with the layer's mean value as their
  // value. Needs per-head scores and a per-token summary (kv.experimental.scoring softmax, no
  // kv.group_summary); off otherwise. On SmolLM2-135M at 1/13 (16 windows): +2.63%
  // perplexity / 90.33% top-1 agreement against full KV where dropping them gives +2.89% /
  // 89.79% (bench_kv_quality; docs/experiments/disk-kv-quality.md).
  bool attend_tail = true;
  // The weight of that estimate (its share times tail_weight) and the first layer it applies
  // to. The low-rank scores overstate the left-out share: a group's best token under
  // rounding noise scores high, and the left-out groups are many.
  float tail_weight = 0.15f;
  int32_t tail_first_layer = 1;
  // Selection prefers groups already in memory: a held group's score s counts as
  // s + resident_bonus * s (a negative raw sum under kv.experimental.scoring sum as s / (1 +
  // bonus), so the bonus never turns a bad score into a good one). A sharper summary follows the
  // query more closely and so changes its picks more from step to step; this trades a little of
  // that for fewer reads. 0 = off. With M = C (the default) a bonus of 3 finds 92% of the picks in
  // memory (0.5: 82%, 0: 74%) for about half a point of perplexity against 0.5, and reads 1.2x what
  // the paper's M*G ~ 400 read at 0.5 (bench_kv_quality / bench_kv_speed;
  // docs/experiments/disk-kv-quality.md). At 1/34 (52 slots) a bonus of 0 gained 2.7 points over 3
  // on the 4 hardest windows but nothing over 16 (+15.32% either way) while missing twice the
  // groups.
  float resident_bonus = 3.0f;
  // The resident bonus of layers whose attention is dispersed (DiskKvPlan::layer_bonus:
  // where the adapters' attention profile misses kDispersedErrorRatio times the median
  // layer's share at the plan's tokens; layers 0-2 of SmolLM2-135M). Their group scores are
  // flat, so their picks churn among near-ties that cost little to miss: at 1/13 a bonus of
  // 10 there reads 10% fewer groups a step at the same quality (16 windows: +2.77% against
  // +2.80% perplexity; 30 read 16% fewer at +2.92%; 100 gave +3.45% on 4 windows).
  // -1: those layers take resident_bonus like the others.
  float dispersed_bonus = 10.0f;
  // FlexGen-style baseline for benchmarks: every step reads each layer's whole KV back
  // instead of predicting groups (the budget then does not bound the staging it needs).
  bool reload_all = false;
};

// What tests and benchmarks attach to a disk policy: not settings (no YAML key, no C API
// field, nothing a user chooses).
struct DiskKvHooks {
  std::shared_ptr<storage::FaultInjector> faults;  // the store's fault injection
  // Sees every read submission (one per layer and pass) right after it.
  std::function<void(int32_t layer, const storage::IoBatch& reads)> on_read_submit;
  // Sees what a decode pass gives a layer's attention for a sequence: the spans of the
  // groups it kept and selected, with their positions (pos0, n_tokens).
  std::function<void(int32_t layer, SeqId seq, std::span<const kernels::KvSpan> view)>
      on_decode_view;
};

struct KvOptions {
  KvPolicyKind policy = KvPolicyKind::kMemory;
  DiskKvOptions disk;
  DiskKvHooks hooks;  // tests and benchmarks only
};

// Checks the ranges of every option that does not depend on the model; errors name the
// setting, the value and the accepted range.
Status ValidateDiskKvOptions(const DiskKvOptions& o);

// Builds the policy the options name for `model`, sized for n_ctx tokens per sequence and
// at most max_sequences sequences.
Status CreateKvPolicy(const Model& model, const KvOptions& options, int32_t n_ctx,
                      int32_t max_sequences, ThreadPool* pool, std::unique_ptr<KvPolicy>* out);

}  // namespace strata
