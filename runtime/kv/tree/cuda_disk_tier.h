// CudaDiskTier: a host-memory slow tier (the block store on disk) behind GPU-resident KV,
// staged through pinned host RAM. This is the Jetson-class arrangement (KV in the GPU's
// memory, the rest on NVMe or eMMC) and a desktop GPU whose host RAM cannot hold the search.
//
// A read goes disk -> pinned staging (the inner tier's own asynchronous I/O), then staging ->
// GPU memory (one copy kernel on the device's copy stream, ordered after the compute enqueued
// before it, ending in an event). A write goes the other way: the copy kernel first, then the
// disk write from staging once the copy's event has passed. Each transfer advances through its
// two stages whenever it is asked Done() or Wait(), so the engine thread drives it as it does
// the other tiers' transfers; Wait() returns once the data is where it was asked to go.
//
// Staging is a fixed pinned region (first fit, in the inner tier's alignment). A transfer that
// finds too little free staging first finishes older transfers, oldest first; one larger than
// the whole region runs in region-sized pieces before Read/Write return.
#pragma once

#include <memory>

#include "platforms/cuda_device.h"
#include "runtime/kv/tree/slow_tier.h"

namespace strata {

// inner: a tier that moves host memory (the block store, or RamSlowTier in tests).
// staging_bytes: pinned host memory for transfers in flight (rounded up to the inner tier's
// alignment; at least one alignment unit).
Status OpenCudaDiskTier(std::shared_ptr<CudaDevice> device, std::unique_ptr<SlowTier> inner,
                        uint64_t staging_bytes, std::unique_ptr<SlowTier>* out);

}  // namespace strata
