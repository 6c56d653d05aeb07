#include "runtime/kv/disk_kv_plan.h"

#include <algorithm>
#include <cstdio>

#include "runtime/kv/adapters.h"
#include "runtime/kv/group_predictor.h"
#include "runtime/kv/reuse_buffer.h"

namespace strata {
namespace {

std::string Mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MiB", double(b) / (1 << 20));
  return s;
}

// Tables per layer and sequence besides the slot table: the view's spans, this step's
// selection and its placements.
uint64_t TablesPerLayer(int32_t c, int32_t m, int32_t sink, int32_t recent) {
  const uint64_t spans = uint64_t(m) + sink + recent + 1;
  return ReuseBuffer::TableBytes(c) + spans * sizeof(kernels::KvSpan) +
         uint64_t(m) * (sizeof(int32_t) + 3 * sizeof(int32_t));
}

}  // namespace

std::string DiskKvPlan::Describe() const {
  char s[512];
  std::snprintf(s, sizeof s,
                "G=%d sigma=%d (rank %d) M=%d C=%d sink=%d recent=%d %s records of %u B: %s of "
                "a %s budget per "
                "sequence (%.1fx below the full cache of %s): K_lr %s, reuse slots %s, "
                "rolling+recent %s, sink %s, write staging %s, tables %s",
                layout.group_size, ratio, rank, groups_per_step, reuse_slots, sink_groups,
                recent_groups, layout.type == kernels::KvType::kQ8_0 ? "q8_0" : "f16",
                layout.record_bytes, Mib(total_bytes()).c_str(), Mib(budget_bytes).c_str(),
                double(full_cache_bytes) / double(total_bytes()), Mib(full_cache_bytes).c_str(),
                Mib(klr_bytes).c_str(), Mib(slot_bytes).c_str(), Mib(ring_bytes).c_str(),
                Mib(sink_bytes).c_str(), Mib(write_bytes).c_str(), Mib(table_bytes).c_str());
  return s;
}

Status PlanDiskKv(const KvShape& shape, const DiskKvOptions& o, uint32_t block_size,
                  DiskKvPlan* out) {
  STRATA_RETURN_IF_ERROR(ValidateDiskKvOptions(o));
  DiskKvPlan p;
  p.n_ctx = shape.n_ctx;
  const bool q8_fits = shape.head_dim % 32 == 0;
  if (o.record_type == KvRecordType::kQ8_0 && !q8_fits)
    return Status::InvalidArgument(
        "kv.record_type = q8_0 needs a head dimension that is a multiple of 32 (Q8_0 blocks "
        "hold 32 values); this model's is " +
        std::to_string(shape.head_dim) + ": use f16 or auto");
  const bool q8 =
      o.record_type == KvRecordType::kQ8_0 || (o.record_type == KvRecordType::kAuto && q8_fits);
  p.layout = KvRecordLayout::Make(shape, o.group_size, block_size,
                                  q8 ? kernels::KvType::kQ8_0 : kernels::KvType::kF16);
  STRATA_RETURN_IF_ERROR(RankForRatio(shape.row(), o.ratio, &p.rank).WithContext("kv.ratio"));
  p.ratio = o.ratio;
  p.sink_groups = o.sink_groups;
  p.recent_groups = o.recent_groups;
  const int32_t max_groups = p.layout.max_groups;
  if (o.group_size > shape.n_ctx)
    return Status::OutOfRange("kv.group_size (G) = " + std::to_string(o.group_size) +
                              " is larger than the context of " + std::to_string(shape.n_ctx) +
                              " tokens");
  if (o.groups_per_step > max_groups)
    return Status::OutOfRange("kv.groups_per_step (M) = " + std::to_string(o.groups_per_step) +
                              " is out of range [1, " + std::to_string(max_groups) +
                              "]: a context of " + std::to_string(shape.n_ctx) + " tokens holds " +
                              std::to_string(max_groups) + " groups of " +
                              std::to_string(o.group_size));
  p.full_cache_bytes = uint64_t(shape.n_layer) * shape.n_ctx * shape.row() * 2 * 2;
  p.budget_bytes =
      o.budget_bytes > 0 ? uint64_t(o.budget_bytes) : p.full_cache_bytes / kDefaultBudgetDivisor;

  const uint64_t L = uint64_t(shape.n_layer), rec = p.layout.record_bytes;
  p.klr_bytes = L * uint64_t(GroupPredictor::KlrTokens(shape.n_ctx)) * uint64_t(p.rank) * 2;
  p.ring_bytes = L * uint64_t(p.ring_records()) * rec;
  p.sink_bytes = L * uint64_t(p.sink_groups) * rec;
  p.write_bytes = L * rec;
  const uint64_t fixed = p.klr_bytes + p.ring_bytes + p.sink_bytes + p.write_bytes;
  // What a configuration with c slots and m selected groups per layer costs.
  auto cost = [&](int32_t c, int32_t m) {
    return fixed + L * (uint64_t(c) * rec + TablesPerLayer(c, m, p.sink_groups, p.recent_groups));
  };

  const int32_t m_default =
      std::min(max_groups, (kDefaultSelectedTokens + o.group_size - 1) / o.group_size);
  const int32_t m_min = o.groups_per_step > 0 ? o.groups_per_step : 1;
  const uint64_t minimum = cost(std::max(m_min, o.reuse_slots), m_min);
  auto below = [&](uint64_t need) {
    return Status::ResourceExhausted(
        "KV budget of " + std::to_string(p.budget_bytes) + " bytes (" + Mib(p.budget_bytes) +
        ") per sequence is below the minimum of " + std::to_string(need) + " bytes (" + Mib(need) +
        ") for G=" + std::to_string(o.group_size) + ", sigma=" + std::to_string(o.ratio) +
        ", M=" + std::to_string(m_min) + " at a context of " + std::to_string(shape.n_ctx) +
        " tokens (K_lr alone takes " + Mib(p.klr_bytes) +
        "); raise kv.budget_bytes or the ratio, or lower M or the context");
  };
  if (minimum > p.budget_bytes) return below(minimum);

  // Slots the budget affords with m selected groups: the cost is linear in c.
  auto fit = [&](int32_t m) {
    const uint64_t per_slot = cost(1, m) - cost(0, m);
    const uint64_t c = (p.budget_bytes - cost(0, m)) / per_slot;
    return int32_t(std::min<uint64_t>(c, uint64_t(max_groups)));
  };
  int32_t m = o.groups_per_step;
  if (m == 0) {
    m = m_default;
    while (m > 1 && cost(m, m) > p.budget_bytes) --m;
  }
  int32_t c = o.reuse_slots;
  if (c == 0) c = fit(m);
  if (c < m)
    return Status::OutOfRange("kv.reuse_slots (C) = " + std::to_string(c) +
                              " must be at least M = " + std::to_string(m) +
                              " (every selected group needs a slot)");
  if (cost(c, m) > p.budget_bytes) return below(cost(c, m));
  p.groups_per_step = m;
  p.reuse_slots = c;
  p.slot_bytes = L * uint64_t(c) * rec;
  p.table_bytes = L * TablesPerLayer(c, m, p.sink_groups, p.recent_groups);
  *out = p;
  return Status::OK();
}

}  // namespace strata
