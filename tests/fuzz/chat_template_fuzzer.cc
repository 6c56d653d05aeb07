// libFuzzer target: arbitrary conversations through every chat template renderer, and
// arbitrary template sources through the detector and the default-system-prompt reader. The
// input is split at NUL bytes into (role, content) pairs. Rendering must not crash and must
// carry every message's content (trimmed templates may drop surrounding space).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/model/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  (void)strata::DetectChatTemplate(in);
  (void)strata::DefaultSystemPrompt(in);
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= in.size(); ++i)
    if (i == in.size() || in[i] == '\0') {
      parts.push_back(in.substr(start, i - start));
      start = i + 1;
    }
  std::vector<strata::ChatMessage> msgs;
  for (size_t i = 0; i + 1 < parts.size(); i += 2) msgs.push_back({parts[i], parts[i + 1]});
  for (auto kind : {strata::ChatTemplateKind::kChatML, strata::ChatTemplateKind::kLlama3,
                    strata::ChatTemplateKind::kLlama2}) {
    for (bool gen : {false, true}) {
      const std::string out = strata::ApplyChatTemplate(kind, msgs, gen, parts.back());
      for (const strata::ChatMessage& m : msgs) {
        // Content without leading or trailing space must appear (the templates trim).
        const size_t b = m.content.find_first_not_of(" \t\n\v\f\r");
        if (b == std::string::npos) continue;
        const size_t e = m.content.find_last_not_of(" \t\n\v\f\r");
        if (out.find(m.content.substr(b, e - b + 1)) == std::string::npos &&
            (m.role == "user" || m.role == "assistant")) {
          std::fprintf(stderr, "chat_template_fuzzer: a message's content is missing\n");
          std::abort();
        }
      }
    }
  }
  return 0;
}
