// Tokenizer: text <-> token ids from a GGUF file's tokenizer.ggml.* metadata.
//
// Two models: byte-level BPE ("gpt2": SmolLM2, Qwen, Llama 3, with the pre-tokenizer the
// file's tokenizer.ggml.pre names) and SentencePiece ("llama": Llama 2). Special tokens
// (control/user-defined) are matched in the text when parse_special is set.
// Immutable after construction; safe to use from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

class GgufFile;

class Tokenizer {
 public:
  static Status FromGguf(const GgufFile& gguf, std::unique_ptr<Tokenizer>* out);
  virtual ~Tokenizer() = default;

  // Encodes UTF-8 text. add_bos: prepend BOS when the model asks for it
  // (tokenizer.ggml.add_bos_token). parse_special: "<|im_start|>" etc. become their ids.
  // Invalid UTF-8 is an error that names the byte offset.
  virtual Status Encode(std::string_view text, bool add_bos, bool parse_special,
                        std::vector<int32_t>* out) const = 0;
  // The bytes a token stands for (may be part of a UTF-8 sequence). Control tokens give
  // their text ("<|im_end|>") only when `special` is set, otherwise "".
  virtual std::string TokenBytes(int32_t id, bool special = false) const = 0;
  std::string Decode(std::span<const int32_t> ids, bool special = false) const;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos() const = 0;  // -1 when none
  virtual int32_t eos() const = 0;
  // End of generation: EOS, and end-of-turn tokens such as <|im_end|> or <|eot_id|>.
  virtual bool IsEndOfGeneration(int32_t id) const = 0;
  virtual bool IsControl(int32_t id) const = 0;
  // The id of a token by its exact text, -1 if absent.
  virtual int32_t Find(std::string_view token_text) const = 0;
};

// Turns a stream of token bytes into whole UTF-8 characters: Push returns the complete
// characters so far and keeps a trailing partial sequence for the next Push. Invalid
// sequences come out as U+FFFD so a caller never prints broken UTF-8.
class Utf8Stream {
 public:
  std::string Push(std::string_view bytes);
  std::string Flush();  // whatever is pending (a partial sequence becomes U+FFFD)

 private:
  std::string pending_;
};

// True when `s` is valid UTF-8; otherwise *bad_offset gets the first bad byte's offset.
bool IsValidUtf8(std::string_view s, size_t* bad_offset);

}  // namespace strata
