#include "tuner/solver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace strata {
namespace {

// A synthetic cost table: what measuring each plan would give.
struct World {
  SolverSpace space;
  std::vector<std::vector<SolverOutcome>> truth;

  int32_t Plans() const {
    int32_t n = 0;
    for (const auto& b : truth) n += int32_t(b.size());
    return n;
  }
  // The best plan by measuring everything.
  SolverResult Exhaustive() const {
    SolverResult r;
    if (space.memory_fits) {
      r.found = r.memory = true;
      r.predicted_tokens_per_second = space.memory_tokens_per_second;
    }
    for (size_t i = 0; i < truth.size(); ++i)
      for (size_t j = 0; j < truth[i].size(); ++j)
        if (truth[i][j].within_bound &&
            (!r.found || truth[i][j].predicted_tokens_per_second > r.predicted_tokens_per_second)) {
          r.found = true;
          r.memory = false;
          r.budget = int32_t(i);
          r.plan = int32_t(j);
          r.predicted_tokens_per_second = truth[i][j].predicted_tokens_per_second;
        }
    return r;
  }
};

// Budgets shrink by a constant factor; a smaller budget is faster and loses more quality.
// Each setting keeps its quality and speed relative to the runtime's own choice at every
// budget (within the spreads given), reads cost each plan a random share of its optimistic
// speed. The loss grows fast enough with a smaller budget that no setting keeps the bound
// two budgets below where the runtime's own choice fails: the solver's assumption. With
// `variants`, a setting may come with up to two variants (each of the one before it): no
// better quality, about the same optimistic speed, fewer reads (a higher predicted speed
// than its parent's, within its own optimistic one).
World MakeWorld(std::mt19937* rng, int32_t budgets, int32_t settings, double bound,
                bool memory_fits, bool variants = false) {
  std::uniform_real_distribution<double> u(0, 1);
  World w;
  // Per plan of a budget: its quality and speed factors and its parent (-1: none).
  std::vector<double> quality, speed;
  std::vector<int32_t> parent;
  for (int32_t j = 0; j < settings; ++j) {
    quality.push_back(j == 0 ? 1.0 : 0.8 + 0.4 * u(*rng));
    speed.push_back(j == 0 ? 1.0 : 0.8 + 0.4 * u(*rng));
    parent.push_back(-1);
    const int32_t n = variants ? int32_t(u(*rng) * 3) : 0;
    for (int32_t k = 0; k < n; ++k) {
      const size_t up = quality.size() - 1;
      quality.push_back(quality[up] * (1.0 + 0.6 * u(*rng)));
      speed.push_back(speed[up] * (0.97 + 0.06 * u(*rng)));
      parent.push_back(int32_t(up));
    }
  }
  const double base_loss = bound * (0.05 + 0.3 * u(*rng));
  for (int32_t i = 0; i < budgets; ++i) {
    std::vector<SolverPlan> plans;
    std::vector<SolverOutcome> outcomes;
    for (size_t j = 0; j < quality.size(); ++j) {
      SolverPlan p;
      p.automatic = j == 0;
      p.parent = parent[j];
      p.optimistic_tokens_per_second = 10.0 * std::pow(1.2, i) * speed[j];
      SolverOutcome o;
      const double share = 0.55 + 0.45 * u(*rng);
      o.predicted_tokens_per_second =
          parent[j] < 0 ? p.optimistic_tokens_per_second * share
                        : std::min(p.optimistic_tokens_per_second,
                                   outcomes[size_t(parent[j])].predicted_tokens_per_second *
                                       (1.0 + 0.6 * u(*rng)));
      o.within_bound = base_loss * std::pow(1.6, i) * quality[j] <= bound;
      plans.push_back(p);
      outcomes.push_back(o);
    }
    w.space.budgets.push_back(plans);
    w.truth.push_back(outcomes);
  }
  w.space.memory_fits = memory_fits;
  w.space.memory_tokens_per_second = 10.0 * (0.5 + 2.0 * u(*rng));
  w.space.max_evaluations = 1 << 20;
  w.space.max_variant_evaluations = 1 << 20;
  return w;
}

Status SolveWorld(const World& w, SolverResult* r, std::vector<std::vector<int>>* asked) {
  asked->assign(w.truth.size(), {});
  for (size_t i = 0; i < w.truth.size(); ++i) (*asked)[i].assign(w.truth[i].size(), 0);
  return SolveEntry(
      w.space,
      [&](size_t i, size_t j, SolverOutcome* o) {
        ++(*asked)[i][j];
        *o = w.truth[i][j];
        return Status::OK();
      },
      r);
}

TEST(SolverTest, FindsTheExhaustiveOptimumOnSyntheticCostTablesMeasuringFewPlans) {
  std::mt19937 rng(2026);
  int64_t evaluations = 0, plans = 0;
  for (int32_t trial = 0; trial < 800; ++trial) {
    const World w =
        MakeWorld(&rng, 2 + trial % 7, 1 + trial % 24, 0.03, trial % 3 == 0, trial % 2 == 1);
    SolverResult got;
    std::vector<std::vector<int>> asked;
    ASSERT_TRUE(SolveWorld(w, &got, &asked).ok());
    const SolverResult want = w.Exhaustive();
    ASSERT_EQ(got.found, want.found) << "trial " << trial;
    EXPECT_EQ(got.memory, want.memory) << "trial " << trial;
    EXPECT_DOUBLE_EQ(got.predicted_tokens_per_second, want.predicted_tokens_per_second)
        << "trial " << trial;
    if (got.found && !got.memory) {
      // What it returns is a plan it measured and that keeps the bound.
      EXPECT_EQ(asked[size_t(got.budget)][size_t(got.plan)], 1);
      EXPECT_TRUE(w.truth[size_t(got.budget)][size_t(got.plan)].within_bound);
    }
    int32_t n = 0;
    for (const auto& b : asked)
      for (int a : b) {
        EXPECT_LE(a, 1) << "a plan was measured twice";
        n += a;
      }
    EXPECT_EQ(n, got.evaluations);
    evaluations += n;
    plans += w.Plans();
  }
  // The bounds prune: most plans are never measured.
  EXPECT_LT(evaluations * 3, plans) << evaluations << " of " << plans;
}

TEST(SolverTest, StopsAtTheMeasurementCap) {
  std::mt19937 rng(7);
  for (int32_t cap : {1, 2, 5}) {
    World w = MakeWorld(&rng, 7, 20, 0.03, false);
    w.space.max_evaluations = cap;
    SolverResult got;
    std::vector<std::vector<int>> asked;
    ASSERT_TRUE(SolveWorld(w, &got, &asked).ok());
    EXPECT_LE(got.evaluations, cap);
  }
}

TEST(SolverTest, HandMadeTables) {
  // Memory fits and is faster than any plan could be: nothing is measured.
  World w;
  w.space.budgets = {{{20, true}, {25, false}}, {{30, true}}};
  w.truth = {{{true, 18}, {true, 22}}, {{true, 28}}};
  w.space.memory_fits = true;
  w.space.memory_tokens_per_second = 40;
  SolverResult r;
  std::vector<std::vector<int>> asked;
  ASSERT_TRUE(SolveWorld(w, &r, &asked).ok());
  EXPECT_TRUE(r.memory);
  EXPECT_EQ(r.evaluations, 0);

  // Memory does not fit; the smaller budget loses the bound; at the larger one a setting
  // the runtime would not choose is faster than its own.
  w.space.memory_fits = false;
  w.truth = {{{true, 18}, {true, 22}}, {{false, 28}}};
  ASSERT_TRUE(SolveWorld(w, &r, &asked).ok());
  EXPECT_FALSE(r.memory);
  EXPECT_EQ(r.budget, 0);
  EXPECT_EQ(r.plan, 1);
  EXPECT_EQ(r.predicted_tokens_per_second, 22);

  // Nothing keeps the bound: not found, and it says how many it measured (the smaller
  // budget's plan first, then the larger budget's two).
  w.truth = {{{false, 18}, {false, 22}}, {{false, 28}}};
  ASSERT_TRUE(SolveWorld(w, &r, &asked).ok());
  EXPECT_FALSE(r.found);
  EXPECT_EQ(r.evaluations, 3);

  // The smaller budget keeps the bound: the largest budget's own plan, slower than it could
  // ever be, is never measured.
  w.truth = {{{true, 18}, {true, 22}}, {{true, 28}}};
  ASSERT_TRUE(SolveWorld(w, &r, &asked).ok());
  EXPECT_EQ(r.budget, 1);
  EXPECT_EQ(asked[0][0], 0);
  EXPECT_EQ(asked[0][1], 0);
  EXPECT_EQ(r.evaluations, 1);

  // Variants: one of a plan that lost the bound is never measured; one of a plan that kept
  // it is, and wins when its fewer reads make it the fastest; the cap of variants holds.
  w.space.memory_fits = false;
  w.space.budgets = {{{20, true}, {30, false, 0}, {30, false, 1}, {25, false}, {25, false, 3}}};
  w.truth = {{{true, 12}, {true, 19}, {false, 25}, {false, 14}, {false, 24}}};
  ASSERT_TRUE(SolveWorld(w, &r, &asked).ok());
  EXPECT_EQ(r.plan, 1);
  EXPECT_EQ(r.predicted_tokens_per_second, 19);
  EXPECT_EQ(asked[0][4], 0) << "the variant of a plan that lost the bound was measured";
  EXPECT_EQ(asked[0][2], 1);
  w.space.max_variant_evaluations = 1;
  ASSERT_TRUE(SolveWorld(w, &r, &asked).ok());
  EXPECT_EQ(asked[0][2], 0);
  EXPECT_EQ(r.evaluations, 3);
  w.space.max_variant_evaluations = 6;

  // An evaluation's error ends the search with that error.
  const Status s = SolveEntry(
      w.space, [](size_t, size_t, SolverOutcome*) { return Status::IOError("disk gone"); }, &r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("disk gone"), std::string::npos);
}

}  // namespace
}  // namespace strata
