// The strict walker: applies a FieldDef tree to a yaml-cpp node, checking types itself (YAML 1.2
// core schema) instead of trusting yaml-cpp's lenient conversions, so that `workers: "2"` and
// `gpus: 1.5` are errors.
#include "spec/walk.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/clock.h"
#include "common/strings.h"

namespace tau::spec::internal {
namespace {

constexpr int kMaxAnyDepth = 32;  // nesting accepted inside recorded-only values such as `eval`
constexpr size_t kMaxAnyNodes = 10000;  // and their size: an alias cycle or alias bomb stops here
constexpr size_t kMaxDurationChars = 64;

enum class ScalarType { kNull, kBool, kInt, kFloat, kString };

bool IsPlain(const YAML::Node& node) {
  // yaml-cpp tags plain scalars "?" and quoted ones "!"; explicit core-schema tags keep their
  // meaning.
  const std::string& tag = node.Tag();
  return tag == "?" || tag.empty() || tag == "tag:yaml.org,2002:int" ||
         tag == "tag:yaml.org,2002:float" || tag == "tag:yaml.org,2002:bool" ||
         tag == "tag:yaml.org,2002:null";
}

bool AllOf(std::string_view s, bool (*pred)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool IsOctDigit(char c) { return c >= '0' && c <= '7'; }

bool LooksInt(std::string_view s) {
  if (s.size() > 2 && s[0] == '0' && s[1] == 'x') return AllOf(s.substr(2), IsHexDigit);
  if (s.size() > 2 && s[0] == '0' && s[1] == 'o') return AllOf(s.substr(2), IsOctDigit);
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return AllOf(s, IsDigit);
}

bool LooksFloat(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == ".nan" || s == ".NaN" || s == ".NAN") {
    return true;
  }
  size_t i = 0;
  size_t digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && IsDigit(s[i])) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (i == s.size()) return false;
    while (i < s.size() && IsDigit(s[i])) ++i;
  }
  return i == s.size();
}

ScalarType Classify(const YAML::Node& node) {
  if (node.IsNull()) return ScalarType::kNull;
  if (!IsPlain(node)) return ScalarType::kString;
  const std::string& s = node.Scalar();
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return ScalarType::kNull;
  if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE") {
    return ScalarType::kBool;
  }
  if (LooksInt(s)) return ScalarType::kInt;
  if (LooksFloat(s)) return ScalarType::kFloat;
  return ScalarType::kString;
}

// Parses an integer the YAML 1.2 core schema way; nullopt when it does not fit in 64 bits.
std::optional<int64_t> ParseInt(std::string_view s) {
  int base = 10;
  bool negative = false;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
    base = s[1] == 'x' ? 16 : 8;
    s.remove_prefix(2);
  } else if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  uint64_t magnitude = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), magnitude, base);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  if (negative) {
    if (magnitude > static_cast<uint64_t>(INT64_MAX) + 1) return std::nullopt;
    return static_cast<int64_t>(0 - magnitude);
  }
  if (magnitude > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return static_cast<int64_t>(magnitude);
}

bool IsStandardTag(const std::string& tag) {
  return tag.empty() || tag == "?" || tag == "!" || StartsWith(tag, "tag:yaml.org,2002:");
}

std::string Qualified(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// Path used for "in '...'" and for looking fields up in the other shape: list indexes dropped.
std::string StripIndexes(const std::string& path) {
  std::string out;
  bool skipping = false;
  for (char c : path) {
    if (c == '[') skipping = true;
    if (!skipping) out += c;
    if (c == ']') skipping = false;
  }
  return out;
}

const std::vector<FieldDef>* ChildrenAt(const std::vector<FieldDef>* fields,
                                        const std::string& path) {
  if (fields == nullptr || path.empty()) return fields;
  for (const std::string& part : Split(StripIndexes(path), '.')) {
    auto it = std::find_if(fields->begin(), fields->end(),
                           [&](const FieldDef& f) { return f.name == part; });
    if (it == fields->end() || it->children.empty()) return nullptr;
    fields = &it->children;
  }
  return fields;
}

// Where a value is. An empty value ("key:" and nothing) has no position of its own: yaml-cpp marks
// it where the next token starts, often on a later line, so the key's position stands in for it.
Pos ValuePos(const YAML::Node& value, Pos key_pos) {
  Pos pos = PosOf(value.Mark());
  if (pos.line == 0) return key_pos;
  if (value.IsNull() && pos.line != key_pos.line) return key_pos;
  return pos;
}

// While an override's node is walked, every diagnostic is the override's.
class OverrideScope {
 public:
  OverrideScope(Ctx& ctx, const std::string& path) : ctx_(ctx), saved_(ctx.scope) {
    if (auto it = ctx.override_at.find(path); it != ctx.override_at.end())
      ctx.scope = static_cast<int>(it->second);
  }
  ~OverrideScope() { ctx_.scope = saved_; }
  OverrideScope(const OverrideScope&) = delete;
  OverrideScope& operator=(const OverrideScope&) = delete;

 private:
  Ctx& ctx_;
  int saved_;
};

class Walker {
 public:
  Walker(Ctx& ctx, FieldsFn other_shape) : ctx_(ctx), other_(other_shape) {}

  void Mapping(const YAML::Node& node, const std::vector<FieldDef>& fields,
               const std::vector<std::string>& required, const std::string& path, Pos pos) {
    std::map<std::string, Pos> seen;
    for (const auto& entry : node) {
      // Copies: yaml-cpp's iterator proxies are temporaries, so references into them would dangle.
      YAML::Node key = entry.first;
      YAML::Node value = entry.second;
      Pos key_pos = PosOf(key.Mark());
      if (!key.IsScalar()) {
        ctx_.Error(key_pos,
                   fmt::format("{}expected a field name, got {}", In(path), Describe(key)));
        continue;
      }
      const std::string& name = key.Scalar();
      if (auto at = ctx_.OverridePos(Qualified(path, name))) key_pos = *at;
      if (auto dup = seen.find(name); dup != seen.end()) {
        ctx_.Error(key_pos, fmt::format("duplicate field '{}'{} (first given on line {})",
                                        Printable(name), InSuffix(path), dup->second.line));
        continue;
      }
      seen[name] = key_pos;
      auto def = std::find_if(fields.begin(), fields.end(),
                              [&](const FieldDef& f) { return f.name == name; });
      if (def == fields.end()) {
        UnknownField(name, fields, path, key_pos);
        continue;
      }
      Field(*def, value, Qualified(path, name), key_pos);
    }
    for (const std::string& name : required) {
      if (seen.count(name) == 0) {
        ctx_.Error(pos, fmt::format("missing required field '{}'{}", name, InSuffix(path)));
      }
    }
  }

 private:
  static std::string In(const std::string& path) { return path.empty() ? "" : path + ": "; }
  static std::string InSuffix(const std::string& path) {
    return path.empty() ? "" : fmt::format(" in '{}'", path);
  }

  void UnknownField(const std::string& name, const std::vector<FieldDef>& fields,
                    const std::string& path, Pos pos) {
    if (name == "<<") {
      ctx_.Error(pos, fmt::format("{}YAML merge keys ('<<') are not supported; write the fields "
                                  "out (anchors and aliases of whole values do work)",
                                  In(path)));
      return;
    }
    std::vector<std::string> names;
    for (const FieldDef& f : fields) names.push_back(f.name);
    std::string message = fmt::format("unknown field '{}'{}", Printable(name), InSuffix(path));
    std::string close = Suggest(name, names);
    const std::vector<FieldDef>* other = other_ ? ChildrenAt(&other_(), path) : nullptr;
    bool in_other =
        other != nullptr && std::any_of(other->begin(), other->end(),
                                        [&](const FieldDef& f) { return f.name == name; });
    // The exact name in the other shape explains more than a near miss in this one.
    if (in_other) {
      message += ctx_.spec.shape == Shape::kManifest
                     ? " (that field belongs to the direct shape, which starts with 'engine:')"
                     : " (that field belongs to the manifest shape, which starts with "
                       "'schema_version: 1')";
    } else if (!close.empty()) {
      message += fmt::format(" (did you mean '{}'?)", close);
    }
    ctx_.Error(pos, message);
  }

  void Field(const FieldDef& def, const YAML::Node& node, const std::string& path, Pos key_pos) {
    OverrideScope scope(ctx_, path);
    Value v;
    v.path = path;
    v.key_pos = key_pos;
    v.pos = ctx_.OverridePos(path) ? key_pos : ValuePos(node, key_pos);
    ctx_.key_pos[path] = key_pos;
    ctx_.value_pos[path] = v.pos;
    if (!IsStandardTag(node.Tag())) {
      ctx_.Error(v.pos, fmt::format("{}: unsupported YAML tag '{}'", path, node.Tag()));
      return;
    }
    if (Read(def, node, &v) && def.set) def.set(ctx_, v);
  }

  bool TypeError(const Value& v, const char* expected, const YAML::Node& node) {
    ctx_.Error(v.pos, fmt::format("{}: expected {}, got {}", v.path, expected, Describe(node)));
    return false;
  }

  // Reads any non-null scalar as text: numbers and booleans keep the spelling they have in the
  // file.
  bool Text(const YAML::Node& node, const std::string& path, Pos pos, bool allow_empty,
            std::string* out) {
    if (!node.IsScalar() || Classify(node) == ScalarType::kNull) {
      ctx_.Error(pos, fmt::format("{}: expected a string, got {}", path, Describe(node)));
      return false;
    }
    if (!IsStandardTag(node.Tag())) {
      ctx_.Error(pos, fmt::format("{}: unsupported YAML tag '{}'", path, node.Tag()));
      return false;
    }
    *out = node.Scalar();
    if (out->find('\0') != std::string::npos) {
      ctx_.Error(pos, fmt::format("{}: must not contain a NUL character", path));
      return false;
    }
    // The file is UTF-8, but a double-quoted escape (\x85) can still make a byte that is not.
    if (size_t bad = FindInvalidUtf8(*out); bad != std::string::npos) {
      ctx_.Error(pos, fmt::format("{}: byte {} is not UTF-8 text (an escape such as \\x{:02x} "
                                  "writes one byte; write the character, or \\u{:04x})",
                                  path, bad, static_cast<unsigned char>((*out)[bad]),
                                  static_cast<unsigned char>((*out)[bad])));
      return false;
    }
    if (out->empty() && !allow_empty) {
      ctx_.Error(pos, fmt::format("{}: must not be empty", path));
      return false;
    }
    return true;
  }

  bool Read(const FieldDef& def, const YAML::Node& node, Value* v) {
    switch (def.kind) {
      case Kind::kString:
        return Text(node, v->path, v->pos, def.allow_empty, &v->text);
      case Kind::kInt:
        return ReadInt(def, node, v);
      case Kind::kBool:
        if (!node.IsScalar() || Classify(node) != ScalarType::kBool) {
          return TypeError(*v, "a boolean (true or false)", node);
        }
        v->flag = node.Scalar()[0] == 't' || node.Scalar()[0] == 'T';
        return true;
      case Kind::kQuantity:
        return ReadQuantity(def, node, v);
      case Kind::kDuration:
        return ReadDuration(def, node, v);
      case Kind::kEnum:
        return ReadEnum(def, node, v);
      case Kind::kStringList:
      case Kind::kEnumList:
        return ReadList(node, v);
      case Kind::kStringMap:
      case Kind::kEnv:
        return ReadPairs(def, node, v);
      case Kind::kObject:
        if (!node.IsMap()) return TypeError(*v, "a mapping", node);
        Mapping(node, def.children, def.required, v->path, v->pos);
        return true;
      case Kind::kObjectList:
        return ReadObjectList(def, node, v);
      case Kind::kAny:
        if (def.must_be_mapping && !node.IsMap()) return TypeError(*v, "a mapping", node);
        return ReadAny(node, v->path, v->pos, &v->any);
    }
    return false;
  }

  bool ReadInt(const FieldDef& def, const YAML::Node& node, Value* v) {
    if (!node.IsScalar() || Classify(node) != ScalarType::kInt) {
      return TypeError(*v, "an integer", node);
    }
    std::optional<int64_t> n = ParseInt(node.Scalar());
    std::string range = def.min && def.max ? fmt::format(" ({}..{})", *def.min, *def.max) : "";
    if (!n || (def.min && *n < *def.min) || (def.max && *n > *def.max)) {
      ctx_.Error(v->pos, fmt::format("{}: {} is out of range{}", v->path, node.Scalar(), range));
      return false;
    }
    v->number = *n;
    return true;
  }

  bool ReadQuantity(const FieldDef& def, const YAML::Node& node, Value* v) {
    ScalarType type = node.IsScalar() ? Classify(node) : ScalarType::kNull;
    if (!node.IsScalar() || type == ScalarType::kNull || type == ScalarType::kBool) {
      return TypeError(*v, "a quantity such as 2, 500m or 64Gi", node);
    }
    const std::string& text = node.Scalar();
    Result<Quantity> q = Quantity::Parse(text);
    if (!q.ok()) {
      ctx_.Error(v->pos, fmt::format("{}: {}", v->path, q.status().message()));
      return false;
    }
    if (q->IsZero()) {
      ctx_.Error(v->pos, fmt::format("{}: must be positive, got '{}'", v->path, text));
      return false;
    }
    if (def.whole_units && q->milli() % 1000 != 0) {
      // "512m" of memory is half a byte: almost always a typo for 512Mi.
      std::string hint = EndsWith(text, "m") ? fmt::format(" (did you mean '{}i'?)",
                                                           text.substr(0, text.size() - 1) + "M")
                                             : "";
      ctx_.Error(v->pos, fmt::format("{}: '{}' is a fraction of a byte{}", v->path, text, hint));
      return false;
    }
    v->quantity = *q;
    return true;
  }

  bool ReadDuration(const FieldDef& def, const YAML::Node& node, Value* v) {
    if (!node.IsScalar() || Classify(node) != ScalarType::kString) {
      return TypeError(*v, "a duration such as 30s, 5m or 1h30m", node);
    }
    const std::string& text = node.Scalar();
    if (text.size() > kMaxDurationChars) {
      ctx_.Error(v->pos, fmt::format("{}: duration is too long", v->path));
      return false;
    }
    Result<int64_t> ms = ParseDurationMillis(text);
    if (!ms.ok()) {
      ctx_.Error(v->pos, fmt::format("{}: {}", v->path, ms.status().message()));
      return false;
    }
    if (def.min && *ms < *def.min) {
      ctx_.Error(v->pos,
                 *def.min <= 1
                     ? fmt::format("{}: must be longer than zero, got '{}'", v->path, text)
                     : fmt::format("{}: must be at least {}, got '{}'", v->path,
                                   *def.min % 1000 == 0 ? fmt::format("{}s", *def.min / 1000)
                                                        : fmt::format("{}ms", *def.min),
                                   text));
      return false;
    }
    v->number = *ms;
    return true;
  }

  bool ReadEnum(const FieldDef& def, const YAML::Node& node, Value* v) {
    if (!Text(node, v->path, v->pos, /*allow_empty=*/true, &v->text)) return false;
    const auto& allowed = def.enum_values;
    if (std::find(allowed.begin(), allowed.end(), v->text) != allowed.end()) return true;
    if (def.normalize) {
      if (std::optional<std::string> mapped = def.normalize(v->text)) {
        ctx_.Warn(v->pos, fmt::format("{}: '{}' is a deprecated spelling of '{}'; tau reads it as "
                                      "'{}' (write '{}')",
                                      v->path, v->text, *mapped, *mapped, *mapped));
        v->text = *mapped;
        return true;
      }
    }
    std::string close = Suggest(v->text, allowed);
    ctx_.Error(v->pos, fmt::format("{}: unknown value '{}'{}; allowed: {}", v->path, v->text,
                                   close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close),
                                   Join(allowed, ", ")));
    return false;
  }

  bool ReadList(const YAML::Node& node, Value* v) {
    if (!node.IsSequence()) return TypeError(*v, "a list", node);
    bool ok = true;
    size_t i = 0;
    for (const auto& element : node) {
      YAML::Node item_node = element;
      std::string item;
      // An empty item's mark is wherever the next token starts; the list's own position is closer.
      Pos pos = item_node.IsNull() ? v->pos : PosOf(item_node.Mark());
      if (pos.line == 0) pos = v->pos;
      const std::string item_path = fmt::format("{}[{}]", v->path, i);
      if (auto at = ctx_.OverridePos(item_path)) pos = *at;
      if (Text(item_node, item_path, pos, /*allow_empty=*/false, &item)) {
        v->list.push_back(std::move(item));
        v->list_pos.push_back(pos);
      } else {
        ok = false;
      }
      ++i;
    }
    return ok;
  }

  // Entries that cannot be read are reported and left out; the rest still go to the field's
  // checks, so one bad value does not hide the errors of its neighbours.
  bool ReadPairs(const FieldDef& def, const YAML::Node& node, Value* v) {
    if (def.kind == Kind::kEnv && node.IsSequence()) return ReadEnvList(def, node, v);
    if (!node.IsMap()) {
      return TypeError(
          *v, def.kind == Kind::kEnv ? "a mapping or a list of {name, value}" : "a mapping", node);
    }
    std::map<std::string, int> seen;
    for (const auto& entry : node) {
      YAML::Node key = entry.first;
      YAML::Node value = entry.second;
      Pair pair;
      pair.key_pos = PosOf(key.Mark());
      pair.value_pos = ValuePos(value, pair.key_pos);
      if (key.IsScalar()) {
        if (auto at = ctx_.OverridePos(Qualified(v->path, key.Scalar())))
          pair.key_pos = pair.value_pos = *at;
      }
      if (key.IsScalar() && key.Scalar().empty()) {
        ctx_.Error(pair.key_pos, fmt::format("{}: a name must not be empty", v->path));
        continue;
      }
      if (!Text(key, v->path, pair.key_pos, /*allow_empty=*/false, &pair.key)) continue;
      if (auto dup = seen.find(pair.key); dup != seen.end()) {
        ctx_.Error(pair.key_pos,
                   fmt::format("duplicate field '{}' in '{}' (first given on line {})", pair.key,
                               v->path, dup->second));
        continue;
      }
      seen[pair.key] = pair.key_pos.line;
      if (!Text(value, Qualified(v->path, Printable(pair.key)), pair.value_pos, def.allow_empty,
                &pair.value)) {
        continue;
      }
      v->pairs.push_back(std::move(pair));
    }
    return true;
  }

  // runtime.env as a list of {name, value} (the Kubernetes form): each item is read into a Pair
  // with the positions of its name and value.
  bool ReadEnvList(const FieldDef& def, const YAML::Node& node, Value* v) {
    std::map<std::string, int> seen;
    size_t i = 0;
    for (const auto& element : node) {
      YAML::Node item = element;
      std::string path = fmt::format("{}[{}]", v->path, i++);
      OverrideScope scope(ctx_, path);
      Pos pos = item.IsNull() ? v->pos : PosOf(item.Mark());
      if (pos.line == 0) pos = v->pos;
      const std::optional<Pos> at = ctx_.OverridePos(path);
      if (at) pos = *at;
      if (!item.IsMap()) {
        ctx_.Error(pos, fmt::format("{}: expected a mapping with 'name' and 'value', got {}", path,
                                    Describe(item)));
        continue;
      }
      Pair pair;
      bool has_name = false, has_value = false, ok = true;
      for (const auto& entry : item) {
        YAML::Node key = entry.first;
        YAML::Node value = entry.second;
        Pos key_pos = PosOf(key.Mark());
        std::string name = key.IsScalar() ? key.Scalar() : "";
        Pos value_pos = ValuePos(value, key_pos);
        if (at) value_pos = *at;
        if (name == "name" && !has_name) {
          has_name = true;
          pair.key_pos = value_pos;
          ok = Text(value, path + ".name", value_pos, /*allow_empty=*/false, &pair.key) && ok;
        } else if (name == "value" && !has_value) {
          has_value = true;
          pair.value_pos = value_pos;
          ok = Text(value, path + ".value", value_pos, def.allow_empty, &pair.value) && ok;
        } else if (name == "name" || name == "value") {
          ctx_.Error(key_pos, fmt::format("duplicate field '{}' in '{}'", name, path));
          ok = false;
        } else {
          std::string close = Suggest(name, {"name", "value"});
          ctx_.Error(
              key_pos,
              fmt::format("unknown field '{}' in '{}'{}", Printable(name), path,
                          name == "valueFrom" ? " (write secret references in runtime.env_secret)"
                          : close.empty()     ? ""
                                              : fmt::format(" (did you mean '{}'?)", close)));
          ok = false;
        }
      }
      if (!has_name || !has_value) {
        ctx_.Error(pos, fmt::format("missing required field '{}' in '{}'",
                                    has_name ? "value" : "name", path));
        continue;
      }
      if (!ok) continue;
      if (auto dup = seen.find(pair.key); dup != seen.end()) {
        ctx_.Error(pair.key_pos, fmt::format("{}: '{}' is set twice (first on line {})", path,
                                             Printable(pair.key), dup->second));
        continue;
      }
      seen[pair.key] = pair.key_pos.line;
      v->pairs.push_back(std::move(pair));
    }
    return true;
  }

  bool ReadObjectList(const FieldDef& def, const YAML::Node& node, Value* v) {
    if (!node.IsSequence()) return TypeError(*v, "a list", node);
    size_t i = 0;
    for (const auto& element : node) {
      YAML::Node item = element;
      std::string path = fmt::format("{}[{}]", v->path, i++);
      OverrideScope scope(ctx_, path);
      Pos pos = item.IsNull() ? v->pos : PosOf(item.Mark());
      if (pos.line == 0) pos = v->pos;
      if (auto at = ctx_.OverridePos(path)) pos = *at;
      if (!item.IsMap()) {
        ctx_.Error(pos, fmt::format("{}: expected a mapping, got {}", path, Describe(item)));
        continue;
      }
      if (def.on_item) def.on_item(ctx_, pos);
      Mapping(item, def.children, def.required, path, pos);
    }
    return true;
  }

  // Converts a recorded-only value to JSON, bounded in depth and size.
  bool ReadAny(const YAML::Node& node, const std::string& path, Pos pos, nlohmann::json* out) {
    size_t budget = kMaxAnyNodes;
    std::string why;
    if (!ToJsonValue(node, 0, &budget, out, &why)) {
      ctx_.Error(pos, fmt::format("{}: {}", path, why));
      return false;
    }
    return true;
  }

  bool ToJsonValue(const YAML::Node& node, int depth, size_t* budget, nlohmann::json* out,
                   std::string* why) {
    if (depth > kMaxAnyDepth || (*budget)-- == 0) {
      *why = "value is nested too deeply or is too large";
      return false;
    }
    if (node.IsMap()) {
      *out = nlohmann::json::object();
      for (const auto& entry : node) {
        YAML::Node key_node = entry.first;
        YAML::Node value = entry.second;
        if (!key_node.IsScalar()) {
          *why = fmt::format("expected a field name, got {}", Describe(key_node));
          return false;
        }
        const std::string key = key_node.Scalar();
        if (out->contains(key)) {
          *why = fmt::format("duplicate field '{}'", key);
          return false;
        }
        if (!ToJsonValue(value, depth + 1, budget, &(*out)[key], why)) return false;
      }
      return true;
    }
    if (node.IsSequence()) {
      *out = nlohmann::json::array();
      for (const auto& element : node) {
        YAML::Node item = element;
        out->push_back(nullptr);
        if (!ToJsonValue(item, depth + 1, budget, &out->back(), why)) return false;
      }
      return true;
    }
    switch (Classify(node)) {
      case ScalarType::kNull:
        *why = "expected a value, got null";
        return false;
      case ScalarType::kBool:
        *out = node.Scalar()[0] == 't' || node.Scalar()[0] == 'T';
        return true;
      case ScalarType::kInt:
        if (std::optional<int64_t> n = ParseInt(node.Scalar())) {
          *out = *n;
          return true;
        }
        break;
      default:
        break;
    }
    *out = node.Scalar();  // floats and strings keep their spelling
    return true;
  }

  Ctx& ctx_;
  FieldsFn other_;
};

}  // namespace

Pos PosOf(const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

std::optional<Pos> Ctx::OverridePos(const std::string& path) const {
  auto it = override_at.find(path);
  if (it == override_at.end()) return std::nullopt;
  return Pos{-static_cast<int>(it->second) - 1, 0};
}

std::string Ctx::OriginOf(Pos pos) const {
  int k = scope >= 0 ? scope : pos.line < 0 ? -pos.line - 1 : -1;
  if (k < 0 || static_cast<size_t>(k) >= overrides.size()) return "";
  return "--set " + overrides[static_cast<size_t>(k)].Text();
}

namespace {

// A diagnostic at a file position, or at the --set that gave the value.
Diagnostic MakeDiagnostic(const Ctx& ctx, Pos pos, std::string message, bool warning) {
  Diagnostic d{ctx.file, pos.line, pos.column, std::move(message), warning};
  if (std::string origin = ctx.OriginOf(pos); !origin.empty()) {
    d.file = std::move(origin);
    d.line = d.column = 0;
  }
  return d;
}

}  // namespace

void Ctx::Error(Pos pos, std::string message) {
  if (diagnostics.size() >= kMaxDiagnostics) {
    ++suppressed;
    return;
  }
  diagnostics.push_back(MakeDiagnostic(*this, pos, std::move(message), false));
}

void Ctx::Warn(Pos pos, std::string message) {
  if (warnings.size() >= kMaxDiagnostics) return;
  warnings.push_back(MakeDiagnostic(*this, pos, std::move(message), true));
}

Pos Ctx::KeyPos(const std::string& path) const {
  auto it = key_pos.find(path);
  return it == key_pos.end() ? Pos{} : it->second;
}

Pos Ctx::ValuePos(const std::string& path) const {
  auto it = value_pos.find(path);
  return it == value_pos.end() ? Pos{} : it->second;
}

std::string Suggest(const std::string& word, const std::vector<std::string>& candidates) {
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  for (const std::string& c : candidates) {
    if (lower(c) == lower(word)) return c;
  }
  return ClosestMatch(word, candidates);
}

std::string Printable(std::string_view text, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    bool continuation = (c & 0xC0) == 0x80;
    if (out.size() >= max_chars && !continuation) return out + "...";
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Describe(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  if (!node.IsScalar()) return "null";
  switch (Classify(node)) {
    case ScalarType::kNull:
      return "null";
    case ScalarType::kBool:
      return fmt::format("a boolean ({})", node.Scalar());
    case ScalarType::kInt:
      return fmt::format("an integer ({})", node.Scalar());
    case ScalarType::kFloat:
      return fmt::format("a number ({})", node.Scalar());
    case ScalarType::kString:
      break;
  }
  std::string text = Printable(node.Scalar(), 40);
  return fmt::format("a string ('{}')", text);
}

void WalkMapping(Ctx& ctx, const YAML::Node& node, const std::vector<FieldDef>& fields,
                 const std::vector<std::string>& required, const std::string& path, Pos pos,
                 FieldsFn other_shape) {
  Walker(ctx, other_shape).Mapping(node, fields, required, path, pos);
}

}  // namespace tau::spec::internal
