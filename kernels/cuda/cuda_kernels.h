// CUDA kernels of Strata: the GPU counterparts of kernels/kernels.h, as plain C++ launchers.
//
// Every function enqueues work on `stream` (a cudaStream_t passed as void*, so this header
// needs no CUDA headers) and returns at once; pointers are device pointers unless a
// comment says "mapped" (pinned host memory the GPU reads through its device alias).
// No allocation, no synchronization. Launch errors are reported by the caller's next
// synchronizing call (see platforms/cuda_device.h).
//
// A kernel may start before the one before it on the stream has finished (launch.cuh), and
// reads some inputs before it waits: weights (matmul weights, norm weights) and the tables
// marked "host-written" below must not be written by a kernel of the same pass (the host
// copies them in, or they are the model's).
//
// Results do not depend on how many rows or sequences share a launch: every output
// element is reduced in a fixed order that depends only on its own inputs. That is what
// lets beam search promise the same results under any grouping on the GPU too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/quant_blocks.h"
#include "kernels/kernels.h"

namespace strata::kernels::cuda {

// Activations quantized for the quantized matmuls (quant_blocks.h): [n][k] int8 and
// [n][k / 32] scales. Kernels that produce a matmul's input can write this form beside (or
// instead of) their float output, sparing a launch; null pointers mean "not wanted".
struct ActOut {
  int8_t* q = nullptr;
  q::ActScale* s = nullptr;
};

// Asks the GPU, once, what the launches need (whether a kernel may start while the one before
// it finishes, how many GEMV blocks the GPU holds at once), so that no such query runs inside
// a graph capture. Call with the device current, before the first capture.
void PrepareLaunches();

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

// y = x / sqrt(mean(x^2) + eps) * weight per row of n <= kMaxNormRow values (weight may be
// null; a weight, read before the wait). y may equal x. With `act` (n % 32 == 0), y is also
// written quantized.
constexpr int64_t kMaxNormRow = 16384;
void RmsNormRows(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n,
                 float eps, void* stream, ActOut act = {});

// x[t * stride + h * head_dim ...]: rotates the first rot_dim dims of n_heads heads of every
// token t < n_tok by position pos[t]; inv_freq has rot_dim / 2 entries (both host-written).
void RopeRows(float* x, int64_t n_tok, int64_t stride, int n_heads, int head_dim, int rot_dim,
              const int32_t* pos, const float* inv_freq, RopeLayout layout, void* stream);

// x += d, then y = RmsNormRows(x): what Add followed by RmsNormRows gives, bit for bit, in one
// launch (the residual add and the next norm of a layer). y may be d, not x. `act` as in
// RmsNormRows.
void AddRmsNormRows(float* x, const float* d, const float* weight, float* y, int64_t n_rows,
                    int64_t n, float eps, void* stream, ActOut act = {});

// RopeRows of q (q_heads heads, row stride q_stride) and of k in one launch.
void RopeQk(float* q, int64_t q_stride, int q_heads, float* k, int64_t k_stride, int k_heads,
            int64_t n_tok, int head_dim, int rot_dim, const int32_t* pos, const float* inv_freq,
            RopeLayout layout, void* stream);

// gate = silu(gate) * up, n values. With `act` (n % 32 == 0), also quantized.
void SwiGlu(float* gate, const float* up, int64_t n, void* stream, ActOut act = {});
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
// The same with the op count read from device memory at run time (*n_ops <= max_ops): a
// launch that a captured graph can replay with other ops. ops and n_ops are host-written.
void StoreF16Counted(const StoreF16Op* ops, const int32_t* n_ops, int32_t max_ops, int64_t max_n,
                     void* stream);
struct CopyOp {
  void* dst;
  const void* src;
  uint64_t bytes;  // multiple of 16; dst and src 16-byte aligned
};
void CopyExtents(const CopyOp* ops, int32_t n_ops, uint64_t max_bytes, void* stream);

// Attention of n_tok query tokens over spans of F16 K/V (kernels::KvSpan, device pointers).
// Token t belongs to sequence tok_seq[t] at position tok_pos[t]; that sequence's spans are
// spans[span_begin[s] .. span_begin[s + 1]) (tok_seq, tok_pos, span_begin and the span list
// are host-written; the K/V they point at need not be). q: [n_tok][n_head * head_dim] (post-RoPE),
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
  // Chunked (decode-sized batches): each sequence's flattened keys go in chunks of
  // chunk_keys (a multiple of 32), n_chunks blocks per (token, KV head) whatever the
  // sequence's length (chunks past its keys are empty), merged in chunk order by a second
  // launch through `partial` ([n_tok][n_head][n_chunks][head_dim + 2] floats). A row's
  // result depends on its own keys only: with one non-empty chunk it is the unchunked bits.
  // chunk_keys 0: one block walks all keys.
  int32_t chunk_keys = 0;
  int32_t n_chunks = 1;
  float* partial = nullptr;
};
// Keys a chunk of a chunked attention takes.
constexpr int32_t kAttentionChunkKeys = 256;
void Attention(const AttentionBatch& a, void* stream);
// The same attention for prefill-sized batches (unchunked): key stages in shared memory
// shared by a tile of consecutive query tokens. Agrees with Attention within float rounding;
// a row's result depends on its own keys only. False (nothing launched) where the shape is
// outside the kernel's (head_dim a multiple of 8 up to 128, GQA up to 16) or chunked.
bool AttentionTiled(const AttentionBatch& a, void* stream);
// Shared memory one attention block takes (must stay within 48 KiB).
size_t AttentionSharedBytes(int n_rep, int head_dim);

// dst[r * n + i] = f16 of value i of Q8_0 row r (n values, n % 32 == 0, rows Q8_0RowBytes(n)
// bytes apart at src) for r < n_rows: KV records of the disk policy expanded for attention.
void ExpandQ8_0Rows(const uint8_t* src, int64_t n_rows, int64_t n, uint16_t* dst, void* stream);
// The disk policy's estimate of the keys a view left out (KvTail), for one token's attention
// output o ([n_head][head_dim]): o_h = (o_h + ratio[h] * mean_v[h / n_rep]) / (1 + ratio[h]).
void AttendTail(float* o, const float* ratio, const float* mean_v, int n_head, int n_rep,
                int head_dim, void* stream);

// ---- Quantized weights (cuda_quant.cu) -------------------------------------------------
//
// Weights stay in their GGUF blocks, rows row_bytes apart, in GPU memory or in host memory
// the GPU maps. Decode-sized batches (a few tokens) run as dequantizing GEMVs over
// quantized activations (four int8 products per dp4a); larger ones as cuBLAS GEMMs over
// F16 copies made by DequantizeF16 into a scratch buffer a chunk of rows at a time.

// Whether the GPU matmuls take weights of type t as they are (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K).
bool QuantizedWeightType(DType t);
// Quantizes n_rows rows of k floats (k % 32 == 0) for the quantized matmuls.
void QuantizeActivations(const float* x, int64_t n_rows, int64_t k, ActOut out, void* stream);
// y[t * rows + r] = dot(W[r], x[t]) for the parts' rows and n_tok tokens, all parts of one
// weight type (k a multiple of its block). Each output is reduced in an order fixed by the
// weight row and k alone: the same for any n_tok and any parts alongside.
struct QMatmulPart {
  const uint8_t* w;
  int64_t rows;
  float* y;
};
void QMatmulParts(DType type, const QMatmulPart* parts, int n_parts, int64_t k, const int8_t* xq,
                  const q::ActScale* xs, int64_t n_tok, void* stream);
// Rows one warp of QMatmulParts sums at once: 1, 2 or 4 (0 restores the default). The outputs
// are the same bits for each; STRATA_CUDA_GEMV_ROWS, when set, overrides it. Returns the
// setting it replaced (0: the default). For measuring and testing the launch shapes.
int SetGemvRowsPerWarp(int rows);
// out[(r - r0) * k + c] = W[r][c] as F16 for rows [r0, r1).
void DequantizeF16(DType type, const uint8_t* w, int64_t r0, int64_t r1, int64_t k, uint16_t* out,
                   void* stream);
// out[i] = f16(x[i]).
void F32ToF16(const float* x, int64_t n, uint16_t* out, void* stream);
// y[t * ldy + r] = dot(W[r], x[t]) for r < rows, t < n_tok, with cuBLAS (F16 inputs, F32
// accumulation and output) through `blas` (a cublasHandle_t bound to the stream). False when
// cuBLAS refuses.
bool GemmF16(void* blas, const uint16_t* w, int64_t rows, int64_t k, const uint16_t* x,
             int64_t n_tok, float* y, int64_t ldy);

}  // namespace strata::kernels::cuda
