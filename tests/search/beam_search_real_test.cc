// Beam search on the real model (SmolLM2-135M Q4_1): with the same seed, the ranked results
// are identical when everything fits, when the budget forces grouping (each grouped
// schedule), and token by token with per-layer offloading; the fast tier never exceeds its
// budget. Fails, does not skip, when the model is missing.
#include <gtest/gtest.h>

#include "runtime/search/beam_search.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

TEST(BeamSearchRealModelTest, SameRankedBeamsUnderEveryScheduleAndBudget) {
  STRATA_REQUIRE_REAL_MODEL(path);
  std::unique_ptr<Model> model;
  ASSERT_TRUE(Model::Load(path, &model).ok());
  std::vector<int32_t> prompt;
  ASSERT_TRUE(EncodeBeamPrompt(*model,
                               "Write three short tips for keeping a vegetable garden healthy "
                               "through a dry summer, one per line.",
                               /*chat=*/true, &prompt)
                  .ok());
  BeamSearchParams p;
  p.n_beams = 8;
  p.beam_width = 2;
  p.step_tokens = 16;
  p.max_tokens = 48;
  p.sampling.temperature = 0.8f;
  p.sampling.seed = 99;
  p.n_threads = 1;
  std::vector<BeamResult> ref;
  BeamSearchStats st;
  ASSERT_TRUE(RunBeamSearch(*model, prompt, p, nullptr, &ref, &st).ok());
  ASSERT_FALSE(ref.empty());
  EXPECT_GT(st.peak_shared_blocks, 0u);
  for (const BeamResult& r : ref) EXPECT_FALSE(r.text.empty());

  const uint64_t tree = st.peak_tree_bytes;
  for (BeamSchedule s : {BeamSchedule::kBalanced, BeamSchedule::kGrouped, BeamSchedule::kPrefix,
                         BeamSchedule::kTokenwise}) {
    p.schedule = s;
    p.fast_budget_bytes = std::max<uint64_t>(
        tree * 2 / 5, MinFastBudgetBytes(p, model->hparams(), int32_t(prompt.size())));
    std::vector<BeamResult> got;
    BeamSearchStats gs;
    Status status = RunBeamSearch(*model, prompt, p, nullptr, &got, &gs);
    ASSERT_TRUE(status.ok()) << BeamScheduleName(s) << ": " << status.ToString();
    EXPECT_LE(gs.kv.peak_fast_bytes, p.fast_budget_bytes) << BeamScheduleName(s);
    EXPECT_GT(gs.kv.bytes_read + gs.kv.bytes_written, 0u) << BeamScheduleName(s);
    ASSERT_EQ(got.size(), ref.size()) << BeamScheduleName(s);
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << BeamScheduleName(s) << " rank " << i;
      EXPECT_EQ(got[i].score, ref[i].score) << BeamScheduleName(s) << " rank " << i;
      EXPECT_EQ(got[i].text, ref[i].text) << BeamScheduleName(s) << " rank " << i;
    }
  }
}

}  // namespace
}  // namespace strata
