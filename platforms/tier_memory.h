// TierMemory: how the engine allocates and writes the memory a fast tier lives in.
//
// "Platforms decide memory, the engine asks" (DESIGN.md): a KV policy never calls malloc or
// memcpy on its fast-tier arena directly but goes through one of these, so the same policy
// code keeps KV in host RAM (HostMemory) or in GPU memory (CudaDevice::memory()), where
// the host cannot touch the bytes and stores become batched device work ordered on the
// compute stream.
//
// Threads: one thread (the engine's) at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"

namespace strata {

// An arena allocated by a TierMemory; frees itself.
using TierArena = std::unique_ptr<std::byte, std::function<void(std::byte*)>>;

class TierMemory {
 public:
  virtual ~TierMemory() = default;
  // "host" or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual const char* name() const = 0;
  // True when the bytes are not addressable from the host (GPU memory): a policy then never
  // dereferences its arena, and the forward pass hands it device pointers.
  virtual bool device() const = 0;
  // `bytes` of zeroed memory aligned to `alignment` (a power of two up to 4096). Host memory
  // is committed by the OS on first touch, so a large budget costs what is used.
  virtual Status Allocate(size_t bytes, size_t alignment, TierArena* out) = 0;
  // dst[i] = f16(src[i]) for i < n. On a device: src is device memory too, and the store may
  // be deferred until the forward pass flushes it before attention (see CudaDevice).
  virtual void StoreF16(uint16_t* dst, const float* src, int64_t n) = 0;
  // Copies n bytes between two places of this memory (copy on write of a block).
  virtual void Copy(void* dst, const void* src, size_t n) = 0;
};

// Plain host RAM (the CPU backend); one instance for the process.
TierMemory* HostMemory();

}  // namespace strata
