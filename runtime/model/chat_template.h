// Chat templates of the common model families, detected from the model's
// tokenizer.chat_template string, rendered without a Jinja engine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

enum class ChatTemplateKind { kNone, kChatML, kLlama3, kLlama2 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

const char* ChatTemplateName(ChatTemplateKind kind);
// Recognizes the family from the template's markers (<|im_start|>, <|start_header_id|>,
// [INST]); kNone when it is none of them.
ChatTemplateKind DetectChatTemplate(std::string_view jinja_source);
// Renders the conversation; add_generation_prompt appends the assistant header. When the
// model's own template injects a default system prompt (SmolLM2's does), `default_system`
// is used for a conversation that has no system message; pass "" for none.
// ChatML: "<|im_start|>role\ncontent<|im_end|>\n" per message.
// Llama 3: "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>", content trimmed;
//   no <|begin_of_text|> (the tokenizer adds BOS).
// Llama 2: "[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s><s>[INST] ...",
//   content trimmed; no leading <s> (the tokenizer adds BOS).
// Special-token markers appear as text: encode the result with parse_special set.
std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt, std::string_view default_system);

// The system prompt a template injects when a conversation has none (SmolLM2's and
// Qwen2.5's ChatML templates do): the literal text of "<|im_start|>system\n...<|im_end|>"
// when it contains no template expression; "" when there is none.
std::string DefaultSystemPrompt(std::string_view jinja_source);

}  // namespace strata
