// The lexical checks of YAML text: what is open at the end, encodings, line breaks.
#include "common/yaml_text.h"

#include <gtest/gtest.h>

namespace tau {
namespace {

std::string Quote(std::string_view text) {
  YamlOpenings o = FindUnclosed(text);
  return o.quote ? std::to_string(o.quote->line) + ":" + std::to_string(o.quote->column) : "";
}
std::string Flow(std::string_view text) {
  YamlOpenings o = FindUnclosed(text);
  return o.flow ? std::to_string(o.flow->line) + ":" + std::to_string(o.flow->column) + " " +
                      o.flow->message
                : "";
}

TEST(YamlTextTest, AQuotedStringNeverClosedIsFoundWhereItOpened) {
  EXPECT_EQ(Quote("name: x\nrun:\n  entrypoint: \"main.py\n"), "3:15");
  EXPECT_EQ(Quote("name: 'x\n"), "1:7");
  EXPECT_NE(FindUnclosed("a: 'x").quote->message.find("single-quoted string is never closed"),
            std::string::npos);
  // Multi-line, escaped and doubled quotes close as YAML says.
  EXPECT_EQ(Quote("a: \"one\n  two\"\nb: 1\n"), "");
  EXPECT_EQ(Quote("a: \"say \\\"hi\\\"\"\n"), "");
  EXPECT_EQ(Quote("a: 'it''s'\n"), "");
  EXPECT_EQ(Quote("- 'x'\n- \"y\"\n- {k: 'v'}\n- ['w', \"z\"]\n"), "");
}

TEST(YamlTextTest, QuotesThatOpenNothingAreNotCounted) {
  EXPECT_EQ(Quote("name: it's mine\n"), "");                     // inside a plain scalar
  EXPECT_EQ(Quote("name: x  # don't\n# it's a comment\n"), "");  // comments
  EXPECT_EQ(Quote("script: |\n  echo 'unbalanced\n  it's fine\nnext: 1\n"), "");  // block scalar
  EXPECT_EQ(Quote("- >-\n    a \"folded\n- b\n"), "");
  EXPECT_EQ(Quote("url: http://host/a'b\n"), "");
  EXPECT_EQ(Quote("a: &anchor 'x'\nb: !!str \"y\"\n"), "");
  // After a block scalar ends, quotes count again.
  EXPECT_EQ(Quote("script: |\n  echo 'x\nname: \"y\n"), "3:7");
}

TEST(YamlTextTest, TheInnermostOpenBracketIsNamed) {
  EXPECT_EQ(Flow("run:\n  args: [a, b\ncompute:\n  gpus: 1\n"), "2:9 to match this '['");
  EXPECT_EQ(Flow("env: {A: 1, B: [x, y]\n"), "1:6 to match this '{'");
  EXPECT_EQ(Flow("a: [1, {b: 2}, [3]]\nc: {d: [e]}\n"), "");
  EXPECT_EQ(Flow("a: x[1]\nb: '['\nc: \"{\"\n# [\n"), "");  // plain text, quotes, comments
}

TEST(YamlTextTest, LoneCarriageReturnsBecomeLineBreaks) {
  std::string text = "a: 1\rb: 2\r\nc: 3\r";
  NormalizeLineBreaks(&text);
  EXPECT_EQ(text, "a: 1\nb: 2\r\nc: 3\n");
}

TEST(YamlTextTest, Utf16AndUtf32AreNamed) {
  EXPECT_NE(WrongEncoding(std::string("\xff\xfe"
                                      "a\0:\0",
                                      6))
                ->message.find("UTF-16"),
            std::string::npos);
  EXPECT_NE(WrongEncoding(std::string("\0a\0:", 4))->message.find("UTF-16"), std::string::npos);
  EXPECT_NE(WrongEncoding(std::string("\xff\xfe\0\0a\0\0\0", 8))->message.find("UTF-32"),
            std::string::npos);
  EXPECT_FALSE(WrongEncoding("name: x\n").has_value());
  EXPECT_FALSE(WrongEncoding("\xef\xbb\xbfname: x\n").has_value());  // UTF-8 with a BOM is fine
  EXPECT_FALSE(WrongEncoding("").has_value());
}

}  // namespace
}  // namespace tau
