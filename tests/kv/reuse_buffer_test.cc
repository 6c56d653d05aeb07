// ReuseBuffer: hits, victims chosen by FIFO / LRU / frequency, pinning of the current
// selection, adjacent slots for adjacent groups, invalidation, read-through slots.
#include "runtime/kv/disk/reuse_buffer.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

std::vector<ReuseBuffer::Placement> Resolve(ReuseBuffer& b, std::vector<int32_t> sel) {
  std::vector<ReuseBuffer::Placement> out;
  b.Resolve(sel, &out);
  return out;
}

int Loads(const std::vector<ReuseBuffer::Placement>& p) {
  int n = 0;
  for (const auto& x : p) n += x.load;
  return n;
}

TEST(ReuseBufferTest, HitsKeepTheirSlotsAndMissesFillFreeOnesInOrder) {
  ReuseBuffer b(6, ReusePolicy::kLru);
  auto p = Resolve(b, {3, 4, 5});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(Loads(p), 3);
  // Adjacent groups land in adjacent slots, so they can be read in one request.
  EXPECT_EQ(p[1].slot, p[0].slot + 1);
  EXPECT_EQ(p[2].slot, p[1].slot + 1);
  auto q = Resolve(b, {4, 5, 9});
  EXPECT_FALSE(q[0].load);
  EXPECT_EQ(q[0].slot, p[1].slot);
  EXPECT_FALSE(q[1].load);
  EXPECT_TRUE(q[2].load);
  EXPECT_EQ(b.group_of(q[2].slot), 9);
}

TEST(ReuseBufferTest, PoliciesChooseDifferentVictims) {
  // Slots: 1 and 2 loaded first; 1 used again and again; 3 loaded later once.
  auto run = [](ReusePolicy policy) {
    ReuseBuffer b(3, policy);
    Resolve(b, {1, 2});
    Resolve(b, {1, 3});  // 2 unused now
    Resolve(b, {1, 2});  // 2 used again, 3 not
    Resolve(b, {1});
    Resolve(b, {3});
    // One new group: which of 1, 2, 3 leaves?
    auto p = Resolve(b, {7});
    int victim = -1;
    for (int32_t g : {1, 2, 3}) {
      bool kept = false;
      for (int32_t s = 0; s < 3; ++s) kept |= b.group_of(s) == g;
      if (!kept) victim = g;
    }
    EXPECT_EQ(Loads(p), 1);
    return victim;
  };
  // FIFO: group 1 was loaded first (step 1) and never reloaded.
  EXPECT_EQ(run(ReusePolicy::kFifo), 1);
  // LRU: 2 was used at step 3, 1 at step 4, 3 at step 5.
  EXPECT_EQ(run(ReusePolicy::kLru), 2);
  // LFU: 1 was selected 4 times, 2 twice, 3 twice (3 more recently): 2 leaves.
  EXPECT_EQ(run(ReusePolicy::kLfu), 2);
}

TEST(ReuseBufferTest, TheCurrentSelectionIsNeverEvicted) {
  ReuseBuffer b(4, ReusePolicy::kFifo);
  Resolve(b, {0, 1, 2, 3});
  auto p = Resolve(b, {0, 1, 10, 11});
  ASSERT_EQ(Loads(p), 2);
  for (int32_t g : {0, 1, 10, 11}) {
    bool held = false;
    for (int32_t s = 0; s < 4; ++s) held |= b.group_of(s) == g;
    EXPECT_TRUE(held) << g;
  }
}

TEST(ReuseBufferTest, InvalidatedSlotsAreLoadedAgain) {
  ReuseBuffer b(2, ReusePolicy::kLru);
  auto p = Resolve(b, {5, 6});
  b.Invalidate(p[0].slot);
  auto q = Resolve(b, {5, 6});
  EXPECT_TRUE(q[0].load);
  EXPECT_FALSE(q[1].load);
  b.Clear();
  EXPECT_EQ(Loads(Resolve(b, {5, 6})), 2);
}

// Read-through: 3 persistent slots and 4 read-through ones. The misses of highest priority
// take the persistent slots; the rest are read through, in adjacent slots for adjacent
// groups; read-through groups are hits only until ForgetTransient (the next step).
TEST(ReuseBufferTest, ReadThroughSlotsTakeTheLowestRankedMisses) {
  ReuseBuffer b(3, ReusePolicy::kLru, 4);
  EXPECT_EQ(b.capacity(), 3);
  EXPECT_EQ(b.transient(), 4);
  EXPECT_EQ(b.size(), 7);
  std::vector<ReuseBuffer::Placement> p;
  const std::vector<int32_t> sel{2, 3, 4, 7, 8, 9};
  const std::vector<float> pri{0.1f, 0.2f, 5.0f, 3.0f, 0.3f, 4.0f};
  b.Resolve(sel, &p, pri);
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(Loads(p), 6);
  for (const auto& x : p) {
    const bool top = x.group == 4 || x.group == 7 || x.group == 9;
    EXPECT_EQ(b.is_transient(x.slot), !top) << "group " << x.group;
    EXPECT_EQ(b.group_of(x.slot), x.group);
  }
  // Groups 2 and 3 (adjacent, both read through) are in adjacent read-through slots.
  EXPECT_EQ(p[1].slot, p[0].slot + 1);
  // Within the step (a refinement), read-through groups are hits; a new miss ranked above
  // them takes a read-through slot, since the persistent ones are all pinned.
  std::vector<ReuseBuffer::Placement> q;
  b.Resolve(std::vector<int32_t>{2, 4, 7, 9, 12}, &q,
            std::vector<float>{0.1f, 5.0f, 3.0f, 4.0f, 9.0f});
  EXPECT_FALSE(q[0].load);
  EXPECT_EQ(q[0].slot, p[0].slot);
  EXPECT_TRUE(q[4].load);
  EXPECT_TRUE(b.is_transient(q[4].slot));
  // A new step: read-through groups are gone, persistent ones stay.
  b.ForgetTransient();
  std::vector<ReuseBuffer::Placement> r;
  b.Resolve(std::vector<int32_t>{2, 4, 7, 9}, &r, std::vector<float>{1, 1, 1, 1});
  EXPECT_TRUE(r[0].load);
  EXPECT_FALSE(r[1].load);
  EXPECT_FALSE(r[2].load);
  EXPECT_FALSE(r[3].load);
  // No free persistent slot: group 2 is read through although its priority is highest.
  EXPECT_TRUE(b.is_transient(r[0].slot));
  // An unselected persistent group is a victim for the best-ranked miss.
  b.ForgetTransient();
  std::vector<ReuseBuffer::Placement> t;
  b.Resolve(std::vector<int32_t>{1, 4, 7, 20}, &t, std::vector<float>{0.5f, 1, 1, 2});
  EXPECT_TRUE(t[0].load);
  EXPECT_TRUE(b.is_transient(t[0].slot));
  EXPECT_TRUE(t[3].load);
  EXPECT_FALSE(b.is_transient(t[3].slot));
  EXPECT_EQ(b.group_of(t[3].slot), 20);
  // Without priorities the earlier groups take the persistent slots.
  ReuseBuffer c(2, ReusePolicy::kFifo, 2);
  std::vector<ReuseBuffer::Placement> u;
  c.Resolve(std::vector<int32_t>{5, 6, 7, 8}, &u);
  EXPECT_FALSE(c.is_transient(u[0].slot));
  EXPECT_FALSE(c.is_transient(u[1].slot));
  EXPECT_TRUE(c.is_transient(u[2].slot));
  EXPECT_TRUE(c.is_transient(u[3].slot));
  // A failed read-through read is forgotten like any other.
  c.Invalidate(u[3].slot);
  EXPECT_EQ(c.group_of(u[3].slot), -1);
}

}  // namespace
}  // namespace strata
