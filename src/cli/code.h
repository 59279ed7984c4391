// The code directory a run ships with: `tau run` snapshots it for the server, `tau plan --backend
// kubernetes` inlines it into the rendered objects. One walk serves both, so both skip the same
// things (version control, caches, virtualenvs, .tauignore patterns).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace tau::cli {

struct CodeFile {
  std::string path;  // relative to the code directory, '/'-separated
  int mode = 0644;
  std::string data;
};

struct CodeWalk {
  std::vector<CodeFile> files;  // in a stable (sorted) order
  size_t bytes = 0;
  std::vector<std::string> warnings;  // links skipped, and why
};

// Reads the files under `root`. A link is followed only when its target stays inside `root` (links
// to directories are skipped). `max_bytes` bounds the total: past it the error says how to keep
// data out of the code directory.
Result<CodeWalk> CollectCode(const std::string& root, size_t max_bytes);

}  // namespace tau::cli
