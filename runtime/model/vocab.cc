#include "runtime/model/vocab.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/model/gguf.h"

namespace strata {

namespace {

// End-of-turn markers of the chat families this runtime knows; generation stops on them
// whatever their declared type (ChatML, Llama 3, Phi/Gemma-style, generic end-of-text).
constexpr std::string_view kEndOfTurnTexts[] = {
    "<|im_end|>",    "<|eot_id|>", "<|eom_id|>",    "<|end_of_text|>",
    "<|endoftext|>", "<|end|>",    "<end_of_turn>", "<EOT>",
};

Status OptionalId(const GgufFile& g, std::string_view key, int32_t n, int32_t* out) {
  if (g.Find(key) == nullptr) return Status::OK();
  uint32_t id = 0;
  STRATA_RETURN_IF_ERROR(g.GetU32(key, &id));
  if (id >= static_cast<uint32_t>(n)) {
    return Status::Corruption(g.path() + ": metadata '" + std::string(key) + "' value " +
                              std::to_string(id) + " is not a token id (vocabulary of " +
                              std::to_string(n) + ")");
  }
  *out = static_cast<int32_t>(id);
  return Status::OK();
}

}  // namespace

Status LoadVocab(const GgufFile& g, bool default_add_bos, Vocab* v) {
  const std::vector<std::string_view>* tokens = nullptr;
  STRATA_RETURN_IF_ERROR(g.GetStringArray("tokenizer.ggml.tokens", &tokens));
  if (tokens->empty()) {
    return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.tokens' is empty");
  }
  if (tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.tokens' has " +
                              std::to_string(tokens->size()) + " entries (limit 2^31-1)");
  }
  const int32_t n = static_cast<int32_t>(tokens->size());
  v->text.reserve(n);
  for (std::string_view t : *tokens) v->text.emplace_back(t);

  v->type.assign(n, TokenType::kNormal);
  if (g.Find("tokenizer.ggml.token_type") != nullptr) {
    std::vector<int32_t> types;
    STRATA_RETURN_IF_ERROR(g.GetI32Array("tokenizer.ggml.token_type", &types));
    if (types.size() != static_cast<size_t>(n)) {
      return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.token_type' has " +
                                std::to_string(types.size()) + " entries for " + std::to_string(n) +
                                " tokens");
    }
    for (int32_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > static_cast<int32_t>(TokenType::kByte)) {
        return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.token_type' entry " +
                                  std::to_string(i) + " has the unknown type " +
                                  std::to_string(types[i]) + " (0..6 known)");
      }
      v->type[i] = static_cast<TokenType>(types[i]);
    }
  }
  if (g.Find("tokenizer.ggml.scores") != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetF32Array("tokenizer.ggml.scores", &v->score));
    if (v->score.size() != static_cast<size_t>(n)) {
      return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.scores' has " +
                                std::to_string(v->score.size()) + " entries for " +
                                std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < v->score.size(); ++i) {
      if (std::isnan(v->score[i])) {
        return Status::Corruption(g.path() + ": metadata 'tokenizer.ggml.scores' entry " +
                                  std::to_string(i) + " is NaN");
      }
    }
  }
  // A later duplicate wins, as in the reference tokenizers.
  v->id_of.reserve(n);
  for (int32_t i = 0; i < n; ++i) v->id_of[v->text[i]] = i;

  STRATA_RETURN_IF_ERROR(OptionalId(g, "tokenizer.ggml.bos_token_id", n, &v->bos));
  STRATA_RETURN_IF_ERROR(OptionalId(g, "tokenizer.ggml.eos_token_id", n, &v->eos));
  STRATA_RETURN_IF_ERROR(OptionalId(g, "tokenizer.ggml.eot_token_id", n, &v->eot));
  STRATA_RETURN_IF_ERROR(OptionalId(g, "tokenizer.ggml.eom_token_id", n, &v->eom));
  STRATA_RETURN_IF_ERROR(OptionalId(g, "tokenizer.ggml.unknown_token_id", n, &v->unk));
  v->add_bos = default_add_bos;
  if (g.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    STRATA_RETURN_IF_ERROR(g.GetBool("tokenizer.ggml.add_bos_token", &v->add_bos));
  }

  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = v->type[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !v->text[i].empty()) {
      v->specials.push_back(i);
    }
  }
  std::stable_sort(v->specials.begin(), v->specials.end(),
                   [&](int32_t a, int32_t b) { return v->text[a].size() > v->text[b].size(); });

  for (int32_t id : {v->eos, v->eot, v->eom}) {
    if (id >= 0) v->end_of_generation.insert(id);
  }
  for (std::string_view s : kEndOfTurnTexts) {
    const int32_t id = v->Find(s);
    if (id >= 0) v->end_of_generation.insert(id);
  }
  return Status::OK();
}

void SplitAtSpecials(const Vocab& vocab, std::string_view text, bool parse_special,
                     std::vector<TextFragment>* out) {
  out->clear();
  if (text.empty()) return;
  out->push_back({text, -1});
  std::vector<TextFragment> next;
  for (int32_t id : vocab.specials) {
    const TokenType t = vocab.type[id];
    if (!parse_special && t != TokenType::kUserDefined) continue;
    const std::string& s = vocab.text[id];
    // Cheap rejection: most texts contain few special tokens, so test for the token in any
    // raw fragment before rebuilding the list.
    bool any = false;
    for (const TextFragment& f : *out) {
      if (f.token < 0 && f.text.find(s) != std::string_view::npos) {
        any = true;
        break;
      }
    }
    if (!any) continue;
    next.clear();
    for (const TextFragment& f : *out) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(s)) != std::string_view::npos;) {
        if (at > 0) next.push_back({rest.substr(0, at), -1});
        next.push_back({std::string_view(), id});
        rest.remove_prefix(at + s.size());
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    out->swap(next);
  }
}

std::string VocabTokenizer::TokenBytes(int32_t id, bool special) const {
  if (id < 0 || id >= vocab_.n()) return std::string();
  const TokenType t = vocab_.type[id];
  if (t == TokenType::kControl || t == TokenType::kUnknown)
    return special ? vocab_.text[id] : std::string();
  return decoded_[id];
}

}  // namespace strata
