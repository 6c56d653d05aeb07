// ISA selection: support queries, forcing a table and restoring it.
#include <gtest/gtest.h>

#include <string>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

TEST(Dispatch, ScalarIsAlwaysAvailableAndForcible) {
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  const Isa before = ActiveIsa();
  ASSERT_TRUE(ForceIsa(Isa::kScalar));
  EXPECT_EQ(ActiveIsa(), Isa::kScalar);
  EXPECT_STREQ(ActiveIsaVariant(), "scalar");
  ASSERT_TRUE(ForceIsa(before));
  EXPECT_EQ(ActiveIsa(), before);
}

TEST(Dispatch, UnsupportedIsaIsRefusedAndLeavesTheActiveOne) {
  const Isa before = ActiveIsa();
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kNeon}) {
    if (IsaSupported(isa)) {
      EXPECT_TRUE(ForceIsa(isa));
      EXPECT_EQ(ActiveIsa(), isa);
    } else {
      EXPECT_FALSE(ForceIsa(isa)) << IsaName(isa);
    }
    ForceIsa(before);
  }
  EXPECT_EQ(ActiveIsa(), before);
}

TEST(Dispatch, VariantsCoverEverySupportedIsa) {
  std::vector<testing::Variant> all = testing::AllVariants();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front()->isa, Isa::kScalar);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kNeon}) {
    bool found = false;
    for (testing::Variant v : all) found |= v->isa == isa;
    EXPECT_EQ(found, IsaSupported(isa)) << IsaName(isa);
  }
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
}

}  // namespace
}  // namespace strata::kernels
