#include "runtime/model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "runtime/model/pretokenizer.h"

namespace strata {

namespace {

using kernels::DType;

const char kTrainingText[] =
    "The quick brown fox jumps over the lazy dog. A small model runs on a small device, and "
    "the cache of keys and values lives on the disk. When the user asks a question, the "
    "assistant answers with care: it reads the context, it predicts the next token, and it "
    "stops at the end of the turn. Hello world! Hello there, how are you today? I am fine, "
    "thank you. The numbers 1, 2, 3 and 2024 are here too. Shall I compare thee to a "
    "summer's day? Thou art more lovely and more temperate. It's a test; don't worry.";

// splitmix64: a small, well-mixed generator (Steele et al., "Fast splittable PRNGs").
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(Next() >> 40) / static_cast<float>(1 << 24);
  }

 private:
  uint64_t s_;
};

// ---- Vocabulary ----------------------------------------------------------------------

struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;
  std::vector<std::string> merges;  // "left right"
};

// Learns up to `max_merges` BPE merges over words given as symbol sequences: the most
// frequent adjacent pair first, ties broken by the pair's text so results are stable.
std::vector<std::pair<std::string, std::string>> LearnMerges(
    std::vector<std::vector<std::string>> words, size_t max_merges) {
  std::vector<std::pair<std::string, std::string>> merges;
  std::set<std::string> known;
  for (const auto& w : words) known.insert(w.begin(), w.end());
  while (merges.size() < max_merges) {
    std::map<std::pair<std::string, std::string>, int> count;
    for (const auto& w : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) ++count[{w[i], w[i + 1]}];
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 0;
    for (const auto& [pair, n] : count) {
      if (n > best_n && !known.count(pair.first + pair.second)) {
        best = &pair;
        best_n = n;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    merges.push_back(merge);
    known.insert(merge.first + merge.second);
    for (auto& w : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == merge.first && w[i + 1] == merge.second) {
          out.push_back(merge.first + merge.second);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w = std::move(out);
    }
  }
  return merges;
}

void AppendUtf8(uint32_t c, std::string* s) {
  if (c < 0x80) {
    s->push_back(static_cast<char>(c));
  } else {  // the GPT-2 byte table only needs two-byte sequences (c < 0x800)
    s->push_back(static_cast<char>(0xC0 | (c >> 6)));
    s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string ByteLevelChar(uint8_t b) {
  uint32_t next = 256, cp = 0;
  for (uint32_t x = 0; x <= b; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    cp = printable ? x : next++;
  }
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

void PadVocab(int32_t n_vocab, SyntheticVocab* v) {
  while (static_cast<int32_t>(v->tokens.size()) < n_vocab) {
    v->tokens.push_back("<|unused_" + std::to_string(v->tokens.size()) + "|>");
    v->types.push_back(5);  // unused
    v->scores.push_back(-1e9f);
  }
}

SyntheticVocab BytePairVocab(int32_t n_vocab) {
  SyntheticVocab v;
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.types.push_back(3);  // control
  }
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteLevelChar(static_cast<uint8_t>(b)));
    v.types.push_back(1);
  }
  std::vector<std::string_view> words;
  PreTokenize(PreTokenizerKind::kSmolLM, kTrainingText, &words);
  std::vector<std::vector<std::string>> symbols;
  for (std::string_view w : words) {
    std::vector<std::string> syms;
    for (unsigned char b : w) syms.push_back(ByteLevelChar(b));
    symbols.push_back(std::move(syms));
  }
  const size_t room = n_vocab > static_cast<int32_t>(v.tokens.size())
                          ? static_cast<size_t>(n_vocab) - v.tokens.size()
                          : 0;
  for (const auto& [l, r] : LearnMerges(std::move(symbols), room)) {
    v.merges.push_back(l + " " + r);
    v.tokens.push_back(l + r);
    v.types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.f);
  PadVocab(n_vocab, &v);
  return v;
}

SyntheticVocab SentencePieceVocab(int32_t n_vocab) {
  SyntheticVocab v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {2, 3, 3};
  v.scores = {0.f, 0.f, 0.f};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.tokens.push_back(name);
    v.types.push_back(6);
    v.scores.push_back(0.f);
  }
  // Words as SentencePiece sees them: spaces as U+2581 in front of each word.
  const std::string mark = "\xE2\x96\x81";
  std::vector<std::vector<std::string>> words;
  std::set<std::string> chars;
  std::string_view text = kTrainingText;
  while (!text.empty()) {
    const size_t sp = text.find(' ', 1);
    std::string_view w = text.substr(0, sp);
    text.remove_prefix(sp == std::string_view::npos ? text.size() : sp);
    std::vector<std::string> syms{mark};
    for (size_t i = (w[0] == ' ' ? 1 : 0); i < w.size(); ++i) syms.push_back(std::string(1, w[i]));
    chars.insert(syms.begin(), syms.end());
    words.push_back(std::move(syms));
  }
  // Single characters score below every merged piece, earlier merges score higher.
  for (const std::string& c : chars) {
    if (static_cast<int32_t>(v.tokens.size()) >= n_vocab) break;
    v.tokens.push_back(c);
    v.types.push_back(1);
    v.scores.push_back(-1000.f);
  }
  const size_t room = n_vocab > static_cast<int32_t>(v.tokens.size())
                          ? static_cast<size_t>(n_vocab) - v.tokens.size()
                          : 0;
  int rank = 0;
  for (const auto& [l, r] : LearnMerges(std::move(words), room)) {
    v.tokens.push_back(l + r);
    v.types.push_back(1);
    v.scores.push_back(-static_cast<float>(++rank));
  }
  PadVocab(n_vocab, &v);
  return v;
}

// ---- Tensors -------------------------------------------------------------------------

// Offsets of the F16 scale fields in each quantized block (per the GGUF block layouts),
// and the value magnitude that keeps weights near `scale`.
struct ScaleFields {
  int d_at = -1, m_at = -1;  // m: the min/dmin field, -1 if none
  float d_div = 8.f;         // d = scale / d_div
};

ScaleFields ScalesOf(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return {0, -1, 8.f};
    case DType::kQ4_1:
      return {0, 2, 8.f};
    case DType::kQ5_0:
      return {0, -1, 16.f};
    case DType::kQ5_1:
      return {0, 2, 16.f};
    case DType::kQ8_0:
      return {0, -1, 128.f};
    case DType::kQ8_1:
      return {0, 2, 128.f};
    case DType::kQ2_K:
      return {80, 82, 64.f};
    case DType::kQ3_K:
      return {108, -1, 128.f};
    case DType::kQ4_K:
      return {0, 2, 256.f};
    case DType::kQ5_K:
      return {0, 2, 512.f};
    case DType::kQ6_K:
      return {208, -1, 1024.f};
    case DType::kIQ4_NL:
      return {0, -1, 128.f};  // grid values up to 127
    case DType::kIQ4_XS:
      return {0, -1, 4096.f};  // 6-bit signed scales (up to 32) times the grid (127)
    default:
      return {};
  }
}

std::vector<uint8_t> RandomTensor(DType type, int64_t cols, int64_t rows, float scale, float center,
                                  Rng* rng) {
  const kernels::TypeInfo& info = kernels::GetTypeInfo(type);
  const size_t n = static_cast<size_t>(cols * rows);
  std::vector<uint8_t> out;
  if (type == DType::kF32 || type == DType::kF16 || type == DType::kBF16) {
    out.resize(n * info.block_bytes);
    for (size_t i = 0; i < n; ++i) {
      const float f = center + rng->Uniform(-scale, scale);
      if (type == DType::kF32) {
        std::memcpy(out.data() + 4 * i, &f, 4);
      } else {
        const uint16_t h = type == DType::kF16 ? kernels::F32ToF16(f) : kernels::F32ToBF16(f);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
    return out;
  }
  const size_t blocks = n / info.block_elems;
  out.resize(blocks * info.block_bytes);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng->Next());
  const ScaleFields sf = ScalesOf(type);
  for (size_t blk = 0; blk < blocks; ++blk) {
    uint8_t* p = out.data() + blk * info.block_bytes;
    if (type == DType::kQ8_K) {
      const float d = scale / 128.f;
      std::memcpy(p, &d, 4);
      continue;
    }
    float d_value = 0.f;
    if (sf.d_at >= 0) {
      d_value = scale / sf.d_div * rng->Uniform(0.5f, 1.f);
      const uint16_t d = kernels::F32ToF16(d_value);
      std::memcpy(p + sf.d_at, &d, 2);
    }
    if (sf.m_at >= 0) {
      // *_1 formats add the min (w = d*q + m); K formats subtract dmin * a 6-bit min. A
      // real quantizer puts a block's min near -(levels/2)*d, so the block is centred on
      // zero; a fixed min would give every row the same large offset, which no real model
      // has and which makes a random network needlessly sensitive to rounding.
      const bool k_format = type == DType::kQ2_K || type == DType::kQ4_K || type == DType::kQ5_K;
      const float levels = type == DType::kQ5_1 ? 31.f : type == DType::kQ8_1 ? 255.f : 15.f;
      const float m =
          k_format ? scale / sf.d_div : -0.5f * levels * d_value * rng->Uniform(0.8f, 1.2f);
      const uint16_t h = kernels::F32ToF16(m);
      std::memcpy(p + sf.m_at, &h, 2);
    }
  }
  return out;
}

}  // namespace

const char* SyntheticTrainingText() { return kTrainingText; }

namespace {

// With `generate`, the tensors are made while the file is written (one in memory at a
// time); they draw from one random stream in the order they were added, which is the order
// they are written, so the file is the same either way.
Status Build(const SyntheticModelSpec& s, GgufWriter* w, bool generate) {
  const std::string a = s.arch;
  if (a != "llama" && a != "qwen2" && a != "qwen3") {
    return Status::InvalidArgument("synthetic model: arch '" + a + "' (llama, qwen2, qwen3)");
  }
  if (s.tokenizer != "gpt2" && s.tokenizer != "llama") {
    return Status::InvalidArgument("synthetic model: tokenizer '" + s.tokenizer +
                                   "' (gpt2, llama)");
  }
  const int32_t min_vocab = s.tokenizer == "gpt2" ? 259 : 262;
  if (s.n_vocab < min_vocab) {
    return Status::InvalidArgument("synthetic model: n_vocab " + std::to_string(s.n_vocab) +
                                   " is below the minimum " + std::to_string(min_vocab));
  }
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0 ||
      (s.head_dim == 0 && s.n_embd % s.n_head != 0)) {
    return Status::InvalidArgument("synthetic model: inconsistent head counts");
  }
  const int64_t hd = s.head_dim ? s.head_dim : s.n_embd / s.n_head;
  const int64_t rope_dim = s.rope_dim ? s.rope_dim : hd;

  w->AddString("general.architecture", a);
  w->AddString("general.name", "strata-synthetic-" + a);
  w->AddU32(a + ".context_length", s.n_ctx_train);
  w->AddU32(a + ".embedding_length", s.n_embd);
  w->AddU32(a + ".block_count", s.n_layer);
  w->AddU32(a + ".feed_forward_length", s.n_ff);
  w->AddU32(a + ".attention.head_count", s.n_head);
  w->AddU32(a + ".attention.head_count_kv", s.n_head_kv);
  if (s.head_dim) {
    // Real files state both (llama.cpp takes V's width from value_length alone).
    w->AddU32(a + ".attention.key_length", s.head_dim);
    w->AddU32(a + ".attention.value_length", s.head_dim);
  }
  w->AddF32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w->AddF32(a + ".rope.freq_base", s.rope_base);
  w->AddU32(a + ".rope.dimension_count", static_cast<uint32_t>(rope_dim));
  if (s.rope_linear_factor > 0) {
    w->AddString(a + ".rope.scaling.type", "linear");
    w->AddF32(a + ".rope.scaling.factor", s.rope_linear_factor);
  }
  if (s.rope_yarn_factor > 0) {
    w->AddString(a + ".rope.scaling.type", "yarn");
    w->AddF32(a + ".rope.scaling.factor", s.rope_yarn_factor);
    if (s.rope_yarn_orig_ctx > 0)
      w->AddU32(a + ".rope.scaling.original_context_length", uint32_t(s.rope_yarn_orig_ctx));
  }
  w->AddU32(a + ".vocab_size", s.n_vocab);

  const SyntheticVocab v =
      s.tokenizer == "gpt2" ? BytePairVocab(s.n_vocab) : SentencePieceVocab(s.n_vocab);
  w->AddString("tokenizer.ggml.model", s.tokenizer);
  w->AddStringArray("tokenizer.ggml.tokens", v.tokens);
  w->AddI32Array("tokenizer.ggml.token_type", v.types);
  if (s.tokenizer == "gpt2") {
    w->AddString("tokenizer.ggml.pre", s.pre);
    w->AddStringArray("tokenizer.ggml.merges", v.merges);
    w->AddU32("tokenizer.ggml.bos_token_id", 1);
    w->AddU32("tokenizer.ggml.eos_token_id", 2);
    w->AddBool("tokenizer.ggml.add_bos_token", false);
    w->AddString("tokenizer.chat_template",
                 "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                 "'system' %}{{ '<|im_start|>system\nYou are a tiny synthetic test "
                 "model.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}");
  } else {
    w->AddF32Array("tokenizer.ggml.scores", v.scores);
    w->AddU32("tokenizer.ggml.unknown_token_id", 0);
    w->AddU32("tokenizer.ggml.bos_token_id", 1);
    w->AddU32("tokenizer.ggml.eos_token_id", 2);
    w->AddBool("tokenizer.ggml.add_bos_token", true);
    w->AddBool("tokenizer.ggml.add_space_prefix", true);
    w->AddString("tokenizer.chat_template",
                 "{% for message in messages %}[INST] {{ message['content'] }} [/INST]"
                 "{% endfor %}");
  }

  auto rng = std::make_shared<Rng>(s.seed);
  const int64_t E = s.n_embd, V = s.n_vocab, F = s.n_ff;
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  auto add = [&](const std::string& name, DType t, int64_t cols, int64_t rows, float center = 0.f,
                 float scale = 0.f) -> Status {
    if (scale == 0.f) scale = 1.f / std::sqrt(static_cast<float>(cols));
    std::vector<int64_t> ne =
        rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
    if (!generate)
      return w->AddTensor(name, t, ne, RandomTensor(t, cols, rows, scale, center, rng.get()));
    return w->AddTensorGenerated(name, t, ne, [=](std::span<uint8_t> out) {
      const std::vector<uint8_t> bytes = RandomTensor(t, cols, rows, scale, center, rng.get());
      std::copy(bytes.begin(), bytes.end(), out.begin());
      return Status::OK();
    });
  };
  STRATA_RETURN_IF_ERROR(add("token_embd.weight", s.embd_type, E, V));
  STRATA_RETURN_IF_ERROR(add("output_norm.weight", DType::kF32, E, 1, 1.f, 0.1f));
  if (!s.tied_output) STRATA_RETURN_IF_ERROR(add("output.weight", s.output_type, E, V));
  if (s.rope_freqs) {
    STRATA_RETURN_IF_ERROR(add("rope_freqs.weight", DType::kF32, rope_dim / 2, 1, 2.f, 1.f));
  }
  for (int32_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    STRATA_RETURN_IF_ERROR(add(p + "attn_norm.weight", DType::kF32, E, 1, 1.f, 0.1f));
    STRATA_RETURN_IF_ERROR(add(p + "attn_q.weight", s.weight_type, E, Q));
    STRATA_RETURN_IF_ERROR(add(p + "attn_k.weight", s.weight_type, E, KV));
    STRATA_RETURN_IF_ERROR(add(p + "attn_v.weight", s.weight_type, E, KV));
    STRATA_RETURN_IF_ERROR(add(p + "attn_output.weight", s.weight_type, Q, E));
    if (a == "qwen2") {
      STRATA_RETURN_IF_ERROR(add(p + "attn_q.bias", DType::kF32, Q, 1, 0.f, 0.1f));
      STRATA_RETURN_IF_ERROR(add(p + "attn_k.bias", DType::kF32, KV, 1, 0.f, 0.1f));
      STRATA_RETURN_IF_ERROR(add(p + "attn_v.bias", DType::kF32, KV, 1, 0.f, 0.1f));
    }
    if (a == "qwen3") {
      STRATA_RETURN_IF_ERROR(add(p + "attn_q_norm.weight", DType::kF32, hd, 1, 1.f, 0.1f));
      STRATA_RETURN_IF_ERROR(add(p + "attn_k_norm.weight", DType::kF32, hd, 1, 1.f, 0.1f));
    }
    STRATA_RETURN_IF_ERROR(add(p + "ffn_norm.weight", DType::kF32, E, 1, 1.f, 0.1f));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_gate.weight", s.weight_type, E, F));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_up.weight", s.weight_type, E, F));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_down.weight", s.weight_type, F, E));
  }
  return Status::OK();
}

}  // namespace

Status BuildSyntheticModel(const SyntheticModelSpec& spec, GgufWriter* w) {
  return Build(spec, w, /*generate=*/false);
}

Status WriteSyntheticModel(const SyntheticModelSpec& spec, const std::string& path) {
  GgufWriter w;
  STRATA_RETURN_IF_ERROR(Build(spec, &w, /*generate=*/true));
  return w.WriteFile(path);
}

}  // namespace strata
