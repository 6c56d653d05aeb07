// Chat templates of the common model families, detected from the model's
// tokenizer.chat_template string, rendered without a Jinja engine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

enum class ChatTemplateKind { kNone, kChatML, kLlama3, kLlama2 };

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

const char* ChatTemplateName(ChatTemplateKind kind);
// Recognizes the family from the template's markers (<|im_start|>, <|start_header_id|>,
// [INST]); kNone when it is none of them.
ChatTemplateKind DetectChatTemplate(std::string_view jinja_source);
// Renders the conversation; add_generation_prompt appends the assistant header. When the
// model's own template injects a default system prompt (SmolLM2's does), `default_system`
// is used for a conversation that has no system message; pass "" for none.
std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt, std::string_view default_system);

}  // namespace strata
