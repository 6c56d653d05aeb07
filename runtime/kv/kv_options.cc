#include "runtime/kv/kv_options.h"

#include "common/enum_names.h"

#include "runtime/kv/disk/disk_kv.h"
#include "runtime/kv/memory_kv.h"
#include "runtime/model/model.h"

namespace strata {
namespace {

Status Range(const char* key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return Status::OutOfRange(std::string(key) + " = " + std::to_string(v) + " is out of range [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return Status::OK();
}

}  // namespace

namespace {

constexpr EnumName<KvPolicyKind> kKvPolicyNames[] = {{KvPolicyKind::kMemory, "memory"},
                                                     {KvPolicyKind::kDisk, "disk"}};
constexpr EnumName<ReusePolicy> kReusePolicyNames[] = {
    {ReusePolicy::kFifo, "fifo"}, {ReusePolicy::kLru, "lru"}, {ReusePolicy::kLfu, "lfu"}};
constexpr EnumName<GroupScoring> kGroupScoringNames[] = {{GroupScoring::kSoftmax, "softmax"},
                                                         {GroupScoring::kSum, "sum"}};
constexpr EnumName<AutoSwitch> kAutoSwitchNames[] = {
    {AutoSwitch::kAuto, "auto"}, {AutoSwitch::kOn, "true"}, {AutoSwitch::kOff, "false"},
    {AutoSwitch::kOn, "on"},     {AutoSwitch::kOff, "off"}, {AutoSwitch::kOn, "yes"},
    {AutoSwitch::kOff, "no"},    {AutoSwitch::kOn, "1"},    {AutoSwitch::kOff, "0"}};
constexpr EnumName<KvRecordType> kKvRecordTypeNames[] = {
    {KvRecordType::kAuto, "auto"}, {KvRecordType::kF16, "f16"}, {KvRecordType::kQ8_0, "q8_0"}};
constexpr EnumName<KeySummaryType> kKeySummaryTypeNames[] = {
    {KeySummaryType::kF16, "f16"}, {KeySummaryType::kQ8, "q8"}, {KeySummaryType::kQ4, "q4"}};

}  // namespace

const char* KvPolicyKindName(KvPolicyKind kind) { return EnumToName(kKvPolicyNames, kind); }
Status ParseKvPolicyKind(const std::string& name, KvPolicyKind* out) {
  return EnumFromName(kKvPolicyNames, "KV policy", name, out);
}

const char* ReusePolicyName(ReusePolicy p) { return EnumToName(kReusePolicyNames, p); }
Status ParseReusePolicy(const std::string& name, ReusePolicy* out) {
  return EnumFromName(kReusePolicyNames, "reuse policy", name, out);
}

const char* GroupScoringName(GroupScoring s) { return EnumToName(kGroupScoringNames, s); }
Status ParseGroupScoring(const std::string& name, GroupScoring* out) {
  return EnumFromName(kGroupScoringNames, "group scoring", name, out);
}

const char* AutoSwitchName(AutoSwitch s) { return EnumToName(kAutoSwitchNames, s); }
Status ParseAutoSwitch(const std::string& name, AutoSwitch* out) {
  // The message names the three meanings, not every spelling of them.
  if (EnumFromName(kAutoSwitchNames, "switch", name, out).ok()) return Status::OK();
  return Status::InvalidArgument("'" + name + "' is not auto, true or false");
}

const char* KvRecordTypeName(KvRecordType t) { return EnumToName(kKvRecordTypeNames, t); }
Status ParseKvRecordType(const std::string& name, KvRecordType* out) {
  return EnumFromName(kKvRecordTypeNames, "KV record type", name, out);
}

const char* KeySummaryTypeName(KeySummaryType t) { return EnumToName(kKeySummaryTypeNames, t); }
Status ParseKeySummaryType(const std::string& name, KeySummaryType* out) {
  return EnumFromName(kKeySummaryTypeNames, "key summary type", name, out);
}

Status ValidateDiskKvOptions(const DiskKvOptions& o) {
  // G above 64 makes a record of a big model larger than the store's largest request unit
  // and defeats the point of prediction; the paper uses 4 to 8.
  STRATA_RETURN_IF_ERROR(Range("kv.group_size (G)", o.group_size, 0, 64));
  STRATA_RETURN_IF_ERROR(Range("kv.ratio (sigma)", o.ratio, 0, 4096));
  STRATA_RETURN_IF_ERROR(Range("kv.groups_per_step (M)", o.groups_per_step, 0, 1 << 20));
  STRATA_RETURN_IF_ERROR(Range("kv.reuse_slots (C)", o.reuse_slots, 0, 1 << 20));
  STRATA_RETURN_IF_ERROR(Range("kv.read_through (T)", o.read_through, -1, 1 << 20));
  STRATA_RETURN_IF_ERROR(Range("kv.experimental.read_through_span", o.read_through_span, 1, 256));
  STRATA_RETURN_IF_ERROR(Range("kv.budget_bytes", o.budget_bytes, 0, int64_t(1) << 50));
  STRATA_RETURN_IF_ERROR(Range("kv.experimental.sink_groups", o.sink_groups, 0, 64));
  STRATA_RETURN_IF_ERROR(Range("kv.experimental.recent_groups", o.recent_groups, 0, 64));
  STRATA_RETURN_IF_ERROR(Range("kv.queue_depth", o.queue_depth, 1, 4096));
  if (!(o.resident_bonus >= 0.0f && o.resident_bonus <= 100.0f))
    return Status::OutOfRange("kv.experimental.resident_bonus = " +
                              std::to_string(o.resident_bonus) + " is out of range [0, 100]");
  if (!(o.dispersed_bonus >= -1.0f && o.dispersed_bonus <= 100.0f))
    return Status::OutOfRange(
        "kv.experimental.dispersed_bonus = " + std::to_string(o.dispersed_bonus) +
        " is out of range [-1, 100] (-1: as kv.experimental.resident_bonus)");
  if (!(o.tail_weight >= 0.0f && o.tail_weight <= 1.0f))
    return Status::OutOfRange("kv.experimental.tail_weight = " + std::to_string(o.tail_weight) +
                              " is out of range [0, 1]");
  STRATA_RETURN_IF_ERROR(Range("kv.experimental.tail_first_layer", o.tail_first_layer, 0, 1 << 16));
  if (!(o.group_spread >= 0.0f && o.group_spread <= 4.0f))
    return Status::OutOfRange("kv.experimental.group_spread = " + std::to_string(o.group_spread) +
                              " is out of range [0, 4]");
  if (o.backend != "auto" && o.backend != "io_uring" && o.backend != "pread")
    return Status::InvalidArgument("kv.backend = '" + o.backend +
                                   "' is not a block store backend (accepted: auto, io_uring, "
                                   "pread)");
  if (o.dir.empty()) return Status::InvalidArgument("kv.dir is empty: name a KV directory");
  return Status::OK();
}

Status CreateKvPolicy(const Model& model, const KvOptions& options, int32_t n_ctx,
                      int32_t max_sequences, ThreadPool* pool, std::unique_ptr<KvPolicy>* out) {
  const HParams& hp = model.hparams();
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx};
  switch (options.policy) {
    case KvPolicyKind::kMemory: {
      std::unique_ptr<MemoryKv> kv;
      STRATA_RETURN_IF_ERROR(MemoryKv::Create(shape, max_sequences, &kv));
      *out = std::move(kv);
      return Status::OK();
    }
    case KvPolicyKind::kDisk: {
      std::unique_ptr<DiskKv> kv;
      STRATA_RETURN_IF_ERROR(
          DiskKv::Create(model, options.disk, n_ctx, max_sequences, pool, &kv, options.hooks));
      *out = std::move(kv);
      return Status::OK();
    }
  }
  return Status::Internal("unhandled KV policy");
}

}  // namespace strata
