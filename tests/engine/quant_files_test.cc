// The engine on GGUF files made by llama.cpp's llama-quantize (Q4_K_M, Q5_K_M, Q3_K_M,
// Q2_K, IQ4_XS, ...), which mix Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS tensors with
// today's types. CI cannot run llama-quantize, so the files come from outside:
//
//   STRATA_TEST_QUANT_DIR=/path/to/dir  (every *.gguf in it is tested)
//
// and the test skips, saying so, when the variable is unset. With it set, the default model
// (tests/testing/test_model.h) is the reference and must be present. For each file and
// every ISA this machine runs: all logits are finite, a counting prompt continues with "6",
// a short text's perplexity is far from chance (and printed beside the reference model's),
// and the ISAs agree with each other. docs/experiments/cpu-weight-types.md says how the files were
// made; the kernels' exactness is the business of tests/kernels, this is the smoke test
// that whole files load and run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "runtime/engine/engine.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

// Digits are single tokens after a space token, so the sane next token is "6".
constexpr char kCounting[] = "1, 2, 3, 4, 5, ";
constexpr char kText[] =
    "The printing press was invented by Johannes Gutenberg in the fifteenth century. It made "
    "books cheaper and helped reading spread across Europe.";
// The text's perplexity must beat a fifth of blind guessing (n_vocab): broken kernels give
// noise at or beyond chance. An honest file can still be poor, so this is no tighter: with
// every ffn_down in Q2_K, requantized from Q4_1 without an importance matrix, SmolLM2 scores
// about 3000 on this text, in llama.cpp as here (docs/experiments/cpu-weight-types.md).
constexpr double kChanceFraction = 0.2;
// Largest difference allowed between ISAs on the first ISA's top-5 logits: the summation
// orders differ, and the network amplifies the rounding (tests/engine/golden_test.cc).
constexpr float kIsaLogitTolerance = 1.5f;

struct Outputs {
  std::vector<float> counting;  // last-token logits of kCounting
  std::vector<float> text;      // every token's logits of kText
  int32_t n_text = 0;
  std::vector<int32_t> text_tokens;
};

Outputs RunPrompts(const Model& model) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_sequences = 1;
  std::unique_ptr<Engine> engine;
  Outputs out;
  Status s = Engine::Create(model, o, &engine);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  auto prefill = [&](const char* text, bool all, std::vector<int32_t>* tokens,
                     std::vector<float>* logits) {
    EXPECT_TRUE(model.tokenizer().Encode(text, true, false, tokens).ok());
    SeqId seq;
    EXPECT_TRUE(engine->NewSequence(&seq).ok());
    const Status st = engine->Prefill(seq, *tokens, logits, all);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(engine->RemoveSequence(seq).ok());
  };
  std::vector<int32_t> counting_tokens;
  prefill(kCounting, false, &counting_tokens, &out.counting);
  prefill(kText, true, &out.text_tokens, &out.text);
  out.n_text = static_cast<int32_t>(out.text_tokens.size());
  return out;
}

double Perplexity(const Outputs& o, int32_t n_vocab) {
  double nll = 0;
  for (int32_t t = 0; t + 1 < o.n_text; ++t) {
    std::vector<float> row(o.text.begin() + size_t(t) * n_vocab,
                           o.text.begin() + size_t(t + 1) * n_vocab);
    const float lse = kernels::SoftmaxInPlace(row.data(), n_vocab);
    nll -= o.text[size_t(t) * n_vocab + o.text_tokens[t + 1]] - lse;
  }
  return std::exp(nll / (o.n_text - 1));
}

int32_t Top1(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Largest difference on `a`'s five largest logits.
float Top5Difference(const std::vector<float>& a, const std::vector<float>& b) {
  int32_t idx[5];
  kernels::TopK(a.data(), static_cast<int64_t>(a.size()), 5, idx);
  float d = 0;
  for (int32_t i : idx) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST(QuantFiles, LlamaCppMixesLoadAndRunSanely) {
  const char* dir = std::getenv("STRATA_TEST_QUANT_DIR");
  if (dir == nullptr || *dir == '\0') {
    GTEST_SKIP() << "STRATA_TEST_QUANT_DIR is not set: point it at a directory of GGUF files "
                    "made with llama-quantize (see docs/experiments/cpu-weight-types.md)";
  }
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".gguf") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << "no .gguf files in STRATA_TEST_QUANT_DIR=" << dir;

  STRATA_REQUIRE_REAL_MODEL(ref_path);
  std::unique_ptr<Model> ref_model;
  ASSERT_TRUE(Model::Load(ref_path, &ref_model).ok());
  const int32_t n_vocab = ref_model->hparams().n_vocab;
  const double ref_ppl = Perplexity(RunPrompts(*ref_model), n_vocab);
  const int32_t six = ref_model->tokenizer().Find("6");
  ASSERT_GE(six, 0);

  const kernels::Isa saved = kernels::ActiveIsa();
  std::map<std::string, int> types_seen;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    std::unique_ptr<Model> model;
    const Status s = Model::Load(path, &model);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(model->hparams().n_vocab, n_vocab);
    for (const GgufTensor& t : model->gguf().tensors()) ++types_seen[kernels::TypeName(t.type)];
    Outputs first;
    for (kernels::Isa isa :
         {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512, kernels::Isa::kNeon}) {
      if (!kernels::ForceIsa(isa)) continue;
      SCOPED_TRACE(kernels::IsaName(isa));
      const Outputs got = RunPrompts(*model);
      ASSERT_EQ(got.counting.size(), size_t(n_vocab));
      ASSERT_EQ(got.text.size(), size_t(got.n_text) * n_vocab);
      for (float v : got.counting) ASSERT_TRUE(std::isfinite(v));
      for (float v : got.text) ASSERT_TRUE(std::isfinite(v));
      const int32_t top1 = Top1(got.counting);
      const double ppl = Perplexity(got, n_vocab);
      std::printf("[ QuantFiles ] %s %s: '%s' -> '%s', text perplexity %.2f (reference %.2f)\n",
                  std::filesystem::path(path).filename().c_str(), kernels::IsaName(isa), kCounting,
                  model->tokenizer().TokenBytes(top1).c_str(), ppl, ref_ppl);
      EXPECT_EQ(top1, six) << "'" << model->tokenizer().TokenBytes(top1) << "'";
      EXPECT_LT(ppl, kChanceFraction * n_vocab);
      if (first.n_text == 0) {
        first = got;
        continue;
      }
      EXPECT_LT(Top5Difference(first.counting, got.counting), kIsaLogitTolerance);
      const std::vector<float> first_last(first.text.end() - n_vocab, first.text.end());
      const std::vector<float> got_last(got.text.end() - n_vocab, got.text.end());
      EXPECT_LT(Top5Difference(first_last, got_last), kIsaLogitTolerance);
    }
  }
  kernels::ForceIsa(saved);
  std::string seen;
  for (const auto& [name, n] : types_seen) seen += " " + name + " x" + std::to_string(n);
  std::printf("[ QuantFiles ] %zu files; tensor types:%s\n", files.size(), seen.c_str());
}

}  // namespace
}  // namespace strata
