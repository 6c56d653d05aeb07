// The CUDA backend end to end: the forward pass on the GPU against the CPU's, step-wise beam
// search with KV in GPU memory and pinned host RAM as the slow tier (identical ranked results
// under every schedule and budget, the budget never exceeded), and the errors a build or a
// machine without a GPU gives. The GPU tests skip, saying so, where this process sees no
// CUDA device (CI has none); the error tests run everywhere.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "platforms/cuda_device.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/tree/cuda_host_tier.h"
#include "runtime/kv/tree/prefix_tree_kv.h"
#include "runtime/model/synthetic_model.h"
#include "runtime/search/beam_search.h"
#include "tests/kv/disk_kv_test_util.h"
#include "tests/testing/host_backed_device.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

#define SKIP_WITHOUT_GPU()                                        \
  do {                                                            \
    if (CudaDevice::Count() == 0) {                               \
      GTEST_SKIP() << "no CUDA device visible: GPU test not run"; \
    }                                                             \
  } while (0)

class CudaBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SyntheticModelSpec spec;
    spec.n_layer = 4;
    spec.n_embd = 128;
    spec.n_head = 4;
    spec.n_head_kv = 2;  // GQA, head_dim 32
    spec.n_ff = 256;
    spec.n_ctx_train = 512;
    path_ = new std::string((std::filesystem::temp_directory_path() /
                             ("strata_cuda_" + std::to_string(getpid()) + ".gguf"))
                                .string());
    STRATA_ASSERT_OK(WriteSyntheticModel(spec, *path_));
    model_ = new std::unique_ptr<Model>();
    STRATA_ASSERT_OK(Model::Load(*path_, model_));
  }
  static void TearDownTestSuite() {
    delete model_;
    std::filesystem::remove(*path_);
    delete path_;
  }
  static const Model& model() { return **model_; }
  std::vector<int32_t> Prompt(size_t n) {
    std::vector<int32_t> ids;
    EXPECT_TRUE(model().tokenizer().Encode(SyntheticTrainingText(), true, false, &ids).ok());
    ids.resize(std::min(ids.size(), n));
    return ids;
  }
  static std::string* path_;
  static std::unique_ptr<Model>* model_;
};
std::string* CudaBackendTest::path_ = nullptr;
std::unique_ptr<Model>* CudaBackendTest::model_ = nullptr;

TEST_F(CudaBackendTest, AskingForAGpuThatIsNotThereIsAClearError) {
  std::shared_ptr<CudaDevice> d;
  const int n = CudaDevice::Count();
  Status s = CudaDevice::Open(n, &d);  // one past the last device, or the only one of none
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(d, nullptr);
  if (n == 0) {
    EXPECT_TRUE(s.message().find("no CUDA") != std::string::npos) << s.ToString();
  } else {
    EXPECT_TRUE(s.message().find("does not exist") != std::string::npos) << s.ToString();
  }
  // Beam search on that device fails with the same reason and leaves nothing behind.
  BeamSearchParams p;
  p.n_beams = 4;
  p.max_tokens = 8;
  p.cuda_device = n;
  std::vector<BeamResult> res;
  BeamSearchStats st;
  Status bs = RunBeamSearch(model(), Prompt(20), p, nullptr, &res, &st);
  ASSERT_FALSE(bs.ok());
  EXPECT_TRUE(bs.message().find("cuda") != std::string::npos) << bs.ToString();
  EXPECT_TRUE(res.empty());
}

TEST_F(CudaBackendTest, AnEngineOnAMissingGpuIsAClearError) {
  EngineOptions eo;
  eo.n_threads = 1;
  eo.cuda_device = CudaDevice::Count();  // none on a machine without a GPU, one past the last
  std::unique_ptr<Engine> e;
  Status s = Engine::Create(model(), eo, &e);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(e, nullptr);
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.ToString();
}

TEST_F(CudaBackendTest, GpuMemoryNeedsASlowTierThatMovesIt) {
  const HParams& hp = model().hparams();
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, 256};
  testing::FakeDeviceTier mem;
  PrefixTreeKvOptions o;
  o.max_blocks = 64;
  o.fast_budget_bytes = 64 * PrefixTreeKv::BlockBytes(shape, o.block_tokens, 4096);
  o.memory = &mem;
  std::unique_ptr<RamSlowTier> ram;
  STRATA_ASSERT_OK(RamSlowTier::Create(o.fast_budget_bytes, &ram, 4096));
  std::unique_ptr<PrefixTreeKv> kv;
  Status s = PrefixTreeKv::Create(shape, o, std::move(ram), &kv);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.message().find("cannot move blocks to and from fake device") != std::string::npos)
      << s.ToString();
}

// Teacher-forced logits of `ids` from an engine on the GPU (prefix-tree KV in GPU memory).
Status GpuLogits(const Model& model, const std::vector<int32_t>& ids, std::vector<float>* logits) {
  std::shared_ptr<CudaDevice> dev;
  STRATA_RETURN_IF_ERROR(CudaDevice::Open(0, &dev));
  const HParams& hp = model.hparams();
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, int32_t(ids.size()) + 1};
  PrefixTreeKvOptions o;
  o.max_blocks = int64_t(ids.size()) / o.block_tokens + 2;
  o.fast_budget_bytes = uint64_t(o.max_blocks + 2) * PrefixTreeKv::BlockBytes(shape, 16, 4096);
  o.memory = dev->memory();
  std::unique_ptr<SlowTier> slow;
  STRATA_RETURN_IF_ERROR(OpenCudaHostTier(
      dev, uint64_t(o.max_blocks) * PrefixTreeKv::BlockBytes(shape, 16, 4096), 4096, &slow));
  std::unique_ptr<PrefixTreeKv> kv;
  STRATA_RETURN_IF_ERROR(PrefixTreeKv::Create(shape, o, std::move(slow), &kv));
  EngineOptions eo;
  eo.n_threads = 1;
  eo.cuda = dev;
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, std::move(kv), &e));
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  return e->Prefill(seq, ids, logits, /*all_logits=*/true);
}

// The same from an engine with the default (memory) policy on the GPU.
Status GpuMemoryKvLogits(const Model& model, const std::vector<int32_t>& ids,
                         std::vector<float>* logits) {
  EngineOptions eo;
  eo.n_threads = 1;
  eo.n_ctx = int32_t(ids.size()) + 1;
  eo.cuda_device = 0;
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, &e));
  if (!e->kv().device_memory()) return Status::Internal("the engine's KV is not on the GPU");
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  return e->Prefill(seq, ids, logits, /*all_logits=*/true);
}

Status CpuLogits(const Model& model, const std::vector<int32_t>& ids, std::vector<float>* logits) {
  EngineOptions eo;
  eo.n_threads = 1;
  eo.n_ctx = int32_t(ids.size()) + 1;
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, &e));
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  return e->Prefill(seq, ids, logits, /*all_logits=*/true);
}

// Relative RMS difference and top-1 agreement of two [rows][n_vocab] logit sets; `clear`
// counts only the rows where b's top two are at least `margin` apart (a near-tie may flip
// under any change of rounding).
struct Agreement {
  double rel_rms = 0, all = 0, clear = 0;
  int64_t clear_rows = 0;
};
Agreement Compare(const std::vector<float>& a, const std::vector<float>& b, int32_t n_vocab,
                  float margin) {
  Agreement r;
  double num = 0, den = 0;
  int64_t same = 0, clear_same = 0;
  const int64_t rows = int64_t(a.size()) / n_vocab;
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = a.data() + i * n_vocab;
    const float* y = b.data() + i * n_vocab;
    for (int32_t j = 0; j < n_vocab; ++j) {
      num += double(x[j] - y[j]) * (x[j] - y[j]);
      den += double(y[j]) * y[j];
    }
    const int64_t ax = std::max_element(x, x + n_vocab) - x;
    const int64_t by = std::max_element(y, y + n_vocab) - y;
    float second = -INFINITY;
    for (int32_t j = 0; j < n_vocab; ++j)
      if (j != by) second = std::max(second, y[j]);
    same += ax == by;
    if (y[by] - second >= margin) {
      ++r.clear_rows;
      clear_same += ax == by;
    }
  }
  r.rel_rms = std::sqrt(num / std::max(den, 1e-30));
  r.all = double(same) / double(rows);
  r.clear = r.clear_rows ? double(clear_same) / double(r.clear_rows) : 1.0;
  return r;
}

TEST_F(CudaBackendTest, GpuLogitsMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const auto ids = Prompt(70);  // several blocks, the last one partial
  std::vector<float> gpu, cpu;
  STRATA_ASSERT_OK(GpuLogits(model(), ids, &gpu));
  STRATA_ASSERT_OK(CpuLogits(model(), ids, &cpu));
  ASSERT_EQ(gpu.size(), cpu.size());
  const Agreement a = Compare(gpu, cpu, model().hparams().n_vocab, 0.5f);
  // The CPU quantizes activations to 8 bits for quantized weights; the GPU keeps them F32.
  EXPECT_LT(a.rel_rms, 0.02);
  EXPECT_GE(a.all, 0.9);
  // The memory policy in GPU memory gives the same bits as the prefix tree there: the same
  // keys in the same order.
  std::vector<float> mem;
  STRATA_ASSERT_OK(GpuMemoryKvLogits(model(), ids, &mem));
  EXPECT_EQ(mem, gpu);
}

TEST_F(CudaBackendTest, BeamSearchOnTheGpuIsIdenticalUnderEveryScheduleAndBudget) {
  SKIP_WITHOUT_GPU();
  const auto prompt = Prompt(37);
  BeamSearchParams p;
  p.n_beams = 8;
  p.step_tokens = 8;
  p.max_tokens = 64;
  p.sampling.temperature = 0.9f;
  p.sampling.seed = 1234;
  p.n_threads = 1;
  p.cuda_device = 0;
  std::vector<BeamResult> ref;
  BeamSearchStats st;
  STRATA_ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &ref, &st));
  ASSERT_FALSE(ref.empty());
  EXPECT_TRUE(st.slow_tier.find("pinned host RAM via cuda:0") != std::string::npos) << st.slow_tier;
  // Both slow tiers of a GPU: pinned host RAM, and the block store staged through it.
  for (bool on_disk : {false, true})
    for (BeamSchedule s : {BeamSchedule::kTokenwise, BeamSchedule::kGrouped, BeamSchedule::kPrefix,
                           BeamSchedule::kBalanced}) {
      p.schedule = s;
      p.gpu_slow_on_disk = on_disk;
      p.fast_budget_bytes =
          std::max<uint64_t>(st.peak_tree_bytes * 2 / 5,
                             MinFastBudgetBytes(p, model().hparams(), int32_t(prompt.size())));
      ASSERT_LT(p.fast_budget_bytes, st.peak_tree_bytes);
      std::vector<BeamResult> got;
      BeamSearchStats gs;
      STRATA_ASSERT_OK(RunBeamSearch(model(), prompt, p, nullptr, &got, &gs));
      const std::string what = std::string(BeamScheduleName(s)) + (on_disk ? " (disk)" : "");
      EXPECT_EQ(gs.slow_tier.find("staged through") != std::string::npos, on_disk) << gs.slow_tier;
      ASSERT_EQ(got.size(), ref.size()) << what;
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(got[i].beam_id, ref[i].beam_id) << what << " rank " << i;
        EXPECT_EQ(got[i].tokens, ref[i].tokens) << what << " rank " << i;
        EXPECT_EQ(got[i].score, ref[i].score) << what << " rank " << i;
      }
      EXPECT_LE(gs.kv.peak_fast_bytes, p.fast_budget_bytes) << what;
      EXPECT_GT(gs.kv.bytes_read, 0u) << what;
      EXPECT_GT(gs.kv.bytes_written, 0u) << what;
      EXPECT_EQ(gs.kv.live_blocks, 0u) << what;
    }
}

// ---- Quantized weights, captured decode, mapped weights, the disk policy on the GPU -----

// A synthetic model whose matrices are all of type t, sized for the K formats (256 wide).
SyntheticModelSpec QuantSpec(kernels::DType t) {
  SyntheticModelSpec s;
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_ctx_train = 1024;
  s.weight_type = t;
  s.output_type = t;
  return s;
}

Status GpuEngine(const Model& m, int32_t n_ctx, int32_t max_seqs, const CudaForwardOptions& g,
                 std::unique_ptr<Engine>* e) {
  EngineOptions eo;
  eo.n_threads = 1;
  eo.n_ctx = n_ctx;
  eo.max_sequences = max_seqs;
  eo.cuda_device = 0;
  eo.gpu = g;
  return Engine::Create(m, eo, e);
}

TEST(CudaQuantModelTest, WeightsStayInTheirTypeAndTheGpuMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  testing::KvTempDir dir;
  for (kernels::DType t : {kernels::DType::kQ4_0, kernels::DType::kQ4_1, kernels::DType::kQ8_0,
                           kernels::DType::kQ4_K, kernels::DType::kQ6_K}) {
    const std::string name = kernels::TypeName(t);
    std::unique_ptr<Model> m;
    STRATA_ASSERT_OK(testing::LoadSyntheticModel(QuantSpec(t), dir.path(), name, &m));
    const std::vector<int32_t> ids = testing::TestTokens(70, m->hparams().n_vocab, 3);
    std::vector<float> gpu, cpu;
    // 70 tokens in one pass: the cuBLAS path.
    STRATA_ASSERT_OK(GpuMemoryKvLogits(*m, ids, &gpu));
    STRATA_ASSERT_OK(CpuLogits(*m, ids, &cpu));
    const Agreement a = Compare(gpu, cpu, m->hparams().n_vocab, 0.5f);
    std::printf("%s prefill: relative RMS %.4f, top-1 %.1f%%\n", name.c_str(), a.rel_rms,
                a.all * 100);
    // The CPU quantizes activations per 32 (Q8_0, Q8_1) or 256 values (Q8_K), the GPU per 32.
    EXPECT_LT(a.rel_rms, 0.05) << name;
    EXPECT_GE(a.clear, 0.95) << name;
    // Decode-sized passes: the quantized GEMVs (and a captured graph).
    std::unique_ptr<Engine> ge, ce;
    STRATA_ASSERT_OK(GpuEngine(*m, 128, 1, {}, &ge));
    EngineOptions co;
    co.n_threads = 1;
    co.n_ctx = 128;
    STRATA_ASSERT_OK(Engine::Create(*m, co, &ce));
    SeqId gs, cs;
    STRATA_ASSERT_OK(ge->NewSequence(&gs));
    STRATA_ASSERT_OK(ce->NewSequence(&cs));
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 20);
    const std::vector<int32_t> decode(ids.begin() + 20, ids.end());
    std::vector<std::vector<float>> gl, cl;
    STRATA_ASSERT_OK(testing::RunTeacherForced(*ge, gs, prompt, decode, &gl));
    STRATA_ASSERT_OK(testing::RunTeacherForced(*ce, cs, prompt, decode, &cl));
    const double rel = testing::MaxRelativeDiff(gl, cl);
    std::printf("%s decode: max relative difference %.4f\n", name.c_str(), rel);
    EXPECT_LT(rel, 0.05) << name;
    // The matrices stay quantized on the GPU: their file bytes plus the F32 norms, far below
    // their F16 size.
    uint64_t f16 = 0, quant = 0;
    auto count = [&](const TensorRef& w) {
      f16 += uint64_t(w.rows * w.cols) * 2;
      quant += uint64_t(w.rows) * w.row_bytes;
    };
    for (const LayerWeights& L : m->weights().layers)
      for (const TensorRef* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        count(*w);
    count(m->weights().output);
    const uint64_t held = ge->forward().device_weight_bytes();
    const uint64_t norms = uint64_t(2 * QuantSpec(t).n_layer + 1) * QuantSpec(t).n_embd * 4;
    EXPECT_EQ(held, quant + norms) << name;
    if (t != kernels::DType::kQ8_0 && t != kernels::DType::kQ6_K) {
      EXPECT_LT(held, f16 * 6 / 10) << name;
    }
  }
}

// Logits of a batch decode: 3 sequences prefilled with different lengths, then `steps`
// passes of one token each for all three.
Status BatchDecodeLogits(Engine& e, int32_t n_vocab, int steps, std::vector<float>* out) {
  out->clear();
  std::vector<SeqId> seqs(3);
  std::vector<float> logits;
  for (size_t i = 0; i < seqs.size(); ++i) {
    STRATA_RETURN_IF_ERROR(e.NewSequence(&seqs[i]));
    const auto p = testing::TestTokens(30 + int32_t(i) * 7, n_vocab, uint32_t(i) + 1);
    STRATA_RETURN_IF_ERROR(e.Prefill(seqs[i], p, &logits));
    out->insert(out->end(), logits.begin(), logits.end());
  }
  ForwardBatch b;
  for (int s = 0; s < steps; ++s) {
    b.Clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t tok = int32_t((s * 131 + i * 17) % uint32_t(n_vocab));
      b.Add(seqs[i], e.kv().Length(seqs[i]), {&tok, 1});
    }
    STRATA_RETURN_IF_ERROR(e.Evaluate(b, &logits));
    out->insert(out->end(), logits.begin(), logits.end());
  }
  return Status::OK();
}

TEST(CudaQuantModelTest, CapturedDecodeAndMappedWeightsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  testing::KvTempDir dir;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(
      testing::LoadSyntheticModel(QuantSpec(kernels::DType::kQ4_K), dir.path(), "q4k", &m));
  const int32_t nv = m->hparams().n_vocab;
  auto run = [&](bool graphs, GpuWeights w, std::vector<float>* out, std::string* desc) {
    CudaForwardOptions g;
    g.graphs = graphs;
    g.weights = w;
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(GpuEngine(*m, 128, 3, g, &e));
    *desc = e->forward().description();
    STRATA_ASSERT_OK(BatchDecodeLogits(*e, nv, 12, out));
  };
  std::vector<float> captured, plain, mapped;
  std::string d1, d2, d3;
  run(true, GpuWeights::kDevice, &captured, &d1);
  run(false, GpuWeights::kDevice, &plain, &d2);
  run(true, GpuWeights::kMapped, &mapped, &d3);
  EXPECT_NE(d1.find("decode graphs"), std::string::npos) << d1;
  EXPECT_EQ(d2.find("decode graphs"), std::string::npos) << d2;
  EXPECT_NE(d3.find("mapped"), std::string::npos) << d3;
  ASSERT_EQ(captured.size(), plain.size());
  EXPECT_TRUE(captured == plain) << "a captured decode step differs from the launched one";
  EXPECT_TRUE(captured == mapped) << "weights read in place differ from the device copy";
}

TEST(CudaQuantModelTest, PrefillSizedPassesAgreeWithTheBatchInvariantPath) {
  SKIP_WITHOUT_GPU();
  testing::KvTempDir dir;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(
      testing::LoadSyntheticModel(QuantSpec(kernels::DType::kQ4_0), dir.path(), "q40", &m));
  const std::vector<int32_t> ids = testing::TestTokens(96, m->hparams().n_vocab, 9);
  std::vector<std::vector<float>> logits(2);
  for (int inv = 0; inv < 2; ++inv) {
    CudaForwardOptions g;
    g.batch_invariant = inv == 1;
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(GpuEngine(*m, 128, 1, g, &e));
    SeqId s;
    STRATA_ASSERT_OK(e->NewSequence(&s));
    STRATA_ASSERT_OK(e->Prefill(s, ids, &logits[size_t(inv)], /*all_logits=*/true));
  }
  const Agreement a = Compare(logits[0], logits[1], m->hparams().n_vocab, 0.5f);
  std::printf("cuBLAS prefill vs GEMV prefill: relative RMS %.5f\n", a.rel_rms);
  // F16 activations (cuBLAS) against 8-bit ones (the GEMVs).
  EXPECT_LT(a.rel_rms, 0.02);
  EXPECT_GE(a.clear, 0.98);
}

TEST(CudaDiskKvTest, TheDiskPolicyOnTheGpuFollowsTheCpuPolicy) {
  SKIP_WITHOUT_GPU();
  testing::KvTempDir dir;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(
      testing::LoadSyntheticModel(QuantSpec(kernels::DType::kQ8_0), dir.path(), "q80", &m));
  const std::string adapters = dir.path() + "/q80.adapters";
  STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*m, {1, 2, 4, 8}, adapters));
  constexpr int32_t kCtx = 512;
  EngineOptions o = testing::DiskEngineOptions(dir.path(), adapters, kCtx);
  o.n_threads = 2;
  o.kv.disk.budget_bytes = 0;  // 1/13 of the cache: sparse decode views
  const auto ids = testing::TestTokens(300, m->hparams().n_vocab, 5);
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 260);
  const std::vector<int32_t> decode(ids.begin() + 260, ids.end());
  std::vector<std::vector<float>> cpu, gpu;
  KvCounters cc, gc;
  {
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*m, o, &e));
    SeqId s;
    STRATA_ASSERT_OK(e->NewSequence(&s));
    STRATA_ASSERT_OK(testing::RunTeacherForced(*e, s, prompt, decode, &cpu));
    cc = e->kv().counters();
  }
  {
    EngineOptions g = o;
    g.cuda_device = 0;
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*m, g, &e));
    EXPECT_STREQ(e->kv().name(), "disk");
    EXPECT_TRUE(e->kv().device_memory());
    SeqId s;
    STRATA_ASSERT_OK(e->NewSequence(&s));
    STRATA_ASSERT_OK(testing::RunTeacherForced(*e, s, prompt, decode, &gpu));
    gc = e->kv().counters();
  }
  const double rel = testing::MaxRelativeDiff(gpu, cpu);
  std::printf(
      "disk policy GPU vs CPU: max relative logit difference %.4f; bytes read %llu vs "
      "%llu, groups selected %llu vs %llu\n",
      rel, (unsigned long long)gc.bytes_read, (unsigned long long)cc.bytes_read,
      (unsigned long long)gc.groups_selected, (unsigned long long)cc.groups_selected);
  EXPECT_LT(rel, 0.05);
  EXPECT_GT(cc.bytes_read, 0u);
  // The same policy selects from nearly the same hidden states: the same reads within a
  // few percent (a score that ties to rounding may fall either way).
  EXPECT_NEAR(double(gc.bytes_read), double(cc.bytes_read), 0.05 * double(cc.bytes_read));
  EXPECT_NEAR(double(gc.groups_selected), double(cc.groups_selected),
              0.05 * double(cc.groups_selected));
  EXPECT_GT(gc.staging_bytes, 0u);
}

TEST(CudaRealModelTest, GpuAgreesWithTheCpuAndBeamsAreIdenticalUnderEverySchedule) {
  SKIP_WITHOUT_GPU();
  STRATA_REQUIRE_REAL_MODEL(path);
  std::unique_ptr<Model> model;
  STRATA_ASSERT_OK(Model::Load(path, &model));
  // The start of tinyshakespeare, as committed for calibration.
  std::ifstream in(testing::SourceDir() + "/tuner/data/calibration.txt");
  std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.\n";
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str().substr(0, 2000);
  }
  std::vector<int32_t> ids;
  STRATA_ASSERT_OK(model->tokenizer().Encode(text, true, false, &ids));
  ids.resize(std::min<size_t>(ids.size(), 300));
  std::vector<float> gpu, cpu;
  STRATA_ASSERT_OK(GpuLogits(*model, ids, &gpu));
  STRATA_ASSERT_OK(CpuLogits(*model, ids, &cpu));
  const Agreement a = Compare(gpu, cpu, model->hparams().n_vocab, 1.0f);
  std::printf(
      "GPU vs CPU logits over %zu tokens: relative RMS difference %.4f, top-1 agreement %.1f%% "
      "(%.1f%% of the %lld tokens whose CPU top-2 margin is >= 1)\n",
      ids.size(), a.rel_rms, a.all * 100, a.clear * 100, (long long)a.clear_rows);
  EXPECT_LT(a.rel_rms, 0.05);
  EXPECT_GE(a.all, 0.9);
  EXPECT_GE(a.clear, 0.99);
  EXPECT_GE(a.clear_rows, int64_t(ids.size()) / 3);

  std::vector<int32_t> prompt;
  STRATA_ASSERT_OK(EncodeBeamPrompt(*model, "Write three short tips for a dry summer garden.",
                                    /*chat=*/true, &prompt));
  BeamSearchParams p;
  p.n_beams = 8;
  p.step_tokens = 16;
  p.max_tokens = 48;
  p.sampling.temperature = 0.8f;
  p.sampling.seed = 99;
  p.n_threads = 1;
  p.cuda_device = 0;
  std::vector<BeamResult> ref;
  BeamSearchStats st;
  STRATA_ASSERT_OK(RunBeamSearch(*model, prompt, p, nullptr, &ref, &st));
  for (BeamSchedule s : {BeamSchedule::kBalanced, BeamSchedule::kTokenwise}) {
    p.schedule = s;
    p.gpu_slow_on_disk = s == BeamSchedule::kBalanced;
    p.fast_budget_bytes =
        std::max<uint64_t>(st.peak_tree_bytes * 2 / 5,
                           MinFastBudgetBytes(p, model->hparams(), int32_t(prompt.size())));
    std::vector<BeamResult> got;
    BeamSearchStats gs;
    STRATA_ASSERT_OK(RunBeamSearch(*model, prompt, p, nullptr, &got, &gs));
    ASSERT_EQ(got.size(), ref.size()) << BeamScheduleName(s);
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << BeamScheduleName(s) << " rank " << i;
      EXPECT_EQ(got[i].score, ref[i].score) << BeamScheduleName(s) << " rank " << i;
    }
    EXPECT_LE(gs.kv.peak_fast_bytes, p.fast_budget_bytes) << BeamScheduleName(s);
  }
}

TEST(CudaRealModelTest, DiskPolicyOnTheGpuFollowsTheCpusGreedyOutput) {
  SKIP_WITHOUT_GPU();
  STRATA_REQUIRE_REAL_MODEL(path);
  const std::string adapters = path.substr(0, path.size() - 5) + ".adapters";
  ASSERT_TRUE(std::filesystem::exists(adapters))
      << adapters << " is missing: scripts/setup.sh makes it (strata calibrate)";
  std::unique_ptr<Model> model;
  STRATA_ASSERT_OK(Model::Load(path, &model));
  testing::KvTempDir dir;
  auto engine = [&](bool gpu, std::unique_ptr<Engine>* e) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 1024;
    o.kv.policy = KvPolicyKind::kDisk;
    o.kv.disk.dir = dir.path();
    o.cuda_device = gpu ? 0 : -1;
    return Engine::Create(*model, o, e);
  };
  const char* prompts[] = {"The history of the printing press", "Write a short poem about the sea.",
                           "List three uses of a paperclip:"};
  int64_t clear = 0, clear_same = 0, all = 0, same = 0;
  for (const char* text : prompts) {
    // The CPU policy's greedy continuation...
    std::unique_ptr<Engine> cpu;
    STRATA_ASSERT_OK(engine(false, &cpu));
    GenerationRequest r;
    STRATA_ASSERT_OK(cpu->NewSequence(&r.seq));
    STRATA_ASSERT_OK(model->tokenizer().Encode(text, true, false, &r.prompt));
    r.params.max_tokens = 48;
    r.params.sampling.temperature = 0;
    r.params.ignore_eos = true;
    STRATA_ASSERT_OK(cpu->Generate({&r, 1}, nullptr));
    // ... fed to both policies token by token: the GPU's choice at each step against the
    // CPU's. Where the CPU's top two logits are close, rounding may pick either.
    std::vector<int32_t> seq_tokens = r.prompt;
    seq_tokens.insert(seq_tokens.end(), r.tokens.begin(), r.tokens.end());
    std::vector<std::vector<float>> lg, lc;
    std::unique_ptr<Engine> gpu;
    STRATA_ASSERT_OK(engine(true, &gpu));
    std::unique_ptr<Engine> cpu2;
    STRATA_ASSERT_OK(engine(false, &cpu2));
    SeqId gs, cs;
    STRATA_ASSERT_OK(gpu->NewSequence(&gs));
    STRATA_ASSERT_OK(cpu2->NewSequence(&cs));
    const std::vector<int32_t> decode(r.tokens.begin(), r.tokens.end() - 1);
    STRATA_ASSERT_OK(testing::RunTeacherForced(*gpu, gs, r.prompt, decode, &lg));
    STRATA_ASSERT_OK(testing::RunTeacherForced(*cpu2, cs, r.prompt, decode, &lc));
    ASSERT_EQ(lg.size(), r.tokens.size());
    std::string gpu_text;
    for (size_t i = 0; i < lg.size(); ++i) {
      const auto& g = lg[i];
      const auto& c = lc[i];
      const int64_t ga = std::max_element(g.begin(), g.end()) - g.begin();
      const int64_t ca = std::max_element(c.begin(), c.end()) - c.begin();
      EXPECT_EQ(ca, r.tokens[i]) << "the CPU policy is not deterministic";
      float second = -INFINITY;
      for (size_t j = 0; j < c.size(); ++j)
        if (int64_t(j) != ca) second = std::max(second, c[j]);
      ++all;
      same += ga == ca;
      if (c[size_t(ca)] - second >= 0.5f) {
        ++clear;
        clear_same += ga == ca;
      }
    }
    std::printf("CPU disk policy: %s\n", r.text.c_str());
  }
  std::printf(
      "GPU disk policy against the CPU's greedy path: %lld of %lld steps agree, %lld of "
      "%lld clear ones\n",
      (long long)same, (long long)all, (long long)clear_same, (long long)clear);
  EXPECT_EQ(clear_same, clear);
  EXPECT_GE(double(same), 0.9 * double(all));
}

}  // namespace
}  // namespace strata
