#include "runtime/engine/session.h"

#include <algorithm>

namespace strata {

Status Session::Create(Engine* engine, std::unique_ptr<Session>* out) {
  std::unique_ptr<Session> s(new Session(engine));
  STRATA_RETURN_IF_ERROR(engine->NewSequence(&s->seq_));
  *out = std::move(s);
  return Status::OK();
}

Session::~Session() {
  if (seq_ >= 0) (void)engine_->RemoveSequence(seq_);
}

Status Session::Reset() {
  STRATA_RETURN_IF_ERROR(engine_->RemoveSequence(seq_));
  seq_ = -1;
  tokens_.clear();
  messages_.clear();
  return engine_->NewSequence(&seq_);
}

Status Session::GenerateTokens(std::vector<int32_t> prompt, const GenerateParams& params,
                               const TokenCallback& on_token, std::string* text,
                               GenerationStats* stats) {
  const int32_t n_ctx = engine_->options().n_ctx;
  if (int64_t(tokens_.size()) + int64_t(prompt.size()) >= n_ctx)
    return Status::OutOfRange(
        "prompt of " + std::to_string(prompt.size()) + " tokens" +
        (tokens_.empty() ? std::string()
                         : " after " + std::to_string(tokens_.size()) + " tokens of conversation") +
        " leaves no room to generate in the context of " + std::to_string(n_ctx) + " tokens");
  GenerationRequest req;
  req.seq = seq_;
  req.prompt = std::move(prompt);
  req.params = params;
  req.on_token = on_token;
  Status st = engine_->Generate({&req, 1}, &last_stats_);
  // Whatever reached the KV is part of the session, even when generation failed midway.
  tokens_.insert(tokens_.end(), req.prompt.begin(), req.prompt.end());
  const size_t evaluated = size_t(engine_->kv().Length(seq_)) - tokens_.size();
  tokens_.insert(tokens_.end(), req.tokens.begin(),
                 req.tokens.begin() + std::min(evaluated, req.tokens.size()));
  STRATA_RETURN_IF_ERROR(st);
  last_stop_ = req.stop_reason;
  if (text) *text = std::move(req.text);
  if (stats) *stats = last_stats_;
  return Status::OK();
}

Status Session::Generate(std::string_view prompt, const GenerateParams& params,
                         const TokenCallback& on_token, std::string* text, GenerationStats* stats) {
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(
      engine_->model().tokenizer().Encode(prompt, tokens_.empty(), /*parse_special=*/true, &ids));
  if (ids.empty()) return Status::InvalidArgument("generate: the prompt is empty");
  return GenerateTokens(std::move(ids), params, on_token, text, stats);
}

Status Session::Chat(std::string_view user_message, const GenerateParams& params,
                     const TokenCallback& on_token, std::string* answer, GenerationStats* stats) {
  const Model& model = engine_->model();
  ChatTemplateKind kind = model.chat_template();
  if (kind == ChatTemplateKind::kNone)
    return Status::NotSupported("model " + model.path() +
                                " has no chat template this runtime recognizes "
                                "(supported: ChatML, Llama 3, Llama 2); use a plain prompt");
  // Checked here, before rendering: the offset then points into the user's own message, and
  // a refused message leaves the conversation as it was.
  size_t bad = 0;
  if (!IsValidUtf8(user_message, &bad))
    return Status::InvalidArgument("the message is not valid UTF-8 at byte " + std::to_string(bad) +
                                   " (of " + std::to_string(user_message.size()) +
                                   "); it was not sent and the conversation is unchanged");
  std::vector<ChatMessage> msgs = messages_;
  msgs.push_back({"user", std::string(user_message)});
  std::vector<ChatMessage> rendered = msgs;
  if (!system_.empty() && (rendered.empty() || rendered[0].role != "system"))
    rendered.insert(rendered.begin(), {"system", system_});
  const std::string text = ApplyChatTemplate(kind, rendered, /*add_generation_prompt=*/true,
                                             model.default_system_prompt());
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(model.tokenizer().Encode(text, true, /*parse_special=*/true, &ids));
  // Reuse the KV when it holds a prefix of the new rendering; otherwise start over.
  const bool prefix =
      ids.size() > tokens_.size() && std::equal(tokens_.begin(), tokens_.end(), ids.begin());
  if (!prefix) {
    std::vector<ChatMessage> keep = messages_;
    STRATA_RETURN_IF_ERROR(Reset());
    messages_ = std::move(keep);
  }
  std::vector<int32_t> suffix(ids.begin() + tokens_.size(), ids.end());
  std::string out;
  STRATA_RETURN_IF_ERROR(GenerateTokens(std::move(suffix), params, on_token, &out, stats));
  messages_ = std::move(msgs);
  messages_.push_back({"assistant", out});
  if (answer) *answer = std::move(out);
  return Status::OK();
}

}  // namespace strata
