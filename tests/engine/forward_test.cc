// The engine's forward pass against the plain reference (reference_forward.cc) on tiny
// synthetic models of every supported architecture and weight type, plus the invariants
// that tie prefill, decode, batching and threading together.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include <unistd.h>

#include <gtest/gtest.h>

#include "runtime/engine/engine.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/session.h"
#include "runtime/kv/tree/prefix_tree_kv.h"
#include "runtime/model/synthetic_model.h"
#include "tests/engine/reference_forward.h"

namespace strata {
namespace {

using kernels::DType;

struct Case {
  const char* name;
  SyntheticModelSpec spec;
  double tol;  // max |engine - reference| relative to the largest reference logit
};

std::vector<Case> Cases() {
  std::vector<Case> c;
  SyntheticModelSpec s;
  c.push_back({"llama_f32", s, 2e-4});
  s.weight_type = DType::kF16;
  s.embd_type = DType::kF16;
  c.push_back({"llama_f16", s, 3e-3});
  s = SyntheticModelSpec();
  s.weight_type = DType::kQ8_0;
  s.embd_type = DType::kQ8_0;
  s.tied_output = true;
  c.push_back({"llama_q8_0_tied", s, 2e-2});
  s = SyntheticModelSpec();
  s.weight_type = DType::kQ4_1;
  s.embd_type = DType::kQ8_0;
  s.output_type = DType::kQ4_0;
  s.n_head = 6;
  s.n_head_kv = 2;
  s.n_embd = 96;
  c.push_back({"llama_q4_1_gqa3", s, 3e-2});
  s = SyntheticModelSpec();
  s.arch = "qwen2";
  s.weight_type = DType::kBF16;
  c.push_back({"qwen2_bias_neox_bf16", s, 5e-3});
  // Qwen2.5's long-context setting: YaRN over an original context shorter than the test's
  // positions, so that some pairs keep their frequency, some are interpolated, some mixed.
  s.weight_type = DType::kF32;
  s.rope_yarn_factor = 4.f;
  s.rope_yarn_orig_ctx = 64;
  c.push_back({"qwen2_yarn", s, 2e-4});
  s = SyntheticModelSpec();
  s.arch = "qwen3";
  s.head_dim = 64;
  s.n_embd = 128;
  s.n_head = 2;
  s.n_head_kv = 1;
  c.push_back({"qwen3_qknorm_hd64", s, 2e-4});
  s = SyntheticModelSpec();
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 4;
  s.n_ff = 512;
  s.weight_type = DType::kQ4_K;
  s.embd_type = DType::kQ6_K;
  s.output_type = DType::kQ6_K;
  s.rope_freqs = true;
  s.rope_linear_factor = 2.0f;
  c.push_back({"llama_kquants_ropescaling", s, 3e-2});
  return c;
}

class ForwardTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    path_ =
        (std::filesystem::temp_directory_path() /
         ("strata_fwd_" + std::string(GetParam().name) + "_" + std::to_string(getpid()) + ".gguf"))
            .string();
    ASSERT_TRUE(WriteSyntheticModel(GetParam().spec, path_).ok());
    Status s = Model::Load(path_, &model_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::unique_ptr<Engine> MakeEngine(int threads, int batch, int max_seqs = 2, int n_ctx = 128) {
    EngineOptions o;
    o.n_threads = threads;
    o.n_ctx = n_ctx;
    o.n_batch = batch;
    o.max_sequences = max_seqs;
    std::unique_ptr<Engine> e;
    Status s = Engine::Create(*model_, o, &e);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return e;
  }

  std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = int32_t(rng() % uint32_t(model_->hparams().n_vocab));
    return t;
  }

  std::string path_;
  std::unique_ptr<Model> model_;
};

double MaxAbs(const float* a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

double MaxDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST_P(ForwardTest, MatchesTheReferenceForwardPass) {
  const int n = 37;
  auto tokens = RandomTokens(n, 11);
  auto ref = testing::ReferenceLogits(*model_, tokens);
  // A batch limit of 16 makes prefill run in three passes that must chain through the KV.
  auto engine = MakeEngine(2, 16);
  SeqId seq;
  ASSERT_TRUE(engine->NewSequence(&seq).ok());
  std::vector<float> logits;
  Status s = engine->Prefill(seq, tokens, &logits, /*all_logits=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const size_t V = size_t(model_->hparams().n_vocab);
  ASSERT_EQ(logits.size(), n * V);
  double worst = 0;
  for (int t = 0; t < n; ++t) {
    const double scale = MaxAbs(ref[t].data(), V);
    worst = std::max(worst, MaxDiff(logits.data() + t * V, ref[t].data(), V) / scale);
  }
  EXPECT_LT(worst, GetParam().tol) << GetParam().name;
}

TEST_P(ForwardTest, DecodeTokenByTokenEqualsPrefill) {
  const int n = 20;
  auto tokens = RandomTokens(n, 5);
  auto engine = MakeEngine(2, 64);
  SeqId a, b;
  ASSERT_TRUE(engine->NewSequence(&a).ok());
  ASSERT_TRUE(engine->NewSequence(&b).ok());
  std::vector<float> all, one;
  ASSERT_TRUE(engine->Prefill(a, tokens, &all, true).ok());
  const size_t V = size_t(model_->hparams().n_vocab);
  for (int t = 0; t < n; ++t) {
    ASSERT_TRUE(engine->Prefill(b, {&tokens[t], 1}, &one).ok());
    const double scale = MaxAbs(all.data() + t * V, V);
    EXPECT_LT(MaxDiff(one.data(), all.data() + t * V, V) / scale, 1e-4) << "position " << t;
  }
}

// Decode over a long context splits each KV head's attention into parts of the context
// that run as separate tasks and are joined by their softmax denominators: the logits must
// equal the prefill's (not split) on any thread count, and be bit for bit the same whether
// the sequence decodes alone or beside another one.
TEST_P(ForwardTest, DecodeSplitIntoPartsEqualsPrefill) {
  const int n = 560, n_prompt = 556;
  // The context is long enough to be split, or this test would check nothing.
  ASSERT_GT(DecodeAttentionParts(n_prompt), 1);
  auto tokens = RandomTokens(n, 7);
  const size_t V = size_t(model_->hparams().n_vocab);
  std::vector<float> all;
  {
    auto engine = MakeEngine(1, 64, 2, 576);
    SeqId a;
    ASSERT_TRUE(engine->NewSequence(&a).ok());
    ASSERT_TRUE(engine->Prefill(a, tokens, &all, true).ok());
  }
  for (int threads : {1, 2, 3}) {
    auto engine = MakeEngine(threads, 64, 2, 576);
    SeqId b, other;
    ASSERT_TRUE(engine->NewSequence(&b).ok());
    ASSERT_TRUE(engine->NewSequence(&other).ok());
    std::vector<float> one;
    ASSERT_TRUE(engine->Prefill(b, {tokens.data(), size_t(n_prompt)}, &one).ok());
    ASSERT_TRUE(engine->Prefill(other, {tokens.data() + 100, 20}, &one).ok());
    int32_t other_len = 20;
    for (int t = n_prompt; t < n; ++t) {
      if (t % 2) {
        ASSERT_TRUE(engine->Prefill(b, {&tokens[t], 1}, &one).ok());
      } else {
        // Beside another decoding sequence: b's logits come first.
        ForwardBatch batch;
        batch.Add(b, t, {&tokens[t], 1}, true);
        batch.Add(other, other_len++, {&tokens[t], 1}, true);
        ASSERT_TRUE(engine->Evaluate(batch, &one).ok());
      }
      const double scale = MaxAbs(all.data() + t * V, V);
      EXPECT_LT(MaxDiff(one.data(), all.data() + t * V, V) / scale, 1e-4)
          << threads << " threads, position " << t;
    }
  }
  // Alone and in a batch, the same bits.
  std::vector<float> alone, together;
  for (bool in_batch : {false, true}) {
    auto engine = MakeEngine(2, 64, 2, 576);
    SeqId b, other;
    ASSERT_TRUE(engine->NewSequence(&b).ok());
    ASSERT_TRUE(engine->NewSequence(&other).ok());
    std::vector<float> logits;
    ASSERT_TRUE(engine->Prefill(b, {tokens.data(), size_t(n_prompt)}, &logits).ok());
    ASSERT_TRUE(engine->Prefill(other, {tokens.data() + 100, 20}, &logits).ok());
    ForwardBatch batch;
    batch.Add(b, n_prompt, {&tokens[n_prompt], 1}, true);
    if (in_batch) batch.Add(other, 20, {&tokens[n_prompt], 1}, true);
    ASSERT_TRUE(engine->Evaluate(batch, &logits).ok());
    logits.resize(V);
    (in_batch ? together : alone) = logits;
  }
  ASSERT_EQ(alone.size(), V);
  for (size_t i = 0; i < V; ++i) ASSERT_EQ(alone[i], together[i]) << i;
}

// A view is split into more parts as it grows, never fewer than one and never unboundedly
// many (the merge over parts runs on one thread); the tuner's attention timing uses the same
// rule, so it times the tasks the pass runs.
TEST(DecodeAttentionPartsTest, GrowsWithTheViewAndIsBounded) {
  EXPECT_EQ(DecodeAttentionParts(0), 1);
  EXPECT_EQ(DecodeAttentionParts(1), 1);
  int32_t last = 1;
  for (int64_t n = 1; n <= (int64_t(1) << 20); n = n * 3 / 2 + 1) {
    const int32_t p = DecodeAttentionParts(n);
    EXPECT_GE(p, last) << n;
    EXPECT_GE(p, 1) << n;
    last = p;
  }
  EXPECT_GT(last, 1);
  EXPECT_EQ(DecodeAttentionParts(int64_t(1) << 40), last);
}

// With pass_invariant a token's logits are the same bits whether its pass begins at the
// prompt's start or anywhere later, holds one token or many: over a context long enough that
// a one-token pass would otherwise be cut into parts, pieces that begin inside attention
// chunks, and one-token pieces.
TEST_P(ForwardTest, PassInvariantEngineGivesATokenTheSameBitsWhereverItsPassBegins) {
  const int n = 600;
  auto tokens = RandomTokens(n, 9);
  const size_t V = size_t(model_->hparams().n_vocab);
  // The engine's own KV (one span a sequence), and a prefix tree of 16-token blocks (a view
  // of many small spans, as a scorer model's).
  for (bool tree : {false, true}) {
    auto make = [&] {
      EngineOptions o;
      o.n_threads = 2;
      o.n_ctx = 640;
      o.n_batch = 640;
      o.max_sequences = 2;
      o.pass_invariant = true;
      std::unique_ptr<Engine> e;
      Status s;
      if (tree) {
        const HParams& hp = model_->hparams();
        const KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, o.n_ctx};
        PrefixTreeKvOptions ko;
        ko.max_blocks = 2 * (o.n_ctx / ko.block_tokens + 1);
        ko.fast_budget_bytes = uint64_t(ko.max_blocks) * PrefixTreeKv::BlockBytes(shape, 16, 64);
        std::unique_ptr<RamSlowTier> slow;
        std::unique_ptr<PrefixTreeKv> kv;
        s = RamSlowTier::Create(ko.fast_budget_bytes, &slow);
        if (s.ok()) s = PrefixTreeKv::Create(shape, ko, std::move(slow), &kv);
        if (s.ok()) s = Engine::Create(*model_, o, std::move(kv), &e);
      } else {
        s = Engine::Create(*model_, o, &e);
      }
      EXPECT_TRUE(s.ok()) << s.ToString();
      return e;
    };
    const char* kv = tree ? "prefix tree" : "memory";
    std::vector<float> whole;
    {
      auto engine = make();
      SeqId a;
      ASSERT_TRUE(engine->NewSequence(&a).ok());
      ASSERT_TRUE(engine->Prefill(a, tokens, &whole, true).ok());
    }
    ASSERT_EQ(whole.size(), size_t(n) * V);
    auto engine = make();
    SeqId b, other;
    ASSERT_TRUE(engine->NewSequence(&b).ok());
    ASSERT_TRUE(engine->NewSequence(&other).ok());
    std::vector<float> ignored;
    ASSERT_TRUE(engine->Prefill(other, {tokens.data() + 7, 40}, &ignored).ok());
    int32_t done = 0;
    for (int32_t piece : {1, 30, 3, 77, 1, 45, 400, 1, 1, 41}) {
      std::vector<float> part;
      if (piece == 1 && done % 2) {
        // Beside another sequence's tokens in the same pass.
        ForwardBatch batch;
        batch.Add(other, engine->kv().Length(other), {tokens.data() + 3, 5}, true);
        batch.Add(b, done, {tokens.data() + done, 1}, true);
        ASSERT_TRUE(engine->Evaluate(batch, &part).ok());
        part.erase(part.begin(), part.begin() + 5 * ptrdiff_t(V));
      } else {
        ASSERT_TRUE(engine->Prefill(b, {tokens.data() + done, size_t(piece)}, &part, true).ok());
      }
      ASSERT_EQ(part.size(), size_t(piece) * V);
      for (int32_t t = 0; t < piece; ++t)
        for (size_t i = 0; i < V; ++i)
          ASSERT_EQ(part[size_t(t) * V + i], whole[size_t(done + t) * V + i])
              << GetParam().name << ", " << kv << ": position " << done + t << ", logit " << i;
      done += piece;
    }
    ASSERT_EQ(done, n);
  }
}

TEST_P(ForwardTest, SequencesInOneBatchEqualSeparateRuns) {
  auto t1 = RandomTokens(9, 1), t2 = RandomTokens(14, 2);
  auto engine = MakeEngine(2, 64, 4);
  SeqId s1, s2, r1, r2;
  ASSERT_TRUE(engine->NewSequence(&s1).ok());
  ASSERT_TRUE(engine->NewSequence(&s2).ok());
  ForwardBatch batch;
  batch.Add(s1, 0, t1, true);
  batch.Add(s2, 0, t2, true);
  std::vector<float> together;
  ASSERT_TRUE(engine->Evaluate(batch, &together).ok());
  ASSERT_TRUE(engine->NewSequence(&r1).ok());
  ASSERT_TRUE(engine->NewSequence(&r2).ok());
  std::vector<float> a, b;
  ASSERT_TRUE(engine->Prefill(r1, t1, &a, true).ok());
  ASSERT_TRUE(engine->Prefill(r2, t2, &b, true).ok());
  a.insert(a.end(), b.begin(), b.end());
  ASSERT_EQ(a.size(), together.size());
  EXPECT_LT(MaxDiff(a.data(), together.data(), a.size()) / MaxAbs(a.data(), a.size()), 1e-5);
  EXPECT_EQ(engine->kv().Length(s1), 9);
  EXPECT_EQ(engine->kv().Length(s2), 14);
}

TEST_P(ForwardTest, ThreadCountDoesNotChangeResults) {
  auto tokens = RandomTokens(24, 3);
  std::vector<float> ref;
  for (int threads : {1, 2, 3}) {
    auto engine = MakeEngine(threads, 64);
    SeqId seq;
    ASSERT_TRUE(engine->NewSequence(&seq).ok());
    std::vector<float> logits;
    ASSERT_TRUE(engine->Prefill(seq, tokens, &logits, true).ok());
    if (ref.empty()) {
      ref = logits;
    } else {
      EXPECT_LT(MaxDiff(ref.data(), logits.data(), ref.size()) / MaxAbs(ref.data(), ref.size()),
                1e-6)
          << threads << " threads";
    }
  }
}

// Matrices repacked for the CPU's kernels (the kRows16 layout of Q4_0, Q4_1, Q8_0, Q4_K and Q6_K
// on AVX-512, a tied head included) give every token the value of the file's layout, in a
// prefill and in decode steps: the same bits where only Q4_K is repacked, otherwise the
// same up to float rounding. The copy replaces the mapped file pages, and an engine that
// does not repack reads the file.
TEST_P(ForwardTest, RepackedWeightsGiveTheValuesOfTheFile) {
  bool any_native = false, only_q4k = true;
  auto run = [&](bool repack, std::vector<float>* out, uint64_t* repacked) {
    std::unique_ptr<Model> model;
    ASSERT_TRUE(Model::Load(path_, &model).ok());
    const ModelWeights& w = model->weights();
    std::vector<const TensorRef*> mats{&w.output};
    for (const LayerWeights& L : w.layers)
      for (const TensorRef* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        mats.push_back(t);
    for (const TensorRef* t : mats) {
      if (!kernels::Rows16Preferred(t->type)) continue;
      any_native = true;
      only_q4k = only_q4k && t->type == DType::kQ4_K;
    }
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 64;
    o.n_batch = 16;
    o.repack_weights = repack;
    std::unique_ptr<Engine> e;
    ASSERT_TRUE(Engine::Create(*model, o, &e).ok());
    SeqId seq;
    ASSERT_TRUE(e->NewSequence(&seq).ok());
    std::vector<float> logits;
    ASSERT_TRUE(e->Prefill(seq, RandomTokens(20, 5), &logits, true).ok());
    *out = logits;
    for (int32_t t : {7, 11, 13}) {  // decode steps: one-token products
      const std::vector<int32_t> one{t};
      ASSERT_TRUE(e->Prefill(seq, one, &logits, false).ok());
      out->insert(out->end(), logits.begin(), logits.end());
    }
    *repacked = model->repacked_bytes();
  };
  std::vector<float> file, packed;
  uint64_t file_bytes = 0, packed_bytes = 0;
  run(false, &file, &file_bytes);
  run(true, &packed, &packed_bytes);
  EXPECT_EQ(file_bytes, 0u);
  EXPECT_EQ(packed_bytes > 0, any_native);
  ASSERT_EQ(file.size(), packed.size());
  if (!any_native || only_q4k) {
    EXPECT_EQ(0, std::memcmp(file.data(), packed.data(), file.size() * sizeof(float)));
    return;
  }
  float peak = 0;
  for (float v : file) peak = std::max(peak, std::fabs(v));
  for (size_t i = 0; i < file.size(); ++i)
    ASSERT_NEAR(packed[i], file[i], 1e-3f * peak) << "logit " << i;
}

INSTANTIATE_TEST_SUITE_P(Architectures, ForwardTest, ::testing::ValuesIn(Cases()),
                         [](const auto& p) { return std::string(p.param.name); });

class EngineErrorsTest : public ForwardTest {};

TEST_P(EngineErrorsTest, BadTokensAndFullContextAreClearErrors) {
  auto engine = MakeEngine(1, 16);
  SeqId seq;
  ASSERT_TRUE(engine->NewSequence(&seq).ok());
  std::vector<float> logits;
  const int32_t bad = model_->hparams().n_vocab;
  Status s = engine->Prefill(seq, {&bad, 1}, &logits);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.ToString();
  EXPECT_EQ(engine->kv().Length(seq), 0) << "a failed pass must not grow the sequence";

  auto tokens = RandomTokens(129, 4);  // context is 128
  s = engine->Prefill(seq, tokens, &logits);
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange);
  EXPECT_NE(s.message().find("context length 128"), std::string::npos) << s.ToString();

  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(engine.get(), &session).ok());
  std::string long_prompt(4000, 'x');
  s = session->Generate(long_prompt, GenerateParams(), nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange) << s.ToString();
}

TEST_P(EngineErrorsTest, GenerationIsDeterministicAndGreedyFollowsTheLogits) {
  auto engine = MakeEngine(2, 32);
  GenerateParams p;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.sampling.temperature = 0;
  std::vector<int32_t> prompt = RandomTokens(6, 8);
  GenerationRequest r;
  ASSERT_TRUE(engine->NewSequence(&r.seq).ok());
  r.prompt = prompt;
  r.params = p;
  ASSERT_TRUE(engine->Generate({&r, 1}, nullptr).ok());
  ASSERT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(r.stop_reason, StopReason::kMaxTokens);
  // Each greedy token is the argmax of the reference logits after the tokens before it,
  // wherever the reference's top two are not a near-tie.
  std::vector<int32_t> seq = prompt;
  for (int32_t tok : r.tokens) {
    auto ref = testing::ReferenceLogits(*model_, seq).back();
    std::vector<float> sorted = ref;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 0.05 * std::fabs(sorted[0])) {
      EXPECT_EQ(tok, std::max_element(ref.begin(), ref.end()) - ref.begin());
    }
    seq.push_back(tok);
  }
  // Same seed, same sampled text.
  p.sampling.temperature = 0.9f;
  p.sampling.seed = 42;
  std::vector<std::vector<int32_t>> outs;
  for (int i = 0; i < 2; ++i) {
    GenerationRequest q;
    ASSERT_TRUE(engine->NewSequence(&q.seq).ok());
    q.prompt = prompt;
    q.params = p;
    ASSERT_TRUE(engine->Generate({&q, 1}, nullptr).ok());
    outs.push_back(q.tokens);
    ASSERT_TRUE(engine->RemoveSequence(q.seq).ok());
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST_P(EngineErrorsTest, ChatReusesTheConversationPrefix) {
  auto engine = MakeEngine(2, 64);
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(engine.get(), &session).ok());
  GenerateParams p;
  p.max_tokens = 4;
  p.sampling.temperature = 0;
  std::string answer;
  Status s = session->Chat("hello there", p, nullptr, &answer, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const size_t after_first = session->tokens().size();
  EXPECT_EQ(int32_t(after_first), engine->kv().Length(session->seq()));
  s = session->Chat("and again", p, nullptr, &answer, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(session->tokens().size(), after_first);
  EXPECT_EQ(int32_t(session->tokens().size()), engine->kv().Length(session->seq()));
}

TEST_P(EngineErrorsTest, AChatMessageThatIsNotUtf8IsRefusedAndTheConversationGoesOn) {
  auto engine = MakeEngine(2, 64);
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(engine.get(), &session).ok());
  GenerateParams p;
  p.max_tokens = 4;
  p.sampling.temperature = 0;
  std::string answer;
  ASSERT_TRUE(session->Chat("hello there", p, nullptr, &answer, nullptr).ok());
  const std::vector<int32_t> before = session->tokens();
  // The offset is the byte in the message itself, not in the rendered template.
  Status s = session->Chat("ok \xff then", p, nullptr, &answer, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("at byte 3 (of 9)"), std::string::npos) << s.ToString();
  EXPECT_EQ(session->tokens(), before);
  EXPECT_EQ(int32_t(before.size()), engine->kv().Length(session->seq()));
  // The next message continues the same conversation (its prefix is reused).
  ASSERT_TRUE(session->Chat("and again", p, nullptr, &answer, nullptr).ok());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), session->tokens().begin()));
}

INSTANTIATE_TEST_SUITE_P(Llama, EngineErrorsTest, ::testing::Values(Cases()[0]),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace strata
