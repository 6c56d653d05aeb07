// The compute-device names of config files and flags, and CudaDevice's errors. These run in
// every build and on every machine: without a GPU (CI), or in a build without CUDA, Count()
// is 0 and Open says why. The one test that needs a GPU skips, saying so, where none is
// visible (the skip pattern of tests/cuda/).
#include "platforms/cuda_device.h"

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "tests/testing/test_model.h"

namespace strata {
namespace {

TEST(ComputeDeviceTest, ParsesCpuAndCudaNames) {
  int32_t d = 99;
  STRATA_ASSERT_OK(ParseComputeDevice("cpu", &d));
  EXPECT_EQ(d, -1);
  STRATA_ASSERT_OK(ParseComputeDevice("cuda", &d));
  EXPECT_EQ(d, 0);
  STRATA_ASSERT_OK(ParseComputeDevice("cuda:0", &d));
  EXPECT_EQ(d, 0);
  STRATA_ASSERT_OK(ParseComputeDevice("cuda:3", &d));
  EXPECT_EQ(d, 3);
  STRATA_ASSERT_OK(ParseComputeDevice("cuda:007", &d));
  EXPECT_EQ(d, 7);
  STRATA_ASSERT_OK(ParseComputeDevice("cuda:999", &d));
  EXPECT_EQ(d, 999);
}

TEST(ComputeDeviceTest, NamesRoundTrip) {
  EXPECT_EQ(ComputeDeviceName(-1), "cpu");
  EXPECT_EQ(ComputeDeviceName(0), "cuda:0");
  EXPECT_EQ(ComputeDeviceName(12), "cuda:12");
  for (int32_t d : {-1, 0, 1, 7, 42, 999}) {
    int32_t back = -2;
    STRATA_ASSERT_OK(ParseComputeDevice(ComputeDeviceName(d), &back));
    EXPECT_EQ(back, d);
  }
  for (const char* name : {"cpu", "cuda:0", "cuda:5"}) {
    int32_t d = -2;
    STRATA_ASSERT_OK(ParseComputeDevice(name, &d));
    EXPECT_EQ(ComputeDeviceName(d), name);
  }
}

TEST(ComputeDeviceTest, RefusesOtherNames) {
  for (const char* bad : {"", "gpu", "CPU", "Cuda", "cuda:", "cuda:-1", "cuda:x", "cuda:1x",
                          "cuda:1234", "cuda0", "cuda: 1", " cpu", "cpu "}) {
    int32_t d = 5;
    Status s = ParseComputeDevice(bad, &d);
    ASSERT_FALSE(s.ok()) << "'" << bad << "' was accepted";
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    std::string want = "'";  // built by appends: GCC 12 -O3 warns falsely about "'" + str
    want.append(bad).append("' is not a device");
    EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("cpu, cuda or cuda:N"), std::string::npos) << s.ToString();
    EXPECT_EQ(d, 5) << "a refused name must leave the device as it was";
  }
}

TEST(CudaDeviceTest, CountIsNeverNegative) { EXPECT_GE(CudaDevice::Count(), 0); }

TEST(CudaDeviceTest, OpeningADeviceThatIsNotThereSaysWhy) {
  const int n = CudaDevice::Count();
  for (int ordinal : {n, n + 1, -1}) {
    std::shared_ptr<CudaDevice> d;
    Status s = CudaDevice::Open(ordinal, &d);
    ASSERT_FALSE(s.ok()) << "device " << ordinal << " of " << n;
    EXPECT_EQ(d, nullptr);
    EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.ToString();
    if (n == 0) {
      // Without a GPU, or in a build without CUDA, every ordinal is refused the same way.
      EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
      EXPECT_NE(s.message().find("CUDA"), std::string::npos) << s.ToString();
    } else {
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.ToString();
    }
  }
}

TEST(CudaDeviceTest, ADeviceMemoryArenaIsAlignedAndOnTheDevice) {
  if (CudaDevice::Count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU test not run";
  std::shared_ptr<CudaDevice> d;
  STRATA_ASSERT_OK(CudaDevice::Open(0, &d));
  EXPECT_EQ(d->name().rfind("cuda:0", 0), 0u) << d->name();
  TierMemory* m = d->memory();
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->device());
  TierArena a;
  STRATA_ASSERT_OK(m->Allocate(3 * 4096 + 5, 4096, &a));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 4096, 0u);
  std::string back(3 * 4096 + 5, 'x');
  STRATA_ASSERT_OK(
      d->CopyToHostAsync(back.data(), a.get(), back.size(), CudaDevice::Stream::kCompute));
  STRATA_ASSERT_OK(d->Synchronize(CudaDevice::Stream::kCompute));
  EXPECT_EQ(back, std::string(back.size(), '\0')) << "device arenas must come zeroed";
  TierArena bad;
  EXPECT_EQ(m->Allocate(4096, 3, &bad).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace strata
