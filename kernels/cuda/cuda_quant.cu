// Quantized-weight kernels (see cuda_kernels.h): dequantizing GEMVs for decode-sized
// batches, dequantization to F16 and cuBLAS GEMMs for prefill. The per-block arithmetic is
// quant_blocks.h's, shared with the host tests.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cublas_loader.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

__device__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// One warp (a block) per weight row at a time. Lane i takes units i, i + 32, ... of the row
// (whole GGUF blocks, or fixed parts of a super-block), for up to NT tokens at once so each
// weight is read once per NT tokens; then the warp reduces. A token's sum runs over the same
// units on the same lanes in the same order whatever NT and n_tok are, so its result is
// independent of the batch. (Splitting a long row over 2-4 warps of a block, with a
// shared-memory reduction, measured slower on an H200; of 1, 2, 4 and 8 rows a block and loops
// unrolled 2 or 4 times, one row a block unrolled 4 times decoded fastest on an H100, by 3% at
// most: see docs/experiments/gpu.md.)
//
// The grid is what the GPU holds at once (ResidentBlocks), and each warp walks the rows n_warps
// apart: while it sums one row, the next one's lines are already on their way into L2, so a
// warp has two rows' weights in flight instead of one and the latency of DRAM is paid once a
// row pair, not once a row. The rows of all parts form one range, part after part.
struct QPartsArg {
  QMatmulPart part[3];
  int64_t first_row[4];
  int n;
};

template <class B, int NT>
__global__ void __launch_bounds__(32) QMatmulKernel(const QPartsArg a, int64_t k, const int8_t* xq,
                                                    const q::ActScale* xs, int64_t n_tok) {
  const int lane = threadIdx.x & 31;
  const int64_t n_warps = gridDim.x, total = a.first_row[a.n];
  const int64_t row_bytes = k / B::kBlockElems * B::kBlockBytes;
  auto row_of = [&](int64_t g, int* p) {
    int i = 0;
    while (i + 1 < a.n && g >= a.first_row[i + 1]) ++i;
    *p = i;
    return a.part[i].w + (g - a.first_row[i]) * row_bytes;
  };
  int p = 0;
  // The weights are the one input no kernel writes: the first row is on its way into L2
  // while the kernel before (a norm, a quantization) finishes.
  if (int64_t(blockIdx.x) < total) PrefetchL2(row_of(blockIdx.x, &p), row_bytes, lane);
  WaitForPrevious();
  LetNextStart();
  const int64_t units = k / B::kUnit;
  for (int64_t g = blockIdx.x; g < total; g += n_warps) {
    int next_p = 0;
    if (g + n_warps < total) PrefetchL2(row_of(g + n_warps, &next_p), row_bytes, lane);
    const uint8_t* row = row_of(g, &p);
    const QMatmulPart& part = a.part[p];
    const int64_t r = g - a.first_row[p];
    for (int64_t t0 = 0; t0 < n_tok; t0 += NT) {
      const int nt = n_tok - t0 < NT ? int(n_tok - t0) : NT;
      float acc[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] = 0.f;
#pragma unroll 4
      for (int64_t u = lane; u < units; u += 32)
        B::template Dot<NT>(row, u, xq + t0 * k, xs + t0 * (k / 32), k, nt, acc);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t < nt) {
          const float s = WarpSum(acc[t]);
          if (lane == 0) part.y[(t0 + t) * part.rows + r] = s;
        }
      }
    }
  }
}

// Blocks of `Kernel` (32 threads, no shared memory) the GPU holds at once; asked once per
// kernel, by PrepareQuantLaunches outside any graph capture. STRATA_CUDA_GEMV_RESIDENT=0
// gives 0: one block per row, as the GPU schedules them (for measuring the difference).
template <auto Kernel>
int64_t ResidentBlocks() {
  static const int64_t n = [] {
    const char* env = std::getenv("STRATA_CUDA_GEMV_RESIDENT");
    if (env != nullptr && std::strcmp(env, "0") == 0) return int64_t(0);
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, 32, 0) != cudaSuccess)
      return int64_t(0);
    return int64_t(sms) * per_sm;
  }();
  return n;
}

template <auto Kernel>
void LaunchRows(QPartsArg a, int64_t k, const int8_t* xq, const q::ActScale* xs, int64_t n_tok,
                cudaStream_t s) {
  const int64_t total = a.first_row[a.n], resident = ResidentBlocks<Kernel>();
  const int64_t blocks = resident > 0 ? std::min(total, resident) : total;
  Launch<Kernel>(dim3(unsigned(blocks)), dim3(32), 0, s, a, k, xq, xs, n_tok);
}

template <class B>
void LaunchQMatmul(QPartsArg a, int n_parts, int64_t k, const int8_t* xq, const q::ActScale* xs,
                   int64_t n_tok, cudaStream_t s) {
  int64_t rows = 0;
  for (int i = 0; i < n_parts; ++i) {
    a.first_row[i] = rows;
    rows += std::max<int64_t>(a.part[i].rows, 0);
  }
  a.first_row[n_parts] = rows;
  if (rows == 0) return;
  if (n_tok == 1)
    LaunchRows<QMatmulKernel<B, 1>>(a, k, xq, xs, n_tok, s);
  else if (n_tok == 2)
    LaunchRows<QMatmulKernel<B, 2>>(a, k, xq, xs, n_tok, s);
  else if (n_tok <= 4)
    LaunchRows<QMatmulKernel<B, 4>>(a, k, xq, xs, n_tok, s);
  else
    LaunchRows<QMatmulKernel<B, 8>>(a, k, xq, xs, n_tok, s);
}

// One thread per unit of rows [r0, r1). The units of a block are consecutive in the output
// (unit i of the range lands at out + i * kUnit), so each thread writes its unit to shared
// memory and the block then copies the whole run out in 16-byte pieces: a thread writing its
// own unit straight to memory touched a new sector with every 4-byte store, which made the
// F16 expansion of a prefill cost more than the GEMM it feeds.
constexpr int kDequantThreads = 128;
template <class B>
__global__ void __launch_bounds__(kDequantThreads)
    DequantizeF16Kernel(const uint8_t* w, int64_t r0, int64_t n_units, int64_t k, __half* out) {
  WaitForPrevious();
  LetNextStart();
  __shared__ uint4 tile[kDequantThreads * B::kUnit / 8];
  const int64_t first = int64_t(blockIdx.x) * kDequantThreads;
  const int64_t i = first + threadIdx.x;
  if (i < n_units) {
    const int64_t per_row = k / B::kUnit;
    const int64_t r = i / per_row, u = i % per_row;
    const int64_t row_bytes = k / B::kBlockElems * B::kBlockBytes;
    float v[B::kUnit];
    B::Dequant(w + (r0 + r) * row_bytes, u, v);
    __half2* t = reinterpret_cast<__half2*>(tile) + threadIdx.x * (B::kUnit / 2);
#pragma unroll
    for (int j = 0; j < B::kUnit; j += 2) t[j / 2] = __floats2half2_rn(v[j], v[j + 1]);
  }
  __syncthreads();
  const int64_t units = n_units - first < kDequantThreads ? n_units - first : kDequantThreads;
  const int pieces = int(units) * (B::kUnit / 8);
  uint4* o = reinterpret_cast<uint4*>(out + first * B::kUnit);
  for (int j = threadIdx.x; j < pieces; j += kDequantThreads) o[j] = tile[j];
}

template <class B>
void LaunchDequant(const uint8_t* w, int64_t r0, int64_t r1, int64_t k, uint16_t* out,
                   cudaStream_t s) {
  const int64_t n_units = (r1 - r0) * (k / B::kUnit);
  if (n_units <= 0) return;
  Launch<DequantizeF16Kernel<B>>(unsigned((n_units + kDequantThreads - 1) / kDequantThreads),
                                 kDequantThreads, 0, s, w, r0, n_units, k,
                                 reinterpret_cast<__half*>(out));
}

__global__ void F32ToF16Kernel(const float* x, int64_t n, __half* out) {
  WaitForPrevious();
  LetNextStart();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

// One thread per Q8_0 block of 32 values.
__global__ void ExpandQ8_0Kernel(const uint8_t* src, int64_t n_blocks, int64_t blocks_per_row,
                                 __half* dst) {
  WaitForPrevious();
  LetNextStart();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_blocks) return;
  const int64_t r = i / blocks_per_row, b = i % blocks_per_row;
  float v[32];
  q::Q8_0::Dequant(src + r * blocks_per_row * q::Q8_0::kBlockBytes, b, v);
  __half2* o = reinterpret_cast<__half2*>(dst + i * 32);
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
}

// One block per query head.
__global__ void AttendTailKernel(float* o, const float* ratio, const float* mean_v, int n_rep,
                                 int head_dim) {
  WaitForPrevious();
  LetNextStart();
  const int h = blockIdx.x;
  const float r = ratio[h];
  if (r == 0.0f) return;
  const float w = 1.0f / (1.0f + r);
  const float* mv = mean_v + (h / n_rep) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float* p = o + h * head_dim + i;
    *p = __fmul_rn(__fadd_rn(*p, __fmul_rn(r, mv[i])), w);
  }
}

template <class B>
void PrepareType() {
  (void)ResidentBlocks<QMatmulKernel<B, 1>>();
  (void)ResidentBlocks<QMatmulKernel<B, 2>>();
  (void)ResidentBlocks<QMatmulKernel<B, 4>>();
  (void)ResidentBlocks<QMatmulKernel<B, 8>>();
}

}  // namespace

void PrepareQuantLaunches() {
  PrepareType<q::Q4_0>();
  PrepareType<q::Q4_1>();
  PrepareType<q::Q8_0>();
  PrepareType<q::Q4_K>();
  PrepareType<q::Q6_K>();
}

void ExpandQ8_0Rows(const uint8_t* src, int64_t n_rows, int64_t n, uint16_t* dst, void* stream) {
  const int64_t n_blocks = n_rows * (n / 32);
  if (n_blocks > 0)
    Launch<ExpandQ8_0Kernel>(unsigned((n_blocks + 127) / 128), 128, 0, S(stream), src, n_blocks,
                             n / 32, reinterpret_cast<__half*>(dst));
}

void AttendTail(float* o, const float* ratio, const float* mean_v, int n_head, int n_rep,
                int head_dim, void* stream) {
  if (n_head > 0)
    Launch<AttendTailKernel>(n_head, 64, 0, S(stream), o, ratio, mean_v, n_rep, head_dim);
}

bool QuantizedWeightType(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void QMatmulParts(DType type, const QMatmulPart* parts, int n_parts, int64_t k, const int8_t* xq,
                  const q::ActScale* xs, int64_t n_tok, void* stream) {
  if (n_parts <= 0 || n_parts > 3 || n_tok <= 0) return;
  QPartsArg a{};
  a.n = n_parts;
  for (int i = 0; i < n_parts; ++i) a.part[i] = parts[i];
  switch (type) {
    case DType::kQ4_0:
      return LaunchQMatmul<q::Q4_0>(a, n_parts, k, xq, xs, n_tok, S(stream));
    case DType::kQ4_1:
      return LaunchQMatmul<q::Q4_1>(a, n_parts, k, xq, xs, n_tok, S(stream));
    case DType::kQ8_0:
      return LaunchQMatmul<q::Q8_0>(a, n_parts, k, xq, xs, n_tok, S(stream));
    case DType::kQ4_K:
      return LaunchQMatmul<q::Q4_K>(a, n_parts, k, xq, xs, n_tok, S(stream));
    case DType::kQ6_K:
      return LaunchQMatmul<q::Q6_K>(a, n_parts, k, xq, xs, n_tok, S(stream));
    default:
      return;
  }
}

void DequantizeF16(DType type, const uint8_t* w, int64_t r0, int64_t r1, int64_t k, uint16_t* out,
                   void* stream) {
  switch (type) {
    case DType::kQ4_0:
      return LaunchDequant<q::Q4_0>(w, r0, r1, k, out, S(stream));
    case DType::kQ4_1:
      return LaunchDequant<q::Q4_1>(w, r0, r1, k, out, S(stream));
    case DType::kQ8_0:
      return LaunchDequant<q::Q8_0>(w, r0, r1, k, out, S(stream));
    case DType::kQ4_K:
      return LaunchDequant<q::Q4_K>(w, r0, r1, k, out, S(stream));
    case DType::kQ6_K:
      return LaunchDequant<q::Q6_K>(w, r0, r1, k, out, S(stream));
    default:
      return;
  }
}

void F32ToF16(const float* x, int64_t n, uint16_t* out, void* stream) {
  if (n > 0)
    Launch<F32ToF16Kernel>(unsigned((n + 255) / 256), 256, 0, S(stream), x, n,
                           reinterpret_cast<__half*>(out));
}

bool GemmF16(void* blas, const uint16_t* w, int64_t rows, int64_t k, const uint16_t* x,
             int64_t n_tok, float* y, int64_t ldy) {
  if (rows <= 0 || n_tok <= 0) return true;
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: W^T (rows x k, W stored k-major) times X (k x n_tok) into Y (rows x
  // n_tok, leading dimension ldy).
  const CublasApi* api = Cublas(nullptr);  // loaded when the handle was made
  if (api == nullptr) return false;
  const cublasStatus_t st =
      api->gemm_ex(static_cast<cublasHandle_t>(blas), CUBLAS_OP_T, CUBLAS_OP_N, int(rows),
                   int(n_tok), int(k), &one, w, CUDA_R_16F, int(k), x, CUDA_R_16F, int(k), &zero, y,
                   CUDA_R_32F, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS;
}

}  // namespace strata::kernels::cuda
