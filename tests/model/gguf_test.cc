#include "runtime/model/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/model/gguf_writer.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

using kernels::DType;
using testing::TempFile;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

size_t Bytes(DType t, std::vector<int64_t> ne) {
  size_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= static_cast<size_t>(ne[i]);
  return kernels::RowBytes(t, ne[0]) * rows;
}

// A small file with a few metadata entries and two tensors ("a" F32, "b" Q8_0).
GgufWriter BaseWriter(uint32_t alignment = 32) {
  GgufWriter w(alignment);
  w.AddString("general.architecture", "llama");
  w.AddBool("test.flag", true);
  const int32_t arr[] = {1, -2, 3};
  w.AddI32Array("test.arr", arr);
  EXPECT_TRUE(
      w.AddTensor("a", DType::kF32, {8, 2}, RandomBytes(Bytes(DType::kF32, {8, 2}), 1)).ok());
  EXPECT_TRUE(
      w.AddTensor("b", DType::kQ8_0, {32, 3}, RandomBytes(Bytes(DType::kQ8_0, {32, 3}), 2)).ok());
  return w;
}

Status Parse(const std::vector<uint8_t>& bytes, size_t len, std::unique_ptr<GgufFile>* out) {
  return GgufFile::FromMemory(bytes.data(), len, out);
}

// Parses `bytes`, expects failure, returns the message.
std::string ParseError(const std::vector<uint8_t>& bytes) {
  std::unique_ptr<GgufFile> f;
  Status s = Parse(bytes, bytes.size(), &f);
  EXPECT_FALSE(s.ok()) << "corrupted file was accepted";
  EXPECT_NE(s.message().find("<memory>"), std::string::npos) << s.message();
  return s.message();
}

template <typename T>
void Patch(std::vector<uint8_t>* bytes, uint64_t at, T v) {
  std::memcpy(bytes->data() + at, &v, sizeof v);
}

TEST(GgufTest, RoundTripsEveryMetadataType) {
  GgufWriter w(64);
  w.AddU8("k.u8", 200);
  w.AddI8("k.i8", -100);
  w.AddU16("k.u16", 60000);
  w.AddI16("k.i16", -30000);
  w.AddU32("k.u32", 4000000000u);
  w.AddI32("k.i32", -2000000000);
  w.AddU64("k.u64", 1ull << 60);
  w.AddI64("k.i64", -(1ll << 60));
  w.AddF32("k.f32", 1.5f);
  w.AddF64("k.f64", -2.25);
  w.AddBool("k.bool", true);
  w.AddString("k.str", "héllo");
  w.AddString("k.empty", "");
  w.AddStringArray("k.strs", {"a", "", "ccc"});
  const float fa[] = {0.5f, -1.f};
  w.AddF32Array("k.f32s", fa);
  const uint32_t ua[] = {7, 8, 9};
  w.AddU32Array("k.u32s", ua);
  const int16_t i16a[] = {-5, 5};
  w.AddArray("k.i16s", GgufValueType::kInt16, i16a, 2);
  const uint8_t bools[] = {1, 0, 1};
  w.AddArray("k.bools", GgufValueType::kBool, bools, 3);
  const std::vector<uint8_t> q4k = RandomBytes(Bytes(DType::kQ4_K, {256, 2}), 3);
  ASSERT_TRUE(w.AddTensor("t.q4k", DType::kQ4_K, {256, 2}, q4k).ok());
  const std::vector<uint8_t> f16 = RandomBytes(Bytes(DType::kF16, {3, 5, 2}), 4);
  ASSERT_TRUE(w.AddTensor("t.f16", DType::kF16, {3, 5, 2}, f16).ok());
  const std::vector<uint8_t> q41 = RandomBytes(Bytes(DType::kQ4_1, {64, 1, 1, 2}), 5);
  ASSERT_TRUE(w.AddTensor("t.q41", DType::kQ4_1, {64, 1, 1, 2}, q41).ok());

  TempFile tmp("roundtrip.gguf");
  ASSERT_TRUE(w.WriteFile(tmp.path()).ok());
  std::unique_ptr<GgufFile> f;
  STRATA_ASSERT_OK(GgufFile::Open(tmp.path(), &f));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);

  uint32_t u32 = 0;
  STRATA_ASSERT_OK(f->GetU32("k.u32", &u32));
  EXPECT_EQ(u32, 4000000000u);
  STRATA_ASSERT_OK(f->GetU32("k.u8", &u32));  // integers widen
  EXPECT_EQ(u32, 200u);
  uint64_t u64 = 0;
  STRATA_ASSERT_OK(f->GetU64("k.u64", &u64));
  EXPECT_EQ(u64, 1ull << 60);
  EXPECT_EQ(std::get<int64_t>(f->Find("k.i64")->scalar), -(1ll << 60));
  EXPECT_EQ(std::get<int64_t>(f->Find("k.i8")->scalar), -100);
  EXPECT_EQ(std::get<int64_t>(f->Find("k.i16")->scalar), -30000);
  EXPECT_EQ(std::get<int64_t>(f->Find("k.i32")->scalar), -2000000000);
  EXPECT_EQ(std::get<uint64_t>(f->Find("k.u16")->scalar), 60000u);
  float f32 = 0;
  STRATA_ASSERT_OK(f->GetF32("k.f32", &f32));
  EXPECT_EQ(f32, 1.5f);
  STRATA_ASSERT_OK(f->GetF32("k.f64", &f32));
  EXPECT_EQ(f32, -2.25f);
  bool b = false;
  STRATA_ASSERT_OK(f->GetBool("k.bool", &b));
  EXPECT_TRUE(b);
  std::string s;
  STRATA_ASSERT_OK(f->GetString("k.str", &s));
  EXPECT_EQ(s, "héllo");
  STRATA_ASSERT_OK(f->GetString("k.empty", &s));
  EXPECT_EQ(s, "");
  const std::vector<std::string_view>* strs = nullptr;
  STRATA_ASSERT_OK(f->GetStringArray("k.strs", &strs));
  EXPECT_EQ(*strs, (std::vector<std::string_view>{"a", "", "ccc"}));
  std::vector<float> floats;
  STRATA_ASSERT_OK(f->GetF32Array("k.f32s", &floats));
  EXPECT_EQ(floats, (std::vector<float>{0.5f, -1.f}));
  std::vector<int32_t> ints;
  STRATA_ASSERT_OK(f->GetI32Array("k.u32s", &ints));
  EXPECT_EQ(ints, (std::vector<int32_t>{7, 8, 9}));
  STRATA_ASSERT_OK(f->GetI32Array("k.i16s", &ints));
  EXPECT_EQ(ints, (std::vector<int32_t>{-5, 5}));
  const GgufValue* bv = f->Find("k.bools");
  ASSERT_NE(bv, nullptr);
  EXPECT_EQ(bv->elem_type, GgufValueType::kBool);
  EXPECT_EQ(bv->array_len, 3u);

  ASSERT_EQ(f->tensors().size(), 3u);
  const GgufTensor* t = f->FindTensor("t.q4k");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, DType::kQ4_K);
  EXPECT_EQ(t->n_dims, 2);
  EXPECT_EQ(t->ne[0], 256);
  EXPECT_EQ(t->ne[1], 2);
  EXPECT_EQ(t->nbytes, q4k.size());
  EXPECT_EQ(std::memcmp(t->data, q4k.data(), q4k.size()), 0);
  t = f->FindTensor("t.f16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_elements(), 30);
  EXPECT_EQ(std::memcmp(t->data, f16.data(), f16.size()), 0);
  t = f->FindTensor("t.q41");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_dims, 4);
  EXPECT_EQ(t->ne[3], 2);
  EXPECT_EQ(std::memcmp(t->data, q41.data(), q41.size()), 0);
  for (const GgufTensor& x : f->tensors()) EXPECT_EQ(x.offset % 64, 0u) << x.name;
  EXPECT_EQ(f->FindTensor("missing"), nullptr);
  EXPECT_EQ(f->Find("missing"), nullptr);
}

TEST(GgufTest, ReadsVersion2AndMemoryBuffers) {
  GgufWriter w = BaseWriter();
  w.set_version(2);
  const std::vector<uint8_t> bytes = w.Serialize();
  std::unique_ptr<GgufFile> f;
  STRATA_ASSERT_OK(Parse(bytes, bytes.size(), &f));
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->path(), "<memory>");
  // Tensor data points into the caller's buffer: nothing is copied.
  const GgufTensor* a = f->FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_GE(static_cast<const uint8_t*>(a->data), bytes.data());
  EXPECT_LT(static_cast<const uint8_t*>(a->data), bytes.data() + bytes.size());
}

TEST(GgufTest, GettersNameKeyAndType) {
  GgufWriter w;
  w.AddI32("neg", -1);
  w.AddU64("big", 1ull << 40);
  w.AddString("name", "x");
  const std::vector<uint8_t> bytes = w.Serialize();
  std::unique_ptr<GgufFile> f;
  STRATA_ASSERT_OK(Parse(bytes, bytes.size(), &f));
  uint32_t u = 0;
  Status s = f->GetU32("absent", &u);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("'absent' is missing"), std::string::npos) << s.message();
  s = f->GetU32("neg", &u);
  EXPECT_NE(s.message().find("-1 is negative"), std::string::npos) << s.message();
  s = f->GetU32("big", &u);
  EXPECT_NE(s.message().find("exceeds the uint32 limit"), std::string::npos) << s.message();
  s = f->GetU32("name", &u);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("'name' has type string (an integer expected)"), std::string::npos)
      << s.message();
  bool b;
  s = f->GetBool("name", &b);
  EXPECT_NE(s.message().find("(bool expected)"), std::string::npos) << s.message();
}

TEST(GgufTest, RejectsWrongMagicAndVersions) {
  std::vector<uint8_t> bytes = BaseWriter().Serialize();
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'X';
  EXPECT_NE(ParseError(bad).find("not a GGUF file: magic"), std::string::npos);
  for (uint32_t v : {1u, 4u, 0u}) {
    bad = bytes;
    Patch<uint32_t>(&bad, 4, v);
    const std::string msg = ParseError(bad);
    EXPECT_NE(msg.find("version " + std::to_string(v) + " is not supported"), std::string::npos)
        << msg;
  }
  bad = bytes;
  Patch<uint32_t>(&bad, 4, 0x03000000u);
  EXPECT_NE(ParseError(bad).find("big-endian"), std::string::npos);
}

TEST(GgufTest, EveryTruncationIsAnError) {
  GgufLayout layout;
  const std::vector<uint8_t> bytes = BaseWriter().Serialize(&layout);
  std::unique_ptr<GgufFile> f;
  STRATA_ASSERT_OK(Parse(bytes, bytes.size(), &f));
  const GgufTensor& last = f->tensors().back();
  const size_t needed = f->data_offset() + last.offset + last.nbytes;
  for (size_t len = 0; len < needed; ++len) {
    std::unique_ptr<GgufFile> g;
    Status s = Parse(bytes, len, &g);
    ASSERT_FALSE(s.ok()) << "prefix of " << len << " bytes accepted";
    // Each message names the field being read or the tensor that does not fit.
    const bool named = s.message().find("truncated: ") != std::string::npos ||
                       s.message().find("past the end") != std::string::npos ||
                       s.message().find("cannot fit") != std::string::npos;
    EXPECT_TRUE(named) << len << ": " << s.message();
  }
  // Truncated inside the header names the header field.
  std::unique_ptr<GgufFile> g;
  Status s = Parse(bytes, 10, &g);
  EXPECT_NE(s.message().find("header tensor_count"), std::string::npos) << s.message();
  s = Parse(bytes, layout.tensors[1].type_at + 2, &g);
  EXPECT_NE(s.message().find("tensor 'b' type"), std::string::npos) << s.message();
}

TEST(GgufTest, RejectsBadStringsAndArrays) {
  GgufLayout l;
  const std::vector<uint8_t> bytes = BaseWriter().Serialize(&l);
  std::vector<uint8_t> bad = bytes;
  Patch<uint64_t>(&bad, l.kvs[0].key_at, 1ull << 40);
  EXPECT_NE(ParseError(bad).find("metadata entry 0 key length 1099511627776 exceeds the limit"),
            std::string::npos);
  bad = bytes;
  bad[l.kvs[0].key_at + 8 + 3] = 0x01;
  EXPECT_NE(ParseError(bad).find("metadata entry 0: key byte 3 is 0x1, not printable ASCII"),
            std::string::npos);
  // The architecture string value (key 0) runs past the end of the file.
  bad = bytes;
  Patch<uint64_t>(&bad, l.kvs[0].value_at, bytes.size());
  std::string msg = ParseError(bad);
  EXPECT_NE(msg.find("metadata 'general.architecture' string length"), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
  // The int32 array "test.arr" (key 2) claims 2^60 elements.
  bad = bytes;
  Patch<uint64_t>(&bad, l.kvs[2].value_at + 4, 1ull << 60);
  msg = ParseError(bad);
  EXPECT_NE(msg.find("metadata 'test.arr': array length 1152921504606846976 of int32 cannot fit"),
            std::string::npos)
      << msg;
  bad = bytes;
  Patch<uint32_t>(&bad, l.kvs[2].value_at, 9);
  EXPECT_NE(ParseError(bad).find("'test.arr': arrays of arrays"), std::string::npos);
  bad = bytes;
  Patch<uint32_t>(&bad, l.kvs[2].value_at, 77);
  EXPECT_NE(ParseError(bad).find("'test.arr': unknown array element type 77"), std::string::npos);
  bad = bytes;
  Patch<uint32_t>(&bad, l.kvs[1].type_at, 13);
  EXPECT_NE(ParseError(bad).find("'test.flag': unknown value type 13"), std::string::npos);
  bad = bytes;
  bad[l.kvs[1].value_at] = 2;
  EXPECT_NE(ParseError(bad).find("'test.flag': bool value 2"), std::string::npos);
  bad = bytes;
  Patch<uint64_t>(&bad, l.kv_count_at, 1ull << 50);
  EXPECT_NE(ParseError(bad).find("metadata_kv_count 1125899906842624 cannot fit"),
            std::string::npos);
  bad = bytes;
  Patch<uint64_t>(&bad, l.tensor_count_at, 1ull << 50);
  EXPECT_NE(ParseError(bad).find("tensor_count 1125899906842624 cannot fit"), std::string::npos);
}

TEST(GgufTest, RejectsBadTensorInfos) {
  GgufLayout l;
  const std::vector<uint8_t> bytes = BaseWriter().Serialize(&l);
  const GgufLayout::TensorInfo& b = l.tensors[1];  // "b": Q8_0 [32, 3]
  std::vector<uint8_t> bad = bytes;
  Patch<uint64_t>(&bad, b.offset_at, 1ull << 20);
  std::string msg = ParseError(bad);
  EXPECT_NE(msg.find("tensor 'b': data at offset 1048576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runs past the end of the data section"), std::string::npos) << msg;

  bad = bytes;
  uint64_t off;
  std::memcpy(&off, bytes.data() + b.offset_at, 8);
  Patch<uint64_t>(&bad, b.offset_at, off + 4);
  EXPECT_NE(ParseError(bad).find("tensor 'b': offset " + std::to_string(off + 4) +
                                 " is not a multiple of the alignment 32"),
            std::string::npos);

  bad = bytes;
  Patch<uint64_t>(&bad, b.offset_at, 0);  // same offset as "a"
  msg = ParseError(bad);
  EXPECT_NE(msg.find("overlaps tensor"), std::string::npos) << msg;

  bad = bytes;
  Patch<uint32_t>(&bad, b.type_at, 99);
  msg = ParseError(bad);
  EXPECT_NE(msg.find("tensor 'b': unknown tensor type 99"), std::string::npos) << msg;

  bad = bytes;
  Patch<uint64_t>(&bad, b.dims_at + 8, 0);
  EXPECT_NE(ParseError(bad).find("tensor 'b': ne[1] = 0 is outside 1.."), std::string::npos);

  bad = bytes;
  Patch<uint64_t>(&bad, b.dims_at, 1ull << 40);
  Patch<uint64_t>(&bad, b.dims_at + 8, 1ull << 40);
  EXPECT_NE(ParseError(bad).find("tensor 'b': element count overflows at ne[1]"),
            std::string::npos);

  bad = bytes;
  Patch<uint64_t>(&bad, b.dims_at, 48);  // 1.5 Q8_0 blocks
  EXPECT_NE(ParseError(bad).find("ne[0] = 48 is not a whole number of Q8_0 blocks"),
            std::string::npos);

  for (uint32_t n : {0u, 5u}) {
    bad = bytes;
    Patch<uint32_t>(&bad, b.n_dims_at, n);
    EXPECT_NE(ParseError(bad).find("tensor 'b': n_dims " + std::to_string(n) + " is outside 1..4"),
              std::string::npos);
  }
}

TEST(GgufTest, RejectsDuplicatesLongNamesAndBadAlignment) {
  GgufWriter dup_key = BaseWriter();
  dup_key.AddBool("test.flag", false);
  EXPECT_NE(ParseError(dup_key.Serialize()).find("metadata 'test.flag' appears twice"),
            std::string::npos);

  GgufWriter dup_tensor = BaseWriter();
  ASSERT_TRUE(dup_tensor.AddTensor("a", DType::kF32, {4}, RandomBytes(16, 1)).ok());
  EXPECT_NE(ParseError(dup_tensor.Serialize()).find("tensor 'a' appears twice"), std::string::npos);

  GgufWriter long_name = BaseWriter();
  ASSERT_TRUE(long_name.AddTensor(std::string(65, 'x'), DType::kF32, {4}, RandomBytes(16, 1)).ok());
  EXPECT_NE(ParseError(long_name.Serialize()).find("name length 65 exceeds the limit 64"),
            std::string::npos);

  GgufLayout l;
  std::vector<uint8_t> bytes = BaseWriter(64).Serialize(&l);
  Patch<uint32_t>(&bytes, l.kvs[0].value_at, 48);  // general.alignment is the first entry
  EXPECT_NE(ParseError(bytes).find("'general.alignment' value 48 is not a power of two"),
            std::string::npos);
}

TEST(GgufTest, OpenNamesTheFile) {
  std::unique_ptr<GgufFile> f;
  Status s = GgufFile::Open("/nonexistent/dir/model.gguf", &f);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/dir/model.gguf"), std::string::npos);
  TempFile empty("empty.gguf");
  FILE* fp = std::fopen(empty.path().c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  std::fclose(fp);
  s = GgufFile::Open(empty.path(), &f);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(empty.path() + ": empty file"), std::string::npos) << s.message();
}

TEST(GgufTest, WriterRejectsWrongTensorSizes) {
  GgufWriter w;
  Status s = w.AddTensor("t", DType::kQ4_0, {32, 2}, RandomBytes(10, 1));
  EXPECT_NE(s.message().find("10 bytes given, 36 expected"), std::string::npos) << s.message();
  s = w.AddTensor("t", DType::kQ4_0, {20}, RandomBytes(18, 1));
  EXPECT_NE(s.message().find("not a multiple of the Q4_0 block"), std::string::npos);
  s = w.AddTensor("t", DType::kF32, {}, {});
  EXPECT_FALSE(s.ok());
}

TEST(GgufTest, GeneratedTensorsAreWrittenAsCopiedOnesAndAFailureLeavesNoFile) {
  const std::vector<uint8_t> a = RandomBytes(Bytes(DType::kF32, {8, 2}), 1);
  const std::vector<uint8_t> b = RandomBytes(Bytes(DType::kQ8_0, {32, 3}), 2);
  GgufWriter copied = BaseWriter(64);
  GgufWriter made(64);
  made.AddString("general.architecture", "llama");
  made.AddBool("test.flag", true);
  const int32_t arr[] = {1, -2, 3};
  made.AddI32Array("test.arr", arr);
  int calls = 0;
  auto from = [&calls](const std::vector<uint8_t>& src) {
    return [&calls, &src](std::span<uint8_t> out) {
      ++calls;
      if (out.size() != src.size()) return Status::Internal("size");
      std::copy(src.begin(), src.end(), out.begin());
      return Status::OK();
    };
  };
  STRATA_ASSERT_OK(made.AddTensorGenerated("a", DType::kF32, {8, 2}, from(a)));
  STRATA_ASSERT_OK(made.AddTensorGenerated("b", DType::kQ8_0, {32, 3}, from(b)));
  EXPECT_FALSE(made.AddTensorGenerated("c", DType::kQ4_0, {20}, from(a)).ok());
  EXPECT_FALSE(made.AddTensorGenerated("c", DType::kF32, {8}, nullptr).ok());
  GgufWriter base64 = BaseWriter(64);
  const std::vector<uint8_t> want = base64.Serialize();
  EXPECT_EQ(made.Serialize(), want);
  EXPECT_EQ(calls, 2);
  TempFile file("generated.gguf");
  STRATA_ASSERT_OK(made.WriteFile(file.path()));
  EXPECT_EQ(calls, 4);
  std::unique_ptr<GgufFile> f;
  STRATA_ASSERT_OK(GgufFile::Open(file.path(), &f));
  ASSERT_NE(f->FindTensor("b"), nullptr);
  EXPECT_EQ(std::memcmp(f->FindTensor("b")->data, b.data(), b.size()), 0);

  // A generator's error is WriteFile's; neither the file nor its temporary is left.
  GgufWriter failing;
  STRATA_ASSERT_OK(failing.AddTensorGenerated(
      "x", DType::kF32, {8}, [](std::span<uint8_t>) { return Status::IOError("no entropy"); }));
  TempFile bad("failing.gguf");
  const Status st = failing.WriteFile(bad.path());
  EXPECT_NE(st.message().find("no entropy"), std::string::npos) << st.message();
  struct stat sb;
  EXPECT_NE(stat(bad.path().c_str(), &sb), 0);
  EXPECT_NE(stat((bad.path() + ".tmp").c_str(), &sb), 0);
  EXPECT_TRUE(failing.Serialize().empty());
}

// Random single-byte corruptions must never crash or hang; the fuzzer goes further.
TEST(GgufTest, RandomCorruptionsFailCleanly) {
  const std::vector<uint8_t> bytes = BaseWriter().Serialize();
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint8_t> bad = bytes;
    const size_t n = 1 + rng() % 4;
    for (size_t i = 0; i < n; ++i) bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
    std::unique_ptr<GgufFile> f;
    Status s = Parse(bad, bad.size(), &f);
    if (!s.ok()) {
      EXPECT_FALSE(s.message().empty());
    }
  }
}

TEST(GgufFileTest, OnlyARegularFileIsAModelAndAFifoIsNotWaitedOn) {
  const std::string fifo = ::testing::TempDir() + "strata_model_fifo_" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::unique_ptr<GgufFile> f;
  Status s = GgufFile::Open(fifo, &f);
  unlink(fifo.c_str());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a FIFO, not a regular file"), std::string::npos) << s.ToString();
  s = GgufFile::Open("/dev/zero", &f);
  EXPECT_NE(s.message().find("character device"), std::string::npos) << s.ToString();
  s = GgufFile::Open(::testing::TempDir(), &f);
  EXPECT_NE(s.message().find("a directory"), std::string::npos) << s.ToString();
  s = GgufFile::Open("", &f);
  EXPECT_NE(s.message().find("empty"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace strata
