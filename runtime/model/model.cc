#include "runtime/model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "common/thread_pool.h"

namespace strata {

namespace {

// Reads the hyper-parameters every supported architecture shares from <arch>.* metadata.
class HParamReader {
 public:
  HParamReader(const GgufFile& g, std::string arch) : g_(g), arch_(std::move(arch)) {}

  std::string Key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }

  // Required positive integer within [1, limit].
  Status Int(std::string_view suffix, int32_t limit, int32_t* out) const {
    const std::string key = Key(suffix);
    const GgufValue* v = g_.Find(key);
    if (v != nullptr && v->type == GgufValueType::kArray) {
      return Status::NotSupported(g_.path() + ": metadata '" + key +
                                  "' is a per-layer array; only one value for all layers is "
                                  "supported");
    }
    uint32_t u = 0;
    STRATA_RETURN_IF_ERROR(g_.GetU32(key, &u));
    if (u < 1 || u > static_cast<uint32_t>(limit)) {
      return Status::Corruption(g_.path() + ": metadata '" + key + "' value " + std::to_string(u) +
                                " is outside 1.." + std::to_string(limit));
    }
    *out = static_cast<int32_t>(u);
    return Status::OK();
  }
  Status OptInt(std::string_view suffix, int32_t limit, int32_t* out) const {
    if (g_.Find(Key(suffix)) == nullptr) return Status::OK();
    return Int(suffix, limit, out);
  }
  // Optional float, finite and within (lo, hi].
  Status OptFloat(std::string_view suffix, float lo, float hi, float* out) const {
    const std::string key = Key(suffix);
    if (g_.Find(key) == nullptr) return Status::OK();
    float f = 0;
    STRATA_RETURN_IF_ERROR(g_.GetF32(key, &f));
    if (!std::isfinite(f) || !(f > lo) || f > hi) {
      return Status::Corruption(g_.path() + ": metadata '" + key + "' value " + std::to_string(f) +
                                " is outside (" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "]");
    }
    *out = f;
    return Status::OK();
  }

 private:
  const GgufFile& g_;
  std::string arch_;
};

// Sanity limits: far above any model this runtime targets, low enough that products of
// them (KV bytes per token, weight shapes) cannot overflow int64.
constexpr int32_t kMaxLayers = 1024;
constexpr int32_t kMaxEmbd = 1 << 17;
constexpr int32_t kMaxHeads = 1024;
constexpr int32_t kMaxHeadDim = 1024;
constexpr int32_t kMaxFf = 1 << 20;
constexpr int32_t kMaxCtx = 1 << 24;

Status ReadHParams(const GgufFile& g, HParams* hp) {
  STRATA_RETURN_IF_ERROR(g.GetString("general.architecture", &hp->arch_name));
  if (hp->arch_name == "llama") {
    hp->arch = Arch::kLlama;
    hp->rope_layout = kernels::RopeLayout::kNormal;
  } else if (hp->arch_name == "qwen2") {
    hp->arch = Arch::kQwen2;
    hp->rope_layout = kernels::RopeLayout::kNeox;
    hp->has_qkv_bias = true;
  } else if (hp->arch_name == "qwen3") {
    hp->arch = Arch::kQwen3;
    hp->rope_layout = kernels::RopeLayout::kNeox;
    hp->has_qk_norm = true;
  } else {
    return Status::NotSupported(g.path() + ": architecture '" + hp->arch_name +
                                "' is not supported (llama, qwen2, qwen3 are)");
  }
  if (g.Find("general.name") != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetString("general.name", &hp->name));
  }
  HParamReader r(g, hp->arch_name);
  STRATA_RETURN_IF_ERROR(r.Int("context_length", kMaxCtx, &hp->n_ctx_train));
  STRATA_RETURN_IF_ERROR(r.Int("embedding_length", kMaxEmbd, &hp->n_embd));
  STRATA_RETURN_IF_ERROR(r.Int("block_count", kMaxLayers, &hp->n_layer));
  STRATA_RETURN_IF_ERROR(r.Int("feed_forward_length", kMaxFf, &hp->n_ff));
  STRATA_RETURN_IF_ERROR(r.Int("attention.head_count", kMaxHeads, &hp->n_head));
  hp->n_head_kv = hp->n_head;
  STRATA_RETURN_IF_ERROR(r.OptInt("attention.head_count_kv", kMaxHeads, &hp->n_head_kv));
  if (hp->n_head % hp->n_head_kv != 0) {
    return Status::Corruption(g.path() + ": attention.head_count " + std::to_string(hp->n_head) +
                              " is not a multiple of attention.head_count_kv " +
                              std::to_string(hp->n_head_kv));
  }
  hp->head_dim = hp->n_embd / hp->n_head;
  if (g.Find(r.Key("attention.key_length")) == nullptr && hp->n_embd % hp->n_head != 0) {
    return Status::Corruption(g.path() + ": embedding_length " + std::to_string(hp->n_embd) +
                              " is not a multiple of attention.head_count " +
                              std::to_string(hp->n_head) + " and attention.key_length is absent");
  }
  STRATA_RETURN_IF_ERROR(r.OptInt("attention.key_length", kMaxHeadDim, &hp->head_dim));
  int32_t value_length = hp->head_dim;
  STRATA_RETURN_IF_ERROR(r.OptInt("attention.value_length", kMaxHeadDim, &value_length));
  if (value_length != hp->head_dim) {
    return Status::NotSupported(g.path() + ": attention.value_length " +
                                std::to_string(value_length) + " differs from key_length " +
                                std::to_string(hp->head_dim));
  }
  // Llama-family converters always write the epsilon; a default would hide a broken file.
  float eps = 0;
  STRATA_RETURN_IF_ERROR(g.GetF32(r.Key("attention.layer_norm_rms_epsilon"), &eps));
  if (!std::isfinite(eps) || !(eps > 0) || eps > 1) {
    return Status::Corruption(g.path() + ": " + r.Key("attention.layer_norm_rms_epsilon") +
                              " value " + std::to_string(eps) + " is outside (0, 1]");
  }
  hp->rms_eps = eps;
  STRATA_RETURN_IF_ERROR(r.OptFloat("rope.freq_base", 0.f, 1e12f, &hp->rope_base));
  hp->rope_dim = hp->head_dim;
  STRATA_RETURN_IF_ERROR(r.OptInt("rope.dimension_count", hp->head_dim, &hp->rope_dim));
  if (hp->rope_dim % 2 != 0) {
    return Status::Corruption(g.path() + ": " + r.Key("rope.dimension_count") + " value " +
                              std::to_string(hp->rope_dim) + " is odd");
  }
  std::string scaling = "none";
  if (g.Find(r.Key("rope.scaling.type")) != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetString(r.Key("rope.scaling.type"), &scaling));
  }
  float factor = 1.f;
  if (scaling == "linear") {
    STRATA_RETURN_IF_ERROR(r.OptFloat("rope.scaling.factor", 0.f, 1e6f, &factor));
  } else if (scaling == "yarn") {
    STRATA_RETURN_IF_ERROR(r.OptFloat("rope.scaling.factor", 0.f, 1e6f, &factor));
    hp->rope_yarn = true;
    hp->rope_orig_ctx = hp->n_ctx_train;
    STRATA_RETURN_IF_ERROR(
        r.OptInt("rope.scaling.original_context_length", kMaxCtx, &hp->rope_orig_ctx));
    STRATA_RETURN_IF_ERROR(
        r.OptFloat("rope.scaling.yarn_beta_fast", 0.f, 1e6f, &hp->rope_yarn_beta_fast));
    STRATA_RETURN_IF_ERROR(
        r.OptFloat("rope.scaling.yarn_beta_slow", 0.f, 1e6f, &hp->rope_yarn_beta_slow));
    float attn = 1.f;
    STRATA_RETURN_IF_ERROR(r.OptFloat("rope.scaling.attn_factor", 0.f, 1e3f, &attn));
    // Models whose converters store a log multiplier (DeepSeek's mscale) scale attention by
    // another rule, which this engine does not implement: refused rather than misread.
    if (g.Find(r.Key("rope.scaling.yarn_log_multiplier")) != nullptr)
      return Status::NotSupported(g.path() + ": " + r.Key("rope.scaling.yarn_log_multiplier") +
                                  " (YaRN with a log multiplier) is not supported");
    hp->rope_attn_factor = attn * (factor > 1.f ? 1.f + 0.1f * std::log(factor) : 1.f);
  } else if (scaling == "none") {
    // Older files state linear scaling as rope.scale_linear.
    STRATA_RETURN_IF_ERROR(r.OptFloat("rope.scale_linear", 0.f, 1e6f, &factor));
  } else {
    return Status::NotSupported(g.path() + ": " + r.Key("rope.scaling.type") + " '" + scaling +
                                "' is not supported (none, linear, yarn)");
  }
  hp->rope_freq_scale = 1.f / factor;
  return Status::OK();
}

Status TensorError(const GgufFile& g, const GgufTensor& t, const std::string& problem) {
  return Status::Corruption(g.path() + ": tensor '" + t.name + "': " + problem);
}

// "F32, F16, Q4_0, ...": the weight types the kernels accept, in GGML id order.
std::string SupportedWeightTypes() {
  std::string s;
  for (const kernels::TypeInfo& t : kernels::KnownTypes()) {
    if (t.weight_supported) s += (s.empty() ? "" : ", ") + std::string(t.name);
  }
  return s;
}

std::string ShapeString(const GgufTensor& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

std::string ShapeString(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t d = 0; d < ne.size(); ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
  return s + "]";
}

enum class Need { kRequired, kOptional };
enum class Kind { kWeight, kNorm };  // matmul/embedding weight, or an F32 vector

// Binds one tensor after checking its presence, shape and type; records the name in *used.
class Binder {
 public:
  explicit Binder(const GgufFile& g) : g_(g) {}
  std::unordered_set<std::string>& used() { return used_; }

  Status Bind(const std::string& name, std::vector<int64_t> shape, Kind kind, Need need,
              TensorRef* out) {
    const GgufTensor* t = g_.FindTensor(name);
    if (t == nullptr) {
      if (need == Need::kOptional) return Status::OK();
      return Status::NotFound(g_.path() + ": tensor '" + name + "' is missing (expected shape " +
                              ShapeString(shape) + ")");
    }
    used_.insert(name);
    // Trailing dims of 1 are equivalent to a lower rank.
    bool same = true;
    for (int d = 0; d < 4; ++d) {
      const int64_t want = d < static_cast<int>(shape.size()) ? shape[d] : 1;
      if (t->ne[d] != want) same = false;
    }
    if (!same) {
      return TensorError(
          g_, *t,
          "shape " + ShapeString(*t) + " does not match the expected " + ShapeString(shape));
    }
    if (kind == Kind::kNorm && t->type != kernels::DType::kF32) {
      return Status::NotSupported(g_.path() + ": tensor '" + name + "' has type " +
                                  kernels::TypeName(t->type) + " (F32 expected)");
    }
    out->type = t->type;
    out->data = t->data;
    out->cols = t->ne[0];
    out->rows = t->ne[1] * t->ne[2] * t->ne[3];
    out->row_bytes = kernels::RowBytes(t->type, t->ne[0]);
    return Status::OK();
  }

  // Weights go through Matmul or, for the embedding, DequantizeRow: both take exactly the
  // weight_supported types. A type the GGUF reader knows but Strata has no kernels for
  // (IQ2_XXS, TQ1_0, ...) is refused here, by name, with the list of what would work.
  Status RequireWeightType(const std::string& name, const TensorRef& ref) {
    if (!ref.present()) return Status::OK();
    if (!kernels::GetTypeInfo(ref.type).weight_supported) {
      return Status::NotSupported(
          g_.path() + ": tensor '" + name + "' has type " + kernels::TypeName(ref.type) +
          ", which Strata has no kernels for (supported weight types: " + SupportedWeightTypes() +
          ")");
    }
    return Status::OK();
  }

 private:
  const GgufFile& g_;
  std::unordered_set<std::string> used_;
};

Status BindWeights(const GgufFile& g, HParams* hp, ModelWeights* w) {
  Binder b(g);
  const int64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
  const int64_t Q = int64_t(hp->n_head) * hp->head_dim, KV = int64_t(hp->n_head_kv) * hp->head_dim;
  STRATA_RETURN_IF_ERROR(
      b.Bind("token_embd.weight", {E, V}, Kind::kWeight, Need::kRequired, &w->tok_embd));
  STRATA_RETURN_IF_ERROR(
      b.Bind("output_norm.weight", {E}, Kind::kNorm, Need::kRequired, &w->output_norm));
  STRATA_RETURN_IF_ERROR(
      b.Bind("output.weight", {E, V}, Kind::kWeight, Need::kOptional, &w->output));
  hp->tied_output = !w->output.present();
  if (hp->tied_output) w->output = w->tok_embd;
  STRATA_RETURN_IF_ERROR(b.RequireWeightType("token_embd.weight", w->tok_embd));
  if (!hp->tied_output) STRATA_RETURN_IF_ERROR(b.RequireWeightType("output.weight", w->output));
  STRATA_RETURN_IF_ERROR(b.Bind("rope_freqs.weight", {hp->rope_dim / 2}, Kind::kNorm,
                                Need::kOptional, &w->rope_freqs));

  w->layers.resize(hp->n_layer);
  for (int32_t i = 0; i < hp->n_layer; ++i) {
    LayerWeights& l = w->layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    const Need bias = hp->has_qkv_bias ? Need::kRequired : Need::kOptional;
    const Need qk_norm = hp->has_qk_norm ? Need::kRequired : Need::kOptional;
    struct Item {
      const char* name;
      std::vector<int64_t> shape;
      Kind kind;
      Need need;
      TensorRef* ref;
    };
    const Item items[] = {
        {"attn_norm.weight", {E}, Kind::kNorm, Need::kRequired, &l.attn_norm},
        {"attn_q.weight", {E, Q}, Kind::kWeight, Need::kRequired, &l.wq},
        {"attn_k.weight", {E, KV}, Kind::kWeight, Need::kRequired, &l.wk},
        {"attn_v.weight", {E, KV}, Kind::kWeight, Need::kRequired, &l.wv},
        {"attn_output.weight", {Q, E}, Kind::kWeight, Need::kRequired, &l.wo},
        {"attn_q.bias", {Q}, Kind::kNorm, bias, &l.bq},
        {"attn_k.bias", {KV}, Kind::kNorm, bias, &l.bk},
        {"attn_v.bias", {KV}, Kind::kNorm, bias, &l.bv},
        {"attn_q_norm.weight", {hp->head_dim}, Kind::kNorm, qk_norm, &l.q_norm},
        {"attn_k_norm.weight", {hp->head_dim}, Kind::kNorm, qk_norm, &l.k_norm},
        {"ffn_norm.weight", {E}, Kind::kNorm, Need::kRequired, &l.ffn_norm},
        {"ffn_gate.weight", {E, F}, Kind::kWeight, Need::kRequired, &l.w_gate},
        {"ffn_up.weight", {E, F}, Kind::kWeight, Need::kRequired, &l.w_up},
        {"ffn_down.weight", {F, E}, Kind::kWeight, Need::kRequired, &l.w_down},
    };
    for (const Item& it : items) {
      STRATA_RETURN_IF_ERROR(b.Bind(p + it.name, it.shape, it.kind, it.need, it.ref));
      if (it.kind == Kind::kWeight)
        STRATA_RETURN_IF_ERROR(b.RequireWeightType(p + it.name, *it.ref));
    }
    // Biases on Q, K, V come as a set; one or two alone mean a broken file.
    const int n_bias = l.bq.present() + l.bk.present() + l.bv.present();
    if (n_bias != 0 && n_bias != 3) {
      return Status::Corruption(g.path() + ": layer " + std::to_string(i) +
                                " has only some of attn_q/k/v.bias");
    }
    if (l.q_norm.present() != l.k_norm.present()) {
      return Status::Corruption(g.path() + ": layer " + std::to_string(i) +
                                " has only one of attn_q_norm/attn_k_norm");
    }
    if (n_bias == 3) hp->has_qkv_bias = true;
    if (l.q_norm.present()) hp->has_qk_norm = true;
  }
  // A tensor we do not bind is a feature the forward pass would silently ignore.
  for (const GgufTensor& t : g.tensors()) {
    if (!b.used().count(t.name)) {
      return Status::NotSupported(g.path() + ": tensor '" + t.name + "' is not part of the " +
                                  hp->arch_name + " layout this runtime implements");
    }
  }
  return Status::OK();
}

// FNV-1a, 64-bit (public-domain constants from the FNV reference).
class Fnv64 {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ull;
  }
  template <typename T>
  void Value(T v) {
    Bytes(&v, sizeof v);
  }
  void Str(std::string_view s) {
    Value<uint64_t>(s.size());
    Bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// The identity covers what makes two files interchangeable for side files (adapters,
// reuse tables): architecture, hyper-parameters, and the tensor table (names, types,
// shapes in file order) plus 3 x 64 bytes of each tensor (start, middle, end), so a
// re-quantized or fine-tuned file differs while reading stays cheap (a few pages per
// tensor). The file path, metadata strings and the tokenizer are not part of it.
uint64_t ComputeIdentity(const GgufFile& g, const HParams& hp) {
  Fnv64 h;
  h.Str("strata-model-identity-v1");
  h.Str(hp.arch_name);
  for (int32_t v : {hp.n_vocab, hp.n_ctx_train, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv,
                    hp.head_dim, hp.n_ff, hp.rope_dim}) {
    h.Value<int32_t>(v);
  }
  h.Value<float>(hp.rms_eps);
  h.Value<float>(hp.rope_base);
  h.Value<float>(hp.rope_freq_scale);
  if (hp.rope_yarn) {  // files without YaRN keep the identity they had
    h.Value<int32_t>(hp.rope_orig_ctx);
    h.Value<float>(hp.rope_yarn_beta_fast);
    h.Value<float>(hp.rope_yarn_beta_slow);
    h.Value<float>(hp.rope_attn_factor);
  }
  constexpr uint64_t kSample = 64;
  for (const GgufTensor& t : g.tensors()) {
    h.Str(t.name);
    h.Value<uint32_t>(static_cast<uint32_t>(t.type));
    for (int64_t d : t.ne) h.Value<int64_t>(d);
    const auto* p = static_cast<const uint8_t*>(t.data);
    const uint64_t n = std::min(kSample, t.nbytes);
    h.Bytes(p, n);
    h.Bytes(p + (t.nbytes - n) / 2, n);
    h.Bytes(p + t.nbytes - n, n);
  }
  return h.value();
}

}  // namespace

Model::~Model() {
  if (repacked_ != nullptr) munmap(repacked_, repacked_bytes_.load());
}

Status Model::Load(const std::string& path, std::unique_ptr<Model>* out) {
  std::unique_ptr<GgufFile> gguf;
  STRATA_RETURN_IF_ERROR(GgufFile::Open(path, &gguf));
  return FromGguf(std::move(gguf), out);
}

Status Model::FromGguf(std::unique_ptr<GgufFile> gguf, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> m(new Model());
  m->path_ = gguf->path();
  m->gguf_ = std::move(gguf);
  const GgufFile& g = *m->gguf_;
  const std::string& path = m->path_;
  STRATA_RETURN_IF_ERROR(ReadHParams(g, &m->hparams_));
  STRATA_RETURN_IF_ERROR(Tokenizer::FromGguf(g, &m->tokenizer_));
  HParams& hp = m->hparams_;
  hp.n_vocab = m->tokenizer_->n_vocab();
  uint32_t declared_vocab = 0;
  if (g.Find(hp.arch_name + ".vocab_size") != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetU32(hp.arch_name + ".vocab_size", &declared_vocab));
    if (declared_vocab != static_cast<uint32_t>(hp.n_vocab)) {
      return Status::Corruption(path + ": " + hp.arch_name + ".vocab_size " +
                                std::to_string(declared_vocab) + " differs from the " +
                                std::to_string(hp.n_vocab) + " tokens in tokenizer.ggml.tokens");
    }
  }
  STRATA_RETURN_IF_ERROR(BindWeights(g, &hp, &m->weights_));
  for (const GgufTensor& t : g.tensors()) m->weight_bytes_ += t.nbytes;
  if (g.Find("tokenizer.chat_template") != nullptr) {
    std::string tmpl;
    STRATA_RETURN_IF_ERROR(g.GetString("tokenizer.chat_template", &tmpl));
    m->chat_template_ = DetectChatTemplate(tmpl);
    m->default_system_prompt_ = DefaultSystemPrompt(tmpl);
  }
  m->identity_ = ComputeIdentity(g, hp);
  *out = std::move(m);
  return Status::OK();
}

std::string Model::identity_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, identity_);
  return buf;
}

const ModelWeights& Model::cpu_weights() const {
  const ModelWeights* w = cpu_view_.load(std::memory_order_acquire);
  return w != nullptr ? *w : weights_;
}

Status Model::PrepareCpuWeights(ThreadPool* pool) const {
  std::lock_guard<std::mutex> lock(repack_mu_);
  if (cpu_view_.load(std::memory_order_acquire) != nullptr) return Status::OK();
  auto w = std::make_unique<ModelWeights>(weights_);
  // The matrices the forward pass multiplies. A tied output head is also the token
  // embedding: repacked once, its rows are looked up through kernels::Rows16Row.
  std::vector<TensorRef*> mats;
  for (LayerWeights& L : w->layers)
    for (TensorRef* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      mats.push_back(t);
  const bool tied = w->output.data == w->tok_embd.data;
  mats.push_back(&w->output);
  std::erase_if(mats, [](const TensorRef* t) { return !kernels::Rows16Preferred(t->type); });
  // Each copy starts on a page of its own, so the kernels' 64-byte vector loads are aligned.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t total = 0;
  for (const TensorRef* t : mats)
    total += (kernels::Rows16Bytes(t->type, t->rows, t->cols) + page - 1) / page * page;
  if (total > 0) {
    void* arena = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED)
      return Status::FromErrno(
          path_ + ": reserving " + std::to_string(total >> 20) + " MiB for the repacked weights",
          errno);
    // Decode streams these bytes once per token: huge pages spare it most TLB misses.
    (void)madvise(arena, total, MADV_HUGEPAGE);
    size_t at = 0;
    std::vector<std::pair<const void*, size_t>> sources;  // the file's bytes, copied
    for (TensorRef* t : mats) {
      uint8_t* dst = static_cast<uint8_t*>(arena) + at;
      const size_t bytes = kernels::Rows16Bytes(t->type, t->rows, t->cols);
      at += (bytes + page - 1) / page * page;
      const int64_t tiles = (t->rows + kernels::kRows16Tile - 1) / kernels::kRows16Tile;
      constexpr int64_t kTilesPerTask = 64;
      const int64_t tasks = (tiles + kTilesPerTask - 1) / kTilesPerTask;
      // Each task drops the file pages it has copied, so a large matrix (a tied head) is
      // never resident twice.
      auto task = [&](int64_t i, int) {
        const int64_t end = std::min(tiles, (i + 1) * kTilesPerTask);
        kernels::RepackRows16(t->type, t->data, t->row_bytes, t->rows, t->cols, dst,
                              i * kTilesPerTask, end);
        const int64_t r0 = i * kTilesPerTask * kernels::kRows16Tile;
        const int64_t r1 = std::min(t->rows, end * kernels::kRows16Tile);
        gguf_->ReleasePages(static_cast<const uint8_t*>(t->data) + size_t(r0) * t->row_bytes,
                            size_t(r1 - r0) * t->row_bytes);
      };
      if (pool != nullptr) {
        pool->Run(tasks, task);
      } else {
        for (int64_t i = 0; i < tasks; ++i) task(i, 0);
      }
      sources.push_back({t->data, t->row_bytes * size_t(t->rows)});
      t->data = dst;
      t->layout = kernels::WeightLayout::kRows16;
    }
    // The small F32 vectors (norms, biases) are copied too: a decode step reading them from
    // the file would fault back in the whole large folio around each (2 MiB of the
    // neighbouring matrices' file pages, a tenth of a 1.5B Q4_K_M file in all).
    std::vector<TensorRef*> vecs{&w->output_norm, &w->rope_freqs};
    for (LayerWeights& L : w->layers)
      for (TensorRef* t : {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.ffn_norm})
        vecs.push_back(t);
    std::erase_if(vecs, [](const TensorRef* t) { return !t->present(); });
    size_t floats = 0;
    for (const TensorRef* t : vecs) floats += (t->row_bytes * size_t(t->rows) + 63) / 64 * 16;
    cpu_vectors_.assign(floats, 0.f);
    float* next = cpu_vectors_.data();
    for (TensorRef* t : vecs) {
      const size_t n = t->row_bytes * size_t(t->rows);
      std::memcpy(next, t->data, n);
      sources.push_back({t->data, n});
      t->data = next;
      next += (n + 63) / 64 * 16;
    }
    // Once more over every source, whole: faults while copying mapped neighbours back.
    for (auto [p, n] : sources) gguf_->ReleasePages(p, n);
    if (tied) w->tok_embd = w->output;
    repacked_ = arena;
    repacked_bytes_.store(total, std::memory_order_release);
  }
  cpu_weights_ = std::move(w);
  cpu_view_.store(cpu_weights_.get(), std::memory_order_release);
  return Status::OK();
}

}  // namespace strata
