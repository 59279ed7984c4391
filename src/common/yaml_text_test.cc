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

std::string Likely(std::string_view text, int line) {
  auto p = LikelyCause(text, "illegal map value", line);
  return p ? std::to_string(p->line) + ":" + std::to_string(p->column) + " " + p->message : "";
}

// yaml-cpp says "illegal map value" on the line after a key without its ':' (5:16 here), and on a
// line indented under a value: the note names the likely mistake.
TEST(YamlTextTest, TheLikelyCauseOfAnIllegalMapValueIsNamed) {
  const std::string no_colon = "a: 1\nrun:\n  entrypoint main.sh\n\n  # c\n  kind: job\n";
  EXPECT_EQ(Likely(no_colon, 6).rfind("3:3 this line has no ':' after its key", 0), 0u)
      << Likely(no_colon, 6);
  EXPECT_EQ(Likely("a:\n  -b\n  c: 1\n", 3),
            "2:3 this list item needs a space after its '-' (- b)");
  EXPECT_EQ(Likely("run:\n  entrypoint: main.sh\n    kind: job\n", 3),
            "3:5 this line is indented more than line 2, whose value is already given; a field "
            "beside it starts at column 3");
  // Nothing is guessed where the line before is a key of its own, or for other messages.
  EXPECT_EQ(Likely("run:\n  kind: job\n", 2), "");
  EXPECT_FALSE(LikelyCause("a b\nc: 1\n", "end of map not found", 2));
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
  EXPECT_EQ(Flow("run:\n  args: [a, b\ncompute:\n  gpus: 1\n"),
            "2:9 this '[' is never closed: add the ']' that ends it");
  EXPECT_EQ(Flow("env: {A: 1, B: [x, y]\n"),
            "1:6 this '{' is never closed: add the '}' that ends it");
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
