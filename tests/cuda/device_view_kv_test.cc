// DeviceViewKv on a host-backed stand-in for the GPU (runs on every machine): the views it
// hands a GPU hold exactly the host policy's keys and values, position for position, for
// the disk policy's prefill (exact staging) and decode (slots, sink, recent and rolling
// groups) views, with F16 and Q8_0 records; its staging is reported; a policy that already
// lives in GPU memory is refused.
#include <gtest/gtest.h>

#include <random>

#include "common/thread_pool.h"
#include "runtime/kv/device_view_kv.h"
#include "runtime/kv/memory_kv.h"
#include "runtime/model/synthetic_model.h"
#include "tests/kv/disk_kv_test_util.h"
#include "tests/testing/host_backed_device.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

using testing::HostBackedDevice;

// Token t of a span as F16 K and V rows of `row` values (the host's F16 or Q8_0 rows).
void SpanRow(const kernels::KvSpan& sp, int32_t t, int32_t row, std::vector<uint16_t>* k,
             std::vector<uint16_t>* v) {
  k->resize(size_t(row));
  v->resize(size_t(row));
  if (sp.type == kernels::KvType::kF16) {
    std::memcpy(k->data(), sp.k + int64_t(t) * sp.stride, size_t(row) * 2);
    std::memcpy(v->data(), sp.v + int64_t(t) * sp.stride, size_t(row) * 2);
    return;
  }
  std::vector<float> f(static_cast<size_t>(row));
  kernels::DequantizeRow(kernels::DType::kQ8_0, sp.qk + int64_t(t) * sp.stride, f.data(), row);
  kernels::F32ToF16Row(f.data(), k->data(), row);
  kernels::DequantizeRow(kernels::DType::kQ8_0, sp.qv + int64_t(t) * sp.stride, f.data(), row);
  kernels::F32ToF16Row(f.data(), v->data(), row);
}

// Every key and value of two views, flattened in span order with its position.
struct Flat {
  std::vector<int32_t> pos;
  std::vector<uint16_t> k, v;
};
Flat Flatten(std::span<const kernels::KvSpan> view, int32_t row) {
  Flat f;
  std::vector<uint16_t> k, v;
  for (const kernels::KvSpan& sp : view)
    for (int32_t t = 0; t < sp.n_tokens; ++t) {
      SpanRow(sp, t, row, &k, &v);
      f.pos.push_back(sp.pos0 + t);
      f.k.insert(f.k.end(), k.begin(), k.end());
      f.v.insert(f.v.end(), v.begin(), v.end());
    }
  return f;
}

class DeviceViewKvTest : public ::testing::TestWithParam<KvRecordType> {};

TEST_P(DeviceViewKvTest, ViewsOnTheDeviceHoldTheHostPolicysKeysAndValues) {
  testing::KvTempDir dir;
  SyntheticModelSpec spec;
  spec.n_layer = 3;
  spec.n_embd = 128;
  spec.n_head = 4;
  spec.n_head_kv = 2;  // head dimension 32: whole Q8_0 blocks
  spec.n_ff = 256;
  std::unique_ptr<Model> model;
  STRATA_ASSERT_OK(testing::LoadSyntheticModel(spec, dir.path(), "m", &model));
  const std::string adapters = dir.path() + "/m.adapters";
  STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*model, {1, 2, 4, 8}, adapters));
  constexpr int32_t kCtx = 512;
  EngineOptions o = testing::DiskEngineOptions(dir.path(), adapters, kCtx);
  o.kv.disk.record_type = GetParam();
  // Groups of an odd size: a Q8_0 record span of 5 rows of 68 bytes ends 8 bytes off a
  // 16-byte boundary, so the F16 span of a prefill's fresh keys that follows must be placed.
  o.kv.disk.group_size = 5;
  // A budget of a fifth of the cache, so decode views are sparse (slots, sink, recent and
  // rolling groups).
  o.kv.disk.budget_bytes = kCtx * 3 * 2 * 64 * 2 / 5;
  ThreadPool pool(1);
  std::unique_ptr<KvPolicy> host;
  STRATA_ASSERT_OK(CreateKvPolicy(*model, o.kv, kCtx, 1, &pool, &host));
  auto dev = std::make_shared<HostBackedDevice>();
  std::unique_ptr<DeviceViewKv> kv;
  STRATA_ASSERT_OK(DeviceViewKv::Create(std::move(host), dev, &kv));
  EXPECT_TRUE(kv->device_memory());
  EXPECT_TRUE(kv->host_inputs());
  EXPECT_STREQ(kv->name(), "disk");

  const HParams& hp = model->hparams();
  const int32_t row = kv->shape().row();
  SeqId seq;
  STRATA_ASSERT_OK(kv->AddSequence(&seq));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto pass = [&](int32_t n_new, bool* sparse) {
    const int32_t pos0 = kv->Length(seq);
    const BatchSeq b{seq, pos0, n_new};
    STRATA_ASSERT_OK(kv->BeginBatch(std::span<const BatchSeq>(&b, 1)));
    std::vector<float> x(size_t(n_new) * hp.n_embd), k(size_t(n_new) * row), v(size_t(n_new) * row);
    for (float& f : x) f = nd(rng);
    STRATA_ASSERT_OK(kv->Prepare(0, x.data(), hp.n_embd));
    for (int32_t l = 0; l < hp.n_layer; ++l) {
      if (l + 1 < hp.n_layer) STRATA_ASSERT_OK(kv->Prepare(l + 1, x.data(), hp.n_embd));
      for (float& f : k) f = nd(rng);
      for (float& f : v) f = nd(rng);
      STRATA_ASSERT_OK(kv->Append(l, seq, k.data(), v.data()));
      std::span<const kernels::KvSpan> dv, hv;
      STRATA_ASSERT_OK(kv->View(l, seq, &dv));
      const Flat got = Flatten(dv, row);
      // Attention reads rows in 16-byte pieces: every span starts on 16 bytes, whatever the
      // Q8_0 rows gathered before it (68 bytes a row here) end on.
      for (const kernels::KvSpan& sp : dv) {
        EXPECT_EQ(sp.type, kernels::KvType::kF16);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(sp.k) % 16, 0u) << "layer " << l << " at " << pos0;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(sp.v) % 16, 0u) << "layer " << l << " at " << pos0;
      }
      STRATA_ASSERT_OK(kv->host().View(l, seq, &hv));
      Flat want = Flatten(hv, row);
      // The host's view may come in windows: the device view holds them all, in order.
      KvWindowedView* windows = kv->host().windowed_view();
      while (windows && windows->MoreWindows(l, seq) > 0) {
        STRATA_ASSERT_OK(windows->NextWindow(l, seq, &hv));
        const Flat more = Flatten(hv, row);
        want.pos.insert(want.pos.end(), more.pos.begin(), more.pos.end());
        want.k.insert(want.k.end(), more.k.begin(), more.k.end());
        want.v.insert(want.v.end(), more.v.begin(), more.v.end());
      }
      ASSERT_EQ(got.pos, want.pos) << "layer " << l << " at " << pos0;
      ASSERT_EQ(got.k, want.k) << "layer " << l << " at " << pos0;
      ASSERT_EQ(got.v, want.v) << "layer " << l << " at " << pos0;
      if (int32_t(want.pos.size()) < pos0 + n_new) *sparse = true;
      // The new tokens are in the view.
      EXPECT_NE(std::find(got.pos.begin(), got.pos.end(), pos0 + n_new - 1), got.pos.end());
    }
    STRATA_ASSERT_OK(kv->EndBatch());
  };
  bool sparse = false;
  // Prefill in passes the policy can stage within its budget (as the engine does); their
  // views come in windows once the earlier records outgrow the pool.
  const int32_t most = kv->max_pass_tokens();
  ASSERT_GT(most, 1);
  for (int32_t done = 0; done < 300; done += std::min(most, 300 - done))
    pass(std::min(most, 300 - done), &sparse);
  EXPECT_FALSE(sparse);  // prefill attends exactly
  for (int i = 0; i < 12; ++i) pass(1, &sparse);
  EXPECT_TRUE(sparse);  // decode views left groups out
  EXPECT_EQ(kv->Length(seq), 312);
  EXPECT_GT(kv->view_bytes(), 0u);
  EXPECT_GT(kv->counters().staging_bytes, 0u);
  EXPECT_GT(kv->counters().bytes_read, 0u);
}

INSTANTIATE_TEST_SUITE_P(Records, DeviceViewKvTest,
                         ::testing::Values(KvRecordType::kF16, KvRecordType::kQ8_0),
                         [](const ::testing::TestParamInfo<KvRecordType>& i) {
                           return std::string(KvRecordTypeName(i.param));
                         });

TEST(DeviceViewKvErrors, APolicyAlreadyInGpuMemoryIsRefused) {
  auto dev = std::make_shared<HostBackedDevice>();
  testing::FakeDeviceTier tier;
  std::unique_ptr<MemoryKv> mkv;
  STRATA_ASSERT_OK(MemoryKv::Create({2, 2, 16, 64}, 1, &mkv, &tier));
  ASSERT_TRUE(mkv->device_memory());
  std::unique_ptr<DeviceViewKv> kv;
  Status s = DeviceViewKv::Create(std::move(mkv), dev, &kv);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("already keeps its KV in GPU memory"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace strata
