// The C API: a thin translation of strata.h onto the C++ classes. It converts types and
// errors and decides nothing of its own. No C++ exception may cross into C: every entry
// point that allocates catches std::bad_alloc and reports it as a status.
#include "strata/strata.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "runtime/api/c_api_internal.h"
#include "runtime/config/config.h"

namespace {

thread_local std::string g_last_error;

strata_status ToC(const strata::Status& s) {
  if (s.ok()) return STRATA_OK;
  g_last_error = s.message();
  return static_cast<strata_status>(static_cast<int>(s.code()));
}

strata_status Fail(strata_status code, std::string msg) {
  g_last_error = std::move(msg);
  return code;
}

// Runs `fn` and turns an escaping allocation failure into a status.
template <class Fn>
strata_status Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(STRATA_ERR_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Fail(STRATA_ERR_INTERNAL, std::string("unexpected exception: ") + e.what());
  }
}

void CopyString(char* dst, size_t cap, const std::string& src) {
  size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

char* DupString(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) {
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
  }
  return p;
}

strata::GenerateParams ToGenerateParams(const strata_generate_params& p) {
  strata::GenerateParams g;
  g.max_tokens = p.max_tokens;
  g.sampling.temperature = p.temperature;
  g.sampling.top_k = p.top_k;
  g.sampling.top_p = p.top_p;
  g.sampling.min_p = p.min_p;
  g.sampling.repeat_penalty = p.repeat_penalty;
  g.sampling.repeat_last_n = p.repeat_last_n;
  g.sampling.seed = p.seed;
  for (size_t i = 0; i < p.n_stop; ++i) g.stop.emplace_back(p.stop[i]);  // checked on entry
  g.ignore_eos = p.ignore_eos != 0;
  return g;
}

strata::TokenCallback ToCallback(strata_token_callback cb, void* user) {
  if (!cb) return nullptr;
  return [cb, user](int32_t token, std::string_view text) {
    return cb(token, text.data(), text.size(), user) == 0;
  };
}

}  // namespace

void strata::api::SetLastError(std::string message) { g_last_error = std::move(message); }

strata_status strata::api::CheckRequired(const char* fn, const char* name, const void* ptr) {
  if (ptr) return STRATA_OK;
  return Fail(STRATA_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + name + " must not be NULL");
}

strata_status strata::api::CheckArray(const char* fn, const char* name, const void* ptr,
                                      const char* count_name, size_t count) {
  // A C caller's -1 arrives as SIZE_MAX: no array is that long, so such a count is taken
  // for the negative number it was.
  if (count > size_t(PTRDIFF_MAX))
    return Fail(STRATA_ERR_INVALID_ARGUMENT,
                std::string(fn) + ": " + count_name + " is negative (" +
                    std::to_string(static_cast<long long>(static_cast<ptrdiff_t>(count))) +
                    ", passed as size_t " + std::to_string(count) + ")");
  if (!ptr && count > 0)
    return Fail(STRATA_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + name + " is NULL but " +
                                                 count_name + " is " + std::to_string(count));
  return STRATA_OK;
}

strata_status strata::api::CheckStrings(const char* fn, const char* name, const char* const* ptr,
                                        const char* count_name, size_t count) {
  STRATA_C_CHECK(CheckArray(fn, name, ptr, count_name, count));
  for (size_t i = 0; i < count; ++i)
    if (!ptr[i])
      return Fail(STRATA_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + name + "[" +
                                                   std::to_string(i) + "] is NULL (" + count_name +
                                                   " is " + std::to_string(count) + ")");
  return STRATA_OK;
}

strata_status strata::api::CheckGenerateParams(const char* fn,
                                               const strata_generate_params* params) {
  if (!params) return STRATA_OK;
  return CheckStrings(fn, "params->stop", params->stop, "params->n_stop", params->n_stop);
}

extern "C" {

const char* strata_version(void) { return "0.1.0"; }

const char* strata_last_error(void) { return g_last_error.c_str(); }

const char* strata_status_name(strata_status status) {
  if (int(status) < 0 || int(status) > int(STRATA_ERR_INTERNAL)) return "unknown status";
  return strata::StatusCodeName(static_cast<strata::Status::Code>(int(status)));
}

strata_status strata_model_load(const char* path, strata_model** out) {
  STRATA_C_REQUIRE_ARG(path);
  STRATA_C_REQUIRE_ARG(out);
  *out = nullptr;
  return Guard([&] {
    auto m = std::make_unique<strata_model>();
    strata_status s = ToC(strata::Model::Load(path, &m->model));
    if (s == STRATA_OK) *out = m.release();
    return s;
  });
}

void strata_model_free(strata_model* model) { delete model; }

strata_status strata_model_get_info(const strata_model* model, strata_model_info* out) {
  STRATA_C_REQUIRE_ARG(model);
  STRATA_C_REQUIRE_ARG(out);
  const strata::HParams& hp = model->model->hparams();
  std::memset(out, 0, sizeof(*out));
  CopyString(out->architecture, sizeof(out->architecture), hp.arch_name);
  CopyString(out->name, sizeof(out->name), hp.name);
  out->n_vocab = hp.n_vocab;
  out->n_ctx_train = hp.n_ctx_train;
  out->n_embd = hp.n_embd;
  out->n_layer = hp.n_layer;
  out->n_head = hp.n_head;
  out->n_head_kv = hp.n_head_kv;
  out->head_dim = hp.head_dim;
  out->n_ff = hp.n_ff;
  uint64_t params = 0;
  for (const auto& t : model->model->gguf().tensors()) params += uint64_t(t.n_elements());
  out->n_params = params;
  out->weight_bytes = model->model->weight_bytes();
  out->kv_bytes_per_token = uint64_t(hp.kv_bytes_per_token_f16());
  out->bos_token = model->model->tokenizer().bos();
  out->eos_token = model->model->tokenizer().eos();
  CopyString(out->chat_template, sizeof(out->chat_template),
             strata::ChatTemplateName(model->model->chat_template()));
  return STRATA_OK;
}

strata_status strata_tokenize(const strata_model* model, const char* text, size_t text_len,
                              int add_bos, int parse_special, int32_t* tokens, size_t capacity,
                              size_t* n_tokens) {
  STRATA_C_REQUIRE_ARG(model);
  STRATA_C_CHECK_ARRAY(text, text_len);
  STRATA_C_CHECK_ARRAY(tokens, capacity);
  STRATA_C_REQUIRE_ARG(n_tokens);
  return Guard([&] {
    std::vector<int32_t> ids;
    strata_status s = ToC(model->model->tokenizer().Encode(std::string_view(text, text_len),
                                                           add_bos != 0, parse_special != 0, &ids));
    if (s != STRATA_OK) return s;
    *n_tokens = ids.size();
    if (ids.size() > capacity)
      return Fail(STRATA_ERR_OUT_OF_RANGE, "strata_tokenize: " + std::to_string(ids.size()) +
                                               " tokens do not fit the capacity " +
                                               std::to_string(capacity));
    std::copy(ids.begin(), ids.end(), tokens);
    return STRATA_OK;
  });
}

strata_status strata_detokenize(const strata_model* model, const int32_t* tokens, size_t n_tokens,
                                char* buf, size_t capacity, size_t* text_len) {
  STRATA_C_REQUIRE_ARG(model);
  STRATA_C_CHECK_ARRAY(tokens, n_tokens);
  STRATA_C_CHECK_ARRAY(buf, capacity);  // NULL with capacity 0 asks for the length
  STRATA_C_REQUIRE_ARG(text_len);
  return Guard([&] {
    const int32_t n_vocab = model->model->tokenizer().n_vocab();
    for (size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= n_vocab)
        return Fail(STRATA_ERR_INVALID_ARGUMENT, "strata_detokenize: token " + std::to_string(i) +
                                                     " is " + std::to_string(tokens[i]) +
                                                     ", outside [0, " + std::to_string(n_vocab) +
                                                     ")");
    std::string s = model->model->tokenizer().Decode({tokens, n_tokens});
    *text_len = s.size();
    if (!buf || capacity < s.size() + 1)
      return Fail(STRATA_ERR_OUT_OF_RANGE, "strata_detokenize: " + std::to_string(s.size() + 1) +
                                               " bytes do not fit the capacity " +
                                               std::to_string(capacity));
    std::memcpy(buf, s.c_str(), s.size() + 1);
    return STRATA_OK;
  });
}

strata_engine_params strata_engine_default_params(void) {
  strata::EngineOptions d;
  strata_engine_params p;
  p.config_path = nullptr;
  p.n_threads = d.n_threads;
  p.n_ctx = d.n_ctx;
  p.n_batch = d.n_batch;
  p.max_sequences = d.max_sequences;
  p.kv_policy = nullptr;
  return p;
}

strata_status strata_engine_create(const strata_model* model, const strata_engine_params* params,
                                   strata_engine** out) {
  STRATA_C_REQUIRE_ARG(model);
  STRATA_C_REQUIRE_ARG(out);
  *out = nullptr;
  return Guard([&] {
    const strata_engine_params p = params ? *params : strata_engine_default_params();
    const strata_engine_params d = strata_engine_default_params();
    strata::Config cfg;
    if (p.config_path) {
      strata_status s = ToC(strata::LoadConfigFile(p.config_path, &cfg));
      if (s != STRATA_OK) return s;
    }
    strata::EngineOptions& o = cfg.engine;
    if (p.n_threads != d.n_threads) o.n_threads = p.n_threads;
    if (p.n_ctx != d.n_ctx) o.n_ctx = p.n_ctx;
    if (p.n_batch != d.n_batch) o.n_batch = p.n_batch;
    if (p.max_sequences != d.max_sequences) o.max_sequences = p.max_sequences;
    if (p.kv_policy) {
      strata_status s = ToC(strata::ParseKvPolicyKind(p.kv_policy, &o.kv.policy));
      if (s != STRATA_OK) return s;
    }
    auto e = std::make_unique<strata_engine>();
    strata_status s = ToC(strata::Engine::Create(*model->model, o, &e->engine));
    if (s == STRATA_OK) *out = e.release();
    return s;
  });
}

void strata_engine_free(strata_engine* engine) { delete engine; }

strata_generate_params strata_generate_default_params(void) {
  strata::GenerateParams d;
  strata_generate_params p;
  std::memset(&p, 0, sizeof(p));
  p.max_tokens = d.max_tokens;
  p.temperature = d.sampling.temperature;
  p.top_k = d.sampling.top_k;
  p.top_p = d.sampling.top_p;
  p.min_p = d.sampling.min_p;
  p.repeat_penalty = d.sampling.repeat_penalty;
  p.repeat_last_n = d.sampling.repeat_last_n;
  p.seed = d.sampling.seed;
  return p;
}

strata_status strata_session_create(strata_engine* engine, strata_session** out) {
  STRATA_C_REQUIRE_ARG(engine);
  STRATA_C_REQUIRE_ARG(out);
  *out = nullptr;
  return Guard([&] {
    auto s = std::make_unique<strata_session>();
    strata_status st = ToC(strata::Session::Create(engine->engine.get(), &s->session));
    if (st == STRATA_OK) *out = s.release();
    return st;
  });
}

void strata_session_free(strata_session* session) { delete session; }

strata_status strata_session_reset(strata_session* session) {
  STRATA_C_REQUIRE_ARG(session);
  return Guard([&] { return ToC(session->session->Reset()); });
}

strata_status strata_generate(strata_session* session, const char* prompt,
                              const strata_generate_params* params, strata_token_callback callback,
                              void* user_data, char** text_out) {
  STRATA_C_REQUIRE_ARG(session);
  STRATA_C_REQUIRE_ARG(prompt);
  STRATA_C_CHECK(strata::api::CheckGenerateParams(__func__, params));
  if (text_out) *text_out = nullptr;
  return Guard([&] {
    const strata_generate_params p = params ? *params : strata_generate_default_params();
    const strata::GenerateParams g = ToGenerateParams(p);
    std::string text;
    strata::Status st = p.chat
                            ? session->session->Chat(prompt, g, ToCallback(callback, user_data),
                                                     &text, &session->stats)
                            : session->session->Generate(prompt, g, ToCallback(callback, user_data),
                                                         &text, &session->stats);
    session->stop = session->session->last_stop_reason();
    if (!st.ok()) return ToC(st);
    if (text_out && !(*text_out = DupString(text)))
      return Fail(STRATA_ERR_RESOURCE_EXHAUSTED, "out of memory");
    return STRATA_OK;
  });
}

strata_status strata_generate_batch(strata_engine* engine, const char* const* prompts,
                                    size_t n_prompts, const strata_generate_params* params,
                                    strata_token_callback callback, void* const* user_data,
                                    char** texts_out) {
  STRATA_C_REQUIRE_ARG(engine);
  STRATA_C_CHECK_STRINGS(prompts, n_prompts);
  if (n_prompts == 0)
    return Fail(STRATA_ERR_INVALID_ARGUMENT, std::string(__func__) + ": n_prompts is 0");
  STRATA_C_CHECK(strata::api::CheckGenerateParams(__func__, params));
  if (texts_out)
    for (size_t i = 0; i < n_prompts; ++i) texts_out[i] = nullptr;
  return Guard([&] {
    strata::Engine& e = *engine->engine;
    const strata_generate_params p = params ? *params : strata_generate_default_params();
    std::vector<strata::GenerationRequest> reqs(n_prompts);
    std::vector<strata::SeqId> created;
    strata::Status st;
    for (size_t i = 0; i < n_prompts && st.ok(); ++i) {
      st = e.model().tokenizer().Encode(prompts[i], true, true, &reqs[i].prompt);
      if (st.ok()) st = e.NewSequence(&reqs[i].seq);
      if (st.ok()) created.push_back(reqs[i].seq);
      reqs[i].params = ToGenerateParams(p);
      reqs[i].on_token = ToCallback(callback, user_data ? user_data[i] : nullptr);
    }
    if (st.ok()) st = e.Generate(reqs, nullptr);
    for (strata::SeqId seq : created) (void)e.RemoveSequence(seq);
    if (!st.ok()) return ToC(st);
    if (texts_out) {
      for (size_t i = 0; i < n_prompts; ++i) texts_out[i] = DupString(reqs[i].text);
    }
    return STRATA_OK;
  });
}

void strata_string_free(char* s) { std::free(s); }

strata_status strata_session_get_stats(const strata_session* session, strata_stats* out) {
  STRATA_C_REQUIRE_ARG(session);
  STRATA_C_REQUIRE_ARG(out);
  const strata::GenerationStats& s = session->stats;
  std::memset(out, 0, sizeof(*out));
  out->prompt_tokens = s.prompt_tokens;
  out->generated_tokens = s.generated_tokens;
  out->prefill_seconds = s.prefill_seconds;
  out->decode_seconds = s.decode_seconds;
  out->prefill_tokens_per_second =
      s.prefill_seconds > 0 ? double(s.prompt_tokens) / s.prefill_seconds : 0;
  out->decode_tokens_per_second =
      s.decode_seconds > 0 ? double(s.decode_tokens) / s.decode_seconds : 0;
  out->peak_rss_bytes = s.peak_rss_bytes;
  out->kv_resident_bytes = s.kv.resident_bytes;
  out->kv_peak_resident_bytes = s.kv.peak_resident_bytes;
  out->kv_bytes_read = s.kv.bytes_read;
  out->kv_bytes_written = s.kv.bytes_written;
  out->kv_reads_issued = s.kv.reads_issued;
  out->kv_reuse_hits = s.kv.reuse_hits;
  out->kv_io_wait_seconds = s.kv.io_wait_seconds;
  CopyString(out->stop_reason, sizeof(out->stop_reason), strata::StopReasonName(session->stop));
  return STRATA_OK;
}

}  // extern "C"
