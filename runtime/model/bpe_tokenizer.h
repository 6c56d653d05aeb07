// BpeTokenizer: byte-level BPE (tokenizer.ggml.model "gpt2": SmolLM2, Qwen, Llama 3).
//
// Text is split at special tokens, pre-tokenized into words (pretokenizer.h), each word's
// bytes are mapped to GPT-2's printable code points and merged pairwise by merge rank
// (lowest first, leftmost on ties). A byte whose code point has no token (SmolLM2 lacks a
// few control bytes such as 0x04) encodes to nothing, as llama.cpp does.
// Immutable after Create; safe from many threads.
#pragma once

#include <array>
#include <memory>
#include <unordered_map>

#include "runtime/model/pretokenizer.h"
#include "runtime/model/tokenizer.h"
#include "runtime/model/vocab.h"

namespace strata {

class BpeTokenizer final : public VocabTokenizer {
 public:
  static Status Create(const GgufFile& gguf, std::unique_ptr<Tokenizer>* out);

  Status Encode(std::string_view text, bool add_bos, bool parse_special,
                std::vector<int32_t>* out) const override;
  PreTokenizerKind pre_tokenizer() const { return pre_; }

 private:
  BpeTokenizer() = default;
  // Appends the ids of one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  PreTokenizerKind pre_ = PreTokenizerKind::kGpt2;
  // Llama 3 emits a word that is itself a token without merging (its tokenizer's
  // ignore_merges), which can differ from what the merges would build.
  bool ignore_merges_ = false;
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  // (left id << 32 | right id) -> merge; only merges whose parts and result are tokens.
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_token_{};   // token of each byte's code point, or -1
  std::array<std::string, 256> byte_text_;  // that code point in UTF-8
};

}  // namespace strata
