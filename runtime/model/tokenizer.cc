#include "runtime/model/tokenizer.h"

#include "runtime/model/bpe_tokenizer.h"
#include "runtime/model/gguf.h"
#include "runtime/model/spm_tokenizer.h"

namespace strata {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at s[0..n): > 0 when complete and valid, 0 when it is
// a valid but incomplete prefix (more bytes could complete it), -1 when invalid.
// Follows RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
int SequenceLength(const uint8_t* s, size_t n) {
  const uint8_t b0 = s[0];
  if (b0 < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= n) return 0;
    const uint8_t lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
    if (s[i] < lo_i || s[i] > hi_i) return -1;
  }
  return len;
}

}  // namespace

Status Tokenizer::FromGguf(const GgufFile& gguf, std::unique_ptr<Tokenizer>* out) {
  std::string model;
  STRATA_RETURN_IF_ERROR(gguf.GetString("tokenizer.ggml.model", &model));
  if (model == "gpt2") return BpeTokenizer::Create(gguf, out);
  if (model == "llama") return SpmTokenizer::Create(gguf, out);
  return Status::NotSupported(gguf.path() + ": tokenizer.ggml.model '" + model +
                              "' is not supported (gpt2, llama are)");
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool special) const {
  std::string out;
  for (int32_t id : ids) out += TokenBytes(id, special);
  return out;
}

bool IsValidUtf8(std::string_view s, size_t* bad_offset) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {  // ASCII runs dominate real text
      ++i;
      continue;
    }
    const int len = SequenceLength(p + i, s.size() - i);
    if (len <= 0) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string Utf8Stream::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto* p = reinterpret_cast<const uint8_t*>(pending_.data());
  size_t i = 0;
  while (i < pending_.size()) {
    const int len = SequenceLength(p + i, pending_.size() - i);
    if (len == 0) break;  // keep the incomplete tail for the next push
    if (len < 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    out.append(pending_, i, static_cast<size_t>(len));
    i += static_cast<size_t>(len);
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace strata
