// What every file tau reads as YAML (specs, platform files, admission scenarios) is checked for as
// text, before and after yaml-cpp parses it: yaml-cpp ends a quoted string that is never closed at
// the end of the file (the value silently changes), reports an unclosed bracket only where it gave
// up, and knows neither a lone CR as a line break nor UTF-16. No YAML library here: a lexical scan.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tau {

// A place in the text (1-based line and column, in characters) and what is wrong there.
struct TextProblem {
  int line = 0;
  int column = 0;
  std::string message;
};

// A lone CR ends a line in YAML as LF does; yaml-cpp reads it as a character. Each becomes an LF
// (CRLF stays), so positions do not move.
void NormalizeLineBreaks(std::string* text);

// UTF-16 or UTF-32 text (a byte-order mark, or NULs between ASCII letters): it must be saved as
// UTF-8. nullopt for anything else.
std::optional<TextProblem> WrongEncoding(std::string_view text);

// What is still open where the text ends: the quoted string (its opening quote), and the
// innermost flow collection ('[' or '{').
struct YamlOpenings {
  std::optional<TextProblem> quote;
  std::optional<TextProblem> flow;
};
YamlOpenings FindUnclosed(std::string_view text);

// The error for a YAML parser's message about a flow collection it found no end of, which it gives
// at the end of the file (`line`:`column`): at the bracket that opened it ("this '[' is never
// closed: ..."), saying where the parser gave up; nullopt for other messages, or when no bracket
// is open.
// Where a YAML parser's "illegal map value" at `line` most likely comes from, when that is clearly
// elsewhere or needs saying: the line before it lacks the ':' after its key (or, as a list item,
// the space after '-'), or the line is indented more than a `key: value` line before it. nullopt
// when no such line is there.
std::optional<TextProblem> LikelyCause(std::string_view text, std::string_view message, int line);

std::optional<TextProblem> UnclosedFlow(const YamlOpenings& open, std::string_view message,
                                        int line, int column);

}  // namespace tau
