#include "runtime/kv/kv_options.h"

#include "runtime/kv/disk_kv.h"
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

const char* KvPolicyKindName(KvPolicyKind kind) {
  switch (kind) {
    case KvPolicyKind::kMemory:
      return "memory";
    case KvPolicyKind::kDisk:
      return "disk";
  }
  return "?";
}

Status ParseKvPolicyKind(const std::string& name, KvPolicyKind* out) {
  if (name == "memory") {
    *out = KvPolicyKind::kMemory;
    return Status::OK();
  }
  if (name == "disk") {
    *out = KvPolicyKind::kDisk;
    return Status::OK();
  }
  return Status::InvalidArgument("unknown KV policy '" + name + "' (accepted: memory, disk)");
}

const char* ReusePolicyName(ReusePolicy p) {
  switch (p) {
    case ReusePolicy::kFifo:
      return "fifo";
    case ReusePolicy::kLru:
      return "lru";
    case ReusePolicy::kLfu:
      return "lfu";
  }
  return "?";
}

Status ParseReusePolicy(const std::string& name, ReusePolicy* out) {
  for (ReusePolicy p : {ReusePolicy::kFifo, ReusePolicy::kLru, ReusePolicy::kLfu}) {
    if (name == ReusePolicyName(p)) {
      *out = p;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown reuse policy '" + name + "' (accepted: fifo, lru, lfu)");
}

const char* GroupScoringName(GroupScoring s) {
  return s == GroupScoring::kSoftmax ? "softmax" : "sum";
}

Status ParseGroupScoring(const std::string& name, GroupScoring* out) {
  if (name == "softmax" || name == "sum") {
    *out = name == "sum" ? GroupScoring::kSum : GroupScoring::kSoftmax;
    return Status::OK();
  }
  return Status::InvalidArgument("unknown group scoring '" + name + "' (accepted: softmax, sum)");
}

const char* AutoSwitchName(AutoSwitch s) {
  return s == AutoSwitch::kAuto ? "auto" : s == AutoSwitch::kOn ? "true" : "false";
}

Status ParseAutoSwitch(const std::string& name, AutoSwitch* out) {
  if (name == "auto") {
    *out = AutoSwitch::kAuto;
  } else if (name == "true" || name == "on" || name == "yes" || name == "1") {
    *out = AutoSwitch::kOn;
  } else if (name == "false" || name == "off" || name == "no" || name == "0") {
    *out = AutoSwitch::kOff;
  } else {
    return Status::InvalidArgument("'" + name + "' is not auto, true or false");
  }
  return Status::OK();
}

const char* KvRecordTypeName(KvRecordType t) {
  switch (t) {
    case KvRecordType::kAuto:
      return "auto";
    case KvRecordType::kF16:
      return "f16";
    case KvRecordType::kQ8_0:
      return "q8_0";
  }
  return "?";
}

Status ParseKvRecordType(const std::string& name, KvRecordType* out) {
  for (KvRecordType t : {KvRecordType::kAuto, KvRecordType::kF16, KvRecordType::kQ8_0}) {
    if (name == KvRecordTypeName(t)) {
      *out = t;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown KV record type '" + name +
                                 "' (accepted: auto, f16, q8_0)");
}

const char* KeySummaryTypeName(KeySummaryType t) {
  switch (t) {
    case KeySummaryType::kQ8:
      return "q8";
    case KeySummaryType::kQ4:
      return "q4";
    default:
      return "f16";
  }
}

Status ParseKeySummaryType(const std::string& name, KeySummaryType* out) {
  for (KeySummaryType t : {KeySummaryType::kF16, KeySummaryType::kQ8, KeySummaryType::kQ4}) {
    if (name == KeySummaryTypeName(t)) {
      *out = t;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown key summary type '" + name + "' (accepted: f16, q8, q4)");
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
