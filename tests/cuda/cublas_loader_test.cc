// cuBLAS is opened on first use rather than linked (kernels/cuda/cublas_loader.h). Needs no
// GPU: loading the library and resolving its symbols is host work.
#include <string>

#include <gtest/gtest.h>

#include "kernels/cuda/cublas_loader.h"

namespace strata::kernels::cuda {
namespace {

// The toolkit the build found ships the library, so it loads, every entry point resolves,
// and a second call returns the same table without loading again.
TEST(CublasLoaderTest, TheToolkitsLibraryLoadsOnceWithEveryEntryPoint) {
  std::string error;
  const CublasApi* api = Cublas(&error);
  ASSERT_NE(api, nullptr) << error;
  EXPECT_NE(api->create, nullptr);
  EXPECT_NE(api->destroy, nullptr);
  EXPECT_NE(api->set_stream, nullptr);
  EXPECT_NE(api->gemm_ex, nullptr);
  EXPECT_EQ(Cublas(nullptr), api);
}

}  // namespace
}  // namespace strata::kernels::cuda
