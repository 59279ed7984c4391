// ToYaml: JSON objects as block-style YAML that kubectl (a YAML 1.1 reader) and people read the
// same way. Our own emitter rather than yaml-cpp's, because the key order (apiVersion, kind,
// metadata first) and the quoting must be stable for golden files: a string is written plain only
// when no YAML version could read it as anything but that string.
#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <vector>

#include "kube/kube.h"

namespace tau::kube {
namespace {

using nlohmann::json;

// Keys that lead, in this order; the others follow alphabetically.
constexpr std::array<std::string_view, 5> kLeadingKeys = {"apiVersion", "kind", "metadata", "name",
                                                          "namespace"};

std::vector<std::string> OrderedKeys(const json& object) {
  std::vector<std::string> keys;
  for (std::string_view k : kLeadingKeys) {
    if (object.contains(std::string(k))) keys.emplace_back(k);
  }
  for (const auto& [k, v] : object.items()) {
    if (std::find(kLeadingKeys.begin(), kLeadingKeys.end(), k) == kLeadingKeys.end()) {
      keys.push_back(k);
    }
  }
  return keys;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Whether `s` may be written without quotes. YAML 1.1 resolves far more plain scalars than 1.2
// (yes/no/on/off, 1_000, 1:20, 2024-01-01, 0b101), so the rule is deliberately narrow: a plain
// string starts with a letter, '_' or '/', or is a digit-led word with a letter no number
// grammar uses ("64Gi", "500m").
bool PlainOk(std::string_view s) {
  if (s.empty() || s.front() == ' ' || s.back() == ' ') return false;
  static const std::array<std::string_view, 10> kReserved = {"true", "false", "yes", "no",   "on",
                                                             "off",  "y",     "n",   "null", "~"};
  std::string lower = Lower(s);
  for (std::string_view r : kReserved) {
    if (lower == r) return false;
  }
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || std::string_view("_./- +=@%").find(c) != std::string_view::npos) {
      continue;
    }
    return false;
  }
  char first = s.front();
  if (std::isalpha(static_cast<unsigned char>(first)) || first == '_' || first == '/') return true;
  if (!std::isdigit(static_cast<unsigned char>(first))) return false;
  // 0x1f, 0o17, 0b101: integers in one YAML version or another.
  if (s.size() > 1 && first == '0' &&
      std::string_view("xXoObB").find(s[1]) != std::string_view::npos) {
    return false;
  }
  // Digit-led: plain only with a letter that no numeric, date or base-prefixed form contains.
  return std::any_of(s.begin(), s.end(), [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) &&
           std::string_view("eEoOxXbB").find(c) == std::string_view::npos;
  });
}

std::string Quoted(const std::string& s) {
  // JSON's string escapes are valid in YAML's double-quoted style.
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string Scalar(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return PlainOk(s) ? s : Quoted(s);
  }
  return v.dump();
}

// Multi-line text reads best as a literal block; text with characters a block cannot hold (a
// carriage return, other control characters) or only newlines is double-quoted instead.
bool UseBlock(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s.find('\n') == std::string::npos) return false;
  if (s.find_first_not_of('\n') == std::string::npos) return false;
  return std::none_of(s.begin(), s.end(), [](char c) {
    unsigned char u = static_cast<unsigned char>(c);
    return u < 0x20 && c != '\n' && c != '\t';
  });
}

// Writes " |<indicators>\n" and the lines at `indent`.
void EmitBlock(std::string& out, const std::string& s, int indent) {
  size_t end = s.find_last_not_of('\n') + 1;
  size_t trailing = s.size() - end;
  std::string core = s.substr(0, end);
  std::vector<std::string> lines;
  for (size_t pos = 0;;) {
    size_t nl = core.find('\n', pos);
    lines.push_back(core.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  std::string header = "|";
  // The indentation is taken from the first non-empty line unless stated.
  for (const std::string& line : lines) {
    if (line.empty()) continue;
    if (line.front() == ' ') header += "2";
    break;
  }
  header += trailing == 0 ? "-" : trailing == 1 ? "" : "+";
  out += " " + header + "\n";
  for (const std::string& line : lines) {
    if (!line.empty()) out += std::string(indent, ' ') + line;
    out += "\n";
  }
  for (size_t i = 1; i < trailing; ++i) out += "\n";
}

void EmitMap(std::string& out, const json& object, int indent, bool first_inline);
void EmitSeq(std::string& out, const json& array, int indent);

// The rest of a line after "key:" or "-".
void EmitValue(std::string& out, const json& v, int indent) {
  if (v.is_object() && !v.empty()) {
    out += "\n";
    EmitMap(out, v, indent + 2, false);
  } else if (v.is_array() && !v.empty()) {
    out += "\n";
    EmitSeq(out, v, indent);
  } else if (v.is_object()) {
    out += " {}\n";
  } else if (v.is_array()) {
    out += " []\n";
  } else if (UseBlock(v)) {
    EmitBlock(out, v.get_ref<const std::string&>(), indent + 2);
  } else {
    out += " " + Scalar(v) + "\n";
  }
}

void EmitMap(std::string& out, const json& object, int indent, bool first_inline) {
  bool first = true;
  for (const std::string& key : OrderedKeys(object)) {
    if (!(first && first_inline)) out += std::string(indent, ' ');
    first = false;
    out += Scalar(json(key)) + ":";
    EmitValue(out, object.at(key), indent);
  }
}

void EmitSeq(std::string& out, const json& array, int indent) {
  for (const json& item : array) {
    out += std::string(indent, ' ') + "-";
    if (item.is_object() && !item.empty()) {
      out += " ";
      EmitMap(out, item, indent + 2, true);
    } else if (item.is_array() && !item.empty()) {
      out += "\n";
      EmitSeq(out, item, indent + 2);
    } else {
      EmitValue(out, item, indent);
    }
  }
}

}  // namespace

std::string ToYaml(const nlohmann::json& object) {
  std::string out;
  if (object.is_object() && !object.empty()) {
    EmitMap(out, object, 0, false);
  } else if (object.is_array() && !object.empty()) {
    EmitSeq(out, object, 0);
  } else {
    std::string line;
    EmitValue(line, object, 0);
    out = line.substr(1);  // no key before it: drop the separating space
  }
  return out;
}

std::string ToYaml(const std::vector<nlohmann::json>& objects) {
  std::string out;
  for (size_t i = 0; i < objects.size(); ++i) {
    if (i > 0) out += "---\n";
    out += ToYaml(objects[i]);
  }
  return out;
}

}  // namespace tau::kube
