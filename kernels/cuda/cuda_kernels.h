// CUDA kernels of Strata: the GPU counterparts of kernels/kernels.h, as plain C++ launchers.
//
// Every function enqueues work on `stream` (a cudaStream_t passed as void*, so this header
// needs no CUDA headers) and returns at once; pointers are device pointers unless a
// comment says "mapped" (pinned host memory the GPU reads through its device alias).
// No allocation, no synchronization. Launch errors are reported by the caller's next
// synchronizing call (see platforms/cuda_device.h).
//
// Results do not depend on how many rows or sequences share a launch: every output
// element is reduced in a fixed order that depends only on its own inputs. That is what
// lets beam search promise the same results under any grouping on the GPU too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace strata::kernels::cuda {

// y[t * rows + r] = dot(W[r], x[t]) for t < n_tok, r < rows. W: F16 [rows][k] row-major;
// x: F32 [n_tok][k]; k % 8 == 0.
void MatmulF16(const uint16_t* w, int64_t rows, int64_t k, const float* x, int64_t n_tok, float* y,
               void* stream);

// Several matmuls of the same x in one launch (a layer's Q, K and V projections; gate and
// up): part i computes y_i[t * rows_i + r] = dot(W_i[r], x[t]), bit for bit what MatmulF16
// gives for it alone. At most kMaxMatmulParts parts.
struct MatmulPart {
  const uint16_t* w;
  int64_t rows;
  float* y;
};
constexpr int kMaxMatmulParts = 3;
void MatmulF16Parts(const MatmulPart* parts, int n_parts, int64_t k, const float* x, int64_t n_tok,
                    void* stream);

// y = x / sqrt(mean(x^2) + eps) * weight per row of n values (weight may be null).
// y may equal x.
void RmsNormRows(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n,
                 float eps, void* stream);

// x[t * stride + h * head_dim ...]: rotates the first rot_dim dims of n_heads heads of every
// token t < n_tok by position pos[t]; inv_freq has rot_dim / 2 entries.
void RopeRows(float* x, int64_t n_tok, int64_t stride, int n_heads, int head_dim, int rot_dim,
              const int32_t* pos, const float* inv_freq, RopeLayout layout, void* stream);

// x += d, then y = RmsNormRows(x): what Add followed by RmsNormRows gives, bit for bit, in one
// launch (the residual add and the next norm of a layer). y may be d, not x.
void AddRmsNormRows(float* x, const float* d, const float* weight, float* y, int64_t n_rows,
                    int64_t n, float eps, void* stream);

// RopeRows of q (q_heads heads, row stride q_stride) and of k in one launch.
void RopeQk(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride, int k_heads,
            int64_t n_tok, int head_dim, int rot_dim, const int32_t* pos, const float* inv_freq,
            RopeLayout layout, void* stream);

// gate = silu(gate) * up, n values.
void SwiGlu(float* gate, const float* up, int64_t n, void* stream);
// y += x, n values.
void Add(float* y, const float* x, int64_t n, void* stream);
// y[r * n + i] += b[i] for r < n_rows.
void AddRowBias(float* y, const float* b, int64_t n_rows, int64_t n, void* stream);
// dst[i * n + :] = src[rows[i] * n + :] for i < n_rows.
void GatherRows(const float* src, const int32_t* rows, float* dst, int64_t n_rows, int64_t n,
                void* stream);

// Batched stores and copies: one launch for many small pieces. The op lists may be mapped.
struct StoreF16Op {
  uint16_t* dst;
  const float* src;
  int64_t n;
};
void StoreF16(const StoreF16Op* ops, int32_t n_ops, int64_t max_n, void* stream);
struct CopyOp {
  void* dst;
  const void* src;
  uint64_t bytes;  // multiple of 16; dst and src 16-byte aligned
};
void CopyExtents(const CopyOp* ops, int32_t n_ops, uint64_t max_bytes, void* stream);

// Attention of n_tok query tokens over spans of F16 K/V (kernels::KvSpan, device pointers).
// Token t belongs to sequence tok_seq[t] at position tok_pos[t]; that sequence's spans are
// spans[span_begin[s] .. span_begin[s + 1]). q: [n_tok][n_head * head_dim] (post-RoPE),
// out: same shape. Keys after the query's position are masked; a query that sees no key
// gets zeros. head_dim % 32 == 0 and <= 256; n_rep <= 16.
struct AttentionBatch {
  const float* q;
  float* out;
  int32_t n_tok;
  int32_t n_head_kv;
  int32_t n_rep;
  int32_t head_dim;
  float scale;
  const int32_t* tok_seq;
  const int32_t* tok_pos;
  const int32_t* span_begin;
  const KvSpan* spans;
};
void Attention(const AttentionBatch& a, void* stream);
// Shared memory one attention block takes (must stay within 48 KiB).
size_t AttentionSharedBytes(int n_rep, int head_dim);

}  // namespace strata::kernels::cuda
