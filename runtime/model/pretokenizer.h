// Pre-tokenizers of the byte-level BPE models: split text into the "words" that BPE then
// merges independently. Each kind reproduces one published split regex (selected by the
// GGUF key tokenizer.ggml.pre) with a hand-written scanner over Unicode categories (ICU),
// so no regex engine runs at encode time.
//
// Internal to runtime/model (BpeTokenizer); stateless functions, safe from any thread.
#pragma once

#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

enum class PreTokenizerKind {
  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // StarCoder/SmolLM: first every \p{N} character on its own, then the GPT-2 split on the
  // pieces in between (Hugging Face: Digits(individual_digits) then ByteLevel).
  kSmolLM,
  // Llama 3 (cl100k-like): (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
  // \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen2: as Llama 3 but \p{N} one digit at a time.
  kQwen2,
};

// Maps a tokenizer.ggml.pre value to a kind: "gpt2", "default" (and an absent key) give
// kGpt2; "smollm", "starcoder" kSmolLM; "llama-bpe", "llama3" kLlama3; "qwen2" kQwen2.
// Anything else is NotSupported naming the value.
Status PreTokenizerFromName(std::string_view name, PreTokenizerKind* kind);
const char* PreTokenizerName(PreTokenizerKind kind);

// Appends the words of `text` (valid UTF-8) in order; their concatenation is `text`.
void PreTokenize(PreTokenizerKind kind, std::string_view text,
                 std::vector<std::string_view>* words);

}  // namespace strata
