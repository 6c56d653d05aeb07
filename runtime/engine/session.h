// Session: one conversation with an engine: a sequence in the KV policy plus the tokens
// it holds, so successive prompts continue where the last generation stopped.
//
// Chat keeps the messages and re-renders the whole conversation with the model's chat
// template each turn; the tokens the KV already holds are reused when they are a prefix
// of the new rendering, otherwise the sequence is rebuilt. Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/model/chat_template.h"

namespace strata {

class Session {
 public:
  static Status Create(Engine* engine, std::unique_ptr<Session>* out);
  ~Session();

  // Appends `prompt` (raw text, special tokens parsed; BOS added if the model wants one and
  // the session is empty) and generates.
  Status Generate(std::string_view prompt, const GenerateParams& params,
                  const TokenCallback& on_token, std::string* text, GenerationStats* stats);
  // Adds a user message, generates the assistant's answer and records it.
  Status Chat(std::string_view user_message, const GenerateParams& params,
              const TokenCallback& on_token, std::string* answer, GenerationStats* stats);
  void SetSystemPrompt(std::string system) { system_ = std::move(system); }
  // Forgets the conversation and its KV.
  Status Reset();

  const std::vector<int32_t>& tokens() const { return tokens_; }
  StopReason last_stop_reason() const { return last_stop_; }
  const GenerationStats& last_stats() const { return last_stats_; }
  SeqId seq() const { return seq_; }

 private:
  explicit Session(Engine* engine) : engine_(engine) {}
  Status GenerateTokens(std::vector<int32_t> prompt, const GenerateParams& params,
                        const TokenCallback& on_token, std::string* text, GenerationStats* stats);

  Engine* engine_;
  SeqId seq_ = -1;
  std::vector<int32_t> tokens_;  // exactly what the KV holds for seq_
  std::vector<ChatMessage> messages_;
  std::string system_;
  StopReason last_stop_ = StopReason::kNone;
  GenerationStats last_stats_;
};

}  // namespace strata
