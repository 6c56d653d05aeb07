#include "runtime/engine/forward_cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "runtime/model/model_math.h"

namespace strata {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;
using Clock = std::chrono::steady_clock;
using Stream = CudaDevice::Stream;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Rows of logits computed per output-head launch: all logits of a long prefill (perplexity)
// go out in chunks of this many, so the buffer does not grow with the batch.
constexpr int64_t kLogitRows = 64;
// Most tokens a captured decode step takes (a beam group or batch decode beyond this runs
// uncaptured).
constexpr int64_t kGraphMaxTokens = 64;
// The F16 copy of a quantized matrix for the cuBLAS path is made this many bytes at a time.
constexpr size_t kDequantChunkBytes = size_t(64) << 20;

size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

// A weight matrix on the GPU: GGUF blocks read in place (q), or F16 rows (h).
struct Mat {
  DType type = DType::kF16;
  const uint8_t* q = nullptr;
  const uint16_t* h = nullptr;
  int64_t rows = 0, cols = 0;
};

// One matmul of a group: y = W x.
struct Part {
  const Mat* w;
  float* y;
};

class CudaForward final : public ForwardPass {
 public:
  CudaForward(const Model& model, KvPolicy* kv, std::shared_ptr<CudaDevice> d, int32_t max_tokens,
              const CudaForwardOptions& o)
      : model_(model),
        hp_(model.hparams()),
        kv_(kv),
        d_(std::move(d)),
        max_tokens_(max_tokens),
        opt_(o) {}

  ~CudaForward() override {
    graph_.exec.reset();
    (void)d_->Synchronize(Stream::kCompute);
    for (void* p : device_allocs_) d_->Free(p);
    for (void* p : host_allocs_) d_->HostFree(p);
    if (mapped_base_) d_->UnmapHost(mapped_base_);
  }

  Status Init();
  int32_t max_tokens() const override { return max_tokens_; }
  Status Run(const ForwardBatch& batch, std::vector<float>* logits) override;
  const ForwardTimes& times() const override { return times_; }
  uint64_t device_bytes() const override { return device_bytes_; }
  uint64_t device_weight_bytes() const override { return weight_bytes_; }
  std::string description() const override {
    return std::string("cuda (") + d_->name() + "): weights " +
           (mapped_base_ ? "mapped from host memory" : "in device memory") +
           (opt_.graphs ? ", decode graphs" : "") +
           (opt_.batch_invariant ? ", batch-invariant" : "");
  }

 private:
  struct Layer {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    Mat wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  };
  // Where one layer's attention finds its spans, and (in a captured graph) its stores.
  struct LayerIo {
    const kernels::KvSpan* spans = nullptr;
    const int32_t* span_begin = nullptr;
    const kc::StoreF16Op* ops = nullptr;  // graph only: launched by StoreF16Counted
    const int32_t* n_ops = nullptr;
    // The policy's estimate of what views left out (KvPolicy::Tail): token row, and the
    // device copies of its ratios and mean values.
    struct Tail {
      int64_t token;
      const float* ratio;
      const float* mean_v;
    };
    std::vector<Tail> tails;
    // Chunked attention (decode-sized batches): chunks per (token, KV head); 0 = unchunked.
    int32_t n_chunks = 0;
  };
  // A captured decode step and the shape it was captured for.
  struct Graph {
    int64_t n_tok = 0, n_out = 0;
    size_t n_seq = 0;
    int32_t span_cap = 0, op_cap = 0, chunk_cap = 0;
    int64_t op_max_n = 0;
    std::unique_ptr<CudaDevice::Graph> exec;
  };
  // Byte offsets of a graph step's parameters in the upload block.
  struct GraphLayout {
    size_t pos = 0, seq = 0, rows = 0, bytes = 0;
    std::vector<size_t> begin, n_ops, spans, ops;
  };

  template <typename T>
  Status Alloc(size_t count, T** out) {
    void* p = nullptr;
    STRATA_RETURN_IF_ERROR(d_->Malloc(count * sizeof(T), &p));
    device_allocs_.push_back(p);
    device_bytes_ += count * sizeof(T);
    *out = static_cast<T*>(p);
    return Status::OK();
  }
  template <typename T>
  Status HostAlloc(size_t count, T** out) {
    void* host = nullptr;
    void* alias = nullptr;
    STRATA_RETURN_IF_ERROR(d_->HostAlloc(count * sizeof(T), &host, &alias));
    host_allocs_.push_back(host);
    *out = static_cast<T*>(host);
    return Status::OK();
  }
  Status UploadMat(const TensorRef& t, const char* what, Mat* out);
  // Room for the chunked attention's partial results of n_tok tokens in n_chunks chunks;
  // *moved is set when the buffer had to be reallocated (a captured graph must then be
  // captured again).
  Status EnsurePartial(int64_t n_tok, int32_t n_chunks, bool* moved);
  // Chunks of kAttentionChunkKeys the longest of these views needs.
  static int32_t ChunksFor(const std::vector<kernels::KvSpan>& spans,
                           const std::vector<int32_t>& begin);
  Status UploadF32(const TensorRef& t, const float** out);
  bool Gemv(int64_t n_tok) const { return opt_.batch_invariant || n_tok <= kGemvMaxTokens; }
  // The quantized-activation output for a kernel producing a matmul input of n values per
  // token on the GEMV path (none when n is not whole blocks).
  kc::ActOut Act(int64_t n, int64_t n_tok) const {
    return Gemv(n_tok) && n % 32 == 0 ? kc::ActOut{xq_, xs_} : kc::ActOut{};
  }
  // y_i = W_i x for all parts (same k). x_quantized: xq_/xs_ already hold x (Act()).
  Status Matmul(std::initializer_list<Part> parts, const float* x, int64_t k, int64_t n_tok,
                bool x_quantized);
  Status PreAttention(int32_t l, int64_t n_tok);
  Status PostAttention(int32_t l, int64_t n_tok, const LayerIo& io);
  Status Output(int64_t n_out, const int32_t* d_rows, int64_t row0, float* logits_host);
  Status RunLayers(const ForwardBatch& batch, int64_t n_tok);
  bool CanCapture(const ForwardBatch& batch) const;
  Status RunCaptured(const ForwardBatch& batch, int64_t n_tok, std::vector<float>* logits);
  Status Capture(const GraphLayout& lay);
  void Plan(int64_t n_tok, size_t n_seq, int64_t n_out, int32_t span_cap, int32_t op_cap,
            GraphLayout* lay) const;

  const Model& model_;
  const HParams& hp_;
  KvPolicy* kv_;
  std::shared_ptr<CudaDevice> d_;
  const int32_t max_tokens_;
  CudaForwardOptions opt_;
  void* stream_ = nullptr;
  void* blas_ = nullptr;
  std::vector<void*> device_allocs_, host_allocs_;
  const void* mapped_base_ = nullptr;    // the model file, when weights are read in place
  const uint8_t* mapped_dev_ = nullptr;  // its device address
  uint64_t device_bytes_ = 0;
  uint64_t weight_bytes_ = 0;  // of device_bytes_, the weights (norms, biases included)
  float* partial_ = nullptr;   // chunked attention's partial results
  size_t partial_floats_ = 0;

  std::vector<Layer> layers_;
  const float* output_norm_ = nullptr;
  Mat output_;
  const float* inv_freq_ = nullptr;
  // GPU scratch, [max_tokens][...].
  float *x_ = nullptr, *xn_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *attn_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr;
  int8_t* xq_ = nullptr;           // quantized activations, [max_tokens][max k]
  kc::q::ActScale* xs_ = nullptr;  // their scales
  uint16_t* xh_ = nullptr;         // F16 activations for cuBLAS, [max_tokens][max k]
  uint16_t* wh_ = nullptr;         // F16 rows of a quantized matrix for cuBLAS
  size_t wh_elems_ = 0;
  // Pinned host staging for the embeddings and a chunk of logits; for a host-input policy,
  // a layer's hidden states and new K/V rows.
  float *x_host_ = nullptr, *logits_host_ = nullptr;
  float *hx_ = nullptr, *hk_ = nullptr, *hv_ = nullptr;
  std::vector<float> tail_upload_;
  // Per pass: token -> position, token -> batch sequence index, rows wanting logits.
  std::vector<int32_t> tok_pos_, tok_seq_, out_rows_, span_begin_;
  std::vector<kernels::KvSpan> spans_;
  std::vector<char> upload_;  // a layer's spans_ then span_begin_, as one upload
  const int32_t* d_pos_ = nullptr;
  const int32_t* d_seq_ = nullptr;
  // Captured decode.
  Graph graph_;
  char* graph_host_ = nullptr;  // pinned parameter block
  char* graph_dev_ = nullptr;
  size_t graph_bytes_ = 0;
  std::vector<std::vector<kernels::KvSpan>> layer_spans_;
  std::vector<std::vector<int32_t>> layer_begin_;
  std::vector<std::vector<kc::StoreF16Op>> layer_ops_;
  ForwardTimes times_;
};

Status CudaForward::UploadMat(const TensorRef& t, const char* what, Mat* out) {
  if (!t.present()) return Status::InvalidArgument(std::string("cuda: the model has no ") + what);
  out->rows = t.rows;
  out->cols = t.cols;
  const kernels::TypeInfo& ti = kernels::GetTypeInfo(t.type);
  if (kc::QuantizedWeightType(t.type) && t.cols % ti.block_elems == 0 &&
      t.row_bytes == kernels::RowBytes(t.type, t.cols)) {
    out->type = t.type;
    if (mapped_base_) {
      out->q = mapped_dev_ + (static_cast<const uint8_t*>(t.data) -
                              static_cast<const uint8_t*>(model_.gguf().base()));
      return Status::OK();
    }
    uint8_t* dev = nullptr;
    const size_t bytes = size_t(t.rows) * t.row_bytes;
    STRATA_RETURN_IF_ERROR(Alloc(bytes, &dev));
    STRATA_RETURN_IF_ERROR(d_->CopyToDevice(dev, t.data, bytes));
    weight_bytes_ += bytes;
    out->q = dev;
    return Status::OK();
  }
  // F16 rows: float tensors, and quantized types the GPU kernels do not decode.
  if (t.cols % 8 != 0)
    return Status::InvalidArgument(std::string("cuda: ") + what + " has " + std::to_string(t.cols) +
                                   " columns; the GPU matmul needs a multiple of 8");
  out->type = DType::kF16;
  std::vector<float> row(size_t(t.cols));
  std::vector<uint16_t> h(size_t(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r) {
    kernels::DequantizeRow(t.type, static_cast<const uint8_t*>(t.data) + size_t(r) * t.row_bytes,
                           row.data(), t.cols);
    kernels::F32ToF16Row(row.data(), h.data() + size_t(r * t.cols), t.cols);
  }
  uint16_t* dev = nullptr;
  STRATA_RETURN_IF_ERROR(Alloc(h.size(), &dev));
  STRATA_RETURN_IF_ERROR(d_->CopyToDevice(dev, h.data(), h.size() * sizeof(uint16_t)));
  weight_bytes_ += h.size() * sizeof(uint16_t);
  out->h = dev;
  return Status::OK();
}

Status CudaForward::EnsurePartial(int64_t n_tok, int32_t n_chunks, bool* moved) {
  const size_t need =
      size_t(n_tok) * size_t(hp_.n_head) * size_t(n_chunks) * size_t(hp_.head_dim + 2);
  if (moved) *moved = false;
  if (need <= partial_floats_) return Status::OK();
  STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
  if (partial_) {
    d_->Free(partial_);
    device_bytes_ -= partial_floats_ * sizeof(float);
  }
  partial_ = nullptr;
  partial_floats_ = 0;
  const size_t grow = std::max(need, need / 2 * 3);
  void* p = nullptr;
  STRATA_RETURN_IF_ERROR(d_->Malloc(grow * sizeof(float), &p));
  partial_ = static_cast<float*>(p);
  partial_floats_ = grow;
  device_bytes_ += grow * sizeof(float);
  if (moved) *moved = true;
  return Status::OK();
}

int32_t CudaForward::ChunksFor(const std::vector<kernels::KvSpan>& spans,
                               const std::vector<int32_t>& begin) {
  int64_t most = 0;
  for (size_t s = 0; s + 1 < begin.size(); ++s) {
    int64_t keys = 0;
    for (int32_t i = begin[s]; i < begin[s + 1]; ++i) keys += spans[size_t(i)].n_tokens;
    most = std::max(most, keys);
  }
  return int32_t(
      std::max<int64_t>(1, (most + kc::kAttentionChunkKeys - 1) / kc::kAttentionChunkKeys));
}

Status CudaForward::UploadF32(const TensorRef& t, const float** out) {
  *out = nullptr;
  if (!t.present()) return Status::OK();
  const size_t n = size_t(t.rows * t.cols);
  std::vector<float> h(n);
  kernels::DequantizeRow(t.type, t.data, h.data(), int64_t(n));
  float* dev = nullptr;
  STRATA_RETURN_IF_ERROR(Alloc(n, &dev));
  STRATA_RETURN_IF_ERROR(d_->CopyToDevice(dev, h.data(), n * sizeof(float)));
  weight_bytes_ += n * sizeof(float);
  *out = dev;
  return Status::OK();
}

Status CudaForward::Init() {
  stream_ = d_->stream(Stream::kCompute);
  // Launch properties are asked of the GPU here, not inside the first captured step.
  kc::PrepareLaunches();
  const int64_t hd = hp_.head_dim;
  if (hd % 32 != 0 || hd > 256)
    return Status::InvalidArgument("cuda: head dimension " + std::to_string(hd) +
                                   " is not a multiple of 32 up to 256");
  if (hp_.n_embd > kc::kMaxNormRow)
    return Status::InvalidArgument("cuda: embedding width " + std::to_string(hp_.n_embd) +
                                   " is above the norm kernel's " +
                                   std::to_string(kc::kMaxNormRow));
  if (hp_.n_rep() > 16)
    return Status::InvalidArgument("cuda: " + std::to_string(hp_.n_rep()) +
                                   " query heads per KV head; the attention kernel takes 16");
  if (kc::AttentionSharedBytes(hp_.n_rep(), int(hd)) > 48 * 1024)
    return Status::InvalidArgument(
        "cuda: " + std::to_string(hp_.n_rep()) + " query heads per KV head of dimension " +
        std::to_string(hd) + " need more than the attention kernel's 48 KiB of shared memory");
  const bool mapped = opt_.weights == GpuWeights::kMapped ||
                      (opt_.weights == GpuWeights::kAuto && d_->integrated());
  if (mapped) {
    const GgufFile& f = model_.gguf();
    const void* dev = nullptr;
    STRATA_RETURN_IF_ERROR(d_->MapHost(f.base(), f.file_size(), true, &dev)
                               .WithContext("cuda: reading the weights of " + model_.path() +
                                            " in place (gpu weights: mapped)"));
    mapped_base_ = f.base();
    mapped_dev_ = static_cast<const uint8_t*>(dev);
  }
  const ModelWeights& W = model_.weights();
  layers_.resize(size_t(hp_.n_layer));
  int64_t max_k = std::max<int64_t>({hp_.n_embd, int64_t(hp_.n_head) * hd, hp_.n_ff});
  size_t widest = 0;  // the largest layer matrix, in values
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    const LayerWeights& L = W.layers[size_t(l)];
    Layer& g = layers_[size_t(l)];
    STRATA_RETURN_IF_ERROR(UploadF32(L.attn_norm, &g.attn_norm));
    STRATA_RETURN_IF_ERROR(UploadF32(L.ffn_norm, &g.ffn_norm));
    STRATA_RETURN_IF_ERROR(UploadMat(L.wq, "attn_q", &g.wq));
    STRATA_RETURN_IF_ERROR(UploadMat(L.wk, "attn_k", &g.wk));
    STRATA_RETURN_IF_ERROR(UploadMat(L.wv, "attn_v", &g.wv));
    STRATA_RETURN_IF_ERROR(UploadMat(L.wo, "attn_output", &g.wo));
    STRATA_RETURN_IF_ERROR(UploadMat(L.w_gate, "ffn_gate", &g.w_gate));
    STRATA_RETURN_IF_ERROR(UploadMat(L.w_up, "ffn_up", &g.w_up));
    STRATA_RETURN_IF_ERROR(UploadMat(L.w_down, "ffn_down", &g.w_down));
    for (const Mat* m : {&g.wq, &g.wk, &g.wv, &g.wo, &g.w_gate, &g.w_up, &g.w_down})
      if (m->q) widest = std::max(widest, size_t(m->rows * m->cols));
    if (hp_.has_qkv_bias) {
      STRATA_RETURN_IF_ERROR(UploadF32(L.bq, &g.bq));
      STRATA_RETURN_IF_ERROR(UploadF32(L.bk, &g.bk));
      STRATA_RETURN_IF_ERROR(UploadF32(L.bv, &g.bv));
    }
    if (hp_.has_qk_norm) {
      STRATA_RETURN_IF_ERROR(UploadF32(L.q_norm, &g.q_norm));
      STRATA_RETURN_IF_ERROR(UploadF32(L.k_norm, &g.k_norm));
    }
  }
  STRATA_RETURN_IF_ERROR(UploadF32(W.output_norm, &output_norm_));
  STRATA_RETURN_IF_ERROR(UploadMat(W.output, "output", &output_));
  if (output_.q) widest = std::max(widest, size_t(output_.rows * output_.cols));
  const std::vector<float> inv = RopeInverseFrequencies(model_);
  float* inv_dev = nullptr;
  STRATA_RETURN_IF_ERROR(Alloc(std::max<size_t>(inv.size(), 1), &inv_dev));
  if (!inv.empty())
    STRATA_RETURN_IF_ERROR(d_->CopyToDevice(inv_dev, inv.data(), inv.size() * sizeof(float)));
  inv_freq_ = inv_dev;

  const size_t T = size_t(max_tokens_);
  const size_t q_dim = size_t(hp_.n_head) * hd, kv_dim = size_t(hp_.n_head_kv) * hd;
  const size_t out_rows = size_t(std::min<int64_t>(max_tokens_, kLogitRows));
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_embd, &x_));
  STRATA_RETURN_IF_ERROR(Alloc(T * std::max<size_t>(hp_.n_embd, q_dim), &xn_));
  STRATA_RETURN_IF_ERROR(Alloc(T * q_dim, &q_));
  STRATA_RETURN_IF_ERROR(Alloc(T * kv_dim, &k_));
  STRATA_RETURN_IF_ERROR(Alloc(T * kv_dim, &v_));
  STRATA_RETURN_IF_ERROR(Alloc(T * q_dim, &attn_));
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_ff, &gate_));
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_ff, &up_));
  STRATA_RETURN_IF_ERROR(Alloc(out_rows * hp_.n_vocab, &logits_));
  STRATA_RETURN_IF_ERROR(Alloc(T * size_t(max_k), &xq_));
  STRATA_RETURN_IF_ERROR(Alloc(T * size_t(max_k) / 32 + 1, &xs_));
  if (!Gemv(max_tokens_)) {
    STRATA_RETURN_IF_ERROR(Alloc(T * size_t(max_k), &xh_));
    // Rows of the widest quantized matrix that fit the chunk (at least one whole row).
    wh_elems_ = std::min(widest, std::max(kDequantChunkBytes / 2, size_t(max_k)));
    if (wh_elems_ > 0) STRATA_RETURN_IF_ERROR(Alloc(wh_elems_, &wh_));
    STRATA_RETURN_IF_ERROR(d_->Blas(&blas_));
  }
  STRATA_RETURN_IF_ERROR(HostAlloc(T * hp_.n_embd, &x_host_));
  STRATA_RETURN_IF_ERROR(HostAlloc(out_rows * hp_.n_vocab, &logits_host_));
  if (kv_->host_inputs()) {
    STRATA_RETURN_IF_ERROR(HostAlloc(T * hp_.n_embd, &hx_));
    STRATA_RETURN_IF_ERROR(HostAlloc(T * kv_dim, &hk_));
    STRATA_RETURN_IF_ERROR(HostAlloc(T * kv_dim, &hv_));
  }
  return d_->Synchronize(Stream::kCompute);
}

Status CudaForward::Matmul(std::initializer_list<Part> parts, const float* x, int64_t k,
                           int64_t n_tok, bool x_quantized) {
  if (Gemv(n_tok)) {
    bool any_q = false;
    for (const Part& p : parts) any_q |= p.w->q != nullptr;
    if (any_q && !x_quantized) kc::QuantizeActivations(x, n_tok, k, {xq_, xs_}, stream_);
    // One launch per weight type among the parts (Q4_K_M files mix Q4_K and Q6_K in a layer).
    kc::QMatmulPart qp[3];
    kc::MatmulPart hp[3];
    bool done[3] = {false, false, false};
    const Part* ps = parts.begin();
    const int n = int(parts.size());
    for (int i = 0; i < n; ++i) {
      if (done[i]) continue;
      int m = 0;
      if (ps[i].w->q) {
        for (int j = i; j < n; ++j)
          if (!done[j] && ps[j].w->q && ps[j].w->type == ps[i].w->type) {
            qp[m++] = {ps[j].w->q, ps[j].w->rows, ps[j].y};
            done[j] = true;
          }
        kc::QMatmulParts(ps[i].w->type, qp, m, k, xq_, xs_, n_tok, stream_);
      } else {
        for (int j = i; j < n; ++j)
          if (!done[j] && !ps[j].w->q) {
            hp[m++] = {ps[j].w->h, ps[j].w->rows, ps[j].y};
            done[j] = true;
          }
        kc::MatmulF16Parts(hp, m, k, x, n_tok, stream_);
      }
    }
    return Status::OK();
  }
  kc::F32ToF16(x, n_tok * k, xh_, stream_);
  for (const Part& p : parts) {
    const Mat& w = *p.w;
    if (w.h) {
      if (!kc::GemmF16(blas_, w.h, w.rows, k, xh_, n_tok, p.y, w.rows))
        return Status::IOError("cuda: cuBLAS refused a matmul");
      continue;
    }
    const int64_t chunk = std::max<int64_t>(1, int64_t(wh_elems_) / k);
    for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
      const int64_t r1 = std::min(w.rows, r0 + chunk);
      kc::DequantizeF16(w.type, w.q, r0, r1, k, wh_, stream_);
      if (!kc::GemmF16(blas_, wh_, r1 - r0, k, xh_, n_tok, p.y + r0, w.rows))
        return Status::IOError("cuda: cuBLAS refused a matmul");
    }
  }
  return Status::OK();
}

// Layer l up to attention: (layer 0's norm), Q, K, V, biases, Q/K norms, RoPE.
Status CudaForward::PreAttention(int32_t l, int64_t n_tok) {
  const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim;
  const int64_t q_dim = int64_t(hp_.n_head) * hd, kv_dim = int64_t(hp_.n_head_kv) * hd;
  const Layer& L = layers_[size_t(l)];
  // Layer 0's attention norm; every later layer's comes with the residual add before it.
  if (l == 0)
    kc::RmsNormRows(x_, L.attn_norm, xn_, n_tok, n_embd, hp_.rms_eps, stream_, Act(n_embd, n_tok));
  STRATA_RETURN_IF_ERROR(Matmul({{&L.wq, q_}, {&L.wk, k_}, {&L.wv, v_}}, xn_, n_embd, n_tok,
                                Act(n_embd, n_tok).q != nullptr));
  if (L.bq) kc::AddRowBias(q_, L.bq, n_tok, q_dim, stream_);
  if (L.bk) kc::AddRowBias(k_, L.bk, n_tok, kv_dim, stream_);
  if (L.bv) kc::AddRowBias(v_, L.bv, n_tok, kv_dim, stream_);
  if (L.q_norm) kc::RmsNormRows(q_, L.q_norm, q_, n_tok * hp_.n_head, hd, hp_.rms_eps, stream_);
  if (L.k_norm) kc::RmsNormRows(k_, L.k_norm, k_, n_tok * hp_.n_head_kv, hd, hp_.rms_eps, stream_);
  kc::RopeQk(q_, q_dim, hp_.n_head, k_, kv_dim, hp_.n_head_kv, n_tok, int(hd), hp_.rope_dim, d_pos_,
             inv_freq_, hp_.rope_layout, stream_);
  return Status::OK();
}

// Layer l from attention on: attention over io's spans, output projection, residual, FFN,
// residual (and the next layer's attention norm).
Status CudaForward::PostAttention(int32_t l, int64_t n_tok, const LayerIo& io) {
  const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim;
  const int64_t q_dim = int64_t(hp_.n_head) * hd;
  const Layer& L = layers_[size_t(l)];
  if (io.ops) kc::StoreF16Counted(io.ops, io.n_ops, graph_.op_cap, graph_.op_max_n, stream_);
  kc::AttentionBatch ab;
  ab.q = q_;
  ab.out = attn_;
  ab.n_tok = int32_t(n_tok);
  ab.n_head_kv = hp_.n_head_kv;
  ab.n_rep = hp_.n_rep();
  ab.head_dim = int32_t(hd);
  ab.scale = AttentionScale(hp_);
  ab.tok_seq = d_seq_;
  ab.tok_pos = d_pos_;
  ab.span_begin = io.span_begin;
  ab.spans = io.spans;
  if (io.n_chunks > 0) {
    ab.chunk_keys = kc::kAttentionChunkKeys;
    ab.n_chunks = io.n_chunks;
    ab.partial = partial_;
  }
  // Prefill-sized passes share key stages among a tile of queries where the shape allows.
  if (Gemv(n_tok) || !kc::AttentionTiled(ab, stream_)) kc::Attention(ab, stream_);
  for (const LayerIo::Tail& t : io.tails)
    kc::AttendTail(attn_ + t.token * q_dim, t.ratio, t.mean_v, hp_.n_head, hp_.n_rep(), int(hd),
                   stream_);

  STRATA_RETURN_IF_ERROR(Matmul({{&L.wo, xn_}}, attn_, q_dim, n_tok, false));
  kc::AddRmsNormRows(x_, xn_, L.ffn_norm, xn_, n_tok, n_embd, hp_.rms_eps, stream_,
                     Act(n_embd, n_tok));
  STRATA_RETURN_IF_ERROR(Matmul({{&L.w_gate, gate_}, {&L.w_up, up_}}, xn_, n_embd, n_tok,
                                Act(n_embd, n_tok).q != nullptr));
  kc::SwiGlu(gate_, up_, n_tok * hp_.n_ff, stream_, Act(hp_.n_ff, n_tok));
  STRATA_RETURN_IF_ERROR(
      Matmul({{&L.w_down, xn_}}, gate_, hp_.n_ff, n_tok, Act(hp_.n_ff, n_tok).q != nullptr));
  if (l + 1 < hp_.n_layer)
    kc::AddRmsNormRows(x_, xn_, layers_[size_t(l) + 1].attn_norm, xn_, n_tok, n_embd, hp_.rms_eps,
                       stream_, Act(n_embd, n_tok));
  else
    kc::Add(x_, xn_, n_tok * n_embd, stream_);
  return Status::OK();
}

// Logits of n_out rows (d_rows: their tokens) into logits_host (pinned), as one chunk.
Status CudaForward::Output(int64_t n_out, const int32_t* d_rows, int64_t row0, float* logits_host) {
  const int64_t n_embd = hp_.n_embd;
  kc::GatherRows(x_, d_rows + row0, xn_, n_out, n_embd, stream_);
  kc::RmsNormRows(xn_, output_norm_, xn_, n_out, n_embd, hp_.rms_eps, stream_, Act(n_embd, n_out));
  STRATA_RETURN_IF_ERROR(
      Matmul({{&output_, logits_}}, xn_, n_embd, n_out, Act(n_embd, n_out).q != nullptr));
  STRATA_RETURN_IF_ERROR(d_->CheckLaunch("the output head"));
  return d_->CopyToHostAsync(logits_host, logits_, size_t(n_out * hp_.n_vocab) * sizeof(float),
                             Stream::kCompute);
}

Status CudaForward::RunLayers(const ForwardBatch& batch, int64_t n_tok) {
  const int64_t n_embd = hp_.n_embd;
  const size_t n_seq = batch.seqs.size();
  const int64_t kv_dim = int64_t(hp_.n_head_kv) * hp_.head_dim;
  // A host policy behind DeviceViewKv takes its inputs in host memory: each layer's hidden
  // states and new K/V come down in one wait, after the layer's Q/K/V.
  const bool host_in = kv_->host_inputs();
  std::span<const kernels::KvSpan> view;
  auto tk = Clock::now();
  STRATA_RETURN_IF_ERROR(kv_->Prepare(0, host_in ? x_host_ : x_, n_embd));
  times_.kv_prepare += Seconds(tk, Clock::now());
  times_.kv += Seconds(tk, Clock::now());
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    if (!host_in && l + 1 < hp_.n_layer) {
      tk = Clock::now();
      STRATA_RETURN_IF_ERROR(kv_->Prepare(l + 1, x_, n_embd));
      times_.kv_prepare += Seconds(tk, Clock::now());
      times_.kv += Seconds(tk, Clock::now());
    }
    STRATA_RETURN_IF_ERROR(PreAttention(l, n_tok));
    const float *k_in = k_, *v_in = v_;
    if (host_in) {
      // x_ still holds layer l's input: PreAttention writes only xn_, q_, k_ and v_.
      if (l + 1 < hp_.n_layer)
        STRATA_RETURN_IF_ERROR(
            d_->CopyToHostAsync(hx_, x_, size_t(n_tok * n_embd) * sizeof(float), Stream::kCompute));
      const size_t kv_bytes = size_t(n_tok * kv_dim) * sizeof(float);
      STRATA_RETURN_IF_ERROR(d_->CopyToHostAsync(hk_, k_, kv_bytes, Stream::kCompute));
      STRATA_RETURN_IF_ERROR(d_->CopyToHostAsync(hv_, v_, kv_bytes, Stream::kCompute));
      // The wait counts as `other` with the rest of the pass (Run adds what kv did not take).
      STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
      tk = Clock::now();
      if (l + 1 < hp_.n_layer) STRATA_RETURN_IF_ERROR(kv_->Prepare(l + 1, hx_, n_embd));
      times_.kv_prepare += Seconds(tk, Clock::now());
      times_.kv += Seconds(tk, Clock::now());
      k_in = hk_;
      v_in = hv_;
    }

    tk = Clock::now();
    int64_t t0 = 0;
    for (const BatchSeq& bs : batch.seqs) {
      STRATA_RETURN_IF_ERROR(kv_->Append(l, bs.seq, k_in + t0 * kv_dim, v_in + t0 * kv_dim));
      t0 += bs.n_new;
    }
    LayerIo io;
    spans_.clear();
    span_begin_.assign(1, 0);
    t0 = 0;
    for (size_t s = 0; s < n_seq; ++s) {
      const BatchSeq& bs = batch.seqs[s];
      STRATA_RETURN_IF_ERROR(kv_->View(l, bs.seq, &view));
      for (const kernels::KvSpan& sp : view) {
        if (sp.type != kernels::KvType::kF16)
          return Status::InvalidArgument(std::string("cuda: KV policy '") + kv_->name() +
                                         "' hands Q8_0 spans; the GPU attention reads F16");
        spans_.push_back(sp);
      }
      span_begin_.push_back(int32_t(spans_.size()));
      KvTail tail;
      KvTailEstimate* estimate = kv_->tail_estimate();
      if (bs.n_new == 1 && estimate && estimate->Tail(l, bs.seq, &tail)) {
        // Ratios and mean values go up together: [n_head] then [n_head_kv * head_dim].
        tail_upload_.assign(tail.ratio, tail.ratio + hp_.n_head);
        tail_upload_.insert(tail_upload_.end(), tail.mean_v, tail.mean_v + kv_dim);
        void* d_tail = nullptr;
        STRATA_RETURN_IF_ERROR(d_->Upload(tail_upload_.data(), tail_upload_.size() * sizeof(float),
                                          Stream::kCompute, &d_tail));
        const float* r = static_cast<const float*>(d_tail);
        io.tails.push_back({t0, r, r + hp_.n_head});
      }
      t0 += bs.n_new;
    }
    times_.kv += Seconds(tk, Clock::now());
    STRATA_RETURN_IF_ERROR(d_->FlushStores());
    // The spans and each sequence's first span in one upload (one copy a layer, not two).
    static_assert(sizeof(kernels::KvSpan) % alignof(int32_t) == 0);
    const size_t span_bytes = spans_.size() * sizeof(kernels::KvSpan);
    upload_.resize(span_bytes + span_begin_.size() * sizeof(int32_t));
    if (span_bytes) std::memcpy(upload_.data(), spans_.data(), span_bytes);
    std::memcpy(upload_.data() + span_bytes, span_begin_.data(),
                span_begin_.size() * sizeof(int32_t));
    void* d_list = nullptr;
    STRATA_RETURN_IF_ERROR(d_->Upload(upload_.data(), upload_.size(), Stream::kCompute, &d_list));
    io.spans = static_cast<const kernels::KvSpan*>(d_list);
    io.span_begin = reinterpret_cast<const int32_t*>(static_cast<char*>(d_list) + span_bytes);
    // Decode-sized batches have few (token, KV head) pairs: their keys go in chunks, so a
    // long context spreads over the GPU (prefill has rows enough).
    if (Gemv(n_tok)) {
      io.n_chunks = ChunksFor(spans_, span_begin_);
      STRATA_RETURN_IF_ERROR(EnsurePartial(n_tok, io.n_chunks, nullptr));
    }
    STRATA_RETURN_IF_ERROR(PostAttention(l, n_tok, io));
    STRATA_RETURN_IF_ERROR(d_->CheckLaunch("the layer's kernels"));
  }
  return Status::OK();
}

bool CudaForward::CanCapture(const ForwardBatch& batch) const {
  if (!opt_.graphs || !kv_->views_precomputable()) return false;
  const int64_t n_tok = int64_t(batch.tokens.size());
  if (n_tok > kGraphMaxTokens || !Gemv(n_tok)) return false;
  for (const BatchSeq& s : batch.seqs)
    if (s.n_new != 1) return false;
  return batch.n_outputs() <= std::min<int64_t>(kLogitRows, max_tokens_);
}

void CudaForward::Plan(int64_t n_tok, size_t n_seq, int64_t n_out, int32_t span_cap, int32_t op_cap,
                       GraphLayout* lay) const {
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at = Align16(at + bytes);
    return here;
  };
  lay->pos = take(size_t(n_tok) * 4);
  lay->seq = take(size_t(n_tok) * 4);
  lay->rows = take(size_t(std::max<int64_t>(n_out, 1)) * 4);
  const size_t L = size_t(hp_.n_layer);
  lay->begin.resize(L);
  lay->n_ops.resize(L);
  lay->spans.resize(L);
  lay->ops.resize(L);
  for (size_t l = 0; l < L; ++l) {
    lay->begin[l] = take((n_seq + 1) * 4);
    lay->n_ops[l] = take(4);
    lay->spans[l] = take(size_t(span_cap) * sizeof(kernels::KvSpan));
    lay->ops[l] = take(size_t(op_cap) * sizeof(kc::StoreF16Op));
  }
  lay->bytes = at;
}

// Records one decode step's whole launch sequence, reading everything that changes from step
// to step (positions, spans, stores, embeddings) from fixed buffers.
Status CudaForward::Capture(const GraphLayout& lay) {
  graph_.exec.reset();
  const int64_t n_tok = graph_.n_tok;
  const char* dev = graph_dev_;
  d_pos_ = reinterpret_cast<const int32_t*>(dev + lay.pos);
  d_seq_ = reinterpret_cast<const int32_t*>(dev + lay.seq);
  STRATA_RETURN_IF_ERROR(d_->BeginCapture());
  Status st = d_->CopyToDeviceAsync(graph_dev_, graph_host_, lay.bytes, Stream::kCompute);
  if (st.ok())
    st = d_->CopyToDeviceAsync(x_, x_host_, size_t(n_tok * hp_.n_embd) * sizeof(float),
                               Stream::kCompute);
  for (int32_t l = 0; st.ok() && l < hp_.n_layer; ++l) {
    st = PreAttention(l, n_tok);
    if (!st.ok()) break;
    LayerIo io;
    io.spans = reinterpret_cast<const kernels::KvSpan*>(dev + lay.spans[size_t(l)]);
    io.span_begin = reinterpret_cast<const int32_t*>(dev + lay.begin[size_t(l)]);
    io.ops = reinterpret_cast<const kc::StoreF16Op*>(dev + lay.ops[size_t(l)]);
    io.n_ops = reinterpret_cast<const int32_t*>(dev + lay.n_ops[size_t(l)]);
    io.n_chunks = graph_.chunk_cap;
    st = PostAttention(l, n_tok, io);
  }
  if (st.ok() && graph_.n_out > 0)
    st = Output(graph_.n_out, reinterpret_cast<const int32_t*>(dev + lay.rows), 0, logits_host_);
  std::unique_ptr<CudaDevice::Graph> exec;
  const Status end = d_->EndCapture(&exec);
  STRATA_RETURN_IF_ERROR(st);
  STRATA_RETURN_IF_ERROR(end);
  graph_.exec = std::move(exec);
  return Status::OK();
}

Status CudaForward::RunCaptured(const ForwardBatch& batch, int64_t n_tok,
                                std::vector<float>* logits) {
  const size_t n_seq = batch.seqs.size();
  const int64_t n_embd = hp_.n_embd;
  const int64_t kv_dim = int64_t(hp_.n_head_kv) * hp_.head_dim;
  const int64_t n_out = int64_t(out_rows_.size());
  // The policy's side of every layer first: it queues stores and computes views only.
  auto tk = Clock::now();
  layer_spans_.resize(size_t(hp_.n_layer));
  layer_begin_.resize(size_t(hp_.n_layer));
  layer_ops_.resize(size_t(hp_.n_layer));
  std::span<const kernels::KvSpan> view;
  STRATA_RETURN_IF_ERROR(kv_->Prepare(0, x_, n_embd));
  int32_t span_cap = 0, op_cap = 0, chunks = 1;
  int64_t op_max_n = 0;
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    if (l + 1 < hp_.n_layer) STRATA_RETURN_IF_ERROR(kv_->Prepare(l + 1, x_, n_embd));
    int64_t t0 = 0;
    for (const BatchSeq& bs : batch.seqs) {
      STRATA_RETURN_IF_ERROR(kv_->Append(l, bs.seq, k_ + t0 * kv_dim, v_ + t0 * kv_dim));
      t0 += bs.n_new;
    }
    auto& spans = layer_spans_[size_t(l)];
    auto& begin = layer_begin_[size_t(l)];
    spans.clear();
    begin.assign(1, 0);
    for (size_t s = 0; s < n_seq; ++s) {
      STRATA_RETURN_IF_ERROR(kv_->View(l, batch.seqs[s].seq, &view));
      for (const kernels::KvSpan& sp : view) {
        if (sp.type != kernels::KvType::kF16)
          return Status::InvalidArgument(std::string("cuda: KV policy '") + kv_->name() +
                                         "' hands Q8_0 spans; the GPU attention reads F16");
        spans.push_back(sp);
      }
      begin.push_back(int32_t(spans.size()));
    }
    STRATA_RETURN_IF_ERROR(d_->TakeStores(&layer_ops_[size_t(l)]));
    span_cap = std::max(span_cap, int32_t(spans.size()));
    chunks = std::max(chunks, ChunksFor(spans, begin));
    op_cap = std::max(op_cap, int32_t(layer_ops_[size_t(l)].size()));
    for (const kc::StoreF16Op& op : layer_ops_[size_t(l)]) op_max_n = std::max(op_max_n, op.n);
  }
  times_.kv += Seconds(tk, Clock::now());

  // Capture again when the step's shape outgrew the captured one.
  bool fits = graph_.exec && graph_.n_tok == n_tok && graph_.n_seq == n_seq &&
              graph_.n_out == n_out && span_cap <= graph_.span_cap && op_cap <= graph_.op_cap &&
              op_max_n <= graph_.op_max_n && chunks <= graph_.chunk_cap;
  GraphLayout lay;
  if (!fits) {
    graph_.n_tok = n_tok;
    graph_.n_seq = n_seq;
    graph_.n_out = n_out;
    graph_.span_cap = std::max(span_cap, graph_.span_cap);
    graph_.op_cap = std::max(op_cap, graph_.op_cap);
    graph_.op_max_n = std::max(op_max_n, graph_.op_max_n);
    // Room for 2048 more keys before the context outgrows the captured chunk count (each
    // chunk past a sequence's keys costs an idle block).
    if (chunks > graph_.chunk_cap) graph_.chunk_cap = chunks == 1 ? 1 : chunks + 8;
  }
  bool moved = false;
  STRATA_RETURN_IF_ERROR(EnsurePartial(n_tok, graph_.chunk_cap, &moved));
  if (moved) fits = false;
  Plan(n_tok, n_seq, n_out, graph_.span_cap, graph_.op_cap, &lay);
  if (lay.bytes > graph_bytes_) {
    graph_.exec.reset();
    STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
    const size_t bytes = lay.bytes * 2;
    STRATA_RETURN_IF_ERROR(HostAlloc(bytes, &graph_host_));
    STRATA_RETURN_IF_ERROR(Alloc(bytes, &graph_dev_));
    graph_bytes_ = bytes;
  }
  char* h = graph_host_;
  std::memcpy(h + lay.pos, tok_pos_.data(), tok_pos_.size() * 4);
  std::memcpy(h + lay.seq, tok_seq_.data(), tok_seq_.size() * 4);
  if (n_out > 0) std::memcpy(h + lay.rows, out_rows_.data(), out_rows_.size() * 4);
  for (size_t l = 0; l < size_t(hp_.n_layer); ++l) {
    std::memcpy(h + lay.begin[l], layer_begin_[l].data(), layer_begin_[l].size() * 4);
    const int32_t n_ops = int32_t(layer_ops_[l].size());
    std::memcpy(h + lay.n_ops[l], &n_ops, 4);
    if (!layer_spans_[l].empty())
      std::memcpy(h + lay.spans[l], layer_spans_[l].data(),
                  layer_spans_[l].size() * sizeof(kernels::KvSpan));
    if (n_ops > 0)
      std::memcpy(h + lay.ops[l], layer_ops_[l].data(), size_t(n_ops) * sizeof(kc::StoreF16Op));
  }
  if (!graph_.exec || !fits) STRATA_RETURN_IF_ERROR(Capture(lay));
  STRATA_RETURN_IF_ERROR(graph_.exec->Launch());
  STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
  logits->resize(size_t(n_out) * hp_.n_vocab);
  if (n_out > 0)
    std::memcpy(logits->data(), logits_host_, size_t(n_out * hp_.n_vocab) * sizeof(float));
  return Status::OK();
}

Status CudaForward::Run(const ForwardBatch& batch, std::vector<float>* logits) {
  const auto t_start = Clock::now();
  const double kv0 = times_.kv;
  const int64_t n_tok = int64_t(batch.tokens.size());
  STRATA_RETURN_IF_ERROR(CheckForwardBatch(batch, max_tokens_, hp_.n_vocab));
  auto tk = Clock::now();
  STRATA_RETURN_IF_ERROR(kv_->BeginBatch(batch.seqs));
  times_.kv += Seconds(tk, Clock::now());

  const ModelWeights& W = model_.weights();
  const int64_t n_embd = hp_.n_embd;
  tok_pos_.clear();
  tok_seq_.clear();
  out_rows_.clear();
  int64_t t = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s)
    for (int32_t i = 0; i < batch.seqs[s].n_new; ++i, ++t) {
      tok_pos_.push_back(batch.seqs[s].pos0 + i);
      tok_seq_.push_back(int32_t(s));
      if (batch.want_logits[size_t(t)]) out_rows_.push_back(int32_t(t));
      const auto* row = static_cast<const uint8_t*>(W.tok_embd.data) +
                        size_t(batch.tokens[size_t(t)]) * W.tok_embd.row_bytes;
      kernels::DequantizeRow(W.tok_embd.type, row, x_host_ + t * n_embd, n_embd);
    }

  Status st;
  if (CanCapture(batch)) {
    st = RunCaptured(batch, n_tok, logits);
    if (!st.ok()) {
      kv_->AbortBatch();
      std::vector<kc::StoreF16Op> dropped;
      (void)d_->TakeStores(&dropped);
      (void)d_->Synchronize(Stream::kCompute);
      graph_.exec.reset();
      return st;
    }
    tk = Clock::now();
    STRATA_RETURN_IF_ERROR(kv_->EndBatch());
    times_.kv += Seconds(tk, Clock::now());
    times_.other += Seconds(t_start, Clock::now()) - (times_.kv - kv0);
    return Status::OK();
  }

  void *d_pos = nullptr, *d_seq = nullptr, *d_rows = nullptr;
  st = d_->Upload(tok_pos_.data(), tok_pos_.size() * 4, Stream::kCompute, &d_pos);
  if (st.ok()) st = d_->Upload(tok_seq_.data(), tok_seq_.size() * 4, Stream::kCompute, &d_seq);
  if (st.ok() && !out_rows_.empty())
    st = d_->Upload(out_rows_.data(), out_rows_.size() * 4, Stream::kCompute, &d_rows);
  if (st.ok())
    st = d_->CopyToDeviceAsync(x_, x_host_, size_t(n_tok * n_embd) * sizeof(float),
                               Stream::kCompute);
  d_pos_ = static_cast<const int32_t*>(d_pos);
  d_seq_ = static_cast<const int32_t*>(d_seq);
  if (st.ok()) st = RunLayers(batch, n_tok);
  if (!st.ok()) {
    kv_->AbortBatch();
    // Stores queued for the aborted pass go out now, into memory the policy no longer
    // counts, rather than into whatever a later pass puts there.
    (void)d_->FlushStores();
    (void)d_->Synchronize(Stream::kCompute);
    return st;
  }
  tk = Clock::now();
  STRATA_RETURN_IF_ERROR(kv_->EndBatch());
  times_.kv += Seconds(tk, Clock::now());

  const int64_t n_out = int64_t(out_rows_.size());
  logits->resize(size_t(n_out) * hp_.n_vocab);
  const int64_t chunk = std::min<int64_t>(kLogitRows, max_tokens_);
  for (int64_t r0 = 0; r0 < n_out; r0 += chunk) {
    const int64_t n = std::min(chunk, n_out - r0);
    STRATA_RETURN_IF_ERROR(Output(n, static_cast<const int32_t*>(d_rows), r0, logits_host_));
    STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
    std::memcpy(logits->data() + size_t(r0) * hp_.n_vocab, logits_host_,
                size_t(n * hp_.n_vocab) * sizeof(float));
  }
  if (n_out == 0) STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
  times_.other += Seconds(t_start, Clock::now()) - (times_.kv - kv0);
  return Status::OK();
}

}  // namespace

Status CreateCudaForward(const Model& model, KvPolicy* kv, std::shared_ptr<CudaDevice> device,
                         int32_t max_tokens, const CudaForwardOptions& options,
                         std::unique_ptr<ForwardPass>* out) {
  if (!device) return Status::InvalidArgument("cuda: no device");
  if (!kv->device_memory())
    return Status::InvalidArgument(std::string("cuda: KV policy '") + kv->name() +
                                   "' keeps KV in host memory; the CUDA backend needs KV in GPU "
                                   "memory (the prefix-tree policy on the device's memory)");
  if (max_tokens < 1)
    return Status::InvalidArgument("cuda: max_tokens " + std::to_string(max_tokens) + " < 1");
  auto f = std::make_unique<CudaForward>(model, kv, std::move(device), max_tokens, options);
  STRATA_RETURN_IF_ERROR(f->Init());
  *out = std::move(f);
  return Status::OK();
}

}  // namespace strata
