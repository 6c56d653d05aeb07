// CudaHostTier: pinned host RAM as the slow tier of GPU-resident KV (a desktop GPU's PCIe
// host tier). Transfers are one copy kernel per Read/Write on the device's copy stream,
// reading or writing the pinned memory through its device alias (zero-copy), so a pass that
// streams a layer of hundreds of blocks costs one launch, not hundreds of cudaMemcpy calls.
// Every transfer is ordered after the compute work enqueued before it (see
// CudaDevice::OrderCopyAfterCompute) and ends with an event its TierTransfer waits on.
#pragma once

#include <memory>

#include "platforms/cuda_device.h"
#include "runtime/kv/tree/slow_tier.h"

namespace strata {

// capacity bytes of pinned host memory; offsets and lengths multiples of `alignment`.
Status OpenCudaHostTier(std::shared_ptr<CudaDevice> device, uint64_t capacity, uint32_t alignment,
                        std::unique_ptr<SlowTier>* out);

}  // namespace strata
