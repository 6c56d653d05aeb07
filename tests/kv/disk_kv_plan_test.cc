// DiskKvPlan: the per-sequence memory plan against the numbers of SmolLM2-135M (30 layers,
// 3 KV heads x 64 dims) at 8K context, and its refusals.
#include "runtime/kv/disk_kv_plan.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

const KvShape kSmol{30, 3, 64, 8192};

TEST(DiskKvPlanTest, DefaultBudgetIsOneThirteenthAndFillsTheSlots) {
  DiskKvOptions o;  // G=4, sigma=16, budget 0 = full/13, record type auto = Q8_0 here
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.full_cache_bytes, uint64_t(30) * 8192 * 192 * 4);
  EXPECT_EQ(p.budget_bytes, p.full_cache_bytes / 13);
  EXPECT_EQ(p.layout.type, kernels::KvType::kQ8_0);
  EXPECT_EQ(p.layout.payload_bytes, 1632u);  // 4 tokens x 6 blocks of 34 bytes x K,V
  EXPECT_EQ(p.layout.record_bytes, 2048u);
  EXPECT_EQ(p.rank, 12);
  EXPECT_EQ(p.klr_bytes, uint64_t(30) * 8192 * 12 * 2);
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  EXPECT_GE(p.reuse_slots, p.groups_per_step);
  EXPECT_LE(p.groups_per_step, 100);  // M*G ~ 400 at most
  // Nothing more fits: one more slot per layer would break the budget.
  EXPECT_GT(p.total_bytes() + uint64_t(30) * 2048, p.budget_bytes);
}

// The same budget in F16 records: 3072 bytes per group, so fewer slots; Q8_0 buys 1.5x the
// slots here (2048-byte records after padding) and 1.9x where G fills the block (G=5).
TEST(DiskKvPlanTest, Q8RecordsHoldMoreGroupsInTheSameBudget) {
  DiskKvOptions o;
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

TEST(DiskKvPlanTest, RefusalsNameTheValueAndTheLimit) {
  DiskKvPlan p;
  DiskKvOptions o;
  o.budget_bytes = int64_t(1) << 20;  // below K_lr alone (5.6 MiB at sigma 16)
  Status st = PlanDiskKv(kSmol, o, 512, &p);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("1048576 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("minimum of"), std::string::npos) << st.message();
  o = DiskKvOptions();
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
