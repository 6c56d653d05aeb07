// Strata's tokenizer against llama.cpp on the real model's vocabulary: every id of every
// case in tests/fixtures/tokenizer_smollm2.json (made by
// tests/golden/make_tokenizer_golden.py) and every token's bytes.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/model/gguf.h"
#include "runtime/model/tokenizer.h"
#include "tests/testing/test_model.h"

namespace strata {
namespace {

std::string Hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

class TokenizerGoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::RealModelPath();
    if (!std::filesystem::exists(path)) return;  // each test fails with the hint
    Status s = GgufFile::Open(path, &gguf_);
    if (s.ok()) s = Tokenizer::FromGguf(*gguf_, &tokenizer_);
    load_status_ = new Status(s);
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    gguf_.reset();
    delete load_status_;
    load_status_ = nullptr;
  }
  void SetUp() override {
    STRATA_REQUIRE_REAL_MODEL(path);
    ASSERT_NE(load_status_, nullptr);
    ASSERT_TRUE(load_status_->ok()) << load_status_->ToString();
    std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/tokenizer_smollm2.json");
    ASSERT_TRUE(in.good()) << "missing tests/fixtures/tokenizer_smollm2.json";
    golden_ = nlohmann::json::parse(in);
  }

  static std::unique_ptr<GgufFile> gguf_;
  static std::unique_ptr<Tokenizer> tokenizer_;
  static Status* load_status_;
  nlohmann::json golden_;
};

std::unique_ptr<GgufFile> TokenizerGoldenTest::gguf_;
std::unique_ptr<Tokenizer> TokenizerGoldenTest::tokenizer_;
Status* TokenizerGoldenTest::load_status_ = nullptr;

TEST_F(TokenizerGoldenTest, VocabularyFacts) {
  EXPECT_EQ(tokenizer_->n_vocab(), golden_["n_vocab"].get<int32_t>());
  EXPECT_EQ(tokenizer_->bos(), golden_["bos"].get<int32_t>());
  EXPECT_EQ(tokenizer_->eos(), golden_["eos"].get<int32_t>());
  EXPECT_EQ(tokenizer_->Find("<|im_end|>"), 2);
  EXPECT_TRUE(tokenizer_->IsEndOfGeneration(2));   // <|im_end|>, the EOS
  EXPECT_TRUE(tokenizer_->IsEndOfGeneration(0));   // <|endoftext|>
  EXPECT_FALSE(tokenizer_->IsEndOfGeneration(1));  // <|im_start|>
  EXPECT_TRUE(tokenizer_->IsControl(1));
  EXPECT_FALSE(tokenizer_->IsControl(19556));
  EXPECT_GE(golden_["cases"].size(), 30u);
}

TEST_F(TokenizerGoldenTest, IdsMatchLlamaCpp) {
  for (const auto& c : golden_["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const bool special = c["parse_special"].get<bool>();
    SCOPED_TRACE(name + (special ? " (parse_special)" : ""));
    const std::string text = c["text"].get<std::string>();
    std::vector<int32_t> ids;
    ASSERT_TRUE(tokenizer_->Encode(text, /*add_bos=*/false, special, &ids).ok());
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(tokenizer_->Encode(text, /*add_bos=*/true, special, &ids).ok());
    EXPECT_EQ(ids, c["ids_add_bos"].get<std::vector<int32_t>>());
  }
}

TEST_F(TokenizerGoldenTest, TokenBytesAndDecodeMatchLlamaCpp) {
  for (const auto& c : golden_["cases"]) {
    const bool special = c["parse_special"].get<bool>();
    SCOPED_TRACE(c["name"].get<std::string>() + (special ? " (parse_special)" : ""));
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto pieces = c["pieces_hex"].get<std::vector<std::string>>();
    ASSERT_EQ(ids.size(), pieces.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(Hex(tokenizer_->TokenBytes(ids[i])), pieces[i]) << "token " << ids[i];
    }
    if (!c["pieces_special_hex"].is_null()) {
      const auto sp = c["pieces_special_hex"].get<std::vector<std::string>>();
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(Hex(tokenizer_->TokenBytes(ids[i], true)), sp[i]) << "token " << ids[i];
      }
    }
    const std::string decoded = tokenizer_->Decode(ids, /*special=*/true);
    EXPECT_EQ(Hex(decoded), c["decoded_hex"].get<std::string>());
    // Round trip: everything but the bytes the vocabulary cannot represent comes back.
    if (c["name"] != "control_bytes") {
      EXPECT_EQ(decoded, c["text"].get<std::string>());
    }
  }
}

}  // namespace
}  // namespace strata
