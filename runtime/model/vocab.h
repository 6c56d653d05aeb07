// Vocab: the token table shared by the tokenizer models (tokenizer.ggml.tokens, token
// types, scores, special ids) and the split of a text at special tokens.
//
// Internal to runtime/model (BpeTokenizer, SpmTokenizer derive from VocabTokenizer).
// Immutable after Load; safe to read from many threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "runtime/model/tokenizer.h"

namespace strata {

class GgufFile;

// The values of tokenizer.ggml.token_type (the GGUF convention, from SentencePiece).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct Vocab {
  Vocab() = default;
  Vocab(const Vocab&) = delete;  // id_of holds views into text
  Vocab& operator=(const Vocab&) = delete;

  std::vector<std::string> text;
  std::vector<TokenType> type;
  std::vector<float> score;  // empty when the file has no tokenizer.ggml.scores
  std::unordered_map<std::string_view, int32_t> id_of;  // views into `text`
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1;
  bool add_bos = false;
  // Tokens matched in raw text before the model runs: control and unknown tokens when
  // parse_special is set, user-defined ones always. Longest first (ties by id).
  std::vector<int32_t> specials;
  std::unordered_set<int32_t> end_of_generation;

  int32_t n() const { return static_cast<int32_t>(text.size()); }
  int32_t Find(std::string_view s) const {
    auto it = id_of.find(s);
    return it == id_of.end() ? -1 : it->second;
  }
  bool IsControl(int32_t id) const {
    return id >= 0 && id < n() && type[id] == TokenType::kControl;
  }
};

// Reads the table from the GGUF metadata. `default_add_bos` applies when the file has no
// tokenizer.ggml.add_bos_token (SentencePiece models add BOS by default, BPE ones do not).
Status LoadVocab(const GgufFile& gguf, bool default_add_bos, Vocab* vocab);

// One piece of text between special tokens, or one special token (token >= 0).
struct TextFragment {
  std::string_view text;
  int32_t token = -1;
};
// Splits `text` at the special tokens it contains. Tokens are taken longest first, each
// splitting all raw pieces left by the longer ones, so a special token is never split.
void SplitAtSpecials(const Vocab& vocab, std::string_view text, bool parse_special,
                     std::vector<TextFragment>* out);

// What the tokenizer models share over their Vocab: the ids, the specials and each token's
// bytes (decoded_, which each model fills at Create its own way).
class VocabTokenizer : public Tokenizer {
 public:
  std::string TokenBytes(int32_t id, bool special = false) const override;
  int32_t n_vocab() const override { return vocab_.n(); }
  int32_t bos() const override { return vocab_.bos; }
  int32_t eos() const override { return vocab_.eos; }
  bool IsEndOfGeneration(int32_t id) const override {
    return vocab_.end_of_generation.count(id) != 0;
  }
  bool IsControl(int32_t id) const override { return vocab_.IsControl(id); }
  int32_t Find(std::string_view token_text) const override { return vocab_.Find(token_text); }

 protected:
  Vocab vocab_;
  std::vector<std::string> decoded_;  // the raw bytes of each token
};

}  // namespace strata
