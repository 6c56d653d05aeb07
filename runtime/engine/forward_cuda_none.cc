// CreateCudaForward in a build without CUDA.
#include "runtime/engine/forward_cuda.h"

namespace strata {

Status CreateCudaForward(const Model&, KvPolicy*, std::shared_ptr<CudaDevice>, int32_t,
                         const CudaForwardOptions&, std::unique_ptr<ForwardPass>*) {
  return Status::NotSupported(
      "cuda: this build of Strata has no CUDA support (configure with the CUDA toolkit "
      "installed, or -DSTRATA_CUDA=ON)");
}

}  // namespace strata
