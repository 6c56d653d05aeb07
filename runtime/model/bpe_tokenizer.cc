#include "runtime/model/bpe_tokenizer.h"

#include <algorithm>

#include "runtime/model/gguf.h"

namespace strata {

namespace {

// GPT-2's byte <-> code point table: printable Latin-1 bytes stand for themselves, the
// other 68 bytes (controls, space, DEL, NBSP, soft hyphen) take 256, 257, ... in byte
// order, so every byte has a visible, non-space character.
std::array<uint32_t, 256> ByteCodePoints() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

void AppendUtf8(uint32_t c, std::string* s) {
  if (c < 0x80) {
    s->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    s->push_back(static_cast<char>(0xC0 | (c >> 6)));
    s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    s->push_back(static_cast<char>(0xE0 | (c >> 12)));
    s->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    s->push_back(static_cast<char>(0xF0 | (c >> 18)));
    s->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Maps a token's text (GPT-2 code points) back to the bytes it stands for. Code points
// outside the table (none in a well-formed vocabulary) pass through as UTF-8.
std::string DecodeByteLevel(std::string_view text, const std::array<int, 512>& byte_of_cp) {
  std::string out;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();) {
    uint32_t c = s[i];
    size_t len = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < text.size()) {
      c = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
      len = 2;
    }
    if (c < byte_of_cp.size() && byte_of_cp[c] >= 0 && (len == 2 || c < 0x80)) {
      out.push_back(static_cast<char>(byte_of_cp[c]));
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

}  // namespace

Status BpeTokenizer::Create(const GgufFile& g, std::unique_ptr<Tokenizer>* out) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  STRATA_RETURN_IF_ERROR(LoadVocab(g, /*default_add_bos=*/false, &t->vocab_));
  std::string pre;
  if (g.Find("tokenizer.ggml.pre") != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetString("tokenizer.ggml.pre", &pre));
  }
  Status s = PreTokenizerFromName(pre, &t->pre_);
  if (!s.ok()) return s.WithContext(g.path());
  t->ignore_merges_ = t->pre_ == PreTokenizerKind::kLlama3;

  const std::array<uint32_t, 256> cps = ByteCodePoints();
  std::array<int, 512> byte_of_cp;
  byte_of_cp.fill(-1);
  for (int b = 0; b < 256; ++b) {
    byte_of_cp[cps[b]] = b;
    AppendUtf8(cps[b], &t->byte_text_[b]);
    // -1 when the vocabulary has no token for the byte (SmolLM2 lacks a few control
    // bytes); such bytes encode to nothing, as in the reference tokenizer.
    t->byte_token_[b] = t->vocab_.Find(t->byte_text_[b]);
  }

  const std::vector<std::string_view>* merges = nullptr;
  STRATA_RETURN_IF_ERROR(g.GetStringArray("tokenizer.ggml.merges", &merges));
  t->merges_.reserve(merges->size());
  std::string joined;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string_view m = (*merges)[rank];
    const size_t sp = m.find(' ', 1);  // a part may itself be a lone space-char
    if (sp == std::string_view::npos || sp + 1 >= m.size()) {
      return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.merges' entry " +
                                std::to_string(rank) + " '" + std::string(m) +
                                "' is not two tokens separated by a space");
    }
    const std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
    joined.assign(left).append(right);
    const int32_t l = t->vocab_.Find(left), r = t->vocab_.Find(right);
    const int32_t res = t->vocab_.Find(joined);
    // A merge whose parts or result are not tokens can never fire on token ids.
    if (l < 0 || r < 0 || res < 0) continue;
    const uint64_t key = (uint64_t(uint32_t(l)) << 32) | uint32_t(r);
    t->merges_.emplace(key, Merge{static_cast<int32_t>(rank), res});  // first rank wins
  }

  t->decoded_.resize(t->vocab_.n());
  for (int32_t i = 0; i < t->vocab_.n(); ++i) {
    switch (t->vocab_.type[i]) {
      case TokenType::kControl:
      case TokenType::kUnknown:
        break;  // text only on request (TokenBytes special)
      case TokenType::kUserDefined:
        t->decoded_[i] = t->vocab_.text[i];
        break;
      default:
        t->decoded_[i] = DecodeByteLevel(t->vocab_.text[i], byte_of_cp);
        break;
    }
  }
  *out = std::move(t);
  return Status::OK();
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() == 1) {
    const int32_t id = byte_token_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out->push_back(id);
    return;
  }
  if (ignore_merges_) {
    thread_local std::string mapped;
    mapped.clear();
    for (unsigned char b : word) mapped += byte_text_[b];
    const int32_t id = vocab_.Find(mapped);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // index of the left symbol; the order of indices is text order
    int32_t right;
    int32_t left_id, right_id, result;
  };
  // Min-heap on (rank, left): the lowest-ranked merge first, the leftmost among equals.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.resize(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    sym[i] = {byte_token_[static_cast<uint8_t>(word[i])], static_cast<int32_t>(i) - 1,
              i + 1 < word.size() ? static_cast<int32_t>(i + 1) : -1};
  }
  heap.clear();
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const uint64_t key = (uint64_t(uint32_t(sym[left].id)) << 32) | uint32_t(sym[right].id);
    auto it = merges_.find(key);
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, right, sym[left].id, sym[right].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(word.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    // Skip pairs that an earlier merge changed.
    if (sym[c.left].id != c.left_id || sym[c.left].next != c.right ||
        sym[c.right].id != c.right_id) {
      continue;
    }
    sym[c.left].id = c.result;
    sym[c.left].next = sym[c.right].next;
    if (sym[c.right].next >= 0) sym[sym[c.right].next].prev = c.left;
    sym[c.right].id = -1;
    consider(sym[c.left].prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) out->push_back(sym[i].id);
  }
}

Status BpeTokenizer::Encode(std::string_view text, bool add_bos, bool parse_special,
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
  thread_local std::vector<std::string_view> words;
  SplitAtSpecials(vocab_, text, parse_special, &fragments);
  for (const TextFragment& f : fragments) {
    if (f.token >= 0) {
      out->push_back(f.token);
      continue;
    }
    words.clear();
    PreTokenize(pre_, f.text, &words);
    for (std::string_view w : words) EncodeWord(w, out);
  }
  return Status::OK();
}

}  // namespace strata
