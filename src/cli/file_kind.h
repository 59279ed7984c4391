// Which kind of file tau reads a YAML file is, by its top-level keys, so that `tau validate`
// checks each with its own reader and plan/explain can say which command a file is for.
#pragma once

#include <string>
#include <vector>

namespace tau::cli {

enum class FileKind { kRunSpec, kWorkflow, kSweep, kPlatform, kScenario, kUnknown };

// "run spec", "workflow file", "sweep file", "platform file", "admission scenario", "unknown".
const char* FileKindName(FileKind kind);
// "a run spec", "an admission scenario".
std::string WithArticle(const std::string& name);

struct FileKindGuess {
  FileKind kind = FileKind::kUnknown;
  std::vector<std::string> keys;  // the top-level keys read, in file order
};

// `kind: workflow` is a workflow; `workloads` an admission scenario (tau admission simulate); a
// platform's sections (queues, workspaces, flavors, ...) a platform file; a run spec's fields
// (schema_version, engine, run, ...) a run spec; `parameters` or a sweep's `spec` with its fields a
// sweep. Text that is not a YAML mapping is a run spec, so that its reader says where it breaks.
FileKindGuess GuessFileKind(const std::string& text);

// Why `file` is none of the kinds tau reads: the kinds, the keys each is known by and the keys
// found.
std::string UnknownFileKindMessage(const std::string& file, const std::vector<std::string>& keys);

}  // namespace tau::cli
