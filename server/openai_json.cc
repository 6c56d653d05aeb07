#include "server/openai_json.h"

#include <cmath>
#include <limits>

namespace strata::server {

using nlohmann::json;

json ErrorJson(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return {{"error", err}};
}

namespace {

bool Fail(ApiError* err, std::string param, std::string message) {
  err->status = 400;
  err->type = "invalid_request_error";
  err->param = std::move(param);
  err->message = std::move(message);
  err->code.clear();
  return false;
}

const char* TypeName(const json& v) { return v.type_name(); }

bool WrongType(ApiError* err, const std::string& field, const char* want, const json& v) {
  return Fail(err, field, "'" + field + "' must be " + want + ", not " + std::string(TypeName(v)));
}

// A number field read as float within [lo, hi]; null counts as absent.
bool ReadFloat(const json& body, const char* field, float lo, float hi, std::optional<float>* out,
               ApiError* err) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number()) return WrongType(err, field, "a number", *it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return Fail(err, field,
                "'" + std::string(field) + "' is " + it->dump() + "; it must be in [" +
                    json(lo).dump() + ", " + json(hi).dump() + "]");
  *out = float(v);
  return true;
}

// An integer field within [lo, hi]; null counts as absent.
bool ReadInt(const json& body, const char* field, int64_t lo, int64_t hi,
             std::optional<int64_t>* out, ApiError* err) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number_integer()) return WrongType(err, field, "an integer", *it);
  // Unsigned values beyond int64 are out of range however they are read.
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return Fail(err, field, "'" + std::string(field) + "' is " + it->dump() + ", out of range");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return Fail(err, field,
                "'" + std::string(field) + "' is " + std::to_string(v) + "; it must be in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  *out = v;
  return true;
}

// A message's content: a string, or an array of text parts (what newer clients send).
bool ReadContent(const json& v, const std::string& field, std::string* out, ApiError* err) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (!v.is_array()) return WrongType(err, field, "a string or an array of text parts", v);
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = field + "[" + std::to_string(i) + "]";
    const json& p = v[i];
    if (!p.is_object()) return WrongType(err, part, "an object", p);
    auto type = p.find("type");
    if (type == p.end() || !type->is_string() || *type != "text")
      return Fail(err, part + ".type", "only parts of type 'text' are supported");
    auto text = p.find("text");
    if (text == p.end() || !text->is_string())
      return Fail(err, part + ".text", "'" + part + ".text' must be a string");
    *out += text->get<std::string>();
  }
  return true;
}

bool ReadMessages(const json& body, CompletionRequest* out, ApiError* err) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return Fail(err, "messages", "'messages' is required");
  if (!it->is_array()) return WrongType(err, "messages", "an array", *it);
  if (it->empty()) return Fail(err, "messages", "'messages' is empty");
  if (it->size() > kMaxMessages)
    return Fail(err, "messages",
                "'messages' holds " + std::to_string(it->size()) + " messages; the limit is " +
                    std::to_string(kMaxMessages));
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    const json& m = (*it)[i];
    if (!m.is_object()) return WrongType(err, field, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return Fail(err, field + ".role", "'" + field + ".role' must be a string");
    std::string r = role->get<std::string>();
    // "developer" is the newer API's name for the system role.
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      return Fail(err, field + ".role",
                  "role '" + role->get<std::string>() +
                      "' is not supported (system, developer, user, assistant)");
    auto content = m.find("content");
    if (content == m.end() || content->is_null())
      return Fail(err, field + ".content", "'" + field + ".content' is required");
    ChatMessage msg{r, {}};
    if (!ReadContent(*content, field + ".content", &msg.content, err)) return false;
    out->messages.push_back(std::move(msg));
  }
  return true;
}

bool ReadPrompt(const json& body, CompletionRequest* out, ApiError* err) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Fail(err, "prompt", "'prompt' is required");
  // One prompt per request (n = 1): a string, or an array holding one string.
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    out->prompt = (*it)[0].get<std::string>();
  } else if (it->is_string()) {
    out->prompt = it->get<std::string>();
  } else {
    return WrongType(err, "prompt", "a string", *it);
  }
  if (out->prompt.empty()) return Fail(err, "prompt", "'prompt' is empty");
  return true;
}

bool ReadStop(const json& body, CompletionRequest* out, ApiError* err) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return true;
  std::vector<json> items;
  if (it->is_string()) {
    items.push_back(*it);
  } else if (it->is_array()) {
    items.assign(it->begin(), it->end());
  } else {
    return WrongType(err, "stop", "a string or an array of strings", *it);
  }
  if (items.size() > kMaxStopStrings)
    return Fail(err, "stop",
                "'stop' holds " + std::to_string(items.size()) + " strings; the limit is " +
                    std::to_string(kMaxStopStrings));
  for (const json& s : items) {
    if (!s.is_string()) return WrongType(err, "stop", "a string or an array of strings", s);
    const std::string v = s.get<std::string>();
    if (v.size() > kMaxStopBytes)
      return Fail(err, "stop",
                  "a stop string holds " + std::to_string(v.size()) + " bytes; the limit is " +
                      std::to_string(kMaxStopBytes));
    if (!v.empty()) out->stop.push_back(v);  // an empty stop string would match at once
  }
  return true;
}

}  // namespace

bool ParseCompletionRequest(std::string_view body, Endpoint endpoint, CompletionRequest* out,
                            ApiError* err) {
  *out = CompletionRequest{};
  out->endpoint = endpoint;
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // A parse error, ill-formed UTF-8 inside a string among them, or a number beyond a
    // double's range (out_of_range, found by fuzzing: it is not a parse_error).
    return Fail(err, "", std::string("the body is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return Fail(err, "", "the body must be a JSON object");

  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return WrongType(err, "model", "a string", *it);
    out->model = it->get<std::string>();
  }
  if (endpoint == Endpoint::kChat) {
    if (!ReadMessages(j, out, err)) return false;
  } else {
    if (!ReadPrompt(j, out, err)) return false;
  }

  std::optional<int64_t> v;
  if (!ReadInt(j, "n", 1, std::numeric_limits<int32_t>::max(), &v, err)) return false;
  if (v && *v != 1) return Fail(err, "n", "'n' must be 1: one choice per request is supported");
  // Chat takes the newer max_completion_tokens too; when both are given, it wins, as in the
  // OpenAI API where max_tokens is its deprecated alias.
  const char* max_fields[] = {"max_tokens", "max_completion_tokens"};
  for (const char* f : max_fields) {
    if (endpoint != Endpoint::kChat && std::string_view(f) == "max_completion_tokens") continue;
    v.reset();
    if (!ReadInt(j, f, 1, std::numeric_limits<int32_t>::max(), &v, err)) return false;
    if (v) {
      out->max_tokens = int32_t(*v);
      out->max_tokens_field = f;
    }
  }
  if (!ReadFloat(j, "temperature", 0.f, 2.f, &out->temperature, err)) return false;
  if (!ReadFloat(j, "top_p", 0.f, 1.f, &out->top_p, err)) return false;
  if (!ReadFloat(j, "min_p", 0.f, 1.f, &out->min_p, err)) return false;
  v.reset();
  if (!ReadInt(j, "top_k", 0, std::numeric_limits<int32_t>::max(), &v, err)) return false;
  if (v) out->top_k = int32_t(*v);
  v.reset();
  if (!ReadInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
               &v, err))
    return false;
  if (v) out->seed = uint64_t(*v);
  if (!ReadStop(j, out, err)) return false;
  if (auto it = j.find("stream"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType(err, "stream", "a boolean", *it);
    out->stream = it->get<bool>();
  }
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType(err, "stream_options", "an object", *it);
    if (auto u = it->find("include_usage"); u != it->end() && !u->is_null()) {
      if (!u->is_boolean()) return WrongType(err, "stream_options.include_usage", "a boolean", *u);
      out->include_usage = u->get<bool>();
    }
  }
  return true;
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json Envelope(Endpoint endpoint, const ResponseMeta& meta, bool chunk) {
  const char* object = endpoint == Endpoint::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

json Reason(const std::string& finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

}  // namespace

json CompletionJson(Endpoint endpoint, const ResponseMeta& meta, const std::string& text,
                    const std::string& finish_reason, const Usage& usage) {
  json j = Envelope(endpoint, meta, false);
  json choice = {{"index", 0}, {"finish_reason", Reason(finish_reason)}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(usage);
  return j;
}

json ChunkJson(Endpoint endpoint, const ResponseMeta& meta, const std::string& text, bool first,
               const std::string& finish_reason) {
  json j = Envelope(endpoint, meta, true);
  json choice = {{"index", 0}, {"finish_reason", Reason(finish_reason)}};
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  j["choices"] = json::array({choice});
  return j;
}

json UsageChunkJson(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  json j = Envelope(endpoint, meta, true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return j;
}

std::string SseEvent(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

// Generated text is whole UTF-8 characters, but the final flush of a stream cut by the token
// limit may end inside one: it is replaced (U+FFFD) rather than failing the response.
std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace strata::server
