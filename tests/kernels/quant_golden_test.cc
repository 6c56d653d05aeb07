// DequantizeRow against an independent decoder: the fixtures in tests/fixtures/quant hold
// random blocks of every weight format and the floats gguf-py (the GGUF reference
// implementation in Python) decodes them to; tests/golden/make_quant_golden.py wrote them.
// Every value must be identical, bit for bit, on every ISA's table.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

struct GoldenBlocks {
  uint32_t type_id = 0;
  std::vector<uint8_t> blocks;
  std::vector<float> values;
};

// Reads one SQB1 file (format in make_quant_golden.py); false with a message on any
// mismatch of size or magic.
::testing::AssertionResult ReadGolden(const std::string& path, GoldenBlocks* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ::testing::AssertionFailure() << "cannot open " << path;
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  uint32_t n = 0, m = 0;
  if (bytes.size() < 16 || std::memcmp(bytes.data(), "SQB1", 4) != 0) {
    return ::testing::AssertionFailure() << path << ": not an SQB1 fixture";
  }
  std::memcpy(&out->type_id, bytes.data() + 4, 4);
  std::memcpy(&n, bytes.data() + 8, 4);
  std::memcpy(&m, bytes.data() + 12, 4);
  if (bytes.size() != 16 + size_t(m) + 4 * size_t(n)) {
    return ::testing::AssertionFailure()
           << path << ": " << bytes.size() << " bytes for n = " << n << ", m = " << m;
  }
  out->blocks.assign(bytes.begin() + 16, bytes.begin() + 16 + m);
  out->values.resize(n);
  std::memcpy(out->values.data(), bytes.data() + 16 + m, 4 * size_t(n));
  return ::testing::AssertionSuccess();
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

const DType kGoldenTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,   DType::kQ5_1,
                              DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,   DType::kQ4_K,
                              DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

class QuantGolden : public ::testing::TestWithParam<testing::Variant> {};

TEST_P(QuantGolden, DequantizeIsBitIdenticalToGgufPy) {
  testing::ScopedVariant isa(GetParam());
  for (DType t : kGoldenTypes) {
    SCOPED_TRACE(TypeName(t));
    GoldenBlocks g;
    ASSERT_TRUE(ReadGolden(std::string(STRATA_QUANT_FIXTURES) + "/" + TypeName(t) + ".bin", &g));
    ASSERT_EQ(g.type_id, static_cast<uint32_t>(t));
    const int64_t n = static_cast<int64_t>(g.values.size());
    ASSERT_EQ(RowBytes(t, n), g.blocks.size());
    std::vector<float> got(n);
    DequantizeRow(t, g.blocks.data(), got.data(), n);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (Bits(got[i]) == Bits(g.values[i])) continue;
      if (++mismatches <= 5) {
        ADD_FAILURE() << "value " << i << ": " << got[i] << " (0x" << std::hex << Bits(got[i])
                      << "), gguf-py " << g.values[i] << " (0x" << Bits(g.values[i]) << ")";
      }
    }
    EXPECT_EQ(mismatches, 0) << "of " << n << " values";
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, QuantGolden, ::testing::ValuesIn(testing::AllVariants()),
                         testing::VariantName);

}  // namespace
}  // namespace strata::kernels
