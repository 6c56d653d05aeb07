#include "runtime/kv/disk/disk_kv_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <queue>
#include <tuple>

#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/disk/group_predictor.h"
#include "runtime/kv/disk/reuse_buffer.h"

namespace strata {
namespace {

std::string Mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MiB", double(b) / (1 << 20));
  return s;
}

// F16 K and V of the whole context, all layers: what the memory policy holds.
uint64_t FullCacheBytes(const KvShape& shape) {
  return uint64_t(shape.n_layer) * shape.n_ctx * shape.row() * 2 * 2;
}

uint64_t BudgetBytes(const KvShape& shape, const DiskKvOptions& o) {
  return o.budget_bytes > 0 ? uint64_t(o.budget_bytes)
                            : FullCacheBytes(shape) / kDefaultBudgetDivisor;
}

// Tables per layer and sequence besides the slot table: the view's spans, this step's
// selection and its placements. t: read-through slots.
uint64_t TablesPerLayer(int32_t c, int32_t m, int32_t sink, int32_t recent, int32_t t) {
  const uint64_t spans = uint64_t(std::max(c + t, m)) + sink + recent + 1;
  return ReuseBuffer::TableBytes(c + t, t > 0) + spans * sizeof(kernels::KvSpan) +
         uint64_t(m) * (sizeof(int32_t) + 3 * sizeof(int32_t));
}

// Per layer and sequence with kv.experimental.attend_tail: the values' sum (committed and this
// pass's), their mean for the view, and each query head's left-out share.
uint64_t TailBytesPerLayer(const KvShape& shape, int32_t n_head) {
  return (3 * uint64_t(shape.row()) + uint64_t(n_head)) * sizeof(float);
}

// Slots per layer: each layer's C_l = M_l * C / M (at least M_l - t and 1, at most
// max_groups), the rounding spread so the sum is L*C where the bounds allow. With
// read-through slots the floors M_l - t may not fit in L*C: then the layers with the most
// slots give theirs up and attend M_l = C_l + t (groups is lowered).
std::vector<int32_t> SpreadSlots(std::vector<int32_t>& groups, int32_t m, int32_t c,
                                 int32_t max_groups, int32_t t) {
  const size_t L = groups.size();
  std::vector<int32_t> slots(L), floor(L);
  std::vector<double> want(L);
  int64_t left = int64_t(c) * int64_t(L);
  for (size_t l = 0; l < L; ++l) {
    floor[l] = std::min(max_groups, std::max(1, groups[l] - t));
    want[l] = double(groups[l]) * c / std::max(m, 1);
    slots[l] = std::clamp(int32_t(want[l]), floor[l], max_groups);
    left -= slots[l];
  }
  while (left != 0) {
    // Give (or take) one slot where the rounding was furthest from the wish.
    int best = -1;
    for (size_t l = 0; l < L; ++l) {
      const bool can = left > 0 ? slots[l] < max_groups : slots[l] > floor[l];
      if (!can) continue;
      const double d = want[l] - slots[l];
      if (best < 0 || (left > 0 ? d > want[size_t(best)] - slots[size_t(best)]
                                : d < want[size_t(best)] - slots[size_t(best)]))
        best = int(l);
    }
    if (best < 0) break;
    slots[size_t(best)] += left > 0 ? 1 : -1;
    left += left > 0 ? -1 : 1;
  }
  for (; left < 0; ++left) {
    const auto most = std::max_element(slots.begin(), slots.end());
    if (*most <= 1) break;
    --*most;
  }
  for (size_t l = 0; l < L; ++l) groups[l] = std::min(groups[l], slots[l] + t);
  return slots;
}

}  // namespace

std::vector<int32_t> SpreadGroups(const AttentionProfile& profile, int32_t n_layer, int32_t m,
                                  int32_t group_size, int32_t max_groups) {
  const int32_t lo = std::min(max_groups, std::max(1, m / 4));
  std::vector<int32_t> g(size_t(n_layer), lo);
  int64_t left = int64_t(m) * n_layer - int64_t(lo) * n_layer;
  // Rounded so that equal slopes compare equal whatever the interpolation's rounding.
  auto gain = [&](int32_t l) {
    const double d =
        profile.Drop(l, double(g[size_t(l)]) * group_size, double(g[size_t(l)] + 1) * group_size);
    return std::round(d * 1e9) / 1e9;
  };
  // (gain, -groups, -layer): equal gains go to the layer with fewer groups, then the earlier.
  using Item = std::tuple<double, int32_t, int32_t>;
  std::priority_queue<Item> q;
  auto push = [&](int32_t l) {
    if (g[size_t(l)] < max_groups) q.push({gain(l), -g[size_t(l)], -l});
  };
  for (int32_t l = 0; l < n_layer; ++l) push(l);
  while (left > 0 && !q.empty()) {
    const int32_t l = -std::get<2>(q.top());
    q.pop();
    ++g[size_t(l)];
    --left;
    push(l);
  }
  return g;
}

std::vector<int32_t> DispersedLayers(const AttentionProfile& profile, int32_t n_layer,
                                     double tokens) {
  std::vector<int32_t> out;
  if (profile.empty() || int32_t(profile.error.size()) != n_layer || n_layer <= 0) return out;
  std::vector<double> e(static_cast<size_t>(n_layer));
  for (int32_t l = 0; l < n_layer; ++l) e[size_t(l)] = profile.Error(l, tokens);
  std::vector<double> sorted = e;
  std::nth_element(sorted.begin(), sorted.begin() + n_layer / 2, sorted.end());
  const double median = sorted[size_t(n_layer / 2)];
  if (!(median > 0.0)) return out;
  for (int32_t l = 0; l < n_layer; ++l)
    if (e[size_t(l)] >= kDispersedErrorRatio * median) out.push_back(l);
  return out;
}

std::string DiskKvPlan::Describe() const {
  const std::string read_through =
      transient_groups > 0
          ? " T=" + std::to_string(transient_groups) +
                (transient_auto ? " (read-through, auto" : " (read-through") +
                (transient_span > 1 ? ", spans of " + std::to_string(transient_span) + ")" : ")")
          : "";
  char s[640];
  std::snprintf(s, sizeof s,
                "G=%d sigma=%d (%srank %d, %s%s) M=%d C=%d%s%s sink=%d recent=%d %s "
                "records of %u B: %s of a %s budget per sequence (%.1fx below the full cache "
                "of %s): K_lr %s, reuse slots %s, "
                "rolling+recent %s, sink %s, write staging %s, read-through %s, tables %s",
                layout.group_size, ratio, ratio_auto ? "auto, " : "", rank,
                KeySummaryTypeName(summary_type), group_summary ? ", a row per group" : "",
                groups_per_step, reuse_slots, read_through.c_str(), tight ? " (tight)" : "",
                sink_groups, recent_groups, layout.type == kernels::KvType::kQ8_0 ? "q8_0" : "f16",
                layout.record_bytes, Mib(total_bytes()).c_str(), Mib(budget_bytes).c_str(),
                double(full_cache_bytes) / double(total_bytes()), Mib(full_cache_bytes).c_str(),
                Mib(klr_bytes).c_str(), Mib(slot_bytes).c_str(), Mib(ring_bytes).c_str(),
                Mib(sink_bytes).c_str(), Mib(write_bytes).c_str(), Mib(transient_bytes).c_str(),
                Mib(table_bytes).c_str());
  std::string out = s;
  if (calibrated) {
    // "; per layer (attention profile) M 25..310, C 33..406"
    const auto [m_lo, m_hi] = std::minmax_element(layer_groups.begin(), layer_groups.end());
    const auto [c_lo, c_hi] = std::minmax_element(layer_slots.begin(), layer_slots.end());
    out += "; per layer (attention profile) M " + std::to_string(*m_lo) + ".." +
           std::to_string(*m_hi) + ", C " + std::to_string(*c_lo) + ".." + std::to_string(*c_hi);
  } else if (!uniform_reason.empty()) {
    out += "; every layer M and C (" + uniform_reason + ")";
  }
  if (!dispersed_layers.empty()) {
    // "; dispersed attention in layers 0,1,2 (resident bonus 10)"
    out += "; dispersed attention in layers ";
    for (size_t i = 0; i < dispersed_layers.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(dispersed_layers[i]);
    }
    char b[48];
    std::snprintf(b, sizeof b, " (resident bonus %g)",
                  double(layer_bonus[size_t(dispersed_layers[0])]));
    out += b;
  }
  if (tail) out += "; left-out keys attended by estimate (kv.experimental.attend_tail)";
  return out;
}

int32_t AutoGroupSize(const KvShape& shape, uint32_t block_size, kernels::KvType type) {
  int32_t best = kAutoGroupMin;
  double best_fill = 0;
  for (int32_t g = kAutoGroupMin; g <= kAutoGroupMax; ++g) {
    const KvRecordLayout l = KvRecordLayout::Make(shape, g, block_size, type);
    const double fill = double(l.payload_bytes) / double(l.record_bytes);
    if (fill > best_fill + 1e-9) best = g, best_fill = fill;
  }
  return best;
}

int32_t AutoRatio(const KvShape& shape, const DiskKvOptions& o, std::span<const int32_t> available,
                  int32_t row_tokens) {
  static constexpr int32_t kCalibrateDefault[] = {4, 8, 16, 32};
  std::vector<int32_t> ratios(available.begin(), available.end());
  if (ratios.empty()) ratios.assign(std::begin(kCalibrateDefault), std::end(kCalibrateDefault));
  std::sort(ratios.begin(), ratios.end());
  const double allowed = kAutoSummaryShare * double(BudgetBytes(shape, o));
  const kernels::ScoreType type = ScoreTypeOf(o.summary_type);
  for (int32_t r : ratios) {
    int32_t rank = 0;
    if (!RankForRatio(shape.row(), r, &rank).ok()) continue;
    const int64_t rows = shape.n_ctx / std::max(row_tokens, 1);
    const uint64_t klr =
        uint64_t(shape.n_layer) * GroupPredictor::SummaryBytes(rows, rank, type, row_tokens > 1);
    if (double(klr) <= allowed) return r;
  }
  return ratios.back();
}

namespace {

// One plan with the summary per group or per token and t read-through slots; tight_as:
// the tightness to assume (the per-token plan's, when auto chose the per-group summary),
// null = this plan's own.
Status PlanOnce(const KvShape& shape, int32_t n_head, const DiskKvOptions& o, uint32_t block_size,
                const AttentionProfile* profile, std::span<const int32_t> ratios,
                bool group_summary, int32_t t, const bool* tight_as, DiskKvPlan* out) {
  DiskKvPlan p;
  p.group_summary = group_summary;
  p.n_ctx = shape.n_ctx;
  const bool q8_fits = shape.head_dim % 32 == 0;
  if (o.record_type == KvRecordType::kQ8_0 && !q8_fits)
    return Status::InvalidArgument(
        "kv.record_type = q8_0 needs a head dimension that is a multiple of 32 (Q8_0 blocks "
        "hold 32 values); this model's is " +
        std::to_string(shape.head_dim) + ": use f16 or auto");
  const bool q8 =
      o.record_type == KvRecordType::kQ8_0 || (o.record_type == KvRecordType::kAuto && q8_fits);
  const kernels::KvType type = q8 ? kernels::KvType::kQ8_0 : kernels::KvType::kF16;
  const int32_t G = o.group_size > 0 ? o.group_size : AutoGroupSize(shape, block_size, type);
  p.layout = KvRecordLayout::Make(shape, G, block_size, type);
  p.ratio_auto = o.ratio == 0;
  p.ratio = p.ratio_auto ? AutoRatio(shape, o, ratios, group_summary ? G : 1) : o.ratio;
  STRATA_RETURN_IF_ERROR(RankForRatio(shape.row(), p.ratio, &p.rank).WithContext("kv.ratio"));
  p.sink_groups = o.sink_groups;
  p.recent_groups = o.recent_groups;
  const int32_t max_groups = p.layout.max_groups;
  if (G > shape.n_ctx)
    return Status::OutOfRange("kv.group_size (G) = " + std::to_string(G) +
                              " is larger than the context of " + std::to_string(shape.n_ctx) +
                              " tokens");
  if (o.groups_per_step > max_groups)
    return Status::OutOfRange("kv.groups_per_step (M) = " + std::to_string(o.groups_per_step) +
                              " is out of range [1, " + std::to_string(max_groups) +
                              "]: a context of " + std::to_string(shape.n_ctx) + " tokens holds " +
                              std::to_string(max_groups) + " groups of " + std::to_string(G));
  if (t > max_groups)
    return Status::OutOfRange("kv.read_through (T) = " + std::to_string(t) +
                              " is out of range [0, " + std::to_string(max_groups) +
                              "]: a context of " + std::to_string(shape.n_ctx) + " tokens holds " +
                              std::to_string(max_groups) + " groups of " + std::to_string(G));
  p.full_cache_bytes = FullCacheBytes(shape);
  p.budget_bytes = BudgetBytes(shape, o);
  p.transient_groups = t;
  p.transient_span = o.read_through_span;

  const uint64_t L = uint64_t(shape.n_layer), rec = p.layout.record_bytes;
  p.summary_type = o.summary_type;
  p.klr_bytes = L * GroupPredictor::SummaryBytes(p.SummaryRows(shape.n_ctx), p.rank,
                                                 p.summary_score_type(), group_summary);
  p.ring_bytes = L * uint64_t(p.ring_records()) * rec;
  p.sink_bytes = L * uint64_t(p.sink_groups) * rec;
  p.write_bytes = L * rec;
  p.transient_bytes = uint64_t(p.transient_records()) * rec;
  p.tail = o.attend_tail && o.scoring == GroupScoring::kSoftmax && !group_summary && !o.reload_all;
  const uint64_t tail_bytes = p.tail ? L * TailBytesPerLayer(shape, n_head) : 0;
  const uint64_t fixed =
      p.klr_bytes + p.ring_bytes + p.sink_bytes + p.write_bytes + p.transient_bytes + tail_bytes;
  // What a configuration with c slots and m selected groups per layer costs.
  auto cost = [&](int32_t c, int32_t m) {
    return fixed +
           L * (uint64_t(c) * rec + TablesPerLayer(c, m, p.sink_groups, p.recent_groups, t));
  };
  // The fewest slots m selected groups need: the rest are read through.
  auto least_slots = [&](int32_t m) { return std::max(1, m - t); };

  const int32_t m_min = o.groups_per_step > 0 ? o.groups_per_step : 1;
  const uint64_t minimum = cost(std::max(least_slots(m_min), o.reuse_slots), m_min);
  auto below = [&](uint64_t need) {
    return Status::ResourceExhausted(
        "KV budget of " + std::to_string(p.budget_bytes) + " bytes (" + Mib(p.budget_bytes) +
        ") per sequence is below the minimum of " + std::to_string(need) + " bytes (" + Mib(need) +
        ") for G=" + std::to_string(G) + ", sigma=" + std::to_string(p.ratio) +
        (p.ratio_auto ? " (auto)" : "") + (group_summary ? " (K_lr per group)" : "") +
        ", M=" + std::to_string(m_min) + (t > 0 ? ", T=" + std::to_string(t) : "") +
        " at a context of " + std::to_string(shape.n_ctx) + " tokens (K_lr alone takes " +
        Mib(p.klr_bytes) + "); raise kv.budget_bytes or the ratio, or lower M or the context");
  };
  if (minimum > p.budget_bytes) return below(minimum);

  // Slots the budget affords with m selected groups: the cost is linear in c >= m - t (the
  // views grow with c too, as attention may read every slot).
  auto fit = [&](int32_t m) {
    const int32_t c0 = least_slots(m);
    if (cost(c0, m) > p.budget_bytes) return c0;  // refused below
    const uint64_t per_slot = cost(c0 + 1, m) - cost(c0, m);
    const uint64_t c = uint64_t(c0) + (p.budget_bytes - cost(c0, m)) / per_slot;
    return int32_t(std::min<uint64_t>(c, uint64_t(max_groups)));
  };
  // M left at 0 is C + T: every slot is chosen afresh each step. Attention reads every slot
  // anyway (kv.experimental.attend_resident), a fresh pick serves it better than a stale one, and
  // the resident bonus keeps the reads near those of the paper's M*G ~ 400 (numbers in
  // docs/experiments/disk-kv-quality.md). C left at 0 is what the budget affords.
  int32_t m = o.groups_per_step;
  int32_t c = o.reuse_slots;
  if (c == 0) c = fit(std::max(m, 1));
  if (m == 0) {
    if (o.reuse_slots == 0)
      while (c > 1 && cost(c, std::min(c + t, max_groups)) > p.budget_bytes) --c;
    m = std::min(c + t, max_groups);
  }
  if (c < least_slots(m))
    return Status::OutOfRange(
        "kv.reuse_slots (C) = " + std::to_string(c) +
        (t > 0 ? " plus kv.read_through (T) = " + std::to_string(t) : "") +
        " must be at least M = " + std::to_string(m) +
        " (every selected group needs a slot; kv.read_through gives groups read for one step)");
  if (cost(c, m) > p.budget_bytes) return below(cost(c, m));
  p.groups_per_step = m;
  p.reuse_slots = c;
  p.layer_groups.assign(size_t(L), m);
  p.layer_slots.assign(size_t(L), c);
  // Slots that hold the whole context are not tight, however few tokens that is.
  p.tight = tight_as ? *tight_as : int64_t(c) * G < kTightSlotTokens && c < max_groups;
  const bool spread = o.calibrated_layers == AutoSwitch::kOn ||
                      (o.calibrated_layers == AutoSwitch::kAuto && p.tight);
  if (spread && profile && !profile->empty() && int32_t(profile->error.size()) == shape.n_layer) {
    p.layer_groups = SpreadGroups(*profile, shape.n_layer, m, G, max_groups);
    p.layer_slots = SpreadSlots(p.layer_groups, m, c, max_groups, t);
    p.calibrated = true;
  } else if (spread) {
    p.uniform_reason =
        "the adapters have no attention profile; recalibrate to spread M and C "
        "over the layers";
  }
  // Costs are linear in each layer's C and M, so the spread ones sum to at most the uniform
  // (unless a layer's M_l - T needed more slots than its share: then the total refuses).
  for (size_t l = 0; l < size_t(L); ++l) {
    p.slot_bytes += uint64_t(p.layer_slots[l]) * rec;
    p.table_bytes +=
        TablesPerLayer(p.layer_slots[l], p.layer_groups[l], p.sink_groups, p.recent_groups, t);
  }
  p.table_bytes += tail_bytes;
  if (p.total_bytes() > p.budget_bytes) return below(p.total_bytes());
  p.layer_bonus.assign(size_t(L), o.resident_bonus);
  if (o.dispersed_bonus >= 0.0f && profile) {
    p.dispersed_layers = DispersedLayers(*profile, shape.n_layer, double(m) * G);
    for (int32_t l : p.dispersed_layers) p.layer_bonus[size_t(l)] = o.dispersed_bonus;
  }
  *out = p;
  return Status::OK();
}

// kv.read_through: as given; auto: where the plan is tight and M is left to it, the fewest
// T for which M*G reaches kReadThroughTokens, or the most that stays at most C (T*L reads
// a step are the price: no more than the persistent slots); else 0.
Status PlanWithReadThrough(const KvShape& shape, int32_t n_head, const DiskKvOptions& o,
                           uint32_t block_size, const AttentionProfile* profile,
                           std::span<const int32_t> ratios, bool group_summary,
                           const bool* tight_as, DiskKvPlan* out) {
  if (o.read_through >= 0)
    return PlanOnce(shape, n_head, o, block_size, profile, ratios, group_summary, o.read_through,
                    tight_as, out);
  DiskKvPlan base;
  STRATA_RETURN_IF_ERROR(
      PlanOnce(shape, n_head, o, block_size, profile, ratios, group_summary, 0, tight_as, &base));
  *out = base;
  const int32_t G = base.layout.group_size;
  if (!base.tight || o.groups_per_step > 0 || o.reuse_slots > 0 ||
      int64_t(base.groups_per_step) * G >= kReadThroughTokens)
    return Status::OK();
  const int32_t want = (kReadThroughTokens + G - 1) / G;
  for (int32_t t = 1; t <= base.layout.max_groups; ++t) {
    DiskKvPlan p;
    if (!PlanOnce(shape, n_head, o, block_size, profile, ratios, group_summary, t, tight_as, &p)
             .ok() ||
        t > p.reuse_slots)
      break;
    p.transient_auto = true;
    *out = p;
    if (p.groups_per_step >= want) break;
  }
  return Status::OK();
}

}  // namespace

Status PlanDiskKv(const KvShape& shape, const DiskKvOptions& o, uint32_t block_size,
                  DiskKvPlan* out, const AttentionProfile* profile, std::span<const int32_t> ratios,
                  int32_t n_head) {
  if (n_head <= 0) n_head = shape.n_head_kv;
  STRATA_RETURN_IF_ERROR(ValidateDiskKvOptions(o));
  if (o.group_summary != AutoSwitch::kAuto)
    return PlanWithReadThrough(shape, n_head, o, block_size, profile, ratios,
                               o.group_summary == AutoSwitch::kOn, nullptr, out);
  DiskKvPlan per_token;
  const Status st = PlanWithReadThrough(shape, n_head, o, block_size, profile, ratios, false,
                                        nullptr, &per_token);
  if (st.ok() && !per_token.tight) {
    *out = per_token;
    return st;
  }
  if (!st.ok() && st.code() != Status::Code::kResourceExhausted) return st;
  // Tight, or refused for want of memory: a summary G times smaller leaves more for slots.
  const bool tight = true;
  DiskKvPlan per_group;
  const Status gs =
      PlanWithReadThrough(shape, n_head, o, block_size, profile, ratios, true, &tight, &per_group);
  if (!gs.ok()) {
    if (!st.ok()) return gs;  // refused either way: the per-group minimum is the smaller
    *out = per_token;
    return st;
  }
  per_group.group_summary_auto = true;
  *out = per_group;
  return Status::OK();
}

}  // namespace strata
