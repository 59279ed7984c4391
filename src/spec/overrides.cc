// --set overrides: PATH=VALUE texts, checked against the field trees and applied to the parsed
// YAML before the walk, so a value from the command line gets every check a file's value gets.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "common/strings.h"
#include "spec/walk.h"

namespace tau::spec {
namespace {

// A path's characters: field names, list indexes and (after a mapping field) any key.
bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

}  // namespace

Result<std::vector<Override>> ParseOverrides(const std::vector<std::string>& texts) {
  std::vector<Override> out;
  std::set<std::string> paths;
  for (const std::string& text : texts) {
    size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument(fmt::format(
          "--set '{}': expected PATH=VALUE, such as compute.gpus=2 or runtime.env.LR=0.01",
          internal::Printable(text)));
    Override o;
    o.path = text.substr(0, eq);
    o.value = text.substr(eq + 1);
    const std::string& p = o.path;
    if (!IsNameChar(p.front()) || p.back() == '.' || p.find("..") != std::string::npos)
      return InvalidArgument(
          fmt::format("--set {}: '{}' is not a field path; write it dotted, such as compute.gpus, "
                      "runtime.env.NAME or run.args[0]",
                      internal::Printable(text), internal::Printable(p)));
    if (!paths.insert(p).second)
      return InvalidArgument(fmt::format("--set {}: {} is set twice; give each path once",
                                         internal::Printable(text), internal::Printable(p)));
    out.push_back(std::move(o));
  }
  return out;
}

std::vector<Override> MergeOverrides(std::vector<Override> base,
                                     const std::vector<Override>& more) {
  for (const Override& o : more) {
    auto same =
        std::find_if(base.begin(), base.end(), [&](const Override& b) { return b.path == o.path; });
    if (same != base.end()) {
      same->value = o.value;
    } else {
      base.push_back(o);
    }
  }
  return base;
}

namespace internal {
namespace {

std::string Qualified(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// One step of a path: a field of a section, an item of a list, a key of a mapping.
struct Step {
  enum Kind { kField, kIndex, kKey } kind = kField;
  std::string name;               // kField, kKey
  size_t index = 0;               // kIndex
  const FieldDef* def = nullptr;  // kField: its definition
  std::string path;               // the walker's path of the node this step reaches
};

// How a value typed on the command line becomes a YAML node: text for string-like fields (so
// that `name=123` is a name, not a number), YAML for the rest (integers, booleans, lists, maps).
enum class ValueForm { kText, kScalar, kYaml };

ValueForm FormOf(Kind kind) {
  switch (kind) {
    case Kind::kString:
    case Kind::kEnum:
    case Kind::kDuration:
    case Kind::kQuantity:
      return ValueForm::kText;
    case Kind::kInt:
    case Kind::kBool:
      return ValueForm::kScalar;
    default:
      return ValueForm::kYaml;
  }
}

const char* KindWords(Kind kind) {
  switch (kind) {
    case Kind::kString:
      return "a string";
    case Kind::kInt:
      return "an integer";
    case Kind::kBool:
      return "a boolean";
    case Kind::kQuantity:
      return "a quantity";
    case Kind::kDuration:
      return "a duration";
    case Kind::kEnum:
      return "one of its allowed values";
    case Kind::kStringList:
    case Kind::kEnumList:
      return "a list";
    case Kind::kStringMap:
    case Kind::kEnv:
      return "a mapping";
    case Kind::kObject:
      return "a section";
    case Kind::kObjectList:
      return "a list of mappings";
    case Kind::kAny:
      return "a free-form value";
  }
  return "a value";
}

// A path below section `def` (at `at`) that --set PATH=VALUE takes: its first field that holds
// one value, in a section of its own if need be ("policy" -> "policy.priority_tier").
std::string ScalarLeaf(const FieldDef& def, const std::string& at) {
  for (const FieldDef& child : def.children) {
    if (FormOf(child.kind) != ValueForm::kYaml) return at + "." + child.name;
  }
  for (const FieldDef& child : def.children)
    if (child.kind == Kind::kObject) return ScalarLeaf(child, at + "." + child.name);
  return at + "." + def.children.front().name;
}

std::vector<std::string> NamesOf(const std::vector<FieldDef>& fields) {
  std::vector<std::string> names;
  for (const FieldDef& f : fields) names.push_back(f.name);
  return names;
}

class Applier {
 public:
  Applier(Ctx& ctx, size_t k) : ctx_(ctx), k_(k), o_(ctx.overrides[k]) {}

  // The document with this override applied, or nullopt after an error.
  std::optional<YAML::Node> Apply(const YAML::Node& root, const std::vector<FieldDef>& fields) {
    if (!Resolve(fields)) return std::nullopt;
    std::optional<YAML::Node> value = ValueNode();
    if (!value) return std::nullopt;
    std::optional<YAML::Node> out = Set(root, 0, *value);
    if (out) {
      // Where its node starts, and the field it sets: checks made after the walk find the
      // value's position by the field's path.
      if (!anchor_.empty()) ctx_.override_at.emplace(anchor_, k_);
      ctx_.override_at.emplace(steps_.back().path, k_);
    }
    return out;
  }

 private:
  void Fail(std::string message) { ctx_.Error(Pos{-static_cast<int>(k_) - 1, 0}, message); }

  // The path's steps against the field tree.
  bool Resolve(const std::vector<FieldDef>& top) {
    const std::string& p = o_.path;
    const std::vector<FieldDef>* fields = &top;
    std::string at;  // the steps so far, as the walker names them
    size_t i = 0;
    while (true) {
      size_t end = i;
      while (end < p.size() && IsNameChar(p[end])) ++end;
      std::string name = p.substr(i, end - i);
      std::string section = at.empty() ? "the top level" : "'" + at + "'";
      if (name.empty()) {
        Fail(
            fmt::format("'{}' is not a field path (at character {}); write it dotted, such as "
                        "compute.gpus, runtime.env.NAME or run.args[0]",
                        Printable(p), i + 1));
        return false;
      }
      auto def = std::find_if(fields->begin(), fields->end(),
                              [&](const FieldDef& f) { return f.name == name; });
      if (def == fields->end()) {
        std::vector<std::string> names = NamesOf(*fields);
        std::string close = Suggest(name, names);
        Fail(fmt::format("{}: unknown field '{}' in {} of the {} shape{}; its fields: {}",
                         Qualified(at, name), Printable(name), section, ShapeName(ctx_.spec.shape),
                         close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close),
                         Join(names, ", ")));
        return false;
      }
      at = Qualified(at, name);
      steps_.push_back({Step::kField, name, 0, &*def, at});
      i = end;
      if (i == p.size()) {
        if (def->kind == Kind::kObject) {
          Fail(
              fmt::format("{} is a section: set its fields one at a time, such as --set "
                          "{}=VALUE; its fields: {}",
                          at, ScalarLeaf(*def, at), Join(NamesOf(def->children), ", ")));
          return false;
        }
        return true;
      }
      bool list = def->kind == Kind::kStringList || def->kind == Kind::kEnumList ||
                  def->kind == Kind::kObjectList;
      if (p[i] == '[') {
        size_t close = p.find(']', i);
        std::string digits = close == std::string::npos ? "" : p.substr(i + 1, close - i - 1);
        if (!list) {
          Fail(fmt::format("{} is {}, not a list: it has no items to index", at,
                           KindWords(def->kind)));
          return false;
        }
        if (digits.empty() || digits.size() > 6 ||
            !std::all_of(digits.begin(), digits.end(),
                         [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
          Fail(fmt::format("{}: an item is named by its index, such as {}[0]", at, at));
          return false;
        }
        size_t index = std::stoul(digits);
        at = fmt::format("{}[{}]", at, index);
        steps_.push_back({Step::kIndex, "", index, nullptr, at});
        i = close + 1;
        if (i == p.size()) return true;
        if (def->kind != Kind::kObjectList || p[i] != '.') {
          Fail(fmt::format("{} is an item of a list of strings: nothing is below it", at));
          return false;
        }
        fields = &def->children;
        ++i;
        continue;
      }
      if (p[i] != '.') {
        Fail(
            fmt::format("'{}' is not a field path (at character {}); write it dotted, such as "
                        "compute.gpus, runtime.env.NAME or run.args[0]",
                        Printable(p), i + 1));
        return false;
      }
      ++i;
      if (def->kind == Kind::kObject) {
        fields = &def->children;
        continue;
      }
      if (def->kind == Kind::kStringMap || def->kind == Kind::kEnv) {
        // The rest is one key: a node selector's keys hold dots and slashes.
        std::string key = p.substr(i);
        steps_.push_back({Step::kKey, key, 0, nullptr, Qualified(at, key)});
        return true;
      }
      if (def->kind == Kind::kAny) {
        // Keys inside a free-form value: the whole field is the override's in diagnostics.
        anchor_ = at;
        for (const std::string& key : Split(p.substr(i), '.')) {
          if (key.empty()) {
            Fail(fmt::format("'{}' has an empty key", Printable(p)));
            return false;
          }
          steps_.push_back({Step::kKey, key, 0, nullptr, Qualified(steps_.back().path, key)});
        }
        return true;
      }
      Fail(fmt::format("{} is {}: nothing is below it (did you mean --set {}=...?)", at,
                       KindWords(def->kind), at));
      return false;
    }
  }

  // The field the value is for: the last field step, and whether the value is one item or one
  // entry of it rather than the whole field.
  std::optional<YAML::Node> ValueNode() {
    const Step* field = nullptr;
    for (const Step& s : steps_)
      if (s.kind == Step::kField) field = &s;
    const Step& last = steps_.back();
    Kind kind = field->def->kind;
    bool part = last.kind != Step::kField;
    ValueForm form = FormOf(kind);
    if (part) {
      // An item of a list of strings, an entry of a string mapping: text. An item of a list of
      // mappings, a key of a free-form value: YAML.
      form = kind == Kind::kObjectList || kind == Kind::kAny ? ValueForm::kYaml : ValueForm::kText;
    }
    if (form == ValueForm::kText) {
      YAML::Node n(o_.value);
      n.SetTag("!");  // quoted: the walker reads it as text
      return n;
    }
    if (form == ValueForm::kScalar) return YAML::Node(o_.value);
    YAML::Node n;
    try {
      n = YAML::Load(o_.value);
    } catch (const YAML::Exception& e) {
      Fail(
          fmt::format("{}: the value is not YAML ({}); write a list as [a, b] and a mapping as "
                      "{{KEY: value}}",
                      last.path, e.msg));
      return std::nullopt;
    }
    if (!part) {
      bool is_list =
          kind == Kind::kStringList || kind == Kind::kEnumList || kind == Kind::kObjectList;
      if (is_list && !n.IsSequence()) {
        Fail(fmt::format(
            "{} is a list: write the whole list as --set '{}=[a, b]'{}", last.path, last.path,
            kind == Kind::kObjectList ? "" : fmt::format(", or one item as {}[0]=a", last.path)));
        return std::nullopt;
      }
      bool is_map = kind == Kind::kStringMap || kind == Kind::kEnv;
      if (is_map && !n.IsMap() && !(kind == Kind::kEnv && n.IsSequence())) {
        Fail(
            fmt::format("{} is a mapping: set one entry with --set {}.KEY=value, or the whole "
                        "mapping as --set '{}={{KEY: value}}'",
                        last.path, last.path, last.path));
        return std::nullopt;
      }
    }
    if (n.IsNull() && (kind == Kind::kAny || kind == Kind::kObjectList)) {
      Fail(fmt::format("{}: expected a value, got nothing", last.path));
      return std::nullopt;
    }
    return n;
  }

  // `node` (the document's node at steps_[i - 1]; undefined or null where the file has none)
  // with the value set at steps_[i...], rebuilt: the document itself is never changed, so an
  // anchor's other aliases keep the file's value.
  std::optional<YAML::Node> Set(const YAML::Node& node, size_t i, const YAML::Node& value) {
    if (i == steps_.size()) return value;
    const Step& step = steps_[i];
    const std::string parent = i == 0 ? "the spec" : steps_[i - 1].path;
    if (step.kind == Step::kIndex) {
      size_t size = node.IsSequence() ? node.size() : 0;
      if (step.index >= size) {
        Fail(
            fmt::format("{}: {} has {}; --set replaces an item that is there, or the whole "
                        "list (--set '{}=[a, b]')",
                        step.path, parent,
                        size == 0 ? "no items" : fmt::format("items 0 to {}", size - 1), parent));
        return std::nullopt;
      }
      YAML::Node out(YAML::NodeType::Sequence);
      for (size_t j = 0; j < size; ++j) {
        if (j != step.index) {
          out.push_back(node[j]);
          continue;
        }
        std::optional<YAML::Node> item = Set(node[j], i + 1, value);
        if (!item) return std::nullopt;
        out.push_back(*item);
      }
      return out;
    }
    bool env_entry = step.kind == Step::kKey && i > 0 && steps_[i - 1].kind == Step::kField &&
                     steps_[i - 1].def->kind == Kind::kEnv;
    if (env_entry && node.IsSequence()) return SetEnvItem(node, step, value);
    if (node.IsDefined() && !node.IsNull() && !node.IsMap()) {
      Fail(fmt::format("{}: {} in the file is {}, not a mapping", step.path, parent,
                       Describe(node)));
      return std::nullopt;
    }
    YAML::Node out(YAML::NodeType::Map);
    bool found = false;
    if (node.IsMap()) {
      for (const auto& entry : node) {
        YAML::Node key = entry.first;
        YAML::Node child = entry.second;
        if (found || !key.IsScalar() || key.Scalar() != step.name) {
          out.force_insert(key, child);
          continue;
        }
        found = true;
        std::optional<YAML::Node> changed = Set(child, i + 1, value);
        if (!changed) return std::nullopt;
        out.force_insert(key, *changed);
      }
    }
    if (!found) {
      // A field the file does not have: it starts here, at the override.
      if (anchor_.empty()) anchor_ = step.path;
      std::optional<YAML::Node> made = Set(YAML::Node(), i + 1, value);
      if (!made) return std::nullopt;
      out.force_insert(YAML::Node(step.name), *made);
    }
    return out;
  }

  // runtime.env in its list form ({name, value} items): the item named so gets the value, or one
  // is added.
  std::optional<YAML::Node> SetEnvItem(const YAML::Node& list, const Step& step,
                                       const YAML::Node& value) {
    YAML::Node out(YAML::NodeType::Sequence);
    std::string field = step.path.substr(0, step.path.size() - step.name.size() - 1);
    bool found = false;
    size_t j = 0;
    for (const auto& element : list) {
      YAML::Node item = element;
      if (!found && item.IsMap() && item["name"].IsScalar() && item["name"].Scalar() == step.name) {
        found = true;
        YAML::Node changed(YAML::NodeType::Map);
        changed.force_insert(YAML::Node("name"), item["name"]);
        changed.force_insert(YAML::Node("value"), value);
        out.push_back(changed);
        anchor_ = fmt::format("{}[{}]", field, j);
      } else {
        out.push_back(item);
      }
      ++j;
    }
    if (!found) {
      YAML::Node added(YAML::NodeType::Map);
      YAML::Node name(step.name);
      name.SetTag("!");
      added.force_insert(YAML::Node("name"), name);
      added.force_insert(YAML::Node("value"), value);
      out.push_back(added);
      anchor_ = fmt::format("{}[{}]", field, j);
    }
    return out;
  }

  Ctx& ctx_;
  size_t k_;
  const Override& o_;
  std::vector<Step> steps_;
  std::string anchor_;  // where the override's node starts, when not at its last step
};

}  // namespace

YAML::Node ApplyOverrides(Ctx& ctx, const YAML::Node& root, const std::vector<FieldDef>& fields) {
  YAML::Node out = root;
  for (size_t k = 0; k < ctx.overrides.size(); ++k) {
    if (std::optional<YAML::Node> applied = Applier(ctx, k).Apply(out, fields)) out = *applied;
  }
  return out;
}

}  // namespace internal
}  // namespace tau::spec
