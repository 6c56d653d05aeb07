// Beam scheduling: which beams run together in one step, for locality across memory tiers
// (DESIGN.md, "Locality-aware beam scheduling").
//
// Inside a step the beams are independent, so a step can run group by group: every group's
// KV (the union of its beams' prefix-tree blocks plus the blocks its step will add) must
// fit the fast tier, and the group runs its whole step as one batch (inter-token locality:
// its blocks are loaded once per step, not once per token). The schedules, each adding one
// idea to the previous, as the benchmark compares them:
//   kTokenwise   (a) the baseline: all beams advance together token by token, and what
//                does not fit is streamed per layer every pass (no planning here: one group)
//   kGrouped     (b) groups filled in the search's own order (ranked by score)
//   kPrefix      (c) beams ordered depth-first over the prefix tree, so beams with the
//                longest shared prefixes share a group and each shared block is loaded once
//                per group (inter-beam locality); the order alternates direction every
//                step so the group that ends a step starts the next with its blocks resident
//   kBalanced    (d) the minimum number of rounds of (c) with the largest group as small as
//                possible, leaving room to prefetch the next group while one computes
// When everything fits, every schedule runs all beams as one group.
//
// Pure functions of their inputs; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

enum class BeamSchedule { kTokenwise, kGrouped, kPrefix, kBalanced };
// "tokenwise", "grouped", "prefix", "balanced"
const char* BeamScheduleName(BeamSchedule s);
// Accepts the names above and the benchmark's letters a, b, c, d.
Status ParseBeamSchedule(const std::string& name, BeamSchedule* out);

// One beam's share of a step.
struct BeamWork {
  std::vector<int32_t> path;  // its prefix-tree blocks, root first
  int32_t new_blocks = 0;     // fast-tier blocks its step adds (new and copied blocks)
};

struct BeamGroup {
  std::vector<int32_t> beams;  // indices into the BeamWork list, in run order
  int32_t blocks = 0;          // working set: distinct path blocks + new blocks
};

struct StepPlan {
  std::vector<BeamGroup> groups;
  int32_t total_blocks = 0;  // working set of all beams together
};

// The working set of `beams` (indices into `work`).
int32_t WorkingSetBlocks(std::span<const BeamWork> work, std::span<const int32_t> beams);

// Plans one step over a fast tier of `capacity` blocks. `reverse` flips the depth-first
// order (kPrefix, kBalanced: pass true on every other step). ResourceExhausted, naming the
// beam and its size, when one beam alone does not fit.
Status PlanStep(std::span<const BeamWork> work, int32_t capacity, BeamSchedule schedule,
                bool reverse, StepPlan* out);

}  // namespace strata
