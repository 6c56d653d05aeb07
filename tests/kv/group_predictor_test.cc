// GroupPredictor against plain double-precision math: the approximate query of a layer
// (norm, Wq, RoPE, projection through the head's rows of A) and the group selection
// (per-head group maxima through a softmax, or raw sums; top M).
#include "runtime/kv/disk/group_predictor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "tests/kv/disk_kv_test_util.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

class GroupPredictorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_ASSERT_OK(testing::LoadSyntheticModel(SyntheticModelSpec(), dir_.path(), "m", &model_));
    const std::string path = dir_.path() + "/m.adapters";
    STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*model_, {1, 4}, path));
    STRATA_ASSERT_OK(Adapters::Read(path, &adapters_));
  }
  // A softmax-scoring predictor for contexts of n tokens and, in *tiled, the F16 summary of
  // n keys drawn from `draw` (positions 0..n-1); null if it cannot be made.
  template <typename Draw>
  std::unique_ptr<GroupPredictor> F16Summary(const AdapterSet& set, int n, Draw& draw,
                                             std::vector<uint8_t>* tiled,
                                             GroupScoring scoring = GroupScoring::kSoftmax) {
    const HParams& hp = model_->hparams();
    const std::vector<float> keys = draw(size_t(n) * hp.n_head_kv * hp.head_dim, 1);
    std::unique_ptr<GroupPredictor> p;
    const Status st =
        GroupPredictor::Create(*model_, set, scoring, kernels::ScoreType::kF16, n, 1, &pool_, &p);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return nullptr;
    tiled->assign(GroupPredictor::KlrBytes(n, set.rank, kernels::ScoreType::kF16), 0);
    p->ProjectKeys(0, keys.data(), n, 0, tiled->data());
    return p;
  }

  testing::KvTempDir dir_;
  std::unique_ptr<Model> model_;
  Adapters adapters_;
  ThreadPool pool_{2};
};

TEST_F(GroupPredictorTest, LowRankQueriesFollowTheLayersQueryPath) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(4);
  std::unique_ptr<GroupPredictor> p;
  STRATA_ASSERT_OK(GroupPredictor::Create(*model_, set, GroupScoring::kSoftmax,
                                          kernels::ScoreType::kF16, 64, 2, &pool_, &p));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(2 * size_t(hp.n_embd));
  for (float& v : x) v = nd(rng);
  const int32_t pos[2] = {7, 130};
  const int32_t layer = 1;
  std::vector<float> got(2 * size_t(hp.n_head) * set.rank);
  p->LowRankQueries(layer, x.data(), 2, pos, got.data());

  const LayerWeights& L = model_->weights().layers[layer];
  const int32_t d = hp.head_dim;
  for (int t = 0; t < 2; ++t) {
    const float* xt = x.data() + t * hp.n_embd;
    double ss = 0;
    for (int i = 0; i < hp.n_embd; ++i) ss += double(xt[i]) * xt[i];
    const double inv = 1.0 / std::sqrt(ss / hp.n_embd + hp.rms_eps);
    std::vector<double> xn(static_cast<size_t>(hp.n_embd)), q(size_t(hp.n_head) * d);
    for (int i = 0; i < hp.n_embd; ++i) xn[i] = xt[i] * inv * L.attn_norm.f32()[i];
    std::vector<float> wrow(static_cast<size_t>(hp.n_embd));
    for (int r = 0; r < hp.n_head * d; ++r) {
      kernels::DequantizeRow(L.wq.type, static_cast<const uint8_t*>(L.wq.data) + r * L.wq.row_bytes,
                             wrow.data(), hp.n_embd);
      for (int i = 0; i < hp.n_embd; ++i) q[r] += double(wrow[i]) * xn[i];
    }
    for (int h = 0; h < hp.n_head; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const double th = pos[t] * std::pow(double(hp.rope_base), -2.0 * i / d);
        double& a = q[h * d + 2 * i];
        double& b = q[h * d + 2 * i + 1];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(th) - b0 * std::sin(th);
        b = a0 * std::sin(th) + b0 * std::cos(th);
      }
    const std::vector<float>& A = set.layers[layer];
    for (int h = 0; h < hp.n_head; ++h) {
      const int g = h / hp.n_rep();
      for (int j = 0; j < set.rank; ++j) {
        double want = 0;
        for (int i = 0; i < d; ++i) want += q[h * d + i] * A[size_t(g * d + i) * set.rank + j];
        EXPECT_NEAR(got[(size_t(t) * hp.n_head + h) * set.rank + j], want, 1e-3)
            << "t " << t << " head " << h << " dim " << j;
      }
    }
  }
}

// Token t's value j as the tiles of `type` hold it.
double StoredValue(kernels::ScoreType type, const std::vector<uint8_t>& tiles, int64_t t, int64_t j,
                   int64_t cols) {
  constexpr int64_t T = kernels::kScoreTile;
  if (type == kernels::ScoreType::kF16) {
    uint16_t h;
    std::memcpy(&h, tiles.data() + 2 * kernels::TiledIndex(t, j, cols), 2);
    return kernels::F16ToF32(h);
  }
  const uint8_t* tile = tiles.data() + (t / T) * kernels::ScoreTileBytes(type, cols);
  uint16_t scale;
  std::memcpy(&scale, tile + cols * T + (t % T) * 2, 2);
  return double(int8_t(tile[j * T + t % T])) * kernels::F16ToF32(scale);
}

// Brute force over the same stored summary (klr: [n][rank] row-major values). softmax: per
// head, each group's best token, a softmax over groups, summed over heads; sum: raw scores
// summed over heads, max per group.
// spread (softmax only): a per-group summary's row spreads (G = 1), each group's score
// raised by weight * |q_h| * spread.
std::vector<int32_t> BruteForce(const std::vector<double>& klr, const std::vector<float>& q,
                                int n_head, int rank, int n, int G, int M, bool softmax,
                                float scale, int g0, const std::vector<double>* spread = nullptr,
                                double weight = 0) {
  const int n_groups = n / G;
  std::vector<double> gs(static_cast<size_t>(n_groups), 0.0), tok(static_cast<size_t>(n), 0.0);
  for (int h = 0; h < n_head; ++h) {
    std::vector<double> s(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < rank; ++j) s[t] += klr[size_t(t) * rank + j] * q[size_t(h) * rank + j];
    if (!softmax) {
      for (int t = 0; t < n; ++t) tok[t] += s[t];
      continue;
    }
    std::vector<double> best(static_cast<size_t>(n_groups));
    for (int g = 0; g < n_groups; ++g)
      best[g] = *std::max_element(s.begin() + g * G, s.begin() + (g + 1) * G);
    if (spread) {
      double qn = 0;
      for (int j = 0; j < rank; ++j)
        qn += double(q[size_t(h) * rank + j]) * q[size_t(h) * rank + j];
      for (int g = 0; g < n_groups; ++g) best[g] += weight * std::sqrt(qn) * (*spread)[g];
    }
    const double m = *std::max_element(best.begin(), best.end());
    double z = 0;
    for (double& v : best) z += (v = std::exp((v - m) * scale));
    for (int g = 0; g < n_groups; ++g) gs[g] += best[g] / z;
  }
  if (!softmax)
    for (int g = 0; g < n_groups; ++g)
      gs[g] = *std::max_element(tok.begin() + g * G, tok.begin() + (g + 1) * G);
  std::vector<int32_t> idx(gs.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return gs[a] > gs[b]; });
  idx.resize(size_t(M));
  for (int32_t& g : idx) g += g0;
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Normal draws from one seeded stream: random keys, then queries.
struct Gaussians {
  std::mt19937 rng;
  std::normal_distribution<float> nd;
  std::vector<float> operator()(size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * nd(rng);
    return v;
  }
};

TEST_F(GroupPredictorTest, SelectsTheTopGroupsOfTheSummary) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(1);  // full rank: scores are exact q.k
  const int M = 20, g0 = 3;
  Gaussians draw{std::mt19937(11), {}};
  const std::vector<float> keys = draw(size_t(4200) * hp.n_head_kv * hp.head_dim, 1);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 3);
  // Scoring runs in chunks of whole tiles and groups, split between threads from 4096
  // tokens: G = 5 and 7 make chunks that are not a power of two, and the range starts at
  // group 3, mid-tile; 1000 tokens are scored on one thread.
  for (const auto& [n, G] : {std::pair{4200, 4}, {4200, 5}, {4200, 7}, {1000, 5}}) {
    for (kernels::ScoreType type : {kernels::ScoreType::kF16, kernels::ScoreType::kQ8}) {
      for (GroupScoring scoring : {GroupScoring::kSoftmax, GroupScoring::kSum}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " G " << G << " "
                                          << (type == kernels::ScoreType::kQ8 ? "q8 " : "f16 ")
                                          << GroupScoringName(scoring));
        std::unique_ptr<GroupPredictor> p;
        STRATA_ASSERT_OK(
            GroupPredictor::Create(*model_, set, scoring, type, g0 * G + n, 1, &pool_, &p));
        // The keys sit at positions [g0*G, g0*G + n).
        const int64_t p0 = int64_t(g0) * G;
        std::vector<uint8_t> tiled(GroupPredictor::KlrBytes(p0 + n, set.rank, type));
        p->ProjectKeys(0, keys.data(), n, p0, tiled.data());
        std::vector<double> klr(size_t(n) * set.rank);  // row-major copy for the brute force
        double err = 0, mag = 0;
        for (int t = 0; t < n; ++t)
          for (int j = 0; j < set.rank; ++j) {
            const double v = StoredValue(type, tiled, p0 + t, j, set.rank);
            klr[size_t(t) * set.rank + j] = v;
            // The identity columns make K_lr a permutation of each key (the
            // WriteIdentityAdapters layout): compare with what was stored.
            err = std::max(err, std::fabs(v - keys[size_t(t) * set.rank + ((j * 7) % set.rank)]));
            mag = std::max(mag, double(std::fabs(keys[size_t(t) * set.rank + j])));
          }
        // F16 keeps 11 bits; Q8 is within half a step of the row's largest magnitude / 127.
        EXPECT_LT(err, type == kernels::ScoreType::kQ8 ? mag / 254 * 1.01 : mag * 1e-3);
        std::vector<int32_t> got;
        p->SelectGroups(q.data(), tiled.data(), g0, g0 + n / G, G, M, &got);
        const auto want =
            BruteForce(klr, q, hp.n_head, set.rank, n, G, M, scoring == GroupScoring::kSoftmax,
                       1.0f / std::sqrt(float(hp.head_dim)), g0);
        EXPECT_EQ(got, want);
      }
    }
  }
}

// Sequences of a batch select side by side, each whole on one pool worker with its own
// scratch: each gets exactly the groups and scores it gets alone from the engine thread,
// whose scoring is split over the pool (4200 tokens).
TEST_F(GroupPredictorTest, SelectionsOnPoolWorkersMatchTheEngineThreads) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(4);
  const int n = 4200, G = 5, M = 40, kQueries = 6;
  Gaussians draw{std::mt19937(5), {}};
  const std::vector<float> keys = draw(size_t(n) * hp.n_head_kv * hp.head_dim, 1);
  const std::vector<float> q = draw(size_t(kQueries) * hp.n_head * set.rank, 3);
  std::unique_ptr<GroupPredictor> p;
  STRATA_ASSERT_OK(GroupPredictor::Create(*model_, set, GroupScoring::kSoftmax,
                                          kernels::ScoreType::kQ4, n, kQueries, &pool_, &p));
  std::vector<uint8_t> tiled(GroupPredictor::KlrBytes(n, set.rank, kernels::ScoreType::kQ4));
  p->ProjectKeys(0, keys.data(), n, 0, tiled.data());
  const std::vector<int32_t> favored = {2, 17, 400, 801};
  auto query = [&](int64_t i) { return q.data() + size_t(i) * hp.n_head * set.rank; };
  std::vector<std::vector<int32_t>> alone(kQueries), side(kQueries);
  std::vector<std::vector<float>> alone_scores(kQueries), side_scores(kQueries);
  for (int i = 0; i < kQueries; ++i)
    p->SelectGroups(query(i), tiled.data(), 1, n / G, G, M, &alone[size_t(i)], favored, 3.0f, {},
                    &alone_scores[size_t(i)]);
  p->ReserveGroupSize(G);
  std::vector<int> workers(kQueries, -1);
  pool_.Run(kQueries, [&](int64_t i, int worker) {
    workers[size_t(i)] = worker;
    p->SelectGroups(query(i), tiled.data(), 1, n / G, G, M, &side[size_t(i)], favored, 3.0f, {},
                    &side_scores[size_t(i)], worker);
  });
  for (int i = 0; i < kQueries; ++i) {
    SCOPED_TRACE(::testing::Message() << "query " << i << " on worker " << workers[size_t(i)]);
    EXPECT_EQ(alone[size_t(i)].size(), size_t(M));
    EXPECT_EQ(side[size_t(i)], alone[size_t(i)]);
    EXPECT_EQ(side_scores[size_t(i)], alone_scores[size_t(i)]);
  }
  // The queries differ, so their selections do too (the comparison above is not vacuous).
  EXPECT_NE(alone[0], alone[1]);
}

// TailRatios: per head, the left-out groups' summed exp(best score) over the attended
// groups' and the outside runs' (each run counted as one group), from the scores of the
// selection just made, against the same sums in double precision.
TEST_F(GroupPredictorTest, TailRatiosCompareLeftOutWithAttendedMass) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(1);
  const int n = 4200, G = 5, g0 = 1, g1 = 800, M = 40;
  Gaussians draw{std::mt19937(23), {}};
  std::vector<uint8_t> tiled;
  std::unique_ptr<GroupPredictor> p = F16Summary(set, n, draw, &tiled);
  ASSERT_TRUE(p);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 0.5);
  std::vector<int32_t> sel;
  p->SelectGroups(q.data(), tiled.data(), g0, g1, G, M, &sel);
  ASSERT_EQ(sel.size(), size_t(M));
  // Attended: the selection and every third group (stale picks still in memory); outside:
  // the sink group, two recent groups and a partial rolling group of 3 tokens.
  std::vector<uint8_t> attended(size_t(g1 - g0), 0);
  for (int32_t g : sel) attended[size_t(g - g0)] = 1;
  for (int32_t g = g0; g < g1; g += 3) attended[size_t(g - g0)] = 1;
  std::vector<int32_t> list;
  for (int32_t g = g0; g < g1; ++g)
    if (attended[size_t(g - g0)]) list.push_back(g);
  const std::vector<GroupPredictor::TokenRun> outside = {{0, G},
                                                         {g1 * G, (g1 + 1) * G},
                                                         {(g1 + 1) * G, (g1 + 2) * G},
                                                         {(g1 + 2) * G, (g1 + 2) * G + 3}};
  std::vector<float> got(size_t(hp.n_head));
  p->TailRatios(tiled.data(), g0, g1, list, outside, -1, got.data());

  const double scale = 1.0 / std::sqrt(double(hp.head_dim));
  auto score = [&](int h, int64_t t) {
    double s = 0;
    for (int j = 0; j < set.rank; ++j)
      s += StoredValue(kernels::ScoreType::kF16, tiled, t, j, set.rank) *
           q[size_t(h) * set.rank + j];
    return s * scale;
  };
  auto best = [&](int h, int64_t a, int64_t b) {
    double m = -INFINITY;
    for (int64_t t = a; t < b; ++t) m = std::max(m, score(h, t));
    return m;
  };
  int heads_with_tail = 0;
  for (int h = 0; h < hp.n_head; ++h) {
    std::vector<double> gm;
    for (int32_t g = g0; g < g1; ++g) gm.push_back(best(h, int64_t(g) * G, int64_t(g + 1) * G));
    const double top = *std::max_element(gm.begin(), gm.end());
    double in = 0, out = 0;
    for (int32_t g = g0; g < g1; ++g)
      (attended[size_t(g - g0)] ? in : out) += std::exp(gm[size_t(g - g0)] - top);
    for (const auto& r : outside) in += std::exp(best(h, r.begin, r.end) - top);
    const double want = out / in;
    EXPECT_NEAR(got[size_t(h)], want, 2e-3 * want + 1e-6) << "head " << h;
    heads_with_tail += want > 0.05;
  }
  // Half the groups are left out: the ratios are not all vanishing.
  EXPECT_GT(heads_with_tail, 0);
}

// Favored groups (those already in memory) win a near tie: with a bonus, the best favored
// group outside the plain top M displaces the weakest plain pick; without one, nothing moves.
TEST_F(GroupPredictorTest, FavoredGroupsWinNearTies) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(1);
  const int n = 512, G = 4, M = 10;
  Gaussians draw{std::mt19937(12), {}};
  std::vector<uint8_t> tiled;
  std::unique_ptr<GroupPredictor> p = F16Summary(set, n, draw, &tiled);
  ASSERT_TRUE(p);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 3);
  std::vector<int32_t> plain, top_more;
  p->SelectGroups(q.data(), tiled.data(), 0, n / G, G, M, &plain);
  p->SelectGroups(q.data(), tiled.data(), 0, n / G, G, M + 1, &top_more);
  // The (M+1)-th best group, favored, with ids outside the range that must be ignored.
  int32_t next = -1;
  for (int32_t g : top_more)
    if (!std::binary_search(plain.begin(), plain.end(), g)) next = g;
  ASSERT_GE(next, 0);
  const std::vector<int32_t> favored = {-5, next, n / G + 3};
  std::vector<int32_t> got;
  p->SelectGroups(q.data(), tiled.data(), 0, n / G, G, M, &got, favored, 0.0f);
  EXPECT_EQ(got, plain);
  p->SelectGroups(q.data(), tiled.data(), 0, n / G, G, M, &got, favored, 100.0f);
  ASSERT_EQ(got.size(), size_t(M));
  EXPECT_TRUE(std::binary_search(got.begin(), got.end(), next));
  int32_t kept = 0;
  for (int32_t g : got) kept += std::binary_search(plain.begin(), plain.end(), g);
  EXPECT_EQ(kept, M - 1);
}

// Raw summed scores (kv.experimental.scoring sum) can be negative. The bonus raises a favored
// group's score but keeps the order of the plain scores: a favored group at the bottom stays out at
// any bonus, and one just below the top M is raised into it.
TEST_F(GroupPredictorTest, TheBonusNeverLiftsANegativeScoreAboveABetterOne) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(1);
  const int n = 512, G = 4, M = 10, n_groups = n / G;
  Gaussians draw{std::mt19937(13), {}};
  std::vector<uint8_t> tiled;
  std::unique_ptr<GroupPredictor> p = F16Summary(set, n, draw, &tiled, GroupScoring::kSum);
  ASSERT_TRUE(p);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 3);
  std::vector<int32_t> all, plain;
  std::vector<float> scores;
  p->SelectGroups(q.data(), tiled.data(), 0, n_groups, G, n_groups, &all, {}, 0.0f, {}, &scores);
  ASSERT_EQ(all.size(), size_t(n_groups));
  std::vector<int32_t> by_score(all);
  std::sort(by_score.begin(), by_score.end(),
            [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  const int32_t worst = by_score.back(), next = by_score[size_t(M)];
  ASSERT_LT(scores[size_t(worst)], 0.0f) << "the draw gives no negative group score";
  p->SelectGroups(q.data(), tiled.data(), 0, n_groups, G, M, &plain);
  for (float bonus : {0.5f, 3.0f, 10.0f, 100.0f}) {
    SCOPED_TRACE(bonus);
    std::vector<int32_t> got;
    const std::vector<int32_t> favored = {worst};
    p->SelectGroups(q.data(), tiled.data(), 0, n_groups, G, M, &got, favored, bonus);
    EXPECT_EQ(got, plain);
  }
  ASSERT_GT(scores[size_t(next)], 0.0f);
  std::vector<int32_t> got;
  const std::vector<int32_t> favored = {next};
  p->SelectGroups(q.data(), tiled.data(), 0, n_groups, G, M, &got, favored, 100.0f);
  EXPECT_TRUE(std::binary_search(got.begin(), got.end(), next));
}

// A per-group summary (kv.group_summary) holds one row per group: the projection of the
// group's mean key. Scored with a group size of 1 it selects exactly what a per-token
// summary selects when every token's row is its group's mean; and it is not what the
// per-token summary of the real keys selects (the best token, not the mean, decides there).
TEST_F(GroupPredictorTest, GroupSummaryRowsAreTheGroupsMeanKey) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(4);
  const int32_t n = 512, G = 4, M = 12, row = hp.n_head_kv * hp.head_dim;
  Gaussians draw{std::mt19937(21), {}};
  const std::vector<float> keys = draw(size_t(n) * row, 1);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 2);
  for (kernels::ScoreType type : {kernels::ScoreType::kF16, kernels::ScoreType::kQ4}) {
    std::unique_ptr<GroupPredictor> p;
    STRATA_ASSERT_OK(
        GroupPredictor::Create(*model_, set, GroupScoring::kSoftmax, type, n, 1, &pool_, &p));
    std::vector<uint8_t> per_group(GroupPredictor::KlrBytes(n / G, set.rank, type));
    std::vector<uint16_t> spreads(GroupPredictor::SpreadBytes(n / G) / 2);
    for (int32_t g = 0; g < n / G; ++g)
      p->ProjectGroup(0, keys.data() + size_t(g) * G * row, G, g, per_group.data(), spreads.data());
    // The same means, projected as tokens: once per group, and once for each of its tokens.
    std::vector<float> means(size_t(n / G) * row, 0.0f), spread(size_t(n) * row);
    for (int32_t g = 0; g < n / G; ++g) {
      float* m = means.data() + size_t(g) * row;
      for (int32_t t = 0; t < G; ++t)
        for (int32_t i = 0; i < row; ++i) m[i] += keys[(size_t(g) * G + t) * row + i];
      for (int32_t i = 0; i < row; ++i) m[i] *= 1.0f / G;
      for (int32_t t = 0; t < G; ++t)
        std::memcpy(spread.data() + (size_t(g) * G + t) * row, m, size_t(row) * sizeof(float));
    }
    std::vector<uint8_t> of_means(per_group.size()),
        of_spread(GroupPredictor::KlrBytes(n, set.rank, type)), of_keys(of_spread.size());
    p->ProjectKeys(0, means.data(), n / G, 0, of_means.data());
    EXPECT_EQ(per_group, of_means);
    p->ProjectKeys(0, spread.data(), n, 0, of_spread.data());
    p->ProjectKeys(0, keys.data(), n, 0, of_keys.data());
    std::vector<int32_t> by_group, by_spread, by_keys;
    p->SelectGroups(q.data(), per_group.data(), 1, n / G, 1, M, &by_group);
    p->SelectGroups(q.data(), of_spread.data(), 1, n / G, G, M, &by_spread);
    p->SelectGroups(q.data(), of_keys.data(), 1, n / G, G, M, &by_keys);
    ASSERT_EQ(by_group.size(), size_t(M));
    EXPECT_EQ(by_group, by_spread);
    EXPECT_NE(by_group, by_keys);
  }
}

// A per-group summary's spread is the largest distance of a group's key from its mean (in
// the summary's space; the full-rank identity adapters make that the keys' own space), and
// selection adds weight * |q_h| * spread to each head's group score, as a brute force does.
TEST_F(GroupPredictorTest, GroupSpreadsRaiseTheScoresOfWideGroups) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(1);
  const int32_t n = 600, G = 5, M = 15, row = hp.n_head_kv * hp.head_dim, rows = n / G;
  Gaussians draw{std::mt19937(31), {}};
  const std::vector<float> keys = draw(size_t(n) * row, 1);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 3);
  std::unique_ptr<GroupPredictor> p;
  STRATA_ASSERT_OK(GroupPredictor::Create(*model_, set, GroupScoring::kSoftmax,
                                          kernels::ScoreType::kF16, n, 1, &pool_, &p));
  std::vector<uint8_t> tiled(GroupPredictor::KlrBytes(rows, set.rank, kernels::ScoreType::kF16));
  std::vector<uint16_t> spread(GroupPredictor::SpreadBytes(rows) / 2);
  for (int32_t g = 0; g < rows; ++g)
    p->ProjectGroup(0, keys.data() + size_t(g) * G * row, G, g, tiled.data(), spread.data());
  std::vector<double> klr(size_t(rows) * set.rank), sp(static_cast<size_t>(rows));
  for (int32_t g = 0; g < rows; ++g) {
    std::vector<double> mean(static_cast<size_t>(row), 0.0);
    for (int32_t t = 0; t < G; ++t)
      for (int32_t i = 0; i < row; ++i) mean[i] += keys[(size_t(g) * G + t) * row + i] / G;
    double worst = 0;
    for (int32_t t = 0; t < G; ++t) {
      double d2 = 0;
      for (int32_t i = 0; i < row; ++i) {
        const double d = keys[(size_t(g) * G + t) * row + i] - mean[i];
        d2 += d * d;
      }
      worst = std::max(worst, std::sqrt(d2));
    }
    sp[g] = kernels::F16ToF32(spread[g]);
    EXPECT_NEAR(sp[g], worst, worst * 2e-3) << "group " << g;
    for (int32_t j = 0; j < set.rank; ++j)
      klr[size_t(g) * set.rank + j] = StoredValue(kernels::ScoreType::kF16, tiled, g, j, set.rank);
  }
  const float scale = 1.0f / std::sqrt(float(hp.head_dim));
  std::vector<int32_t> plain;
  p->SelectGroups(q.data(), tiled.data(), 0, rows, 1, M, &plain);
  EXPECT_EQ(plain, BruteForce(klr, q, hp.n_head, set.rank, rows, 1, M, true, scale, 0));
  for (float weight : {0.25f, 1.0f}) {
    SCOPED_TRACE(weight);
    std::vector<int32_t> got;
    p->SelectGroups(q.data(), tiled.data(), 0, rows, 1, M, &got, {}, 0.0f,
                    RowSpread{spread.data(), weight});
    EXPECT_EQ(got,
              BruteForce(klr, q, hp.n_head, set.rank, rows, 1, M, true, scale, 0, &sp, weight));
    EXPECT_NE(got, plain);
  }
}

// kv.experimental.read_through_span: the selection's `keep` best groups stay, and the rest of the M
// come from the spans of adjacent groups that carry the most attention outside them.
TEST_F(GroupPredictorTest, SpanReadThroughKeepsTheBestAndFillsWholeSpans) {
  const HParams& hp = model_->hparams();
  const AdapterSet& set = *adapters_.Find(1);
  const int32_t n = 800, G = 4, groups = n / G, g0 = 1, M = 40, keep = 15;
  const int32_t row = hp.n_head_kv * hp.head_dim;
  Gaussians draw{std::mt19937(57), {}};
  const std::vector<float> keys = draw(size_t(n) * row, 1);
  const std::vector<float> q = draw(size_t(hp.n_head) * set.rank, 3);
  std::unique_ptr<GroupPredictor> p;
  STRATA_ASSERT_OK(GroupPredictor::Create(*model_, set, GroupScoring::kSoftmax,
                                          kernels::ScoreType::kF16, n, n, &pool_, &p));
  std::vector<uint8_t> tiled(GroupPredictor::KlrBytes(n, set.rank, kernels::ScoreType::kF16));
  p->ProjectKeys(0, keys.data(), n, 0, tiled.data());
  // Every group's score, from a selection that takes them all.
  std::vector<int32_t> all;
  std::vector<float> score;
  p->SelectGroups(q.data(), tiled.data(), g0, groups, G, groups, &all, {}, 0.0f, {}, &score);
  ASSERT_EQ(int32_t(score.size()), groups - g0);
  for (int32_t span : {1, 3, 8}) {
    SCOPED_TRACE(span);
    std::vector<int32_t> sel;
    std::vector<float> sel_scores;
    p->SelectGroups(q.data(), tiled.data(), g0, groups, G, M, &sel, {}, 0.0f, {}, &sel_scores);
    const std::vector<int32_t> plain = sel;
    p->SpanReadThrough(g0, groups, keep, span, &sel, &sel_scores);
    ASSERT_EQ(int32_t(sel.size()), M);
    ASSERT_EQ(sel_scores.size(), sel.size());
    EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    EXPECT_EQ(std::adjacent_find(sel.begin(), sel.end()), sel.end());
    for (size_t i = 0; i < sel.size(); ++i)
      EXPECT_EQ(sel_scores[i], score[size_t(sel[i] - g0)]) << "group " << sel[i];
    if (span == 1) {
      EXPECT_EQ(sel, plain);
      continue;
    }
    // The keep best groups of all.
    std::vector<int32_t> rank(static_cast<size_t>(groups - g0));
    std::iota(rank.begin(), rank.end(), 0);
    std::stable_sort(rank.begin(), rank.end(),
                     [&](int32_t a, int32_t b) { return score[size_t(a)] > score[size_t(b)]; });
    std::vector<bool> kept(static_cast<size_t>(groups - g0), false), in(kept);
    for (int32_t i = 0; i < keep; ++i) kept[size_t(rank[size_t(i)])] = true;
    for (int32_t g : sel) in[size_t(g - g0)] = true;
    for (int32_t i = 0; i < keep; ++i) EXPECT_TRUE(in[size_t(rank[size_t(i)])]);
    // Spans by their mass outside the kept groups, heaviest first: whole spans are taken in
    // that order, and no span outside the taken ones outweighs the lightest taken.
    const int32_t n_spans = (groups - g0 + span - 1) / span;
    std::vector<double> mass(static_cast<size_t>(n_spans), 0.0);
    std::vector<int32_t> free(static_cast<size_t>(n_spans), 0), taken(free);
    for (int32_t g = 0; g < groups - g0; ++g)
      if (!kept[size_t(g)]) {
        mass[size_t(g / span)] += score[size_t(g)];
        ++free[size_t(g / span)];
        taken[size_t(g / span)] += in[size_t(g)];
      }
    int32_t partial = 0;
    double lightest_whole = 1e30, heaviest_untaken = -1;
    for (int32_t sp = 0; sp < n_spans; ++sp) {
      if (taken[size_t(sp)] == 0) {
        heaviest_untaken = std::max(heaviest_untaken, mass[size_t(sp)]);
      } else if (taken[size_t(sp)] == free[size_t(sp)]) {
        lightest_whole = std::min(lightest_whole, mass[size_t(sp)]);
      } else {
        ++partial;
      }
    }
    EXPECT_LE(partial, 1);
    EXPECT_LE(heaviest_untaken, lightest_whole);
    EXPECT_NE(sel, plain);
  }
  // Nothing changes where the keep covers the selection.
  std::vector<int32_t> sel;
  std::vector<float> sel_scores;
  p->SelectGroups(q.data(), tiled.data(), g0, groups, G, M, &sel, {}, 0.0f, {}, &sel_scores);
  const std::vector<int32_t> plain = sel;
  p->SpanReadThrough(g0, groups, M, 8, &sel, &sel_scores);
  EXPECT_EQ(sel, plain);
}

TEST_F(GroupPredictorTest, FewerCandidatesThanMSelectsThemAll) {
  std::unique_ptr<GroupPredictor> p;
  STRATA_ASSERT_OK(GroupPredictor::Create(*model_, *adapters_.Find(4), GroupScoring::kSoftmax,
                                          kernels::ScoreType::kF16, 64, 1, &pool_, &p));
  std::vector<float> q(size_t(model_->hparams().n_head) * p->rank(), 1.0f);
  std::vector<uint8_t> klr(GroupPredictor::KlrBytes(64, p->rank(), kernels::ScoreType::kF16));
  std::vector<int32_t> got;
  p->SelectGroups(q.data(), klr.data(), 2, 6, 4, 10, &got);
  EXPECT_EQ(got, (std::vector<int32_t>{2, 3, 4, 5}));
  p->SelectGroups(q.data(), klr.data(), 2, 2, 4, 10, &got);
  EXPECT_TRUE(got.empty());
}

}  // namespace
}  // namespace strata
