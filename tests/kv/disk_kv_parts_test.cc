// The disk KV policy's parts alone, without an engine: the record store and arenas
// (DiskKvStore), the decode view's walk (disk_kv_view.h) and the selection (DiskKvSelector).
#include <algorithm>
#include <cstring>
#include <memory>

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_select.h"
#include "runtime/kv/disk/disk_kv_store.h"
#include "runtime/kv/disk/disk_kv_view.h"
#include "storage/fault_injection.h"
#include "tests/kv/disk_kv_test_util.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

using disk_kv::Layer;
using disk_kv::Sequence;
using testing::KvTempDir;

const KvShape kShape{2, 2, 32, 256};  // 2 layers, 2 KV heads of 32, 256 tokens

DiskKvOptions PartsOptions(const std::string& dir) {
  DiskKvOptions o;
  o.dir = dir;
  o.group_size = 4;
  o.record_type = KvRecordType::kF16;
  o.budget_bytes = int64_t(8) << 20;
  o.reuse_slots = 16;
  o.groups_per_step = 8;
  o.read_through = 0;
  return o;
}

class DiskKvStoreTest : public ::testing::Test {
 protected:
  void Open(int32_t max_sequences) {
    STRATA_ASSERT_OK(DiskKvStore::ProbeBlockSize(options_, &block_));
    STRATA_ASSERT_OK(PlanDiskKv(kShape, options_, block_, &plan_));
    STRATA_ASSERT_OK(
        DiskKvStore::Open(options_, plan_, kShape, max_sequences, block_, &c_, &store_, hooks_));
  }
  // Writes group g of `layer` in s's region as a record of bytes (g + 1).
  void WriteRecord(const Sequence& s, int32_t layer, int32_t g) {
    storage::AlignedBuffer b;
    STRATA_ASSERT_OK(storage::AlignedBuffer::Allocate(plan_.layout.record_bytes, block_, &b));
    std::memset(b.data(), g + 1, b.size());
    STRATA_ASSERT_OK(store_->block_store().Write(plan_.layout.Offset(s.region, layer, g), b.data(),
                                                 plan_.layout.record_bytes));
  }
  bool SlotHolds(const Sequence& s, int32_t layer, int32_t slot, int32_t g) {
    const std::byte* r = s.SlotRecord(layer, slot);
    for (uint32_t i = 0; i < plan_.layout.record_bytes; ++i)
      if (r[i] != std::byte(g + 1)) return false;
    return true;
  }

  KvTempDir dir_;
  DiskKvOptions options_ = PartsOptions(dir_.path());
  DiskKvHooks hooks_;
  uint32_t block_ = 0;
  DiskKvPlan plan_;
  KvCounters c_;
  std::unique_ptr<DiskKvStore> store_;
};

// One region a sequence; the arenas are disjoint and carved as the plan says; a released
// region is taken again.
TEST_F(DiskKvStoreTest, SequencesTakeRegionsAndArenasAsPlanned) {
  Open(2);
  std::unique_ptr<Sequence> a, b, c;
  STRATA_ASSERT_OK(store_->NewSequence(4, &a));
  STRATA_ASSERT_OK(store_->NewSequence(4, &b));
  EXPECT_NE(a->region, b->region);
  Status st = store_->NewSequence(4, &c);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("the limit is 2"), std::string::npos) << st.ToString();
  const std::byte* a0 = a->arena.data();
  const std::byte* b0 = b->arena.data();
  EXPECT_TRUE(a0 + a->arena.size() <= b0 || b0 + b->arena.size() <= a0);
  const uint32_t rec = plan_.layout.record_bytes;
  for (int32_t l = 0; l < kShape.n_layer; ++l) {
    const Layer& L = a->layers[size_t(l)];
    EXPECT_EQ(L.reuse.capacity(), plan_.layer_slots[size_t(l)]);
    // Slots in the pool, ring / sink / write records after it, all inside the arena.
    EXPECT_GE(L.slots, a0);
    EXPECT_LE(L.slots + size_t(L.reuse.capacity()) * rec, a0 + a->pool_bytes);
    EXPECT_GE(L.ring, a0 + a->pool_bytes);
    EXPECT_EQ(L.sink, L.ring + size_t(plan_.ring_records()) * rec);
    EXPECT_EQ(L.write, L.sink + size_t(plan_.sink_groups) * rec);
    EXPECT_LE(L.write + rec, a0 + a->arena.size());
    EXPECT_EQ(L.tail_ratio.size(), plan_.tail ? 4u : 0u);
  }
  const int32_t region = b->region;
  store_->ReleaseSequence(*b);
  b.reset();
  STRATA_ASSERT_OK(store_->NewSequence(4, &c));
  EXPECT_EQ(c->region, region);
}

// A store that cannot be opened is an error naming the directory, not a crash.
TEST_F(DiskKvStoreTest, AStoreThatCannotOpenNamesItsDirectory) {
  STRATA_ASSERT_OK(DiskKvStore::ProbeBlockSize(options_, &block_));
  STRATA_ASSERT_OK(PlanDiskKv(kShape, options_, block_, &plan_));
  options_.dir = dir_.path() + "/gone";
  Status st = DiskKvStore::Open(options_, plan_, kShape, 1, block_, &c_, &store_);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(options_.dir), std::string::npos) << st.ToString();
  EXPECT_EQ(store_, nullptr);
}

// Placements that need a load become reads into their slots, groups adjacent on disk and in
// the slots as one request; what lands is the group's record; counters say so.
TEST_F(DiskKvStoreTest, LoadsCoalesceAndLandInTheirSlots) {
  Open(1);
  std::unique_ptr<Sequence> s;
  STRATA_ASSERT_OK(store_->NewSequence(4, &s));
  const int32_t layer = 1;
  for (int32_t g : {3, 4, 5, 9}) WriteRecord(*s, layer, g);
  Layer& L = s->layers[size_t(layer)];
  const std::vector<int32_t> selected = {3, 4, 5, 9};
  L.reuse.Resolve(selected, &L.placed);
  ASSERT_EQ(L.placed.size(), 4u);
  size_t runs = 0;
  for (size_t i = 0; i < L.placed.size(); ++i)
    if (i == 0 || L.placed[i].group != L.placed[i - 1].group + 1 ||
        L.placed[i].slot != L.placed[i - 1].slot + 1)
      ++runs;
  const size_t batch = DiskKvStore::GuessReads(layer);
  store_->AddLoads(layer, *s, batch, /*first=*/true);
  EXPECT_EQ(store_->reads(batch).size(), runs);
  EXPECT_LT(runs, 4u);  // 3, 4, 5 go to adjacent empty slots
  STRATA_ASSERT_OK(store_->SubmitReads(layer, batch));
  EXPECT_FALSE(store_->settled(batch));
  STRATA_ASSERT_OK(store_->SettleLayer(layer));
  EXPECT_TRUE(store_->settled(batch));
  for (const ReuseBuffer::Placement& p : L.placed)
    EXPECT_TRUE(SlotHolds(*s, layer, p.slot, p.group)) << "group " << p.group;
  EXPECT_EQ(c_.reads_issued, runs);
  EXPECT_EQ(c_.bytes_read, 4u * plan_.layout.record_bytes);
  EXPECT_EQ(c_.groups_selected, 4u);
  EXPECT_EQ(c_.reuse_hits, 0u);
  // The same selection again: all hits, nothing to read.
  store_->reads(batch).Clear();
  L.reuse.Resolve(selected, &L.placed);
  store_->AddLoads(layer, *s, batch, /*first=*/true);
  EXPECT_TRUE(store_->reads(batch).empty());
  EXPECT_EQ(c_.reuse_hits, 4u);
}

// A failed read is an error naming the layer, and its slots are forgotten (never attended
// with stale bytes); a failed group write marks the sequence lost.
TEST_F(DiskKvStoreTest, FailedReadsForgetTheirSlotsAndFailedWritesLoseTheSequence) {
  auto faults = std::make_shared<storage::FaultInjector>();
  hooks_.faults = faults;
  Open(1);
  std::unique_ptr<Sequence> s;
  STRATA_ASSERT_OK(store_->NewSequence(4, &s));
  s->id = 7;
  Layer& L = s->layers[0];
  const std::vector<int32_t> selected = {10, 20};
  L.reuse.Resolve(selected, &L.placed);
  const size_t batch = DiskKvStore::GuessReads(0);
  store_->AddLoads(0, *s, batch, true);
  // The first of the two reads fails: its slot is forgotten, the other one's kept.
  faults->Add(storage::FaultRule::Eio(storage::IoKind::kRead));
  STRATA_ASSERT_OK(store_->SubmitReads(0, batch));
  Status st = store_->SettleLayer(0);
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("layer 0"), std::string::npos) << st.ToString();
  ASSERT_EQ(store_->reads(batch).size(), 2u);
  int32_t held = 0;
  for (int32_t slot = 0; slot < L.reuse.size(); ++slot) held += L.reuse.group_of(slot) >= 0;
  EXPECT_EQ(held, 1);
  EXPECT_EQ(faults->fired(), 1u);
  faults->Clear();

  // Decode writes: one record, written at the step's end and checked at the next start.
  std::memset(L.write, 0x5a, plan_.layout.record_bytes);
  L.write_group = 2;
  Sequence* batch_seqs[] = {s.get()};
  STRATA_ASSERT_OK(store_->SubmitDecodeWrites(batch_seqs));
  EXPECT_EQ(L.write_group, -1);
  STRATA_ASSERT_OK(store_->SettleDecodeWrites());
  EXPECT_EQ(c_.write_requests, 1u);
  EXPECT_TRUE(s->lost.ok());
  faults->Add(storage::FaultRule::Eio(storage::IoKind::kWrite));
  L.write_group = 3;
  STRATA_ASSERT_OK(store_->SubmitDecodeWrites(batch_seqs));
  EXPECT_FALSE(store_->SettleDecodeWrites().ok());
  EXPECT_FALSE(s->lost.ok());
  EXPECT_NE(s->lost.message().find("sequence 7"), std::string::npos) << s->lost.ToString();
}

// The decode view walks sink, selection, resident groups (kv.experimental.attend_resident) and
// ring, and its spans cover exactly those tokens.
TEST_F(DiskKvStoreTest, DecodeViewWalksSinkSelectionResidentAndRing) {
  options_.recent_groups = 1;
  Open(1);
  std::unique_ptr<Sequence> s;
  STRATA_ASSERT_OK(store_->NewSequence(4, &s));
  const int32_t G = plan_.layout.group_size;
  s->length = 10 * G + 2;  // groups 0..9 full, the new token is the third of group 10
  Layer& L = s->layers[1];
  const std::vector<int32_t> earlier = {2}, now = {3, 5};
  L.reuse.Resolve(earlier, &L.placed);
  L.reuse.Resolve(now, &L.placed);
  struct Step {
    disk_kv::Viewed kind;
    int32_t group, tokens;
  };
  auto walk = [&](bool resident) {
    std::vector<Step> steps;
    disk_kv::ForEachViewed(plan_, resident, L, s->length,
                           [&](disk_kv::Viewed k, int32_t g, int32_t, int32_t n) {
                             steps.push_back({k, g, n});
                           });
    return steps;
  };
  using V = disk_kv::Viewed;
  const std::vector<Step> want = {{V::kSink, 0, G},     {V::kSlot, 3, G}, {V::kSlot, 5, G},
                                  {V::kResident, 2, G}, {V::kRing, 9, G}, {V::kRing, 10, 3}};
  const std::vector<Step> got = walk(true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kind, want[i].kind) << i;
    EXPECT_EQ(got[i].group, want[i].group) << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  }
  EXPECT_EQ(walk(false).size(), want.size() - 1);  // without the resident group

  s->pending = 1;
  EXPECT_EQ(disk_kv::AssembleDecodeView(plan_, true, *s, 1), 1);
  ASSERT_EQ(L.view.size(), want.size());
  int32_t tokens = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(L.view[i].pos0, want[i].group * G) << i;
    tokens += L.view[i].n_tokens;
  }
  EXPECT_EQ(tokens, 5 * G + 3);
}

// The selector picks M groups among those between the sink and the ring for each decoding
// sequence (not the exact ones), places them, and the same query again hits them all.
TEST(DiskKvSelectorTest, SelectsAndPlacesForDecodingSequencesOnly) {
  KvTempDir dir, kv_dir;
  std::unique_ptr<Model> model;
  SyntheticModelSpec spec;
  STRATA_ASSERT_OK(testing::LoadSyntheticModel(spec, dir.path(), "m", &model));
  const std::string path = dir.path() + "/m.adapters";
  STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*model, {1, 2, 4}, path));
  Adapters adapters;
  STRATA_ASSERT_OK(Adapters::Read(path, &adapters));
  const HParams& hp = model->hparams();
  const KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, 256};
  DiskKvOptions o = PartsOptions(kv_dir.path());
  o.ratio = 2;
  uint32_t block = 0;
  STRATA_ASSERT_OK(DiskKvStore::ProbeBlockSize(o, &block));
  DiskKvPlan plan;
  STRATA_ASSERT_OK(PlanDiskKv(shape, o, block, &plan, nullptr, {}, hp.n_head));
  KvCounters c;
  std::unique_ptr<DiskKvStore> store;
  STRATA_ASSERT_OK(DiskKvStore::Open(o, plan, shape, 2, block, &c, &store));
  ThreadPool pool(2);
  std::unique_ptr<DiskKvSelector> sel;
  STRATA_ASSERT_OK(
      DiskKvSelector::Create(*model, *adapters.Find(plan.ratio), o, plan, 256, 2, &pool, &sel));

  std::unique_ptr<Sequence> decoding, exact;
  STRATA_ASSERT_OK(store->NewSequence(hp.n_head, &decoding));
  STRATA_ASSERT_OK(store->NewSequence(hp.n_head, &exact));
  const int32_t G = plan.layout.group_size, n_tok = 50 * G;
  std::vector<float> k(size_t(n_tok) * shape.row());
  for (size_t i = 0; i < k.size(); ++i) k[i] = float((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  for (int32_t l = 0; l < shape.n_layer; ++l)
    sel->SummarizeKeys(l, k.data(), n_tok, 0, decoding->layers[size_t(l)]);
  decoding->length = n_tok;
  exact->exact = true;
  exact->row = 1;
  std::vector<float> x(size_t(2) * hp.n_embd);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 3.0f;
  Sequence* batch[] = {decoding.get(), exact.get()};
  const int32_t layer = 1;
  std::vector<Sequence*> chosen;
  sel->Select(layer, x.data(), hp.n_embd, batch, /*refining=*/false, &chosen);
  ASSERT_EQ(chosen.size(), 1u);
  EXPECT_EQ(chosen[0], decoding.get());
  const Layer& L = decoding->layers[size_t(layer)];
  const int32_t m = plan.layer_groups[size_t(layer)];
  ASSERT_EQ(int32_t(L.selected.size()), m);
  EXPECT_TRUE(std::is_sorted(L.selected.begin(), L.selected.end()));
  EXPECT_EQ(std::adjacent_find(L.selected.begin(), L.selected.end()), L.selected.end());
  for (int32_t g : L.selected) {
    EXPECT_GE(g, plan.sink_groups);
    EXPECT_LT(g, 50 - plan.recent_groups);
  }
  ASSERT_EQ(L.placed.size(), L.selected.size());
  for (const ReuseBuffer::Placement& p : L.placed) EXPECT_TRUE(p.load);
  EXPECT_TRUE(exact->layers[size_t(layer)].placed.empty());
  const std::vector<int32_t> first = L.selected;
  chosen.clear();
  sel->Select(layer, x.data(), hp.n_embd, batch, /*refining=*/true, &chosen);
  EXPECT_EQ(L.selected, first);
  for (const ReuseBuffer::Placement& p : L.placed) EXPECT_FALSE(p.load);
}

}  // namespace
}  // namespace strata
