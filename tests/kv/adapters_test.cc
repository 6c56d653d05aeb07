// The adapters file: round trip, and every kind of damage refused with the field named.
#include "runtime/kv/adapters.h"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/testing/test_model.h"

namespace strata {
namespace {

Adapters Sample() {
  Adapters a;
  a.model_identity = 0x1234abcd5678ef90ull;
  a.n_layer = 2;
  a.n_head_kv = 2;
  a.head_dim = 4;
  a.calibration_tokens = 99;
  a.note = "unit test";
  for (int32_t ratio : {2, 4}) {
    AdapterSet s{ratio, 8 / ratio, {}};
    for (int l = 0; l < 2; ++l) {
      std::vector<float> m(size_t(8) * s.rank);
      for (size_t i = 0; i < m.size(); ++i) m[i] = float(i) * 0.5f - float(l);
      s.layers.push_back(m);
    }
    a.sets.push_back(s);
  }
  return a;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(AdaptersTest, RoundTrip) {
  testing::TempFile f("rt.adapters");
  const Adapters a = Sample();
  STRATA_ASSERT_OK(a.Write(f.path()));
  Adapters b;
  STRATA_ASSERT_OK(Adapters::Read(f.path(), &b));
  EXPECT_EQ(b.model_identity, a.model_identity);
  EXPECT_EQ(b.note, a.note);
  EXPECT_EQ(b.calibration_tokens, 99u);
  ASSERT_EQ(b.sets.size(), 2u);
  EXPECT_EQ(b.Find(4)->rank, 2);
  EXPECT_EQ(b.Find(4)->layers[1], a.sets[1].layers[1]);
  EXPECT_EQ(b.Find(3), nullptr);
  EXPECT_EQ(b.RatioList(), "2, 4");
}

TEST(AdaptersTest, DamageIsRefusedWithTheReason) {
  testing::TempFile f("dmg.adapters");
  STRATA_ASSERT_OK(Sample().Write(f.path()));
  const std::string good = Slurp(f.path());
  auto read_with = [&](const std::string& bytes) {
    std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
    Adapters a;
    return Adapters::Read(f.path(), &a);
  };
  std::string flipped = good;
  flipped[40] ^= 1;
  Status st = read_with(flipped);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.message();
  st = read_with(good.substr(0, good.size() - 9));
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  std::string magic = good;
  magic[0] = 'X';
  st = read_with(magic);
  EXPECT_NE(st.message().find("magic"), std::string::npos) << st.message();
  st = read_with("tiny");
  EXPECT_NE(st.message().find("too short"), std::string::npos) << st.message();
}

TEST(AdaptersTest, MissingFileSaysHowToMakeIt) {
  Adapters a;
  Status st = Adapters::Read("/nonexistent/dir/x.adapters", &a);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("strata calibrate"), std::string::npos) << st.message();
}

TEST(AdaptersTest, RankForRatio) {
  int32_t r = 0;
  STRATA_ASSERT_OK(RankForRatio(192, 16, &r));
  EXPECT_EQ(r, 12);
  STRATA_ASSERT_OK(RankForRatio(192, 32, &r));
  EXPECT_EQ(r, 6);
  Status st = RankForRatio(192, 193, &r);
  EXPECT_EQ(st.code(), Status::Code::kOutOfRange);
  EXPECT_NE(st.message().find("[1, 192]"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace strata
