#include "runtime/engine/text_stream.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(TextStreamTest, PassesTextThroughWithoutStops) {
  TextStream s({});
  std::string out;
  EXPECT_FALSE(s.Push("Hello", &out));
  EXPECT_EQ(out, "Hello");
  EXPECT_FALSE(s.Push(" world", &out));
  EXPECT_EQ(out, " world");
  EXPECT_EQ(s.Flush(), "");
}

TEST(TextStreamTest, HoldsBackAPossibleStopAcrossTokens) {
  TextStream s({"\nUser:"});
  std::string out, all;
  EXPECT_FALSE(s.Push("Sure.\nUs", &out));
  EXPECT_EQ(out, "Sure.");
  EXPECT_TRUE(s.Push("er: hi", &out));
  EXPECT_EQ(out, "");  // everything after "Sure." is the stop string or after it
}

TEST(TextStreamTest, ReleasesHeldTextWhenItIsNotAStop) {
  TextStream s({"###"});
  std::string out;
  EXPECT_FALSE(s.Push("a #", &out));
  EXPECT_EQ(out, "a ");
  EXPECT_FALSE(s.Push("b", &out));
  EXPECT_EQ(out, "#b");
  EXPECT_FALSE(s.Push("##", &out));
  EXPECT_EQ(out, "");
  EXPECT_EQ(s.Flush(), "##");
}

TEST(TextStreamTest, NeverSplitsAUtf8Character) {
  TextStream s({});
  std::string out;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes
  EXPECT_FALSE(s.Push(euro.substr(0, 1), &out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(s.Push(euro.substr(1, 1), &out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(s.Push(euro.substr(2) + "x", &out));
  EXPECT_EQ(out, euro + "x");
}

TEST(TextStreamTest, StopInsideOneToken) {
  TextStream s({"END"});
  std::string out;
  EXPECT_TRUE(s.Push("abcENDdef", &out));
  EXPECT_EQ(out, "abc");
}

}  // namespace
}  // namespace strata
