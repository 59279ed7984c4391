// The strict reader. yaml-cpp converts leniently ("yes" -> true, "2" -> 2), so the type of every
// plain scalar is decided here from its spelling, and quoted scalars are always strings.
#include "policy/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/clock.h"
#include "common/strings.h"

namespace tau::policy::internal {
namespace {

enum class Type { kNull, kBool, kInt, kFloat, kString };

bool Digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Type Classify(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return Type::kNull;
  if (!node.IsScalar()) return Type::kString;
  // Quoted scalars carry the non-specific tag "!"; plain ones "?".
  if (node.Tag() == "!") return Type::kString;
  std::string_view s = node.Scalar();
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return Type::kNull;
  if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE") {
    return Type::kBool;
  }
  std::string_view body = s;
  if (body[0] == '-' || body[0] == '+') body.remove_prefix(1);
  if (Digits(body)) return Type::kInt;
  size_t dot = body.find('.');
  size_t exp = body.find_first_of("eE");
  std::string_view mantissa = body.substr(0, exp);
  bool float_like =
      !mantissa.empty() && mantissa != "." &&
      std::all_of(mantissa.begin(), mantissa.end(),
                  [](char c) { return c == '.' || std::isdigit(static_cast<unsigned char>(c)); }) &&
      std::count(mantissa.begin(), mantissa.end(), '.') <= 1 &&
      (exp == std::string_view::npos ||
       Digits(body.substr(
           exp + 1 + (exp + 1 < body.size() && (body[exp + 1] == '-' || body[exp + 1] == '+')))));
  if (float_like && (dot != std::string_view::npos || exp != std::string_view::npos)) {
    return Type::kFloat;
  }
  return Type::kString;
}

Pos ValuePos(const YAML::Node& value, Pos key_pos) {
  Pos pos = PosOf(value);
  // An empty value has no position of its own: yaml-cpp marks where the next token starts.
  if (pos.line == 0 || (value.IsNull() && pos.line != key_pos.line)) return key_pos;
  return pos;
}

std::string Qualified(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

}  // namespace

Pos PosOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

void Reader::Error(Pos pos, std::string message) {
  diagnostics_.push_back(Diagnostic{file_, pos.line, pos.column, std::move(message)});
}

bool Reader::Map(const YAML::Node& node, const std::string& path, Pos pos,
                 const std::vector<std::string>& allowed, const std::vector<std::string>& required,
                 Fields* out) {
  if (!node.IsMap()) {
    Error(pos, fmt::format("{}: expected a mapping, got {}", path.empty() ? "the file" : path,
                           Describe(node)));
    return false;
  }
  std::string in = path.empty() ? "" : fmt::format(" in '{}'", path);
  for (const auto& item : node) {
    // Copies: yaml-cpp's iterator values are temporaries.
    YAML::Node key = item.first;
    YAML::Node value = item.second;
    Pos key_pos = PosOf(key);
    if (!key.IsScalar()) {
      Error(key_pos, fmt::format("expected a field name{}, got {}", in, Describe(key)));
      continue;
    }
    const std::string name = key.Scalar();
    if (auto dup = out->find(name); dup != out->end()) {
      Error(key_pos, fmt::format("duplicate field '{}'{} (first given on line {})", name, in,
                                 dup->second.key_pos.line));
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      Error(key_pos, fmt::format("unknown field '{}'{}{}", name, in, Hint(name, allowed)));
      continue;
    }
    (*out)[name] = Entry{value, Qualified(path, name), key_pos, ValuePos(value, key_pos)};
  }
  for (const std::string& name : required) {
    if (out->count(name) == 0) Error(pos, fmt::format("missing required field '{}'{}", name, in));
  }
  return true;
}

bool Reader::TypeError(const Entry& e, const char* expected) {
  Error(e.pos, fmt::format("{}: expected {}, got {}", e.path, expected, Describe(e.value)));
  return false;
}

std::optional<std::string> Reader::Str(const Entry& e) {
  // Numbers and booleans keep their spelling: `name: 2024` is the string "2024".
  if (!e.value.IsScalar() || Classify(e.value) == Type::kNull) {
    TypeError(e, "a string");
    return std::nullopt;
  }
  const std::string& s = e.value.Scalar();
  if (s.find('\0') != std::string::npos) {
    Error(e.pos, fmt::format("{}: must not contain a NUL character", e.path));
    return std::nullopt;
  }
  return s;
}

std::optional<int64_t> Reader::Int(const Entry& e, int64_t lo, int64_t hi) {
  if (Classify(e.value) != Type::kInt) {
    TypeError(e, "an integer");
    return std::nullopt;
  }
  const std::string& s = e.value.Scalar();
  int64_t v = 0;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) {
    Error(e.pos, fmt::format("{}: {} is out of range ({}..{})", e.path, s, lo, hi));
    return std::nullopt;
  }
  return v;
}

std::optional<bool> Reader::Bool(const Entry& e) {
  if (Classify(e.value) != Type::kBool) {
    TypeError(e, "a boolean (true or false)");
    return std::nullopt;
  }
  return std::tolower(static_cast<unsigned char>(e.value.Scalar()[0])) == 't';
}

std::optional<Quantity> Reader::Qty(const Entry& e, bool whole_units) {
  Type type = Classify(e.value);
  if (!e.value.IsScalar() || type == Type::kNull || type == Type::kBool) {
    TypeError(e, "a quantity such as 2, 500m or 64Gi");
    return std::nullopt;
  }
  const std::string& text = e.value.Scalar();
  Result<Quantity> q = Quantity::Parse(text);
  if (!q.ok()) {
    Error(e.pos, fmt::format("{}: {}", e.path, q.status().message()));
    return std::nullopt;
  }
  if (q->IsZero()) {
    Error(e.pos, fmt::format("{}: must be positive, got '{}'", e.path, text));
    return std::nullopt;
  }
  if (whole_units && q->milli() % 1000 != 0) {
    // "512m" of memory is half a byte: almost always meant as 512Mi.
    Error(e.pos, fmt::format("{}: '{}' is a fraction of a byte{}", e.path, text,
                             EndsWith(text, "m") ? fmt::format(" (did you mean '{}Mi'?)",
                                                               text.substr(0, text.size() - 1))
                                                 : ""));
    return std::nullopt;
  }
  return *q;
}

std::optional<int64_t> Reader::DurationMs(const Entry& e) {
  if (Classify(e.value) != Type::kString || e.value.Scalar().size() > 64) {
    TypeError(e, "a duration such as 30m, 12h or 1h30m");
    return std::nullopt;
  }
  Result<int64_t> ms = ParseDurationMillis(e.value.Scalar());
  if (!ms.ok()) {
    Error(e.pos, fmt::format("{}: {}", e.path, ms.status().message()));
    return std::nullopt;
  }
  if (*ms <= 0) {
    Error(e.pos, fmt::format("{}: must be longer than zero", e.path));
    return std::nullopt;
  }
  return *ms;
}

std::optional<std::vector<Entry>> Reader::Items(const Entry& e) {
  if (!e.value.IsSequence()) {
    TypeError(e, "a list");
    return std::nullopt;
  }
  std::vector<Entry> out;
  size_t i = 0;
  for (const auto& element : e.value) {
    YAML::Node item = element;
    Pos pos = item.IsNull() ? e.pos : PosOf(item);
    if (pos.line == 0) pos = e.pos;
    out.push_back(Entry{item, fmt::format("{}[{}]", e.path, i++), e.key_pos, pos});
  }
  return out;
}

std::optional<std::vector<Entry>> Reader::StrList(const Entry& e) {
  std::optional<std::vector<Entry>> items = Items(e);
  if (!items) return std::nullopt;
  bool ok = true;
  for (const Entry& item : *items) {
    std::optional<std::string> s = Str(item);
    if (s && s->empty()) {
      Error(item.pos, fmt::format("{}: must not be empty", item.path));
      s.reset();
    }
    ok = ok && s.has_value();
  }
  if (!ok) return std::nullopt;
  return items;
}

void Reader::Unknown(Pos pos, const std::string& what, const std::string& kind,
                     const std::string& name, const std::vector<std::string>& known) {
  std::string hint = Hint(name, known);
  if (hint.empty() && known.empty()) hint = fmt::format(" (the platform defines no {})", kind);
  Error(pos, fmt::format("{}: unknown {} '{}'{}", what, kind, name, hint));
}

std::string Describe(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  switch (Classify(node)) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return fmt::format("a boolean ({})", node.Scalar());
    case Type::kInt:
      return fmt::format("an integer ({})", node.Scalar());
    case Type::kFloat:
      return fmt::format("a number ({})", node.Scalar());
    case Type::kString:
      break;
  }
  std::string text = node.Scalar();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return fmt::format("a string ('{}')", text);
}

std::string Suggest(const std::string& word, const std::vector<std::string>& candidates) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const std::string& c : candidates) {
    if (lower(c) == lower(word)) return c;
  }
  return ClosestMatch(word, candidates);
}

std::string Hint(const std::string& word, const std::vector<std::string>& candidates) {
  std::string close = Suggest(word, candidates);
  return close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close);
}

std::string ShortDuration(int64_t ms) {
  if (ms <= 0) return "0s";
  std::string out;
  const std::pair<int64_t, const char*> units[] = {
      {3'600'000, "h"}, {60'000, "m"}, {1'000, "s"}, {1, "ms"}};
  for (const auto& [size, name] : units) {
    if (ms >= size) {
      out += fmt::format("{}{}", ms / size, name);
      ms %= size;
    }
  }
  return out;
}

bool IsResourceName(std::string_view s) {
  std::string_view name = s;
  if (size_t slash = s.find('/'); slash != std::string_view::npos) {
    std::string_view prefix = s.substr(0, slash);
    name = s.substr(slash + 1);
    if (prefix.empty() || prefix.size() > 253) return false;
    for (const std::string& label : Split(prefix, '.')) {
      if (!IsDns1123Label(label)) return false;
    }
  }
  // The name part: a Kubernetes qualified name (alphanumerics, '-', '_', '.'; alphanumeric ends).
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (name.empty() || name.size() > 63 || !alnum(name.front()) || !alnum(name.back())) {
    return false;
  }
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '-' || c == '_' || c == '.'; });
}

}  // namespace tau::policy::internal
