// DiskKvPlan: the per-sequence memory plan against the numbers of SmolLM2-135M (30 layers,
// 3 KV heads x 64 dims) at 8K context, and its refusals.
#include "runtime/kv/disk_kv_plan.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

const KvShape kSmol{30, 3, 64, 8192};

TEST(DiskKvPlanTest, DefaultBudgetIsOneThirteenthAndFillsTheSlots) {
  DiskKvOptions o;  // G=4, sigma=16, budget 0 = full/13
  DiskKvPlan p;
  ASSERT_TRUE(PlanDiskKv(kSmol, o, 512, &p).ok());
  EXPECT_EQ(p.full_cache_bytes, uint64_t(30) * 8192 * 192 * 4);
  EXPECT_EQ(p.budget_bytes, p.full_cache_bytes / 13);
  EXPECT_EQ(p.layout.record_bytes, 3072u);  // 4 tokens x 192 x K,V x 2 bytes
  EXPECT_EQ(p.rank, 12);
  EXPECT_EQ(p.klr_bytes, uint64_t(30) * 8192 * 12 * 2);
  EXPECT_LE(p.total_bytes(), p.budget_bytes);
  EXPECT_GE(p.reuse_slots, p.groups_per_step);
  EXPECT_LE(p.groups_per_step, 100);  // M*G ~ 400 at most
  // Nothing more fits: one more slot per layer would break the budget.
  EXPECT_GT(p.total_bytes() + uint64_t(30) * 3072, p.budget_bytes);
}

TEST(DiskKvPlanTest, ExplicitSettingsAndPadding) {
  DiskKvOptions o;
  o.group_size = 1;
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
