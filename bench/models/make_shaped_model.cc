// make_shaped_model: writes a random-weight GGUF with the shape of a real model (layers,
// widths, heads, vocabulary, biases, Q/K norms, RoPE base and frequency factors) for speed
// and memory measurements at real sizes; its outputs mean nothing. Every matrix, the
// embeddings and the output head are of one type, written directly by Strata's own GGUF
// writer (runtime/model/synthetic_model.h), so the file can be made wherever the
// benchmark runs instead of being carried there.
//
//   make_shaped_model --list
//   make_shaped_model --shape llama-3.1-8b --type q4_0 -o /tmp/l8b.q4_0.gguf [--layers N]
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kernels/types.h"
#include "runtime/model/synthetic_model.h"

namespace strata {
namespace {

struct Shape {
  const char* name;
  const char* arch;
  int32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
  float rope_base;
  bool rope_freqs, tied;
};

// From the models' published configurations.
constexpr Shape kShapes[] = {
    {"smollm2-135m", "llama", 576, 30, 9, 3, 0, 1536, 49152, 8192, 100000.f, false, true},
    {"llama-3.2-1b", "llama", 2048, 16, 32, 8, 0, 8192, 128256, 131072, 500000.f, true, true},
    {"llama-3.2-3b", "llama", 3072, 28, 24, 8, 0, 8192, 128256, 131072, 500000.f, true, true},
    {"llama-3.1-8b", "llama", 4096, 32, 32, 8, 0, 14336, 128256, 131072, 500000.f, true, false},
    {"qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 0, 8960, 151936, 32768, 1000000.f, false, true},
    {"qwen3-4b", "qwen3", 2560, 36, 32, 8, 128, 9728, 151936, 40960, 1000000.f, false, true},
};

int Main(int argc, char** argv) {
  CLI::App app{"writes a random-weight GGUF with a real model's shape"};
  std::string shape, type = "q4_0", out;
  int32_t layers = 0;
  bool list = false;
  app.add_option("--shape", shape, "model shape (--list shows them)");
  app.add_option("--type", type, "type of every matrix: q4_0, q4_1, q8_0, q4_k, q6_k, f16");
  app.add_option("-o,--output", out, "GGUF file to write");
  app.add_option("--layers", layers, "fewer layers than the real model (0 = all)");
  app.add_flag("--list", list, "list the shapes");
  CLI11_PARSE(app, argc, argv);
  if (list) {
    for (const Shape& s : kShapes)
      std::printf("%-14s %s: %d layers, %d wide, %d/%d heads, FFN %d, vocabulary %d\n", s.name,
                  s.arch, s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.n_ff, s.n_vocab);
    return 0;
  }
  const Shape* sh = nullptr;
  for (const Shape& s : kShapes)
    if (shape == s.name) sh = &s;
  if (!sh || out.empty()) {
    std::fprintf(stderr, "make_shaped_model: give --shape (one of --list) and -o FILE\n");
    return 2;
  }
  kernels::DType t;
  if (type == "q4_0")
    t = kernels::DType::kQ4_0;
  else if (type == "q4_1")
    t = kernels::DType::kQ4_1;
  else if (type == "q8_0")
    t = kernels::DType::kQ8_0;
  else if (type == "q4_k")
    t = kernels::DType::kQ4_K;
  else if (type == "q6_k")
    t = kernels::DType::kQ6_K;
  else if (type == "f16")
    t = kernels::DType::kF16;
  else {
    std::fprintf(stderr,
                 "make_shaped_model: --type %s is not one of q4_0, q4_1, q8_0, q4_k, "
                 "q6_k, f16\n",
                 type.c_str());
    return 2;
  }
  SyntheticModelSpec spec;
  spec.arch = sh->arch;
  spec.n_embd = sh->n_embd;
  spec.n_layer = layers > 0 ? layers : sh->n_layer;
  spec.n_head = sh->n_head;
  spec.n_head_kv = sh->n_head_kv;
  spec.head_dim = sh->head_dim;
  spec.n_ff = sh->n_ff;
  spec.n_vocab = sh->n_vocab;
  spec.n_ctx_train = sh->n_ctx;
  spec.rope_base = sh->rope_base;
  spec.rope_freqs = sh->rope_freqs;
  spec.tied_output = sh->tied;
  spec.weight_type = t;
  spec.embd_type = t;
  spec.output_type = t;
  const Status s = WriteSyntheticModel(spec, out);
  if (!s.ok()) {
    std::fprintf(stderr, "make_shaped_model: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
