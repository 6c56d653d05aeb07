// libFuzzer target: arbitrary bytes as a GGUF file. Parsing must fail cleanly or produce a
// file whose every metadata entry and tensor can be read; a file that parses goes on
// through the tokenizer and the model binding, which must also fail cleanly or succeed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/model/gguf.h"
#include "runtime/model/model.h"
#include "runtime/model/tokenizer.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "gguf_fuzzer: invariant failed: %s\n", what);
    std::abort();
  }
}

void TouchEverything(const strata::GgufFile& f) {
  // Read every key through the getters (type mismatches are errors, not crashes).
  for (const auto& [key, v] : f.metadata()) {
    std::string s;
    uint32_t u32;
    uint64_t u64;
    float f32;
    bool b;
    std::vector<int32_t> i32s;
    std::vector<float> f32s;
    const std::vector<std::string_view>* strs;
    (void)f.GetString(key, &s);
    (void)f.GetU32(key, &u32);
    (void)f.GetU64(key, &u64);
    (void)f.GetF32(key, &f32);
    (void)f.GetBool(key, &b);
    (void)f.GetI32Array(key, &i32s);
    (void)f.GetF32Array(key, &f32s);
    (void)f.GetStringArray(key, &strs);
    Check(f.Find(key) == &v, "Find returns the entry");
  }
  // Every tensor's bytes lie inside the buffer: reading the first and last byte is safe
  // (ASan would report otherwise).
  volatile uint8_t sink = 0;
  for (const strata::GgufTensor& t : f.tensors()) {
    Check(t.nbytes > 0 && t.n_elements() > 0, "tensor has bytes");
    Check(t.offset % f.alignment() == 0, "tensor offset aligned");
    const auto* p = static_cast<const uint8_t*>(t.data);
    sink = sink + p[0] + p[t.nbytes - 1];
    Check(f.FindTensor(t.name) == &t, "FindTensor returns the tensor");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy so the tensors' data pointers refer to a buffer of exactly `size` bytes.
  std::vector<uint8_t> buf(data, data + size);
  std::unique_ptr<strata::GgufFile> f;
  strata::Status s = strata::GgufFile::FromMemory(buf.data(), buf.size(), &f);
  if (!s.ok()) {
    Check(!s.message().empty(), "errors have a message");
    return 0;
  }
  TouchEverything(*f);
  std::unique_ptr<strata::Tokenizer> tok;
  if (strata::Tokenizer::FromGguf(*f, &tok).ok()) {
    std::vector<int32_t> ids;
    if (tok->Encode("Hello <|im_start|> wörld 123 ", true, true, &ids).ok()) {
      for (int32_t id : ids) Check(id >= 0 && id < tok->n_vocab(), "ids within the vocabulary");
      (void)tok->Decode(ids, true);
    }
  }
  std::unique_ptr<strata::Model> model;
  if (strata::Model::FromGguf(std::move(f), &model).ok()) {
    const strata::HParams& hp = model->hparams();
    Check(hp.n_layer > 0 && hp.n_head > 0 && hp.n_head % hp.n_head_kv == 0, "hparams sane");
    Check(static_cast<int32_t>(model->weights().layers.size()) == hp.n_layer, "layers bound");
  }
  return 0;
}
