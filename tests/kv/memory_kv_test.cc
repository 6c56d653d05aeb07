#include "runtime/kv/memory_kv.h"

#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

KvShape Shape() { return KvShape{2, 2, 4, 16}; }  // 2 layers, 2 KV heads, head dim 4

std::vector<float> Rows(int n, float base) {
  std::vector<float> v(size_t(n) * 8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + float(i);
  return v;
}

Status AppendAll(MemoryKv& kv, SeqId seq, int32_t pos0, int n, float base) {
  BatchSeq b{seq, pos0, n};
  STRATA_RETURN_IF_ERROR(kv.BeginBatch({&b, 1}));
  for (int l = 0; l < 2; ++l) {
    auto k = Rows(n, base + float(100 * l)), v = Rows(n, base + float(100 * l + 50));
    STRATA_RETURN_IF_ERROR(kv.Append(l, seq, k.data(), v.data()));
  }
  return kv.EndBatch();
}

TEST(MemoryKvTest, AppendsAndViewsOneSpanPerLayer) {
  std::unique_ptr<MemoryKv> kv;
  ASSERT_TRUE(MemoryKv::Create(Shape(), 2, &kv).ok());
  SeqId s;
  ASSERT_TRUE(kv->AddSequence(&s).ok());
  ASSERT_TRUE(AppendAll(*kv, s, 0, 3, 1).ok());
  ASSERT_TRUE(AppendAll(*kv, s, 3, 2, 10).ok());
  EXPECT_EQ(kv->Length(s), 5);
  std::span<const kernels::KvSpan> view;
  ASSERT_TRUE(kv->View(1, s, &view).ok());
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(view[0].n_tokens, 5);
  EXPECT_EQ(view[0].pos0, 0);
  EXPECT_EQ(view[0].stride, 8);
  // Token 3 of layer 1 is the first row of the second append: base 10 + 100.
  EXPECT_EQ(kernels::F16ToF32(view[0].k[3 * 8]), 110.f);
  EXPECT_EQ(kernels::F16ToF32(view[0].v[3 * 8 + 1]), 161.f);
  EXPECT_EQ(kv->counters().resident_bytes, 5u * 8 * 2 * 2 * 2);
}

TEST(MemoryKvTest, ContextAndPositionErrors) {
  std::unique_ptr<MemoryKv> kv;
  ASSERT_TRUE(MemoryKv::Create(Shape(), 1, &kv).ok());
  SeqId s, t;
  ASSERT_TRUE(kv->AddSequence(&s).ok());
  EXPECT_EQ(kv->AddSequence(&t).code(), Status::Code::kResourceExhausted);
  BatchSeq too_long{s, 0, 17};
  Status st = kv->BeginBatch({&too_long, 1});
  EXPECT_EQ(st.code(), Status::Code::kOutOfRange);
  EXPECT_NE(st.message().find("context length 16"), std::string::npos) << st.message();
  BatchSeq gap{s, 2, 1};
  EXPECT_EQ(kv->BeginBatch({&gap, 1}).code(), Status::Code::kInvalidArgument);
  BatchSeq unknown{99, 0, 1};
  EXPECT_EQ(kv->BeginBatch({&unknown, 1}).code(), Status::Code::kNotFound);
}

TEST(MemoryKvTest, AbortDropsTheBatch) {
  std::unique_ptr<MemoryKv> kv;
  ASSERT_TRUE(MemoryKv::Create(Shape(), 1, &kv).ok());
  SeqId s;
  ASSERT_TRUE(kv->AddSequence(&s).ok());
  BatchSeq b{s, 0, 4};
  ASSERT_TRUE(kv->BeginBatch({&b, 1}).ok());
  kv->AbortBatch();
  EXPECT_EQ(kv->Length(s), 0);
  ASSERT_TRUE(AppendAll(*kv, s, 0, 2, 0).ok());
  EXPECT_EQ(kv->Length(s), 2);
}

TEST(MemoryKvTest, ForkCopiesAndDiverges) {
  std::unique_ptr<MemoryKv> kv;
  ASSERT_TRUE(MemoryKv::Create(Shape(), 3, &kv).ok());
  SeqId a, b;
  ASSERT_TRUE(kv->AddSequence(&a).ok());
  ASSERT_TRUE(AppendAll(*kv, a, 0, 3, 1).ok());
  ASSERT_TRUE(kv->ForkSequence(a, &b).ok());
  EXPECT_EQ(kv->Length(b), 3);
  ASSERT_TRUE(AppendAll(*kv, b, 3, 1, 500).ok());
  EXPECT_EQ(kv->Length(a), 3);
  std::span<const kernels::KvSpan> va, vb;
  ASSERT_TRUE(kv->View(0, a, &va).ok());
  ASSERT_TRUE(kv->View(0, b, &vb).ok());
  for (int i = 0; i < 3 * 8; ++i) EXPECT_EQ(va[0].k[i], vb[0].k[i]);
  EXPECT_EQ(kernels::F16ToF32(vb[0].k[3 * 8]), 500.f);
  ASSERT_TRUE(kv->RemoveSequence(a).ok());
  EXPECT_EQ(kv->RemoveSequence(a).code(), Status::Code::kNotFound);
}

}  // namespace
}  // namespace strata
