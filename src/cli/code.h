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

// Where a spec's code comes from, and where in it the run starts (`subdir`, "" at the root).
//  - TauGrid's repository layout: a spec in the `tau/` folder of a repository (the folder's parent
//    holds `.git`), or any spec with `code_dir` (--code-dir DIR). The code is the repository (or
//    DIR), the spec's relative paths are relative to it and the run starts at its root, as
//    TauGrid runs from the repository root: tau/train.yaml's `train.py` is the root's train.py.
//    An entrypoint that leaves the spec's folder (`../train.py`) is read from the spec's folder
//    as before, and the run starts there; it must stay inside the root.
//  - Otherwise the spec's own folder (subdir ""); an entrypoint that leaves it (`../train.py`)
//    makes the root the ancestor that holds it and `subdir` the spec's folder inside it, so
//    relative paths mean what they mean on the user's machine.
struct CodeRoot {
  std::string root;
  std::string subdir;
};
Result<CodeRoot> FindCodeRoot(const std::string& spec_file, const spec::RunSpec& spec,
                              const std::string& code_dir = "");

// The nearest of `dir` and its ancestors that holds `.git` (a directory, or the file of a
// worktree or submodule), absolute; "" when none does.
std::string FindRepositoryRoot(const std::string& dir);

// The spec `tau run TARGET` names. DIR/tau.yaml (or .yml) for a directory; TARGET itself when it
// exists, or has a '/', or ends in .yaml or .yml; otherwise tau/TARGET.yaml or tau/TARGET.yml in
// `code_dir` (--code-dir) or else in the repository the current directory is in
// (FindRepositoryRoot), named relative to the current directory. NotFound names every place it
// looked; InvalidArgument when both spellings exist.
Result<std::string> ResolveSpecTarget(const std::string& target, const std::string& code_dir);

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
