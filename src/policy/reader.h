// Internal to the policy module: a small strict reader over yaml-cpp nodes. It checks types the
// YAML 1.2 core-schema way (a quoted "2" is a string, not an integer), reports unknown, duplicate
// and missing keys with "did you mean", and collects every error as a positioned Diagnostic.
// The spec's walker is internal to that module, so this is the policy module's own small one.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/quantity.h"
#include "policy/policy.h"

namespace tau::policy::internal {

struct Pos {
  int line = 0;  // 1-based; 0 unknown
  int column = 0;
};

Pos PosOf(const YAML::Node& node);

// One key of a mapping: its value and where the key and the value are.
struct Entry {
  YAML::Node value;
  std::string path;  // dotted path for messages: "workspaces[0].limits.max_workers"
  Pos key_pos;
  Pos pos;  // the value's position (the key's when the value is empty)
};

using Fields = std::map<std::string, Entry>;

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  void Error(Pos pos, std::string message);
  std::vector<Diagnostic>& diagnostics() { return diagnostics_; }

  // Reads a mapping: keys not in `allowed` are errors (with a hint), duplicates are errors,
  // `required` keys must be present. Returns false (after reporting) when `node` is not a mapping.
  bool Map(const YAML::Node& node, const std::string& path, Pos pos,
           const std::vector<std::string>& allowed, const std::vector<std::string>& required,
           Fields* out);

  // Scalars. Each reports its own error and returns nullopt on a wrong type or value.
  std::optional<std::string> Str(const Entry& e);
  std::optional<int64_t> Int(const Entry& e, int64_t lo, int64_t hi);
  std::optional<bool> Bool(const Entry& e);
  // A positive Kubernetes quantity; `whole_units` refuses fractions (bytes).
  std::optional<Quantity> Qty(const Entry& e, bool whole_units);
  std::optional<int64_t> DurationMs(const Entry& e);
  // A list of non-empty strings, with each item's entry (for positions).
  std::optional<std::vector<Entry>> StrList(const Entry& e);
  // A list of mappings: each item as an Entry whose path is "PATH[i]".
  std::optional<std::vector<Entry>> Items(const Entry& e);

  // "unknown workspace 'reserch' (did you mean 'research'?)"
  void Unknown(Pos pos, const std::string& what, const std::string& kind, const std::string& name,
               const std::vector<std::string>& known);

 private:
  bool TypeError(const Entry& e, const char* expected);
  std::string file_;
  std::vector<Diagnostic> diagnostics_;
};

// "a mapping", "a list", "null", "a string ('x')", "an integer (3)", ...
std::string Describe(const YAML::Node& node);
// A case-insensitive match first, else the closest by edit distance; "" if none.
std::string Suggest(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" or "".
std::string Hint(const std::string& word, const std::vector<std::string>& candidates);
// "72h", "1h30m", "90s", "250ms": like the platform file spells durations, zero parts left out.
std::string ShortDuration(int64_t ms);
// A Kubernetes resource name: [DNS-subdomain "/"] name, e.g. cpu, nvidia.com/gpu.
bool IsResourceName(std::string_view s);

}  // namespace tau::policy::internal
