// SpmTokenizer: SentencePiece-style BPE (tokenizer.ggml.model "llama": Llama 2 and
// relatives).
//
// Spaces become U+2581 ("▁"), with one prepended to the text and after each special token
// when tokenizer.ggml.add_space_prefix is set (the default). Characters are merged
// pairwise, always taking the pair whose merged piece has the highest score (leftmost on
// ties), while the merged piece is in the vocabulary; characters with no piece fall back
// to the <0xXX> byte tokens, or to the unknown token. Decoding turns "▁" back into a space
// and keeps the prefix space (as llama.cpp's token pieces do); a caller printing a reply
// may drop it. Immutable; safe from many threads.
#pragma once

#include <array>
#include <memory>

#include "runtime/model/tokenizer.h"
#include "runtime/model/vocab.h"

namespace strata {

class SpmTokenizer final : public VocabTokenizer {
 public:
  static Status Create(const GgufFile& gguf, std::unique_ptr<Tokenizer>* out);

  Status Encode(std::string_view text, bool add_bos, bool parse_special,
                std::vector<int32_t>* out) const override;

 private:
  SpmTokenizer() = default;
  // Appends the ids of one fragment of text already in "▁" form.
  void EncodePiece(std::string_view text, std::vector<int32_t>* out) const;

  bool add_space_prefix_ = true;
  std::array<int32_t, 256> byte_token_{};  // <0xXX> tokens, -1 where absent
};

}  // namespace strata
