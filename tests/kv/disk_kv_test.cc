// The disk-backed sparse policy inside the engine, on a tiny synthetic model: exact when
// every group is selected, within budget, batch decode, and clear errors for a removed KV
// directory, a full disk, failed reads, bad adapters and bad parameters.
#include "runtime/kv/disk/disk_kv.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "runtime/kv/disk/group_predictor.h"
#include "storage/fault_injection.h"
#include "tests/kv/disk_kv_test_util.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

using testing::DiskEngineOptions;
using testing::KvTempDir;
using testing::MaxRelativeDiff;
using testing::RunTeacherForced;
using testing::TestTokens;

constexpr int32_t kCtx = 256;

class DiskKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UseLayers(SyntheticModelSpec().n_layer);
    prompt_ = TestTokens(150, model_->hparams().n_vocab, 1);
    decode_ = TestTokens(70, model_->hparams().n_vocab, 2);
  }

  EngineOptions Options() { return DiskEngineOptions(kv_dir_.path(), adapters_, kCtx); }

  // Loads (or replaces) the model, with identity adapters, at n_layer layers. The refinement
  // corrects layers 1 .. n_layer-2 (layer 0 is guessed from its own input, the last has no
  // later call), so the default two layers never refine.
  void UseLayers(int32_t n_layer) {
    SyntheticModelSpec spec;
    spec.n_layer = n_layer;
    const std::string name = "m" + std::to_string(n_layer);
    STRATA_ASSERT_OK(testing::LoadSyntheticModel(spec, dir_.path(), name, &model_));
    adapters_ = dir_.path() + "/" + name + ".adapters";
    STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*model_, {1, 2, 4, 8}, adapters_));
  }

  // The identity adapters with an attention profile whose error at t selected tokens in
  // layer l is error(l, t), written as `name` in the test's directory; returns the path.
  std::string WriteProfiledAdapters(const std::string& name,
                                    const std::function<float(int32_t, int32_t)>& error) {
    Adapters a;
    EXPECT_TRUE(Adapters::Read(adapters_, &a).ok());
    a.profile.tokens = AttentionProfile::DefaultTokens();
    for (int32_t l = 0; l < model_->hparams().n_layer; ++l) {
      std::vector<float> m;
      for (int32_t t : a.profile.tokens) m.push_back(error(l, t));
      a.profile.error.push_back(m);
    }
    const std::string path = dir_.path() + "/" + name;
    EXPECT_TRUE(a.Write(path).ok());
    return path;
  }

  // Logits of prompt_ + decode_ under `options` (memory policy when memory is true).
  std::vector<std::vector<float>> Run(EngineOptions o, KvCounters* counters = nullptr) {
    std::unique_ptr<Engine> e;
    Status st = Engine::Create(*model_, o, &e);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return {};
    SeqId seq;
    EXPECT_TRUE(e->NewSequence(&seq).ok());
    std::vector<std::vector<float>> out;
    st = RunTeacherForced(*e, seq, prompt_, decode_, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (counters) *counters = e->kv().counters();
    return out;
  }

  std::vector<std::vector<float>> Reference() {
    EngineOptions o = Options();
    o.kv.policy = KvPolicyKind::kMemory;
    return Run(o);
  }

  // The logits under each reuse policy must agree; returns FIFO's.
  std::vector<std::vector<float>> CheckReusePolicies(bool refine);

  KvTempDir dir_, kv_dir_;
  std::unique_ptr<Model> model_;
  std::string adapters_;
  std::vector<int32_t> prompt_, decode_;
};

// With M as large as the context, every group is selected: the policy then attends to
// exactly the keys the memory policy holds (both F16), for any G, sink and recent window,
// and whether the groups sit in persistent slots or are read through (slots > 0: that many
// persistent slots, the rest read through, in buffers that layers l and l+2 share).
TEST_F(DiskKvTest, SelectingEveryGroupMatchesFullKv) {
  const auto ref = Reference();
  struct Variant {
    int32_t g, sink, recent;
    bool refine;
    KeySummaryType summary = KeySummaryType::kF16;
    bool group_summary = false;
    int32_t slots = 0;
  };
  for (Variant v : {Variant{4, 1, 0, false}, Variant{1, 0, 0, false}, Variant{3, 2, 3, true},
                    Variant{8, 0, 1, false}, Variant{4, 1, 0, true, KeySummaryType::kQ8},
                    Variant{5, 1, 0, true, KeySummaryType::kQ4, true},
                    Variant{3, 0, 2, false, KeySummaryType::kF16, true},
                    Variant{4, 1, 0, false, KeySummaryType::kF16, false, 6},
                    Variant{4, 1, 0, true, KeySummaryType::kQ4, false, 20},
                    Variant{5, 0, 1, true, KeySummaryType::kQ4, true, 1}}) {
    EngineOptions o = Options();
    o.kv.disk.summary_type = v.summary;
    o.kv.disk.group_summary = v.group_summary ? AutoSwitch::kOn : AutoSwitch::kOff;
    o.kv.disk.refine = v.refine;
    o.kv.disk.group_size = v.g;
    o.kv.disk.sink_groups = v.sink;
    o.kv.disk.recent_groups = v.recent;
    o.kv.disk.groups_per_step = (kCtx + v.g - 1) / v.g;
    if (v.slots > 0) {
      o.kv.disk.reuse_slots = v.slots;
      o.kv.disk.read_through = o.kv.disk.groups_per_step - v.slots;
    }
    KvCounters c;
    const auto got = Run(o, &c);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(MaxRelativeDiff(got, ref), 1e-4)
        << "G=" << v.g << " sink=" << v.sink << " recent=" << v.recent
        << " group summary=" << v.group_summary << " slots=" << v.slots;
    EXPECT_GT(c.bytes_read, 0u);
    EXPECT_GT(c.bytes_written, 0u);
    // Read-through groups are read again every step; none without read-through slots.
    if (v.slots > 0)
      EXPECT_GT(c.read_through_groups, uint64_t(decode_.size()) * 2) << "slots=" << v.slots;
    else
      EXPECT_EQ(c.read_through_groups, 0u);
  }
}

// Mean over tokens of |a - b| / |b| (L2 over the vocabulary).
double MeanRelativeDiff(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t t = 0; t < a.size() && t < b.size(); ++t) {
    double d = 0, n = 0;
    for (size_t i = 0; i < b[t].size(); ++i) {
      d += double(a[t][i] - b[t][i]) * (a[t][i] - b[t][i]);
      n += double(b[t][i]) * b[t][i];
    }
    sum += std::sqrt(d / std::max(n, 1e-30));
  }
  return b.empty() ? 0.0 : sum / double(b.size());
}

// Quantized key summaries: at the same rank Q8 ranks groups almost exactly as F16 does, and
// Q4 at four times the rank ranks them closer to the full-rank F16 summary than F16 at the
// rank that takes about the same memory (what makes Q4 the default). Measured as the mean
// distance of the runs' logits, with few groups selected.
TEST_F(DiskKvTest, QuantizedSummariesRankCloserAtEqualMemory) {
  const auto ref = Reference();
  struct Variant {
    KeySummaryType type;
    int32_t ratio;
  };
  const Variant variants[4] = {{KeySummaryType::kF16, 1},  // rank 32, the best ranking
                               {KeySummaryType::kQ8, 1},
                               {KeySummaryType::kQ4, 1},    // 18 bytes a token
                               {KeySummaryType::kF16, 4}};  // rank 8: 16 bytes a token
  std::vector<std::vector<float>> run[4];
  for (int i = 0; i < 4; ++i) {
    EngineOptions o = Options();
    o.kv.disk.summary_type = variants[i].type;
    o.kv.disk.ratio = variants[i].ratio;
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 9;
    o.kv.disk.resident_bonus = 0;  // selection by the scores alone
    run[i] = Run(o);
  }
  const double sparse = MeanRelativeDiff(run[0], ref);
  const double q8 = MeanRelativeDiff(run[1], run[0]), q4 = MeanRelativeDiff(run[2], run[0]);
  const double f16_low = MeanRelativeDiff(run[3], run[0]);
  std::printf(
      "full-rank F16 summary vs full KV %.4g; vs that summary: Q8 %.4g, Q4 %.4g, F16 at "
      "a quarter of the rank %.4g\n",
      sparse, q8, q4, f16_low);
  EXPECT_GT(sparse, 1e-3);
  EXPECT_LT(q8, sparse / 5);
  EXPECT_LT(q4, f16_low);
}

// The replacement policy decides where a group sits in memory, never which groups attention
// sees, so FIFO, LRU and LFU give identical logits; a small M differs from full KV.
TEST_F(DiskKvTest, ReusePolicyDoesNotChangeResults) {
  UseLayers(4);
  std::vector<std::vector<float>> fifo[2];
  for (bool refine : {false, true}) {
    SCOPED_TRACE(refine ? "refine" : "guess only");
    fifo[refine] = CheckReusePolicies(refine);
  }
  // The refinement did run: exact queries chose other groups than the guesses.
  EXPECT_GT(MaxRelativeDiff(fifo[1], fifo[0]), 1e-4);
}

std::vector<std::vector<float>> DiskKvTest::CheckReusePolicies(bool refine) {
  std::vector<std::vector<std::vector<float>>> runs;
  std::vector<KvCounters> cs;
  for (ReusePolicy p : {ReusePolicy::kFifo, ReusePolicy::kLru, ReusePolicy::kLfu}) {
    EngineOptions o = Options();
    o.kv.disk.refine = refine;
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 9;
    o.kv.disk.reuse = p;
    // Attention over the selection only, and selection by score alone: which unselected
    // groups stay resident is exactly what the policies differ in.
    o.kv.disk.attend_resident = false;
    o.kv.disk.resident_bonus = 0;
    KvCounters c;
    runs.push_back(Run(o, &c));
    cs.push_back(c);
  }
  EXPECT_EQ(MaxRelativeDiff(runs[1], runs[0]), 0.0);
  EXPECT_EQ(MaxRelativeDiff(runs[2], runs[0]), 0.0);
  EXPECT_GT(MaxRelativeDiff(runs[0], Reference()), 1e-4);
  for (const KvCounters& c : cs) {
    EXPECT_EQ(c.groups_selected, uint64_t(decode_.size()) * 6 * model_->hparams().n_layer);
    EXPECT_GT(c.reuse_hits, 0u);
    EXPECT_LT(c.reuse_hits, c.groups_selected);
  }
  return runs[0];
}

// Layer 1 would be guessed from the embedding alone, so with the refinement on it is
// selected once a step, from its exact query: at most one batch of loads a step, where a
// later layer (guess, then refinement) gets two in some steps; and the selections stay
// M groups a layer a step.
TEST_F(DiskKvTest, LayerOneIsSelectedOnlyFromItsExactQuery) {
  UseLayers(4);
  for (bool refine : {true, false}) {
    SCOPED_TRACE(refine ? "refine" : "guess only");
    EngineOptions o = Options();
    o.kv.disk.refine = refine;
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 9;
    // Selection by score alone, so that picks change from step to step.
    o.kv.disk.resident_bonus = 0;
    std::vector<uint64_t> load_batches(size_t(model_->hparams().n_layer), 0);
    o.kv.hooks.on_read_submit = [&](int32_t layer, const storage::IoBatch& b) {
      // Decode loads only, not a prefill's read-back (its requests carry an all-ones tag).
      if (!b.empty() && b.request(0).tag != ~uint64_t{0}) ++load_batches[size_t(layer)];
    };
    KvCounters c;
    Run(o, &c);
    const uint64_t steps = decode_.size();
    EXPECT_EQ(c.groups_selected, steps * 6 * model_->hparams().n_layer);
    EXPECT_GT(load_batches[1], 0u);
    if (refine) {
      EXPECT_LE(load_batches[1], steps);
      EXPECT_GT(load_batches[2], steps);
    } else {
      EXPECT_LE(load_batches[2], steps);
    }
  }
}

// The decode-view hook sees, for every layer of every decode pass, the spans attention gets:
// positions inside what the sequence holds, the newest token among them, and no more groups
// than the plan keeps (the selection plus the always-kept sink and recent groups).
TEST_F(DiskKvTest, TheDecodeViewHookSeesEachLayersAttendedSpans) {
  EngineOptions o = Options();
  o.kv.disk.groups_per_step = 6;
  o.kv.disk.reuse_slots = 9;
  std::vector<int32_t> calls(size_t(model_->hparams().n_layer), 0);
  int32_t bad = 0, newest_missing = 0;
  o.kv.hooks.on_decode_view = [&](int32_t layer, SeqId, std::span<const kernels::KvSpan> view) {
    ++calls[size_t(layer)];
    int32_t last = -1;
    for (const kernels::KvSpan& sp : view) {
      if (sp.pos0 < 0 || sp.n_tokens <= 0) ++bad;
      last = std::max(last, sp.pos0 + sp.n_tokens - 1);
    }
    // The pass appends one token after the prompt and the tokens decoded before it.
    if (last < int32_t(prompt_.size())) ++newest_missing;
  };
  KvCounters c;
  Run(o, &c);
  for (int32_t n : calls) EXPECT_EQ(n, int32_t(decode_.size()));
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(newest_missing, 0);
}

// A resident bonus makes selection keep groups it already holds: more reuse hits and fewer
// bytes read for the same number of selected groups; off, selection is by score alone.
TEST_F(DiskKvTest, ResidentBonusTradesReadsForSelection) {
  KvCounters c[2];
  for (int b = 0; b < 2; ++b) {
    EngineOptions o = Options();
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 12;
    o.kv.disk.resident_bonus = b ? 1.0f : 0.0f;
    Run(o, &c[b]);
  }
  EXPECT_EQ(c[1].groups_selected, c[0].groups_selected);
  EXPECT_GT(c[1].reuse_hits, c[0].reuse_hits);
  EXPECT_LT(c[1].bytes_read, c[0].bytes_read);
}

// A layer whose calibrated attention profile misses far more than the others' (dispersed
// attention) takes kv.experimental.dispersed_bonus instead of kv.experimental.resident_bonus: with
// the others' bonus 0 it alone keeps what it holds, so the same selections read fewer groups.
TEST_F(DiskKvTest, DispersedLayersKeepWhatTheyHold) {
  UseLayers(4);
  const int32_t n_layer = model_->hparams().n_layer;
  const std::string profiled = WriteProfiledAdapters(
      "dispersed.adapters",
      [](int32_t l, int32_t t) { return (l == 1 ? 0.9f : 0.1f) * std::exp(-float(t) / 4096.0f); });
  KvCounters c[2];
  for (int d = 0; d < 2; ++d) {
    EngineOptions o = Options();
    o.kv.disk.adapters = profiled;
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 12;
    o.kv.disk.resident_bonus = 0;
    o.kv.disk.dispersed_bonus = d ? 10.0f : -1.0f;
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
    const DiskKvPlan& plan = static_cast<DiskKv&>(e->kv()).plan();
    EXPECT_EQ(plan.dispersed_layers, d ? std::vector<int32_t>{1} : std::vector<int32_t>{});
    ASSERT_EQ(plan.layer_bonus.size(), size_t(n_layer));
    EXPECT_EQ(plan.layer_bonus[1], d ? 10.0f : 0.0f);
    EXPECT_EQ(plan.layer_bonus[0], 0.0f);
    Run(o, &c[d]);
  }
  EXPECT_EQ(c[1].groups_selected, c[0].groups_selected);
  EXPECT_GT(c[1].reuse_hits, c[0].reuse_hits);
  EXPECT_LT(c[1].bytes_read, c[0].bytes_read);
}

// Attention also reads the groups the reuse buffer still holds from earlier steps: more
// of the context at no extra I/O, so the logits move toward full KV; off, it reads the
// selection only.
TEST_F(DiskKvTest, AttendingResidentGroupsReadsMoreOfTheContext) {
  const auto ref = Reference();
  double diff[2] = {0, 0};
  for (bool resident : {false, true}) {
    SCOPED_TRACE(resident ? "resident" : "selection only");
    EngineOptions o = Options();
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 30;
    o.kv.disk.attend_resident = resident;
    o.kv.disk.resident_bonus = 0;  // selection by score alone: resident picks go stale
    KvCounters c;
    const auto run = Run(o, &c);
    diff[resident] = MaxRelativeDiff(run, ref);
    EXPECT_EQ(c.groups_selected, uint64_t(decode_.size()) * 6 * model_->hparams().n_layer);
    if (resident) {
      // After the first steps most of the 30 slots hold groups besides this step's 6.
      EXPECT_GT(c.resident_attended, uint64_t(decode_.size()) * 10 * model_->hparams().n_layer);
      EXPECT_LE(c.resident_attended, uint64_t(decode_.size()) * 24 * model_->hparams().n_layer);
    } else {
      EXPECT_EQ(c.resident_attended, 0u);
    }
  }
  EXPECT_LT(diff[1], diff[0]);
  EXPECT_GT(diff[1], 0.0);
}

// kv.experimental.attend_tail: the groups a step leaves out enter attention by their estimated
// share with the mean value. Where it is off, weighted 0 or starts past the last layer, the results
// are those of the plain selection bit for bit; on, they move, here towards full KV (the synthetic
// model's attention is spread, so the left-out mass is large).
TEST_F(DiskKvTest, LeftOutKeysEnterAttentionByTheirEstimatedShare) {
  const auto ref = Reference();
  auto run = [&](bool tail, float weight, int32_t first) {
    EngineOptions o = Options();
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 6;
    o.kv.disk.attend_tail = tail;
    o.kv.disk.tail_weight = weight;
    o.kv.disk.tail_first_layer = first;
    return Run(o);
  };
  const auto off = run(false, 1.0f, 0);
  EXPECT_EQ(run(true, 0.0f, 0), off);
  EXPECT_EQ(run(true, 1.0f, model_->hparams().n_layer), off);
  const auto on = run(true, 1.0f, 0);
  const double d_on = MaxRelativeDiff(on, ref), d_off = MaxRelativeDiff(off, ref);
  EXPECT_GT(MaxRelativeDiff(on, off), 1e-4);
  EXPECT_LT(d_on, d_off);
  std::printf("max relative logit difference from full KV: %.4f with the tail, %.4f without\n",
              d_on, d_off);
}

// Adapters with an attention profile spread M and C over the layers (here the last layer
// spreads its attention, the first does not) within the same budget; with M covering the
// context every layer still gets every group, so results equal full KV.
TEST_F(DiskKvTest, AttentionProfileSpreadsGroupsOverLayers) {
  const int32_t n_layer = model_->hparams().n_layer;
  const std::string profiled = WriteProfiledAdapters("profiled.adapters", [](int32_t l, int32_t t) {
    return l == 0 ? 0.0f : std::max(0.0f, 0.8f - float(t) / 400.0f);
  });
  EngineOptions o = Options();
  o.kv.disk.adapters = profiled;
  o.kv.disk.calibrated_layers = AutoSwitch::kOn;
  o.kv.disk.groups_per_step = 12;
  o.kv.disk.reuse_slots = 16;
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  const DiskKvPlan& plan = static_cast<DiskKv&>(e->kv()).plan();
  ASSERT_TRUE(plan.calibrated);
  EXPECT_EQ(plan.layer_groups[0], 3);  // the floor, M/4
  EXPECT_EQ(plan.layer_groups[size_t(n_layer - 1)], 12 * n_layer - 3 * (n_layer - 1));
  KvCounters c;
  Run(o, &c);
  EXPECT_EQ(c.groups_selected, uint64_t(decode_.size()) * 12 * n_layer);
  EXPECT_LE(c.peak_sequence_resident_bytes, c.budget_bytes);

  o.kv.disk.groups_per_step = (kCtx + 3) / 4;
  o.kv.disk.reuse_slots = 0;
  EXPECT_LT(MaxRelativeDiff(Run(o), Reference()), 1e-4);
}

// K_lr is kept in tiles of 16 tokens; a context that is not a whole number of tiles must
// select and attend exactly as a larger one does (capacity never changes the math).
TEST_F(DiskKvTest, ContextSizeOffTheSummaryTilesGivesTheSameResults) {
  std::vector<std::vector<std::vector<float>>> runs;
  for (int32_t n_ctx : {kCtx, 237}) {
    EngineOptions o = DiskEngineOptions(kv_dir_.path(), adapters_, n_ctx);
    o.kv.disk.groups_per_step = 6;
    o.kv.disk.reuse_slots = 9;
    runs.push_back(Run(o));
    ASSERT_EQ(runs.back().size(), decode_.size() + 1) << n_ctx;
  }
  EXPECT_EQ(MaxRelativeDiff(runs[1], runs[0]), 0.0);
  EXPECT_GT(MaxRelativeDiff(runs[0], Reference()), 1e-4);
}

// Q8_0 records (what `auto` picks when the head dimension is a multiple of 32): with every
// group selected the policy attends to the same keys as full KV, now within Q8_0's rounding;
// records and reads are smaller than F16's, and an explicit q8_0 for a model whose heads do
// not split into Q8_0 blocks is refused.
TEST_F(DiskKvTest, Q8RecordsSelectingEveryGroupStayWithinQuantizationErrorOfFullKv) {
  SyntheticModelSpec spec;
  spec.head_dim = 32;
  std::unique_ptr<Model> model;
  STRATA_ASSERT_OK(testing::LoadSyntheticModel(spec, dir_.path(), "q8", &model));
  const std::string adapters = dir_.path() + "/q8.adapters";
  STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*model, {1, 2, 4, 8}, adapters));
  auto run = [&](KvPolicyKind policy, KvRecordType type, uint32_t* record_bytes, KvCounters* c) {
    EngineOptions o = DiskEngineOptions(kv_dir_.path(), adapters, kCtx);
    o.kv.policy = policy;
    o.kv.disk.group_size = 8;
    o.kv.disk.groups_per_step = kCtx / 8;
    o.kv.disk.recent_groups = 1;
    o.kv.disk.record_type = type;
    std::unique_ptr<Engine> e;
    Status st = Engine::Create(*model, o, &e);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::vector<std::vector<float>> out;
    if (!st.ok()) return out;
    if (record_bytes) *record_bytes = static_cast<DiskKv&>(e->kv()).plan().layout.record_bytes;
    SeqId seq;
    EXPECT_TRUE(e->NewSequence(&seq).ok());
    st = RunTeacherForced(*e, seq, prompt_, decode_, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (c) *c = e->kv().counters();
    return out;
  };
  const auto ref = run(KvPolicyKind::kMemory, KvRecordType::kAuto, nullptr, nullptr);
  uint32_t rec_f16 = 0, rec_q8 = 0;
  KvCounters c_f16, c_q8;
  const auto f16 = run(KvPolicyKind::kDisk, KvRecordType::kF16, &rec_f16, &c_f16);
  const auto q8 = run(KvPolicyKind::kDisk, KvRecordType::kAuto, &rec_q8, &c_q8);
  ASSERT_EQ(f16.size(), ref.size());
  ASSERT_EQ(q8.size(), ref.size());
  EXPECT_LT(MaxRelativeDiff(f16, ref), 1e-4);
  const double d = MaxRelativeDiff(q8, ref);
  EXPECT_GT(d, 1e-6) << "Q8_0 records should not be bit-exact";
  EXPECT_LT(d, 1e-2);
  EXPECT_EQ(rec_f16, 2048u);  // 8 tokens x 64 values x K,V x 2 bytes
  EXPECT_EQ(rec_q8, 1536u);   // 8 x 2 blocks of 34 bytes x K,V = 1088, padded to 512
  EXPECT_EQ(c_q8.groups_selected, c_f16.groups_selected);
  EXPECT_LT(c_q8.bytes_read, c_f16.bytes_read);

  EngineOptions o = Options();  // head_dim 16: no whole Q8_0 block per head
  o.kv.disk.record_type = KvRecordType::kQ8_0;
  std::unique_ptr<Engine> e;
  const Status st = Engine::Create(*model_, o, &e);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("kv.record_type = q8_0 needs a head dimension that is a multiple "
                              "of 32"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("this model's is 16"), std::string::npos) << st.message();
}

// For each key summary type (rank 4 in F16, 8 in Q8, 16 in Q4: about the same bytes), the
// counted resident memory (summary tiles in use, arena, tables) stays within the budget.
TEST_F(DiskKvTest, ResidentMemoryStaysWithinBudgetOverALongGeneration) {
  struct Variant {
    KeySummaryType type;
    int32_t ratio;
    bool group_summary = false;
    int32_t read_through = 0;
    int32_t span = 1;
  };
  for (Variant v : {Variant{KeySummaryType::kF16, 8}, Variant{KeySummaryType::kQ8, 4},
                    Variant{KeySummaryType::kQ4, 2}, Variant{KeySummaryType::kQ4, 1, true},
                    Variant{KeySummaryType::kQ4, 2, false, 10},
                    Variant{KeySummaryType::kQ4, 2, false, 10, 4}}) {
    SCOPED_TRACE(std::string(KeySummaryTypeName(v.type)) + (v.group_summary ? " per group" : "") +
                 " read-through " + std::to_string(v.read_through) + " in spans of " +
                 std::to_string(v.span));
    EngineOptions o = Options();
    o.kv.disk.group_size = 2;
    o.kv.disk.ratio = v.ratio;
    o.kv.disk.summary_type = v.type;
    o.kv.disk.group_summary = v.group_summary ? AutoSwitch::kOn : AutoSwitch::kOff;
    o.kv.disk.recent_groups = 2;
    // With read-through slots the selection is larger than the slots the budget affords.
    o.kv.disk.groups_per_step = v.read_through > 0 ? 18 : 12;
    o.kv.disk.read_through = v.read_through;
    o.kv.disk.read_through_span = v.span;
    // Tight: the key summary at full context plus about 20 slots per layer.
    const HParams& hp = model_->hparams();
    const int32_t rank = hp.n_head_kv * hp.head_dim / v.ratio;
    const int64_t rec = 512;  // 2 tokens x 32 values x K,V x 2 bytes = 256, padded to the block
    const int64_t rows = v.group_summary ? kCtx / 2 : kCtx;
    o.kv.disk.budget_bytes =
        int64_t(hp.n_layer) *
        (int64_t(GroupPredictor::KlrBytes(rows, rank, ScoreTypeOf(v.type))) + 30 * rec);
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
    auto& kv = static_cast<DiskKv&>(e->kv());
    EXPECT_EQ(kv.plan().rank, rank);
    EXPECT_EQ(kv.plan().group_summary, v.group_summary);
    EXPECT_GT(kv.plan().reuse_slots + v.read_through, kv.plan().groups_per_step);
    if (v.read_through > 0) {
      EXPECT_GT(kv.plan().groups_per_step, kv.plan().reuse_slots);
    }
    EXPECT_EQ(kv.plan().transient_groups, v.read_through);
    EXPECT_LE(kv.plan().total_bytes(), uint64_t(o.kv.disk.budget_bytes));
    SeqId seq;
    STRATA_ASSERT_OK(e->NewSequence(&seq));
    GenerationRequest r;
    r.seq = seq;
    r.prompt = TestTokens(20, hp.n_vocab, 3);
    r.params.max_tokens = kCtx - 21;
    r.params.ignore_eos = true;
    r.params.sampling.temperature = 0;
    GenerationStats st;
    STRATA_ASSERT_OK(e->Generate({&r, 1}, &st));
    EXPECT_GE(kv.Length(seq), kCtx - 2);
    const KvCounters c = kv.counters();
    EXPECT_EQ(c.budget_bytes, uint64_t(o.kv.disk.budget_bytes));
    EXPECT_GT(c.peak_sequence_resident_bytes, c.budget_bytes * 3 / 4);
    EXPECT_LE(c.peak_sequence_resident_bytes, c.budget_bytes);
    EXPECT_LE(c.peak_resident_bytes, c.budget_bytes);
    EXPECT_GE(c.steps, uint64_t(r.params.max_tokens - 1));
    EXPECT_EQ(c.read_through_groups > 0, v.read_through > 0);
  }
}

// A prefill whose earlier records do not fit beside its own buffers in the slot pool reads
// them back in windows that attention joins: the same logits as the memory policy (exact
// prefill), and no byte of staging outside the budget, whatever the prompt's length. A pass
// larger than the pool can take is refused, and the engine chunks prefill to what it can.
TEST_F(DiskKvTest, PrefillStagingStaysInsideTheBudgetInWindows) {
  const HParams& hp = model_->hparams();
  EngineOptions o = Options();
  o.n_batch = 16;
  o.kv.disk.group_size = 2;
  o.kv.disk.recent_groups = 1;
  o.kv.disk.groups_per_step = 12;
  const int32_t rank = hp.n_head_kv * hp.head_dim / 4;
  const int64_t rec = 512;
  o.kv.disk.budget_bytes =
      int64_t(hp.n_layer) *
      (int64_t(GroupPredictor::KlrBytes(kCtx, rank, ScoreTypeOf(KeySummaryType::kQ4))) + 24 * rec);
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  auto& kv = static_cast<DiskKv&>(e->kv());
  // 150 tokens = 75 records of earlier groups by the last chunk: two layers' worth do not fit
  // the slots (about 2 x 24 records) beside the pass's buffers.
  EXPECT_LT(uint64_t(kv.plan().reuse_slots) * hp.n_layer, 150u);
  SeqId seq;
  STRATA_ASSERT_OK(e->NewSequence(&seq));
  std::vector<std::vector<float>> got;
  STRATA_ASSERT_OK(RunTeacherForced(*e, seq, prompt_, {}, &got));
  const KvCounters c = kv.counters();
  EXPECT_EQ(c.peak_staging_bytes, 0u);
  EXPECT_LE(c.peak_sequence_resident_bytes, c.budget_bytes);
  // Against exact attention over all keys (the memory policy), prefill only.
  EngineOptions m = Options();
  m.n_batch = 16;
  m.kv.policy = KvPolicyKind::kMemory;
  std::unique_ptr<Engine> me;
  STRATA_ASSERT_OK(Engine::Create(*model_, m, &me));
  SeqId ms;
  STRATA_ASSERT_OK(me->NewSequence(&ms));
  std::vector<std::vector<float>> want;
  STRATA_ASSERT_OK(RunTeacherForced(*me, ms, prompt_, {}, &want));
  EXPECT_LT(MaxRelativeDiff(got, want), 1e-4);
  // The engine's batch was clamped to what a pass can take; a larger pass is refused.
  EXPECT_LE(e->options().n_batch, kv.max_pass_tokens());
  ForwardBatch b;
  const std::vector<int32_t> big = TestTokens(kv.max_pass_tokens() + 1, hp.n_vocab, 7);
  b.Add(seq, kv.Length(seq), big);
  if (int64_t(big.size()) <= e->forward().max_tokens()) {
    std::vector<float> logits;
    const Status st = e->Evaluate(b, &logits);
    EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  }
}

// kv.experimental.read_through_span: the same number of groups read through, in spans of adjacent
// groups that travel in one request each, so the step issues fewer requests.
TEST_F(DiskKvTest, ReadThroughSpansIssueFewerRequests) {
  const HParams& hp = model_->hparams();
  auto run = [&](int32_t span, KvCounters* c) {
    EngineOptions o = Options();
    o.kv.disk.group_size = 2;
    o.kv.disk.reuse_slots = 8;
    o.kv.disk.read_through = 16;
    o.kv.disk.groups_per_step = 24;
    o.kv.disk.read_through_span = span;
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
    SeqId seq;
    STRATA_ASSERT_OK(e->NewSequence(&seq));
    GenerationRequest r;
    r.seq = seq;
    r.prompt = TestTokens(160, hp.n_vocab, 5);
    r.params.max_tokens = 48;
    r.params.ignore_eos = true;
    r.params.sampling.temperature = 0;
    GenerationStats st;
    STRATA_ASSERT_OK(e->Generate({&r, 1}, &st));
    *c = e->kv().counters();
  };
  KvCounters single, spans;
  run(1, &single);
  run(8, &spans);
  ASSERT_GT(single.read_through_groups, 0u);
  // Every step fills its read-through slots either way (the context holds far more groups).
  EXPECT_EQ(spans.groups_selected, single.groups_selected);
  EXPECT_GT(spans.read_through_groups, single.read_through_groups * 9 / 10);
  EXPECT_LT(spans.reads_issued * 3, single.reads_issued * 2)
      << "spans " << spans.reads_issued << " single " << single.reads_issued;
}

// Parameter: 0 no read-through, 1 read-through slots, 2 read-through in spans of 2.
class DiskKvBatchTest : public DiskKvTest, public ::testing::WithParamInterface<int> {};

// Several sequences in one pass give each the logits it gets alone, with or without
// read-through slots, single or in spans (each sequence has its own read-through buffers, and
// each worker selecting side by side its own scratch), refinement included.
TEST_P(DiskKvBatchTest, BatchDecodeMatchesSingleSequences) {
  UseLayers(4);
  EngineOptions o = Options();
  o.max_sequences = 3;
  o.kv.disk.groups_per_step = 5;
  if (GetParam() > 0) {
    o.kv.disk.reuse_slots = 2;
    o.kv.disk.read_through = 3;
    o.kv.disk.read_through_span = GetParam() == 2 ? 2 : 1;
  }
  const int32_t n_vocab = model_->hparams().n_vocab;
  std::vector<std::vector<int32_t>> prompts, decodes;
  std::vector<std::vector<std::vector<float>>> alone;
  for (uint32_t i = 0; i < 3; ++i) {
    prompts.push_back(TestTokens(60 + 17 * int32_t(i), n_vocab, 10 + i));
    decodes.push_back(TestTokens(30, n_vocab, 20 + i));
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
    SeqId s;
    STRATA_ASSERT_OK(e->NewSequence(&s));
    alone.emplace_back();
    STRATA_ASSERT_OK(RunTeacherForced(*e, s, prompts[i], decodes[i], &alone.back()));
  }
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  std::vector<SeqId> seqs(3);
  std::vector<float> logits;
  for (size_t i = 0; i < 3; ++i) {
    STRATA_ASSERT_OK(e->NewSequence(&seqs[i]));
    STRATA_ASSERT_OK(e->Prefill(seqs[i], prompts[i], &logits));
  }
  const uint64_t reads_before = e->kv().counters().reads_issued;
  ForwardBatch b;
  for (size_t step = 0; step < 30; ++step) {
    b.Clear();
    for (size_t i = 0; i < 3; ++i)
      b.Add(seqs[i], e->kv().Length(seqs[i]), std::span<const int32_t>(&decodes[i][step], 1));
    STRATA_ASSERT_OK(e->Evaluate(b, &logits));
    const size_t n_vocab_sz = size_t(n_vocab);
    for (size_t i = 0; i < 3; ++i) {
      std::vector<std::vector<float>> got{std::vector<float>(
          logits.begin() + i * n_vocab_sz, logits.begin() + (i + 1) * n_vocab_sz)};
      EXPECT_LT(MaxRelativeDiff(got, {alone[i][step + 1]}), 1e-5)
          << "seq " << i << " step " << step;
    }
  }
  EXPECT_GT(e->kv().counters().reads_issued, reads_before);
  EXPECT_EQ(e->kv().counters().read_through_groups > 0, GetParam() > 0);
}

INSTANTIATE_TEST_SUITE_P(ReadThrough, DiskKvBatchTest, ::testing::Values(0, 1, 2));

// The sequences' arenas (slots, rings, read-through buffers) are registered with the store
// for fixed-buffer reads, and re-registered at the next pass when sequences come and go.
TEST_F(DiskKvTest, ArenasAreRegisteredForFixedBufferReads) {
  EngineOptions o = Options();
  o.max_sequences = 2;
  o.kv.disk.groups_per_step = 5;
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  auto& kv = static_cast<DiskKv&>(e->kv());
  EXPECT_EQ(kv.store().registered_bytes(), 0u);
  std::vector<float> logits;
  SeqId a, b;
  STRATA_ASSERT_OK(e->NewSequence(&a));
  STRATA_ASSERT_OK(e->Prefill(a, prompt_, &logits));
  const uint64_t one = kv.store().registered_bytes();
  EXPECT_GT(one, 0u);
  STRATA_ASSERT_OK(e->NewSequence(&b));
  STRATA_ASSERT_OK(e->Prefill(b, prompt_, &logits));
  EXPECT_EQ(kv.store().registered_bytes(), 2 * one);
  STRATA_ASSERT_OK(e->RemoveSequence(a));
  ForwardBatch batch;
  batch.Add(b, kv.Length(b), std::span<const int32_t>(&decode_[0], 1));
  STRATA_ASSERT_OK(e->Evaluate(batch, &logits));
  EXPECT_EQ(kv.store().registered_bytes(), one);
}

// The KV store is an unnamed file where the filesystem allows (it cannot outlive the
// process): removing its directory mid-run changes nothing, the run goes on. Where the store
// has a name (filesystems without O_TMPFILE), losing it is an error naming the directory.
TEST_F(DiskKvTest, RemovingTheKvDirectoryMidRunKeepsAnUnnamedStoreOrIsAnError) {
  for (const bool named : {false, true}) {
    SCOPED_TRACE(named ? "named store" : "unnamed store");
    if (named) setenv("STRATA_STORAGE_FORCE_FALLBACK", "tmpfile", 1);
    auto gone = std::make_unique<KvTempDir>();
    EngineOptions o = DiskEngineOptions(gone->path(), adapters_, kCtx);
    std::unique_ptr<Engine> e;
    STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
    unsetenv("STRATA_STORAGE_FORCE_FALLBACK");
    SeqId seq;
    STRATA_ASSERT_OK(e->NewSequence(&seq));
    std::vector<float> logits;
    STRATA_ASSERT_OK(e->Prefill(seq, prompt_, &logits));
    const std::string dir = gone->path();
    gone.reset();
    ASSERT_FALSE(std::filesystem::exists(dir));
    ForwardBatch b;
    b.Add(seq, e->kv().Length(seq), std::span<const int32_t>(&decode_[0], 1));
    Status st = e->Evaluate(b, &logits);
    if (!named) {
      STRATA_ASSERT_OK(st);
      continue;
    }
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    EXPECT_NE(st.message().find(dir), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("removed"), std::string::npos) << st.message();
    // It stays an error rather than attending to a cache that no longer exists.
    EXPECT_FALSE(e->Evaluate(b, &logits).ok());
  }
}

TEST_F(DiskKvTest, FullDiskIsAnErrorAndTheSequenceKeepsItsState) {
  auto faults = std::make_shared<storage::FaultInjector>();
  EngineOptions o = Options();
  o.kv.hooks.faults = faults;
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  SeqId seq;
  STRATA_ASSERT_OK(e->NewSequence(&seq));
  std::vector<float> logits;
  const std::vector<int32_t> first(prompt_.begin(), prompt_.begin() + 64);
  STRATA_ASSERT_OK(e->Prefill(seq, first, &logits));
  storage::FaultRule full = storage::FaultRule::NoSpace();
  full.times = 0;
  faults->Add(full);
  const std::vector<int32_t> more(prompt_.begin() + 64, prompt_.end());
  Status st = e->Prefill(seq, more, &logits);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(kv_dir_.path()), std::string::npos) << st.message();
  EXPECT_EQ(e->kv().Length(seq), 64);
  // Space again: the sequence continues from where it was and matches full KV.
  faults->Clear();
  STRATA_ASSERT_OK(e->Prefill(seq, more, &logits));
  std::vector<std::vector<float>> got{logits};
  std::vector<std::vector<float>> ref = Reference();
  EXPECT_LT(MaxRelativeDiff(got, {ref[0]}), 1e-4);
}

TEST_F(DiskKvTest, FailedReadsAreErrorsAndLeaveNoStaleSlots) {
  auto faults = std::make_shared<storage::FaultInjector>();
  EngineOptions o = Options();
  o.kv.hooks.faults = faults;
  o.kv.disk.groups_per_step = (kCtx + 3) / 4;
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  SeqId seq;
  STRATA_ASSERT_OK(e->NewSequence(&seq));
  std::vector<std::vector<float>> got;
  std::vector<float> logits;
  STRATA_ASSERT_OK(e->Prefill(seq, prompt_, &logits));
  got.push_back(logits);
  faults->Add(storage::FaultRule::Eio(storage::IoKind::kRead));
  ForwardBatch b;
  b.Add(seq, e->kv().Length(seq), std::span<const int32_t>(&decode_[0], 1));
  Status st = e->Evaluate(b, &logits);
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_EQ(e->kv().Length(seq), int32_t(prompt_.size()));
  // The next attempt reloads what failed and gets the exact result.
  for (int32_t tok : decode_) {
    b.Clear();
    b.Add(seq, e->kv().Length(seq), std::span<const int32_t>(&tok, 1));
    STRATA_ASSERT_OK(e->Evaluate(b, &logits));
    got.push_back(logits);
  }
  EXPECT_LT(MaxRelativeDiff(got, Reference()), 1e-4);
}

TEST_F(DiskKvTest, BudgetBelowTheMinimumSaysWhatTheMinimumIs) {
  EngineOptions o = Options();
  o.kv.disk.budget_bytes = 1000;
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(*model_, o, &e);
  ASSERT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  const std::string& m = st.message();
  EXPECT_NE(m.find("1000 bytes"), std::string::npos) << m;
  const size_t at = m.find("minimum of ");
  ASSERT_NE(at, std::string::npos) << m;
  const int64_t minimum = std::stoll(m.substr(at + 11));
  // The minimum it names is exactly what it accepts.
  o.kv.disk.budget_bytes = minimum - 1;
  EXPECT_EQ(Engine::Create(*model_, o, &e).code(), Status::Code::kResourceExhausted);
  o.kv.disk.budget_bytes = minimum;
  STRATA_ASSERT_OK(Engine::Create(*model_, o, &e));
  EXPECT_EQ(static_cast<DiskKv&>(e->kv()).plan().groups_per_step, 1);
}

TEST_F(DiskKvTest, OutOfRangeParametersNameValueAndLimit) {
  struct Case {
    void (*set)(DiskKvOptions*);
    const char* expect;
  };
  const Case cases[] = {
      {[](DiskKvOptions* d) { d->group_size = -1; },
       "kv.group_size (G) = -1 is out of range [0, 64]"},
      {[](DiskKvOptions* d) { d->group_size = 65; },
       "kv.group_size (G) = 65 is out of range [0, 64]"},
      {[](DiskKvOptions* d) { d->groups_per_step = 65; },
       "kv.groups_per_step (M) = 65 is out of range [1, 64]"},
      {[](DiskKvOptions* d) { d->groups_per_step = -1; }, "kv.groups_per_step (M) = -1"},
      {[](DiskKvOptions* d) {
         d->groups_per_step = 10;
         d->reuse_slots = 5;
       },
       "kv.reuse_slots (C) = 5 must be at least M = 10"},
      {[](DiskKvOptions* d) { d->ratio = 3; }, "kv.ratio = 3 is not in adapters"},
      {[](DiskKvOptions* d) { d->ratio = 33; }, "ratio 33 is out of range [1, 32]"},
      {[](DiskKvOptions* d) { d->backend = "spdk"; }, "kv.backend = 'spdk'"},
  };
  for (const Case& c : cases) {
    EngineOptions o = Options();
    c.set(&o.kv.disk);
    std::unique_ptr<Engine> e;
    Status st = Engine::Create(*model_, o, &e);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.ToString();
  }
}

TEST_F(DiskKvTest, AdaptersOfAnotherModelOrDamagedAreRefused) {
  SyntheticModelSpec other;
  other.seed = 7;
  std::unique_ptr<Model> m2;
  STRATA_ASSERT_OK(testing::LoadSyntheticModel(other, dir_.path(), "other", &m2));
  const std::string foreign = dir_.path() + "/other.adapters";
  STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*m2, {4}, foreign));
  EngineOptions o = Options();
  o.kv.disk.adapters = foreign;
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(*model_, o, &e);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("were made for model identity " + m2->identity_hex()),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(model_->identity_hex()), std::string::npos) << st.message();

  std::string bytes;
  {
    std::ifstream in(adapters_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string damaged = dir_.path() + "/damaged.adapters";
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(damaged, std::ios::binary) << bytes;
  o.kv.disk.adapters = damaged;
  st = Engine::Create(*model_, o, &e);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.message();

  o.kv.disk.adapters = dir_.path() + "/missing.adapters";
  st = Engine::Create(*model_, o, &e);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("strata calibrate"), std::string::npos) << st.message();
}

TEST_F(DiskKvTest, MissingKvDirectoryIsAnError) {
  EngineOptions o = Options();
  o.kv.disk.dir = kv_dir_.path() + "/does/not/exist";
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(*model_, o, &e);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(o.kv.disk.dir), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace strata
