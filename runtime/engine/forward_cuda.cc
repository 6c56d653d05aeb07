#include "runtime/engine/forward_cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"

namespace strata {
namespace {

namespace kc = kernels::cuda;
using Clock = std::chrono::steady_clock;
using Stream = CudaDevice::Stream;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class CudaForward final : public ForwardPass {
 public:
  CudaForward(const Model& model, KvPolicy* kv, std::shared_ptr<CudaDevice> d, int32_t max_tokens)
      : model_(model), hp_(model.hparams()), kv_(kv), d_(std::move(d)), max_tokens_(max_tokens) {}

  ~CudaForward() override {
    (void)d_->Synchronize(Stream::kCompute);
    for (void* p : device_allocs_) d_->Free(p);
    for (void* p : host_allocs_) d_->HostFree(p);
  }

  Status Init();
  int32_t max_tokens() const override { return max_tokens_; }
  Status Run(const ForwardBatch& batch, std::vector<float>* logits) override;
  const ForwardTimes& times() const override { return times_; }

 private:
  struct Layer {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const uint16_t *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const uint16_t *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  };

  template <typename T>
  Status Alloc(size_t count, T** out) {
    void* p = nullptr;
    STRATA_RETURN_IF_ERROR(d_->Malloc(count * sizeof(T), &p));
    device_allocs_.push_back(p);
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
  // A matrix as F16 rows in GPU memory, whatever its type in the file.
  Status UploadF16(const TensorRef& t, const char* what, const uint16_t** out);
  // An F32 vector (norm weights, biases); null when absent.
  Status UploadF32(const TensorRef& t, const float** out);
  void Matmul(const uint16_t* w, int64_t rows, int64_t k, const float* x, int64_t n, float* y) {
    kc::MatmulF16(w, rows, k, x, n, y, stream_);
  }
  Status RunLayers(const ForwardBatch& batch, int64_t n_tok);

  const Model& model_;
  const HParams& hp_;
  KvPolicy* kv_;
  std::shared_ptr<CudaDevice> d_;
  const int32_t max_tokens_;
  void* stream_ = nullptr;
  std::vector<void*> device_allocs_, host_allocs_;

  std::vector<Layer> layers_;
  const float* output_norm_ = nullptr;
  const uint16_t* output_ = nullptr;
  const float* inv_freq_ = nullptr;
  // GPU scratch, [max_tokens][...].
  float *x_ = nullptr, *xn_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *attn_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr;
  // Pinned host staging for the embeddings and the logits.
  float *x_host_ = nullptr, *logits_host_ = nullptr;
  // Per pass: token -> position, token -> batch sequence index (GPU copies in the ring).
  std::vector<int32_t> tok_pos_, tok_seq_, out_rows_, span_begin_;
  std::vector<kernels::KvSpan> spans_;
  std::vector<char> upload_;  // a layer's spans_ then span_begin_, as one upload
  const int32_t* d_pos_ = nullptr;
  const int32_t* d_seq_ = nullptr;
  ForwardTimes times_;
};

Status CudaForward::UploadF16(const TensorRef& t, const char* what, const uint16_t** out) {
  if (!t.present()) return Status::InvalidArgument(std::string("cuda: the model has no ") + what);
  if (t.cols % 8 != 0)
    return Status::InvalidArgument(std::string("cuda: ") + what + " has " + std::to_string(t.cols) +
                                   " columns; the GPU matmul needs a multiple of 8");
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
  *out = dev;
  return Status::OK();
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
  *out = dev;
  return Status::OK();
}

Status CudaForward::Init() {
  stream_ = d_->stream(Stream::kCompute);
  const int64_t hd = hp_.head_dim;
  if (hd % 32 != 0 || hd > 256)
    return Status::InvalidArgument("cuda: head dimension " + std::to_string(hd) +
                                   " is not a multiple of 32 up to 256");
  if (hp_.n_rep() > 16)
    return Status::InvalidArgument("cuda: " + std::to_string(hp_.n_rep()) +
                                   " query heads per KV head; the attention kernel takes 16");
  if (kc::AttentionSharedBytes(hp_.n_rep(), int(hd)) > 48 * 1024)
    return Status::InvalidArgument(
        "cuda: " + std::to_string(hp_.n_rep()) + " query heads per KV head of dimension " +
        std::to_string(hd) + " need more than the attention kernel's 48 KiB of shared memory");
  const ModelWeights& W = model_.weights();
  layers_.resize(size_t(hp_.n_layer));
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    const LayerWeights& L = W.layers[size_t(l)];
    Layer& g = layers_[size_t(l)];
    STRATA_RETURN_IF_ERROR(UploadF32(L.attn_norm, &g.attn_norm));
    STRATA_RETURN_IF_ERROR(UploadF32(L.ffn_norm, &g.ffn_norm));
    STRATA_RETURN_IF_ERROR(UploadF16(L.wq, "attn_q", &g.wq));
    STRATA_RETURN_IF_ERROR(UploadF16(L.wk, "attn_k", &g.wk));
    STRATA_RETURN_IF_ERROR(UploadF16(L.wv, "attn_v", &g.wv));
    STRATA_RETURN_IF_ERROR(UploadF16(L.wo, "attn_output", &g.wo));
    STRATA_RETURN_IF_ERROR(UploadF16(L.w_gate, "ffn_gate", &g.w_gate));
    STRATA_RETURN_IF_ERROR(UploadF16(L.w_up, "ffn_up", &g.w_up));
    STRATA_RETURN_IF_ERROR(UploadF16(L.w_down, "ffn_down", &g.w_down));
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
  STRATA_RETURN_IF_ERROR(UploadF16(W.output, "output", &output_));
  const std::vector<float> inv = RopeInverseFrequencies(model_);
  float* inv_dev = nullptr;
  STRATA_RETURN_IF_ERROR(Alloc(std::max<size_t>(inv.size(), 1), &inv_dev));
  if (!inv.empty())
    STRATA_RETURN_IF_ERROR(d_->CopyToDevice(inv_dev, inv.data(), inv.size() * sizeof(float)));
  inv_freq_ = inv_dev;

  const size_t T = size_t(max_tokens_);
  const size_t q_dim = size_t(hp_.n_head) * hd, kv_dim = size_t(hp_.n_head_kv) * hd;
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_embd, &x_));
  STRATA_RETURN_IF_ERROR(Alloc(T * std::max<size_t>(hp_.n_embd, q_dim), &xn_));
  STRATA_RETURN_IF_ERROR(Alloc(T * q_dim, &q_));
  STRATA_RETURN_IF_ERROR(Alloc(T * kv_dim, &k_));
  STRATA_RETURN_IF_ERROR(Alloc(T * kv_dim, &v_));
  STRATA_RETURN_IF_ERROR(Alloc(T * q_dim, &attn_));
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_ff, &gate_));
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_ff, &up_));
  STRATA_RETURN_IF_ERROR(Alloc(T * hp_.n_vocab, &logits_));
  STRATA_RETURN_IF_ERROR(HostAlloc(T * hp_.n_embd, &x_host_));
  STRATA_RETURN_IF_ERROR(HostAlloc(T * hp_.n_vocab, &logits_host_));
  return d_->Synchronize(Stream::kCompute);
}

Status CudaForward::RunLayers(const ForwardBatch& batch, int64_t n_tok) {
  const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim;
  const int64_t q_dim = int64_t(hp_.n_head) * hd, kv_dim = int64_t(hp_.n_head_kv) * hd;
  const size_t n_seq = batch.seqs.size();
  std::span<const kernels::KvSpan> view;
  auto tk = Clock::now();
  STRATA_RETURN_IF_ERROR(kv_->Prepare(0, x_, n_embd));
  times_.kv += Seconds(tk, Clock::now());
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    const Layer& L = layers_[size_t(l)];
    if (l + 1 < hp_.n_layer) {
      tk = Clock::now();
      STRATA_RETURN_IF_ERROR(kv_->Prepare(l + 1, x_, n_embd));
      times_.kv += Seconds(tk, Clock::now());
    }
    // Layer 0's attention norm; every later layer's comes with the residual add before it.
    if (l == 0) kc::RmsNormRows(x_, L.attn_norm, xn_, n_tok, n_embd, hp_.rms_eps, stream_);
    // Q, K and V in one launch (a pass of a small model is bound by its launches).
    const kc::MatmulPart qkv[] = {{L.wq, q_dim, q_}, {L.wk, kv_dim, k_}, {L.wv, kv_dim, v_}};
    kc::MatmulF16Parts(qkv, 3, n_embd, xn_, n_tok, stream_);
    if (L.bq) kc::AddRowBias(q_, L.bq, n_tok, q_dim, stream_);
    if (L.bk) kc::AddRowBias(k_, L.bk, n_tok, kv_dim, stream_);
    if (L.bv) kc::AddRowBias(v_, L.bv, n_tok, kv_dim, stream_);
    if (L.q_norm) kc::RmsNormRows(q_, L.q_norm, q_, n_tok * hp_.n_head, hd, hp_.rms_eps, stream_);
    if (L.k_norm)
      kc::RmsNormRows(k_, L.k_norm, k_, n_tok * hp_.n_head_kv, hd, hp_.rms_eps, stream_);
    kc::RopeQk(q_, q_dim, hp_.n_head, k_, kv_dim, hp_.n_head_kv, n_tok, int(hd), hp_.rope_dim,
               d_pos_, inv_freq_, hp_.rope_layout, stream_);

    tk = Clock::now();
    int64_t t0 = 0;
    for (const BatchSeq& bs : batch.seqs) {
      STRATA_RETURN_IF_ERROR(kv_->Append(l, bs.seq, k_ + t0 * kv_dim, v_ + t0 * kv_dim));
      t0 += bs.n_new;
    }
    spans_.clear();
    span_begin_.assign(1, 0);
    for (size_t s = 0; s < n_seq; ++s) {
      STRATA_RETURN_IF_ERROR(kv_->View(l, batch.seqs[s].seq, &view));
      for (const kernels::KvSpan& sp : view) {
        if (sp.type != kernels::KvType::kF16)
          return Status::InvalidArgument(std::string("cuda: KV policy '") + kv_->name() +
                                         "' hands Q8_0 spans; the GPU attention reads F16");
        spans_.push_back(sp);
      }
      span_begin_.push_back(int32_t(spans_.size()));
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
    void* d_spans = d_list;
    void* d_begin = static_cast<char*>(d_list) + span_bytes;
    kc::AttentionBatch ab;
    ab.q = q_;
    ab.out = attn_;
    ab.n_tok = int32_t(n_tok);
    ab.n_head_kv = hp_.n_head_kv;
    ab.n_rep = hp_.n_rep();
    ab.head_dim = int32_t(hd);
    ab.scale = 1.0f / std::sqrt(float(hd));
    ab.tok_seq = d_seq_;
    ab.tok_pos = d_pos_;
    ab.span_begin = static_cast<const int32_t*>(d_begin);
    ab.spans = static_cast<const kernels::KvSpan*>(d_spans);
    kc::Attention(ab, stream_);

    Matmul(L.wo, n_embd, q_dim, attn_, n_tok, xn_);
    kc::AddRmsNormRows(x_, xn_, L.ffn_norm, xn_, n_tok, n_embd, hp_.rms_eps, stream_);
    const kc::MatmulPart gate_up[] = {{L.w_gate, hp_.n_ff, gate_}, {L.w_up, hp_.n_ff, up_}};
    kc::MatmulF16Parts(gate_up, 2, n_embd, xn_, n_tok, stream_);
    kc::SwiGlu(gate_, up_, n_tok * hp_.n_ff, stream_);
    Matmul(L.w_down, n_embd, hp_.n_ff, gate_, n_tok, xn_);
    if (l + 1 < hp_.n_layer)
      kc::AddRmsNormRows(x_, xn_, layers_[size_t(l) + 1].attn_norm, xn_, n_tok, n_embd, hp_.rms_eps,
                         stream_);
    else
      kc::Add(x_, xn_, n_tok * n_embd, stream_);
    STRATA_RETURN_IF_ERROR(d_->CheckLaunch("the layer's kernels"));
  }
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
  void *d_pos = nullptr, *d_seq = nullptr, *d_rows = nullptr;
  Status st = d_->Upload(tok_pos_.data(), tok_pos_.size() * 4, Stream::kCompute, &d_pos);
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
  if (n_out > 0) {
    kc::GatherRows(x_, static_cast<const int32_t*>(d_rows), xn_, n_out, n_embd, stream_);
    kc::RmsNormRows(xn_, output_norm_, xn_, n_out, n_embd, hp_.rms_eps, stream_);
    Matmul(output_, hp_.n_vocab, n_embd, xn_, n_out, logits_);
    STRATA_RETURN_IF_ERROR(d_->CheckLaunch("the output head"));
    STRATA_RETURN_IF_ERROR(d_->CopyToHostAsync(
        logits_host_, logits_, size_t(n_out * hp_.n_vocab) * sizeof(float), Stream::kCompute));
  }
  STRATA_RETURN_IF_ERROR(d_->Synchronize(Stream::kCompute));
  if (n_out > 0)
    std::memcpy(logits->data(), logits_host_, size_t(n_out * hp_.n_vocab) * sizeof(float));
  times_.other += Seconds(t_start, Clock::now()) - (times_.kv - kv0);
  return Status::OK();
}

}  // namespace

Status CreateCudaForward(const Model& model, KvPolicy* kv, std::shared_ptr<CudaDevice> device,
                         int32_t max_tokens, std::unique_ptr<ForwardPass>* out) {
  if (!device) return Status::InvalidArgument("cuda: no device");
  if (!kv->device_memory())
    return Status::InvalidArgument(std::string("cuda: KV policy '") + kv->name() +
                                   "' keeps KV in host memory; the CUDA backend needs KV in GPU "
                                   "memory (the prefix-tree policy on the device's memory)");
  if (max_tokens < 1)
    return Status::InvalidArgument("cuda: max_tokens " + std::to_string(max_tokens) + " < 1");
  auto f = std::make_unique<CudaForward>(model, kv, std::move(device), max_tokens);
  STRATA_RETURN_IF_ERROR(f->Init());
  *out = std::move(f);
  return Status::OK();
}

}  // namespace strata
