#include "tuner/solver.h"

#include <algorithm>

namespace strata {

Status SolveEntry(const SolverSpace& space, const SolverEvaluate& evaluate, SolverResult* out) {
  SolverResult r;
  if (space.memory_fits) {
    r.found = true;
    r.memory = true;
    r.predicted_tokens_per_second = space.memory_tokens_per_second;
  }
  const size_t n = space.budgets.size();
  std::vector<std::vector<char>> measured(n);
  for (size_t i = 0; i < n; ++i) measured[i].assign(space.budgets[i].size(), 0);
  auto measure = [&](size_t i, size_t j, bool* within) -> Status {
    SolverOutcome o;
    STRATA_RETURN_IF_ERROR(evaluate(i, j, &o));
    measured[i][j] = 1;
    ++r.evaluations;
    *within = o.within_bound;
    if (o.within_bound &&
        (!r.found || o.predicted_tokens_per_second > r.predicted_tokens_per_second)) {
      r.found = true;
      r.memory = false;
      r.budget = int32_t(i);
      r.plan = int32_t(j);
      r.predicted_tokens_per_second = o.predicted_tokens_per_second;
    }
    return Status::OK();
  };
  auto cannot_win = [&](const SolverPlan& p) {
    return r.found && p.optimistic_tokens_per_second <= r.predicted_tokens_per_second;
  };
  auto automatic = [&](size_t i) -> int64_t {
    for (size_t j = 0; j < space.budgets[i].size(); ++j)
      if (space.budgets[i][j].automatic) return int64_t(j);
    return -1;
  };

  // 1. The budget: the smallest at which the automatic plan keeps the bound. lo: the
  // smallest known to keep it (or not worth measuring: it cannot beat the best, and a
  // larger budget is slower); hi: the largest known not to, or past the end.
  auto keeps = [&](size_t i, bool* ok) -> Status {
    *ok = false;
    const int64_t j = automatic(i);
    if (j < 0) return Status::OK();
    if (cannot_win(space.budgets[i][size_t(j)])) {
      *ok = true;
      return Status::OK();
    }
    if (r.evaluations >= space.max_evaluations) return Status::OK();
    return measure(i, size_t(j), ok);
  };
  size_t lo = 0, hi = n;
  if (n > 0) {
    bool ok = false;
    STRATA_RETURN_IF_ERROR(keeps(0, &ok));
    if (!ok) hi = 0;
    while (hi > lo + 1) {
      const size_t mid = lo + (hi - lo) / 2;
      STRATA_RETURN_IF_ERROR(keeps(mid, &ok));
      (ok ? lo : hi) = mid;
    }
  }

  // 2. The settings at the budget found, the larger ones (where a setting the runtime would
  // not choose may still be the fastest) and the next smaller one, in order of optimistic
  // speed, until none left could beat the best within the bound.
  struct Ref {
    size_t i, j;
    double optimistic;
  };
  std::vector<Ref> rest;
  for (size_t i = 0; i < n && i <= lo + 1; ++i)
    for (size_t j = 0; j < space.budgets[i].size(); ++j)
      if (!measured[i][j] && !space.budgets[i][j].automatic)
        rest.push_back({i, j, space.budgets[i][j].optimistic_tokens_per_second});
  std::stable_sort(rest.begin(), rest.end(),
                   [](const Ref& a, const Ref& b) { return a.optimistic > b.optimistic; });
  for (const Ref& c : rest) {
    if (cannot_win(space.budgets[c.i][c.j])) break;
    if (r.evaluations >= space.max_evaluations) break;
    bool within = false;
    STRATA_RETURN_IF_ERROR(measure(c.i, c.j, &within));
  }
  *out = r;
  return Status::OK();
}

}  // namespace strata
