// Picks the kernel table once (CPU features, then the STRATA_ISA override) and forwards
// the public entry points of kernels.h to it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  // Linux arch/arm64 uapi hwcap bit for SDOT/UDOT
#endif
#endif

namespace strata::kernels {
namespace cpu {

#if defined(__x86_64__)
// F16C from CPUID leaf 1 (ECX bit 29, Intel SDM vol. 2A): clang's __builtin_cpu_supports
// does not know the "f16c" feature name, GCC's does; CPUID works for both.
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
bool CpuHasAvx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
}
// libgcc's probe also checks that the OS saves the ZMM state (XGETBV), so a kernel with
// AVX-512 disabled reports false here.
bool CpuHasAvx512() {
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
}
bool CpuHasNeonDotprod() { return false; }
const KernelTable* NeonKernels(bool) { return nullptr; }
#elif defined(__aarch64__)
bool CpuHasAvx2() { return false; }
bool CpuHasAvx512() { return false; }
bool CpuHasNeonDotprod() {
#if defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}
const KernelTable* Avx2Kernels() { return nullptr; }
const KernelTable* Avx512Kernels() { return nullptr; }
#else
bool CpuHasAvx2() { return false; }
bool CpuHasAvx512() { return false; }
bool CpuHasNeonDotprod() { return false; }
const KernelTable* Avx2Kernels() { return nullptr; }
const KernelTable* Avx512Kernels() { return nullptr; }
const KernelTable* NeonKernels(bool) { return nullptr; }
#endif

}  // namespace cpu

namespace {

const cpu::KernelTable* TableFor(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return &cpu::ScalarKernels();
    case Isa::kAvx2:
      return cpu::CpuHasAvx2() ? cpu::Avx2Kernels() : nullptr;
    case Isa::kAvx512:
      return cpu::CpuHasAvx512() ? cpu::Avx512Kernels() : nullptr;
    case Isa::kNeon:
      return cpu::NeonKernels(cpu::CpuHasNeonDotprod());
  }
  return nullptr;
}

const cpu::KernelTable* BestTable() {
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kNeon}) {
    if (const cpu::KernelTable* t = TableFor(isa)) return t;
  }
  return &cpu::ScalarKernels();
}

const cpu::KernelTable* InitialTable() {
  const cpu::KernelTable* best = BestTable();
  const char* env = std::getenv("STRATA_ISA");
  if (env == nullptr || *env == '\0') return best;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kNeon}) {
    if (std::strcmp(env, IsaName(isa)) != 0) continue;
    if (const cpu::KernelTable* t = TableFor(isa)) return t;
    std::fprintf(stderr, "strata: STRATA_ISA=%s is not supported by this CPU or build; using %s\n",
                 env, best->variant);
    return best;
  }
  std::fprintf(stderr, "strata: STRATA_ISA=%s is not one of scalar|avx2|avx512|neon; using %s\n",
               env, best->variant);
  return best;
}

std::atomic<const cpu::KernelTable*> g_table{nullptr};

// Every candidate table is immutable once built (function-local statics) and racing first
// calls pick the same one. Release/acquire makes the table's construction by the thread
// that published it visible to a thread that only loads the pointer (relaxed would let a
// worker read the fields without a happens-before edge; TSan reports it). On x86 an
// acquire load is a plain load.
inline const cpu::KernelTable& K() {
  const cpu::KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) [[unlikely]] {
    t = InitialTable();
    g_table.store(t, std::memory_order_release);
  }
  return *t;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kNeon:
      return "neon";
  }
  return "unknown";
}

namespace cpu {

std::vector<const KernelTable*> RunnableTables() {
  std::vector<const KernelTable*> out = {&ScalarKernels()};
  if (const KernelTable* t = TableFor(Isa::kAvx2)) out.push_back(t);
  if (const KernelTable* t = TableFor(Isa::kAvx512)) out.push_back(t);
  if (const KernelTable* t = NeonKernels(false)) out.push_back(t);
  if (CpuHasNeonDotprod()) out.push_back(NeonKernels(true));
  return out;
}

const KernelTable* ActiveTable() { return &K(); }
void SetActiveTable(const KernelTable* t) { g_table.store(t, std::memory_order_release); }

}  // namespace cpu

Isa ActiveIsa() { return K().isa; }
const char* ActiveIsaVariant() { return K().variant; }
bool IsaSupported(Isa isa) { return TableFor(isa) != nullptr; }

bool ForceIsa(Isa isa) {
  const cpu::KernelTable* t = TableFor(isa);
  if (t == nullptr) return false;
  g_table.store(t, std::memory_order_release);
  return true;
}

void QuantizeActivations(DType weight, const float* x, int64_t n, void* out) {
  K().quantize_activations(weight, x, n, out);
}
namespace {

// A block's code dwords and its 2-byte scale (kRows16, kernels.h).
struct Rows16Form {
  int64_t block_bytes = 0, dwords = 0;
  int64_t scale_at = 0, scale_bytes = 0;  // the scale's offset in the block, 0 or 2 bytes
  int64_t codes_at = 0;                   // the first code byte
  const uint8_t* order = nullptr;         // vector v holds dword order[v] (nullptr: v)
  int64_t min_at = -1;                    // Q4_1's 2-byte min m (-1: none)
};
// A block's min sits in the tile after its 16 scales, as a vector of its own.
constexpr int64_t kRows16MinAt = 2 * kRows16Tile;

bool FormOf(DType t, Rows16Form* f) {
  switch (t) {
    case DType::kQ4_0:
      *f = {sizeof(BlockQ4_0), 4, 0, 2, 2};
      return true;
    case DType::kQ4_1:
      *f = {sizeof(BlockQ4_1),       4,       offsetof(BlockQ4_1, d), 2,
            offsetof(BlockQ4_1, qs), nullptr, offsetof(BlockQ4_1, m)};
      return true;
    case DType::kQ8_0:
      *f = {sizeof(BlockQ8_0), 8, 0, 2, 2};
      return true;
    case DType::kQ4_K:
      *f = {sizeof(BlockQ4_K), sizeof(BlockQ4_K) / 4, 0, 0, 0};
      return true;
    case DType::kQ6_K:
      *f = {sizeof(BlockQ6_K), 52, offsetof(BlockQ6_K, d), 2, 0, kQ6_KRows16Order.data()};
      return true;
    default:
      return false;
  }
}

Rows16Form Form(DType t) {
  Rows16Form f;
  (void)FormOf(t, &f);
  return f;
}

}  // namespace

bool Rows16Supported(DType t) {
  Rows16Form f;
  return FormOf(t, &f);
}
bool Rows16Preferred(DType t) {
  return Rows16Supported(t) && (K().matmul_rows16_types >> static_cast<uint32_t>(t) & 1u) != 0;
}

size_t Rows16TileBytes(DType t, int64_t k) { return (RowBytes(t, k) * kRows16Tile + 63) / 64 * 64; }

size_t Rows16Bytes(DType t, int64_t rows, int64_t k) {
  const int64_t tiles = (rows + kRows16Tile - 1) / kRows16Tile;
  return static_cast<size_t>(tiles) * Rows16TileBytes(t, k);
}

Rows16Block Rows16BlockAt(DType t, int64_t nb, int64_t b) {
  const Rows16Form f = Form(t);
  return Rows16BlockOffsets(f.block_bytes, f.dwords, nb, b);
}

namespace {

// Visits every (row of the tile, block) with the row's block in the file's layout and the
// tile's bytes for it: f(row_block, tile_codes, tile_scales, r) where dword j of the row's
// codes lives at tile_codes + 4 * (j * 16 + r) and its scale at tile_scales + 2 * r.
template <typename F>
void ForEachTileBlock(DType t, int64_t k, F&& f) {
  const Rows16Form form = Form(t);
  const int64_t nb = static_cast<int64_t>(RowBytes(t, k)) / form.block_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    const Rows16Block at = Rows16BlockAt(t, nb, b);
    for (int64_t r = 0; r < kRows16Tile; ++r) f(form, b * form.block_bytes, at, r);
  }
}

// Row r's block in the file's layout <-> its place in the tile.
void PackBlock(const Rows16Form& f, const uint8_t* in, uint8_t* tile, const Rows16Block& at,
               int64_t r) {
  std::memcpy(tile + at.scales + f.scale_bytes * r, in + f.scale_at, size_t(f.scale_bytes));
  if (f.min_at >= 0) std::memcpy(tile + at.scales + kRows16MinAt + 2 * r, in + f.min_at, 2);
  for (int64_t v = 0; v < f.dwords; ++v)
    std::memcpy(tile + at.codes + 4 * (v * kRows16Tile + r),
                in + f.codes_at + 4 * (f.order ? f.order[v] : v), 4);
}
void UnpackBlock(const Rows16Form& f, const uint8_t* tile, const Rows16Block& at, int64_t r,
                 uint8_t* out) {
  std::memcpy(out + f.scale_at, tile + at.scales + f.scale_bytes * r, size_t(f.scale_bytes));
  if (f.min_at >= 0) std::memcpy(out + f.min_at, tile + at.scales + kRows16MinAt + 2 * r, 2);
  for (int64_t v = 0; v < f.dwords; ++v)
    std::memcpy(out + f.codes_at + 4 * (f.order ? f.order[v] : v),
                tile + at.codes + 4 * (v * kRows16Tile + r), 4);
}

// kRows16 weights for a table without a kernel of its own: each tile's rows unpacked into
// a thread's buffer and multiplied as row-major rows (the same bits as the file's layout).
void MatmulUnpackedRows16(const cpu::KernelTable& table, const MatmulArgs& a, int64_t rb,
                          int64_t re) {
  const size_t row_bytes = RowBytes(a.wtype, a.k), tile_bytes = Rows16TileBytes(a.wtype, a.k);
  static thread_local std::vector<uint8_t> rows;
  rows.resize(row_bytes * kRows16Tile);
  for (int64_t r0 = rb / kRows16Tile * kRows16Tile; r0 < re; r0 += kRows16Tile) {
    const uint8_t* tile = static_cast<const uint8_t*>(a.w) + size_t(r0 / kRows16Tile) * tile_bytes;
    ForEachTileBlock(a.wtype, a.k,
                     [&](const Rows16Form& f, int64_t off, const Rows16Block& at, int64_t r) {
                       UnpackBlock(f, tile, at, r, rows.data() + size_t(r) * row_bytes + off);
                     });
    MatmulArgs u = a;
    u.w = rows.data();
    u.w_row_bytes = row_bytes;
    u.w_layout = WeightLayout::kRowMajor;
    u.y = a.y + r0;
    table.matmul(u, std::max<int64_t>(rb - r0, 0), std::min<int64_t>(re - r0, kRows16Tile));
  }
}

}  // namespace

void RepackRows16(DType t, const void* src, size_t src_row_bytes, int64_t rows, int64_t k,
                  void* dst, int64_t tile_begin, int64_t tile_end) {
  const size_t tile_bytes = Rows16TileBytes(t, k);
  const std::vector<uint8_t> zero(RowBytes(t, k), 0);  // rows past the end
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    uint8_t* tile = static_cast<uint8_t*>(dst) + size_t(i) * tile_bytes;
    std::memset(tile + RowBytes(t, k) * kRows16Tile, 0, tile_bytes - RowBytes(t, k) * kRows16Tile);
    ForEachTileBlock(t, k, [&](const Rows16Form& f, int64_t off, const Rows16Block& at, int64_t r) {
      const int64_t row = i * kRows16Tile + r;
      const uint8_t* in =
          row < rows ? static_cast<const uint8_t*>(src) + size_t(row) * src_row_bytes : zero.data();
      PackBlock(f, in + off, tile, at, r);
    });
  }
}

void Rows16Row(DType t, const void* tiles, int64_t k, int64_t row, void* dst) {
  const Rows16Form f = Form(t);
  const int64_t nb = static_cast<int64_t>(RowBytes(t, k)) / f.block_bytes;
  const uint8_t* tile =
      static_cast<const uint8_t*>(tiles) + size_t(row / kRows16Tile) * Rows16TileBytes(t, k);
  for (int64_t b = 0; b < nb; ++b)
    UnpackBlock(f, tile, Rows16BlockAt(t, nb, b), row % kRows16Tile,
                static_cast<uint8_t*>(dst) + b * f.block_bytes);
}

void Matmul(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  if (row_end <= row_begin || a.n_tok <= 0) return;
  const TypeInfo* info = FindTypeInfo(static_cast<uint32_t>(a.wtype));
  const bool rows16 = a.w_layout == WeightLayout::kRows16;
  if (info == nullptr || !info->weight_supported || a.k % info->block_elems != 0 ||
      (rows16 && !Rows16Supported(a.wtype))) [[unlikely]] {
    // The engine validates weights at load time; if a bad one gets here anyway, NaN rows
    // make it visible downstream instead of plausible-looking garbage.
    for (int64_t t = 0; t < a.n_tok; ++t) {
      for (int64_t r = row_begin; r < row_end; ++r) a.y[t * a.y_stride + r] = std::nanf("");
    }
    return;
  }
  const cpu::KernelTable& table = K();
  if (!rows16) return table.matmul(a, row_begin, row_end);
  if ((table.matmul_rows16_types >> static_cast<uint32_t>(a.wtype) & 1u) != 0)
    return table.matmul_rows16(a, row_begin, row_end);
  MatmulUnpackedRows16(table, a, row_begin, row_end);
}
void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  K().dequantize_row(t, src, dst, n);
}
void RmsNorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  K().rms_norm(x, weight, y, n, eps);
}
void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  K().swiglu(gate, up, out, n);
}
void Add(float* y, const float* x, int64_t n) { K().add(y, x, n); }
float SoftmaxInPlace(float* x, int64_t n) { return K().softmax(x, n); }
float DotF32(const float* a, const float* b, int64_t n) { return K().dot_f32(a, b, n); }
void RowsTimesMatrix(const float* x, int64_t n, int64_t k, const float* a, int64_t r, float* y) {
  if (n > 0 && r > 0) K().rows_times_matrix(x, n, k, a, r, y);
}
void F32ToF16Row(const float* src, uint16_t* dst, int64_t n) { K().f32_to_f16(src, dst, n); }
void F16ToF32Row(const uint16_t* src, float* dst, int64_t n) { K().f16_to_f32(src, dst, n); }
void RopeApply(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_sin,
               RopeLayout layout) {
  K().rope(x, n_heads, head_dim, rot_dim, cos_sin, layout);
}
namespace {

// One head of `n` Q8_0 rows (stride bytes apart, the head's first block at `first`) as F16
// rows of head_dim values.
void ExpandQ8Head(const uint8_t* first, int64_t stride, int32_t n, int32_t head_dim,
                  uint16_t* dst) {
  K().q8_0_rows_to_f16(first, stride, n, head_dim, dst);
}

}  // namespace

void AttentionOverSpans(const AttentionArgs& a) {
  if (a.n_q <= 0 || a.n_rep <= 0) return;
  bool quantized = false;
  for (int32_t s = 0; s < a.n_spans; ++s) quantized |= a.spans[s].type != KvType::kF16;
  if (!quantized) {
    K().attention(a);
    return;
  }
  // Expand kv_head's visible Q8_0 rows to F16 once per call; F16 spans pass through with
  // their head offset applied, so the kernel sees head 0 of every span. (The kernels gather
  // the keys every query sees from consecutive spans into whole chunks, so a view of many
  // small spans costs what its keys do.)
  thread_local std::vector<uint16_t> expanded;
  thread_local std::vector<KvSpan> spans;
  const int32_t D = a.head_dim, last = a.q_pos0 + a.n_q - 1;
  auto visible = [&](const KvSpan& sp) { return std::clamp(last - sp.pos0 + 1, 0, sp.n_tokens); };
  int64_t n_q8 = 0;
  for (int32_t s = 0; s < a.n_spans; ++s)
    if (a.spans[s].type == KvType::kQ8_0) n_q8 += visible(a.spans[s]);
  const size_t need = size_t(n_q8) * D * 2;
  if (expanded.size() < need) expanded.resize(need);
  spans.clear();
  const int64_t head_bytes = Q8_0RowBytes(D) * a.kv_head;
  uint16_t* out = expanded.data();
  for (int32_t s = 0; s < a.n_spans; ++s) {
    KvSpan sp = a.spans[s];
    if (sp.type != KvType::kQ8_0) {
      sp.k += int64_t(a.kv_head) * D;
      sp.v += int64_t(a.kv_head) * D;
      spans.push_back(sp);
      continue;
    }
    const int32_t n = visible(sp);
    ExpandQ8Head(sp.qk + head_bytes, sp.stride, n, D, out);
    ExpandQ8Head(sp.qv + head_bytes, sp.stride, n, D, out + int64_t(n) * D);
    spans.push_back(KvSpan{out, out + int64_t(n) * D, n, sp.pos0, D});
    out += int64_t(n) * D * 2;
  }
  AttentionArgs b = a;
  b.kv_head = 0;
  b.spans = spans.data();
  b.n_spans = int32_t(spans.size());
  K().attention(b);
}
void MergeAttentionParts(const float* parts, const float* lse, int32_t n_parts, int32_t n_q,
                         int32_t n_rep, int32_t head_dim, float* out, int32_t out_stride) {
  const int64_t n_rows = int64_t(n_q) * n_rep;
  for (int64_t r = 0; r < n_rows; ++r) {
    float* o = out + (r / n_rep) * out_stride + (r % n_rep) * head_dim;
    float m = -std::numeric_limits<float>::infinity();
    for (int32_t p = 0; p < n_parts; ++p) m = std::max(m, lse[p * n_rows + r]);
    std::fill(o, o + head_dim, 0.0f);
    if (m == -std::numeric_limits<float>::infinity()) continue;
    float sum = 0.0f;
    for (int32_t p = 0; p < n_parts; ++p) {
      const float w = std::exp(lse[p * n_rows + r] - m);
      if (w == 0.0f) continue;
      sum += w;
      const float* x = parts + (p * n_rows + r) * head_dim;
      for (int32_t d = 0; d < head_dim; ++d) o[d] += w * x[d];
    }
    const float inv = 1.0f / sum;
    for (int32_t d = 0; d < head_dim; ++d) o[d] *= inv;
  }
}

void StoreScoreRow(ScoreType type, const float* row, int64_t cols, int64_t token, void* tiles) {
  const int64_t slot = token % kScoreTile;
  if (type == ScoreType::kF16) {
    uint16_t* t = static_cast<uint16_t*>(tiles) + TiledIndex(token, 0, cols);
    for (int64_t j = 0; j < cols; ++j) t[j * kScoreTile] = F32ToF16(row[j]);
    return;
  }
  uint8_t* tile = static_cast<uint8_t*>(tiles) + (token / kScoreTile) * ScoreTileBytes(type, cols);
  const bool q4 = type == ScoreType::kQ4;
  const float levels = q4 ? 7.0f : 127.0f;
  float amax = 0.0f;
  bool finite = true;
  for (int64_t j = 0; j < cols; ++j) {
    finite = finite && std::isfinite(row[j]);
    amax = std::max(amax, std::fabs(row[j]));
  }
  // The scale is rounded to F16 first and the bytes are made against the rounded scale, so
  // byte * scale is the nearest value the format can give. A row with a NaN or infinity, or
  // a magnitude past F16's range, keeps zeros and a NaN scale: its scores come out NaN,
  // which selection ranks last, rather than silently finite.
  uint16_t scale = F32ToF16(amax / levels);
  const float d = F16ToF32(scale);
  finite = finite && std::isfinite(d);
  if (!finite) scale = 0x7e00;  // F16 quiet NaN
  const float inv = finite && d > 0 ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    const int q = finite ? int(std::clamp(std::nearbyint(row[j] * inv), -levels, levels)) : 0;
    if (!q4) {
      tile[j * kScoreTile + slot] = uint8_t(int8_t(q));
      continue;
    }
    uint8_t& b = tile[j * (kScoreTile / 2) + slot % (kScoreTile / 2)];
    const int shift = slot < kScoreTile / 2 ? 0 : 4;
    b = uint8_t((b & ~(0x0F << shift)) | ((q + 8) << shift));
  }
  std::memcpy(tile + ScoreValueBytes(type, cols) + slot * 2, &scale, 2);
}

void ScoreTiles(ScoreType type, const void* tiles, int64_t tile_begin, int64_t tile_end,
                int64_t cols, const float* x, int64_t n_x, float* y, int64_t y_stride) {
  if (tile_end <= tile_begin || n_x <= 0) return;
  switch (type) {
    case ScoreType::kQ8:
      return K().score_tiles_q8(static_cast<const uint8_t*>(tiles), tile_begin, tile_end, cols, x,
                                n_x, y, y_stride);
    case ScoreType::kQ4:
      return K().score_tiles_q4(static_cast<const uint8_t*>(tiles), tile_begin, tile_end, cols, x,
                                n_x, y, y_stride);
    default:
      return K().score_tiles_f16(static_cast<const uint16_t*>(tiles), tile_begin, tile_end, cols, x,
                                 n_x, y, y_stride);
  }
}

}  // namespace strata::kernels
