#include "runtime/engine/engine.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "runtime/engine/forward_cuda.h"
#include "runtime/engine/text_stream.h"
#include "runtime/kv/device_view_kv.h"
#include "runtime/kv/memory_kv.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

ForwardTimes Minus(const ForwardTimes& a, const ForwardTimes& b) {
  return {a.matmul - b.matmul, a.attention - b.attention, a.kv - b.kv, a.other - b.other};
}

}  // namespace

int64_t PeakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t CurrentRssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long pages = 0, resident = 0;
  const bool ok = std::fscanf(f, "%lld %lld", &pages, &resident) == 2;
  std::fclose(f);
  return ok ? int64_t(resident) * int64_t(sysconf(_SC_PAGESIZE)) : 0;
}

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kNone:
      return "none";
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kEndOfGeneration:
      return "eos";
    case StopReason::kStopString:
      return "stop_string";
    case StopReason::kCallback:
      return "callback";
    case StopReason::kContextFull:
      return "context_full";
  }
  return "?";
}

Status ValidateEngineOptions(const EngineOptions& o, const HParams& hp) {
  if (o.n_threads < 0 || o.n_threads > 1024)
    return Status::InvalidArgument("threads: " + std::to_string(o.n_threads) +
                                   " is out of range [0, 1024] (0 = all cores)");
  if (o.n_ctx < 0 || o.n_ctx > (1 << 24))
    return Status::InvalidArgument("context: " + std::to_string(o.n_ctx) +
                                   " is out of range [0, 16777216] (0 = the model's " +
                                   std::to_string(hp.n_ctx_train) + ")");
  if (o.n_batch < 1 || o.n_batch > 8192)
    return Status::InvalidArgument("batch: " + std::to_string(o.n_batch) +
                                   " is out of range [1, 8192]");
  if (o.max_sequences < 1 || o.max_sequences > 4096)
    return Status::InvalidArgument("max_sequences: " + std::to_string(o.max_sequences) +
                                   " is out of range [1, 4096]");
  return Status::OK();
}

Engine::Engine(const Model& model, const EngineOptions& options)
    : model_(model), options_(options) {}
Engine::~Engine() = default;

Status Engine::Create(const Model& model, const EngineOptions& options,
                      std::unique_ptr<Engine>* out) {
  return Create(model, options, nullptr, out);
}

Status Engine::Create(const Model& model, const EngineOptions& options,
                      std::unique_ptr<KvPolicy> kv, std::unique_ptr<Engine>* out) {
  STRATA_RETURN_IF_ERROR(ValidateEngineOptions(options, model.hparams()));
  std::unique_ptr<Engine> e(new Engine(model, options));
  EngineOptions& o = e->options_;
  if (o.n_threads == 0) o.n_threads = int32_t(std::max(1u, std::thread::hardware_concurrency()));
  if (o.n_ctx == 0) o.n_ctx = model.hparams().n_ctx_train > 0 ? model.hparams().n_ctx_train : 4096;
  e->pool_ = std::make_unique<ThreadPool>(o.n_threads);
  if (!o.cuda && o.cuda_device >= 0)
    STRATA_RETURN_IF_ERROR(CudaDevice::Open(o.cuda_device, &o.cuda));
  // Before the KV policy: the disk policy's predictor multiplies with the same weights.
  if (!o.cuda && o.repack_weights) STRATA_RETURN_IF_ERROR(model.PrepareCpuWeights(e->pool_.get()));
  if (kv) {
    const HParams& hp = model.hparams();
    const KvShape& sh = kv->shape();
    if (sh.n_layer != hp.n_layer || sh.n_head_kv != hp.n_head_kv || sh.head_dim != hp.head_dim)
      return Status::InvalidArgument(
          std::string("KV policy '") + kv->name() + "' is shaped for " +
          std::to_string(sh.n_layer) + " layers x " + std::to_string(sh.n_head_kv) +
          " KV heads x " + std::to_string(sh.head_dim) + " dims, the model has " +
          std::to_string(hp.n_layer) + " x " + std::to_string(hp.n_head_kv) + " x " +
          std::to_string(hp.head_dim));
    o.n_ctx = sh.n_ctx;
    e->kv_ = std::move(kv);
  } else if (o.cuda && o.kv.policy != KvPolicyKind::kMemory) {
    // A host policy (the disk policy: block store, reuse slots, selection on the host) seen
    // by the GPU through DeviceViewKv.
    std::unique_ptr<KvPolicy> host;
    STRATA_RETURN_IF_ERROR(
        CreateKvPolicy(model, o.kv, o.n_ctx, o.max_sequences, e->pool_.get(), &host));
    std::unique_ptr<DeviceViewKv> dv;
    STRATA_RETURN_IF_ERROR(DeviceViewKv::Create(std::move(host), o.cuda, &dv));
    e->kv_ = std::move(dv);
  } else if (o.cuda) {
    // On a GPU the memory policy keeps every sequence's KV in the device's memory.
    const HParams& hp = model.hparams();
    std::unique_ptr<MemoryKv> mkv;
    STRATA_RETURN_IF_ERROR(MemoryKv::Create({hp.n_layer, hp.n_head_kv, hp.head_dim, o.n_ctx},
                                            o.max_sequences, &mkv, o.cuda->memory()));
    e->kv_ = std::move(mkv);
  } else {
    STRATA_RETURN_IF_ERROR(
        CreateKvPolicy(model, o.kv, o.n_ctx, o.max_sequences, e->pool_.get(), &e->kv_));
  }
  // A policy may take fewer new tokens a pass than the batch (the disk policy's staging must
  // fit its budget): prefill is chunked by the smaller.
  o.n_batch = std::max(1, std::min(o.n_batch, e->kv_->max_pass_tokens()));
  // A pass never needs more rows than the batch limit or the context.
  const int64_t most_rows = std::min<int64_t>(o.n_batch, int64_t(o.n_ctx) * o.max_sequences);
  if (o.cuda) {
    STRATA_RETURN_IF_ERROR(
        CreateCudaForward(model, e->kv_.get(), o.cuda, int32_t(most_rows), o.gpu, &e->forward_));
  } else {
    if (e->kv_->device_memory())
      return Status::InvalidArgument(std::string("KV policy '") + e->kv_->name() +
                                     "' keeps KV in GPU memory; run the engine on that GPU");
    e->forward_ = std::make_unique<Forward>(model, e->kv_.get(), e->pool_.get(), int32_t(most_rows),
                                            o.pass_invariant);
  }
  *out = std::move(e);
  return Status::OK();
}

Status Engine::Evaluate(const ForwardBatch& batch, std::vector<float>* logits) {
  return forward_->Run(batch, logits);
}

Status Engine::Prefill(SeqId seq, std::span<const int32_t> tokens, std::vector<float>* logits,
                       bool all_logits) {
  const int32_t n_vocab = model_.hparams().n_vocab;
  const int32_t len = kv_->Length(seq);
  if (int64_t(len) + int64_t(tokens.size()) > options_.n_ctx)
    return Status::OutOfRange("prompt of " + std::to_string(tokens.size()) + " tokens after " +
                              std::to_string(len) + " already in the sequence exceeds the " +
                              "context length " + std::to_string(options_.n_ctx));
  ForwardBatch batch;
  std::vector<float> chunk_logits;
  logits->clear();
  const size_t step = size_t(forward_->max_tokens());
  for (size_t i = 0; i < tokens.size(); i += step) {
    const size_t n = std::min(step, tokens.size() - i);
    batch.Clear();
    batch.Add(seq, len + int32_t(i), tokens.subspan(i, n), all_logits);
    STRATA_RETURN_IF_ERROR(forward_->Run(batch, &chunk_logits));
    if (all_logits) {
      logits->insert(logits->end(), chunk_logits.begin(), chunk_logits.end());
    } else if (i + n == tokens.size()) {
      logits->assign(chunk_logits.end() - n_vocab, chunk_logits.end());
    }
  }
  return Status::OK();
}

Status Engine::Generate(std::span<GenerationRequest> requests, GenerationStats* stats) {
  const Tokenizer& tok = model_.tokenizer();
  const int32_t n_vocab = model_.hparams().n_vocab;
  const ForwardTimes times0 = forward_->times();
  GenerationStats st;
  struct Live {
    GenerationRequest* req;
    Sampler sampler;
    TextStream text;
    std::vector<int32_t> history;  // prompt + generated, for the repetition penalty
    int32_t next = -1;             // sampled, not yet evaluated
    bool done = false;
  };
  std::vector<Live> live;
  live.reserve(requests.size());
  for (GenerationRequest& r : requests) {
    STRATA_RETURN_IF_ERROR(ValidateSamplingParams(r.params.sampling));
    if (r.params.max_tokens < 0)
      return Status::InvalidArgument("max_tokens: " + std::to_string(r.params.max_tokens) +
                                     " is negative (0 = until the context is full)");
    if (r.prompt.empty()) return Status::InvalidArgument("generate: the prompt has no tokens");
    r.tokens.clear();
    r.text.clear();
    r.stop_reason = StopReason::kNone;
    live.push_back({&r, Sampler(r.params.sampling, n_vocab), TextStream(r.params.stop), {}});
  }

  // Emits a sampled token: returns true when the request is finished.
  auto accept = [&](Live& lv, int32_t id) {
    GenerationRequest& r = *lv.req;
    if (!r.params.ignore_eos && tok.IsEndOfGeneration(id)) {
      r.stop_reason = StopReason::kEndOfGeneration;
      return true;
    }
    r.tokens.push_back(id);
    lv.history.push_back(id);
    ++st.generated_tokens;
    std::string piece;
    const bool hit = lv.text.Push(tok.TokenBytes(id), &piece);
    r.text += piece;
    if (r.on_token && !r.on_token(id, piece)) {
      r.stop_reason = StopReason::kCallback;
      return true;
    }
    if (hit) {
      r.stop_reason = StopReason::kStopString;
      return true;
    }
    if (r.params.max_tokens > 0 && int32_t(r.tokens.size()) >= r.params.max_tokens) {
      r.stop_reason = StopReason::kMaxTokens;
      return true;
    }
    if (kv_->Length(r.seq) + 1 > options_.n_ctx) {
      r.stop_reason = StopReason::kContextFull;
      return true;
    }
    return false;
  };
  auto finish = [&](Live& lv) {
    lv.done = true;
    std::string rest = lv.text.Flush();
    if (lv.req->stop_reason != StopReason::kStopString && !rest.empty()) {
      lv.req->text += rest;
      if (lv.req->on_token) lv.req->on_token(-1, rest);
    }
  };

  // Prefill each prompt, then sample its first token.
  std::vector<float> logits;
  for (Live& lv : live) {
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(Prefill(lv.req->seq, lv.req->prompt, &logits));
    st.prefill_seconds += Seconds(t0, Clock::now());
    st.prompt_tokens += int64_t(lv.req->prompt.size());
    lv.history = lv.req->prompt;
    const auto t1 = Clock::now();
    lv.next = lv.sampler.Sample(logits.data(), lv.history);
    st.sample_seconds += Seconds(t1, Clock::now());
    if (accept(lv, lv.next)) finish(lv);
  }

  // Decode: one token per live sequence per pass.
  ForwardBatch batch;
  for (;;) {
    batch.Clear();
    std::vector<Live*> order;
    for (Live& lv : live) {
      if (lv.done) continue;
      batch.Add(lv.req->seq, kv_->Length(lv.req->seq), std::span<const int32_t>(&lv.next, 1));
      order.push_back(&lv);
    }
    if (order.empty()) break;
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(forward_->Run(batch, &logits));
    const auto t1 = Clock::now();
    st.decode_seconds += Seconds(t0, t1);
    st.decode_tokens += int64_t(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      Live& lv = *order[i];
      lv.next = lv.sampler.Sample(logits.data() + i * size_t(n_vocab), lv.history);
      if (accept(lv, lv.next)) finish(lv);
    }
    st.sample_seconds += Seconds(t1, Clock::now());
  }

  st.forward = Minus(forward_->times(), times0);
  st.kv = kv_->counters();
  st.peak_rss_bytes = PeakRssBytes();
  if (stats) *stats = st;
  return Status::OK();
}

}  // namespace strata
