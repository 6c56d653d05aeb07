// The continuous-batching scheduler on a small synthetic model: requests served together,
// in prefill chunks interleaved with decode steps, get exactly the tokens and text each gets
// alone from Engine::Generate; a prompt extending a finished one reuses its KV and still gets
// them; cancellation, a full queue and shutdown end requests as documented.
#include "server/scheduler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/model/synthetic_model.h"

namespace strata::server {
namespace {

constexpr int32_t kCtx = 128;

class ServeSchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SyntheticModelSpec spec;
    spec.n_layer = 2;
    spec.n_embd = 64;
    spec.n_ff = 96;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    char path[] = "/tmp/serve_scheduler_test_XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_TRUE(WriteSyntheticModel(spec, path).ok());
    ASSERT_TRUE(Model::Load(path, &model_).ok());
    unlink(path);  // mapped: the file can go
  }
  static void TearDownTestSuite() { model_.reset(); }

  // Small passes, so a prompt takes several prefill chunks between other slots' decodes.
  static std::unique_ptr<Engine> MakeEngine(int32_t sequences) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = kCtx;
    o.n_batch = 8;
    o.max_sequences = sequences;
    std::unique_ptr<Engine> e;
    EXPECT_TRUE(Engine::Create(*model_, o, &e).ok());
    return e;
  }

  static GenerateParams Greedy(int32_t max_tokens) {
    GenerateParams p;
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    p.ignore_eos = true;  // a fixed length, whatever the random weights favour
    return p;
  }

  static std::vector<int32_t> Prompt(uint32_t seed, size_t n) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    // Ordinary tokens (byte and merge ids), none that ends generation.
    for (int32_t& t : p) t = int32_t(3 + rng() % 250);
    return p;
  }

  struct Alone {
    std::vector<int32_t> tokens;
    std::string text;
  };
  static Alone RunAlone(const std::vector<int32_t>& prompt, const GenerateParams& params) {
    std::unique_ptr<Engine> e = MakeEngine(1);
    GenerationRequest r;
    EXPECT_TRUE(e->NewSequence(&r.seq).ok());
    r.prompt = prompt;
    r.params = params;
    EXPECT_TRUE(e->Generate({&r, 1}, nullptr).ok());
    return {r.tokens, r.text};
  }

  static Job::Result Wait(Job& job, std::string* text) {
    Job::Result r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!job.Take(std::chrono::milliseconds(50), text, &r))
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "the job did not finish within 60 s";
        break;
      }
    return r;
  }

  static std::unique_ptr<Model> model_;
};

std::unique_ptr<Model> ServeSchedulerTest::model_;

TEST_F(ServeSchedulerTest, TogetherEachGetsWhatItGetsAlone) {
  std::unique_ptr<Engine> engine = MakeEngine(3);
  Metrics metrics;
  Scheduler s(engine.get(), 3, 8, &metrics);
  ASSERT_TRUE(s.Start().ok());
  // Five requests for three slots, prompts of one to five prefill chunks.
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<Alone> want;
  for (uint32_t i = 0; i < 5; ++i) {
    const std::vector<int32_t> p = Prompt(i, 3 + 9 * i);
    const GenerateParams g = Greedy(6 + int32_t(i));
    want.push_back(RunAlone(p, g));
    jobs.push_back(std::make_shared<Job>(p, g));
  }
  for (auto& j : jobs) ASSERT_EQ(s.Submit(j), Scheduler::Admission::kQueued);
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::string text;
    const Job::Result r = Wait(*jobs[i], &text);
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.stop, StopReason::kMaxTokens);
    EXPECT_EQ(r.completion_tokens, int64_t(want[i].tokens.size())) << i;
    EXPECT_EQ(r.prompt_tokens, int64_t(jobs[i]->prompt().size()));
    EXPECT_EQ(text, want[i].text) << "request " << i;
  }
  s.Stop();  // the gauges are set at the end of a step, which may still be running
  const std::string m = metrics.Render();
  EXPECT_NE(m.find("strata_active_slots 0"), std::string::npos) << m;
  EXPECT_NE(m.find("strata_generated_tokens_total 40"), std::string::npos) << m;
}

TEST_F(ServeSchedulerTest, AnExtendedPromptReusesTheKvAndGetsTheSameTokens) {
  std::unique_ptr<Engine> engine = MakeEngine(2);
  Metrics metrics;
  Scheduler s(engine.get(), 2, 8, &metrics);
  ASSERT_TRUE(s.Start().ok());
  const std::vector<int32_t> p = Prompt(7, 20);
  auto first = std::make_shared<Job>(p, Greedy(5));
  ASSERT_EQ(s.Submit(first), Scheduler::Admission::kQueued);
  std::string text;
  ASSERT_TRUE(Wait(*first, &text).error.empty());
  // The slot holds the prompt and the generated tokens but the last (never evaluated).
  const Alone a = RunAlone(p, Greedy(5));
  std::vector<int32_t> longer = p;
  longer.insert(longer.end(), a.tokens.begin(), a.tokens.end() - 1);
  const size_t resident = longer.size();
  longer.push_back(9);
  longer.push_back(10);
  auto second = std::make_shared<Job>(longer, Greedy(7));
  ASSERT_EQ(s.Submit(second), Scheduler::Admission::kQueued);
  text.clear();
  const Job::Result r = Wait(*second, &text);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.cached_tokens, int64_t(resident));
  EXPECT_EQ(text, RunAlone(longer, Greedy(7)).text);
  // A prompt that does not extend it starts over in a slot.
  auto third = std::make_shared<Job>(Prompt(8, 10), Greedy(3));
  ASSERT_EQ(s.Submit(third), Scheduler::Admission::kQueued);
  EXPECT_EQ(Wait(*third, &text).cached_tokens, 0);
}

TEST_F(ServeSchedulerTest, ACancelledRequestFreesItsSlot) {
  std::unique_ptr<Engine> engine = MakeEngine(1);
  Metrics metrics;
  Scheduler s(engine.get(), 1, 4, &metrics);
  ASSERT_TRUE(s.Start().ok());
  auto long_job = std::make_shared<Job>(Prompt(1, 4), Greedy(kCtx - 8));
  ASSERT_EQ(s.Submit(long_job), Scheduler::Admission::kQueued);
  long_job->Cancel();
  std::string text;
  const Job::Result r = Wait(*long_job, &text);
  EXPECT_NE(r.error.find("cancelled"), std::string::npos);
  auto next = std::make_shared<Job>(Prompt(2, 4), Greedy(3));
  ASSERT_EQ(s.Submit(next), Scheduler::Admission::kQueued);
  text.clear();
  EXPECT_TRUE(Wait(*next, &text).error.empty());
  EXPECT_EQ(text, RunAlone(Prompt(2, 4), Greedy(3)).text);
}

TEST_F(ServeSchedulerTest, AFullQueueRefusesAndShutdownEndsEveryRequest) {
  std::unique_ptr<Engine> engine = MakeEngine(1);
  Metrics metrics;
  Scheduler s(engine.get(), 1, 1, &metrics);
  // Not started: nothing is admitted, so the bound is exact. One free slot and one place in
  // the queue take two requests.
  auto a = std::make_shared<Job>(Prompt(1, 4), Greedy(3));
  auto b = std::make_shared<Job>(Prompt(2, 4), Greedy(3));
  auto c = std::make_shared<Job>(Prompt(3, 4), Greedy(3));
  ASSERT_EQ(s.Submit(a), Scheduler::Admission::kQueued);
  ASSERT_EQ(s.Submit(b), Scheduler::Admission::kQueued);
  EXPECT_EQ(s.Submit(c), Scheduler::Admission::kQueueFull);
  s.Stop();
  for (auto* j : {a.get(), b.get()}) {
    std::string text;
    const Job::Result r = Wait(*j, &text);
    EXPECT_TRUE(r.shutting_down);
    EXPECT_FALSE(r.error.empty());
  }
  EXPECT_EQ(s.Submit(c), Scheduler::Admission::kStopping);
}

TEST_F(ServeSchedulerTest, ShutdownEndsARunningRequest) {
  std::unique_ptr<Engine> engine = MakeEngine(1);
  Metrics metrics;
  Scheduler s(engine.get(), 1, 1, &metrics);
  ASSERT_TRUE(s.Start().ok());
  auto a = std::make_shared<Job>(Prompt(1, 4), Greedy(kCtx - 8));
  ASSERT_EQ(s.Submit(a), Scheduler::Admission::kQueued);
  s.Stop();
  std::string text;
  const Job::Result r = Wait(*a, &text);
  // Stopped before, during or (on a fast machine) after its generation: never left hanging.
  EXPECT_TRUE(r.error.empty() || r.shutting_down) << r.error;
}

}  // namespace
}  // namespace strata::server
