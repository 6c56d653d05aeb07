#include "runtime/model/pretokenizer.h"

#include <unicode/uchar.h>

#include <array>
#include <cstdint>
#include <string>

namespace strata {

namespace {

// Character classes of the split regexes. kOther is any valid code point that is neither
// letter, number nor white space ([^\s\p{L}\p{N}]); 0 stands for "past the fragment".
enum : uint8_t { kLetter = 1, kNumber = 2, kSpace = 4, kOther = 8 };

uint8_t ClassOf(uint32_t c) {
  // \s is the Unicode White_Space property; \p{L} and \p{N} are the general categories
  // L* and N*, as in the regexes' original (Python regex / Oniguruma) semantics.
  if (u_isUWhiteSpace(static_cast<UChar32>(c))) return kSpace;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return kNumber;
    default:
      return kOther;
  }
}

// Decoded code points with their byte offsets and classes (offset[n] == text.size()).
struct CodePoints {
  std::vector<uint32_t> cp;
  std::vector<uint32_t> offset;
  std::vector<uint8_t> cls;
};

void Decode(std::string_view text, CodePoints* out) {
  static const auto kAscii = [] {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = ClassOf(c);
    return t;
  }();
  out->cp.clear();
  out->offset.clear();
  out->cls.clear();
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    uint32_t c = s[i];
    size_t len = 1;
    // The caller validated the text, so lead bytes tell the length.
    if (c >= 0xF0) {
      c = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
          (s[i + 3] & 0x3F);
      len = 4;
    } else if (c >= 0xE0) {
      c = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
      len = 3;
    } else if (c >= 0xC0) {
      c = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
      len = 2;
    }
    out->cp.push_back(c);
    out->offset.push_back(static_cast<uint32_t>(i));
    out->cls.push_back(c < 128 ? kAscii[c] : ClassOf(c));
    i += len;
  }
  out->offset.push_back(static_cast<uint32_t>(text.size()));
}

// Splits code points [begin, end) of one fragment; emits word boundaries through `cut`.
class Scanner {
 public:
  Scanner(const CodePoints& cps, size_t begin, size_t end) : c_(cps), begin_(begin), end_(end) {}

  uint32_t Cp(size_t i) const { return i < end_ ? c_.cp[i] : 0xFFFFFFFFu; }
  uint8_t Cls(size_t i) const { return i < end_ ? c_.cls[i] : 0; }
  static uint32_t Lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

  // 's 't 're 've 'm 'll 'd at i: the length matched (0 if none).
  size_t Contraction(size_t i, bool any_case) const {
    if (Cp(i) != '\'') return 0;
    auto norm = [&](uint32_t c) { return any_case ? Lower(c) : c; };
    const uint32_t a = norm(Cp(i + 1));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    const uint32_t b = norm(Cp(i + 2));
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }
  size_t RunOf(size_t i, uint8_t cls) const {
    while (Cls(i) & cls) ++i;
    return i;
  }
  // Trailing white space: \s+(?!\S) leaves the last space of a run for the next word;
  // \s+ takes a run that ends the fragment (or a lone space before a non-space).
  size_t WhiteSpace(size_t i) const {
    const size_t run_end = RunOf(i, kSpace);
    const size_t n = run_end - i;
    if (n > 1 && run_end < end_) return run_end - 1;
    return n > 0 ? run_end : i + 1;
  }

  template <typename Cut>
  void Gpt2(Cut cut) const {
    size_t i = begin_;
    while (i < end_) {
      size_t next;
      const uint32_t c = Cp(i);
      const uint8_t cls = c == ' ' ? Cls(i + 1) : Cls(i);
      const size_t skip = c == ' ' ? 1 : 0;
      if (size_t n = Contraction(i, /*any_case=*/false)) {
        next = i + n;
      } else if (cls == kLetter || cls == kNumber || cls == kOther) {
        next = RunOf(i + skip, cls);
      } else {
        next = WhiteSpace(i);
      }
      cut(next);
      i = next;
    }
  }

  template <typename Cut>
  void Llama3(size_t max_digits, Cut cut) const {
    size_t i = begin_;
    while (i < end_) {
      size_t next;
      const uint32_t c = Cp(i);
      const bool newline = c == '\r' || c == '\n';
      if (size_t n = Contraction(i, /*any_case=*/true)) {
        next = i + n;
      } else if (!newline && Cls(i) != kNumber && (Cls(i) == kLetter || Cls(i + 1) == kLetter)) {
        // [^\r\n\p{L}\p{N}]?\p{L}+
        next = RunOf(i + 1, kLetter);
      } else if (Cls(i) == kNumber) {
        next = i;
        while (next < end_ && next - i < max_digits && Cls(next) == kNumber) ++next;
      } else if ((c == ' ' ? Cls(i + 1) : Cls(i)) == kOther) {
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        next = RunOf(i + (c == ' ' ? 1 : 0), kOther);
        while (Cp(next) == '\r' || Cp(next) == '\n') ++next;
      } else {
        // \s*[\r\n]+ takes white space up to its last line break; otherwise as GPT-2.
        const size_t run_end = RunOf(i, kSpace);
        size_t last_break = 0;
        for (size_t j = i; j < run_end; ++j) {
          if (Cp(j) == '\r' || Cp(j) == '\n') last_break = j + 1;
        }
        next = last_break ? last_break : WhiteSpace(i);
      }
      cut(next);
      i = next;
    }
  }

 private:
  const CodePoints& c_;
  size_t begin_, end_;
};

}  // namespace

Status PreTokenizerFromName(std::string_view name, PreTokenizerKind* kind) {
  if (name == "gpt2" || name == "default" || name.empty()) {
    *kind = PreTokenizerKind::kGpt2;
  } else if (name == "smollm" || name == "starcoder") {
    *kind = PreTokenizerKind::kSmolLM;
  } else if (name == "llama-bpe" || name == "llama3") {
    *kind = PreTokenizerKind::kLlama3;
  } else if (name == "qwen2") {
    *kind = PreTokenizerKind::kQwen2;
  } else {
    return Status::NotSupported("tokenizer.ggml.pre '" + std::string(name) +
                                "' is not supported (gpt2, default, smollm, starcoder, "
                                "llama-bpe, qwen2 are)");
  }
  return Status::OK();
}

const char* PreTokenizerName(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return "gpt2";
    case PreTokenizerKind::kSmolLM:
      return "smollm";
    case PreTokenizerKind::kLlama3:
      return "llama-bpe";
    case PreTokenizerKind::kQwen2:
      return "qwen2";
  }
  return "?";
}

void PreTokenize(PreTokenizerKind kind, std::string_view text,
                 std::vector<std::string_view>* words) {
  if (text.empty()) return;
  thread_local CodePoints cps;
  Decode(text, &cps);
  size_t word_begin = 0;  // code point index where the current word starts
  auto cut = [&](size_t cp_end) {
    if (cp_end <= word_begin) return;
    const uint32_t b = cps.offset[word_begin], e = cps.offset[cp_end];
    words->push_back(text.substr(b, e - b));
    word_begin = cp_end;
  };
  const size_t n = cps.cp.size();
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      Scanner(cps, 0, n).Gpt2(cut);
      break;
    case PreTokenizerKind::kSmolLM: {
      // Every number is a fragment of its own; the runs between them go through GPT-2.
      size_t frag = 0;
      for (size_t i = 0; i <= n; ++i) {
        if (i < n && cps.cls[i] != kNumber) continue;
        Scanner(cps, frag, i).Gpt2(cut);
        if (i < n) cut(i + 1);
        frag = i + 1;
      }
      break;
    }
    case PreTokenizerKind::kLlama3:
      Scanner(cps, 0, n).Llama3(3, cut);
      break;
    case PreTokenizerKind::kQwen2:
      Scanner(cps, 0, n).Llama3(1, cut);
      break;
  }
}

}  // namespace strata
