// CudaForward: the forward pass of forward.h on a CUDA GPU.
//
// Weights are expanded to F16 once, at creation, into GPU memory (a 135M-parameter model
// takes 270 MB); activations stay F32 on the GPU; the matmuls, norms, RoPE, SwiGLU and the
// attention over the policy's spans are the kernels of kernels/cuda/. KV lives where the
// policy keeps it, which must be GPU memory (a prefix-tree policy built on
// CudaDevice::memory()): the policy hands device pointers in its views, and Append
// receives device pointers to the new K/V rows. Only the embeddings (looked up on the host)
// go up and only the logits come back per pass.
//
// Every kernel reduces each output in an order fixed by its own inputs, so a sequence's
// logits do not depend on which other sequences share its batch: beam search gives the same
// results under any grouping on the GPU as on the CPU (the GPU's and the CPU's logits
// differ slightly: F16 weights and F32 activations here, quantized activations there).
#pragma once

#include <memory>

#include "platforms/cuda_device.h"
#include "runtime/engine/forward.h"

namespace strata {

// NotSupported in a build without CUDA; InvalidArgument when the policy does not keep KV in
// GPU memory or the model has a shape the kernels do not take (the message says which).
Status CreateCudaForward(const Model& model, KvPolicy* kv, std::shared_ptr<CudaDevice> device,
                         int32_t max_tokens, std::unique_ptr<ForwardPass>* out);

}  // namespace strata
