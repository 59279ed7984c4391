// Internal to the spec module: a small declarative schema (FieldDef trees) and the strict walker
// that applies it to a yaml-cpp document. One tree per shape drives both the parser and
// JsonSchema(), so the two can never disagree about which fields exist.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/quantity.h"
#include "spec/spec.h"

namespace tau::spec::internal {

// A 1-based position in the file; {0, 0} when unknown.
struct Pos {
  int line = 0;
  int column = 0;
};

Pos PosOf(const YAML::Mark& mark);

// One entry of a YAML mapping read as string -> string (env, node_selector).
struct Pair {
  std::string key;
  std::string value;
  Pos key_pos;
  Pos value_pos;
};

// A field's value after the walker has checked its type. Only the member matching the field's Kind
// is set.
struct Value {
  std::string path;  // dotted path, e.g. "compute.workers"
  Pos key_pos;
  Pos pos;  // the value's position (the key's when the value is empty)
  std::string text;
  int64_t number = 0;
  bool flag = false;
  Quantity quantity;
  std::vector<std::string> list;
  std::vector<Pos> list_pos;
  std::vector<Pair> pairs;
  nlohmann::json any;
};

// Parser state shared by the walker and the field setters.
struct Ctx {
  explicit Ctx(std::string file_name) : file(std::move(file_name)) {}
  void Error(Pos pos, std::string message);
  // An accepted field the author should hear about (deprecated spelling, not acted on).
  void Warn(Pos pos, std::string message);
  bool Seen(const std::string& path) const { return key_pos.count(path) > 0; }
  Pos KeyPos(const std::string& path) const;
  Pos ValuePos(const std::string& path) const;

  // A pathological file (a megabyte of unknown keys) would otherwise produce a megabyte of errors.
  static constexpr size_t kMaxDiagnostics = 200;

  std::string file;
  std::vector<Diagnostic> diagnostics;
  std::vector<Diagnostic> warnings;
  size_t suppressed = 0;  // errors beyond kMaxDiagnostics, counted but not kept
  RunSpec spec;
  std::map<std::string, Pos> key_pos;    // every field present in the file, by dotted path
  std::map<std::string, Pos> value_pos;  // and where its value starts
  // Direct-shape aliases, resolved after the walk.
  std::string top_level_image;
  std::optional<int64_t> direct_gpus;
  std::optional<int64_t> direct_gpus_per_worker;
  bool kind_set = false;  // `engine` / `run.engine` / `run.workload_kind` was read successfully
  // Fields given at two levels of the direct shape (name / run.name, engine / run.engine,
  // entrypoint / run.entrypoint, image / run.image): the value as read, by the path it was read at,
  // compared after the walk.
  struct Spelled {
    std::string text;
    Pos pos;
  };
  std::map<std::string, Spelled> spelled;
  std::map<std::string, Spelled> env_pos;  // env variable -> {the field it is in, its position}

  // The --set overrides (ParseSpec's), and where each one's value sits in the walked document:
  // the walker path of the node it made or replaced ("compute.gpus", "runtime.env.LR",
  // "run.args[1]", "runtime.env[2]"). A node there, and everything under it, is at the override's
  // position (OverridePos): its diagnostics say "--set PATH=VALUE" instead of file:line:col.
  std::vector<Override> overrides;
  std::map<std::string, size_t> override_at;
  int scope = -1;  // the override whose node is being walked, or -1
  // Pos{-(k + 1), 0} for the override placed at `path`, else nullopt.
  std::optional<Pos> OverridePos(const std::string& path) const;
  // The "--set PATH=VALUE" of a position OverridePos made (or of the scope); "" for a file's.
  std::string OriginOf(Pos pos) const;
};

enum class Kind {
  kString,
  kInt,
  kBool,
  kQuantity,
  kDuration,
  kEnum,
  kStringList,
  kEnumList,
  kStringMap,
  kEnv,
  kObject,
  kObjectList,
  kAny,
};

using Setter = std::function<void(Ctx&, const Value&)>;

struct FieldDef {
  std::string name;
  Kind kind = Kind::kString;
  std::string doc;
  Setter set;                            // called once the value has the right type
  std::vector<FieldDef> children;        // kObject, and each item of kObjectList
  std::vector<std::string> required;     // required children (kObject, kObjectList items)
  std::vector<std::string> enum_values;  // kEnum, kEnumList
  std::optional<int64_t> min, max;       // kInt range; kDuration minimum (ms); kString max length
  bool allow_empty = false;              // kString: "" is accepted
  bool whole_units = false;              // kQuantity: bytes, so no milli-units ("512m" memory)
  bool scalar_text = false;              // strings: numbers and booleans are documented as accepted
  bool must_be_mapping = false;          // kAny: the value must be a mapping
  std::string pattern;                   // JSON Schema pattern (strings, or map keys)
  std::function<void(Ctx&, Pos)> on_item;  // kObjectList: before each item's fields are read
  // kEnum: maps a spelling that is not one of enum_values to the value it stands for (a deprecated
  // alias), or nullopt. The walker warns at the value and reads the mapped value instead.
  std::function<std::optional<std::string>(const std::string&)> normalize;
  std::vector<std::string> deprecated_values;  // kEnum: aliases, for the JSON Schema

  // Compatibility with TauGrid's run config (docs/taugrid-compat.md, CompatibilityTable()): what
  // each backend does with the field, in a few words. Every field must say; a section (kObject)
  // says "section". tau_extension: TauGrid has no such field.
  std::string local;
  std::string kube;
  bool tau_extension = false;
};

// Walks `node` (a mapping) against `fields`, reporting unknown, duplicate, mistyped and missing
// fields. `path` is "" at the top level. `other_shape` (may be null) gives the fields the other
// shape accepts, for hints; it is called only when an unknown field needs one, so that a valid
// spec never builds the other shape's tree (a cost on every `tau run`).
using FieldsFn = const std::vector<FieldDef>& (*)();
void WalkMapping(Ctx& ctx, const YAML::Node& node, const std::vector<FieldDef>& fields,
                 const std::vector<std::string>& required, const std::string& path, Pos pos,
                 FieldsFn other_shape);

// A "did you mean" candidate: a case-insensitive match first, else the closest by edit distance; ""
// if none.
std::string Suggest(const std::string& word, const std::vector<std::string>& candidates);

// Text for a message: control characters escaped, long text shortened (on a UTF-8 boundary).
std::string Printable(std::string_view text, size_t max_chars = 60);

// "a mapping", "a list", "null", "a string", "an integer", "a number", "a boolean".
std::string Describe(const YAML::Node& node);

// Applies the --set overrides (ctx.overrides) to a copy of `root` (the document's top mapping)
// rebuilt along each path, checking each path against `fields` first: an unknown field, a path
// below a value, a list index past the list's end are errors at the override. Records where each
// one landed in ctx.override_at.
YAML::Node ApplyOverrides(Ctx& ctx, const YAML::Node& root, const std::vector<FieldDef>& fields);

// The field trees. Setters write into Ctx::spec.
const std::vector<FieldDef>& ManifestFields();
const std::vector<FieldDef>& DirectFields();
const std::vector<std::string>& ManifestRequired();
const std::vector<std::string>& DirectRequired();

// The two shapes' JSON Schemas, from the trees.
nlohmann::json SchemaForFields(const std::vector<FieldDef>& fields,
                               const std::vector<std::string>& required);

// Allowed values, shared by the trees, the validators and the tests.
const std::vector<std::string>& GpuClasses();
const std::vector<std::pair<std::string, std::string>>& GpuClassAliases();  // alias -> class
const std::vector<std::string>& Topologies();
const std::vector<std::string>& RetryableFailureClasses();

}  // namespace tau::spec::internal
