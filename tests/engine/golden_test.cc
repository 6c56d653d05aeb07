// The engine on the real model against llama.cpp's golden outputs
// (tests/golden/make_generation_golden.py wrote the fixtures).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/engine/engine.h"
#include "tests/testing/test_model.h"
#include "tests/testing/window_perplexity.h"

namespace strata {
namespace {

// Largest |strata - llama.cpp| allowed on a top-5 logit (logits are ~10-30 here). Both
// runtimes quantize every matmul's activations to 8 bits, so the last bit of a summation
// order flips some roundings and the model amplifies them: measured against an exact
// float64 forward pass (tests/engine/reference_forward.cc), llama.cpp's top-5 logits are
// off by up to 0.6-0.7 and ours by 0.3-1.0 depending on the kernels' summation order, and
// llama.cpp's own logits move by up to 1.13 between evaluating a sequence as one batch and
// token by token (peer_self_top5_max_diff in the fixture).
constexpr double kLogitTolerance = 1.5;
// A greedy step whose best two logits (llama.cpp's) are closer than this is a near-tie:
// within the noise above, so two correct runtimes may pick different tokens there.
constexpr double kNearTie = 1.0;

nlohmann::json LoadFixture(const std::string& name) {
  std::ifstream in(testing::SourceDir() + "/tests/fixtures/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return nlohmann::json::parse(in);
}

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_REQUIRE_REAL_MODEL(path);
    Status s = Model::Load(path, &model_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 1024;
    o.max_sequences = 2;
    ASSERT_TRUE(Engine::Create(*model_, o, &engine_).ok());
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(GoldenTest, GreedyContinuationsAndTopLogitsMatchLlamaCpp) {
  const nlohmann::json fx = LoadFixture("generation_smollm2.json");
  const size_t V = size_t(model_->hparams().n_vocab);
  const int32_t eos = model_->tokenizer().eos();
  int identical = 0, well_posed = 0, index = 0, forced_steps = 0, forced_agree = 0;
  for (const auto& p : fx["prompts"]) {
    ++index;
    const std::vector<int32_t> prompt = p["prompt_tokens"];
    const std::vector<int32_t> want = p["greedy"];
    const std::vector<double> margins = p["greedy_margins"];
    const bool peer_self_consistent = p["peer_self_consistent"];
    // "Identical continuation" is a well-posed requirement only where llama.cpp's own
    // continuation has no near-tie: elsewhere the next token is decided by rounding noise.
    const bool determined = *std::min_element(margins.begin(), margins.end()) >= kNearTie;

    // Free-running greedy continuation, as long as llama.cpp's (which ends at EOS or 64).
    SeqId seq;
    ASSERT_TRUE(engine_->NewSequence(&seq).ok());
    std::vector<float> logits;
    ASSERT_TRUE(engine_->Prefill(seq, prompt, &logits).ok());
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      got.push_back(next);
      if (next == eos) break;
      ASSERT_TRUE(engine_->Prefill(seq, {&next, 1}, &logits).ok());
    }
    ASSERT_TRUE(engine_->RemoveSequence(seq).ok());
    well_posed += determined;
    if (got == want) {
      identical += determined;
      std::cout << "prompt " << index << ": identical (" << want.size() << " tokens)\n";
    } else {
      size_t i = 0;
      while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
      std::cout << "prompt " << index << ": diverges at generated token " << i << " (strata "
                << (i < got.size() ? got[i] : -1) << ", llama.cpp " << want[i]
                << "); llama.cpp's top-2 margin there is " << margins[i] << " (near-tie < "
                << kNearTie << ")"
                << (peer_self_consistent ? ""
                                         : "; llama.cpp itself diverges on this prompt when "
                                           "it evaluates it token by token")
                << "\n";
      EXPECT_LT(margins[i], kNearTie)
          << "prompt " << index << " diverges where llama.cpp's choice is not a near-tie";
    }

    // Teacher-forced: on llama.cpp's own continuation, every step's argmax must agree with
    // llama.cpp's unless that step is a near-tie.
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), want.begin(), want.end());
    ASSERT_TRUE(engine_->NewSequence(&seq).ok());
    ASSERT_TRUE(engine_->Prefill(seq, all, &logits, true).ok());
    ASSERT_TRUE(engine_->RemoveSequence(seq).ok());
    for (size_t i = 0; i < want.size(); ++i) {
      const float* row = logits.data() + (prompt.size() - 1 + i) * V;
      const int32_t mine = int32_t(std::max_element(row, row + V) - row);
      if (margins[i] < kNearTie) continue;
      ++forced_steps;
      forced_agree += mine == want[i];
      EXPECT_EQ(mine, want[i]) << "prompt " << index << " step " << i << " (margin " << margins[i]
                               << ")";
    }

    // Top-5 logits at the first 16 positions of prompt + continuation.
    const auto& top = p["top5"];
    double worst = 0;
    for (size_t pos = 0; pos < top.size(); ++pos) {
      for (const auto& pair : top[pos]) {
        const int32_t id = pair[0];
        const double ref = pair[1];
        worst = std::max(worst, std::fabs(double(logits[pos * V + id]) - ref));
      }
    }
    std::cout << "prompt " << index << ": max |logit - llama.cpp| over top-5 x " << top.size()
              << " positions = " << worst
              << " (llama.cpp vs itself: " << double(p["peer_self_top5_max_diff"]) << ")\n";
    EXPECT_LE(worst, kLogitTolerance) << "prompt " << index;
  }
  std::cout << "teacher-forced argmax agreement on steps that are not near-ties: " << forced_agree
            << "/" << forced_steps << "\n";
  std::cout << "identical greedy continuations: " << identical << " of the " << well_posed
            << " prompts whose llama.cpp continuation has no near-tie\n";
  // The bar: identical greedy continuations for at least 3 of 4 prompts, counted
  // over the prompts where identity is well posed; on every other prompt each divergence
  // was checked above to sit at a near-tie, and the teacher-forced check covers every step.
  ASSERT_GE(well_posed, 4);
  EXPECT_GE(identical * 4, well_posed * 3);
}

TEST_F(GoldenTest, PerplexityWithinOnePercentOfLlamaCpp) {
  const nlohmann::json fx = LoadFixture("perplexity_smollm2.json");
  const std::vector<int32_t> tokens = fx["tokens"];
  const int window = fx["window"];
  const std::vector<double> want = fx["window_perplexity"];
  // The first 8 windows here (the CLI's `strata perplexity` covers all 32 in the bench).
  const int n_windows = std::min<int>(8, int(want.size()));
  const size_t V = size_t(model_->hparams().n_vocab);
  double nll_all = 0, want_log = 0;
  for (int w = 0; w < n_windows; ++w) {
    const int32_t* tok = tokens.data() + size_t(w) * window;
    double nll = 0;
    ASSERT_TRUE(testing::WindowNll(*engine_, {tok, size_t(window)}, V, &nll));
    const double ppl = std::exp(nll / (window - 1));
    EXPECT_NEAR(ppl / want[w], 1.0, 0.01) << "window " << w;
    nll_all += nll;
    want_log += std::log(want[w]) * (window - 1);
  }
  const double ppl = std::exp(nll_all / (double(n_windows) * (window - 1)));
  const double ref = std::exp(want_log / (double(n_windows) * (window - 1)));
  std::cout << "perplexity over " << n_windows << " windows: strata " << ppl << ", llama.cpp "
            << ref << " (ratio " << ppl / ref << ")\n";
  EXPECT_NEAR(ppl / ref, 1.0, 0.01);
}

}  // namespace
}  // namespace strata
