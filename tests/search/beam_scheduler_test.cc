// PlanStep: every group fits the capacity, every beam runs exactly once, prefix-aware
// groups keep subtrees together, balanced groups keep the minimum number of rounds with a
// smaller largest group, and a beam too large for the budget is an error naming it.
#include <algorithm>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "runtime/search/beam_scheduler.h"

namespace strata {
namespace {

// A beam tree: a shared prompt of `prompt` blocks, then `levels` levels of branching
// `fanout`, each level adding `per_level` private blocks. Beams are listed in a shuffled
// order, as a score ranking would list them.
std::vector<BeamWork> Tree(int32_t prompt, int32_t levels, int32_t fanout, int32_t per_level,
                           int32_t new_blocks, uint32_t seed) {
  std::vector<std::vector<int32_t>> paths(1);
  int32_t next = 0;
  for (int32_t i = 0; i < prompt; ++i) paths[0].push_back(next++);
  for (int32_t l = 0; l < levels; ++l) {
    std::vector<std::vector<int32_t>> deeper;
    for (const auto& p : paths)
      for (int32_t c = 0; c < fanout; ++c) {
        auto q = p;
        for (int32_t i = 0; i < per_level; ++i) q.push_back(next++);
        deeper.push_back(q);
      }
    paths = deeper;
  }
  std::shuffle(paths.begin(), paths.end(), std::mt19937(seed));
  std::vector<BeamWork> w;
  for (auto& p : paths) w.push_back({p, new_blocks});
  return w;
}

void CheckPlan(const std::vector<BeamWork>& w, const StepPlan& plan, int32_t capacity) {
  std::multiset<int32_t> seen;
  for (const BeamGroup& g : plan.groups) {
    EXPECT_FALSE(g.beams.empty());
    EXPECT_EQ(g.blocks, WorkingSetBlocks(w, g.beams));
    EXPECT_LE(g.blocks, capacity);
    seen.insert(g.beams.begin(), g.beams.end());
  }
  ASSERT_EQ(seen.size(), w.size());
  for (int32_t i = 0; i < int32_t(w.size()); ++i) EXPECT_EQ(seen.count(i), 1u) << i;
}

TEST(BeamSchedulerTest, EverythingFitsRunsOneGroup) {
  const auto w = Tree(8, 3, 2, 2, 2, 1);
  const int32_t total = WorkingSetBlocks(w, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(total, 8 + 2 * (2 + 4 + 8) + 8 * 2);
  for (BeamSchedule s : {BeamSchedule::kTokenwise, BeamSchedule::kGrouped, BeamSchedule::kPrefix,
                         BeamSchedule::kBalanced}) {
    StepPlan plan;
    ASSERT_TRUE(PlanStep(w, total, s, false, &plan).ok());
    ASSERT_EQ(plan.groups.size(), 1u) << BeamScheduleName(s);
    EXPECT_EQ(plan.total_blocks, total);
    CheckPlan(w, plan, total);
  }
}

TEST(BeamSchedulerTest, GroupsFitAndPrefixAwareGroupsLoadLess) {
  const auto w = Tree(8, 4, 2, 2, 2, 3);  // 16 beams
  std::vector<int32_t> all(w.size());
  for (size_t i = 0; i < w.size(); ++i) all[i] = int32_t(i);
  const int32_t total = WorkingSetBlocks(w, all);
  const int32_t capacity = total / 4;
  StepPlan grouped, prefix, balanced;
  ASSERT_TRUE(PlanStep(w, capacity, BeamSchedule::kGrouped, false, &grouped).ok());
  ASSERT_TRUE(PlanStep(w, capacity, BeamSchedule::kPrefix, false, &prefix).ok());
  ASSERT_TRUE(PlanStep(w, capacity, BeamSchedule::kBalanced, false, &balanced).ok());
  CheckPlan(w, grouped, capacity);
  CheckPlan(w, prefix, capacity);
  CheckPlan(w, balanced, capacity);
  // Blocks loaded over the step, if each group loads its working set: sharing prefixes
  // inside groups must load less than the ranked order does.
  auto loaded = [](const StepPlan& p) {
    int32_t n = 0;
    for (const BeamGroup& g : p.groups) n += g.blocks;
    return n;
  };
  EXPECT_LT(loaded(prefix), loaded(grouped));
  EXPECT_LE(prefix.groups.size(), grouped.groups.size());
  // Depth-first: siblings (identical paths but for their last level) share a group.
  for (const BeamGroup& g : prefix.groups)
    for (size_t i = 1; i < g.beams.size(); ++i)
      EXPECT_LT(w[g.beams[i - 1]].path, w[g.beams[i]].path);
  // Balanced: as few rounds, the largest group never larger, and strictly smaller whenever
  // the greedy fill leaves a short last group.
  auto largest = [](const StepPlan& p) {
    int32_t m = 0;
    for (const BeamGroup& g : p.groups) m = std::max(m, g.blocks);
    return m;
  };
  int improved = 0;
  for (int32_t cap = 18; cap < total; cap += 3) {  // 18: one beam's path and new blocks
    ASSERT_TRUE(PlanStep(w, cap, BeamSchedule::kPrefix, false, &prefix).ok());
    ASSERT_TRUE(PlanStep(w, cap, BeamSchedule::kBalanced, false, &balanced).ok());
    CheckPlan(w, balanced, cap);
    EXPECT_EQ(balanced.groups.size(), prefix.groups.size()) << cap;
    EXPECT_LE(largest(balanced), largest(prefix)) << cap;
    improved += largest(balanced) < largest(prefix);
  }
  EXPECT_GT(improved, 0);
}

TEST(BeamSchedulerTest, ReverseOrderStartsWhereTheLastStepEnded) {
  const auto w = Tree(4, 3, 2, 3, 1, 5);
  StepPlan fwd, rev;
  ASSERT_TRUE(PlanStep(w, 20, BeamSchedule::kPrefix, false, &fwd).ok());
  ASSERT_TRUE(PlanStep(w, 20, BeamSchedule::kPrefix, true, &rev).ok());
  ASSERT_GT(fwd.groups.size(), 1u);
  EXPECT_EQ(rev.groups.front().beams.front(), fwd.groups.back().beams.back());
}

TEST(BeamSchedulerTest, ABeamLargerThanTheBudgetIsAnErrorNamingIt) {
  auto w = Tree(8, 1, 2, 2, 2, 1);
  StepPlan plan;
  Status s = PlanStep(w, 11, BeamSchedule::kBalanced, false, &plan);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("needs 12 KV blocks"), std::string::npos) << s.message();
  // The token-by-token schedule streams what does not fit: it plans one group regardless.
  ASSERT_TRUE(PlanStep(w, 11, BeamSchedule::kTokenwise, false, &plan).ok());
  EXPECT_EQ(plan.groups.size(), 1u);
}

TEST(BeamSchedulerTest, ScheduleNamesParse) {
  BeamSchedule s;
  ASSERT_TRUE(ParseBeamSchedule("d", &s).ok());
  EXPECT_EQ(s, BeamSchedule::kBalanced);
  ASSERT_TRUE(ParseBeamSchedule("prefix", &s).ok());
  EXPECT_EQ(s, BeamSchedule::kPrefix);
  Status bad = ParseBeamSchedule("fastest", &s);
  EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("'fastest'"), std::string::npos);
}

}  // namespace
}  // namespace strata
