// Calibration: the SVD projection recovers the subspace keys live in, and a calibration run
// on a synthetic model yields adapters the disk policy accepts for that model only.
#include "tuner/calibration.h"

#include <cmath>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "runtime/model/model.h"
#include "runtime/model/synthetic_model.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

// Columns of a [row][rank] matrix: max |A^T A - I|.
double OrthonormalError(const std::vector<float>& a, int row, int rank) {
  double worst = 0;
  for (int i = 0; i < rank; ++i)
    for (int j = 0; j < rank; ++j) {
      double d = 0;
      for (int r = 0; r < row; ++r) d += double(a[r * rank + i]) * a[r * rank + j];
      worst = std::max(worst, std::fabs(d - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

TEST(CalibrationTest, ProjectionRecoversTheKeySubspace) {
  const int row = 16, n = 400, k = 3;
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  // Keys = coefficients x a fixed 3-dimensional basis, the first direction strongest, plus
  // a little noise in every dimension.
  std::vector<double> basis(size_t(k) * row);
  for (double& v : basis) v = nd(rng);
  std::vector<float> keys(size_t(n) * row);
  for (int t = 0; t < n; ++t) {
    double coef[k];
    for (int j = 0; j < k; ++j) coef[j] = (10.0 / (j + 1)) * nd(rng);
    for (int r = 0; r < row; ++r) {
      double v = 1e-3 * nd(rng);
      for (int j = 0; j < k; ++j) v += coef[j] * basis[j * row + r];
      keys[size_t(t) * row + r] = float(v);
    }
  }
  std::vector<float> a;
  STRATA_ASSERT_OK(LowRankProjection(keys, n, row, k, &a));
  EXPECT_LT(OrthonormalError(a, row, k), 1e-5);
  // K A A^T keeps the keys: relative residual at the noise level.
  double res = 0, tot = 0;
  for (int t = 0; t < n; ++t) {
    std::vector<double> c(static_cast<size_t>(k), 0.0);
    for (int j = 0; j < k; ++j)
      for (int r = 0; r < row; ++r) c[j] += double(keys[size_t(t) * row + r]) * a[r * k + j];
    for (int r = 0; r < row; ++r) {
      double back = 0;
      for (int j = 0; j < k; ++j) back += c[j] * a[r * k + j];
      const double x = keys[size_t(t) * row + r];
      res += (x - back) * (x - back);
      tot += x * x;
    }
  }
  EXPECT_LT(std::sqrt(res / tot), 1e-3);
  // Rank 1 is the strongest direction, so it keeps more than a third of the energy.
  std::vector<float> a1;
  STRATA_ASSERT_OK(LowRankProjection(keys, n, row, 1, &a1));
  for (int r = 0; r < row; ++r) EXPECT_NEAR(std::fabs(a1[r]), std::fabs(a[r * k]), 1e-5);
}

// E[(q.k - q^T W k)^2] = tr(Sq (I - W) Sk (I - W)^T) for independent q and k.
double BilinearError(const std::vector<double>& sq, const std::vector<double>& sk,
                     const std::vector<double>& w, int n) {
  std::vector<double> e(size_t(n) * n), t1(size_t(n) * n, 0.0), t2(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) e[i * n + j] = (i == j) - w[i * n + j];
  for (int i = 0; i < n; ++i)  // t1 = Sq E
    for (int p = 0; p < n; ++p)
      for (int j = 0; j < n; ++j) t1[i * n + j] += sq[i * n + p] * e[p * n + j];
  for (int i = 0; i < n; ++i)  // t2 = t1 Sk
    for (int p = 0; p < n; ++p)
      for (int j = 0; j < n; ++j) t2[i * n + j] += t1[i * n + p] * sk[p * n + j];
  double tr = 0;  // tr(t2 E^T)
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) tr += t2[i * n + j] * e[i * n + j];
  return tr;
}

TEST(CalibrationTest, QueryAwareKeepsTheDirectionsScoresDependOn) {
  // Keys vary most in dims 0-3, which queries never use; queries live in dims 4-7.
  const int n = 12, rank = 4;
  std::vector<double> sk(size_t(n) * n, 0.0), sq(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    sk[i * n + i] = i < 4 ? 100.0 : 1.0;
    sq[i * n + i] = (i >= 4 && i < 8) ? 1.0 : 1e-9;
  }
  std::vector<std::vector<float>> a, b;
  STRATA_ASSERT_OK(QueryAwareProjection(sk, sq, n, {rank, n}, &a, &b));
  ASSERT_EQ(a.size(), 2u);
  auto w_of = [&](const std::vector<float>& am, const std::vector<float>& bm, int r) {
    std::vector<double> w(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        for (int c = 0; c < r; ++c) w[i * n + j] += double(bm[i * r + c]) * am[j * r + c];
    return w;
  };
  const double total = BilinearError(sq, sk, std::vector<double>(size_t(n) * n, 0.0), n);
  const double aware = BilinearError(sq, sk, w_of(a[0], b[0], rank), n);
  // Key-only: the keys' leading directions are dims 0-3 (the covariance is diagonal).
  std::vector<float> keys_only(size_t(n) * rank, 0.0f);
  for (int c = 0; c < rank; ++c) keys_only[c * rank + c] = 1.0f;
  const double plain = BilinearError(sq, sk, w_of(keys_only, keys_only, rank), n);
  EXPECT_LT(aware, 1e-6 * total);
  EXPECT_GT(plain, 0.99 * total);
  // Full rank reproduces every score.
  EXPECT_LT(BilinearError(sq, sk, w_of(a[1], b[1], n), n), 1e-9 * total);
}

TEST(CalibrationTest, TooFewKeysOrBadRankAreErrors) {
  std::vector<float> keys(8 * 16, 1.0f), a;
  Status st = LowRankProjection(keys, 8, 16, 2, &a);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("8 keys are fewer than the key width 16"), std::string::npos)
      << st.message();
  keys.resize(32 * 16, 1.0f);
  EXPECT_EQ(LowRankProjection(keys, 32, 16, 17, &a).code(), Status::Code::kOutOfRange);
}

TEST(CalibrationTest, CalibratesASyntheticModel) {
  testing::TempFile model_file("calib.gguf"), text_file("calib.txt"), out_file("calib.adapters");
  SyntheticModelSpec spec;
  STRATA_ASSERT_OK(WriteSyntheticModel(spec, model_file.path()));
  std::unique_ptr<Model> model;
  STRATA_ASSERT_OK(Model::Load(model_file.path(), &model));
  {
    std::ofstream t(text_file.path());
    for (int i = 0; i < 40; ++i) t << SyntheticTrainingText() << "\n";
  }
  CalibrationOptions o;
  o.text_path = text_file.path();
  o.query_aware = false;
  o.ratios = {2, 4, 8};
  o.tokens = 192;
  o.window = 64;
  o.threads = 2;
  Adapters a;
  STRATA_ASSERT_OK(Calibrate(*model, o, &a));
  const int row = model->hparams().n_head_kv * model->hparams().head_dim;
  EXPECT_EQ(a.model_identity, model->identity());
  EXPECT_EQ(a.calibration_tokens, 192u);
  EXPECT_NE(a.note.find("first 50%"), std::string::npos) << a.note;
  ASSERT_EQ(a.sets.size(), 3u);
  for (const AdapterSet& s : a.sets) {
    EXPECT_EQ(s.rank, row / s.ratio);
    ASSERT_EQ(int(s.layers.size()), model->hparams().n_layer);
    for (const auto& m : s.layers) EXPECT_LT(OrthonormalError(m, row, s.rank), 1e-4);
  }
  // Smaller ranks are the leading columns of larger ones.
  const AdapterSet* big = a.Find(2);
  const AdapterSet* small = a.Find(8);
  for (int r = 0; r < row; ++r)
    for (int j = 0; j < small->rank; ++j)
      EXPECT_EQ(small->layers[1][r * small->rank + j], big->layers[1][r * big->rank + j]);
  // The attention profile: per layer, non-increasing in the tokens kept, some error with
  // none kept, none once the whole window (64 tokens) can be kept.
  ASSERT_FALSE(a.profile.empty());
  ASSERT_EQ(int(a.profile.error.size()), model->hparams().n_layer);
  for (const std::vector<float>& m : a.profile.error) {
    ASSERT_EQ(m.size(), a.profile.tokens.size());
    EXPECT_GT(m[0], 0.0f);
    EXPECT_LE(m[0], AttentionProfile::kMaxError);
    for (size_t i = 1; i < m.size(); ++i) EXPECT_LE(m[i], m[i - 1]);
    EXPECT_LT(a.profile.Error(int32_t(&m - a.profile.error.data()), 64), 1e-6);
  }
  STRATA_ASSERT_OK(a.Write(out_file.path()));
  Adapters back;
  STRATA_ASSERT_OK(Adapters::Read(out_file.path(), &back));
  STRATA_ASSERT_OK(back.CheckModel(*model, out_file.path()));
  EXPECT_EQ(back.profile.error, a.profile.error);

  // Query-aware: a B per layer, and at full rank B A^T is the identity on what was seen.
  o.query_aware = true;
  o.ratios = {1, 4};
  STRATA_ASSERT_OK(Calibrate(*model, o, &a));
  const AdapterSet* full = a.Find(1);
  ASSERT_EQ(int(full->queries.size()), model->hparams().n_layer);
  EXPECT_NE(a.note.find("query-aware"), std::string::npos) << a.note;
  double worst = 0;
  for (int i = 0; i < row; ++i)
    for (int j = 0; j < row; ++j) {
      double w = 0;
      for (int c = 0; c < row; ++c)
        w += double(full->queries[0][i * row + c]) * full->layers[0][j * row + c];
      worst = std::max(worst, std::fabs(w - (i == j)));
    }
  EXPECT_LT(worst, 1e-3);
  STRATA_ASSERT_OK(a.Write(out_file.path()));
  STRATA_ASSERT_OK(Adapters::Read(out_file.path(), &back));
  EXPECT_EQ(back.Find(4)->queries[1], a.Find(4)->queries[1]);

  o.ratios = {3, 64};
  Status st = Calibrate(*model, o, &a);
  EXPECT_EQ(st.code(), Status::Code::kOutOfRange);
  EXPECT_NE(st.message().find("ratio 64 is out of range [1, 32]"), std::string::npos)
      << st.message();
  o.ratios = {4};
  o.tokens = 1 << 20;
  st = Calibrate(*model, o, &a);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("fewer than the 1048576 asked for"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace strata
