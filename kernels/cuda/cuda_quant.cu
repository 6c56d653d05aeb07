// Quantized-weight kernels (see cuda_kernels.h): dequantizing GEMVs for decode-sized
// batches, dequantization to F16 and cuBLAS GEMMs for prefill. The per-block arithmetic is
// quant_blocks.h's, shared with the host tests.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
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

// One warp (a block) per R weight rows at a time. Lane i takes units i, i + 32, ... of the
// rows (whole GGUF blocks, or fixed parts of a super-block), for up to NT tokens at once so
// each weight is read once per NT tokens; then the warp reduces. A token's sum over a row runs
// over the same units on the same lanes in the same order whatever R, NT and n_tok are, so
// its result is independent of the batch and of R. (Splitting a long row over 2-4 warps of a
// block, with a shared-memory reduction, measured slower on an H200; see
// docs/experiments/gpu.md for the launch shapes tried.)
//
// R rows a warp: the R rows' dot products with a unit take the same activations, which the
// warp loads once for all of them (SumUnit), and the R rows' weights are independent loads in
// flight together. A row's activations (k int8 and k / 32 scales) are more bytes
// than its Q4 weights, so with one row a warp the GEMV moved more activation bytes through
// L1 and L2 than weight bytes from DRAM.
//
// The grid is what the GPU holds at once (ResidentBlocks), and each warp walks the row groups
// n_warps apart: while it sums one group, the next one's lines are already on their way into
// L2, so the latency of DRAM is paid once a pair of groups, not once a row. The rows of all
// parts form one range, part after part; a group may straddle two parts.
struct QPartsArg {
  QMatmulPart part[3];
  int64_t first_row[4];
  int n;
};

// acc[j][t] += unit u of row j dotted with token t, for R rows and nt <= NT tokens: each
// row's weights loaded once, each token's activations once for all R rows.
template <class B, int NT, int R>
__device__ __forceinline__ void SumUnit(const uint8_t* const* row, int64_t u, const int8_t* xq,
                                        const q::ActScale* xs, int64_t k, int nt,
                                        float (*acc)[NT]) {
  typename B::W w[R];
#pragma unroll
  for (int j = 0; j < R; ++j) w[j] = B::Load(row[j], u);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= nt) break;
    int x[B::kUnit / 4];
    q::ActScale a[B::kUnit / 32];
    q::LoadUnitActs<B::kUnit>(xq + t * k, xs + t * (k / 32), u, x, a);
#pragma unroll
    for (int j = 0; j < R; ++j) B::Acc(w[j], x, a, &acc[j][t]);
  }
}

template <class B, int NT, int R>
__global__ void __launch_bounds__(32)
    QMatmulKernel(const QPartsArg a, int64_t k, const int8_t* xq, const q::ActScale* xs,
                  int64_t n_tok, int64_t prefetch_bytes) {
  const int lane = threadIdx.x & 31;
  const int64_t n_warps = gridDim.x, total = a.first_row[a.n];
  const int64_t n_groups = (total + R - 1) / R;
  const int64_t row_bytes = k / B::kBlockElems * B::kBlockBytes;
  // Row g of the joined range: its weights, its part and its index in the part.
  auto row_of = [&](int64_t g, int* p, int64_t* r) {
    int i = 0;
    while (i + 1 < a.n && g >= a.first_row[i + 1]) ++i;
    *p = i;
    *r = g - a.first_row[i];
    return a.part[i].w + *r * row_bytes;
  };
  auto prefetch_group = [&](int64_t grp) {
    int p;
    int64_t r;
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (grp * R + j < total) PrefetchL2(row_of(grp * R + j, &p, &r), prefetch_bytes, lane);
  };
  // The weights are the one input no kernel writes: the first rows are on their way into L2
  // while the kernel before (a norm, a quantization) finishes.
  if (int64_t(blockIdx.x) < n_groups) prefetch_group(blockIdx.x);
  WaitForPrevious();
  LetNextStart();
  const int64_t units = k / B::kUnit;
  // Units in flight per lane: four with one row (measured best), fewer with more rows.
  constexpr int kUnroll = R >= 4 ? 1 : 4 / R;
  for (int64_t grp = blockIdx.x; grp < n_groups; grp += n_warps) {
    if (grp + n_warps < n_groups) prefetch_group(grp + n_warps);
    const uint8_t* row[R];
    int part[R];
    int64_t index[R];
    // Rows past the end repeat the last row; their sums are not stored.
    const int valid = total - grp * R < R ? int(total - grp * R) : R;
#pragma unroll
    for (int j = 0; j < R; ++j)
      row[j] = row_of(grp * R + (j < valid ? j : valid - 1), &part[j], &index[j]);
    for (int64_t t0 = 0; t0 < n_tok; t0 += NT) {
      const int nt = n_tok - t0 < NT ? int(n_tok - t0) : NT;
      float acc[R][NT];
#pragma unroll
      for (int j = 0; j < R; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[j][t] = 0.f;
      const int8_t* x = xq + t0 * k;
      const q::ActScale* s = xs + t0 * (k / 32);
      // Whole chunks (every decode step of one sequence) take the branch with nt constant, so
      // its token loop unrolls without exits.
      if (nt == NT) {
#pragma unroll kUnroll
        for (int64_t u = lane; u < units; u += 32) SumUnit<B, NT, R>(row, u, x, s, k, NT, acc);
      } else {
        for (int64_t u = lane; u < units; u += 32) SumUnit<B, NT, R>(row, u, x, s, k, nt, acc);
      }
#pragma unroll
      for (int j = 0; j < R; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            const float v = WarpSum(acc[j][t]);
            if (lane == 0 && j < valid)
              a.part[part[j]].y[(t0 + t) * a.part[part[j]].rows + index[j]] = v;
          }
        }
    }
  }
}

// Rows a warp sums at once (R of QMatmulKernel): STRATA_CUDA_GEMV_ROWS (1, 2 or 4) when set,
// else SetGemvRowsPerWarp's, else two rows for one or two tokens and four for more (the
// fastest of 1, 2 and 4 on an H200 at each: docs/experiments/gpu.md).
std::atomic<int> g_rows_per_warp{0};
int RowsPerWarp(int64_t n_tok) {
  static const int env = [] {
    const char* v = std::getenv("STRATA_CUDA_GEMV_ROWS");
    if (v == nullptr) return 0;
    const int r = std::atoi(v);
    return r == 1 || r == 2 || r == 4 ? r : 0;
  }();
  if (env != 0) return env;
  const int set = g_rows_per_warp.load(std::memory_order_relaxed);
  return set != 0 ? set : n_tok <= 2 ? 2 : 4;
}

// Bytes of each row of its next group a warp prefetches into L2 (see QMatmulKernel), for
// `warps` warps of R rows of row_bytes: STRATA_CUDA_GEMV_PREFETCH = a byte count, "all" or
// "l2" (half the L2 cache shared by the warps' next groups) when set; else all.
int64_t PrefetchBytes(int64_t row_bytes, int64_t warps, int r) {
  static const int64_t env = [] {
    const char* v = std::getenv("STRATA_CUDA_GEMV_PREFETCH");
    if (v == nullptr || std::strcmp(v, "all") == 0) return int64_t(-1);
    if (std::strcmp(v, "l2") == 0) return int64_t(-2);
    return int64_t(std::atoll(v));
  }();
  static const int64_t l2 = [] {
    int device = 0, bytes = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess)
      return int64_t(0);
    return int64_t(bytes);
  }();
  if (env == -1) return row_bytes;
  if (env == -2) return std::min(row_bytes, l2 / 2 / std::max<int64_t>(1, warps * r) / 128 * 128);
  return std::min(row_bytes, env);
}

// Blocks of `Kernel` (32 threads, no shared memory) the GPU holds at once; asked once per
// kernel, by PrepareQuantLaunches outside any graph capture. STRATA_CUDA_GEMV_RESIDENT=0
// gives 0: one block per row group, as the GPU schedules them (for measuring the difference).
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

template <auto Kernel, int R>
void LaunchRows(QPartsArg a, int64_t k, int64_t row_bytes, const int8_t* xq, const q::ActScale* xs,
                int64_t n_tok, cudaStream_t s) {
  const int64_t groups = (a.first_row[a.n] + R - 1) / R, resident = ResidentBlocks<Kernel>();
  const int64_t blocks = resident > 0 ? std::min(groups, resident) : groups;
  Launch<Kernel>(dim3(unsigned(blocks)), dim3(32), 0, s, a, k, xq, xs, n_tok,
                 PrefetchBytes(row_bytes, blocks, R));
}

template <class B, int R>
void LaunchQMatmulR(QPartsArg a, int64_t k, const int8_t* xq, const q::ActScale* xs, int64_t n_tok,
                    cudaStream_t s) {
  const int64_t rb = k / B::kBlockElems * B::kBlockBytes;
  if (n_tok == 1)
    LaunchRows<QMatmulKernel<B, 1, R>, R>(a, k, rb, xq, xs, n_tok, s);
  else if (n_tok == 2)
    LaunchRows<QMatmulKernel<B, 2, R>, R>(a, k, rb, xq, xs, n_tok, s);
  else if (n_tok <= 4)
    LaunchRows<QMatmulKernel<B, 4, R>, R>(a, k, rb, xq, xs, n_tok, s);
  else
    LaunchRows<QMatmulKernel<B, 8, R>, R>(a, k, rb, xq, xs, n_tok, s);
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
  switch (RowsPerWarp(n_tok)) {
    case 1:
      return LaunchQMatmulR<B, 1>(a, k, xq, xs, n_tok, s);
    case 2:
      return LaunchQMatmulR<B, 2>(a, k, xq, xs, n_tok, s);
    default:
      return LaunchQMatmulR<B, 4>(a, k, xq, xs, n_tok, s);
  }
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

template <class B, int R>
void PrepareRows() {
  (void)ResidentBlocks<QMatmulKernel<B, 1, R>>();
  (void)ResidentBlocks<QMatmulKernel<B, 2, R>>();
  (void)ResidentBlocks<QMatmulKernel<B, 4, R>>();
  (void)ResidentBlocks<QMatmulKernel<B, 8, R>>();
}
template <class B>
void PrepareType() {
  PrepareRows<B, 1>();
  PrepareRows<B, 2>();
  PrepareRows<B, 4>();
}

}  // namespace

void PrepareQuantLaunches() {
  (void)PrefetchBytes(0, 1, 1);  // asks the GPU its L2 size now, outside any capture
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

int SetGemvRowsPerWarp(int rows) {
  return g_rows_per_warp.exchange(rows == 1 || rows == 2 || rows == 4 ? rows : 0,
                                  std::memory_order_relaxed);
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
