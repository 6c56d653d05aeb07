#include "runtime/model/spm_tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "runtime/model/gguf.h"

namespace strata {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

size_t Utf8Length(uint8_t lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t at; (at = s.find(from)) != std::string_view::npos;) {
    out.append(s.substr(0, at)).append(to);
    s.remove_prefix(at + from.size());
  }
  out.append(s);
  return out;
}

// "<0x41>" -> 0x41; -1 when the text is not a byte token's.
int ParseByteToken(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= c - '0';
    else if (c >= 'A' && c <= 'F')
      v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      v |= c - 'a' + 10;
    else
      return -1;
  }
  return v;
}

}  // namespace

Status SpmTokenizer::Create(const GgufFile& g, std::unique_ptr<Tokenizer>* out) {
  std::unique_ptr<SpmTokenizer> t(new SpmTokenizer());
  STRATA_RETURN_IF_ERROR(LoadVocab(g, /*default_add_bos=*/true, &t->vocab_));
  if (g.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetBool("tokenizer.ggml.add_space_prefix", &t->add_space_prefix_));
  }
  t->byte_token_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_token_[b] = t->vocab_.Find(name);
  }
  t->decoded_.resize(t->vocab_.n());
  for (int32_t i = 0; i < t->vocab_.n(); ++i) {
    const std::string& text = t->vocab_.text[i];
    switch (t->vocab_.type[i]) {
      case TokenType::kControl:
      case TokenType::kUnknown:
        break;  // text only on request (TokenBytes special)
      case TokenType::kByte: {
        const int b = ParseByteToken(text);
        if (b < 0) {
          return Status::Corruption(g.path() + ": token " + std::to_string(i) + " '" + text +
                                    "' has type byte but is not of the form <0xXX>");
        }
        t->decoded_[i] = std::string(1, static_cast<char>(b));
        break;
      }
      default:
        t->decoded_[i] = ReplaceAll(text, kSpaceMark, " ");
        break;
    }
  }
  *out = std::move(t);
  return Status::OK();
}

void SpmTokenizer::EncodePiece(std::string_view text, std::vector<int32_t>* out) const {
  struct Symbol {
    uint32_t begin, len;  // bytes of text
    int32_t prev, next;
  };
  struct Candidate {
    float score;
    int32_t left, right;
    uint32_t left_len, right_len;
  };
  // Max-heap on score; among equal scores the leftmost pair first.
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.clear();
  heap.clear();
  for (uint32_t i = 0; i < text.size();) {
    const uint32_t len = static_cast<uint32_t>(
        std::min<size_t>(Utf8Length(static_cast<uint8_t>(text[i])), text.size() - i));
    const int32_t idx = static_cast<int32_t>(sym.size());
    sym.push_back({i, len, idx - 1, -1});
    if (idx > 0) sym[idx - 1].next = idx;
    i += len;
  }
  auto consider = [&](int32_t left) {
    if (left < 0 || sym[left].next < 0) return;
    const int32_t right = sym[left].next;
    const int32_t id = vocab_.Find(text.substr(sym[left].begin, sym[left].len + sym[right].len));
    if (id < 0) return;
    const float score = vocab_.score.empty() ? 0.f : vocab_.score[id];
    heap.push_back({score, left, right, sym[left].len, sym[right].len});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = sym[c.left];
    // Skip pairs that an earlier merge changed (a symbol only grows, so lengths tell).
    if (l.len != c.left_len || l.next != c.right || sym[c.right].len != c.right_len) continue;
    Symbol& r = sym[c.right];
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    r.len = 0;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].begin, sym[i].len);
    const int32_t id = vocab_.Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (unsigned char b : piece) {
      const int32_t bt = byte_token_[b] >= 0 ? byte_token_[b] : vocab_.unk;
      if (bt >= 0) out->push_back(bt);
    }
  }
}

Status SpmTokenizer::Encode(std::string_view text, bool add_bos, bool parse_special,
                            std::vector<int32_t>* out) const {
  out->clear();
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return Status::InvalidArgument("Encode: invalid UTF-8 at byte offset " + std::to_string(bad) +
                                   " (byte " + std::to_string(static_cast<uint8_t>(text[bad])) +
                                   ")");
  }
  if (add_bos && vocab_.add_bos && vocab_.bos >= 0) out->push_back(vocab_.bos);
  thread_local std::vector<TextFragment> fragments;
  SplitAtSpecials(vocab_, text, parse_special, &fragments);
  bool after_special = true;  // the text's start counts as "after a special token"
  std::string piece;
  for (const TextFragment& f : fragments) {
    if (f.token >= 0) {
      out->push_back(f.token);
      after_special = true;
      continue;
    }
    piece.clear();
    if (add_space_prefix_ && after_special) piece = kSpaceMark;
    piece += ReplaceAll(f.text, " ", kSpaceMark);
    EncodePiece(piece, out);
    after_special = false;
  }
  return Status::OK();
}

}  // namespace strata
