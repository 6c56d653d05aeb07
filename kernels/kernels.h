// The compute kernels of Strata: stateless functions on raw pointers and shapes.
//
// No allocation, no threads: the engine's thread pool splits work (row ranges of a
// matmul, heads of attention) and calls these from its workers. Every function is safe to
// call concurrently on disjoint outputs. Each operation has a scalar reference in
// kernels/cpu/ that every SIMD variant (AVX2+FMA+F16C, AVX-512, NEON) is tested against;
// the variant is chosen once at start-up from the CPU's features (see ActiveIsa).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "kernels/types.h"

namespace strata::kernels {

enum class Isa { kScalar, kAvx2, kAvx512, kNeon };
const char* IsaName(Isa isa);
// The instruction set whose kernels are in use (the best the CPU supports, unless the
// environment variable STRATA_ISA=scalar|avx2|avx512|neon or ForceIsa chose another).
Isa ActiveIsa();
// True when this CPU and this build support `isa`.
bool IsaSupported(Isa isa);
// Switches every dispatched kernel to `isa` (tests and benchmarks); false if unsupported.
// Not thread-safe with respect to kernels running concurrently.
bool ForceIsa(Isa isa);
// The active table's detail, e.g. "avx512" or "neon+dotprod" (logs and benchmarks).
const char* ActiveIsaVariant();

// ---- Matrix multiplication with quantized weights -------------------------------------
//
// Weights W are [rows][k] in type wtype, row-major, rows `w_row_bytes` apart.
// Activations X are [n_tok][k] floats; the engine first converts them once per matmul
// to ActivationType(wtype) (Q8_0, Q8_1, Q8_K, F16 or F32 rows) with QuantizeActivations,
// and the dot products then run on the quantized blocks directly.

// The row format X must be converted to before Matmul with weights of type `weight`.
DType ActivationType(DType weight);
// Converts one row of `n` floats into ActivationType(weight); `out` holds
// RowBytes(ActivationType(weight), n) bytes. n must be a multiple of the weight block.
void QuantizeActivations(DType weight, const float* x, int64_t n, void* out);

// How a weight matrix's rows are laid out in memory. kRowMajor is the GGUF file's own
// layout. kRows16 (made by RepackRows16 for the types Rows16Supported names) regroups each
// tile of 16 rows (rows 16i..16i+15, the last tile padded with zero rows) so that a vector
// holds one dword of the same block of all 16 rows, lane r = row r: a product then reads 16
// rows' codes as whole vectors with the rows in the lanes and sums each block exactly in
// integers, without the lane reductions or transposes the row-major layout needs.
//
// A block's bytes are its code dwords and, for Q4_0, Q4_1, Q8_0 and Q6_K, a 2-byte scale d
// (the block's first or last two bytes; Q4_1 also a 2-byte min m after d). In a tile, block
// b's code dwords come as `dwords` vectors of 16 dwords (dword j of row r at j * 16 + r); the
// blocks go in pairs, each pair's two code runs followed by the scales of its first block's
// 16 rows, then of its second's (a 16-lane F16 vector each; for Q4_1 the d vector, then the
// m vector), which keeps every code vector 64-byte aligned. Q4_K has no
// separate scale (its d and dmin are its first dword), so its tile is simply the 16 rows'
// dwords transposed. Q6_K's 52 code vectors go in the order its kernel reads them
// (kQ6_KRows16Order), so a decode streams each block front to back. Tiles are
// Rows16TileBytes apart.
enum class WeightLayout : uint8_t { kRowMajor, kRows16 };
// Q6_K in kRows16: vector v of a block holds the block's dword kQ6_KRows16Order[v] (ql is
// dwords 0..31, qh 32..47, the scales 48..51): the scales, then per quarter (half n of 128
// values, 16-value group q) the ql dwords of its low and high 32 values and their qh dwords.
constexpr std::array<uint8_t, 52> Q6_KRows16Order() {
  std::array<uint8_t, 52> o{48, 49, 50, 51};
  int v = 4;
  for (int n = 0; n < 2; ++n)
    for (int q = 0; q < 2; ++q)
      for (int base : {16 * n + 4 * q, 16 * n + 8 + 4 * q, 32 + 8 * n + 4 * q})
        for (int i = 0; i < 4; ++i) o[size_t(v++)] = static_cast<uint8_t>(base + i);
  return o;
}
inline constexpr std::array<uint8_t, 52> kQ6_KRows16Order = Q6_KRows16Order();
constexpr int64_t kRows16Tile = 16;
// True when `t` has a kRows16 form (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K).
bool Rows16Supported(DType t);
// True when the active kernels compute kRows16 weights of type t natively (AVX-512 VNNI);
// elsewhere Matmul still accepts them, unpacking 16 rows at a time, so repacking only pays
// there. With a native kernel Q4_K gives the same bits as the row-major layout; Q4_0, Q4_1,
// Q8_0 and Q6_K add the blocks in another order than the row-major kernels (the same value up to
// float rounding). Either way a token gets the same bits alone or in any batch.
bool Rows16Preferred(DType t);
// Bytes between consecutive tiles: 16 rows, rounded up to a multiple of 64.
size_t Rows16TileBytes(DType t, int64_t k);
// Bytes of a rows x k matrix of type t in the kRows16 layout (rows rounded up to 16).
size_t Rows16Bytes(DType t, int64_t rows, int64_t k);
// Where block b (of nb per row) of a tile starts: its code vectors, and its 16 scales
// (equal to `codes` for Q4_K, which has none), in bytes from the tile's start.
struct Rows16Block {
  int64_t codes, scales;
};
Rows16Block Rows16BlockAt(DType t, int64_t nb, int64_t b);
// The same for a block of block_bytes bytes, code_dwords of them code (the rest its scale):
// the one place the pairing is worked out, for the repack and the kernels alike.
constexpr Rows16Block Rows16BlockOffsets(int64_t block_bytes, int64_t code_dwords, int64_t nb,
                                         int64_t b) {
  const int64_t codes = code_dwords * 4 * kRows16Tile;
  const int64_t scales = (block_bytes - code_dwords * 4) * kRows16Tile;
  const int64_t first = b / 2 * 2, in_pair = nb - first < 2 ? nb - first : 2;
  const int64_t base = first * block_bytes * kRows16Tile;
  return {base + (b - first) * codes, base + in_pair * codes + (b - first) * scales};
}
// Writes tiles [tile_begin, tile_end) of the kRows16 form of `src` (rows x k, rows
// src_row_bytes apart) into `dst` (Rows16Bytes bytes). Disjoint tile ranges may be written
// concurrently.
void RepackRows16(DType t, const void* src, size_t src_row_bytes, int64_t rows, int64_t k,
                  void* dst, int64_t tile_begin, int64_t tile_end);
// Copies row `row` of kRows16 weights back into the file's layout (RowBytes(t, k) bytes).
void Rows16Row(DType t, const void* tiles, int64_t k, int64_t row, void* dst);

struct MatmulArgs {
  DType wtype;
  const void* w;        // weights [rows][k] (w_layout kRows16: the repacked tiles)
  size_t w_row_bytes;   // RowBytes(wtype, k) for a dense tensor
  int64_t k;            // inner dimension
  const void* xq;       // activations [n_tok][k] in ActivationType(wtype)
  size_t xq_row_bytes;  // bytes between consecutive activation rows
  int64_t n_tok;        // number of activation rows (1 = GEMV)
  float* y;             // y[t * y_stride + r] = dot(W[r], X[t])
  int64_t y_stride;
  WeightLayout w_layout = WeightLayout::kRowMajor;
};
// Computes output rows [row_begin, row_end) for all n_tok tokens. The engine splits rows
// across threads in multiples of kMatmulRowAlign (the last chunk may be ragged).
// wtype must be a weight_supported type and k a multiple of its block size (32 or 256;
// float types take any k); otherwise the rows are filled with NaN. Rows and activation rows
// need no alignment. On x86 the activations are rearranged into a per-thread panel of half
// the core's L2 (allocated on a thread's first call, kept while it lives); other ISAs read
// the activation rows in place. Concurrent calls on disjoint row ranges (or different y) are safe,
// and a token's outputs are the same bits in any batch.
constexpr int64_t kMatmulRowAlign = 16;
// How far ahead of its reads a single-token matmul (decode) on x86 asks for weight bytes
// with software prefetches. Decode streams every weight once from DRAM; the hardware
// prefetchers stop at each 4 KiB page and keep too few lines in flight for one core to
// reach the memory's rate while it also decodes and multiplies, so reads and arithmetic
// took turns. A page and a half ahead keeps the next pages' lines arriving across page
// boundaries: nearer leaves stalls at each page, much farther evicts lines from L1 before
// they are used (docs/experiments/cpu-kernels.md has the sweep). The lines go to L1 unless
// the token's activation panel, which every row rereads, takes more than a quarter of the
// L1 (long rows: a 14336-wide FFN down projection has a 21-28 KiB panel): then they go to
// L2, where they cannot evict the panel that the row's products need next.
constexpr int64_t kMatmulPrefetchBytes = 6144;
void Matmul(const MatmulArgs& a, int64_t row_begin, int64_t row_end);

// Dequantizes n values (one row of a tensor of type t) to floats, e.g. an embedding row.
// Handles every weight type plus the activation formats Q8_0, Q8_1 and Q8_K; other types
// give NaN. Scalar on every ISA (one row per token: not worth SIMD).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats into type t (weight types and Q8_0/Q8_1/Q8_K), round to nearest with
// min/max scales; for tests, fixtures and tools (GGUF converters choose scales better).
// Scalar on every ISA. False when t has no quantizer here or n is not a multiple of the
// block size.
bool QuantizeRow(DType t, const float* src, void* dst, int64_t n);

// Low-rank key summaries (K_lr) live in tiles of kScoreTile tokens: inside a tile the
// values of one dimension for all its tokens are adjacent, so one vector load reads a
// dimension of a whole tile and scoring needs no horizontal sums. Token t, dimension j of
// rows of `cols` values sits at tiles[TiledIndex(t, j, cols)].
constexpr int64_t kScoreTile = 16;
constexpr int64_t TiledIndex(int64_t t, int64_t j, int64_t cols) {
  return ((t / kScoreTile) * cols + j) * kScoreTile + t % kScoreTile;
}
//
// Three value types. F16: tile i is the kScoreTile*cols halves at TiledIndex(i*kScoreTile,
// 0, cols). Q8 and Q4: signed integers with one F16 scale per token (value = integer *
// scale, the scale the row's largest magnitude / 127 or / 7); tile i starts at byte i *
// ScoreTileBytes(type, cols), holds the integers dimension by dimension, then its
// kScoreTile scales. Q8: one byte per value, in the F16 layout's order. Q4: 8 bytes per
// dimension, byte b holding token b in its low nibble and token b + 8 in its high one, each
// as integer + 8 (1..15). Q8 takes 1 + 2/cols bytes a value, Q4 0.5 + 2/cols, so a summary
// of twice or four times the rank fits in about the memory of F16.
enum class ScoreType { kF16, kQ8, kQ4 };
// Bytes of a tile's values (Q8, Q4: before its scales) and of the whole tile.
constexpr int64_t ScoreValueBytes(ScoreType type, int64_t cols) {
  return type == ScoreType::kQ4   ? kScoreTile / 2 * cols
         : type == ScoreType::kQ8 ? kScoreTile * cols
                                  : 2 * kScoreTile * cols;
}
constexpr int64_t ScoreTileBytes(ScoreType type, int64_t cols) {
  return ScoreValueBytes(type, cols) + (type == ScoreType::kF16 ? 0 : 2 * kScoreTile);
}
// Writes one token's row of `cols` floats into the tiles at position `token`.
void StoreScoreRow(ScoreType type, const float* row, int64_t cols, int64_t token, void* tiles);
// Scores n_x queries (x: n_x rows of `cols` floats) against every token of tiles
// [tile_begin, tile_end):
//   y[q * y_stride + (t - tile_begin * kScoreTile)] = dot(x[q], row t).
// y_stride >= (tile_end - tile_begin) * kScoreTile.
// Q4 tiles may be scored with each query rounded to int8 against its own largest magnitude
// (the AVX-512 kernel does, to multiply in integers with VNNI): a score then differs from
// the float product by at most sum_j |row t, j| * max|x[q]| / 254, an error 18x below the
// Q4 values' own.
void ScoreTiles(ScoreType type, const void* tiles, int64_t tile_begin, int64_t tile_end,
                int64_t cols, const float* x, int64_t n_x, float* y, int64_t y_stride);
// Indices of the k largest of x[0..n), by descending value, ties by lower index, NaN last;
// writes min(k, n) entries. O(n log k), no allocation.
void TopK(const float* x, int64_t n, int64_t k, int32_t* idx_out);

// ---- Element-wise and normalization ----------------------------------------------------

// y = x / sqrt(mean(x^2) + eps) * weight; weight may be nullptr (no scaling). y may be x.
void RmsNorm(const float* x, const float* weight, float* y, int64_t n, float eps);
// out = silu(gate) * up. out may alias gate.
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);
// y += x
void Add(float* y, const float* x, int64_t n);
// x = softmax(x); returns log(sum(exp(x))) of the input (-inf when n <= 0), so that
// softmax(x)[i] = exp(x[i] - the returned value).
float SoftmaxInPlace(float* x, int64_t n);
float DotF32(const float* a, const float* b, int64_t n);
// y[t][j] = sum over i < k of x[t][i] * a[i][j], for t < n and j < r: n rows of x ([n][k])
// times the matrix a ([k][r], row-major), each sum taken in order of i with one fused
// multiply-add a term, so every ISA gives the same bits. For small products that the
// quantized matmul does not serve (the disk policy's low-rank key projection).
void RowsTimesMatrix(const float* x, int64_t n, int64_t k, const float* a, int64_t r, float* y);
void F32ToF16Row(const float* src, uint16_t* dst, int64_t n);
void F16ToF32Row(const uint16_t* src, float* dst, int64_t n);

// Rotary position embedding on `n_heads` heads of `head_dim` floats each (contiguous),
// rotating the first `rot_dim` dims of each head. `cos_sin` holds rot_dim/2 (cos, sin)
// pairs for this token's position (the engine caches them per position).
// Normal layout rotates pairs (2i, 2i+1); NeoX layout rotates (i, i + rot_dim/2).
enum class RopeLayout { kNormal, kNeox };
void RopeApply(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_sin,
               RopeLayout layout);

// ---- Attention over a view of spans ----------------------------------------------------
//
// The forward pass never knows where KV lives: a KV policy hands it a list of spans, each
// a run of consecutive positions with K and V for all KV heads of one layer, in F16 or in
// Q8_0 blocks (32 values, one F16 scale; a head of head_dim values is head_dim/32 blocks,
// so Q8_0 spans need head_dim % 32 == 0).
enum class KvType : uint8_t { kF16, kQ8_0 };
struct KvSpan {
  const uint16_t* k;  // F16: token t, head h at k[t * stride + h * head_dim]
  const uint16_t* v;  // same layout as k
  int32_t n_tokens;
  int32_t pos0;    // position of the span's first token
  int32_t stride;  // F16: elements between consecutive tokens (usually n_kv_heads*head_dim);
                   // Q8_0: bytes between consecutive tokens
  KvType type = KvType::kF16;
  // Q8_0 only (k and v are then null): token t's row starts at qk + t * stride bytes.
  const uint8_t* qk = nullptr;
  const uint8_t* qv = nullptr;
};
// Bytes of one Q8_0 row of n values (n % 32 == 0).
constexpr int64_t Q8_0RowBytes(int64_t n) { return n / 32 * 34; }

struct AttentionArgs {
  // Queries for n_q consecutive positions q_pos0, q_pos0+1, ... and the n_rep query heads
  // that share KV head `kv_head` (GQA): q[t * q_stride + j * head_dim + d], already RoPE'd.
  const float* q;
  int32_t n_q;
  int32_t q_stride;
  int32_t q_pos0;
  int32_t n_rep;
  int32_t head_dim;
  int32_t kv_head;
  const KvSpan* spans;  // any order; keys with position > query position are masked
  int32_t n_spans;
  float scale;  // usually 1/sqrt(head_dim)
  float* out;   // out[t * out_stride + j * head_dim + d]
  int32_t out_stride;
  float* scratch;  // AttentionScratchFloats(args) floats, owned by the caller's thread
  // Optional: lse[t * n_rep + j] = log of row (t, j)'s softmax denominator, in scaled-score
  // units (max + log(sum of exp(score - max))); -inf for a row that sees no key. Outputs of
  // disjoint parts of one view merge into the whole view's output with weights exp(lse).
  float* lse = nullptr;
};
// Online (streaming) softmax: one pass over the spans, no full score matrix.
// Q8_0 spans are expanded to F16 (the visible tokens of kv_head only, in a buffer of the
// calling thread) before the F16 kernel runs. Chunks are cut every kAttnChunk keys of the
// view, small spans gathered into them, wherever the queries begin: many small spans cost
// what their keys do, and a query row's output does not depend on the first position of its
// call or on how many rows follow it (spans in position order; keys a row does not see
// must follow it in the view, or they get chunks of their own). Both types agree to
// float rounding for the same values. head_dim must be a multiple of 16. A query row that sees no
// key gets zeros. Scratch grows with n_q * n_rep * head_dim: split long prefills into query blocks.
void AttentionOverSpans(const AttentionArgs& a);
// Joins attention run over disjoint parts of one view (e.g. a decode view split so that more
// threads share it): part p's row r = t * n_rep + j is parts[(p * n_q * n_rep + r) * head_dim
// + d] with lse[p * n_q * n_rep + r] (AttentionArgs::lse); the joined row goes to
// out[t * out_stride + j * head_dim + d]. Rows no part sees are zeros.
void MergeAttentionParts(const float* parts, const float* lse, int32_t n_parts, int32_t n_q,
                         int32_t n_rep, int32_t head_dim, float* out, int32_t out_stride);
size_t AttentionScratchFloats(int32_t n_q, int32_t n_rep, int32_t head_dim);

}  // namespace strata::kernels
