#include "runtime/search/beam_scheduler.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "common/enum_names.h"

namespace strata {

namespace {
// The benchmark's letters for the schedules, beside their names.
constexpr EnumName<BeamSchedule> kBeamScheduleNames[] = {{BeamSchedule::kTokenwise, "tokenwise"},
                                                         {BeamSchedule::kGrouped, "grouped"},
                                                         {BeamSchedule::kPrefix, "prefix"},
                                                         {BeamSchedule::kBalanced, "balanced"},
                                                         {BeamSchedule::kTokenwise, "a"},
                                                         {BeamSchedule::kGrouped, "b"},
                                                         {BeamSchedule::kPrefix, "c"},
                                                         {BeamSchedule::kBalanced, "d"}};
}  // namespace

const char* BeamScheduleName(BeamSchedule s) { return EnumToName(kBeamScheduleNames, s); }

Status ParseBeamSchedule(const std::string& name, BeamSchedule* out) {
  return EnumFromName(kBeamScheduleNames, "beam schedule", name, out);
}

int32_t WorkingSetBlocks(std::span<const BeamWork> work, std::span<const int32_t> beams) {
  std::unordered_set<int32_t> seen;
  int32_t n = 0;
  for (int32_t i : beams) {
    for (int32_t b : work[i].path) seen.insert(b);
    n += work[i].new_blocks;
  }
  return n + int32_t(seen.size());
}

namespace {

// Fills groups in `order`, starting a new group whenever the next beam would push the
// current one past `cap`. For contiguous runs of a fixed order this greedy gives the fewest
// groups (a run's working set only grows as it is extended).
std::vector<BeamGroup> FillInOrder(std::span<const BeamWork> work,
                                   const std::vector<int32_t>& order, int32_t cap) {
  std::vector<BeamGroup> groups;
  BeamGroup cur;
  std::unordered_set<int32_t> seen;
  for (int32_t i : order) {
    int32_t add = work[i].new_blocks;
    for (int32_t b : work[i].path) add += seen.count(b) ? 0 : 1;
    if (!cur.beams.empty() && cur.blocks + add > cap) {
      groups.push_back(std::move(cur));
      cur = BeamGroup();
      seen.clear();
      add = work[i].new_blocks + int32_t(work[i].path.size());
    }
    for (int32_t b : work[i].path) seen.insert(b);
    cur.beams.push_back(i);
    cur.blocks += add;
  }
  if (!cur.beams.empty()) groups.push_back(std::move(cur));
  return groups;
}

}  // namespace

Status PlanStep(std::span<const BeamWork> work, int32_t capacity, BeamSchedule schedule,
                bool reverse, StepPlan* out) {
  out->groups.clear();
  std::vector<int32_t> order(work.size());
  std::iota(order.begin(), order.end(), 0);
  out->total_blocks = WorkingSetBlocks(work, order);
  if (work.empty()) return Status::OK();
  for (size_t i = 0; i < work.size(); ++i) {
    const int32_t one = int32_t(work[i].path.size()) + work[i].new_blocks;
    if (schedule != BeamSchedule::kTokenwise && one > capacity)
      return Status::ResourceExhausted(
          "beam " + std::to_string(i) + " needs " + std::to_string(one) +
          " KV blocks for its step, the fast tier holds " + std::to_string(capacity));
  }
  if (schedule != BeamSchedule::kGrouped) {
    // Depth-first over the tree: paths compared block by block put every set of beams that
    // share a prefix next to each other, deepest shares innermost.
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return work[a].path < work[b].path; });
    if (reverse) std::reverse(order.begin(), order.end());
  }
  if (schedule == BeamSchedule::kTokenwise || out->total_blocks <= capacity) {
    out->groups.push_back({order, out->total_blocks});
    return Status::OK();
  }
  out->groups = FillInOrder(work, order, capacity);
  if (schedule != BeamSchedule::kBalanced) return Status::OK();
  // The fewest rounds are those of the greedy fill at full capacity; the smallest cap that
  // still needs no more rounds balances the groups (binary search: rounds fall as cap grows).
  const size_t rounds = out->groups.size();
  int32_t lo = (out->total_blocks + int32_t(rounds) - 1) / int32_t(rounds), hi = capacity;
  for (size_t i = 0; i < work.size(); ++i)
    lo = std::max(lo, int32_t(work[i].path.size()) + work[i].new_blocks);
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (FillInOrder(work, order, mid).size() <= rounds)
      hi = mid;
    else
      lo = mid + 1;
  }
  out->groups = FillInOrder(work, order, hi);
  return Status::OK();
}

}  // namespace strata
