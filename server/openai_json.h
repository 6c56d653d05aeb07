// The OpenAI-compatible request and response shapes `strata serve` speaks: parsing and
// validating a completion or chat request body, and building the response objects, the
// streamed chunks and the error object. Pure functions over JSON: no model, no network, so
// they are unit-tested and fuzzed on their own.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/model/chat_template.h"

namespace strata::server {

// An error as the OpenAI API reports it: an HTTP status and
// {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" for none (null in the JSON)
  std::string code;   // "" for none (null in the JSON)
};
nlohmann::json ErrorJson(const ApiError& e);

// Bounds on what a request may hold, beside the body size the HTTP layer enforces. The
// OpenAI API takes at most 4 stop strings; the rest keep one request from holding the
// scheduler's attention with work no context could take anyway.
inline constexpr size_t kMaxStopStrings = 4;
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr size_t kMaxMessages = 4096;

enum class Endpoint { kCompletions, kChat };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                  // "" when absent
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions
  // Absent fields keep the server's defaults (strata.yaml's `generate` section), so a
  // request that sets nothing samples as `strata run` does.
  std::optional<int32_t> max_tokens;
  std::string max_tokens_field;  // "max_tokens" or "max_completion_tokens", for errors
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses and validates `body` for `endpoint`. On failure returns false with `err` set (400,
// naming the field). Limits that need the model (the context) are checked by the caller.
bool ParseCompletionRequest(std::string_view body, Endpoint endpoint, CompletionRequest* out,
                            ApiError* err);

// Token counts a response reports.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV was already resident
};
nlohmann::json UsageJson(const Usage& u);

// Identifies one response: its id ("chatcmpl-..." or "cmpl-..."), creation time and model.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// The whole non-streamed response.
nlohmann::json CompletionJson(Endpoint endpoint, const ResponseMeta& meta, const std::string& text,
                              const std::string& finish_reason, const Usage& usage);
// One streamed chunk: `text` as the delta (chat: with the role on the first chunk),
// `finish_reason` "" for none (null). The usage chunk has no choices.
nlohmann::json ChunkJson(Endpoint endpoint, const ResponseMeta& meta, const std::string& text,
                         bool first, const std::string& finish_reason);
nlohmann::json UsageChunkJson(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);

// A server-sent event carrying `j`: "data: {...}\n\n".
std::string SseEvent(const nlohmann::json& j);
// `j` as compact text, ill-formed UTF-8 replaced rather than thrown on.
std::string DumpJson(const nlohmann::json& j);

}  // namespace strata::server
