// The code directory a run ships with: `tau run` snapshots it for the server, `tau plan --backend
// kubernetes` inlines it into the rendered objects. One walk serves both, so both skip the same
// things (version control, caches, virtualenvs, .tauignore patterns).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/code_file.h"
#include "common/status.h"
#include "spec/spec.h"

namespace tau::cli {

struct CodeWalk {
  std::vector<CodeFile> files;  // in a stable (sorted) order
  std::vector<size_t> sizes;    // each file's size when it was walked
  size_t bytes = 0;
  std::vector<std::string> warnings;  // links skipped, and why
};

// Where a spec's code comes from. Normally the spec's own folder; an entrypoint that leaves it
// (`../train.py`, TauGrid's `tau/` folder beside the project's code) makes the root the ancestor
// that holds it, as TauGrid resolves entrypoints against the project. `subdir` is the spec's folder
// inside the root ("" when they are one): the run starts there, so relative paths mean what they
// mean on the user's machine.
struct CodeRoot {
  std::string root;
  std::string subdir;
};
Result<CodeRoot> FindCodeRoot(const std::string& spec_file, const spec::RunSpec& spec);

// Reads the files under `root`. A symbolic link to a file inside `root` is stored as that file's
// content; a link to a directory is skipped with a warning, and so is a dangling link. A link whose
// target leaves `root` (through '..', an absolute path or another link), or a link loop, is an
// error naming the link: tau never uploads files from outside the code directory. `max_bytes`
// bounds the total: past it the error says how to keep data out of the code directory. The limits
// are checked from the files' sizes before any is read.
// `excludes` (run.working_dir_excludes) are more .tauignore lines, applied after the file's.
Result<CodeWalk> CollectCode(const std::string& root, size_t max_bytes,
                             const std::vector<std::string>& excludes = {});
// The same walk, within `tau run`'s limits, without reading the files: paths, modes and sizes
// (each file's data is empty).
Result<CodeWalk> ListCode(const std::string& root, const std::vector<std::string>& excludes = {});

// What the local backend would refuse at submission because the run could not start on this
// machine (runtime::CheckStartable over the code `tau run` would ship), as a warning at the field
// it names: `validate` and `plan` say it before `run` refuses. nullopt when the run can start, or
// when the code cannot be read (`tau run` says why).
std::optional<spec::Diagnostic> CannotStartWarning(const std::string& spec_file,
                                                   const spec::ParseOutcome& parsed,
                                                   int gpus_per_worker);

}  // namespace tau::cli
