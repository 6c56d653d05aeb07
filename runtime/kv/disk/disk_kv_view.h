// How decode attention sees a layer of a disk KV sequence (internal to runtime/kv/disk): which
// records it reads, in what order, and the spans that point at them. Owns nothing: it reads
// the layer's state (disk_kv_state.h) and the plan, and writes the layer's view. Same
// threading as DiskKv (the selector calls ForEachViewed from pool workers, one sequence
// each).
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_state.h"

namespace strata::disk_kv {

// What decode attention reads of a layer at position p (the pass's new token), in its
// view's order: fn(kind, group, where, tokens) for the sink groups (where: sink record), the
// selection's placements and, with kv.experimental.attend_resident, the other groups the slots hold
// (where: slot), then the recent and rolling groups (where: ring record; the rolling one with
// the pass's new token).
enum class Viewed { kSink, kSlot, kResident, kRing };
template <typename Fn>
void ForEachViewed(const DiskKvPlan& plan, bool attend_resident, const Layer& L, int32_t p,
                   Fn&& fn) {
  const int32_t G = plan.layout.group_size, gp = p / G, R = plan.ring_records();
  const int32_t n_sink = std::min(plan.sink_groups, gp);
  for (int32_t g = 0; g < n_sink; ++g) fn(Viewed::kSink, g, g, G);
  for (const ReuseBuffer::Placement& pl : L.placed) fn(Viewed::kSlot, pl.group, pl.slot, G);
  const int32_t g_hi = std::max(n_sink, gp - plan.recent_groups);
  if (attend_resident) {
    // Groups still held from earlier steps: their reads settled then (a failed one cleared
    // its slot), and they lie between the sink and the ring like every selected group.
    // Read-through slots the refinement gave up still hold this step's reads too.
    for (int32_t i = 0; i < L.reuse.size(); ++i) {
      const int32_t g = L.reuse.group_of(i);
      if (g >= n_sink && g < g_hi && !L.reuse.placed_last(i)) fn(Viewed::kResident, g, i, G);
    }
  }
  for (int32_t g = g_hi; g < gp; ++g) fn(Viewed::kRing, g, g % R, G);
  fn(Viewed::kRing, gp, gp % R, p - gp * G + 1);
}

// Layer `layer` of s's decode view into its Layer::view, once its reads have settled; with
// kv.experimental.attend_tail also the values' mean over every token so far and the pass's. Returns
// how many groups it attends only because they were still resident.
inline int32_t AssembleDecodeView(const DiskKvPlan& plan, bool attend_resident, Sequence& s,
                                  int32_t layer) {
  Layer& L = s.layers[size_t(layer)];
  const int32_t p = s.length;
  const uint32_t rec = plan.layout.record_bytes;
  int32_t resident = 0;
  L.view.clear();
  ForEachViewed(plan, attend_resident, L, p, [&](Viewed kind, int32_t g, int32_t where, int32_t n) {
    const std::byte* r = kind == Viewed::kSink   ? L.sink + size_t(where) * rec
                         : kind == Viewed::kRing ? L.ring + size_t(where) * rec
                                                 : s.SlotRecord(layer, where);
    L.view.push_back(plan.layout.Span(r, g, n));
    if (kind == Viewed::kResident) ++resident;
  });
  if (plan.tail) {
    const float inv = 1.0f / float(p + s.pending);
    for (size_t i = 0; i < L.v_mean.size(); ++i) L.v_mean[i] = (L.v_sum[i] + L.v_new[i]) * inv;
  }
  return resident;
}

}  // namespace strata::disk_kv
