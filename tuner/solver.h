// The search of one tuned entry, on numbers alone: which plan of which budget to measure
// next, and when no plan left can beat the best one found. `strata tune` (tuner/tune.cc)
// feeds it the cost model's optimistic speeds and measures what it asks for; the tests
// feed it synthetic cost tables and compare with an exhaustive search.
//
// What it relies on (and where it is not exact):
//   - A plan's predicted speed never exceeds its optimistic speed (the cost model without
//     reads): a plan whose optimistic speed cannot beat the best found is not measured.
//   - Quality grows with the budget for the runtime's own choice of settings (the
//     `automatic` plan of a budget), so the smallest budget at which it keeps the bound is
//     found by bisection.
//   - Other settings are searched at that budget, every larger one and the next smaller
//     one: a setting that keeps the bound two budgets below where the runtime's own choice
//     fails is not looked for.
//   - A variant (a plan with a parent: the same settings with more groups re-selected a
//     step) keeps no better quality than its parent, and its speed is known only once its
//     reads are measured, so the optimistic bound says little about it. Variants are
//     searched last, with a cap of their own, each only if its parent kept the bound (or
//     was never measured because it could not win), best known speed first.
// Within that, the search is exact: it returns what measuring every plan would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"

namespace strata {

struct SolverPlan {
  double optimistic_tokens_per_second = 0;
  bool automatic = false;  // the runtime's own settings at this budget (at most one a budget)
  int32_t parent = -1;     // a variant of that plan of the same budget (see above); -1: none
};

struct SolverSpace {
  // Budgets from the largest down; a smaller budget's plans are faster and keep less.
  std::vector<std::vector<SolverPlan>> budgets;
  // Full KV in memory, when it fits: exact (always within the bound), its speed predicted.
  bool memory_fits = false;
  double memory_tokens_per_second = 0;
  int32_t max_evaluations = 16;         // plans measured at most, variants aside
  int32_t max_variant_evaluations = 6;  // variants measured at most
};

struct SolverOutcome {
  bool within_bound = false;
  double predicted_tokens_per_second = 0;  // with the measured reads
};

struct SolverResult {
  bool found = false;
  bool memory = false;  // the memory policy won (budget and plan are then -1)
  int32_t budget = -1, plan = -1;
  double predicted_tokens_per_second = 0;
  int32_t evaluations = 0;
};

// evaluate(budget, plan, outcome) measures one plan; each is asked for at most once.
using SolverEvaluate = std::function<Status(size_t budget, size_t plan, SolverOutcome* out)>;

Status SolveEntry(const SolverSpace& space, const SolverEvaluate& evaluate, SolverResult* out);

}  // namespace strata
