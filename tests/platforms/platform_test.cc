// DetectPlatform: what it reports about this machine must be sane, and its kind must follow
// the machine (a Jetson's device tree, else a visible CUDA GPU, else the CPU).
#include "platforms/platform.h"

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "platforms/cuda_device.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

bool IsJetson() {
  std::ifstream in("/proc/device-tree/compatible", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str().find("nvidia,tegra") != std::string::npos;
}

TEST(PlatformTest, DetectsCoresAndMemory) {
  PlatformInfo p;
  STRATA_ASSERT_OK(DetectPlatform(&p));
  EXPECT_GT(p.cores, 0);
  EXPECT_GT(p.memory_total, 0u);
  EXPECT_GT(p.memory_available, 0u);
  EXPECT_LE(p.memory_available, p.memory_total);
  EXPECT_EQ(p.isa, kernels::IsaName(kernels::ActiveIsa()));
}

TEST(PlatformTest, KindFollowsTheMachine) {
  PlatformInfo p;
  STRATA_ASSERT_OK(DetectPlatform(&p));
  if (IsJetson()) {
    EXPECT_EQ(p.kind, PlatformKind::kJetson);
    EXPECT_TRUE(p.unified_memory);
  } else if (CudaDevice::Count() > 0) {
    EXPECT_EQ(p.kind, PlatformKind::kDesktopCuda);
    EXPECT_FALSE(p.unified_memory);
  } else {
    // No GPU and no Jetson: a plain CPU machine, as CI is.
    EXPECT_EQ(p.kind, PlatformKind::kCpu);
    EXPECT_FALSE(p.unified_memory);
  }
}

TEST(PlatformTest, DetectionIsRepeatable) {
  PlatformInfo a, b;
  STRATA_ASSERT_OK(DetectPlatform(&a));
  STRATA_ASSERT_OK(DetectPlatform(&b));
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.cores, b.cores);
  EXPECT_EQ(a.memory_total, b.memory_total);
  EXPECT_EQ(a.cpu_model, b.cpu_model);
}

TEST(PlatformTest, KindNames) {
  EXPECT_STREQ(PlatformKindName(PlatformKind::kCpu), "cpu");
  EXPECT_STREQ(PlatformKindName(PlatformKind::kJetson), "jetson");
  EXPECT_STREQ(PlatformKindName(PlatformKind::kDesktopCuda), "desktop-cuda");
}

}  // namespace
}  // namespace strata
