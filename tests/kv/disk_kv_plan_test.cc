// DiskKvPlan: the per-sequence memory plan against the numbers of SmolLM2-135M (30 layers,
// 3 KV heads x 64 dims) at 8K context, and its refusals.
#include "runtime/kv/disk/disk_kv_plan.h"

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

namespace strata {
namespace {

const KvShape kSmol{30, 3, 64, 8192};

TEST(DiskKvPlanTest, DefaultBudgetIsOneThirteenthAndFillsTheSlots) {
  DiskKvOptions o;  // G auto, sigma=4 in Q4, budget 0 = full/13, record type auto = Q8_0 here
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.full_cache_bytes, uint64_t(30) * 8192 * 192 * 4);
  EXPECT_EQ(p.budget_bytes, p.full_cache_bytes / 13);
  EXPECT_EQ(p.layout.type, kernels::KvType::kQ8_0);
  EXPECT_EQ(p.layout.group_size, 5);         // fills the block best (see below)
  EXPECT_EQ(p.layout.payload_bytes, 2040u);  // 5 tokens x 6 blocks of 34 bytes x K,V
  EXPECT_EQ(p.layout.record_bytes, 2048u);
  EXPECT_EQ(p.rank, 48);
  EXPECT_EQ(p.ratio, 4);  // kv.ratio 0: the summary fits in half of this budget at sigma 4
  EXPECT_TRUE(p.ratio_auto);
  EXPECT_NE(p.Describe().find("sigma=4 (auto, rank 48, q4)"), std::string::npos) << p.Describe();
  EXPECT_EQ(p.summary_type, KeySummaryType::kQ4);
  EXPECT_EQ(p.klr_bytes, uint64_t(30) * 8192 * 26);  // 24 bytes of nibbles + an F16 scale
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  // M left at 0 is C: every slot chosen afresh each step (122 groups of 5 tokens a layer;
  // 123 without kv.experimental.attend_tail's tables, below).
  EXPECT_EQ(p.groups_per_step, p.reuse_slots);
  EXPECT_EQ(p.reuse_slots, 122);
  EXPECT_TRUE(p.tail);
  // Nothing more fits: one more slot per layer would break the budget.
  EXPECT_GT(p.total_bytes() + uint64_t(30) * 2048, p.budget_bytes);
}

// kv.experimental.attend_tail's tables (each layer's value sums and mean, and a share per query
// head) are part of the budget; the tail needs per-head scores of a per-token summary and is off
// otherwise, leaving those bytes to the slots.
TEST(DiskKvPlanTest, TailTablesAreInTheBudget) {
  DiskKvOptions o;
  o.group_summary = AutoSwitch::kOff;
  DiskKvPlan on, off, sum, group;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &on, nullptr, {}, 9).ok());
  EXPECT_TRUE(on.tail);
  EXPECT_NE(on.Describe().find("kv.experimental.attend_tail"), std::string::npos) << on.Describe();
  o.attend_tail = false;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &off, nullptr, {}, 9).ok());
  EXPECT_FALSE(off.tail);
  EXPECT_EQ(off.Describe().find("kv.experimental.attend_tail"), std::string::npos)
      << off.Describe();
  const uint64_t tail_bytes = uint64_t(30) * (3 * 192 + 9) * sizeof(float);
  EXPECT_EQ(on.reuse_slots, 122);
  EXPECT_EQ(off.reuse_slots, 123);
  EXPECT_EQ(on.slot_bytes + 30 * 2048, off.slot_bytes);
  // The tables differ by the tail's and by one slot's table entries.
  EXPECT_GT(on.table_bytes, off.table_bytes + tail_bytes - 30 * 200);
  EXPECT_LT(on.table_bytes, off.table_bytes + tail_bytes);
  EXPECT_LE(on.total_bytes(), on.budget_bytes);
  o.attend_tail = true;
  o.scoring = GroupScoring::kSum;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &sum, nullptr, {}, 9).ok());
  EXPECT_FALSE(sum.tail);
  o.scoring = GroupScoring::kSoftmax;
  o.group_summary = AutoSwitch::kOn;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &group, nullptr, {}, 9).ok());
  EXPECT_FALSE(group.tail);
}

// Auto G: of 4..8, the G whose records fill the 512-byte blocks best, the smaller on a tie.
TEST(DiskKvPlanTest, AutoGroupSizeFillsTheBlocks) {
  // Q8_0: 408 bytes a token; 1632 of 2048 at G=4, 2040 of 2048 at G=5, 2448 of 2560 at G=6.
  EXPECT_EQ(AutoGroupSize(kSmol, 512, kernels::KvType::kQ8_0), 5);
  // F16: 768 bytes a token; G=4 fills 3072 exactly (as does G=8: the smaller wins).
  EXPECT_EQ(AutoGroupSize(kSmol, 512, kernels::KvType::kF16), 4);
  // 4 KiB blocks: 1632/4096, 2040/4096, ... 3264/4096 at G=8.
  EXPECT_EQ(AutoGroupSize(kSmol, 4096, kernels::KvType::kQ8_0), 8);
  DiskKvOptions o;
  o.record_type = KvRecordType::kF16;
  o.group_summary = AutoSwitch::kOff;  // per-token rows: F16's slots are tight at 1/13
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.layout.group_size, 4);
  EXPECT_LE(p.reuse_slots, 100);
  // Tight (fewer than 400 slot tokens): read-through groups make up 500 attended tokens.
  EXPECT_TRUE(p.tight);
  EXPECT_EQ(p.groups_per_step, 125);
  EXPECT_EQ(p.reuse_slots + p.transient_groups, 125);
}

// The same budget in F16 records: 3072 bytes per group, so fewer slots; Q8_0 buys 1.5x the
// slots here (2048-byte records after padding) and 1.9x where G fills the block (G=5).
TEST(DiskKvPlanTest, Q8RecordsHoldMoreGroupsInTheSameBudget) {
  DiskKvOptions o;
  o.group_size = 4;
  o.group_summary = AutoSwitch::kOff;  // the same summary in every plan here
  o.record_type = KvRecordType::kF16;
  DiskKvPlan f16, q8, q8_g5;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &f16).ok());
  EXPECT_EQ(f16.layout.type, kernels::KvType::kF16);
  EXPECT_EQ(f16.layout.record_bytes, 3072u);  // 4 tokens x 192 x K,V x 2 bytes
  o.record_type = KvRecordType::kQ8_0;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &q8).ok());
  EXPECT_GE(q8.reuse_slots * 2, f16.reuse_slots * 3 - 2);
  EXPECT_LE(q8.total_bytes(), q8.budget_bytes);
  o.group_size = 5;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &q8_g5).ok());
  EXPECT_EQ(q8_g5.layout.payload_bytes, 2040u);
  EXPECT_EQ(q8_g5.layout.record_bytes, 2048u);
  // Heads of 80 dims do not split into Q8_0 blocks: auto falls back to F16, q8_0 is refused.
  const KvShape odd{30, 3, 80, 8192};
  o = DiskKvOptions();
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(odd, o, 512, &p).ok());
  EXPECT_EQ(p.layout.type, kernels::KvType::kF16);
  o.record_type = KvRecordType::kQ8_0;
  const Status st = PlanDiskKv(odd, o, 512, &p);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("this model's is 80"), std::string::npos) << st.message();
}

// A Q8 key summary at sigma 8 (rank 24: 24 bytes and a 2-byte scale per token) costs 26/24
// of F16 at sigma 16, and the slots take what is left.
TEST(DiskKvPlanTest, Q8SummaryDoublesTheRankForAboutTheSameBytes) {
  DiskKvOptions o;
  o.group_summary = AutoSwitch::kOff;  // rows per token, as the sizes below count
  o.summary_type = KeySummaryType::kF16;
  o.ratio = 16;
  DiskKvPlan f16, q8;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &f16).ok());
  o.summary_type = KeySummaryType::kQ8;
  o.ratio = 8;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &q8).ok());
  EXPECT_EQ(q8.rank, 24);
  EXPECT_EQ(q8.summary_type, KeySummaryType::kQ8);
  EXPECT_EQ(q8.klr_bytes, uint64_t(30) * (8192 / 16) * (16 * 24 + 16 * 2));
  EXPECT_EQ(q8.klr_bytes * 24, f16.klr_bytes * 26);
  EXPECT_LE(q8.total_bytes(), q8.budget_bytes);
  EXPECT_GE(q8.reuse_slots, q8.groups_per_step);
  EXPECT_LT(q8.reuse_slots, f16.reuse_slots);  // the summary's extra bytes come from slots
  EXPECT_GT(q8.reuse_slots, f16.reuse_slots * 9 / 10);
  EXPECT_NE(q8.Describe().find("sigma=8 (rank 24, q8)"), std::string::npos) << q8.Describe();
  // F16 at sigma 8 takes 11.25 MiB of the 13.84 MiB budget: fewer than M slots are left.
  o.summary_type = KeySummaryType::kF16;
  DiskKvPlan f16_8;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &f16_8).ok());
  EXPECT_LT(f16_8.reuse_slots, q8.reuse_slots / 2);
}

// A profile where even layers concentrate their attention (nothing missed past 64 tokens)
// and odd layers spread it (the missed share falls slowly, with diminishing returns).
AttentionProfile TwoKindsOfLayers() {
  AttentionProfile prof;
  prof.tokens = AttentionProfile::DefaultTokens();
  for (int l = 0; l < 30; ++l) {
    std::vector<float> m;
    for (int32_t t : prof.tokens)
      m.push_back(l % 2 == 0 ? std::max(0.0f, 0.3f - 0.3f * float(t) / 64.0f)
                             : 0.6f * std::exp(-float(t) / 2048.0f));
    prof.error.push_back(m);
  }
  return prof;
}

TEST(DiskKvPlanTest, SpreadGroupsGivesWideLayersMoreWithinTheTotal) {
  const AttentionProfile prof = TwoKindsOfLayers();
  const std::vector<int32_t> g = SpreadGroups(prof, 30, 100, 4, 2048);
  ASSERT_EQ(g.size(), 30u);
  int64_t sum = 0;
  for (int l = 0; l < 30; ++l) {
    sum += g[size_t(l)];
    EXPECT_GE(g[size_t(l)], 25) << "layer " << l;  // the floor, M/4
    if (l % 2 == 0)
      EXPECT_EQ(g[size_t(l)], 25) << "layer " << l;  // 16 groups cover it
    else
      EXPECT_EQ(g[size_t(l)], 175) << "layer " << l;
  }
  EXPECT_EQ(sum, 30 * 100);
  // Capped by the groups a context holds.
  const std::vector<int32_t> capped = SpreadGroups(prof, 30, 100, 4, 120);
  for (int l = 1; l < 30; l += 2) EXPECT_EQ(capped[size_t(l)], 120);
}

TEST(DiskKvPlanTest, CalibratedLayersKeepTheBudgetAndSayTheSpread) {
  const AttentionProfile prof = TwoKindsOfLayers();
  DiskKvOptions o;
  o.groups_per_step = 80;  // C > M: both spread, each within its total
  DiskKvPlan uniform, spread;
  ASSERT_EQ(o.calibrated_layers, AutoSwitch::kAuto);  // on at tight budgets only
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &spread, &prof).ok());
  EXPECT_FALSE(spread.tight);
  EXPECT_FALSE(spread.calibrated);
  o.calibrated_layers = AutoSwitch::kOn;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &uniform).ok());
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &spread, &prof).ok());
  EXPECT_FALSE(uniform.calibrated);
  ASSERT_TRUE(spread.calibrated);
  EXPECT_EQ(spread.groups_per_step, uniform.groups_per_step);
  int64_t m = 0, c = 0;
  for (int l = 0; l < 30; ++l) {
    EXPECT_EQ(uniform.layer_groups[size_t(l)], uniform.groups_per_step);
    EXPECT_GE(spread.layer_slots[size_t(l)], spread.layer_groups[size_t(l)]);
    m += spread.layer_groups[size_t(l)];
    c += spread.layer_slots[size_t(l)];
  }
  EXPECT_EQ(m, 30 * int64_t(uniform.groups_per_step));
  EXPECT_EQ(c, 30 * int64_t(uniform.reuse_slots));
  EXPECT_GT(spread.layer_groups[1], spread.layer_groups[0]);
  EXPECT_GT(spread.layer_slots[1], spread.layer_slots[0]);
  EXPECT_LE(spread.total_bytes(), spread.budget_bytes);
  EXPECT_EQ(spread.total_bytes(), uniform.total_bytes());
  EXPECT_NE(spread.Describe().find("per layer (attention profile) M 20.."), std::string::npos)
      << spread.Describe();
  // Off by option.
  o.calibrated_layers = AutoSwitch::kOff;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &spread, &prof).ok());
  EXPECT_FALSE(spread.calibrated);
}

// A budget whose slots hold fewer than kTightSlotTokens tokens per layer is tight: the
// automatic kv.calibrated_layers spreads the slots over the layers there; explicit stays.
TEST(DiskKvPlanTest, TightBudgetsSpreadTheLayers) {
  const AttentionProfile prof = TwoKindsOfLayers();
  const int64_t full = int64_t(kSmol.n_layer) * kSmol.n_ctx * kSmol.row() * 4;
  DiskKvOptions o;
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());  // 1/13: 122 slots of 5 tokens
  EXPECT_FALSE(p.tight);
  EXPECT_FALSE(p.calibrated);
  EXPECT_NE(p.Describe().find("C=122 sink="), std::string::npos) << p.Describe();
  o.budget_bytes = full / 34;  // per token, sigma 16: 52 slots of 5 tokens
  o.group_summary = AutoSwitch::kOff;
  o.read_through = 0;  // (ReadThroughAtTightBudgets below)
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());
  EXPECT_TRUE(p.tight);
  EXPECT_LT(p.reuse_slots * p.layout.group_size, kTightSlotTokens);
  EXPECT_TRUE(p.calibrated);
  EXPECT_NE(p.Describe().find("C=51 (tight) sink="), std::string::npos) << p.Describe();
  // The default summary there is per group (61 slots), and the budget is as tight.
  o.group_summary = AutoSwitch::kAuto;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());
  EXPECT_TRUE(p.tight);
  EXPECT_TRUE(p.calibrated);
  EXPECT_NE(p.Describe().find("C=61 (tight) sink="), std::string::npos) << p.Describe();
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  // Without a profile the layers stay uniform, and the plan says why.
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_FALSE(p.calibrated);
  EXPECT_NE(p.Describe().find("no attention profile"), std::string::npos) << p.Describe();
  // An explicit setting wins over the tight default.
  o.calibrated_layers = AutoSwitch::kOff;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());
  EXPECT_TRUE(p.tight);
  EXPECT_FALSE(p.calibrated);
}

// M left at 0 follows C, whether C is what the budget affords or set; a set M stays.
TEST(DiskKvPlanTest, DefaultMIsEverySlot) {
  DiskKvOptions o;
  o.reuse_slots = 90;
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.reuse_slots, 90);
  EXPECT_EQ(p.groups_per_step, 90);
  o.reuse_slots = 0;
  o.groups_per_step = 80;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.groups_per_step, 80);
  EXPECT_GT(p.reuse_slots, 80);  // the rest of the budget: stale picks, attended at no I/O
  // A tight budget: M = C shrinks with it, and the plan still fits.
  o.groups_per_step = 0;
  o.ratio = 16;
  o.read_through = 0;
  o.budget_bytes = int64_t(kSmol.n_layer) * kSmol.n_ctx * kSmol.row() * 4 / 34;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.groups_per_step, p.reuse_slots);
  EXPECT_GT(p.reuse_slots, 40);
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  EXPECT_GT(p.total_bytes() + uint64_t(30) * 2048, p.budget_bytes);
}

// kv.ratio 0: the smallest ratio the adapters hold whose Q4 summary takes at most half the
// budget. Per token and layer the summary takes 26 bytes at sigma 4, 14 at 8, 8 at 16 and 5
// at 32 (6.09, 3.28, 1.88 and 1.17 MiB at 8K).
TEST(DiskKvPlanTest, AutoRatioFollowsTheBudget) {
  const int64_t full = int64_t(kSmol.n_layer) * kSmol.n_ctx * kSmol.row() * 4;
  struct Case {
    int64_t divisor;
    int32_t ratio;
  };
  // 1/80: even sigma 32 takes more than half (1.17 of 2.25 MiB); the largest is taken and
  // the rest still affords slots.
  for (const Case c : {Case{13, 4}, Case{20, 8}, Case{34, 16}, Case{50, 32}, Case{80, 32}}) {
    DiskKvOptions o;
    o.group_summary = AutoSwitch::kOff;  // per-token rows (per group: GroupSummary... below)
    o.budget_bytes = full / c.divisor;
    EXPECT_EQ(AutoRatio(kSmol, o), c.ratio) << "1/" << c.divisor;
    DiskKvPlan p;
    ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok()) << "1/" << c.divisor;
    EXPECT_EQ(p.ratio, c.ratio) << "1/" << c.divisor;
    EXPECT_EQ(p.rank, 192 / c.ratio);
    EXPECT_LE(p.total_bytes(), p.budget_bytes);
    EXPECT_GE(p.reuse_slots, 10) << "1/" << c.divisor;
    if (c.divisor < 80) {
      EXPECT_LE(p.klr_bytes * 2, p.budget_bytes) << "1/" << c.divisor;
    }
  }
  // Only what the adapters hold is chosen.
  DiskKvOptions o;
  const int32_t held[] = {16, 8};
  EXPECT_EQ(AutoRatio(kSmol, o, held), 8);
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, nullptr, held).ok());
  EXPECT_EQ(p.ratio, 8);
  // An explicit ratio is kept, even where the automatic choice would differ.
  o.ratio = 16;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, nullptr, held).ok());
  EXPECT_EQ(p.ratio, 16);
  EXPECT_FALSE(p.ratio_auto);
}

// kv.group_summary: one K_lr row per group instead of per token. Auto takes it where the
// per-token plan is tight (1/34 here), where the 5x smaller summary buys slots; at 1/13 the
// per-token summary stays. Rows are the context's complete groups (8192 / 5 = 1638, tiled
// to 1648), 26 bytes each at sigma 4 in Q4, and an F16 spread per row.
TEST(DiskKvPlanTest, GroupSummaryAtTightBudgets) {
  const int64_t full = int64_t(kSmol.n_layer) * kSmol.n_ctx * kSmol.row() * 4;
  DiskKvOptions o;
  DiskKvPlan p13, p34, token34, group13;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p13).ok());
  EXPECT_FALSE(p13.group_summary);
  EXPECT_EQ(p13.reuse_slots, 122);
  EXPECT_EQ(p13.Describe().find("per group"), std::string::npos) << p13.Describe();
  o.budget_bytes = full / 34;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p34).ok());
  EXPECT_TRUE(p34.group_summary);
  EXPECT_TRUE(p34.group_summary_auto);
  EXPECT_TRUE(p34.tight);
  EXPECT_EQ(p34.ratio, 4);  // sigma 4 per group takes 1.32 of the 5.29 MiB
  EXPECT_EQ(AutoRatio(kSmol, o, {}, 5), 4);
  EXPECT_EQ(p34.SummaryRows(8192), 1638);
  EXPECT_EQ(p34.summary_group_size(), 1);
  EXPECT_EQ(p34.klr_bytes, uint64_t(30) * 1648 * (26 + 2));  // rows and their F16 spreads
  EXPECT_LE(p34.total_bytes(), p34.budget_bytes);
  EXPECT_NE(p34.Describe().find("sigma=4 (auto, rank 48, q4, a row per group) M=100 C=56 T=44"),
            std::string::npos)
      << p34.Describe();
  o.group_summary = AutoSwitch::kOff;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &token34).ok());
  EXPECT_FALSE(token34.group_summary);
  EXPECT_EQ(token34.ratio, 16);
  EXPECT_EQ(token34.summary_group_size(), 5);
  EXPECT_LT(token34.reuse_slots, p34.reuse_slots);  // 52 slots
  // Forced on at 1/13: the summary is a fifth of sigma 4's per-token one.
  o.budget_bytes = 0;
  o.group_summary = AutoSwitch::kOn;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &group13).ok());
  EXPECT_TRUE(group13.group_summary);
  EXPECT_FALSE(group13.group_summary_auto);
  EXPECT_EQ(group13.ratio, 4);
  EXPECT_GT(group13.reuse_slots, p13.reuse_slots + 70);
  // At 1/80 sigma 4 per group takes more than half: sigma 8 (14 bytes a row).
  o.group_summary = AutoSwitch::kAuto;
  o.budget_bytes = full / 80;
  EXPECT_EQ(AutoRatio(kSmol, o, {}, 5), 8);
}

// kv.read_through: a tight budget attends more groups than it keeps. Auto adds the fewest
// read-through slots T (two records each, shared by the layers) for M*G >= 500 tokens and
// no more than C; every layer's M_l fits in its C_l + T; 1/13 is not tight and has none.
TEST(DiskKvPlanTest, ReadThroughAtTightBudgets) {
  const int64_t full = int64_t(kSmol.n_layer) * kSmol.n_ctx * kSmol.row() * 4;
  DiskKvOptions o;
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.transient_groups, 0);
  EXPECT_EQ(p.transient_bytes, 0u);
  EXPECT_EQ(p.Describe().find("read-through,"), std::string::npos) << p.Describe();
  o.budget_bytes = full / 34;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_TRUE(p.transient_auto);
  EXPECT_EQ(p.groups_per_step, 100);  // 500 tokens of 5
  EXPECT_EQ(p.reuse_slots + p.transient_groups, 100);
  EXPECT_LE(p.transient_groups, p.reuse_slots);
  EXPECT_EQ(p.transient_bytes, uint64_t(2) * uint64_t(p.transient_groups) * 2048);
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  DiskKvOptions none = o;
  none.read_through = 0;
  DiskKvPlan p0;
  ASSERT_TRUE(PlanDiskKv(kSmol, none, 512, &p0).ok());
  EXPECT_EQ(p0.groups_per_step, 61);  // every slot, and only the slots
  EXPECT_EQ(p0.reuse_slots, 61);
  EXPECT_GT(p0.reuse_slots, p.reuse_slots);  // the buffers cost a few slots
  // Spread over the layers by a profile: each layer's selection fits its slots plus T, and
  // the totals stay within L*M and L*C.
  const AttentionProfile prof = TwoKindsOfLayers();
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());
  EXPECT_TRUE(p.calibrated);
  EXPECT_GT(p.transient_groups, 0);
  int64_t m = 0, c = 0;
  for (size_t l = 0; l < 30; ++l) {
    EXPECT_LE(p.layer_groups[l], p.layer_slots[l] + p.transient_groups) << "layer " << l;
    EXPECT_GE(p.layer_slots[l], 1) << "layer " << l;
    m += p.layer_groups[l];
    c += p.layer_slots[l];
  }
  EXPECT_LE(m, 30 * int64_t(p.groups_per_step));
  EXPECT_LE(c, 30 * int64_t(p.reuse_slots));
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  // Explicit T: M = C + T, whatever the budget's tightness.
  o.read_through = 20;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_FALSE(p.transient_auto);
  EXPECT_EQ(p.groups_per_step, p.reuse_slots + 20);
  EXPECT_NE(p.Describe().find(" T=20 (read-through) "), std::string::npos) << p.Describe();
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  // Where no T reaches 500 tokens, T stops at C.
  o.read_through = -1;
  o.group_summary = AutoSwitch::kOff;
  o.budget_bytes = full / 80;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_GT(p.transient_groups, 0);
  EXPECT_LE(p.transient_groups, p.reuse_slots);
  EXPECT_LT(p.groups_per_step * p.layout.group_size, kReadThroughTokens);
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  // Refusals name the values.
  o = DiskKvOptions();
  o.groups_per_step = 100;
  o.reuse_slots = 50;
  o.read_through = 10;
  Status st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_NE(st.message().find(
                "kv.reuse_slots (C) = 50 plus kv.read_through (T) = 10 must be at least M = 100"),
            std::string::npos)
      << st.message();
  o.read_through = 50;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.groups_per_step, 100);
  o.group_size = 4;
  o.read_through = 3000;
  st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_NE(st.message().find("kv.read_through (T) = 3000 is out of range [0, 2048]"),
            std::string::npos)
      << st.message();
  o.read_through = -2;
  st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_NE(st.message().find("kv.read_through (T) = -2 is out of range [-1,"), std::string::npos)
      << st.message();
}

TEST(DiskKvPlanTest, ExplicitSettingsAndPadding) {
  DiskKvOptions o;
  o.group_size = 1;
  o.record_type = KvRecordType::kF16;
  o.groups_per_step = 400;
  o.reuse_slots = 500;
  o.budget_bytes = int64_t(64) << 20;
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.layout.payload_bytes, 768u);
  EXPECT_EQ(p.layout.record_bytes, 1024u);  // padded to the 512-byte block
  EXPECT_EQ(p.groups_per_step, 400);
  EXPECT_EQ(p.reuse_slots, 500);
  EXPECT_EQ(p.slot_bytes, uint64_t(30) * 500 * 1024);
}

// Three layers that miss far more of their attention than the rest at any token count,
// one that misses twice the median (not enough), and the others spread around the median.
AttentionProfile ThreeDispersedLayers() {
  AttentionProfile prof;
  prof.tokens = AttentionProfile::DefaultTokens();
  for (int l = 0; l < 30; ++l) {
    const float scale = l < 3 ? 0.6f : l == 7 ? 0.2f : 0.08f + 0.004f * float(l % 5);
    std::vector<float> m;
    for (int32_t t : prof.tokens) m.push_back(scale * std::exp(-float(t) / 1024.0f));
    prof.error.push_back(m);
  }
  return prof;
}

TEST(DiskKvPlanTest, DispersedLayersStandOutFromTheMedian) {
  const AttentionProfile prof = ThreeDispersedLayers();
  for (double tokens : {0.0, 400.0, 615.0, 3000.0})
    EXPECT_EQ(DispersedLayers(prof, 30, tokens), (std::vector<int32_t>{0, 1, 2})) << tokens;
  // A profile for another layer count, none at all, or one whose errors are all 0 (every
  // layer fully covered) finds none.
  EXPECT_TRUE(DispersedLayers(prof, 31, 400).empty());
  EXPECT_TRUE(DispersedLayers(AttentionProfile(), 30, 400).empty());
  AttentionProfile flat = prof;
  for (auto& e : flat.error) std::fill(e.begin(), e.end(), 0.0f);
  EXPECT_TRUE(DispersedLayers(flat, 30, 400).empty());
  // Every layer alike: none stands out.
  AttentionProfile same = prof;
  for (auto& e : same.error) e = prof.error[5];
  EXPECT_TRUE(DispersedLayers(same, 30, 400).empty());
}

TEST(DiskKvPlanTest, DispersedLayersTakeTheirOwnResidentBonus) {
  const AttentionProfile prof = ThreeDispersedLayers();
  DiskKvOptions o;
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());
  EXPECT_FALSE(p.calibrated);  // 1/13 is not tight: M and C stay uniform, the bonus does not
  ASSERT_EQ(p.layer_bonus.size(), 30u);
  EXPECT_EQ(p.dispersed_layers, (std::vector<int32_t>{0, 1, 2}));
  for (int l = 0; l < 30; ++l)
    EXPECT_EQ(p.layer_bonus[size_t(l)], l < 3 ? o.dispersed_bonus : o.resident_bonus) << l;
  EXPECT_NE(p.Describe().find("; dispersed attention in layers 0,1,2 (resident bonus 10)"),
            std::string::npos)
      << p.Describe();
  // The same memory either way: the bonus only changes which groups stay.
  DiskKvPlan none;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &none).ok());
  EXPECT_TRUE(none.dispersed_layers.empty());
  EXPECT_EQ(none.layer_bonus, std::vector<float>(30, o.resident_bonus));
  EXPECT_EQ(none.total_bytes(), p.total_bytes());
  EXPECT_EQ(none.Describe().find("dispersed"), std::string::npos) << none.Describe();
  // -1: off.
  o.dispersed_bonus = -1;
  o.resident_bonus = 2;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p, &prof).ok());
  EXPECT_TRUE(p.dispersed_layers.empty());
  EXPECT_EQ(p.layer_bonus, std::vector<float>(30, 2.0f));
  // Out of range names the key and the range.
  o.dispersed_bonus = -2;
  const Status st = PlanDiskKv(kSmol, o, 512, &p, &prof);
  EXPECT_EQ(st.code(), Status::Code::kOutOfRange);
  EXPECT_NE(st.message().find("kv.experimental.dispersed_bonus = -2"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("[-1, 100]"), std::string::npos) << st.message();
}

TEST(DiskKvPlanTest, RefusalsNameTheValueAndTheLimit) {
  DiskKvPlan p;
  DiskKvOptions o;
  o.budget_bytes = int64_t(1) << 20;  // below K_lr alone, even at sigma 32 (1.17 MiB in Q4)
  o.group_summary = AutoSwitch::kOff;
  Status st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("sigma=32 (auto)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("1048576 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("minimum of"), std::string::npos) << st.message();
  // Per group the summary is 5x smaller: auto plans what per token cannot, and below even
  // that the refusal names the per-group minimum.
  o.group_summary = AutoSwitch::kAuto;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_TRUE(p.group_summary);
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  o.budget_bytes = int64_t(256) << 10;
  st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("(K_lr per group)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("262144 bytes"), std::string::npos) << st.message();
  o = DiskKvOptions();
  o.group_size = 4;
  o.groups_per_step = 2049;
  st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_NE(st.message().find("kv.groups_per_step (M) = 2049 is out of range [1, 2048]"),
            std::string::npos)
      << st.message();
  o = DiskKvOptions();
  o.ratio = 500;
  st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_NE(st.message().find("500 is out of range [1, 192]"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace strata
