#include "tuner/calibration.h"

#include <lapacke.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>

#include "runtime/engine/engine.h"
#include "runtime/kv/memory_kv.h"

namespace strata {
namespace {

// A memory KV policy that also keeps a copy of every key it is given, per layer.
class KeyRecorder final : public KvPolicy {
 public:
  KeyRecorder(std::unique_ptr<MemoryKv> inner, int32_t capacity)
      : inner_(std::move(inner)), capacity_(capacity), keys_(size_t(inner_->shape().n_layer)) {}

  const char* name() const override { return "key-recorder"; }
  const KvShape& shape() const override { return inner_->shape(); }
  Status AddSequence(SeqId* out) override { return inner_->AddSequence(out); }
  Status RemoveSequence(SeqId seq) override { return inner_->RemoveSequence(seq); }
  int32_t Length(SeqId seq) const override { return inner_->Length(seq); }
  Status BeginBatch(std::span<const BatchSeq> batch) override {
    batch_.assign(batch.begin(), batch.end());
    return inner_->BeginBatch(batch);
  }
  Status Append(int32_t layer, SeqId seq, const float* k, const float* v) override {
    std::vector<float>& dst = keys_[size_t(layer)];
    const size_t row = size_t(shape().row());
    const size_t room = size_t(capacity_) * row - std::min(dst.size(), size_t(capacity_) * row);
    int32_t n_new = 0;
    for (const BatchSeq& b : batch_)
      if (b.seq == seq) n_new = b.n_new;
    dst.insert(dst.end(), k, k + std::min(room, size_t(n_new) * row));
    return inner_->Append(layer, seq, k, v);
  }
  Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override {
    return inner_->View(layer, seq, out);
  }
  Status EndBatch() override { return inner_->EndBatch(); }
  void AbortBatch() override { inner_->AbortBatch(); }
  KvCounters counters() const override { return inner_->counters(); }

  const std::vector<float>& keys(int32_t layer) const { return keys_[size_t(layer)]; }

 private:
  std::unique_ptr<MemoryKv> inner_;
  const int32_t capacity_;
  std::vector<BatchSeq> batch_;
  std::vector<std::vector<float>> keys_;
};

Status ReadText(const CalibrationOptions& o, std::string* text) {
  std::ifstream in(o.text_path, std::ios::binary);
  if (!in) return Status::FromErrno("calibration text " + o.text_path, errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  size_t end = size_t(double(all.size()) * o.text_fraction);
  // Cut at a line end so no UTF-8 character is split.
  while (end > 0 && end < all.size() && all[end - 1] != '\n') --end;
  *text = all.substr(0, end);
  return Status::OK();
}

}  // namespace

Status LowRankProjection(const std::vector<float>& keys, int32_t n, int32_t row, int32_t rank,
                         std::vector<float>* a) {
  if (n < row)
    return Status::InvalidArgument("calibration: " + std::to_string(n) +
                                   " keys are fewer than the key width " + std::to_string(row) +
                                   "; give more text or tokens");
  if (rank < 1 || rank > row)
    return Status::OutOfRange("calibration: rank " + std::to_string(rank) +
                              " is out of range [1, " + std::to_string(row) + "]");
  std::vector<double> m(size_t(n) * row);
  for (size_t i = 0; i < m.size(); ++i) m[i] = keys[i];
  const size_t w = size_t(row);
  std::vector<double> s(w), vt(w * w), superb(w);
  const lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'S', n, row, m.data(), row,
                                         s.data(), nullptr, 1, vt.data(), row, superb.data());
  if (info != 0)
    return Status::Internal("calibration: LAPACKE_dgesvd failed (info " + std::to_string(info) +
                            ")");
  // Rows of vt are the right singular vectors, by descending singular value.
  a->assign(size_t(row) * rank, 0.0f);
  for (int32_t i = 0; i < row; ++i)
    for (int32_t j = 0; j < rank; ++j) (*a)[size_t(i) * rank + j] = float(vt[size_t(j) * row + i]);
  return Status::OK();
}

Status Calibrate(const Model& model, const CalibrationOptions& o, Adapters* out,
                 const std::function<void(const std::string&)>& progress) {
  const HParams& hp = model.hparams();
  const int32_t row = hp.n_head_kv * hp.head_dim;
  if (o.ratios.empty()) return Status::InvalidArgument("calibrate: no ratios given");
  if (!(o.text_fraction > 0 && o.text_fraction <= 1))
    return Status::OutOfRange("calibrate: text fraction " + std::to_string(o.text_fraction) +
                              " is out of range (0, 1]");
  if (o.window < 1 || o.tokens < row)
    return Status::OutOfRange("calibrate: window " + std::to_string(o.window) + " and tokens " +
                              std::to_string(o.tokens) +
                              " must be >= 1 and >= " + std::to_string(row) + " (the key width)");
  std::vector<int32_t> ranks;
  for (int32_t r : o.ratios) {
    int32_t rank = 0;
    STRATA_RETURN_IF_ERROR(RankForRatio(row, r, &rank).WithContext("calibrate --ratios"));
    ranks.push_back(rank);
  }
  std::string text;
  STRATA_RETURN_IF_ERROR(ReadText(o, &text));
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(model.tokenizer().Encode(text, false, false, &ids));
  if (int64_t(ids.size()) < o.tokens)
    return Status::InvalidArgument("calibrate: the first " + std::to_string(o.text_fraction) +
                                   " of " + o.text_path + " holds " + std::to_string(ids.size()) +
                                   " tokens, fewer than the " + std::to_string(o.tokens) +
                                   " asked for");

  const int32_t window = std::min(o.window, hp.n_ctx_train > 0 ? hp.n_ctx_train : o.window);
  EngineOptions eo;
  eo.n_threads = o.threads;
  eo.n_ctx = window;
  std::unique_ptr<MemoryKv> mem;
  STRATA_RETURN_IF_ERROR(
      MemoryKv::Create({hp.n_layer, hp.n_head_kv, hp.head_dim, window}, 1, &mem));
  auto recorder = std::make_unique<KeyRecorder>(std::move(mem), o.tokens);
  KeyRecorder* rec = recorder.get();
  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, std::move(recorder), &engine));
  std::vector<float> logits;
  for (int32_t start = 0; start < o.tokens; start += window) {
    const int32_t n = std::min(window, o.tokens - start);
    SeqId seq;
    STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
    if (progress)
      progress("collecting keys of tokens " + std::to_string(start) + ".." +
               std::to_string(start + n));
    STRATA_RETURN_IF_ERROR(
        engine->Prefill(seq, std::span<const int32_t>(ids.data() + start, size_t(n)), &logits));
    STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
  }

  Adapters a;
  a.model_identity = model.identity();
  a.n_layer = hp.n_layer;
  a.n_head_kv = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.calibration_tokens = uint64_t(o.tokens);
  a.note = "post-RoPE keys of " + std::to_string(o.tokens) + " tokens (windows of " +
           std::to_string(window) + ") from the first " +
           std::to_string(int(std::lround(o.text_fraction * 100))) + "% of " + o.text_path;
  for (size_t i = 0; i < o.ratios.size(); ++i)
    a.sets.push_back(AdapterSet{o.ratios[i], ranks[i], {}});
  const int32_t max_rank = *std::max_element(ranks.begin(), ranks.end());
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    if (progress) progress("SVD of layer " + std::to_string(l) + " keys");
    std::vector<float> full;
    STRATA_RETURN_IF_ERROR(LowRankProjection(rec->keys(l), o.tokens, row, max_rank, &full));
    // The leading vectors of every smaller rank are a prefix of the largest one's.
    for (AdapterSet& set : a.sets) {
      std::vector<float> m(size_t(row) * set.rank);
      for (int32_t i = 0; i < row; ++i)
        for (int32_t j = 0; j < set.rank; ++j)
          m[size_t(i) * set.rank + j] = full[size_t(i) * max_rank + j];
      set.layers.push_back(std::move(m));
    }
  }
  *out = std::move(a);
  return Status::OK();
}

}  // namespace strata
