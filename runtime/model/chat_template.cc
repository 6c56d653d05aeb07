#include "runtime/model/chat_template.h"

namespace strata {

namespace {

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The messages with `default_system` in front when the conversation has no system
// message of its own (what the templates that inject one do).
std::vector<ChatMessage> WithDefaultSystem(const std::vector<ChatMessage>& messages,
                                           std::string_view default_system) {
  std::vector<ChatMessage> out;
  if (!default_system.empty() && !messages.empty() && messages.front().role != "system") {
    out.push_back({"system", std::string(default_system)});
  }
  out.insert(out.end(), messages.begin(), messages.end());
  return out;
}

std::string RenderChatML(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += Trim(m.content);
    out += "<|eot_id|>";
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Meta's Llama 2 chat format: the system prompt sits inside the first [INST] block; each
// completed exchange ends with </s> and the next one opens with <s>.
std::string RenderLlama2(const std::vector<ChatMessage>& msgs) {
  std::string out;
  std::string system;
  bool first_turn = true;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      system = std::string(Trim(m.content));
    } else if (m.role == "user") {
      if (!first_turn) out += "<s>";
      out += "[INST] ";
      if (!system.empty()) {
        out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
        system.clear();
      }
      out += Trim(m.content);
      out += " [/INST]";  // also the generation prompt when the turn is the last one
      first_turn = false;
    } else {  // assistant
      out += " ";
      out += Trim(m.content);
      out += " </s>";
      first_turn = false;
    }
  }
  return out;
}

std::string RenderPlain(const std::vector<ChatMessage>& msgs) {
  std::string out;
  for (const ChatMessage& m : msgs) out += m.content + "\n";
  return out;
}

}  // namespace

const char* ChatTemplateName(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kNone:
      return "none";
    case ChatTemplateKind::kChatML:
      return "chatml";
    case ChatTemplateKind::kLlama3:
      return "llama3";
    case ChatTemplateKind::kLlama2:
      return "llama2";
  }
  return "?";
}

ChatTemplateKind DetectChatTemplate(std::string_view src) {
  if (src.find("<|im_start|>") != std::string_view::npos) return ChatTemplateKind::kChatML;
  if (src.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplateKind::kLlama3;
  if (src.find("[INST]") != std::string_view::npos) return ChatTemplateKind::kLlama2;
  return ChatTemplateKind::kNone;
}

std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt, std::string_view default_system) {
  const std::vector<ChatMessage> msgs = WithDefaultSystem(messages, default_system);
  switch (kind) {
    case ChatTemplateKind::kChatML:
      return RenderChatML(msgs, add_generation_prompt);
    case ChatTemplateKind::kLlama3:
      return RenderLlama3(msgs, add_generation_prompt);
    case ChatTemplateKind::kLlama2:
      return RenderLlama2(msgs);
    case ChatTemplateKind::kNone:
      return RenderPlain(msgs);
  }
  return RenderPlain(msgs);
}

std::string DefaultSystemPrompt(std::string_view src) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t at = 0; (at = src.find(kOpen, at)) != std::string_view::npos;) {
    at += kOpen.size();
    // The role line ends with a newline, written literally or as the escape "\n".
    size_t body = at;
    if (src.substr(body, 1) == "\n") {
      body += 1;
    } else if (src.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    const size_t end = src.find(kClose, body);
    if (end == std::string_view::npos) break;
    const std::string_view text = src.substr(body, end - body);
    // Quotes, braces or '+' mean the prompt is built from an expression (the user's own
    // system message), not a literal default.
    if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return std::string();
}

}  // namespace strata
