// CUDA kernels (see cuda_kernels.h). Written for clarity first: the models Strata targets on
// a GPU are small, so a pass is bound by launches and memory traffic, not by arithmetic.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

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
__device__ float WarpMax(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

__device__ void Unpack8(const uint4& u, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// One warp per output row; tokens in chunks of kTokChunk so a row of W is read once per
// chunk. Each lane sums its own columns in a fixed order, then the warp reduces: the
// result for (t, r) depends on neither n_tok nor the chunking.
constexpr int kRowsPerBlock = 8;
constexpr int kTokChunk = 8;
__device__ void MatmulRow(const __half* __restrict__ w, int64_t rows, int64_t k, const float* x,
                          int64_t n_tok, float* __restrict__ y, int64_t r, int lane) {
  const uint4* wr = reinterpret_cast<const uint4*>(w + r * k);
  const int64_t groups = k / 8;
  for (int64_t t0 = 0; t0 < n_tok; t0 += kTokChunk) {
    const int nt = n_tok - t0 < kTokChunk ? int(n_tok - t0) : kTokChunk;
    float acc[kTokChunk];
#pragma unroll
    for (int j = 0; j < kTokChunk; ++j) acc[j] = 0.f;
    for (int64_t g = lane; g < groups; g += 32) {
      float wf[8];
      Unpack8(wr[g], wf);
#pragma unroll
      for (int j = 0; j < kTokChunk; ++j) {
        if (j < nt) {
          const float4* xp = reinterpret_cast<const float4*>(x + (t0 + j) * k + g * 8);
          const float4 a = xp[0], b = xp[1];
          float s = acc[j];
          s = fmaf(wf[0], a.x, s);
          s = fmaf(wf[1], a.y, s);
          s = fmaf(wf[2], a.z, s);
          s = fmaf(wf[3], a.w, s);
          s = fmaf(wf[4], b.x, s);
          s = fmaf(wf[5], b.y, s);
          s = fmaf(wf[6], b.z, s);
          s = fmaf(wf[7], b.w, s);
          acc[j] = s;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kTokChunk; ++j) {
      if (j < nt) {
        const float s = WarpSum(acc[j]);
        if (lane == 0) y[(t0 + j) * rows + r] = s;
      }
    }
  }
}

// Each part has whole blocks of its own, so a block's warps all work for one part.
struct MatmulPartsArg {
  MatmulPart part[kMaxMatmulParts];
  unsigned first_block[kMaxMatmulParts + 1];
  int n;
};

__global__ void MatmulF16PartsKernel(const MatmulPartsArg a, int64_t k, const float* x,
                                     int64_t n_tok) {
  WaitForPrevious();
  LetNextStart();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int p = 0;
  while (p + 1 < a.n && blockIdx.x >= a.first_block[p + 1]) ++p;
  const MatmulPart& part = a.part[p];
  const int64_t r = int64_t(blockIdx.x - a.first_block[p]) * kRowsPerBlock + warp;
  if (r < part.rows)
    MatmulRow(reinterpret_cast<const __half*>(part.w), part.rows, k, x, n_tok, part.y, r, lane);
}

// Writes lane's value v of a block of 32 consecutive values quantized (ActQuant): the
// warp's 32 lanes hold one block.
__device__ void QuantizeLane(float v, int lane, int8_t* q, q::ActScale* s) {
  const float d = q::ActScaleOf(WarpMax(fabsf(v)));
  const int qi = q::ActQuant(v, d);
  q[lane] = int8_t(qi);
  int sum = qi;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(kFull, sum, off);
  if (lane == 0) *s = {d, d * float(sum)};
}

// One block per row, the row held in registers (kPer values a thread: element j * blockDim
// + thread), so it is read once: squares summed per thread, per warp, then warp 0 sums the
// warps in order. With kAdd, the row first takes d's row (x += d) and is normed as Add then
// RmsNormRows would norm it: the same values, summed in the same order. With act.q, each
// warp's 32 outputs of a pass (a whole block: blockDim and n are multiples of 32) are
// quantized too.
template <bool kAdd, int kPer>
__global__ void RmsNormKernel(float* x, const float* d, const float* weight, float* y, int64_t n,
                              float eps, ActOut act) {
  __shared__ float part[32];
  float* xr = x + int64_t(blockIdx.x) * n;
  float* yr = y + int64_t(blockIdx.x) * n;
  const int64_t stride = blockDim.x;
  // The norm's weights are read while the kernel before finishes (they are the model's), not
  // after the reduction: the row is the only memory wait on the way.
  float v[kPer], w[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = j * stride + threadIdx.x;
    w[j] = weight && i < n ? weight[i] : 1.f;
  }
  WaitForPrevious();
  LetNextStart();
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = j * stride + threadIdx.x;
    v[j] = 0.f;
    if (i < n) {
      v[j] = xr[i];
      if (kAdd) {
        v[j] += d[int64_t(blockIdx.x) * n + i];
        xr[i] = v[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) ss = fmaf(v[j], v[j], ss);
  ss = WarpSum(ss);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    const int nw = int(blockDim.x + 31) >> 5;
    float t = lane < nw ? part[lane] : 0.f;
    t = WarpSum(t);
    if (lane == 0) part[0] = t;
  }
  __syncthreads();
  const float scale = float(1.0 / sqrt(double(part[0]) / double(n) + double(eps)));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = j * stride + threadIdx.x;
    // The pass's first element of this warp decides for the whole warp (n % 32 == 0 when
    // quantizing), so the shuffles of QuantizeLane see all 32 lanes.
    if (j * stride + warp * 32 >= n) break;
    float o = 0.f;
    if (i < n) {
      o = v[j] * scale * w[j];
      yr[i] = o;
    }
    if (act.q)
      QuantizeLane(o, lane, act.q + int64_t(blockIdx.x) * n + (i - lane),
                   act.s + (int64_t(blockIdx.x) * n + i - lane) / 32);
  }
}

// Rotates element pair j of head h of token t of one tensor by the angle whose cosine and
// sine are c and s (see RopeRows).
__device__ void RopePair(float* x, int64_t t, int64_t stride, int h, int head_dim, int j, int half,
                         float c, float s, bool neox) {
  float* v = x + t * stride + int64_t(h) * head_dim;
  const int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
  const float p = v[i0], q = v[i1];
  v[i0] = p * c - q * s;
  v[i1] = p * s + q * c;
}

// q's heads, then k's (k_heads may be 0), one thread per rotated pair.
__global__ void RopeQkKernel(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride,
                             int k_heads, int64_t n_tok, int head_dim, int rot_dim,
                             const int32_t* pos, const float* inv_freq, bool neox) {
  const int half = rot_dim / 2;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float* x = q;
  int64_t stride = q_stride;
  int heads = q_heads;
  bool live = true;
  if (i >= n_tok * q_heads * half) {
    i -= n_tok * q_heads * half;
    x = k;
    stride = k_stride;
    heads = k_heads;
    live = i < n_tok * k_heads * half;
  }
  // Positions and frequencies come from the host: the angle (in double, like the CPU's) is
  // computed while the projections before this kernel finish.
  const int64_t t = live ? i / (int64_t(half) * heads) : 0;
  const int j = live ? int(i % half) : 0;
  double a = 0.0;
  if (live) a = double(pos[t]) * double(inv_freq[j]);
  const float c = float(cos(a)), s = float(sin(a));
  WaitForPrevious();
  LetNextStart();
  if (live) RopePair(x, t, stride, int((i / half) % heads), head_dim, j, half, c, s, neox);
}

__global__ void SwiGluKernel(float* g, const float* u, int64_t n, ActOut act) {
  WaitForPrevious();
  LetNextStart();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!act.q) {
    if (i < n) {
      const float a = g[i];
      g[i] = a / (1.f + expf(-a)) * u[i];
    }
    return;
  }
  // n % 32 == 0: a warp is one whole block, or past the end.
  if (i - (threadIdx.x & 31) >= n) return;
  const float a = g[i];
  const float v = a / (1.f + expf(-a)) * u[i];
  g[i] = v;
  const int64_t base = i - (threadIdx.x & 31);
  QuantizeLane(v, int(threadIdx.x & 31), act.q + base, act.s + base / 32);
}

__global__ void QuantizeKernel(const float* x, int64_t n, ActOut act) {
  WaitForPrevious();
  LetNextStart();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t base = i - (threadIdx.x & 31);
  if (base >= n) return;
  QuantizeLane(x[i], int(threadIdx.x & 31), act.q + base, act.s + base / 32);
}

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  WaitForPrevious();
  LetNextStart();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void AddRowBiasKernel(float* y, const float* b, int64_t total, int64_t n) {
  WaitForPrevious();
  LetNextStart();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) y[i] += b[i % n];
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, float* dst, int64_t n) {
  WaitForPrevious();
  LetNextStart();
  const float* s = src + int64_t(rows[blockIdx.x]) * n;
  float* d = dst + int64_t(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

constexpr int64_t kStoreChunk = 4096;
__global__ void StoreF16Kernel(const StoreF16Op* ops) {
  WaitForPrevious();
  LetNextStart();
  const StoreF16Op op = ops[blockIdx.x];
  const int64_t begin = int64_t(blockIdx.y) * kStoreChunk;
  const int64_t end = min(op.n, begin + kStoreChunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    op.dst[i] = __half_as_ushort(__float2half_rn(op.src[i]));
}

__global__ void StoreF16CountedKernel(const StoreF16Op* ops, const int32_t* n_ops) {
  // The op list comes from the host; the values it copies come from the kernels before.
  const bool mine = int32_t(blockIdx.x) < *n_ops;
  StoreF16Op op{};
  if (mine) op = ops[blockIdx.x];
  WaitForPrevious();
  LetNextStart();
  if (!mine) return;
  const int64_t begin = int64_t(blockIdx.y) * kStoreChunk;
  const int64_t end = min(op.n, begin + kStoreChunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    op.dst[i] = __half_as_ushort(__float2half_rn(op.src[i]));
}

constexpr uint64_t kCopyChunk = 16384;
__global__ void CopyExtentsKernel(const CopyOp* ops) {
  WaitForPrevious();
  LetNextStart();
  const CopyOp op = ops[blockIdx.x];
  const uint64_t begin = uint64_t(blockIdx.y) * kCopyChunk;
  if (begin >= op.bytes) return;
  const uint64_t end = min(op.bytes, begin + kCopyChunk);
  const uint4* s = static_cast<const uint4*>(op.src);
  uint4* d = static_cast<uint4*>(op.dst);
  for (uint64_t i = begin / 16 + threadIdx.x; i < end / 16; i += blockDim.x) d[i] = s[i];
}

// One block per (query token, KV head). The block's warps are n_rep query heads x `splits`
// key splits: warp (r, j) scores query head r against key tiles j, j + splits, ... (tiles of
// 32 keys in the order of the spans: lane i takes key tile*32 + i) with an online softmax,
// accumulating V lane-per-dimension; then split 0 merges the splits' partial results in
// split order. Tiles and splits follow the flattened key order and the model's shape only,
// never the span boundaries or the rest of the batch, so equal key sequences give equal
// bits whatever the grouping.
constexpr int kAttentionMaxWarps = 16;
template <int kDpl>
__global__ void __launch_bounds__(32 * kAttentionMaxWarps)
    AttentionKernel(AttentionBatch a, int splits) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, h = blockIdx.y, chunk = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = warp % a.n_rep, split = warp / a.n_rep;
  const int hd = a.head_dim;
  const int q_stride = a.n_head_kv * a.n_rep * hd;
  const int qh = h * a.n_rep + r;
  float* qs = smem + warp * hd;                // this warp's scaled query
  float* part = smem + a.n_rep * splits * hd;  // per warp: m, l, acc[hd]
  float* mine = part + warp * (hd + 2);
  // The pass's token table and spans come from the host, not from a kernel: read while the
  // kernel before (the store of the new keys) finishes.
  const int seq = a.tok_seq[t];
  const int32_t qpos = a.tok_pos[t];
  const int sb = a.span_begin[seq], se = a.span_begin[seq + 1];
  WaitForPrevious();
  LetNextStart();
  for (int d = lane; d < hd; d += 32) qs[d] = a.q[int64_t(t) * q_stride + qh * hd + d] * a.scale;
  __syncwarp();

  float m = -INFINITY, l = 0.f, acc[kDpl];
#pragma unroll
  for (int i = 0; i < kDpl; ++i) acc[i] = 0.f;
  // Keys [k_end - chunk_keys, k_end) of the flattened span list (all of them unchunked). The
  // cursor (span si, offset off) is the first key of this warp's next tile, kidx its index.
  const int64_t k0 = int64_t(chunk) * a.chunk_keys;
  const int64_t k_end = a.chunk_keys > 0 ? k0 + a.chunk_keys : INT64_MAX;
  int64_t kidx = k0 + 32 * split;
  int si = sb;
  int64_t off = kidx;
  while (si < se && off >= a.spans[si].n_tokens) {
    off -= a.spans[si].n_tokens;
    ++si;
  }
  while (si < se && kidx < k_end) {
    int s = si;
    int64_t o = off + lane;
    while (s < se && o >= a.spans[s].n_tokens) {
      o -= a.spans[s].n_tokens;
      ++s;
    }
    float score = -INFINITY;
    const __half* vp = nullptr;
    if (s < se && a.spans[s].pos0 + o <= qpos) {
      const KvSpan& sp = a.spans[s];
      const int64_t base = int64_t(o) * sp.stride + int64_t(h) * hd;
      const uint4* kp = reinterpret_cast<const uint4*>(sp.k + base);
      vp = reinterpret_cast<const __half*>(sp.v + base);
      float dot = 0.f;
#pragma unroll 4
      for (int g = 0; g < hd / 8; ++g) {
        float kf[8];
        Unpack8(kp[g], kf);
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(qs[g * 8 + e], kf[e], dot);
      }
      score = dot;
    }
    const float tile_max = WarpMax(score);
    if (tile_max > -INFINITY) {
      const float m_new = fmaxf(m, tile_max);
      const float corr = expf(m - m_new);
      const float p = vp ? expf(score - m_new) : 0.f;
      l = l * corr + WarpSum(p);
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[i] *= corr;
      // Eight keys at a time: their loads are independent and can be in flight together.
      for (int j0 = 0; j0 < 32; j0 += 8) {
        float pj[8], vv[8][kDpl];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          pj[u] = __shfl_sync(kFull, p, j0 + u);
          const auto* v = reinterpret_cast<const __half*>(
              __shfl_sync(kFull, reinterpret_cast<unsigned long long>(vp), j0 + u));
#pragma unroll
          for (int i = 0; i < kDpl; ++i)
            vv[u][i] = v && lane + 32 * i < hd ? __half2float(v[lane + 32 * i]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
          for (int i = 0; i < kDpl; ++i) acc[i] = fmaf(pj[u], vv[u][i], acc[i]);
      }
      m = m_new;
    }
    // Advance to this warp's next tile: 32 * splits keys on.
    kidx += 32 * splits;
    int64_t o2 = off + 32 * splits;
    while (si < se && o2 >= a.spans[si].n_tokens) {
      o2 -= a.spans[si].n_tokens;
      ++si;
    }
    off = o2;
  }
  if (lane == 0) {
    mine[0] = m;
    mine[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kDpl; ++i)
    if (lane + 32 * i < hd) mine[2 + lane + 32 * i] = acc[i];
  __syncthreads();
  if (split != 0) return;
  // Merge the splits of query head r in split order.
  float big = -INFINITY;
  for (int j = 0; j < splits; ++j) big = fmaxf(big, part[(j * a.n_rep + r) * (hd + 2)]);
  float lsum = 0.f, out_acc[kDpl];
#pragma unroll
  for (int i = 0; i < kDpl; ++i) out_acc[i] = 0.f;
  if (big > -INFINITY) {
    for (int j = 0; j < splits; ++j) {
      const float* pj = part + (j * a.n_rep + r) * (hd + 2);
      if (pj[0] == -INFINITY) continue;
      const float w = expf(pj[0] - big);
      lsum = fmaf(pj[1], w, lsum);
#pragma unroll
      for (int i = 0; i < kDpl; ++i)
        if (lane + 32 * i < hd) out_acc[i] = fmaf(pj[2 + lane + 32 * i], w, out_acc[i]);
    }
  }
  if (gridDim.z > 1) {
    // One chunk of several: its maximum, denominator and unnormalized sum, for the merge.
    float* pp =
        a.partial + ((int64_t(t) * a.n_head_kv * a.n_rep + qh) * gridDim.z + chunk) * (hd + 2);
    if (lane == 0) {
      pp[0] = big;
      pp[1] = lsum;
    }
#pragma unroll
    for (int i = 0; i < kDpl; ++i)
      if (lane + 32 * i < hd) pp[2 + lane + 32 * i] = out_acc[i];
    return;
  }
  float* out = a.out + int64_t(t) * q_stride + qh * hd;
  const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
  for (int i = 0; i < kDpl; ++i)
    if (lane + 32 * i < hd) out[lane + 32 * i] = out_acc[i] * inv;
}

// Joins the chunks of one (token, query head) in chunk order, with the formulas of the
// kernel's own merge of its splits: a row with one non-empty chunk gets the bits it would
// have got unchunked.
__global__ void AttentionMergeKernel(AttentionBatch a, int n_chunks) {
  WaitForPrevious();
  LetNextStart();
  const int t = blockIdx.x, qh = blockIdx.y;
  const int hd = a.head_dim;
  const int n_head = a.n_head_kv * a.n_rep;
  const float* base = a.partial + (int64_t(t) * n_head + qh) * n_chunks * (hd + 2);
  float big = -INFINITY;
  for (int c = 0; c < n_chunks; ++c) big = fmaxf(big, base[c * (hd + 2)]);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float lsum = 0.f, acc = 0.f;
    if (big > -INFINITY) {
      for (int c = 0; c < n_chunks; ++c) {
        const float* pc = base + c * (hd + 2);
        if (pc[0] == -INFINITY) continue;
        const float w = expf(pc[0] - big);
        lsum = fmaf(pc[1], w, lsum);
        acc = fmaf(pc[2 + i], w, acc);
      }
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    a.out[int64_t(t) * n_head * hd + qh * hd + i] = acc * inv;
  }
}

// Prefill-sized passes: one block per (tile of consecutive query tokens, KV head). The
// per-token kernel above reads every key once per query token and gives each lane a key
// row of its own to load; here a block stages 64 keys at a time in shared memory and
// scores them against all its query rows (kRpw rows a warp, the n_rep query heads of each
// token), so a key is read from memory once per tile. Lane i scores keys i and i + 32 of a
// stage; the online softmax and the V sums go stage by stage in key order, so a row's result
// depends on its own keys only (not on the rows beside it), though not bit for bit the
// per-token kernel's. A tile whose tokens belong to several sequences takes them one run at
// a time. Stages whose keys all lie after the tile's last query position are skipped.
constexpr int kTileWarps = 8, kTileKeys = 64;
struct TileShared {
  int kpos[kTileKeys];
  const uint4* kp[kTileKeys];
  const uint4* vp[kTileKeys];
};

size_t TiledSharedBytes(int rows, int hd) {
  return size_t(rows) * hd * sizeof(float) + size_t(kTileKeys) * (hd + 2) * sizeof(__half) +
         size_t(kTileKeys) * hd * sizeof(__half);
}

template <int kDpl, int kRpw>
__global__ void __launch_bounds__(32 * kTileWarps)
    AttentionTiledKernel(AttentionBatch a, int tile_tokens) {
  WaitForPrevious();
  LetNextStart();
  extern __shared__ float4 tiled_smem[];
  __shared__ TileShared ts;
  const int hd = a.head_dim, n_rep = a.n_rep, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q_stride = a.n_head_kv * n_rep * hd;
  const int ks = hd + 2;  // K stage row stride in halves: an odd word count, so the lanes'
                          // different keys fall in different banks
  float* qs = reinterpret_cast<float*>(tiled_smem);  // [kTileWarps * kRpw][hd], scaled
  __half* kt = reinterpret_cast<__half*>(qs + kTileWarps * kRpw * hd);  // [kTileKeys][ks]
  __half* vt = kt + kTileKeys * ks;                                     // [kTileKeys][hd]
  const int pieces = hd / 8;  // 16-byte pieces of a key's row
  const int t_end = min(a.n_tok, int(blockIdx.x + 1) * tile_tokens);
  for (int s0 = int(blockIdx.x) * tile_tokens; s0 < t_end;) {
    const int seq = a.tok_seq[s0];
    int s1 = s0 + 1;
    while (s1 < t_end && a.tok_seq[s1] == seq) ++s1;
    const int n_rows = (s1 - s0) * n_rep;
    int32_t qmax = INT_MIN;
    for (int t = s0; t < s1; ++t) qmax = max(qmax, a.tok_pos[t]);
    for (int i = threadIdx.x; i < n_rows * hd; i += blockDim.x) {
      const int row = i / hd, d = i % hd;
      const int qh = h * n_rep + row % n_rep;
      qs[i] = a.q[int64_t(s0 + row / n_rep) * q_stride + qh * hd + d] * a.scale;
    }
    int32_t qpos[kRpw];
    float m[kRpw], l[kRpw], acc[kRpw][kDpl];
#pragma unroll
    for (int r = 0; r < kRpw; ++r) {
      const int row = warp * kRpw + r;
      qpos[r] = row < n_rows ? a.tok_pos[s0 + row / n_rep] : INT_MIN;
      m[r] = -INFINITY;
      l[r] = 0.f;
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[r][i] = 0.f;
    }
    const int sb = a.span_begin[seq], se = a.span_begin[seq + 1];
    int si = sb;
    int64_t off = 0;
    while (si < se && a.spans[si].n_tokens == 0) ++si;
    while (si < se) {
      __syncthreads();  // the previous stage (or segment) is no longer read
      if (threadIdx.x < kTileKeys) {
        int s = si;
        int64_t o = off + threadIdx.x;
        while (s < se && o >= a.spans[s].n_tokens) {
          o -= a.spans[s].n_tokens;
          ++s;
        }
        if (s < se) {
          const KvSpan& sp = a.spans[s];
          const int64_t base = o * sp.stride + int64_t(h) * hd;
          ts.kpos[threadIdx.x] = sp.pos0 + int32_t(o);
          ts.kp[threadIdx.x] = reinterpret_cast<const uint4*>(sp.k + base);
          ts.vp[threadIdx.x] = reinterpret_cast<const uint4*>(sp.v + base);
        } else {
          ts.kpos[threadIdx.x] = INT_MAX;
          ts.kp[threadIdx.x] = nullptr;
          ts.vp[threadIdx.x] = nullptr;
        }
      }
      __syncthreads();
      const bool live = threadIdx.x < kTileKeys && ts.kpos[threadIdx.x] <= qmax;
      if (__syncthreads_or(live)) {
        for (int c = threadIdx.x; c < kTileKeys * pieces; c += blockDim.x) {
          const int j = c / pieces, p = c % pieces;
          uint4 kk = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
          if (ts.kp[j]) {
            kk = ts.kp[j][p];
            vv = ts.vp[j][p];
          }
          reinterpret_cast<uint4*>(vt + j * hd)[p] = vv;
          unsigned* kd = reinterpret_cast<unsigned*>(kt + j * ks + p * 8);
          kd[0] = kk.x;
          kd[1] = kk.y;
          kd[2] = kk.z;
          kd[3] = kk.w;
        }
        __syncthreads();
        if (warp * kRpw < n_rows) {
          float sc[kRpw][2];
#pragma unroll
          for (int r = 0; r < kRpw; ++r) sc[r][0] = sc[r][1] = 0.f;
          const __half2* k0 = reinterpret_cast<const __half2*>(kt + lane * ks);
          const __half2* k1 = reinterpret_cast<const __half2*>(kt + (lane + 32) * ks);
          const float* qw = qs + warp * kRpw * hd;
          for (int d2 = 0; d2 < hd / 2; ++d2) {
            const float2 a0 = __half22float2(k0[d2]), a1 = __half22float2(k1[d2]);
#pragma unroll
            for (int r = 0; r < kRpw; ++r) {
              const float2 qv = reinterpret_cast<const float2*>(qw + r * hd)[d2];
              sc[r][0] = fmaf(qv.y, a0.y, fmaf(qv.x, a0.x, sc[r][0]));
              sc[r][1] = fmaf(qv.y, a1.y, fmaf(qv.x, a1.x, sc[r][1]));
            }
          }
          const int32_t p0 = ts.kpos[lane], p1 = ts.kpos[lane + 32];
          float pr[kRpw][2];
#pragma unroll
          for (int r = 0; r < kRpw; ++r) {
            const bool v0 = p0 <= qpos[r], v1 = p1 <= qpos[r];
            const float x0 = v0 ? sc[r][0] : -INFINITY, x1 = v1 ? sc[r][1] : -INFINITY;
            const float tile_max = WarpMax(fmaxf(x0, x1));
            pr[r][0] = pr[r][1] = 0.f;
            if (tile_max > -INFINITY) {
              const float m_new = fmaxf(m[r], tile_max);
              const float corr = expf(m[r] - m_new);
              pr[r][0] = v0 ? expf(x0 - m_new) : 0.f;
              pr[r][1] = v1 ? expf(x1 - m_new) : 0.f;
              l[r] = l[r] * corr + WarpSum(pr[r][0] + pr[r][1]);
#pragma unroll
              for (int i = 0; i < kDpl; ++i) acc[r][i] *= corr;
              m[r] = m_new;
            }
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
#pragma unroll 4
            for (int jj = 0; jj < 32; ++jj) {
              const __half* v = vt + (half * 32 + jj) * hd;
              float vv[kDpl];
#pragma unroll
              for (int i = 0; i < kDpl; ++i)
                vv[i] = lane + 32 * i < hd ? __half2float(v[lane + 32 * i]) : 0.f;
#pragma unroll
              for (int r = 0; r < kRpw; ++r) {
                const float pj = __shfl_sync(kFull, pr[r][half], jj);
#pragma unroll
                for (int i = 0; i < kDpl; ++i) acc[r][i] = fmaf(pj, vv[i], acc[r][i]);
              }
            }
          }
        }
      }
      off += kTileKeys;
      while (si < se && off >= a.spans[si].n_tokens) {
        off -= a.spans[si].n_tokens;
        ++si;
      }
    }
#pragma unroll
    for (int r = 0; r < kRpw; ++r) {
      const int row = warp * kRpw + r;
      if (row >= n_rows) continue;
      float* out = a.out + int64_t(s0 + row / n_rep) * q_stride + (h * n_rep + row % n_rep) * hd;
      const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
      for (int i = 0; i < kDpl; ++i)
        if (lane + 32 * i < hd) out[lane + 32 * i] = acc[r][i] * inv;
    }
    __syncthreads();  // qs is rewritten by the next segment
    s0 = s1;
  }
}

template <int kDpl, int kRpw>
void LaunchTiled(const AttentionBatch& a, cudaStream_t s) {
  const int rows = kTileWarps * kRpw;
  const int tile_tokens = rows / a.n_rep;
  const size_t shared = TiledSharedBytes(rows, a.head_dim);
  auto* kernel = AttentionTiledKernel<kDpl, kRpw>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
  const dim3 grid(unsigned((a.n_tok + tile_tokens - 1) / tile_tokens), unsigned(a.n_head_kv));
  Launch<AttentionTiledKernel<kDpl, kRpw>>(grid, 32 * kTileWarps, shared, s, a, tile_tokens);
}

template <int kDpl>
void LaunchTiledRows(const AttentionBatch& a, int rpw, cudaStream_t s) {
  if (rpw >= 8)
    LaunchTiled<kDpl, 8>(a, s);
  else if (rpw >= 4)
    LaunchTiled<kDpl, 4>(a, s);
  else
    LaunchTiled<kDpl, 2>(a, s);
}

unsigned Blocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

bool LaunchesOverlap() {
  static const bool overlap = [] {
    const char* env = std::getenv("STRATA_CUDA_PDL");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return false;
    cudaFuncAttributes attr{};
    // The wait and the trigger exist in code built for compute capability 9.0 and later only.
    return major >= 9 &&
           cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(AddKernel)) == cudaSuccess &&
           attr.ptxVersion >= 90;
  }();
  return overlap;
}

void PrepareLaunches() {
  (void)LaunchesOverlap();
  PrepareQuantLaunches();
}

void MatmulF16(const uint16_t* w, int64_t rows, int64_t k, const float* x, int64_t n_tok, float* y,
               void* stream) {
  const MatmulPart part{w, rows, y};
  MatmulF16Parts(&part, 1, k, x, n_tok, stream);
}

void MatmulF16Parts(const MatmulPart* parts, int n_parts, int64_t k, const float* x, int64_t n_tok,
                    void* stream) {
  if (n_parts <= 0 || n_parts > kMaxMatmulParts || n_tok <= 0) return;
  MatmulPartsArg a{};
  a.n = n_parts;
  unsigned blocks = 0;
  for (int i = 0; i < n_parts; ++i) {
    a.part[i] = parts[i];
    a.first_block[i] = blocks;
    blocks += parts[i].rows > 0 ? Blocks(parts[i].rows, kRowsPerBlock) : 0;
  }
  a.first_block[n_parts] = blocks;
  if (blocks > 0)
    Launch<MatmulF16PartsKernel>(blocks, 32 * kRowsPerBlock, 0, S(stream), a, k, x, n_tok);
}

// Threads and values a thread for a row of n: the fewest values (1, 2, 4, 8, 16) that fit
// 1024 threads, then whole warps enough for the row. Rows longer than kMaxNormRow are refused
// by the forward pass.
template <bool kAdd>
void LaunchRmsNorm(float* x, const float* d, const float* weight, float* y, int64_t n_rows,
                   int64_t n, float eps, cudaStream_t s, ActOut act) {
  if (n_rows <= 0 || n <= 0) return;
  const int per = n <= 1024 ? 1 : n <= 2048 ? 2 : n <= 4096 ? 4 : n <= 8192 ? 8 : 16;
  const int threads = int(std::min<int64_t>(1024, ((n + per - 1) / per + 31) / 32 * 32));
  const unsigned blocks = unsigned(n_rows);
  switch (per) {
    case 1:
      Launch<RmsNormKernel<kAdd, 1>>(blocks, threads, 0, s, x, d, weight, y, n, eps, act);
      break;
    case 2:
      Launch<RmsNormKernel<kAdd, 2>>(blocks, threads, 0, s, x, d, weight, y, n, eps, act);
      break;
    case 4:
      Launch<RmsNormKernel<kAdd, 4>>(blocks, threads, 0, s, x, d, weight, y, n, eps, act);
      break;
    case 8:
      Launch<RmsNormKernel<kAdd, 8>>(blocks, threads, 0, s, x, d, weight, y, n, eps, act);
      break;
    default:
      Launch<RmsNormKernel<kAdd, 16>>(blocks, threads, 0, s, x, d, weight, y, n, eps, act);
      break;
  }
}

void RmsNormRows(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n,
                 float eps, void* stream, ActOut act) {
  // x is only read (y may be x).
  LaunchRmsNorm<false>(const_cast<float*>(x), nullptr, weight, y, n_rows, n, eps, S(stream), act);
}

void AddRmsNormRows(float* x, const float* d, const float* weight, float* y, int64_t n_rows,
                    int64_t n, float eps, void* stream, ActOut act) {
  LaunchRmsNorm<true>(x, d, weight, y, n_rows, n, eps, S(stream), act);
}

void QuantizeActivations(const float* x, int64_t n_rows, int64_t k, ActOut out, void* stream) {
  const int64_t n = n_rows * k;
  if (n > 0) Launch<QuantizeKernel>(Blocks(n, 256), 256, 0, S(stream), x, n, out);
}

void RopeRows(float* x, int64_t n_tok, int64_t stride, int n_heads, int head_dim, int rot_dim,
              const int32_t* pos, const float* inv_freq, RopeLayout layout, void* stream) {
  RopeQk(x, stride, n_heads, nullptr, 0, 0, n_tok, head_dim, rot_dim, pos, inv_freq, layout,
         stream);
}

void RopeQk(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride, int k_heads,
            int64_t n_tok, int head_dim, int rot_dim, const int32_t* pos, const float* inv_freq,
            RopeLayout layout, void* stream) {
  const int64_t total = n_tok * (q_heads + k_heads) * (rot_dim / 2);
  if (total <= 0) return;
  Launch<RopeQkKernel>(Blocks(total, 256), 256, 0, S(stream), q, q_stride, q_heads, k, k_stride,
                       k_heads, n_tok, head_dim, rot_dim, pos, inv_freq,
                       layout == RopeLayout::kNeox);
}

void SwiGlu(float* gate, const float* up, int64_t n, void* stream, ActOut act) {
  if (n > 0) Launch<SwiGluKernel>(Blocks(n, 256), 256, 0, S(stream), gate, up, n, act);
}

void Add(float* y, const float* x, int64_t n, void* stream) {
  if (n > 0) Launch<AddKernel>(Blocks(n, 256), 256, 0, S(stream), y, x, n);
}

void AddRowBias(float* y, const float* b, int64_t n_rows, int64_t n, void* stream) {
  const int64_t total = n_rows * n;
  if (total > 0) Launch<AddRowBiasKernel>(Blocks(total, 256), 256, 0, S(stream), y, b, total, n);
}

void GatherRows(const float* src, const int32_t* rows, float* dst, int64_t n_rows, int64_t n,
                void* stream) {
  if (n_rows > 0) Launch<GatherRowsKernel>(unsigned(n_rows), 256, 0, S(stream), src, rows, dst, n);
}

void StoreF16(const StoreF16Op* ops, int32_t n_ops, int64_t max_n, void* stream) {
  if (n_ops <= 0 || max_n <= 0) return;
  const dim3 grid(unsigned(n_ops), unsigned((max_n + kStoreChunk - 1) / kStoreChunk));
  Launch<StoreF16Kernel>(grid, 256, 0, S(stream), ops);
}

void StoreF16Counted(const StoreF16Op* ops, const int32_t* n_ops, int32_t max_ops, int64_t max_n,
                     void* stream) {
  if (max_ops <= 0 || max_n <= 0) return;
  const dim3 grid(unsigned(max_ops), unsigned((max_n + kStoreChunk - 1) / kStoreChunk));
  Launch<StoreF16CountedKernel>(grid, 256, 0, S(stream), ops, n_ops);
}

void CopyExtents(const CopyOp* ops, int32_t n_ops, uint64_t max_bytes, void* stream) {
  if (n_ops <= 0 || max_bytes == 0) return;
  const dim3 grid(unsigned(n_ops), unsigned((max_bytes + kCopyChunk - 1) / kCopyChunk));
  Launch<CopyExtentsKernel>(grid, 256, 0, S(stream), ops);
}

// As many key splits as fit 16 warps (a block of 1024 threads would leave each at most 64
// registers), at most 8: a decode token's keys are walked by several warps per query head.
int AttentionSplits(int n_rep) { return std::max(1, std::min(8, kAttentionMaxWarps / n_rep)); }

size_t AttentionSharedBytes(int n_rep, int head_dim) {
  return size_t(n_rep * AttentionSplits(n_rep)) * (2 * size_t(head_dim) + 2) * sizeof(float);
}

void Attention(const AttentionBatch& a, void* stream) {
  if (a.n_tok <= 0) return;
  const int splits = AttentionSplits(a.n_rep);
  const int chunks = a.chunk_keys > 0 ? std::max(1, a.n_chunks) : 1;
  const dim3 grid(unsigned(a.n_tok), unsigned(a.n_head_kv), unsigned(chunks));
  const int warps = a.n_rep * splits;
  const size_t shared = AttentionSharedBytes(a.n_rep, a.head_dim);
  switch (a.head_dim / 32) {
    case 1:
      Launch<AttentionKernel<1>>(grid, 32 * warps, shared, S(stream), a, splits);
      break;
    case 2:
      Launch<AttentionKernel<2>>(grid, 32 * warps, shared, S(stream), a, splits);
      break;
    case 3:
    case 4:
      Launch<AttentionKernel<4>>(grid, 32 * warps, shared, S(stream), a, splits);
      break;
    default:
      Launch<AttentionKernel<8>>(grid, 32 * warps, shared, S(stream), a, splits);
      break;
  }
  if (chunks > 1)
    Launch<AttentionMergeKernel>(dim3(unsigned(a.n_tok), unsigned(a.n_head_kv * a.n_rep)),
                                 std::min(128, (a.head_dim + 31) / 32 * 32), 0, S(stream), a,
                                 chunks);
}

bool AttentionTiled(const AttentionBatch& a, void* stream) {
  const int hd = a.head_dim;
  if (hd % 8 != 0 || hd > 128 || a.n_rep < 1 || a.n_rep > 2 * kTileWarps || a.chunk_keys > 0)
    return false;
  if (a.n_tok <= 0) return true;
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 1;
    return n;
  }();
  // The most rows a warp (fewer loads of each key stage per row) that still leaves two
  // blocks per multiprocessor; rows a block must cover at least one token's query heads.
  int rpw = 8;
  while (rpw > 2) {
    const int tile_tokens = kTileWarps * rpw / a.n_rep;
    const int64_t blocks = (a.n_tok + tile_tokens - 1) / tile_tokens * int64_t(a.n_head_kv);
    if (blocks >= 2 * sms) break;
    rpw /= 2;
  }
  while (kTileWarps * rpw < a.n_rep) rpw *= 2;
  switch ((hd + 31) / 32) {
    case 1:
      LaunchTiledRows<1>(a, rpw, S(stream));
      break;
    case 2:
      LaunchTiledRows<2>(a, rpw, S(stream));
      break;
    default:
      LaunchTiledRows<4>(a, rpw, S(stream));
      break;
  }
  return true;
}

}  // namespace strata::kernels::cuda
