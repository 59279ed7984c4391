#include "cli/file_kind.h"

#include <algorithm>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"

namespace tau::cli {
namespace {

bool HasAny(const std::vector<std::string>& keys, const std::vector<std::string>& wanted) {
  return std::any_of(keys.begin(), keys.end(), [&](const std::string& k) {
    return std::find(wanted.begin(), wanted.end(), k) != wanted.end();
  });
}

const std::vector<std::string> kPlatformKeys = {"queues",  "workspaces", "flavors",
                                                "cohorts", "priorities", "compute_profiles"};
const std::vector<std::string> kSpecKeys = {"schema_version", "engine",  "run",    "entrypoint",
                                            "script",         "compute", "runtime"};
const std::vector<std::string> kSweepKeys = {"parameters", "objective", "method", "samples"};

}  // namespace

const char* FileKindName(FileKind kind) {
  switch (kind) {
    case FileKind::kRunSpec:
      return "run spec";
    case FileKind::kWorkflow:
      return "workflow file";
    case FileKind::kSweep:
      return "sweep file";
    case FileKind::kPlatform:
      return "platform file";
    case FileKind::kScenario:
      return "admission scenario";
    case FileKind::kUnknown:
      break;
  }
  return "unknown";
}

std::string WithArticle(const std::string& name) {
  const bool vowel = !name.empty() && std::string_view("aeiou").find(name[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + name;
}

FileKindGuess GuessFileKind(const std::string& text) {
  FileKindGuess out;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception&) {
    out.kind = FileKind::kRunSpec;  // the run-spec reader says where the text breaks
    return out;
  }
  if (!root.IsMap()) {
    out.kind = FileKind::kRunSpec;
    return out;
  }
  bool workflow = false;
  for (const auto& entry : root) {
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    if (!key.IsScalar()) continue;
    out.keys.push_back(key.Scalar());
    if (key.Scalar() == "kind" && value.IsScalar() && value.Scalar() == "workflow") workflow = true;
  }
  if (workflow)
    out.kind = FileKind::kWorkflow;
  else if (HasAny(out.keys, {"workloads"}))
    out.kind = FileKind::kScenario;
  else if (HasAny(out.keys, kPlatformKeys))
    out.kind = FileKind::kPlatform;
  else if (HasAny(out.keys, kSpecKeys))
    out.kind = FileKind::kRunSpec;
  else if (HasAny(out.keys, kSweepKeys))
    out.kind = FileKind::kSweep;
  return out;
}

std::string UnknownFileKindMessage(const std::string& file, const std::vector<std::string>& keys) {
  return fmt::format(
      "{}:1:1: error: not a file tau reads (its top-level keys: {}); tau reads a run spec "
      "(schema_version: 1, or engine: job|rayjob), a workflow file (kind: workflow), a sweep file "
      "(spec and parameters), a platform file (queues and workspaces) and an admission scenario "
      "(queues and workloads)",
      file, keys.empty() ? "none" : Join(keys, ", "));
}

}  // namespace tau::cli
