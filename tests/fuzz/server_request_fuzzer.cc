// libFuzzer target: request bodies of `strata serve`'s OpenAI API. The first input byte picks
// the endpoint (chat or completions); the rest is the body. Parsing never throws; a refusal is
// a 400 with a message; an accepted request keeps every limit the parser promises, and its
// responses and error objects serialize whatever text they carry.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/openai_json.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "server_request_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::server;
  if (size == 0) return 0;
  const Endpoint ep = data[0] & 1 ? Endpoint::kChat : Endpoint::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  CompletionRequest r;
  ApiError e;
  if (!ParseCompletionRequest(body, ep, &r, &e)) {
    if (e.status != 400 || e.message.empty()) Fail("a refusal without status 400 and a message");
    (void)DumpJson(ErrorJson(e));
    return 0;
  }
  if (ep == Endpoint::kChat && (r.messages.empty() || r.messages.size() > kMaxMessages))
    Fail("accepted chat messages out of bounds");
  if (ep == Endpoint::kCompletions && r.prompt.empty()) Fail("accepted an empty prompt");
  if (r.stop.size() > kMaxStopStrings) Fail("too many stop strings");
  for (const std::string& s : r.stop)
    if (s.empty() || s.size() > kMaxStopBytes) Fail("a stop string out of bounds");
  if (r.max_tokens && *r.max_tokens < 1) Fail("max_tokens below 1");
  if (r.temperature && (*r.temperature < 0.f || *r.temperature > 2.f)) Fail("temperature");
  if (r.top_p && (*r.top_p < 0.f || *r.top_p > 1.f)) Fail("top_p");
  if (r.min_p && (*r.min_p < 0.f || *r.min_p > 1.f)) Fail("min_p");
  if (r.top_k && *r.top_k < 0) Fail("top_k");
  for (const auto& m : r.messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant") Fail("a role");
  // What a request carries comes back in responses: they must serialize.
  const ResponseMeta meta{"id", 0, r.model};
  const std::string text = ep == Endpoint::kChat ? r.messages.back().content : r.prompt;
  (void)DumpJson(CompletionJson(ep, meta, text, "stop", Usage{}));
  (void)SseEvent(ChunkJson(ep, meta, text, true, ""));
  return 0;
}
