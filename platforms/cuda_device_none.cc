// CudaDevice in a build without CUDA: there is never a device, and asking for one says why.
#include "platforms/cuda_device.h"

namespace strata {

int CudaDevice::Count() { return 0; }

Status CudaDevice::Open(int, std::shared_ptr<CudaDevice>*) {
  return Status::NotSupported(
      "cuda: this build of Strata has no CUDA support (configure with the CUDA toolkit "
      "installed, or -DSTRATA_CUDA=ON)");
}

}  // namespace strata
