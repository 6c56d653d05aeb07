#include "runtime/model/tokenizer.h"

#include <thread>

#include <gtest/gtest.h>

#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/pretokenizer.h"
#include "runtime/model/synthetic_model.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

using Words = std::vector<std::string_view>;

Words Split(PreTokenizerKind kind, std::string_view text) {
  Words w;
  PreTokenize(kind, text, &w);
  return w;
}

TEST(PreTokenizerTest, Gpt2Split) {
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "Hello  world's 123abc\n\n x"),
            (Words{"Hello", " ", " world", "'s", " 123", "abc", "\n\n", " x"}));
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "\tfoo"), (Words{"\t", "foo"}));
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "a!!  "), (Words{"a", "!!", "  "}));
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "IT'S it'S"), (Words{"IT", "'", "S", " it", "'", "S"}));
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "café ½"), (Words{"café", " ½"}));
  EXPECT_TRUE(Split(PreTokenizerKind::kGpt2, "").empty());
}

TEST(PreTokenizerTest, SmolLMIsolatesEveryDigit) {
  EXPECT_EQ(Split(PreTokenizerKind::kSmolLM, "abc 123 x"),
            (Words{"abc", " ", "1", "2", "3", " x"}));
  EXPECT_EQ(Split(PreTokenizerKind::kSmolLM, "v2.0"), (Words{"v", "2", ".", "0"}));
}

TEST(PreTokenizerTest, Llama3AndQwen2) {
  EXPECT_EQ(Split(PreTokenizerKind::kLlama3, "Hello WORLD'S 12345 ..\n\n  x"),
            (Words{"Hello", " WORLD", "'S", " ", "123", "45", " ..\n\n", " ", " x"}));
  EXPECT_EQ(Split(PreTokenizerKind::kLlama3, "\tfoo"), (Words{"\tfoo"}));
  EXPECT_EQ(Split(PreTokenizerKind::kLlama3, "a \n\n b"), (Words{"a", " \n\n", " b"}));
  EXPECT_EQ(Split(PreTokenizerKind::kQwen2, "x 12345"), (Words{"x", " ", "1", "2", "3", "4", "5"}));
}

TEST(PreTokenizerTest, NamesAndUnknownNames) {
  PreTokenizerKind k;
  ASSERT_TRUE(PreTokenizerFromName("smollm", &k).ok());
  EXPECT_EQ(k, PreTokenizerKind::kSmolLM);
  ASSERT_TRUE(PreTokenizerFromName("llama-bpe", &k).ok());
  EXPECT_EQ(k, PreTokenizerKind::kLlama3);
  ASSERT_TRUE(PreTokenizerFromName("qwen2", &k).ok());
  EXPECT_EQ(k, PreTokenizerKind::kQwen2);
  ASSERT_TRUE(PreTokenizerFromName("default", &k).ok());
  EXPECT_EQ(k, PreTokenizerKind::kGpt2);
  Status s = PreTokenizerFromName("deepseek-coder", &k);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported);
  EXPECT_NE(s.message().find("tokenizer.ggml.pre 'deepseek-coder'"), std::string::npos);
}

TEST(Utf8Test, ValidityAndOffsets) {
  size_t at = 99;
  EXPECT_TRUE(IsValidUtf8("", &at));
  EXPECT_TRUE(IsValidUtf8("héllo €😀", &at));
  struct Case {
    std::string text;
    size_t offset;
  };
  for (const Case& c : std::vector<Case>{{"ab\xC3(", 2},
                                         {"\xC0\x80", 0},          // overlong
                                         {"x\xED\xA0\x80", 1},     // surrogate
                                         {"abc\xE2\x82", 3},       // truncated at the end
                                         {"\xF4\x90\x80\x80", 0},  // above U+10FFFF
                                         {"ok\x80", 2},            // lone continuation
                                         {"\xFF", 0}}) {
    EXPECT_FALSE(IsValidUtf8(c.text, &at)) << c.text;
    EXPECT_EQ(at, c.offset) << c.text;
  }
}

TEST(Utf8Test, StreamNeverEmitsBrokenCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("\xE2"), "");
  EXPECT_EQ(s.Push("\x82"), "");
  EXPECT_EQ(s.Push("\xAC!"), "€!");
  EXPECT_EQ(s.Push("a\xF0\x9F"), "a");
  EXPECT_EQ(s.Push("\x98\x80"
                   "b"),
            "😀b");
  EXPECT_EQ(s.Push("\xFF"
                   "c"),
            "\xEF\xBF\xBD"
            "c");                                  // invalid byte -> U+FFFD
  EXPECT_EQ(s.Push("\xE2\x28"), "\xEF\xBF\xBD(");  // bad continuation
  EXPECT_EQ(s.Push("\xF0\x9F"), "");
  EXPECT_EQ(s.Flush(), "\xEF\xBF\xBD");  // a dangling partial character
  EXPECT_EQ(s.Flush(), "");
  // Byte-at-a-time pushes reassemble the text exactly.
  const std::string text = "naïve 👨‍👩‍👧 日本";
  std::string out;
  for (char c : text) out += s.Push(std::string_view(&c, 1));
  out += s.Flush();
  EXPECT_EQ(out, text);
}

class SyntheticBpeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticModelSpec spec;
    GgufWriter w;
    ASSERT_TRUE(BuildSyntheticModel(spec, &w).ok());
    bytes_ = w.Serialize();
    STRATA_ASSERT_OK(GgufFile::FromMemory(bytes_.data(), bytes_.size(), &gguf_));
    STRATA_ASSERT_OK(Tokenizer::FromGguf(*gguf_, &tok_));
  }
  std::vector<int32_t> Encode(std::string_view text, bool special = false) {
    std::vector<int32_t> ids;
    Status s = tok_->Encode(text, /*add_bos=*/true, special, &ids);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return ids;
  }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SyntheticBpeTest, RoundTripsAnyText) {
  EXPECT_EQ(tok_->n_vocab(), 384);
  const std::string training = SyntheticTrainingText();
  const std::vector<int32_t> ids = Encode(training);
  EXPECT_LT(ids.size(), training.size() / 2) << "the trained merges should compress their text";
  EXPECT_EQ(tok_->Decode(ids), training);
  for (std::string text : {"", "x", "Ünïcödé 日本 😀 \t\n  spaced", "<|im_start|>", "a'S 'll"}) {
    EXPECT_EQ(tok_->Decode(Encode(text)), text) << text;
  }
}

TEST_F(SyntheticBpeTest, SpecialTokensOnlyWithParseSpecial) {
  const std::vector<int32_t> parsed = Encode("<|im_start|>user\nhi<|im_end|>", true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  EXPECT_EQ(tok_->Decode(parsed), "user\nhi");  // control tokens print only on request
  EXPECT_EQ(tok_->Decode(parsed, /*special=*/true), "<|im_start|>user\nhi<|im_end|>");
  const std::vector<int32_t> raw = Encode("<|im_start|>user\nhi<|im_end|>", false);
  for (int32_t id : raw) EXPECT_GT(id, 2);
  EXPECT_TRUE(tok_->IsEndOfGeneration(2));
  EXPECT_TRUE(tok_->IsEndOfGeneration(0));
  EXPECT_FALSE(tok_->IsEndOfGeneration(1));
  EXPECT_TRUE(tok_->IsControl(0));
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_EQ(tok_->TokenBytes(-1), "");
  EXPECT_EQ(tok_->TokenBytes(100000), "");
}

TEST_F(SyntheticBpeTest, InvalidUtf8NamesTheOffset) {
  std::vector<int32_t> ids{7};
  Status s = tok_->Encode("hello\xC3(world", false, false, &ids);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("invalid UTF-8 at byte offset 5 (byte 195)"), std::string::npos)
      << s.message();
}

TEST_F(SyntheticBpeTest, ConcurrentEncodesAgree) {
  const std::string text = std::string(SyntheticTrainingText()) + " 😀 end";
  const std::vector<int32_t> want = Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::vector<int32_t> ids;
        if (!tok_->Encode(text, true, false, &ids).ok() || ids != want) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// SentencePiece: a hand-built vocabulary where the scores decide between two merges.
class SpmTest : public ::testing::Test {
 protected:
  void Build(const std::vector<std::pair<std::string, float>>& pieces, bool byte_tokens) {
    std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types{2, 3, 3};
    std::vector<float> scores{0, 0, 0};
    if (byte_tokens) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        tokens.push_back(name);
        types.push_back(6);
        scores.push_back(0);
      }
    }
    for (const auto& [text, score] : pieces) {
      tokens.push_back(text);
      types.push_back(1);
      scores.push_back(score);
    }
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");
    w.AddStringArray("tokenizer.ggml.tokens", tokens);
    w.AddI32Array("tokenizer.ggml.token_type", types);
    w.AddF32Array("tokenizer.ggml.scores", scores);
    w.AddU32("tokenizer.ggml.bos_token_id", 1);
    w.AddU32("tokenizer.ggml.eos_token_id", 2);
    w.AddU32("tokenizer.ggml.unknown_token_id", 0);
    bytes_ = w.Serialize();
    STRATA_ASSERT_OK(GgufFile::FromMemory(bytes_.data(), bytes_.size(), &gguf_));
    STRATA_ASSERT_OK(Tokenizer::FromGguf(*gguf_, &tok_));
  }
  std::vector<std::string> Pieces(std::string_view text, bool add_bos = false,
                                  bool special = false) {
    std::vector<int32_t> ids;
    Status s = tok_->Encode(text, add_bos, special, &ids);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<std::string> out;
    const auto& texts = gguf_->Find("tokenizer.ggml.tokens")->strings;
    for (int32_t id : ids) out.emplace_back(texts[id]);
    return out;
  }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tok_;
};

const std::string kMark = "\xE2\x96\x81";  // ▁

TEST_F(SpmTest, HigherScoreMergesFirst) {
  Build(
      {{kMark, -10}, {"a", -10}, {"b", -10}, {"c", -10}, {"ab", -2}, {"bc", -1}, {kMark + "a", -3}},
      false);
  // "▁abc": bc (-1) beats ab (-2) and ▁a (-3); then ▁a (-3) is the only merge left.
  EXPECT_EQ(Pieces("abc"), (std::vector<std::string>{kMark + "a", "bc"}));
  Build({{kMark, -10},
         {"a", -10},
         {"b", -10},
         {"c", -10},
         {"ab", -1},
         {"bc", -2},
         {kMark + "ab", -5}},
        false);
  EXPECT_EQ(Pieces("abc"), (std::vector<std::string>{kMark + "ab", "c"}));
}

TEST_F(SpmTest, ByteFallbackSpacesAndBos) {
  Build({{kMark, -10}, {"h", -10}, {"i", -10}, {kMark + "h", -2}, {kMark + "hi", -1}}, true);
  std::vector<int32_t> ids;
  ASSERT_TRUE(tok_->Encode("hi é", /*add_bos=*/true, false, &ids).ok());
  // BOS, "▁hi", "▁", then é as its two UTF-8 bytes (byte tokens sit at 3 + byte).
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3 + 256 + 4, 3 + 256, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok_->Decode(ids), " hi é");
  EXPECT_EQ(tok_->TokenBytes(3 + 0xC3), "\xC3");
  // After a special token the text gets its own leading-space mark.
  EXPECT_EQ(Pieces("</s>hi", false, true), (std::vector<std::string>{"</s>", kMark + "hi"}));
  EXPECT_EQ(Pieces("</s>hi", false, false).front(), kMark);
}

TEST_F(SpmTest, UnknownWithoutByteTokens) {
  Build({{kMark, -10}, {"h", -10}}, false);
  std::vector<int32_t> ids;
  ASSERT_TRUE(tok_->Encode("hz", false, false, &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 4, 0}));  // ▁ h <unk>
}

TEST(SyntheticSpmTest, TrainedVocabularyRoundTrips) {
  SyntheticModelSpec spec;
  spec.tokenizer = "llama";
  GgufWriter w;
  ASSERT_TRUE(BuildSyntheticModel(spec, &w).ok());
  const std::vector<uint8_t> bytes = w.Serialize();
  std::unique_ptr<GgufFile> g;
  STRATA_ASSERT_OK(GgufFile::FromMemory(bytes.data(), bytes.size(), &g));
  std::unique_ptr<Tokenizer> tok;
  STRATA_ASSERT_OK(Tokenizer::FromGguf(*g, &tok));
  const std::string text = SyntheticTrainingText();
  std::vector<int32_t> ids;
  ASSERT_TRUE(tok->Encode(text, true, false, &ids).ok());
  EXPECT_EQ(ids.front(), tok->bos());
  EXPECT_LT(ids.size(), text.size() * 3 / 5);  // merges fire (chars alone would be ~1:1)
  EXPECT_EQ(tok->Decode(ids), " " + text);     // the space prefix comes back as a space
  ASSERT_TRUE(tok->Encode("Zebra ñ", false, false, &ids).ok());
  EXPECT_EQ(tok->Decode(ids), " Zebra ñ");
  EXPECT_GE(tok->Find(kMark + "the"), 0);
}

TEST(TokenizerErrorsTest, BadVocabularies) {
  auto load = [](GgufWriter& w) {
    const std::vector<uint8_t> bytes = w.Serialize();
    std::unique_ptr<GgufFile> g;
    Status s = GgufFile::FromMemory(bytes.data(), bytes.size(), &g);
    if (!s.ok()) return s;
    std::unique_ptr<Tokenizer> t;
    return Tokenizer::FromGguf(*g, &t);
  };
  GgufWriter a;
  a.AddString("tokenizer.ggml.model", "llama");
  a.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
  const int32_t bad_types[] = {1, 9};
  a.AddI32Array("tokenizer.ggml.token_type", bad_types);
  Status s = load(a);
  EXPECT_NE(s.message().find("'tokenizer.ggml.token_type' entry 1 has the unknown type 9"),
            std::string::npos)
      << s.message();

  GgufWriter b;
  b.AddString("tokenizer.ggml.model", "llama");
  b.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
  b.AddU32("tokenizer.ggml.eos_token_id", 5);
  s = load(b);
  EXPECT_NE(s.message().find("'tokenizer.ggml.eos_token_id' value 5 is not a token id"),
            std::string::npos)
      << s.message();

  GgufWriter c;
  c.AddString("tokenizer.ggml.model", "gpt2");
  c.AddString("tokenizer.ggml.pre", "mystery");
  c.AddStringArray("tokenizer.ggml.tokens", {"a"});
  c.AddStringArray("tokenizer.ggml.merges", {});
  s = load(c);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported);
  EXPECT_NE(s.message().find("tokenizer.ggml.pre 'mystery'"), std::string::npos) << s.message();

  GgufWriter d;
  d.AddString("tokenizer.ggml.model", "gpt2");
  d.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  d.AddStringArray("tokenizer.ggml.merges", {"ab"});
  s = load(d);
  EXPECT_NE(s.message().find("merges' entry 0 'ab' is not two tokens"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace strata
