// The code directory a run ships with: `tau run` snapshots it for the server, `tau plan --backend
// kubernetes` inlines it into the rendered objects. One walk serves both, so both skip the same
// things (version control, caches, virtualenvs, .tauignore patterns).
#pragma once

#include <string>
#include <vector>

#include "common/code_file.h"
#include "common/status.h"

namespace tau::cli {

struct CodeWalk {
  std::vector<CodeFile> files;  // in a stable (sorted) order
  size_t bytes = 0;
  std::vector<std::string> warnings;  // links skipped, and why
};

// Reads the files under `root`. A symbolic link to a file inside `root` is stored as that file's
// content; a link to a directory is skipped with a warning, and so is a dangling link. A link whose
// target leaves `root` (through '..', an absolute path or another link), or a link loop, is an
// error naming the link: tau never uploads files from outside the code directory. `max_bytes`
// bounds the total: past it the error says how to keep data out of the code directory.
Result<CodeWalk> CollectCode(const std::string& root, size_t max_bytes);

}  // namespace tau::cli
