// SchemaSet: validation of rendered objects against OpenAPI v3 structural schemas (CRDs' and our
// own description of the built-in kinds). Strict where the API server is strict or prunes silently:
// an unknown field is an error here, because a field pruned by the server is a setting that
// silently does not happen.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <regex>
#include <set>

#include "common/json_text.h"
#include "common/strings.h"
#include "kube/kube.h"

namespace tau::kube {
namespace {

using nlohmann::json;

// The API server validates a root `metadata` itself (CRDs only say `type: object`); this is the
// part of ObjectMeta a client sets.
const json& ObjectMetaSchema() {
  static const json kSchema = json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 253},
      "generateName": {"type": "string"},
      "namespace": {"type": "string", "maxLength": 63},
      "labels": {"type": "object", "additionalProperties": {"type": "string"}},
      "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
      "finalizers": {"type": "array", "items": {"type": "string"}},
      "ownerReferences": {"type": "array", "items": {
        "type": "object", "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
          "apiVersion": {"type": "string"}, "kind": {"type": "string"},
          "name": {"type": "string"}, "uid": {"type": "string"},
          "controller": {"type": "boolean"}, "blockOwnerDeletion": {"type": "boolean"}}}}
    }
  })");
  return kSchema;
}

bool IsLabelName(std::string_view s) {
  static const std::regex kName("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]");
  return !s.empty() && s.size() <= 63 && std::regex_match(s.begin(), s.end(), kName);
}

bool IsDnsSubdomain(std::string_view s) {
  static const std::regex kSub("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return !s.empty() && s.size() <= 253 && std::regex_match(s.begin(), s.end(), kSub);
}

// Label keys are [prefix/]name; values are empty or a name (Kubernetes' label syntax).
void CheckLabels(const json& labels, const std::string& path, std::vector<std::string>& errors) {
  if (!labels.is_object()) return;
  for (const auto& [key, value] : labels.items()) {
    size_t slash = key.find('/');
    std::string_view prefix =
        slash == std::string::npos ? "" : std::string_view(key).substr(0, slash);
    std::string_view name =
        slash == std::string::npos ? key : std::string_view(key).substr(slash + 1);
    if ((slash != std::string::npos && !IsDnsSubdomain(prefix)) || !IsLabelName(name)) {
      errors.push_back(fmt::format("{}: '{}' is not a valid label key", path, key));
    }
    if (value.is_string()) {
      const std::string& v = value.get_ref<const std::string&>();
      if (!v.empty() && !IsLabelName(v)) {
        errors.push_back(fmt::format(
            "{}.{}: '{}' is not a valid label value (at most 63 characters: letters, digits, "
            "'-', '_', '.', starting and ending with a letter or digit)",
            path, key, v));
      }
    }
  }
}

std::string TypeOf(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

std::string Short(const json& v) {
  std::string s = JsonText(v);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string JoinPath(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

struct KindSchema {
  json schema;
  std::shared_ptr<const json> definitions;  // for "$ref": "#/definitions/X"
};

}  // namespace

struct SchemaSet::Impl {
  std::map<std::string, KindSchema> kinds;  // "apiVersion/Kind"
  mutable std::map<std::string, std::optional<std::regex>> patterns;

  const std::regex* Pattern(const std::string& p) const {
    auto it = patterns.find(p);
    if (it == patterns.end()) {
      std::optional<std::regex> re;
      try {
        re.emplace(p, std::regex::ECMAScript | std::regex::optimize);
      } catch (const std::regex_error&) {
        // A pattern std::regex cannot read (RE2-only syntax) is not checked rather than failing
        // every object.
      }
      it = patterns.emplace(p, std::move(re)).first;
    }
    return it->second ? &*it->second : nullptr;
  }

  void Check(const json& schema_in, const json& v, const std::string& path, const json* defs,
             int depth, std::vector<std::string>& errors) const {
    const json* schema = &schema_in;
    if (schema->contains("$ref")) {
      std::string ref = schema->at("$ref").get<std::string>();
      const std::string prefix = "#/definitions/";
      if (defs == nullptr || !StartsWith(ref, prefix) ||
          !defs->contains(ref.substr(prefix.size()))) {
        errors.push_back(fmt::format("{}: schema error: unresolved $ref '{}'", path, ref));
        return;
      }
      schema = &defs->at(ref.substr(prefix.size()));
    }
    const json& s = *schema;
    if (v.is_null()) {
      if (s.value("nullable", false)) return;
      if (!s.contains("type") && !s.value("x-kubernetes-int-or-string", false)) return;
      errors.push_back(fmt::format("{}: null is not allowed here", path));
      return;
    }
    if (s.value("x-kubernetes-int-or-string", false)) {
      if (!v.is_number_integer() && !v.is_string()) {
        errors.push_back(fmt::format("{}: expected an integer or a string, got {} {}", path,
                                     TypeOf(v), Short(v)));
        return;
      }
      if (v.is_string()) CheckString(s, v.get_ref<const std::string&>(), path, errors);
      return;
    }
    if (s.contains("anyOf")) {
      bool any = false;
      for (const json& branch : s["anyOf"]) {
        std::vector<std::string> sub;
        Check(branch, v, path, defs, depth, sub);
        if (sub.empty()) any = true;
      }
      if (!any) errors.push_back(fmt::format("{}: matches none of the allowed forms", path));
    }
    if (s.contains("enum")) {
      bool found = false;
      for (const json& e : s["enum"]) found = found || e == v;
      if (!found) {
        std::vector<std::string> allowed;
        for (const json& e : s["enum"])
          allowed.push_back(e.is_string() ? e.get<std::string>() : e.dump());
        errors.push_back(
            fmt::format("{}: {} is not one of: {}", path, Short(v), tau::Join(allowed, ", ")));
      }
    }
    const std::string type = s.value("type", "");
    if (type == "object" || (type.empty() && v.is_object() &&
                             (s.contains("properties") || s.contains("additionalProperties")))) {
      if (!v.is_object()) {
        errors.push_back(
            fmt::format("{}: expected an object, got {} {}", path, TypeOf(v), Short(v)));
        return;
      }
      CheckObject(s, v, path, defs, depth, errors);
    } else if (type == "array") {
      if (!v.is_array()) {
        errors.push_back(
            fmt::format("{}: expected an array, got {} {}", path, TypeOf(v), Short(v)));
        return;
      }
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) {
        errors.push_back(fmt::format("{}: at least {} items needed, got {}", path,
                                     s["minItems"].get<size_t>(), v.size()));
      }
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) {
        errors.push_back(fmt::format("{}: at most {} items allowed, got {}", path,
                                     s["maxItems"].get<size_t>(), v.size()));
      }
      if (s.contains("items")) {
        for (size_t i = 0; i < v.size(); ++i) {
          Check(s["items"], v[i], fmt::format("{}[{}]", path, i), defs, depth + 1, errors);
        }
      }
    } else if (type == "string") {
      if (!v.is_string()) {
        errors.push_back(
            fmt::format("{}: expected a string, got {} {}", path, TypeOf(v), Short(v)));
        return;
      }
      CheckString(s, v.get_ref<const std::string&>(), path, errors);
    } else if (type == "integer") {
      if (!v.is_number_integer()) {
        errors.push_back(
            fmt::format("{}: expected an integer, got {} {}", path, TypeOf(v), Short(v)));
        return;
      }
      int64_t n = v.get<int64_t>();
      if (s.value("format", "") == "int32" && (n < INT32_MIN || n > INT32_MAX)) {
        errors.push_back(fmt::format("{}: {} does not fit in 32 bits", path, n));
      }
      if (s.contains("minimum") && n < s["minimum"].get<double>()) {
        errors.push_back(
            fmt::format("{}: {} is below the minimum {}", path, n, s["minimum"].dump()));
      }
      if (s.contains("maximum") && n > s["maximum"].get<double>()) {
        errors.push_back(
            fmt::format("{}: {} is above the maximum {}", path, n, s["maximum"].dump()));
      }
    } else if (type == "number") {
      if (!v.is_number()) {
        errors.push_back(
            fmt::format("{}: expected a number, got {} {}", path, TypeOf(v), Short(v)));
      }
    } else if (type == "boolean") {
      if (!v.is_boolean()) {
        errors.push_back(
            fmt::format("{}: expected a boolean, got {} {}", path, TypeOf(v), Short(v)));
      }
    }
  }

  void CheckString(const json& s, const std::string& v, const std::string& path,
                   std::vector<std::string>& errors) const {
    if (s.contains("maxLength") && v.size() > s["maxLength"].get<size_t>()) {
      errors.push_back(fmt::format("{}: {} characters, at most {} allowed", path, v.size(),
                                   s["maxLength"].get<size_t>()));
    }
    if (s.contains("minLength") && v.size() < s["minLength"].get<size_t>()) {
      errors.push_back(
          fmt::format("{}: at least {} characters needed", path, s["minLength"].get<size_t>()));
    }
    if (s.contains("pattern")) {
      const std::string& p = s["pattern"].get_ref<const std::string&>();
      if (const std::regex* re = Pattern(p); re != nullptr && !std::regex_search(v, *re)) {
        errors.push_back(fmt::format("{}: '{}' does not match the pattern {}", path, v, p));
      }
    }
    if (s.value("format", "") == "date-time") {
      static const std::regex kTime(
          "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{"
          "2})");
      if (!std::regex_match(v, kTime)) {
        errors.push_back(fmt::format("{}: '{}' is not an RFC 3339 date-time", path, v));
      }
    }
  }

  void CheckObject(const json& s, const json& v, const std::string& path, const json* defs,
                   int depth, std::vector<std::string>& errors) const {
    const bool preserve = s.value("x-kubernetes-preserve-unknown-fields", false);
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    // A CRD's root metadata is ObjectMeta, checked by the API server rather than by the schema.
    if (depth == 1 && path == "metadata" && props == nullptr) {
      CheckObject(ObjectMetaSchema(), v, path, nullptr, depth + 1, errors);
      CheckLabels(v.value("labels", json::object()), JoinPath(path, "labels"), errors);
      return;
    }
    if (EndsWith(path, "metadata") && v.contains("labels")) {
      CheckLabels(v["labels"], JoinPath(path, "labels"), errors);
    }
    if (s.contains("required")) {
      for (const json& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) {
          errors.push_back(fmt::format("{}: missing required field '{}'",
                                       path.empty() ? "(root)" : path, r.get<std::string>()));
        }
      }
    }
    if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>()) {
      errors.push_back(fmt::format("{}: at most {} entries allowed, got {}", path,
                                   s["maxProperties"].get<size_t>(), v.size()));
    }
    const json* additional =
        s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    std::vector<std::string> known;
    if (props != nullptr) {
      for (const auto& [k, unused] : props->items()) known.push_back(k);
    }
    for (const auto& [key, value] : v.items()) {
      std::string child = JoinPath(path, key);
      if (props != nullptr && props->contains(key)) {
        Check(props->at(key), value, child, defs, depth + 1, errors);
      } else if (additional != nullptr && additional->is_object()) {
        Check(*additional, value, child, defs, depth + 1, errors);
      } else if ((additional != nullptr && additional->is_boolean() && additional->get<bool>()) ||
                 preserve) {
        continue;
      } else {
        std::string hint = ClosestMatch(key, known);
        errors.push_back(
            fmt::format("{}: unknown field{}", child,
                        hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint)));
      }
    }
  }
};

SchemaSet::SchemaSet() : impl_(std::make_unique<Impl>()) {}
SchemaSet::~SchemaSet() = default;
SchemaSet::SchemaSet(SchemaSet&&) noexcept = default;
SchemaSet& SchemaSet::operator=(SchemaSet&&) noexcept = default;

Status SchemaSet::AddCrd(const nlohmann::json& crd) {
  try {
    if (crd.value("kind", "") != "CustomResourceDefinition") {
      return InvalidArgument("not a CustomResourceDefinition (kind is '" + crd.value("kind", "") +
                             "')");
    }
    const json& spec = crd.at("spec");
    std::string group = spec.at("group").get<std::string>();
    std::string kind = spec.at("names").at("kind").get<std::string>();
    int added = 0;
    for (const json& version : spec.at("versions")) {
      if (!version.value("served", false)) continue;
      std::string api = group + "/" + version.at("name").get<std::string>();
      impl_->kinds[api + "/" + kind] = {version.at("schema").at("openAPIV3Schema"), nullptr};
      ++added;
    }
    if (added == 0) return InvalidArgument("CRD " + kind + " serves no version");
    return Status::Ok();
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("malformed CustomResourceDefinition: ") + e.what());
  }
}

Status SchemaSet::AddSchemas(const nlohmann::json& doc) {
  if (!doc.is_object() || !doc.contains("kinds") || !doc["kinds"].is_object()) {
    return InvalidArgument("a schema file needs a 'kinds' object (\"apiVersion/Kind\": schema)");
  }
  auto defs = std::make_shared<const json>(doc.value("definitions", json::object()));
  for (const auto& [key, schema] : doc["kinds"].items()) impl_->kinds[key] = {schema, defs};
  return Status::Ok();
}

bool SchemaSet::Knows(const nlohmann::json& object) const {
  if (!object.is_object()) return false;
  return impl_->kinds.count(object.value("apiVersion", "") + "/" + object.value("kind", "")) > 0;
}

Status SchemaSet::Validate(const nlohmann::json& object) const {
  if (!object.is_object() || !object.contains("apiVersion") || !object.contains("kind") ||
      !object["apiVersion"].is_string() || !object["kind"].is_string()) {
    return InvalidArgument("not a Kubernetes object: apiVersion and kind must be strings");
  }
  std::string api = object["apiVersion"].get<std::string>();
  std::string kind = object["kind"].get<std::string>();
  auto it = impl_->kinds.find(api + "/" + kind);
  if (it == impl_->kinds.end()) {
    return InvalidArgument(fmt::format("no schema for {} {}", api, kind));
  }
  std::vector<std::string> errors;
  impl_->Check(it->second.schema, object, "", it->second.definitions.get(), 0, errors);
  if (!object.contains("metadata")) errors.push_back("metadata: missing");
  if (errors.empty()) return Status::Ok();
  std::string name = object.contains("metadata") && object["metadata"].is_object()
                         ? object["metadata"].value("name", "?")
                         : "?";
  for (std::string& e : errors) e = fmt::format("{}/{}: {}", kind, name, e);
  return InvalidArgument(tau::Join(errors, "\n"));
}

}  // namespace tau::kube
