#include "server/server.h"

#include <httplib.h>

#include <ctime>
#include <filesystem>

#include "runtime/engine/sampler.h"
#include "server/metrics.h"
#include "server/openai_json.h"
#include "server/scheduler.h"

namespace strata::server {

using nlohmann::json;

namespace {

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(DumpJson(ErrorJson(e)), "application/json");
}

ApiError BadRequest(std::string param, std::string message, std::string code = {}) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

const char* FinishReason(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens:
    case StopReason::kContextFull:
      return "length";
    default:
      return "stop";
  }
}

// Metrics label requests by route; anything else is one label, so a scan of made-up paths
// cannot grow the metrics without bound.
std::string EndpointLabel(const std::string& path) {
  for (const char* known :
       {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == known) return known;
  return "other";
}

// Compares without an early exit, so the time taken says nothing about how much of a guessed
// key was right (its length aside).
bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i] ^ b[i]);
  return diff == 0;
}

// A job that ended in an error: 503 when the server is stopping (a retry elsewhere may
// succeed), 500 otherwise.
ApiError JobError(const Job::Result& r) {
  ApiError e;
  e.status = r.shutting_down ? 503 : 500;
  e.type = "server_error";
  e.message = r.error;
  return e;
}

}  // namespace

struct Server::Impl {
  Impl(Engine* e, ServerOptions o)
      : engine(e),
        opts(std::move(o)),
        scheduler(e, opts.slots, opts.max_waiting, &metrics),
        n_ctx(e->options().n_ctx) {
    const std::filesystem::path p(opts.model_path);
    file_name = p.filename().string();
    model_id = p.extension() == ".gguf" ? p.stem().string() : file_name;
  }

  void Routes();
  void HandleCompletion(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  bool ModelMatches(const std::string& name) const {
    return name == model_id || name == file_name || name == opts.model_path;
  }

  Engine* engine;
  ServerOptions opts;
  Metrics metrics;
  Scheduler scheduler;
  const int32_t n_ctx;
  std::string model_id, file_name;
  httplib::Server http;
  std::atomic<bool> stop_requested{false};
  std::atomic<uint64_t> next_id{0};
};

Server::Server(Engine* engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {}

Server::~Server() { Stop(); }

void Server::Impl::Routes() {
  // Handler threads wait on their request for its whole generation: one per slot and per
  // waiting request, and some more so that, with all of those busy, health checks, metrics
  // and the 503s of a full queue are still answered. Connections beyond them wait in the
  // library's own queue (0.11 cannot bound it) until a thread is free.
  const size_t threads = size_t(opts.slots) + size_t(opts.max_waiting) + 16;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(opts.max_body_bytes);
  http.set_read_timeout(opts.timeout_s, 0);
  http.set_write_timeout(opts.timeout_s, 0);
  http.set_keep_alive_timeout(opts.keep_alive_s);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Health stays open so that a load balancer's probe needs no key.
    if (opts.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    if (SameKey(req.get_header_value("Authorization"), "Bearer " + opts.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = 401;
    e.message = "a valid API key is required: send \"Authorization: Bearer KEY\"";
    e.code = "invalid_api_key";
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors the library raises itself (unknown route, body over the limit, bad request line)
  // get the same JSON shape as ours.
  http.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    if (res.status == 404) {
      e.message = "no such endpoint";
    } else if (res.status == 413) {
      e.message =
          "the request body exceeds the limit of " + std::to_string(opts.max_body_bytes) + " bytes";
    } else {
      e.message = "the request failed with HTTP status " + std::to_string(res.status);
    }
    SendError(res, e);
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.CountRequest(EndpointLabel(req.path), res.status);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.Render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "strata"}};
    res.set_content(DumpJson({{"object", "list"}, {"data", json::array({model})}}),
                    "application/json");
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(req, res, Endpoint::kChat);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(req, res, Endpoint::kCompletions);
  });
}

void Server::Impl::HandleCompletion(const httplib::Request& req, httplib::Response& res,
                                    Endpoint ep) {
  CompletionRequest cr;
  ApiError err;
  if (!ParseCompletionRequest(req.body, ep, &cr, &err)) return SendError(res, err);
  if (!cr.model.empty() && !ModelMatches(cr.model))
    return SendError(res, BadRequest("model",
                                     "model '" + cr.model +
                                         "' is not served here; this server "
                                         "serves '" +
                                         model_id + "'",
                                     "model_not_found"));
  const Model& model = engine->model();
  const bool chat = ep == Endpoint::kChat;
  const char* input_field = chat ? "messages" : "prompt";
  std::string text;
  if (chat) {
    if (model.chat_template() == ChatTemplateKind::kNone)
      return SendError(res, BadRequest("messages",
                                       "the model has no chat template this server recognizes "
                                       "(ChatML, Llama 3, Llama 2); use /v1/completions"));
    // Rendered as `strata run --chat` renders a conversation, so the same messages give the
    // same tokens.
    text = ApplyChatTemplate(model.chat_template(), cr.messages, /*add_generation_prompt=*/true,
                             model.default_system_prompt());
  } else {
    text = std::move(cr.prompt);
  }
  std::vector<int32_t> ids;
  const Status enc = model.tokenizer().Encode(text, /*add_bos=*/true, /*parse_special=*/true, &ids);
  if (!enc.ok()) return SendError(res, BadRequest(input_field, enc.message()));
  if (ids.empty()) return SendError(res, BadRequest(input_field, "the prompt has no tokens"));
  if (int64_t(ids.size()) >= n_ctx)
    return SendError(res, BadRequest(input_field,
                                     "the prompt is " + std::to_string(ids.size()) +
                                         " tokens; the context holds " + std::to_string(n_ctx) +
                                         ", leaving no room to generate",
                                     "context_length_exceeded"));
  const int64_t room = int64_t(n_ctx) - int64_t(ids.size());
  GenerateParams gp = opts.defaults;
  if (cr.max_tokens) {
    if (*cr.max_tokens > room)
      return SendError(
          res, BadRequest(cr.max_tokens_field,
                          "'" + cr.max_tokens_field + "' is " + std::to_string(*cr.max_tokens) +
                              "; the prompt's " + std::to_string(ids.size()) +
                              " tokens leave room for at most " + std::to_string(room) +
                              " in the context of " + std::to_string(n_ctx) + " tokens",
                          "context_length_exceeded"));
    gp.max_tokens = *cr.max_tokens;
  }
  if (cr.temperature) gp.sampling.temperature = *cr.temperature;
  if (cr.top_p) gp.sampling.top_p = *cr.top_p;
  if (cr.top_k) gp.sampling.top_k = *cr.top_k;
  if (cr.min_p) gp.sampling.min_p = *cr.min_p;
  if (cr.seed) gp.sampling.seed = *cr.seed;
  if (!cr.stop.empty()) gp.stop = cr.stop;
  if (const Status s = ValidateSamplingParams(gp.sampling); !s.ok())
    return SendError(res, BadRequest("", s.message()));

  auto job = std::make_shared<Job>(std::move(ids), gp);
  switch (scheduler.Submit(job)) {
    case Scheduler::Admission::kQueued:
      break;
    case Scheduler::Admission::kQueueFull: {
      ApiError e;
      e.status = 503;
      e.type = "server_error";
      e.code = "queue_full";
      e.message = "every slot is busy and " + std::to_string(opts.max_waiting) +
                  " requests are waiting; retry later";
      res.set_header("Retry-After", "1");
      return SendError(res, e);
    }
    case Scheduler::Admission::kStopping: {
      ApiError e;
      e.status = 503;
      e.type = "server_error";
      e.message = "the server is shutting down";
      return SendError(res, e);
    }
  }
  ResponseMeta meta;
  meta.id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id.fetch_add(1));
  meta.created = int64_t(std::time(nullptr));
  meta.model = model_id;

  if (!cr.stream) {
    std::string out;
    Job::Result r;
    // httplib 0.11 cannot tell a handler that its client left, so a whole-response request
    // runs to its end even then; a streamed one is cancelled at its next write.
    while (!job->Take(std::chrono::milliseconds(500), &out, &r)) {
    }
    if (!r.error.empty()) return SendError(res, JobError(r));
    const Usage usage{r.prompt_tokens, r.completion_tokens, r.cached_tokens};
    res.set_content(DumpJson(CompletionJson(ep, meta, out, FinishReason(r.stop), usage)),
                    "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  const bool include_usage = cr.include_usage;
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, meta, ep, include_usage](size_t, httplib::DataSink& sink) {
        bool first = true;
        Job::Result r;
        std::string piece;
        for (;;) {
          piece.clear();
          const bool done = job->Take(std::chrono::milliseconds(100), &piece, &r);
          if (!piece.empty()) {
            const std::string ev = SseEvent(ChunkJson(ep, meta, piece, first, ""));
            first = false;
            // A failed write is a client gone: its slot is freed at the next step.
            if (!sink.write(ev.data(), ev.size())) {
              job->Cancel();
              return false;
            }
          }
          if (done) break;
          if (!sink.is_writable()) {
            job->Cancel();
            return false;
          }
        }
        std::string tail;
        if (!r.error.empty()) {
          tail += SseEvent(ErrorJson(JobError(r)));
        } else {
          tail += SseEvent(ChunkJson(ep, meta, "", first, FinishReason(r.stop)));
          if (include_usage)
            tail += SseEvent(UsageChunkJson(
                ep, meta, Usage{r.prompt_tokens, r.completion_tokens, r.cached_tokens}));
        }
        tail += "data: [DONE]\n\n";
        if (sink.write(tail.data(), tail.size())) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->Cancel();
      });
}

Status Server::Bind() {
  impl_->Routes();
  Impl& m = *impl_;
  if (m.opts.port == 0) {
    port_ = m.http.bind_to_any_port(m.opts.host);
  } else {
    port_ = m.http.bind_to_port(m.opts.host, m.opts.port) ? m.opts.port : -1;
  }
  if (port_ < 0)
    return Status::IOError("cannot listen on " + m.opts.host + ":" + std::to_string(m.opts.port) +
                           " (in use, or not an address of this machine)");
  return Status::OK();
}

Status Server::Run() {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.scheduler.Start());
  if (!m.stop_requested.load()) m.http.listen_after_bind();
  // The listener has stopped and its threads are joined; nothing submits any more.
  m.scheduler.Stop();
  return Status::OK();
}

void Server::Stop() {
  Impl& m = *impl_;
  m.stop_requested.store(true);
  // The scheduler first: running requests end, so the HTTP threads waiting on them return
  // and the listener's shutdown (which joins them) completes.
  m.scheduler.Stop();
  m.http.stop();
}

}  // namespace strata::server
