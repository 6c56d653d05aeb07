// CudaForward: the forward pass of forward.h on a CUDA GPU.
//
// Weights keep their GGUF type in GPU memory (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K; F16 and F32
// tensors, and types these kernels do not decode, become F16 once). Small batches (decode,
// beam groups: up to kGemvMaxTokens tokens) multiply with dequantizing GEMVs over int8
// activations; larger ones (prefill) dequantize each matrix to F16 a chunk of rows at a time
// and multiply with cuBLAS on the tensor cores. Activations stay F32 on the GPU; the norms,
// RoPE, SwiGLU and the attention over the policy's spans are the kernels of kernels/cuda/.
//
// KV lives where the policy keeps it, which must be memory the GPU reads: a policy on
// CudaDevice::memory() hands device pointers in its views and receives device pointers in
// Append. When the policy's views can be computed before a pass (views_precomputable: the
// memory policy), a decode step is one captured CUDA graph, replayed step after step with
// that step's spans, positions and stores uploaded in one copy: a small model's decode is
// then bound by the GPU, not by launching ~12 kernels a layer from the host.
//
// Weight placement: in GPU memory (a discrete GPU), or read in place from the model file's
// mapping, pinned and mapped into the GPU's address space (an integrated GPU, where device
// and host memory are the same RAM: no second copy of the weights; on a discrete GPU the
// same mode works over the bus, which is how it is tested).
//
// batch_invariant: every batch goes through the GEMV path, whose result for a token does not
// depend on the tokens beside it, so beam search gives the same beams under any grouping.
// Otherwise a sequence's logits in a prefill-sized batch differ from its decode-sized ones
// by float rounding.
#pragma once

#include <memory>

#include "platforms/cuda_device.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/options.h"

namespace strata {

// Batches of at most this many tokens use the GEMV path.
constexpr int64_t kGemvMaxTokens = 32;

// NotSupported in a build without CUDA; InvalidArgument when the policy does not keep KV in
// GPU memory or the model has a shape the kernels do not take (the message says which).
Status CreateCudaForward(const Model& model, KvPolicy* kv, std::shared_ptr<CudaDevice> device,
                         int32_t max_tokens, const CudaForwardOptions& options,
                         std::unique_ptr<ForwardPass>* out);

}  // namespace strata
