// How Strata's CUDA kernels are launched: with programmatic dependent launch where the GPU
// has it (compute capability 9.0 and later), so that a kernel's blocks are scheduled while its
// predecessor on the stream still runs, instead of after it has drained.
//
// A decode step is a chain of a few hundred kernels, many of them a few microseconds long
// (norms, RoPE, stores, attention at short context); with plain stream order each boundary
// costs the drain of one kernel and the launch and ramp of the next. With the overlap, every
// kernel must follow two rules, which WaitForPrevious and LetNextStart express:
//   - nothing written by an earlier kernel is read, and nothing is written at all, before
//     WaitForPrevious(): it returns once every earlier kernel on the stream has completed and
//     its writes are visible (each kernel waits for its predecessor, which waited for its own,
//     so the guarantee is transitive only if every kernel launched this way calls it);
//   - LetNextStart() lets the next kernel's blocks be scheduled; called right after the wait,
//     the next kernel's launch overlaps this kernel's body.
// Before the wait a kernel may only read memory no kernel writes during a pass: the weights
// (the quantized GEMV prefetches its rows into L2 there, so the first wave's weight reads
// overlap the small kernel before it) and what the host copied in ahead of the kernels
// (positions, span lists, store lists: RoPE computes its angles and attention finds its spans
// while the kernel before finishes). Activations are read with ordinary loads, never the
// read-only path (__ldg, const __restrict__), which is only defined for data that stays
// unchanged for the whole life of the kernel.
//
// Launches go through Launch<Kernel>(...), which asks for the overlap only where the kernels'
// code was compiled for a GPU that has it (code compiled from older PTX has no wait in it)
// and STRATA_CUDA_PDL is not 0 (for measuring the difference).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace strata::kernels::cuda {

__device__ __forceinline__ void WaitForPrevious() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void LetNextStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Prefetches the 128-byte lines of [p, p + bytes) into L2, the lines spread over the lanes.
__device__ __forceinline__ void PrefetchL2(const void* p, long long bytes, int lane) {
  const char* c = static_cast<const char*>(p);
  for (long long off = (long long)lane * 128; off < bytes; off += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

// Whether launches may overlap their predecessor: compute capability 9.0 or later, the
// kernels' code built for it (all kernels share one architecture list, so one stands for
// all), and STRATA_CUDA_PDL not set to 0. Asked of the GPU once, by PrepareLaunches
// (cuda_kernels.h) before any graph capture; the process drives one GPU model at a time.
bool LaunchesOverlap();

// The quantized matmuls' share of PrepareLaunches (cuda_quant.cu): how many blocks of each
// GEMV kernel the GPU holds at once.
void PrepareQuantLaunches();

template <auto Kernel, class... Args>
void Launch(dim3 grid, dim3 block, size_t shared, cudaStream_t stream, Args&&... args) {
  const bool overlap = LaunchesOverlap();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = stream;
  cfg.attrs = overlap ? attr : nullptr;
  cfg.numAttrs = overlap ? 1 : 0;
  // Errors surface at the caller's next synchronizing call, as with <<< >>>.
  (void)cudaLaunchKernelEx(&cfg, Kernel, std::forward<Args>(args)...);
}

}  // namespace strata::kernels::cuda
