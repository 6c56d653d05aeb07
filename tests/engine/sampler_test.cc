#include "runtime/engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f}; }

TEST(SamplerTest, GreedyTakesArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 6);
  auto l = Logits();
  EXPECT_EQ(s.Sample(l.data(), {}), 1);
  EXPECT_EQ(ArgMax(l.data(), 6), 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 1234;
  Sampler a(p, 6), b(p, 6);
  auto l = Logits();
  std::vector<int32_t> x, y;
  for (int i = 0; i < 200; ++i) {
    x.push_back(a.Sample(l.data(), {}));
    y.push_back(b.Sample(l.data(), {}));
  }
  EXPECT_EQ(x, y);
  p.seed = 99;
  Sampler c(p, 6);
  std::vector<int32_t> z;
  for (int i = 0; i < 200; ++i) z.push_back(c.Sample(l.data(), {}));
  EXPECT_NE(x, z);
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 7;
  Sampler s(p, 6);
  auto l = Logits();
  double z = 0;
  for (float v : l) z += std::exp(v);
  std::map<int32_t, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) count[s.Sample(l.data(), {})]++;
  for (int id = 0; id < 6; ++id) {
    const double expect = std::exp(l[id]) / z;
    // 5 standard deviations of a binomial proportion.
    const double tol = 5 * std::sqrt(expect * (1 - expect) / n) + 1e-3;
    EXPECT_NEAR(double(count[id]) / n, expect, tol) << "token " << id;
  }
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  Sampler s(p, 6);
  auto l = Logits();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.Sample(l.data(), {}), 1);
}

TEST(SamplerTest, TopPAndMinPRestrictTheCandidates) {
  auto l = Logits();
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.min_p = 0;
  p.top_p = 0.5f;  // tokens 1 and 3 hold ~0.38 each: both are needed to reach 0.5
  Sampler s(p, 6);
  for (int i = 0; i < 300; ++i) {
    int32_t t = s.Sample(l.data(), {});
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: ids 1, 3 (e^2/e^3 = 0.37 < 0.5)
  Sampler m(p, 6);
  for (int i = 0; i < 300; ++i) {
    int32_t t = m.Sample(l.data(), {});
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(SamplerTest, RepetitionPenaltyChangesTheGreedyChoice) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;  // 3.0 -> 1.5 for the repeated tokens 1 and 3
  Sampler s(p, 6);
  auto l = Logits();
  std::vector<int32_t> hist = {1, 3};
  EXPECT_EQ(s.Sample(l.data(), hist), 2);
  p.repeat_last_n = 1;  // only token 3 is penalized
  Sampler t(p, 6);
  EXPECT_EQ(t.Sample(l.data(), hist), 1);
}

TEST(SamplerTest, ValidationNamesTheParameter) {
  SamplingParams p;
  p.top_p = 0;
  Status s = ValidateSamplingParams(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sampling.top_p"), std::string::npos) << s.ToString();
  p = SamplingParams();
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p).message().find("temperature"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams()).ok());
}

}  // namespace
}  // namespace strata
