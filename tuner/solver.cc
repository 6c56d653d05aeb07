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
  std::vector<std::vector<char>> measured(n), kept(n);
  std::vector<std::vector<double>> predicted(n);
  for (size_t i = 0; i < n; ++i) {
    measured[i].assign(space.budgets[i].size(), 0);
    kept[i].assign(space.budgets[i].size(), 0);
    predicted[i].assign(space.budgets[i].size(), 0);
  }
  auto measure = [&](size_t i, size_t j, bool* within) -> Status {
    SolverOutcome o;
    STRATA_RETURN_IF_ERROR(evaluate(i, j, &o));
    measured[i][j] = 1;
    kept[i][j] = o.within_bound;
    predicted[i][j] = o.predicted_tokens_per_second;
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
  // larger budget is slower), or the largest budget before that is known; hi: the largest
  // known not to, or past the end. The largest budget is measured only when every smaller
  // one the bisection asked about lost the bound: its plans attend the most groups, so
  // they are the slowest to measure and the least likely to win.
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
    while (hi > lo + 1) {
      const size_t mid = lo + (hi - lo) / 2;
      STRATA_RETURN_IF_ERROR(keeps(mid, &ok));
      (ok ? lo : hi) = mid;
    }
    if (lo == 0) {
      STRATA_RETURN_IF_ERROR(keeps(0, &ok));
      if (!ok) hi = 0;
    }
  }

  // 2. The settings at the budget found, the larger ones (where a setting the runtime would
  // not choose, or the runtime's own one the bisection stepped over, may still be the
  // fastest) and the next smaller one, in order of optimistic speed, until none left could
  // beat the best within the bound.
  struct Ref {
    size_t i, j;
    double optimistic;
  };
  std::vector<Ref> rest;
  for (size_t i = 0; i < n && i <= lo + 1; ++i)
    for (size_t j = 0; j < space.budgets[i].size(); ++j)
      if (!measured[i][j] && space.budgets[i][j].parent < 0 &&
          (!space.budgets[i][j].automatic || i < hi))
        rest.push_back({i, j, space.budgets[i][j].optimistic_tokens_per_second});
  std::stable_sort(rest.begin(), rest.end(),
                   [](const Ref& a, const Ref& b) { return a.optimistic > b.optimistic; });
  for (const Ref& c : rest) {
    if (cannot_win(space.budgets[c.i][c.j])) break;
    if (r.evaluations >= space.max_evaluations) break;
    bool within = false;
    STRATA_RETURN_IF_ERROR(measure(c.i, c.j, &within));
  }

  // 3. Variants, at the same budgets: one whose parent kept the bound (its speed, with the
  // parent's reads, is the best guess of the variant's: it reads less) or was not measured
  // (it could not win on speed; the variant may, reading less), highest guess first. One
  // whose parent lost the bound loses it too.
  int32_t variants = 0;
  for (;;) {
    if (variants >= space.max_variant_evaluations) break;
    bool any = false;
    size_t bi = 0, bj = 0;
    double best_guess = 0;
    for (size_t i = 0; i < n && i <= lo + 1; ++i)
      for (size_t j = 0; j < space.budgets[i].size(); ++j) {
        const SolverPlan& p = space.budgets[i][j];
        if (p.parent < 0 || measured[i][j] || cannot_win(p)) continue;
        // The nearest measured ancestor decides; with none, the root must be the runtime's
        // own plan of a budget the bisection found to keep the bound, or have been passed
        // over for its speed (not for the measurement cap).
        double guess = p.optimistic_tokens_per_second;
        bool eligible = true;
        for (int32_t a = p.parent; a >= 0; a = space.budgets[i][size_t(a)].parent) {
          if (measured[i][size_t(a)]) {
            eligible = kept[i][size_t(a)];
            guess = std::min(guess, predicted[i][size_t(a)]);
            break;
          }
          const SolverPlan& root = space.budgets[i][size_t(a)];
          if (root.parent < 0 && !cannot_win(root) && !(root.automatic && i < hi)) eligible = false;
        }
        if (!eligible) continue;
        if (!any || guess > best_guess) {
          any = true;
          bi = i;
          bj = j;
          best_guess = guess;
        }
      }
    if (!any) break;
    bool within = false;
    STRATA_RETURN_IF_ERROR(measure(bi, bj, &within));
    ++variants;
  }
  *out = r;
  return Status::OK();
}

}  // namespace strata
