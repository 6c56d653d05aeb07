// Step-wise beam search on a small synthetic model: identical ranked results under every
// schedule and fast-tier budget (everything fits, grouping forced at several budgets, the
// token-by-token baseline), the budget never exceeded, delimiter steps, greedy expansion,
// verifiers (the scorer model agrees with the generator's own log-probabilities when it is
// the same model; the callback ranks), and bad input with no blocks left behind.
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <set>

#include <gtest/gtest.h>

#include "runtime/model/synthetic_model.h"
#include "runtime/search/beam_search.h"
#include "tests/testing/file_modes.h"

namespace strata {
namespace {

::testing::AssertionResult IsOk(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s.ToString();
}
#define ASSERT_OK(expr) ASSERT_TRUE(IsOk(expr))

class BeamSearchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SyntheticModelSpec spec;
    spec.n_layer = 16;  // enough layers for the baseline's two one-layer staging areas to pay
    spec.n_embd = 128;
    spec.n_head = 2;
    spec.n_head_kv = 2;  // head_dim 64: a block's layer piece is 8 KiB, no padding
    spec.n_ff = 256;
    spec.n_ctx_train = 512;
    path_ = new std::string((std::filesystem::temp_directory_path() /
                             ("strata_beam_" + std::to_string(getpid()) + ".gguf"))
                                .string());
    ASSERT_OK(WriteSyntheticModel(spec, *path_));
    model_ = new std::unique_ptr<Model>();
    ASSERT_OK(Model::Load(*path_, model_));
  }
  static void TearDownTestSuite() {
    delete model_;
    std::filesystem::remove(*path_);
    delete path_;
  }
  const Model& model() { return **model_; }

  std::vector<int32_t> Prompt() {
    std::vector<int32_t> ids;
    EXPECT_TRUE(model().tokenizer().Encode(SyntheticTrainingText(), true, false, &ids).ok());
    ids.resize(std::min<size_t>(ids.size(), 37));  // not a multiple of the block size
    return ids;
  }

  BeamSearchParams Base() {
    BeamSearchParams p;
    p.n_beams = 8;
    p.beam_width = 2;
    p.step_tokens = 8;
    p.max_tokens = 96;
    p.sampling.temperature = 0.9f;
    p.sampling.seed = 1234;
    p.n_threads = 1;  // the suite's time goes to thread hand-offs otherwise
    p.slow_dir = std::filesystem::temp_directory_path().string();
    return p;
  }

  // Steps that end at a delimiter, so beams of a group end their steps at different lengths.
  BeamSearchParams DelimitedSteps() {
    BeamSearchParams p = Base();
    p.step_delimiter = "e";
    p.step_tokens = 12;
    p.max_tokens = 64;
    return p;
  }
  // The test model scoring itself, for the searches of p.
  Status MakeScorer(const BeamSearchParams& p, std::unique_ptr<ModelVerifier>* out) {
    return ModelVerifier::Create(model(), model(), 1, int32_t(Prompt().size()) + p.max_tokens + 1,
                                 p.n_beams, out);
  }

  static std::string* path_;
  static std::unique_ptr<Model>* model_;
};
std::string* BeamSearchTest::path_ = nullptr;
std::unique_ptr<Model>* BeamSearchTest::model_ = nullptr;

BeamSearchParams Tokenwise(BeamSearchParams p) {
  p.schedule = BeamSchedule::kTokenwise;
  return p;
}

void ExpectSameResults(const std::vector<BeamResult>& a, const std::vector<BeamResult>& b,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].beam_id, b[i].beam_id) << what << " rank " << i;
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << " rank " << i;
    EXPECT_EQ(a[i].score, b[i].score) << what << " rank " << i;  // bit for bit
    EXPECT_EQ(a[i].stop, b[i].stop) << what << " rank " << i;
  }
}

TEST_F(BeamSearchTest, ResultsAreIdenticalUnderEverySchedulePlanAndBudget) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  std::vector<BeamResult> ref;
  BeamSearchStats st;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &ref, &st));
  ASSERT_FALSE(ref.empty());
  EXPECT_EQ(st.rounds, st.steps);  // everything fits: one group per step
  EXPECT_EQ(st.kv.bytes_read + st.kv.bytes_written, 0u);
  EXPECT_GT(st.peak_shared_blocks, 0u);
  for (size_t i = 1; i < ref.size(); ++i) EXPECT_GE(ref[i - 1].score, ref[i].score);

  const uint64_t min_a =
      MinFastBudgetBytes(Tokenwise(p), model().hparams(), int32_t(prompt.size()));
  for (BeamSchedule s : {BeamSchedule::kTokenwise, BeamSchedule::kGrouped, BeamSchedule::kPrefix,
                         BeamSchedule::kBalanced})
    for (double share : {0.4, 0.6, 0.8}) {
      p.schedule = s;
      // A share of the tree at its largest, so every run must evict.
      p.fast_budget_bytes = uint64_t(double(st.peak_tree_bytes) * share);
      if (s == BeamSchedule::kTokenwise) p.fast_budget_bytes = std::max(p.fast_budget_bytes, min_a);
      ASSERT_LT(p.fast_budget_bytes, st.peak_tree_bytes);
      const std::string what =
          std::string(BeamScheduleName(s)) + " at " + std::to_string(int(share * 100)) + "%";
      std::vector<BeamResult> got;
      BeamSearchStats gs;
      ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &got, &gs)) << what;
      ExpectSameResults(ref, got, what);
      // The fast tier never held more than the budget, and KV really moved.
      EXPECT_LE(gs.kv.peak_fast_bytes, p.fast_budget_bytes) << what;
      EXPECT_GT(gs.kv.bytes_written, 0u) << what;
      EXPECT_GT(gs.kv.bytes_read, 0u) << what;
      EXPECT_EQ(gs.kv.live_blocks, 0u) << what;
      if (s != BeamSchedule::kTokenwise) {
        EXPECT_GT(gs.rounds, gs.steps) << what;
      } else {
        EXPECT_GT(gs.kv.layer_reads, 0u) << what;
      }
    }
}

TEST_F(BeamSearchTest, RAMSlowTierGivesTheSameResultsAsTheBlockStore) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  p.fast_budget_bytes = SearchKvBytes(p, model().hparams(), int32_t(prompt.size())) / 2;
  std::vector<BeamResult> disk, ram;
  BeamSearchStats st;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &disk, &st));
  EXPECT_NE(st.slow_tier.find("block store"), std::string::npos) << st.slow_tier;
  p.slow_in_ram = true;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &ram, &st));
  EXPECT_EQ(st.slow_tier, "ram");
  ExpectSameResults(disk, ram, "ram vs block store");
}

// The slow tier's file holds the beams' KV: readable by its owner only, unnamed or named
// (STRATA_STORAGE_FORCE_FALLBACK=tmpfile), whatever the umask (0 would leave a file created
// 0644 open to everyone, 0277 one created 0600 without its owner's write bit). The scorer
// looks at the files the process holds open in slow_dir while the search runs.
TEST_F(BeamSearchTest, SlowTierFileIsOwnerOnly) {
  const auto prompt = Prompt();
  for (const char* force : {"", "tmpfile"})
    for (const mode_t mask : {mode_t(0), mode_t(0277)}) {
      SCOPED_TRACE(std::string("forced fallback: '") + force + "', umask " +
                   strata::testing::OctalMode(mask));
      std::string dir =
          (std::filesystem::temp_directory_path() / "strata_beam_modes_XXXXXX").string();
      ASSERT_NE(mkdtemp(dir.data()), nullptr);
      if (*force) setenv("STRATA_STORAGE_FORCE_FALLBACK", force, 1);
      BeamSearchParams p = Base();
      p.slow_dir = dir;
      p.max_tokens = 32;
      p.fast_budget_bytes = SearchKvBytes(p, model().hparams(), int32_t(prompt.size())) / 2;
      std::set<mode_t> seen;
      CallbackVerifier v([&](const StepCandidate& c, double* score) {
        for (mode_t m : strata::testing::ModesOfOpenFilesIn(dir)) seen.insert(m);
        *score = c.step_logprobs.empty() ? 0 : c.step_logprobs[0];
        return Status::OK();
      });
      std::vector<BeamResult> r;
      BeamSearchStats st;
      Status s;
      {
        strata::testing::ScopedUmask um(mask);
        s = RunBeamSearch(model(), prompt, p, &v, &r, &st);
      }
      unsetenv("STRATA_STORAGE_FORCE_FALLBACK");
      std::filesystem::remove_all(dir);
      ASSERT_OK(s);
      EXPECT_NE(st.slow_tier.find("block store"), std::string::npos) << st.slow_tier;
      ASSERT_FALSE(seen.empty());
      for (mode_t m : seen) EXPECT_EQ(strata::testing::OctalMode(m), "0600");
    }
}

TEST_F(BeamSearchTest, GreedyChildrenStartDifferentlyAndStayDeterministic) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  p.sampling.temperature = 0.f;
  p.max_tokens = 16;
  p.max_steps = 1;  // results are step 0's beams: children of the prompt
  std::vector<BeamResult> a, b;
  BeamSearchStats st;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &a, &st));
  ASSERT_EQ(a.size(), 8u);
  std::set<int32_t> first;
  for (const BeamResult& r : a) {
    ASSERT_FALSE(r.tokens.empty());
    first.insert(r.tokens[0]);
    EXPECT_EQ(r.stop, BeamStop::kStepLimit);
  }
  EXPECT_EQ(first.size(), 8u);
  p.max_steps = 0;
  p.fast_budget_bytes = MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size()));
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &a, &st));
  EXPECT_GT(st.rounds, st.steps);
  p.schedule = BeamSchedule::kTokenwise;
  p.fast_budget_bytes = MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size()));
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &b, &st));
  ExpectSameResults(a, b, "greedy balanced vs tokenwise");
}

TEST_F(BeamSearchTest, DelimiterEndsSteps) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  p.step_delimiter = "e";
  p.step_tokens = 12;
  p.ignore_eos = true;
  struct Seen {
    std::string text, before_last;  // the step's text, and without its last token
    size_t n;
    bool final;
  };
  std::vector<Seen> seen;
  CallbackVerifier v([&](const StepCandidate& c, double* score) {
    const Tokenizer& t = model().tokenizer();
    seen.push_back({t.Decode(c.step_tokens),
                    t.Decode(c.step_tokens.first(c.step_tokens.size() - 1)), c.step_tokens.size(),
                    c.final});
    *score = c.step_logprobs.empty() ? 0 : c.step_logprobs[0];
    return Status::OK();
  });
  std::vector<BeamResult> r;
  BeamSearchStats st;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, &v, &r, &st));
  ASSERT_FALSE(seen.empty());
  int ended_by_delimiter = 0;
  for (const Seen& s : seen) {
    if (s.final) continue;  // max_tokens may cut the last step short
    const size_t at = s.text.find('e');
    if (at == std::string::npos) {
      EXPECT_EQ(s.n, 12u) << s.text;  // no delimiter: the step ran to its limit
    } else {
      ++ended_by_delimiter;
      // The delimiter came with the step's last token: the text before it has none.
      EXPECT_EQ(s.before_last.find('e'), std::string::npos) << s.text;
    }
  }
  EXPECT_GT(ended_by_delimiter, 0);
}

// Speculative beam extension: with steps that end at a delimiter, beams that end early
// continue as their first child in the slots they free. The ranked results are the same bits
// as without it, under every grouped schedule, with everything fitting and under a budget
// that forces eviction, stochastic and greedy; the idle share of the batch slots falls, the
// budget holds, and no block is left behind.
TEST_F(BeamSearchTest, SpeculationKeepsResultsIdenticalAndFillsIdleSlots) {
  const auto prompt = Prompt();
  int64_t kept = 0;
  for (float temperature : {0.9f, 0.0f}) {
    BeamSearchParams p = Base();
    p.step_delimiter = "e";
    p.step_tokens = 12;
    p.sampling.temperature = temperature;
    std::vector<BeamResult> ref;
    BeamSearchStats rs;
    ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &ref, &rs));
    ASSERT_FALSE(ref.empty());
    ASSERT_GT(rs.idle_slot_passes, 0) << "steps of equal length: nothing to fill";
    EXPECT_EQ(rs.speculative_tokens, 0);
    for (BeamSchedule s : {BeamSchedule::kGrouped, BeamSchedule::kPrefix, BeamSchedule::kBalanced})
      for (double share : {0.0, 0.6}) {
        const std::string what = std::string(BeamScheduleName(s)) + " at " +
                                 std::to_string(int(share * 100)) + "%, temperature " +
                                 std::to_string(temperature);
        BeamSearchParams q = p;
        q.schedule = s;
        q.fast_budget_bytes = uint64_t(double(rs.peak_tree_bytes) * share);
        std::vector<BeamResult> plain, spec;
        BeamSearchStats ps, ss;
        ASSERT_OK(RunBeamSearch(model(), prompt, q, nullptr, &plain, &ps)) << what;
        q.speculate = 0.5f;
        ASSERT_OK(RunBeamSearch(model(), prompt, q, nullptr, &spec, &ss)) << what;
        ExpectSameResults(ref, plain, what);
        ExpectSameResults(ref, spec, what + ", speculating");
        EXPECT_GT(ss.speculative_tokens, 0) << what;
        EXPECT_LE(ss.speculative_tokens_kept, ss.speculative_tokens) << what;
        kept += ss.speculative_tokens_kept;
        // Kept speculation is work the next step does not redo: fewer passes, fewer idle slots.
        EXPECT_LT(double(ss.idle_slot_passes) / double(ss.slot_passes),
                  double(ps.idle_slot_passes) / double(ps.slot_passes))
            << what;
        EXPECT_EQ(ss.finished_tokens, ps.finished_tokens) << what;
        if (q.fast_budget_bytes > 0) {
          EXPECT_LE(ss.kv.peak_fast_bytes, q.fast_budget_bytes) << what;
          EXPECT_GT(ss.kv.bytes_read, 0u) << what;
        }
        EXPECT_EQ(ss.kv.live_blocks, 0u) << what;
      }
  }
  EXPECT_GT(kept, 0) << "no speculative token was ever kept";
}

TEST_F(BeamSearchTest, SpeculationSettingsOutOfRangeAreClearErrors) {
  const auto prompt = Prompt();
  std::vector<BeamResult> r;
  BeamSearchParams p = Base();
  p.speculate = 1.5f;
  Status s = RunBeamSearch(model(), prompt, p, nullptr, &r, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("speculate: 1.5"), std::string::npos) << s.ToString();
  p.speculate = 0.5f;
  p.schedule = BeamSchedule::kTokenwise;
  s = RunBeamSearch(model(), prompt, p, nullptr, &r, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("grouped schedule"), std::string::npos) << s.ToString();
}

// Forwards to the built-in scorer and checks that a scorer model identical to the generator
// gives the same scores (a prefill over the step instead of the generator's decode passes).
class ComparingVerifier final : public Verifier {
 public:
  explicit ComparingVerifier(ModelVerifier* m) : model_(m) {}
  const char* name() const override { return "comparing"; }
  Status Begin(std::span<const int32_t> prompt, uint64_t root) override {
    return model_->Begin(prompt, root);
  }
  Status ScoreStep(std::span<const StepCandidate> c, std::vector<double>* scores) override {
    std::vector<double> m;
    STRATA_RETURN_IF_ERROR(model_->ScoreStep(c, &m));
    STRATA_RETURN_IF_ERROR(builtin_.ScoreStep(c, scores));
    for (size_t i = 0; i < c.size(); ++i)
      max_diff = std::max(max_diff, std::abs(m[i] - (*scores)[i]));
    compared += c.size();
    return Status::OK();
  }
  void Forget(uint64_t id) override { model_->Forget(id); }
  void End() override { model_->End(); }
  double max_diff = 0;
  size_t compared = 0;

 private:
  ModelVerifier* model_;
  MeanLogProbVerifier builtin_;
};

TEST_F(BeamSearchTest, ScorerModelMatchesTheGeneratorsOwnLogProbabilities) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  p.step_tokens = 6;  // steps across block boundaries
  std::unique_ptr<ModelVerifier> mv;
  ASSERT_OK(ModelVerifier::Create(model(), model(), 2, int32_t(prompt.size()) + p.max_tokens + 1,
                                  p.n_beams, &mv));
  ComparingVerifier v(mv.get());
  std::vector<BeamResult> r;
  BeamSearchStats st;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, &v, &r, &st));
  EXPECT_GE(v.compared, size_t(p.n_beams) * 6);
  EXPECT_LT(v.max_diff, 1e-3);

  SyntheticModelSpec other;
  other.n_vocab = 300;
  const std::string path = *path_ + ".other.gguf";
  ASSERT_OK(WriteSyntheticModel(other, path));
  std::unique_ptr<Model> m2;
  ASSERT_OK(Model::Load(path, &m2));
  std::filesystem::remove(path);
  Status s = ModelVerifier::Create(*m2, model(), 1, 128, 4, &mv);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s.message();
}

TEST_F(BeamSearchTest, AScorerModelSharesTheBudgetWithTheSameResults) {
  const auto prompt = Prompt();
  BeamSearchParams p = DelimitedSteps();
  p.n_beams = 16;  // a tree several times one beam's working set, so splits differ
  std::unique_ptr<ModelVerifier> mv;
  ASSERT_OK(MakeScorer(p, &mv));
  std::vector<BeamResult> ref;
  BeamSearchStats rs;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, mv.get(), &ref, &rs));
  ASSERT_FALSE(ref.empty());
  EXPECT_FALSE(rs.shared_budget);                // everything fits: the scorer keeps its own memory
  const uint64_t both = 2 * rs.peak_tree_bytes;  // the scorer's tree has the same shape
  uint64_t moved = 0;
  for (BeamSchedule sched : {BeamSchedule::kGrouped, BeamSchedule::kBalanced})
    for (double budget : {0.6, 0.35})
      for (float share : {-1.f, 0.5f, 0.25f}) {
        const std::string what = std::string(BeamScheduleName(sched)) + " at " +
                                 std::to_string(int(budget * 100)) + "% of both trees, share " +
                                 std::to_string(share);
        BeamSearchParams q = p;
        q.schedule = sched;
        q.fast_budget_bytes = uint64_t(double(both) * budget);
        q.verifier_share = share;
        q.speculate = share == 0.5f ? 0.5f : 0.f;
        std::vector<BeamResult> r;
        BeamSearchStats st;
        ASSERT_OK(RunBeamSearch(model(), prompt, q, mv.get(), &r, &st)) << what;
        ExpectSameResults(ref, r, what);
        EXPECT_TRUE(st.shared_budget) << what;
        EXPECT_LE(st.peak_fast_bytes_total, q.fast_budget_bytes) << what;
        EXPECT_GT(st.verifier_kv.peak_fast_bytes, 0u) << what;
        EXPECT_EQ(st.kv.live_blocks, 0u) << what;
        EXPECT_EQ(st.verifier_kv.live_blocks, 0u) << what;
        EXPECT_GT(st.generator_phase_share, 0.0) << what;
        EXPECT_LT(st.generator_phase_share, 1.0) << what;
        if (share >= 0.f) {  // a fixed split: each model always had its share
          EXPECT_NEAR(st.verifier_phase_share, share, 0.1) << what;
          EXPECT_NEAR(st.generator_phase_share, 1.0 - share, 0.1) << what;
        }
        moved += st.verifier_kv.bytes_written + st.verifier_kv.bytes_read;
      }
  EXPECT_GT(moved, 0u) << "the scorer's KV never left the fast tier: the budgets are not tight";

  // The scorer goes back to its own memory for a search without a budget.
  std::vector<BeamResult> again;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, mv.get(), &again, &rs));
  ExpectSameResults(ref, again, "without a budget after shared ones");

  // Too small for one beam of each model, or a share out of range: errors naming the limit.
  BeamSearchParams q = p;
  q.fast_budget_bytes = MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size()));
  Status s = RunBeamSearch(model(), prompt, q, mv.get(), &again, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("scorer model's KV"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("the minimum is " + std::to_string(2 * q.fast_budget_bytes)),
            std::string::npos)
      << s.ToString();
  q.fast_budget_bytes = both;
  q.verifier_share = 1.5f;
  s = RunBeamSearch(model(), prompt, q, mv.get(), &again, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("verifier share: 1.5"), std::string::npos) << s.ToString();
}

// With speculation a scorer model runs a beam's step and its first child's tokens generated
// ahead in one pass, and the child's scoring starts after them: the same scores to the bit
// (the scorer's engine is pass-invariant), under every grouped schedule, with and without a
// budget, every kept speculative token verified once.
TEST_F(BeamSearchTest, AScorerModelVerifiesTokensGeneratedAheadInTheirParentsPass) {
  const auto prompt = Prompt();
  const BeamSearchParams p = DelimitedSteps();  // beams end early and speculate
  std::unique_ptr<ModelVerifier> mv;
  ASSERT_OK(MakeScorer(p, &mv));
  std::vector<BeamResult> ref;
  BeamSearchStats rs;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, mv.get(), &ref, &rs));
  ASSERT_FALSE(ref.empty());
  EXPECT_EQ(rs.verifier_ahead_tokens, 0);
  int64_t reused = 0;
  for (BeamSchedule sched :
       {BeamSchedule::kGrouped, BeamSchedule::kPrefix, BeamSchedule::kBalanced})
    for (double budget : {0.0, 0.7}) {
      const std::string what = std::string(BeamScheduleName(sched)) + " at " +
                               std::to_string(int(budget * 100)) + "% of both trees";
      BeamSearchParams q = p;
      q.schedule = sched;
      q.fast_budget_bytes = uint64_t(double(2 * rs.peak_tree_bytes) * budget);
      q.speculate = 0.5f;
      std::vector<BeamResult> r;
      BeamSearchStats st;
      ASSERT_OK(RunBeamSearch(model(), prompt, q, mv.get(), &r, &st)) << what;
      ExpectSameResults(ref, r, what);
      EXPECT_GT(st.speculative_tokens_kept, 0) << what;
      EXPECT_LE(st.verifier_ahead_tokens, st.speculative_tokens) << what;
      // Every kept token was run in its parent's pass and taken over by its child (a sibling
      // whose step begins with the same tokens takes them over too).
      EXPECT_GE(st.verifier_ahead_reused, st.speculative_tokens_kept) << what;
      EXPECT_EQ(st.verifier_ahead_tokens, st.speculative_tokens) << what;
      EXPECT_EQ(st.kv.live_blocks, 0u) << what;
      if (q.fast_budget_bytes > 0) {
        EXPECT_TRUE(st.shared_budget) << what;
        EXPECT_LE(st.peak_fast_bytes_total, q.fast_budget_bytes) << what;
        EXPECT_EQ(st.verifier_kv.live_blocks, 0u) << what;
      }
      reused += st.verifier_ahead_reused;
    }
  EXPECT_GT(reused, 0);
}

// A scorer model whose scores turn to NaN at one step, keeping its KV in the search's tiers.
class FailingModelVerifier final : public Verifier {
 public:
  FailingModelVerifier(ModelVerifier* m, int32_t fail_step) : m_(m), fail_step_(fail_step) {}
  const char* name() const override { return "failing"; }
  Status Begin(std::span<const int32_t> prompt, uint64_t root) override {
    return m_->Begin(prompt, root);
  }
  Status ScoreStep(std::span<const StepCandidate> c, std::vector<double>* scores) override {
    STRATA_RETURN_IF_ERROR(m_->ScoreStep(c, scores));
    if (!c.empty() && c[0].step == fail_step_) (*scores)[c.size() / 2] = std::nan("");
    return Status::OK();
  }
  void Forget(uint64_t id) override { m_->Forget(id); }
  void End() override { m_->End(); }
  uint64_t KvBlockBytes(int32_t b, uint32_t a) const override { return m_->KvBlockBytes(b, a); }
  Status PlaceKv(const FastTier* f, int32_t limit, int32_t b, const SlowTierFactory& s) override {
    return m_->PlaceKv(f, limit, b, s);
  }
  PrefixTreeKv* shared_kv() override { return m_->shared_kv(); }
  uint64_t weight_bytes() const override { return m_->weight_bytes(); }

 private:
  ModelVerifier* m_;
  int32_t fail_step_;
};

TEST_F(BeamSearchTest, AScorerThatFailsMidSearchNamesTheBeamAndLeavesBothTreesEmpty) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  std::unique_ptr<ModelVerifier> mv;
  ASSERT_OK(ModelVerifier::Create(model(), model(), 1, int32_t(prompt.size()) + p.max_tokens + 1,
                                  p.n_beams, &mv));
  FailingModelVerifier v(mv.get(), 2);
  p.fast_budget_bytes = 3 * MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size()));
  std::vector<BeamResult> r;
  BeamSearchStats st;
  Status s = RunBeamSearch(model(), prompt, p, &v, &r, &st);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("verifier 'failing': beam "), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(" at step 2 got a score that is not a finite number"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(r.empty());
  EXPECT_TRUE(st.shared_budget);
  EXPECT_EQ(st.kv.live_blocks, 0u);
  EXPECT_EQ(st.verifier_kv.live_blocks, 0u);
  EXPECT_EQ(st.verifier_kv.fast_bytes_in_use, 0u);
  EXPECT_LE(st.peak_fast_bytes_total, p.fast_budget_bytes);
}

TEST_F(BeamSearchTest, CallbackScoresRankTheResults) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  p.ignore_eos = true;
  // +1 for a step whose first token is even, -1 otherwise.
  CallbackVerifier v([](const StepCandidate& c, double* s) {
    *s = c.step_tokens[0] % 2 == 0 ? 1.0 : -1.0;
    return Status::OK();
  });
  std::vector<BeamResult> r;
  BeamSearchStats st;
  ASSERT_OK(RunBeamSearch(model(), prompt, p, &v, &r, &st));
  ASSERT_EQ(r.size(), 8u);
  for (size_t i = 0; i < r.size(); ++i) {
    double sum = 0;
    int steps = 0;
    for (size_t t = 0; t < r[i].tokens.size(); t += size_t(p.step_tokens), ++steps)
      sum += r[i].tokens[t] % 2 == 0 ? 1.0 : -1.0;
    EXPECT_EQ(r[i].score, sum / steps) << i;
    if (i > 0) {
      EXPECT_GE(r[i - 1].score, r[i].score);
    }
  }
  EXPECT_GT(r[0].score, 0.5);  // selection favoured even first tokens
}

TEST_F(BeamSearchTest, FailingCallbackIsAClearErrorAndLeavesNoBlocks) {
  const auto prompt = Prompt();
  BeamSearchParams p = Base();
  p.fast_budget_bytes = MinFastBudgetBytes(Tokenwise(p), model().hparams(), int32_t(prompt.size()));
  for (BeamSchedule s : {BeamSchedule::kTokenwise, BeamSchedule::kBalanced}) {
    p.schedule = s;
    int calls = 0;
    CallbackVerifier v([&](const StepCandidate& c, double* score) {
      if (c.step == 2 && ++calls == 3)
        return Status::Aborted("scorer callback returned 7 for beam " + std::to_string(c.beam_id));
      *score = 0;
      return Status::OK();
    });
    std::vector<BeamResult> r;
    BeamSearchStats st;
    Status status = RunBeamSearch(model(), prompt, p, &v, &r, &st);
    EXPECT_EQ(status.code(), Status::Code::kAborted);
    EXPECT_NE(status.message().find("returned 7"), std::string::npos) << status.message();
    EXPECT_TRUE(r.empty());
    EXPECT_EQ(st.steps, 2);
    EXPECT_EQ(st.kv.live_blocks, 0u);
    EXPECT_EQ(st.kv.fast_bytes_in_use, 0u);
    EXPECT_LE(st.kv.peak_fast_bytes, p.fast_budget_bytes);
  }
  CallbackVerifier nan([](const StepCandidate&, double* score) {
    *score = std::nan("");
    return Status::OK();
  });
  std::vector<BeamResult> r;
  Status status = RunBeamSearch(model(), prompt, p, &nan, &r, nullptr);
  EXPECT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(status.message().find("not a finite number"), std::string::npos);
}

TEST_F(BeamSearchTest, BadParametersAreClearErrors) {
  const auto prompt = Prompt();
  std::vector<BeamResult> r;
  auto expect = [&](BeamSearchParams p, Status::Code code, const std::string& text) {
    Status s = RunBeamSearch(model(), prompt, p, nullptr, &r, nullptr);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
  };
  BeamSearchParams p = Base();
  p.n_beams = 0;
  expect(p, Status::Code::kInvalidArgument, "beams: 0 is out of range");
  p = Base();
  p.beam_width = 3;
  expect(p, Status::Code::kInvalidArgument, "beam width: 3");
  p = Base();
  p.beam_width = 0;
  expect(p, Status::Code::kInvalidArgument, "beam width: 0");
  p = Base();
  p.step_tokens = 0;
  expect(p, Status::Code::kInvalidArgument, "step tokens: 0");
  p.step_tokens = 5000;
  expect(p, Status::Code::kInvalidArgument, "step tokens: 5000");
  p = Base();
  p.max_tokens = 500;
  expect(p, Status::Code::kInvalidArgument, "max tokens: 500");
  p = Base();
  const uint64_t min = MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size()));
  p.fast_budget_bytes = min - 1;
  expect(p, Status::Code::kResourceExhausted,
         "one beam's working set (37 prompt + 96 generated tokens): the minimum is " +
             std::to_string(min) + " bytes");
  p.fast_budget_bytes = min;  // exactly one beam's working set is enough to run
  ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &r, nullptr));
  p.schedule = BeamSchedule::kTokenwise;
  const uint64_t min_a = MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size()));
  EXPECT_GT(min_a, min);
  p.fast_budget_bytes = min_a - 1;
  expect(p, Status::Code::kResourceExhausted, "the minimum is " + std::to_string(min_a));
  p = Base();
  r.clear();
  Status s = RunBeamSearch(model(), {}, p, nullptr, &r, nullptr);
  EXPECT_NE(s.message().find("the prompt has no tokens"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace strata
