#include "runtime/model/chat_template.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

// SmolLM2-135M-Instruct's template, as its GGUF file carries it.
const char kSmolLM2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

const char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const char kLlama2Template[] =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
    "message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}";

TEST(ChatTemplateTest, DetectsFamilies) {
  EXPECT_EQ(DetectChatTemplate(kSmolLM2Template), ChatTemplateKind::kChatML);
  EXPECT_EQ(DetectChatTemplate(kLlama3Template), ChatTemplateKind::kLlama3);
  EXPECT_EQ(DetectChatTemplate(kLlama2Template), ChatTemplateKind::kLlama2);
  EXPECT_EQ(DetectChatTemplate("{{ messages }}"), ChatTemplateKind::kNone);
  EXPECT_STREQ(ChatTemplateName(ChatTemplateKind::kLlama3), "llama3");
}

TEST(ChatTemplateTest, ExtractsALiteralDefaultSystemPrompt) {
  EXPECT_EQ(DefaultSystemPrompt(kSmolLM2Template),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  // Qwen2.5 writes its newline as an escape inside the Jinja string.
  EXPECT_EQ(DefaultSystemPrompt("{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}"),
            "You are Qwen.");
  // A system turn built from the user's message is not a default.
  EXPECT_EQ(DefaultSystemPrompt("{{'<|im_start|>system\n' + messages[0]['content'] + "
                                "'<|im_end|>'}}"),
            "");
  EXPECT_EQ(DefaultSystemPrompt(kLlama3Template), "");
}

TEST(ChatTemplateTest, RendersChatMLLikeSmolLM2) {
  const std::string sys = DefaultSystemPrompt(kSmolLM2Template);
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kChatML, {{"user", "Hi there"}}, true, sys),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  // An explicit system message replaces the default; no generation prompt when not asked.
  EXPECT_EQ(
      ApplyChatTemplate(ChatTemplateKind::kChatML,
                        {{"system", "Be brief."}, {"user", "Q"}, {"assistant", "A"}}, false, sys),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
      "<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kChatML, {{"user", "Q"}}, false, ""),
            "<|im_start|>user\nQ<|im_end|>\n");
}

TEST(ChatTemplateTest, RendersLlama3) {
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kLlama3,
                              {{"system", "Sys "}, {"user", "  Hello\n"}}, true, ""),
            "<|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, RendersLlama2) {
  EXPECT_EQ(
      ApplyChatTemplate(
          ChatTemplateKind::kLlama2,
          {{"system", "Sys"}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "More"}}, true, ""),
      "[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] More [/INST]");
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kLlama2, {{"user", "Hi"}}, true, ""),
            "[INST] Hi [/INST]");
}

}  // namespace
}  // namespace strata
