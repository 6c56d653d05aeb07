// ReuseBuffer: hits, victims chosen by FIFO / LRU / frequency, pinning of the current
// selection, adjacent slots for adjacent groups, invalidation.
#include "runtime/kv/reuse_buffer.h"

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

}  // namespace
}  // namespace strata
