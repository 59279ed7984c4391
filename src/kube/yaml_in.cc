// ParseYaml: YAML documents as JSON, for CRDs (schemas) and for reading rendered YAML back in
// tests. yaml-cpp exceptions stop here.
#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <regex>

#include "kube/kube.h"

namespace tau::kube {
namespace {

using nlohmann::json;

// The YAML 1.2 core schema's resolution of plain scalars (what CRD files are written in).
json PlainScalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  // Most scalars are words; only text that starts like a number goes through the regexes.
  char c = s.front();
  if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.')) return s;
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  if (std::regex_match(s, kInt)) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno == 0 && end != nullptr && *end == '\0') return static_cast<int64_t>(v);
    return s;
  }
  if (std::regex_match(s, kFloat)) return std::strtod(s.c_str(), nullptr);
  return s;
}

json ToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) out[kv.first.Scalar()] = ToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(ToJson(item));
      return out;
    }
    case YAML::NodeType::Scalar:
      // "?" is a plain scalar; "!" a quoted one, and explicit tags keep the text as written.
      if (node.Tag() == "?") return PlainScalar(node.Scalar());
      return node.Scalar();
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
  }
  return nullptr;
}

}  // namespace

Result<std::vector<nlohmann::json>> ParseYaml(std::string_view text) {
  try {
    std::vector<json> out;
    for (const YAML::Node& doc : YAML::LoadAll(std::string(text))) {
      if (doc.IsNull()) continue;  // an empty document (a trailing "---")
      out.push_back(ToJson(doc));
    }
    return out;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(fmt::format("YAML error at line {}, column {}: {}", e.mark.line + 1,
                                       e.mark.column + 1, e.msg));
  }
}

}  // namespace tau::kube
