// libFuzzer target: arbitrary bytes as text to encode. The first byte picks parse_special;
// the rest is the text. Invalid UTF-8 must be an error; valid text must encode to ids in
// range that decode back to the text (the real SmolLM2 vocabulary has no token for a few
// control bytes, so there the decoded text may only drop bytes). Also feeds the decoded
// bytes through Utf8Stream in pieces, whose output must always be valid UTF-8.
//
// Uses the real model's vocabulary when present ($STRATA_TEST_MODEL or the default cache
// path), else a synthetic byte-level BPE one; a synthetic SentencePiece one always.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/synthetic_model.h"
#include "runtime/model/tokenizer.h"

namespace {

struct Vocab {
  std::vector<uint8_t> bytes;  // the GGUF buffer when synthetic
  std::unique_ptr<strata::GgufFile> gguf;
  std::unique_ptr<strata::Tokenizer> tok;
  bool lossless = true;
};

Vocab* bpe = nullptr;
Vocab* spm = nullptr;

void Fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "tokenizer_fuzzer: %s (text of %zu bytes)\n", what, text.size());
  std::abort();
}

Vocab* Synthetic(const std::string& tokenizer) {
  auto* v = new Vocab;
  strata::SyntheticModelSpec spec;
  spec.tokenizer = tokenizer;
  spec.n_layer = 1;
  spec.n_embd = 32;
  spec.n_ff = 32;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  strata::GgufWriter w;
  if (!strata::BuildSyntheticModel(spec, &w).ok()) std::abort();
  v->bytes = w.Serialize();
  if (!strata::GgufFile::FromMemory(v->bytes.data(), v->bytes.size(), &v->gguf).ok() ||
      !strata::Tokenizer::FromGguf(*v->gguf, &v->tok).ok()) {
    std::abort();
  }
  return v;
}

Vocab* Real() {
  std::string path;
  if (const char* p = std::getenv("STRATA_TEST_MODEL"); p != nullptr && *p) {
    path = p;
  } else if (const char* h = std::getenv("STRATA_HOME"); h != nullptr && *h) {
    path = std::string(h) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  } else if (const char* home = std::getenv("HOME")) {
    path = std::string(home) + "/.cache/strata/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  auto* v = new Vocab;
  if (!strata::GgufFile::Open(path, &v->gguf).ok() ||
      !strata::Tokenizer::FromGguf(*v->gguf, &v->tok).ok()) {
    delete v;
    return nullptr;
  }
  v->lossless = false;
  std::fprintf(stderr, "tokenizer_fuzzer: using the vocabulary of %s\n", path.c_str());
  return v;
}

// True when `sub` is `text` with zero or more bytes removed.
bool IsSubsequence(std::string_view sub, std::string_view text) {
  size_t j = 0;
  for (size_t i = 0; i < text.size() && j < sub.size(); ++i) {
    if (text[i] == sub[j]) ++j;
  }
  return j == sub.size();
}

void Exercise(const Vocab& v, std::string_view text, bool special, bool spm_prefix) {
  std::vector<int32_t> ids;
  size_t bad = 0;
  const bool valid = strata::IsValidUtf8(text, &bad);
  strata::Status s = v.tok->Encode(text, true, special, &ids);
  if (!valid) {
    if (s.ok()) Fail("invalid UTF-8 accepted", text);
    if (s.message().find("byte offset " + std::to_string(bad)) == std::string::npos) {
      Fail("error does not name the byte offset", text);
    }
    return;
  }
  if (!s.ok()) Fail("valid text rejected", text);
  for (int32_t id : ids) {
    if (id < 0 || id >= v.tok->n_vocab()) Fail("id out of range", text);
  }
  std::string decoded;
  for (int32_t id : ids) {
    if (id == v.tok->bos()) continue;  // the BOS add_bos may have put first
    decoded += v.tok->TokenBytes(id, /*special=*/true);
  }
  if (spm_prefix) {
    // SentencePiece marks the start of the text (and text after a special token) with a
    // space; without special tokens exactly one leading space comes back.
    if (!special && !text.empty()) {
      if (decoded != " " + std::string(text)) Fail("SPM round trip differs", text);
    }
  } else if (v.lossless ? decoded != text : !IsSubsequence(decoded, text)) {
    Fail("BPE round trip differs", text);
  }
  // Streaming the bytes in uneven pieces never yields invalid UTF-8.
  strata::Utf8Stream stream;
  std::string streamed;
  for (size_t i = 0; i < decoded.size();) {
    const size_t n = 1 + (i * 7 + decoded.size()) % 5;
    streamed += stream.Push(std::string_view(decoded).substr(i, n));
    i += n;
  }
  streamed += stream.Flush();
  if (!strata::IsValidUtf8(streamed, &bad)) Fail("Utf8Stream emitted invalid UTF-8", text);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  bpe = Real();
  if (bpe == nullptr) bpe = Synthetic("gpt2");
  spm = Synthetic("llama");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool special = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  Exercise(*bpe, text, special, /*spm_prefix=*/false);
  Exercise(*spm, text, special, /*spm_prefix=*/true);
  return 0;
}
