// The engine on GGUF files made by llama.cpp's llama-quantize (Q4_K_M, Q5_K_M, Q3_K_M,
// Q2_K, IQ4_XS, ...), which mix Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS tensors with
// today's types. The files are llama.cpp's own output, not Strata's writer's:
//
//   STRATA_TEST_QUANT_DIR=$(scripts/make_quant_files.sh)  (every *.gguf in it is tested)
//
// scripts/test.sh (CI) sets it; the tests skip, saying so, when it is unset. The default
// model (tests/testing/test_model.h) is the reference and must be present. For each file and
// every ISA this machine runs: all logits are finite, a counting prompt continues with "6",
// a short text's perplexity is far from chance (and printed beside the reference model's),
// and the ISAs agree with each other. The Q4_K_M and Q5_K_M files' perplexity on
// tinyshakespeare must be within 1% of llama.cpp's on the same bytes
// (tests/fixtures/perplexity_quant_files.json). The kernels' exactness is the business of
// tests/kernels; these check that whole files load and run as llama.cpp runs them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/kernels.h"
#include "runtime/engine/engine.h"
#include "tests/testing/test_model.h"
#include "tests/testing/window_perplexity.h"

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

// $STRATA_TEST_QUANT_DIR, or null when it is unset.
const char* QuantDir() {
  const char* dir = std::getenv("STRATA_TEST_QUANT_DIR");
  return dir != nullptr && *dir != '\0' ? dir : nullptr;
}
constexpr char kNoQuantDir[] =
    "STRATA_TEST_QUANT_DIR is not set: point it at a directory of GGUF files made with "
    "llama-quantize, as scripts/make_quant_files.sh prints";

TEST(QuantFiles, LlamaCppMixesLoadAndRunSanely) {
  const char* dir = QuantDir();
  if (dir == nullptr) GTEST_SKIP() << kNoQuantDir;
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

// The checksum of tests/golden/make_quant_files_golden.py: the sum and the xor of the file's
// little-endian 64-bit words, the last one zero-padded, as 16 hex digits each.
struct FileSum {
  uint64_t bytes = 0, sum = 0, x = 0;
};
bool Checksum(const std::string& path, FileSum* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::vector<char> buf(1 << 20);
  *out = {};
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const size_t n = size_t(in.gcount());
    out->bytes += n;
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w = 0;
      for (size_t b = 0; b < 8 && i + b < n; ++b) w |= uint64_t(uint8_t(buf[i + b])) << (8 * b);
      out->sum += w;
      out->x ^= w;
    }
  }
  return true;
}
std::string Hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

nlohmann::json LoadFixture(const std::string& name) {
  std::ifstream in(testing::SourceDir() + "/tests/fixtures/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return nlohmann::json::parse(in);
}

TEST(QuantFiles, PerplexityWithinOnePercentOfLlamaCppOnTheSameFile) {
  const char* dir = QuantDir();
  if (dir == nullptr) GTEST_SKIP() << kNoQuantDir;
  const nlohmann::json fx = LoadFixture("perplexity_quant_files.json");
  const nlohmann::json text = LoadFixture(fx["source"].get<std::string>());
  const std::vector<int32_t> tokens = text["tokens"];
  const int window = fx["window"], n_windows = fx["windows"];
  ASSERT_GE(tokens.size(), size_t(window) * size_t(n_windows));
  ASSERT_FALSE(fx["files"].empty());
  for (const auto& [name, want] : fx["files"].items()) {
    SCOPED_TRACE(name);
    const std::string path = std::string(dir) + "/" + name;
    FileSum got;
    ASSERT_TRUE(Checksum(path, &got))
        << "cannot read " << path << " (scripts/make_quant_files.sh writes it)";
    // llama.cpp's figures hold for these bytes only: another llama-quantize may round
    // differently, and the comparison would be between two files.
    ASSERT_TRUE(got.bytes == want["bytes"].get<uint64_t>() && Hex(got.sum) == want["word_sum"] &&
                Hex(got.x) == want["word_xor"])
        << path << " is not the file llama.cpp's perplexity was computed on (" << got.bytes
        << " bytes, sum " << Hex(got.sum) << ", xor " << Hex(got.x) << " against " << want.dump()
        << "): rerun tests/golden/make_quant_files_golden.py on it";
    std::unique_ptr<Model> model;
    Status s = Model::Load(path, &model);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = window;
    o.max_sequences = 1;
    std::unique_ptr<Engine> engine;
    s = Engine::Create(*model, o, &engine);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<double> ref = want["window_perplexity"];
    ASSERT_EQ(ref.size(), size_t(n_windows));
    const size_t V = size_t(model->hparams().n_vocab);
    double nll = 0, ref_log = 0;
    for (int w = 0; w < n_windows; ++w) {
      double window_nll = 0;
      ASSERT_TRUE(testing::WindowNll(*engine, {tokens.data() + size_t(w) * window, size_t(window)},
                                     V, &window_nll));
      nll += window_nll;
      ref_log += std::log(ref[size_t(w)]) * (window - 1);
    }
    const double scored = double(n_windows) * (window - 1);
    const double ppl = std::exp(nll / scored), want_ppl = std::exp(ref_log / scored);
    std::printf("[ QuantFiles ] %s: perplexity over %d windows of %d tokens %.4f, llama.cpp %.4f\n",
                name.c_str(), n_windows, window, ppl, want_ppl);
    EXPECT_NEAR(ppl / want_ppl, 1.0, 0.01);
  }
}

}  // namespace
}  // namespace strata
