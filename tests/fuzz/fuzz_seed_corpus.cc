// Writes the fuzzers' seed corpus: small valid GGUF files (synthetic Llama/Qwen models with
// byte-level BPE and SentencePiece vocabularies, a metadata-only file, a v2 file) into
// <dir>/gguf, a few texts (prose, Unicode, special tokens, whitespace) into <dir>/text, an
// adapters file into <dir>/adapters, a store file into <dir>/store, configs into
// <dir>/config, conversations into <dir>/chat and server request bodies into <dir>/requests.
// Usage: fuzz_seed_corpus <dir>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/config/config.h"
#include "runtime/kv/disk/adapters.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/synthetic_model.h"
#include "storage/block_store.h"

namespace {

bool WriteBytes(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  ::mkdir(dir.c_str(), 0755);
  ::mkdir((dir + "/gguf").c_str(), 0755);
  ::mkdir((dir + "/text").c_str(), 0755);

  // Small models: Q4_0 weights keep each file at a few KB so mutations stay cheap.
  struct Seed {
    const char* name;
    const char* arch;
    const char* tokenizer;
    bool tied;
  };
  const Seed seeds[] = {{"llama_bpe", "llama", "gpt2", false},
                        {"qwen2_bpe", "qwen2", "gpt2", true},
                        {"qwen3_spm", "qwen3", "llama", false}};
  for (const Seed& s : seeds) {
    strata::SyntheticModelSpec spec;
    spec.arch = s.arch;
    spec.tokenizer = s.tokenizer;
    spec.tied_output = s.tied;
    spec.n_vocab = 272;
    spec.n_embd = 32;
    spec.n_ff = 32;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 1;
    spec.weight_type = strata::kernels::DType::kQ4_0;
    spec.embd_type = strata::kernels::DType::kQ4_0;
    spec.output_type = strata::kernels::DType::kQ4_0;
    const std::string path = dir + "/gguf/" + s.name + ".gguf";
    strata::Status st = strata::WriteSyntheticModel(spec, path);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  strata::GgufWriter meta(64);
  meta.set_version(2);
  meta.AddString("general.architecture", "llama");
  meta.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  const int32_t types[] = {1, 1, 3};
  meta.AddI32Array("tokenizer.ggml.token_type", types);
  meta.AddF64("x.f64", 0.5);
  meta.AddI8("x.i8", -3);
  const std::vector<float> v(8, 1.f);
  if (!meta.AddTensorF32("t", strata::kernels::DType::kF16, {8}, v).ok()) return 1;
  const std::vector<uint8_t> bytes = meta.Serialize();
  if (!WriteBytes(dir + "/gguf/meta_v2.gguf", std::string(bytes.begin(), bytes.end()))) return 1;

  // Texts: the first byte selects parse_special (odd = on).
  const char* texts[] = {
      "\x01<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n",
      "\x00The quick brown fox jumps over the lazy dog. It's 2024; don't panic.",
      "\x00  \t\n\n  spaced   out \r\n",
      "\x01 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80\xE2\x80\x8D 12345 </s><s>",
  };
  int i = 0;
  for (const char* t : texts) {
    // Texts start with a flag byte that may be NUL, so lengths come from the literal.
    const std::string s(t, t[0] == 0 ? 1 + std::strlen(t + 1) : std::strlen(t));
    if (!WriteBytes(dir + "/text/seed" + std::to_string(i++), s)) return 1;
  }

  // An adapters file (two layers, ratios 4 and 8), prefixed with the fuzzer's flag byte.
  for (const char* d : {"/adapters", "/store", "/config", "/chat", "/requests"})
    ::mkdir((dir + d).c_str(), 0755);
  strata::Adapters a;
  a.model_identity = 42;
  a.n_layer = 2;
  a.n_head_kv = 1;
  a.head_dim = 32;
  a.note = "seed";
  for (int32_t ratio : {4, 8}) {
    strata::AdapterSet set;
    set.ratio = ratio;
    set.rank = 32 / ratio;
    for (int32_t l = 0; l < a.n_layer; ++l)
      set.layers.push_back(std::vector<float>(size_t(32 * set.rank), 0.25f * float(l + 1)));
    a.sets.push_back(std::move(set));
  }
  const std::string ad = dir + "/adapters/tmp.adapters";
  if (!a.Write(ad).ok()) return 1;
  {
    FILE* f = std::fopen(ad.c_str(), "rb");
    if (!f) return 1;
    std::string body(1, '\x01');
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) body.append(buf, n);
    std::fclose(f);
    std::remove(ad.c_str());
    if (!WriteBytes(dir + "/adapters/seed.adapters", body)) return 1;
  }

  // A store file (a kept store of 64 KiB), its header and a little data.
  {
    strata::storage::StoreOptions o;
    o.directory = dir + "/store";
    o.file_name = "seed.strata";
    o.capacity = 65536;
    o.keep_files = true;
    o.direct_io = false;
    o.report = [](std::string_view) {};
    std::unique_ptr<strata::storage::BlockStore> store;
    if (!strata::storage::BlockStore::Open(o, &store).ok()) return 1;
  }

  // Configs: the writer's full output and a few hand-written ones (an alias, flow style).
  strata::Config c;
  if (!WriteBytes(dir + "/config/full.yaml", strata::ConfigToYaml(c))) return 1;
  if (!WriteBytes(dir + "/config/small.yaml",
                  "threads: 2\nkv:\n  policy: disk\n  group_size: 5\ngenerate:\n  stop: &s "
                  "[\"a\", \"b\"]\nsampling: {temperature: 0.5, top_k: 4}\n"))
    return 1;

  // Conversations: role NUL content NUL ..., the last part a default system prompt.
  const std::string chats[] = {
      std::string("system\0You are terse.\0user\0Hi there\0assistant\0 Hello! \0user\0"
                  "Two\nlines\0sys",
                  73),
      std::string("user\0<|im_end|>[INST]\0\0", 23),
  };
  i = 0;
  for (const std::string& t : chats)
    if (!WriteBytes(dir + "/chat/seed" + std::to_string(i++), t)) return 1;

  // Request bodies of strata serve: the first byte picks the endpoint (odd: chat).
  const std::string requests[] = {
      std::string("\x01") +
          R"({"model":"m","messages":[{"role":"system","content":"Be brief."},)"
          R"({"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":8,)"
          R"("temperature":0,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":7,"stop":["
","."],)"
          R"("stream":true,"stream_options":{"include_usage":true},"n":1})",
      std::string("\x01") + R"({"messages":[{"role":"developer","content":"x"}],)"
                            R"("max_completion_tokens":3})",
      std::string("\x00") + R"({"prompt":"Once upon a time","max_tokens":16,"stop":"end"})",
      std::string("\x00") + R"({"prompt":["a"],"seed":-1,"stream":false})",
  };
  i = 0;
  for (const std::string& t : requests)
    if (!WriteBytes(dir + "/requests/seed" + std::to_string(i++), t)) return 1;
  return 0;
}
