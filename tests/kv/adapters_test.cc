// The adapters file: round trip, and every kind of damage refused with the field named.
#include "runtime/kv/disk/adapters.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

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
  a.profile.tokens = {0, 4, 8};
  a.profile.error = {{0.5f, 0.25f, 0.0f}, {0.9f, 0.8f, 0.7f}};
  return a;
}

// The checksum the file ends with (FNV-1a 64 of every byte before it).
void Reseal(std::string* bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i + 8 < bytes->size(); ++i) {
    h ^= uint8_t((*bytes)[i]);
    h *= 0x100000001b3ull;
  }
  std::memcpy(bytes->data() + bytes->size() - 8, &h, 8);
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
  EXPECT_EQ(b.profile.tokens, a.profile.tokens);
  EXPECT_EQ(b.profile.error, a.profile.error);
  // Linear between points, flat past the last.
  EXPECT_DOUBLE_EQ(b.profile.Error(0, 2), 0.375);
  EXPECT_DOUBLE_EQ(b.profile.Error(1, 100), 0.7f);
}

TEST(AdaptersTest, Version2FilesAreReadWithoutAProfile) {
  testing::TempFile f("v2.adapters");
  Adapters a = Sample();
  a.profile = {};
  STRATA_ASSERT_OK(a.Write(f.path()));
  std::string bytes = Slurp(f.path());
  // Version 2 ends at the matrices: drop the profile's point count (0) and reseal.
  bytes.erase(bytes.size() - 12, 4);
  const uint32_t v2 = 2;
  std::memcpy(bytes.data() + 8, &v2, 4);
  Reseal(&bytes);
  std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
  Adapters b;
  STRATA_ASSERT_OK(Adapters::Read(f.path(), &b));
  EXPECT_TRUE(b.profile.empty());
  EXPECT_EQ(b.Find(2)->layers[0], a.sets[0].layers[0]);
}

TEST(AdaptersTest, ADamagedProfileIsRefused) {
  testing::TempFile f("prof.adapters");
  STRATA_ASSERT_OK(Sample().Write(f.path()));
  std::string bytes = Slurp(f.path());
  // The last profile value (layer 1, point 2) sits just before the checksum.
  const float bad = 20.0f;
  std::memcpy(bytes.data() + bytes.size() - 12, &bad, 4);
  Reseal(&bytes);
  std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
  Adapters b;
  Status st = Adapters::Read(f.path(), &b);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("attention profile of layer 1 holds 20"), std::string::npos)
      << st.message();
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

TEST(AdaptersTest, AHeaderThatPromisesMoreThanTheFileHoldsIsRefusedBeforeAllocating) {
  // A valid file, then its n_layer raised to the limit (checksum skipped, as a damaged file
  // with a matching checksum would be): the matrices it promises do not fit in the bytes.
  Adapters a;
  a.model_identity = 1;
  a.n_layer = 1;
  a.n_head_kv = 1;
  a.head_dim = 64;
  AdapterSet set;
  set.ratio = 4;
  set.rank = 16;
  set.layers.push_back(std::vector<float>(64 * 16, 0.5f));
  a.sets.push_back(set);
  const std::string path = ::testing::TempDir() + "promise.adapters";
  ASSERT_TRUE(a.Write(path).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  // Header: magic (8), version (4), identity (8), then n_layer.
  const uint32_t huge = 60000;
  std::memcpy(b.data() + 20, &huge, 4);
  Adapters out;
  const Status s = Adapters::Parse(b, "promise.adapters", &out, /*verify_checksum=*/false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kCorruption);
  EXPECT_NE(s.message().find("promises"), std::string::npos) << s.ToString();
}

TEST(AdaptersTest, AHeaderWhoseMatricesSumPast64BitsIsRefused) {
  // Found by the fuzzer: n_layer 65536, n_head_kv 23296, head_dim 65536 and a rank near
  // 1.7e8 promise more than 2^64 bytes; the total wrapped to a small number and the parser
  // asked for an impossible allocation.
  const std::vector<uint8_t> b = {
      0x53, 0x54, 0x52, 0x4b, 0x56, 0x41, 0x44, 0x50, 0x03, 0x00, 0x00, 0x00, 0x93, 0x00, 0x2a,
      0x00, 0x01, 0x00, 0x00, 0x0d, 0x00, 0x00, 0x01, 0x00, 0x00, 0x5b, 0x00, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x00, 0x1b, 0x00, 0x00, 0x08, 0x2b, 0x00, 0xbb, 0x00, 0x00, 0x00, 0x00, 0x01,
      0x00, 0x00, 0x00, 0xff, 0xff, 0x26, 0x0a, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x60, 0x70, 0x00, 0x1b, 0x00, 0xff, 0x00, 0x2b, 0x00};
  Adapters out;
  const Status s = Adapters::Parse(b, "wrap.adapters", &out, /*verify_checksum=*/false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kCorruption);
  EXPECT_NE(s.message().find("more than 2^64"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace strata
