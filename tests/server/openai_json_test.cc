// Request parsing and validation of the OpenAI-compatible API: every refusal is a 400 that
// names the offending field, and what is accepted reaches the request as given.
#include "server/openai_json.h"

#include <gtest/gtest.h>

#include <string>

namespace strata::server {
namespace {

ApiError Refused(const std::string& body, Endpoint ep = Endpoint::kChat) {
  CompletionRequest r;
  ApiError e;
  EXPECT_FALSE(ParseCompletionRequest(body, ep, &r, &e)) << body;
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  return e;
}

CompletionRequest Accepted(const std::string& body, Endpoint ep = Endpoint::kChat) {
  CompletionRequest r;
  ApiError e;
  EXPECT_TRUE(ParseCompletionRequest(body, ep, &r, &e)) << body << ": " << e.message;
  return r;
}

const char* kHi = R"("messages":[{"role":"user","content":"hi"}])";

std::string Chat(const std::string& extra) {
  return std::string("{") + kHi + (extra.empty() ? "" : "," + extra) + "}";
}

TEST(ServeRequestJson, ChatFieldsReachTheRequest) {
  CompletionRequest r = Accepted(Chat(
      R"("model":"m","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,)"
      R"("seed":42,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},"n":1)"));
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(r.max_tokens_field, "max_tokens");
  EXPECT_EQ(*r.temperature, 0.f);
  EXPECT_EQ(*r.top_k, 3);
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ServeRequestJson, AbsentFieldsStayUnset) {
  CompletionRequest r = Accepted(Chat(R"("temperature":null)"));
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.temperature);
  EXPECT_FALSE(r.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
}

TEST(ServeRequestJson, MaxCompletionTokensIsChatsName) {
  CompletionRequest r = Accepted(Chat(R"("max_completion_tokens":5)"));
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.max_tokens_field, "max_completion_tokens");
}

TEST(ServeRequestJson, ContentPartsAndDeveloperRole) {
  CompletionRequest r = Accepted(
      R"({"messages":[{"role":"developer","content":"be brief"},)"
      R"({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
}

TEST(ServeRequestJson, StopAsOneString) {
  EXPECT_EQ(Accepted(Chat(R"("stop":"\n")")).stop, (std::vector<std::string>{"\n"}));
}

TEST(ServeRequestJson, CompletionPrompt) {
  EXPECT_EQ(Accepted(R"({"prompt":"Once"})", Endpoint::kCompletions).prompt, "Once");
  EXPECT_EQ(Accepted(R"({"prompt":["Once"]})", Endpoint::kCompletions).prompt, "Once");
  EXPECT_EQ(Refused(R"({"prompt":[1,2]})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(Refused(R"({"prompt":""})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(Refused(R"({})", Endpoint::kCompletions).param, "prompt");
  // max_completion_tokens belongs to chat; completions ignore it like any unknown field.
  EXPECT_FALSE(
      Accepted(R"({"prompt":"a","max_completion_tokens":3})", Endpoint::kCompletions).max_tokens);
}

TEST(ServeRequestJson, MalformedBodies) {
  EXPECT_EQ(Refused("").param, "");
  EXPECT_EQ(Refused("{").param, "");
  EXPECT_EQ(Refused("[1]").param, "");
  EXPECT_NE(Refused("{\"messages\":\"\xff\"}").message.find("not valid JSON"), std::string::npos);
  // nlohmann reports a number beyond a double's range as out_of_range, not as a parse error.
  EXPECT_EQ(Refused(Chat(R"("temperature":2E401)")).param, "");
}

TEST(ServeRequestJson, MessagesAreChecked) {
  EXPECT_EQ(Refused("{}").param, "messages");
  EXPECT_EQ(Refused(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(Refused(R"({"messages":{}})").param, "messages");
  EXPECT_EQ(Refused(R"({"messages":[1]})").param, "messages[0]");
  EXPECT_EQ(Refused(R"({"messages":[{"content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(Refused(R"({"messages":[{"role":"tool","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(Refused(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(Refused(R"({"messages":[{"role":"user","content":5}]})").param, "messages[0].content");
  EXPECT_EQ(Refused(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})").param,
            "messages[0].content[0].type");
}

TEST(ServeRequestJson, WrongTypesNameTheField) {
  EXPECT_EQ(Refused(Chat(R"("model":3)")).param, "model");
  EXPECT_EQ(Refused(Chat(R"("max_tokens":"7")")).param, "max_tokens");
  EXPECT_EQ(Refused(Chat(R"("max_tokens":1.5)")).param, "max_tokens");
  EXPECT_EQ(Refused(Chat(R"("temperature":"hot")")).param, "temperature");
  EXPECT_EQ(Refused(Chat(R"("top_k":0.5)")).param, "top_k");
  EXPECT_EQ(Refused(Chat(R"("seed":"1")")).param, "seed");
  EXPECT_EQ(Refused(Chat(R"("stream":1)")).param, "stream");
  EXPECT_EQ(Refused(Chat(R"("stop":5)")).param, "stop");
  EXPECT_EQ(Refused(Chat(R"("stop":["a",1])")).param, "stop");
  EXPECT_EQ(Refused(Chat(R"("stream_options":true)")).param, "stream_options");
  EXPECT_EQ(Refused(Chat(R"("stream_options":{"include_usage":"yes"})")).param,
            "stream_options.include_usage");
}

TEST(ServeRequestJson, LimitsNameTheField) {
  EXPECT_EQ(Refused(Chat(R"("n":2)")).param, "n");
  EXPECT_EQ(Refused(Chat(R"("max_tokens":0)")).param, "max_tokens");
  EXPECT_EQ(Refused(Chat(R"("max_tokens":-1)")).param, "max_tokens");
  EXPECT_EQ(Refused(Chat(R"("max_tokens":99999999999)")).param, "max_tokens");
  EXPECT_EQ(Refused(Chat(R"("max_tokens":18446744073709551615)")).param, "max_tokens");
  EXPECT_EQ(Refused(Chat(R"("temperature":2.5)")).param, "temperature");
  EXPECT_EQ(Refused(Chat(R"("temperature":-0.1)")).param, "temperature");
  EXPECT_EQ(Refused(Chat(R"("top_p":1.5)")).param, "top_p");
  EXPECT_EQ(Refused(Chat(R"("min_p":-1)")).param, "min_p");
  EXPECT_EQ(Refused(Chat(R"("top_k":-1)")).param, "top_k");
  EXPECT_EQ(Refused(Chat(R"("stop":["a","b","c","d","e"])")).param, "stop");
  EXPECT_EQ(Refused(Chat("\"stop\":\"" + std::string(kMaxStopBytes + 1, 'x') + "\"")).param,
            "stop");
}

TEST(ServeRequestJson, ErrorShape) {
  ApiError e;
  e.message = "bad";
  e.param = "n";
  const nlohmann::json j = ErrorJson(e);
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(ServeRequestJson, ResponsesAndChunks) {
  const ResponseMeta meta{"chatcmpl-1", 5, "m"};
  const Usage u{10, 3, 4};
  nlohmann::json j = CompletionJson(Endpoint::kChat, meta, "hey", "stop", u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  j = ChunkJson(Endpoint::kChat, meta, "a", true, "");
  EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "a");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  j = ChunkJson(Endpoint::kCompletions, meta, "b", false, "length");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "b");
  EXPECT_EQ(UsageChunkJson(Endpoint::kChat, meta, u)["choices"].size(), 0u);
  EXPECT_EQ(SseEvent(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // A cut UTF-8 character is replaced, not thrown on.
  EXPECT_NE(DumpJson(nlohmann::json("\xe2\x82")).find("\xef\xbf\xbd"), std::string::npos);
}

}  // namespace
}  // namespace strata::server
