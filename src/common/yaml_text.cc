#include "common/yaml_text.h"

#include <vector>

#include <fmt/format.h>

namespace tau {

void NormalizeLineBreaks(std::string* text) {
  for (size_t i = 0; i < text->size(); ++i)
    if ((*text)[i] == '\r' && (i + 1 == text->size() || (*text)[i + 1] != '\n')) (*text)[i] = '\n';
}

std::optional<TextProblem> WrongEncoding(std::string_view t) {
  auto starts = [&](std::string_view prefix) { return t.substr(0, prefix.size()) == prefix; };
  const char* name = nullptr;
  if (starts(std::string_view("\xff\xfe\0\0", 4)) || starts(std::string_view("\0\0\xfe\xff", 4)))
    name = "UTF-32";
  else if (starts("\xff\xfe") || starts("\xfe\xff"))
    name = "UTF-16";
  else if (t.size() >= 2 && ((t[0] != '\0' && t[1] == '\0') || (t[0] == '\0' && t[1] != '\0')))
    name = "UTF-16";  // no byte-order mark: ASCII with a NUL before or after each letter
  if (name == nullptr) return std::nullopt;
  return TextProblem{1, 1,
                     fmt::format("the file is {} text; tau reads YAML as UTF-8: save it as "
                                 "UTF-8 (your editor's encoding setting), or convert it with "
                                 "`iconv -f {} -t UTF-8 FILE > FILE.utf8`",
                                 name, name)};
}

namespace {

// A lexical pass that knows just enough YAML to tell quotes and brackets that open something from
// the same characters inside plain text, comments and block scalars. Where it cannot tell, it
// takes the character as plain text: it may miss what is unclosed, never invent it.
class Scanner {
 public:
  explicit Scanner(std::string_view t) : t_(t) {}

  YamlOpenings Run() {
    while (i_ < t_.size()) {
      if (line_begin_ && !StartLine()) continue;
      const char c = t_[i_];
      if (quote_ != 0) {
        Quoted(c);
        continue;
      }
      Plain(c);
    }
    YamlOpenings out;
    if (quote_ != 0)
      out.quote = TextProblem{quote_at_.line, quote_at_.column,
                              fmt::format("this {}-quoted string is never closed: add its closing "
                                          "{} (YAML would end it at the end of the file)",
                                          quote_ == '"' ? "double" : "single", quote_)};
    if (!flows_.empty())
      out.flow = TextProblem{flows_.back().line, flows_.back().column,
                             fmt::format("this '{}' is never closed: add the '{}' that ends it",
                                         flows_.back().c, flows_.back().c == '[' ? ']' : '}')};
    return out;
  }

 private:
  struct Open {
    int line = 0, column = 0;
    char c = 0;
  };

  char At(size_t k) const { return k < t_.size() ? t_[k] : '\n'; }
  static bool Space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
  // Moves one byte on, counting characters (not UTF-8 continuation bytes) and lines.
  void Step() {
    const char c = t_[i_++];
    if (c == '\n') {
      ++line_;
      column_ = 1;
      line_begin_ = true;
    } else if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
      ++column_;
    }
  }
  // To the line's end (its '\n' is left for the next step).
  void SkipRestOfLine() {
    while (i_ < t_.size() && t_[i_] != '\n') Step();
  }
  void SkipLine() {
    SkipRestOfLine();
    if (i_ < t_.size()) Step();
  }
  // At the start of a line: skips the lines of a block scalar, directives and blank lines; false
  // when it skipped the line (the caller looks again).
  bool StartLine() {
    line_begin_ = false;
    size_t indent = 0;
    while (i_ + indent < t_.size() && t_[i_ + indent] == ' ') ++indent;
    const char first = At(i_ + indent);
    const bool blank = first == '\n' || first == '\r';
    if (quote_ == 0 && block_indent_ >= 0) {
      if (blank || static_cast<int>(indent) > block_indent_) {
        SkipLine();
        return false;
      }
      block_indent_ = -1;
    }
    if (quote_ == 0 && flows_.empty()) {
      if (indent == 0 && first == '%') {  // a directive
        SkipLine();
        return false;
      }
      at_start_ = true;
      line_indent_ = static_cast<int>(indent);
    }
    for (size_t k = 0; k < indent; ++k) Step();
    return true;
  }
  void Quoted(char c) {
    if (quote_ == '"' && c == '\\') {
      Step();
      if (i_ < t_.size()) Step();
      return;
    }
    if (c == quote_) {
      if (quote_ == '\'' && At(i_ + 1) == '\'') {  // '' is a quote inside
        Step();
        Step();
        return;
      }
      quote_ = 0;
      at_start_ = false;
    }
    Step();
  }
  void Plain(char c) {
    const bool in_flow = !flows_.empty();
    const bool after_space = i_ == 0 || Space(t_[i_ - 1]);
    switch (c) {
      case ' ':
      case '\t':
      case '\r':
      case '\n':
        break;
      case '#':
        if (after_space) {
          SkipRestOfLine();
          return;
        }
        at_start_ = false;
        break;
      case '"':
      case '\'':
        if (at_start_) {
          quote_ = c;
          quote_at_ = {line_, column_, c};
        }
        at_start_ = false;
        break;
      case '[':
      case '{':
        if (at_start_) flows_.push_back({line_, column_, c});  // and a value may start inside
        break;
      case ']':
      case '}':
        if (in_flow) flows_.pop_back();
        at_start_ = false;
        break;
      case ',':
        at_start_ = in_flow;
        break;
      case ':':
        at_start_ = Space(At(i_ + 1)) || in_flow;
        break;
      case '-':
      case '?':
        // A list item or a complex key: what follows may start a value.
        if (!(at_start_ && !in_flow && Space(At(i_ + 1)))) at_start_ = false;
        break;
      case '|':
      case '>':
        if (at_start_ && !in_flow) {
          block_indent_ = line_indent_;
          SkipRestOfLine();
          return;
        }
        at_start_ = false;
        break;
      case '&':
      case '!':
      case '*':
        // An anchor or a tag comes before a value; an alias is one.
        if (at_start_) {
          while (i_ < t_.size() && !Space(t_[i_]) && t_[i_] != ',' && t_[i_] != ']' &&
                 t_[i_] != '}')
            Step();
          at_start_ = c != '*';
          return;
        }
        break;
      default:
        at_start_ = false;
        break;
    }
    Step();
  }

  std::string_view t_;
  size_t i_ = 0;
  int line_ = 1, column_ = 1;
  bool line_begin_ = true;
  bool at_start_ = true;  // where a quoted string or a flow collection may start
  int line_indent_ = 0;
  int block_indent_ = -1;  // skipping a block scalar: its lines are indented more than this
  char quote_ = 0;         // inside a quoted string: its quote
  Open quote_at_;
  std::vector<Open> flows_;
};

}  // namespace

YamlOpenings FindUnclosed(std::string_view text) { return Scanner(text).Run(); }

std::optional<TextProblem> LikelyCause(std::string_view text, std::string_view message, int line) {
  if (message != "illegal map value" || line < 2) return std::nullopt;
  std::vector<std::string_view> lines;
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (static_cast<size_t>(line) > lines.size()) return std::nullopt;
  auto indent = [](std::string_view l) { return l.find_first_not_of(' '); };
  const std::string_view here = lines[line - 1];
  // The line before, skipping blank lines and comments.
  int p = line - 1;
  while (p >= 1 && (indent(lines[p - 1]) == std::string_view::npos ||
                    lines[p - 1][indent(lines[p - 1])] == '#'))
    --p;
  if (p < 1 || indent(here) == std::string_view::npos) return std::nullopt;
  const std::string_view before = lines[p - 1];
  size_t before_indent = indent(before);
  std::string_view content = before.substr(before_indent);
  while (!content.empty() && content.back() == ' ') content.remove_suffix(1);
  if (content.size() >= 2 && content[0] == '-' && content[1] == ' ') {
    before_indent += 2;
    content.remove_prefix(2);
  }
  const bool has_key =
      content.find(": ") != std::string_view::npos || (!content.empty() && content.back() == ':');
  if (content.empty() ||
      std::string_view("[{\"'|>&*!%@`").find(content[0]) != std::string_view::npos)
    return std::nullopt;
  const int column = static_cast<int>(before_indent) + 1;
  if (!has_key && before_indent == indent(here)) {
    if (content[0] == '-' && content.size() > 1)
      return TextProblem{
          p, column,
          "this list item needs a space after its '-' (- " + std::string(content.substr(1)) + ")"};
    return TextProblem{p, column,
                       "this line has no ':' after its key (KEY: VALUE), so YAML read it and "
                       "the next as one text; add the ':'"};
  }
  if (has_key && content.back() != ':' && indent(here) > before_indent)
    return TextProblem{line, static_cast<int>(indent(here)) + 1,
                       fmt::format("this line is indented more than line {}, whose value is "
                                   "already given; a field beside it starts at column {}",
                                   p, column)};
  return std::nullopt;
}

std::optional<TextProblem> UnclosedFlow(const YamlOpenings& open, std::string_view message,
                                        int line, int column) {
  if (!open.flow || message.find("flow") == std::string_view::npos) return std::nullopt;
  TextProblem out = *open.flow;
  out.message += fmt::format(" (YAML syntax error at {}:{}: {})", line, column, message);
  return out;
}

}  // namespace tau
