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

// What follows a YAML parser's message about a flow collection it found no end of, as a compiler's
// note where the bracket opened ("\nFILE:5:9: note: to match this '['"); "" for other messages, or
// when no bracket is open.
std::string FlowNote(std::string_view file, const YamlOpenings& open, std::string_view message);

}  // namespace tau
