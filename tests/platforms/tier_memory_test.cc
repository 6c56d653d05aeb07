// HostMemory(): host RAM as a fast tier. Arenas come aligned and zeroed, bad alignments are
// refused with a message, StoreF16 converts like the kernels, Copy copies.
#include "platforms/tier_memory.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/types.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

TEST(TierMemoryTest, HostMemoryIsOneHostTier) {
  TierMemory* m = HostMemory();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m, HostMemory());
  EXPECT_STREQ(m->name(), "host");
  EXPECT_FALSE(m->device());
}

TEST(TierMemoryTest, ArenasAreAlignedAndZeroed) {
  for (size_t alignment = 1; alignment <= 4096; alignment *= 2) {
    for (size_t bytes : {size_t(1), size_t(4096), size_t(3 * 4096 + 5)}) {
      TierArena a;
      STRATA_ASSERT_OK(HostMemory()->Allocate(bytes, alignment, &a));
      ASSERT_NE(a.get(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % alignment, 0u)
          << bytes << " bytes at alignment " << alignment;
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(a.get()[i], std::byte{0}) << "byte " << i;
      std::memset(a.get(), 0xAB, bytes);  // and writable to the end
      EXPECT_EQ(a.get()[bytes - 1], std::byte{0xAB});
    }
  }
}

TEST(TierMemoryTest, EmptyArenaIsValid) {
  TierArena a;
  STRATA_ASSERT_OK(HostMemory()->Allocate(0, 64, &a));
  EXPECT_NE(a.get(), nullptr);
}

TEST(TierMemoryTest, RefusesBadAlignments) {
  for (size_t alignment : {size_t(0), size_t(3), size_t(6), size_t(100), size_t(8192)}) {
    TierArena a;
    Status s = HostMemory()->Allocate(4096, alignment, &a);
    ASSERT_FALSE(s.ok()) << "alignment " << alignment;
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(s.message().find("alignment " + std::to_string(alignment)), std::string::npos)
        << s.ToString();
    EXPECT_EQ(a.get(), nullptr);
  }
}

TEST(TierMemoryTest, RefusesAnImpossibleSize) {
  TierArena a;
  Status s = HostMemory()->Allocate(size_t(1) << 62, 64, &a);  // past any address space
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("cannot allocate"), std::string::npos) << s.ToString();
}

TEST(TierMemoryTest, StoreF16ConvertsEveryValue) {
  // 37 values: a SIMD body and a tail. Exactly representable ones must come back exactly;
  // the others as the reference conversion rounds them.
  std::vector<float> src(37);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (float(i) - 18.f) * 0.25f;
  src[3] = 65504.f;    // the largest finite F16
  src[4] = 1.f / 3.f;  // rounded
  src[5] = 1e-7f;      // subnormal in F16
  src[6] = -0.f;
  TierArena a;
  STRATA_ASSERT_OK(HostMemory()->Allocate(src.size() * 2 + 8, 64, &a));
  uint16_t* dst = reinterpret_cast<uint16_t*>(a.get());
  dst[src.size()] = 0x1234;  // must stay untouched
  HostMemory()->StoreF16(dst, src.data(), int64_t(src.size()));
  for (size_t i = 0; i < src.size(); ++i)
    EXPECT_EQ(dst[i], kernels::F32ToF16(src[i])) << "value " << i << " = " << src[i];
  EXPECT_EQ(dst[src.size()], 0x1234);
  EXPECT_EQ(dst[3], 0x7BFF);
  EXPECT_EQ(dst[6], 0x8000);
  EXPECT_EQ(kernels::F16ToF32(dst[0]), -4.5f);
}

TEST(TierMemoryTest, CopyCopiesWithinAnArena) {
  TierArena a;
  STRATA_ASSERT_OK(HostMemory()->Allocate(8192, 4096, &a));
  for (int i = 0; i < 4096; ++i) a.get()[i] = std::byte(i * 7);
  HostMemory()->Copy(a.get() + 4096, a.get(), 4096);
  EXPECT_EQ(std::memcmp(a.get(), a.get() + 4096, 4096), 0);
  HostMemory()->Copy(a.get() + 4096, a.get() + 1, 0);  // nothing to copy
  EXPECT_EQ(a.get()[4096], std::byte{0});
}

}  // namespace
}  // namespace strata
