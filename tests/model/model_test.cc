#include "runtime/model/model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include <gtest/gtest.h>

#include "runtime/model/gguf_writer.h"
#include "runtime/model/model_math.h"
#include "runtime/model/synthetic_model.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

using kernels::DType;
using testing::TempFile;

Status LoadSynthetic(const SyntheticModelSpec& spec, const std::string& name,
                     std::unique_ptr<Model>* out) {
  TempFile tmp(name);
  STRATA_RETURN_IF_ERROR(WriteSyntheticModel(spec, tmp.path()));
  // The mapping keeps the data alive after the file is unlinked.
  return Model::Load(tmp.path(), out);
}

// Copies a parsed file into a writer, letting the test drop or change entries: `keep_kv`
// and `keep_tensor` decide what is copied; `extra` adds more before serialization.
struct Edit {
  std::function<bool(const std::string&)> keep_kv = [](const std::string&) { return true; };
  std::function<bool(const GgufTensor&)> keep_tensor = [](const GgufTensor&) { return true; };
  std::function<void(GgufWriter*)> extra = [](GgufWriter*) {};
};

Status Rewrite(const SyntheticModelSpec& spec, const Edit& edit, const std::string& out_path) {
  GgufWriter src;
  STRATA_RETURN_IF_ERROR(BuildSyntheticModel(spec, &src));
  const std::vector<uint8_t> bytes = src.Serialize();
  std::unique_ptr<GgufFile> f;
  STRATA_RETURN_IF_ERROR(GgufFile::FromMemory(bytes.data(), bytes.size(), &f));
  GgufWriter w;
  for (const auto& [key, v] : f->metadata()) {
    if (!edit.keep_kv(key)) continue;
    switch (v.type) {
      case GgufValueType::kString:
        w.AddString(key, std::get<std::string_view>(v.scalar));
        break;
      case GgufValueType::kUint32:
        w.AddU32(key, uint32_t(std::get<uint64_t>(v.scalar)));
        break;
      case GgufValueType::kFloat32:
        w.AddF32(key, float(std::get<double>(v.scalar)));
        break;
      case GgufValueType::kBool:
        w.AddBool(key, std::get<bool>(v.scalar));
        break;
      case GgufValueType::kArray:
        if (v.elem_type == GgufValueType::kString) {
          w.AddStringArray(key, std::vector<std::string>(v.strings.begin(), v.strings.end()));
        } else {
          w.AddArray(key, v.elem_type, v.array_data, v.array_len);
        }
        break;
      default:
        return Status::Internal("Rewrite: unexpected metadata type");
    }
  }
  for (const GgufTensor& t : f->tensors()) {
    if (!edit.keep_tensor(t)) continue;
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    STRATA_RETURN_IF_ERROR(w.AddTensor(
        t.name, t.type, ne, {static_cast<const uint8_t*>(t.data), static_cast<size_t>(t.nbytes)}));
  }
  edit.extra(&w);
  return w.WriteFile(out_path);
}

// Loads a rewritten synthetic llama and returns the (expected) error.
Status LoadEdited(const Edit& edit, SyntheticModelSpec spec = {}) {
  TempFile tmp("edited.gguf");
  Status s = Rewrite(spec, edit, tmp.path());
  if (!s.ok()) return s;
  std::unique_ptr<Model> m;
  return Model::Load(tmp.path(), &m);
}

void ExpectRef(const TensorRef& r, DType type, int64_t cols, int64_t rows) {
  EXPECT_TRUE(r.present());
  EXPECT_EQ(r.type, type);
  EXPECT_EQ(r.cols, cols);
  EXPECT_EQ(r.rows, rows);
  EXPECT_EQ(r.row_bytes, kernels::RowBytes(type, cols));
}

TEST(ModelTest, LoadsSyntheticLlama) {
  SyntheticModelSpec spec;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "llama.gguf", &m));
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, Arch::kLlama);
  EXPECT_EQ(hp.n_vocab, 384);
  EXPECT_EQ(hp.n_embd, 64);
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.n_rep(), 2);
  EXPECT_EQ(hp.head_dim, 16);
  EXPECT_EQ(hp.rope_dim, 16);
  EXPECT_EQ(hp.n_ff, 128);
  EXPECT_EQ(hp.n_ctx_train, 512);
  EXPECT_EQ(hp.rope_layout, kernels::RopeLayout::kNormal);
  EXPECT_FALSE(hp.tied_output);
  EXPECT_FALSE(hp.has_qkv_bias);
  EXPECT_FALSE(hp.has_qk_norm);
  EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.f);
  const ModelWeights& w = m->weights();
  ExpectRef(w.tok_embd, DType::kF32, 64, 384);
  ExpectRef(w.output, DType::kF32, 64, 384);
  EXPECT_NE(w.output.data, w.tok_embd.data);
  EXPECT_FALSE(w.rope_freqs.present());
  ASSERT_EQ(w.layers.size(), 2u);
  ExpectRef(w.layers[1].wq, DType::kF32, 64, 64);
  ExpectRef(w.layers[1].wk, DType::kF32, 64, 32);
  ExpectRef(w.layers[1].wo, DType::kF32, 64, 64);
  ExpectRef(w.layers[1].w_down, DType::kF32, 128, 64);
  ExpectRef(w.layers[0].attn_norm, DType::kF32, 64, 1);
  EXPECT_FALSE(w.layers[0].bq.present());
  // Norm weights are near 1 (the synthetic model's choice), so the data is really bound.
  EXPECT_NEAR(w.output_norm.f32()[5], 1.f, 0.11f);
  EXPECT_EQ(m->chat_template(), ChatTemplateKind::kChatML);
  EXPECT_EQ(m->default_system_prompt(), "You are a tiny synthetic test model.");
  EXPECT_GT(m->weight_bytes(), uint64_t(2 * 384 * 64 * 4));
  EXPECT_EQ(m->identity_hex().size(), 16u);
}

TEST(ModelTest, WrittenSyntheticModelIsTheBuiltOneMadeTensorByTensor) {
  SyntheticModelSpec spec;
  spec.arch = "qwen2";
  spec.weight_type = DType::kQ4_K;
  spec.n_embd = 256;
  spec.n_head = 4;
  spec.n_ff = 512;
  GgufWriter w;
  STRATA_ASSERT_OK(BuildSyntheticModel(spec, &w));
  const std::vector<uint8_t> built = w.Serialize();
  TempFile tmp("written.gguf");
  STRATA_ASSERT_OK(WriteSyntheticModel(spec, tmp.path()));
  FILE* f = std::fopen(tmp.path().c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<uint8_t> written(built.size() + 1);
  const size_t n = std::fread(written.data(), 1, written.size(), f);
  std::fclose(f);
  ASSERT_EQ(n, built.size());
  written.resize(n);
  EXPECT_TRUE(written == built);
}

TEST(ModelTest, IdentityFollowsContentNotPath) {
  SyntheticModelSpec spec;
  std::unique_ptr<Model> a, b, c;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "id_a.gguf", &a));
  STRATA_ASSERT_OK(LoadSynthetic(spec, "id_b.gguf", &b));
  EXPECT_EQ(a->identity(), b->identity());
  spec.seed = 2;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "id_c.gguf", &c));
  EXPECT_NE(a->identity(), c->identity());
}

TEST(ModelTest, LoadsQwen2WithBiasesAndQwen3WithQkNorm) {
  SyntheticModelSpec spec;
  spec.arch = "qwen2";
  spec.tied_output = true;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "qwen2.gguf", &m));
  EXPECT_EQ(m->hparams().arch, Arch::kQwen2);
  EXPECT_EQ(m->hparams().rope_layout, kernels::RopeLayout::kNeox);
  EXPECT_TRUE(m->hparams().has_qkv_bias);
  EXPECT_TRUE(m->hparams().tied_output);
  EXPECT_EQ(m->weights().output.data, m->weights().tok_embd.data);
  ExpectRef(m->weights().layers[0].bq, DType::kF32, 64, 1);
  ExpectRef(m->weights().layers[0].bk, DType::kF32, 32, 1);

  spec = {};
  spec.arch = "qwen3";
  spec.head_dim = 32;  // qwen3 decouples head_dim from n_embd / n_head
  STRATA_ASSERT_OK(LoadSynthetic(spec, "qwen3.gguf", &m));
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, Arch::kQwen3);
  EXPECT_EQ(hp.rope_layout, kernels::RopeLayout::kNeox);
  EXPECT_TRUE(hp.has_qk_norm);
  EXPECT_EQ(hp.head_dim, 32);
  ExpectRef(m->weights().layers[1].q_norm, DType::kF32, 32, 1);
  ExpectRef(m->weights().layers[1].wq, DType::kF32, 64, 128);
  ExpectRef(m->weights().layers[1].wo, DType::kF32, 128, 64);
}

TEST(ModelTest, RopeScalingAndFrequencyFactors) {
  SyntheticModelSpec spec;
  spec.rope_linear_factor = 4.f;
  spec.rope_freqs = true;
  spec.rope_base = 500000.f;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "rope.gguf", &m));
  EXPECT_FLOAT_EQ(m->hparams().rope_freq_scale, 0.25f);
  EXPECT_FLOAT_EQ(m->hparams().rope_base, 500000.f);
  ExpectRef(m->weights().rope_freqs, DType::kF32, 8, 1);
}

TEST(ModelTest, YarnScalingIsReadWithItsDefaultsAndChangesTheIdentity) {
  SyntheticModelSpec spec;
  spec.rope_yarn_factor = 4.f;
  spec.rope_yarn_orig_ctx = 256;
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "yarn.gguf", &m));
  const HParams& hp = m->hparams();
  EXPECT_TRUE(hp.rope_yarn);
  EXPECT_FLOAT_EQ(hp.rope_freq_scale, 0.25f);
  EXPECT_EQ(hp.rope_orig_ctx, 256);
  EXPECT_FLOAT_EQ(hp.rope_yarn_beta_fast, 32.f);
  EXPECT_FLOAT_EQ(hp.rope_yarn_beta_slow, 1.f);
  EXPECT_NEAR(hp.rope_attn_factor, 1.0 + 0.1 * std::log(4.0), 1e-6);
  // The first pairs turn often over 256 tokens and keep their frequency; the last are
  // interpolated by the factor.
  const std::vector<float> inv = RopeInverseFrequencies(*m);
  const int32_t half = hp.rope_dim / 2;
  EXPECT_FLOAT_EQ(inv[0], 1.f);
  EXPECT_NEAR(inv[size_t(half - 1)], 0.25 * std::pow(10000.0, -2.0 * (half - 1) / hp.rope_dim),
              1e-9);
  std::unique_ptr<Model> plain;
  spec.rope_yarn_factor = 0;
  STRATA_ASSERT_OK(LoadSynthetic(spec, "plain.gguf", &plain));
  EXPECT_NE(m->identity_hex(), plain->identity_hex());
}

TEST(ModelTest, QuantizedWeightTypesFollowTheKernelTable) {
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const kernels::TypeInfo* info = kernels::FindTypeInfo(raw);
    if (info == nullptr || info->block_elems > 64) continue;  // n_embd = 64
    SCOPED_TRACE(info->name);
    SyntheticModelSpec spec;
    spec.weight_type = info->type;
    std::unique_ptr<Model> m;
    Status s = LoadSynthetic(spec, "quant.gguf", &m);
    if (info->weight_supported) {
      STRATA_ASSERT_OK(s);
      ExpectRef(m->weights().layers[0].w_up, info->type, 64, 128);
    } else {
      EXPECT_EQ(s.code(), Status::Code::kNotSupported);
      EXPECT_NE(
          s.message().find("tensor 'blk.0.attn_q.weight' has type " + std::string(info->name)),
          std::string::npos)
          << s.message();
    }
  }
}

TEST(ModelTest, K256QuantsNeedWideRows) {
  SyntheticModelSpec spec;
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.weight_type = DType::kQ4_K;
  spec.embd_type = DType::kQ8_0;
  std::unique_ptr<Model> m;
  Status s = LoadSynthetic(spec, "q4k.gguf", &m);
  if (kernels::GetTypeInfo(DType::kQ4_K).weight_supported) {
    STRATA_ASSERT_OK(s);
    ExpectRef(m->weights().layers[0].w_down, DType::kQ4_K, 512, 256);
    ExpectRef(m->weights().tok_embd, DType::kQ8_0, 256, 384);
  } else {
    EXPECT_EQ(s.code(), Status::Code::kNotSupported);
  }
}

// A file that uses a GGUF type Strata has no kernels for is refused at load, naming the
// tensor, its type, and the types that would work, whichever weight it is.
TEST(ModelTest, TypesWithoutKernelsAreRefusedByName) {
  const std::string supported =
      "supported weight types: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, "
      "Q6_K, IQ4_NL, IQ4_XS, BF16)";
  for (DType t : {DType::kIQ2_XXS, DType::kIQ3_S, DType::kTQ1_0, DType::kIQ1_M}) {
    for (bool embedding : {false, true}) {
      SCOPED_TRACE(std::string(kernels::TypeName(t)) + (embedding ? " embedding" : " weights"));
      SyntheticModelSpec spec;
      spec.n_embd = 256;
      spec.n_ff = 512;
      spec.weight_type = embedding ? DType::kQ8_0 : t;
      spec.embd_type = embedding ? t : DType::kQ8_0;
      std::unique_ptr<Model> m;
      const Status s = LoadSynthetic(spec, "unsupported.gguf", &m);
      EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
      const std::string tensor = embedding ? "token_embd.weight" : "blk.0.attn_q.weight";
      EXPECT_NE(s.message().find("tensor '" + tensor + "' has type " + kernels::TypeName(t) +
                                 ", which Strata has no kernels for"),
                std::string::npos)
          << s.message();
      EXPECT_NE(s.message().find(supported), std::string::npos) << s.message();
    }
  }
}

// A type id no published GGUF version defines stays a clean error naming the tensor.
TEST(ModelTest, UnknownTypeIdIsACleanError) {
  SyntheticModelSpec spec;
  GgufWriter w;
  STRATA_ASSERT_OK(BuildSyntheticModel(spec, &w));
  GgufLayout layout;
  std::vector<uint8_t> bytes = w.Serialize(&layout);
  std::unique_ptr<GgufFile> parsed;
  STRATA_ASSERT_OK(GgufFile::FromMemory(bytes.data(), bytes.size(), &parsed));
  size_t index = 0;
  while (parsed->tensors()[index].name != "blk.0.attn_q.weight") ++index;
  for (uint32_t raw : {4u, 31u, 99u, 0xffffffffu}) {
    std::memcpy(bytes.data() + layout.tensors[index].type_at, &raw, 4);
    TempFile tmp("unknown_type.gguf");
    {
      std::FILE* f = std::fopen(tmp.path().c_str(), "wb");
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
      std::fclose(f);
    }
    std::unique_ptr<Model> m;
    const Status s = Model::Load(tmp.path(), &m);
    EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
    EXPECT_NE(s.message().find("tensor 'blk.0.attn_q.weight': unknown tensor type " +
                               std::to_string(raw)),
              std::string::npos)
        << s.message();
  }
}

TEST(ModelTest, ErrorsNameTheProblem) {
  auto expect = [](Status s, Status::Code code, const std::string& needle) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  Edit e;
  e.keep_tensor = [](const GgufTensor& t) { return t.name != "blk.1.ffn_up.weight"; };
  expect(LoadEdited(e), Status::Code::kNotFound,
         "tensor 'blk.1.ffn_up.weight' is missing (expected shape [64, 128])");

  e = {};
  e.extra = [](GgufWriter* w) {
    std::vector<float> z(4);
    ASSERT_TRUE(w->AddTensorF32("blk.0.mystery.weight", DType::kF32, {4}, z).ok());
  };
  expect(LoadEdited(e), Status::Code::kNotSupported,
         "tensor 'blk.0.mystery.weight' is not part of the llama layout");

  e = {};
  e.keep_tensor = [](const GgufTensor& t) { return t.name != "blk.0.attn_k.weight"; };
  e.extra = [](GgufWriter* w) {
    std::vector<float> z(64 * 16);
    ASSERT_TRUE(w->AddTensorF32("blk.0.attn_k.weight", DType::kF32, {64, 16}, z).ok());
  };
  expect(LoadEdited(e), Status::Code::kCorruption,
         "tensor 'blk.0.attn_k.weight': shape [64, 16] does not match the expected [64, 32]");

  e = {};
  e.keep_tensor = [](const GgufTensor& t) { return t.name != "output_norm.weight"; };
  e.extra = [](GgufWriter* w) {
    std::vector<float> z(64);
    ASSERT_TRUE(w->AddTensorF32("output_norm.weight", DType::kF16, {64}, z).ok());
  };
  expect(LoadEdited(e), Status::Code::kNotSupported,
         "tensor 'output_norm.weight' has type F16 (F32 expected)");

  e = {};
  e.keep_kv = [](const std::string& k) { return k != "general.architecture"; };
  e.extra = [](GgufWriter* w) { w->AddString("general.architecture", "gptneox"); };
  expect(LoadEdited(e), Status::Code::kNotSupported, "architecture 'gptneox' is not supported");

  e = {};
  e.keep_kv = [](const std::string& k) { return k != "llama.context_length"; };
  expect(LoadEdited(e), Status::Code::kNotFound, "metadata 'llama.context_length' is missing");

  e = {};
  e.keep_kv = [](const std::string& k) { return k != "llama.attention.head_count_kv"; };
  e.extra = [](GgufWriter* w) { w->AddU32("llama.attention.head_count_kv", 3); };
  expect(LoadEdited(e), Status::Code::kCorruption,
         "attention.head_count 4 is not a multiple of attention.head_count_kv 3");

  e = {};
  e.keep_kv = [](const std::string& k) { return k != "llama.block_count"; };
  e.extra = [](GgufWriter* w) { w->AddU32("llama.block_count", 0); };
  expect(LoadEdited(e), Status::Code::kCorruption,
         "metadata 'llama.block_count' value 0 is outside 1..1024");

  e = {};
  e.keep_kv = [](const std::string& k) { return k != "llama.vocab_size"; };
  e.extra = [](GgufWriter* w) { w->AddU32("llama.vocab_size", 999); };
  expect(LoadEdited(e), Status::Code::kCorruption, "llama.vocab_size 999 differs from the 384");

  e = {};
  e.extra = [](GgufWriter* w) { w->AddString("llama.rope.scaling.type", "longrope"); };
  expect(LoadEdited(e), Status::Code::kNotSupported,
         "rope.scaling.type 'longrope' is not supported (none, linear, yarn)");

  e = {};
  e.extra = [](GgufWriter* w) {
    w->AddString("llama.rope.scaling.type", "yarn");
    w->AddF32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
  };
  expect(LoadEdited(e), Status::Code::kNotSupported,
         "rope.scaling.yarn_log_multiplier (YaRN with a log multiplier) is not supported");

  e = {};
  e.keep_kv = [](const std::string& k) { return k != "tokenizer.ggml.model"; };
  e.extra = [](GgufWriter* w) { w->AddString("tokenizer.ggml.model", "bert"); };
  expect(LoadEdited(e), Status::Code::kNotSupported, "tokenizer.ggml.model 'bert'");

  SyntheticModelSpec qwen2;
  qwen2.arch = "qwen2";
  e = {};
  e.keep_tensor = [](const GgufTensor& t) { return t.name != "blk.0.attn_v.bias"; };
  expect(LoadEdited(e, qwen2), Status::Code::kNotFound, "tensor 'blk.0.attn_v.bias' is missing");
}

TEST(ModelTest, RealModelHyperParameters) {
  STRATA_REQUIRE_REAL_MODEL(path);
  std::unique_ptr<Model> m;
  STRATA_ASSERT_OK(Model::Load(path, &m));
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, Arch::kLlama);
  EXPECT_EQ(hp.n_layer, 30);
  EXPECT_EQ(hp.n_head, 9);
  EXPECT_EQ(hp.n_head_kv, 3);
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.rope_dim, 64);
  EXPECT_EQ(hp.n_embd, 576);
  EXPECT_EQ(hp.n_ff, 1536);
  EXPECT_EQ(hp.n_vocab, 49152);
  EXPECT_EQ(hp.n_ctx_train, 8192);
  EXPECT_FLOAT_EQ(hp.rope_base, 100000.f);
  EXPECT_FLOAT_EQ(hp.rms_eps, 1e-5f);
  EXPECT_EQ(hp.rope_layout, kernels::RopeLayout::kNormal);
  EXPECT_TRUE(hp.tied_output);
  EXPECT_EQ(m->weights().output.data, m->weights().tok_embd.data);
  ExpectRef(m->weights().tok_embd, DType::kQ8_0, 576, 49152);
  ExpectRef(m->weights().layers[29].wq, DType::kQ4_1, 576, 576);
  ExpectRef(m->weights().layers[29].wk, DType::kQ4_1, 576, 192);
  ExpectRef(m->weights().layers[0].w_down, DType::kQ4_1, 1536, 576);
  EXPECT_EQ(m->chat_template(), ChatTemplateKind::kChatML);
  EXPECT_EQ(m->default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_LT(m->weight_bytes(), m->gguf().file_size());
  EXPECT_GT(m->weight_bytes(), m->gguf().file_size() * 9 / 10);
  std::unique_ptr<Model> again;
  STRATA_ASSERT_OK(Model::Load(path, &again));
  EXPECT_EQ(again->identity(), m->identity());
}

}  // namespace
}  // namespace strata
