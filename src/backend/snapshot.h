// Code snapshots: the files of a run's code directory as they were at submission, stored once per
// content digest under $TAU_HOME/snapshots/<sha256>. Later edits of the user's files never change a
// queued run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/code_file.h"
#include "common/limits.h"
#include "common/status.h"

namespace tau::server {

struct Snapshot {
  std::string digest;  // sha256 over the sorted (path, mode, sha256 of content) list
  std::string dir;
  nlohmann::json files;  // [{"path","size","sha256","mode"}]
};

// A code path is plain and relative: not empty or absolute, no '.', '..' or '//' parts, within the
// length limits. The error says which rule it breaks.
Status CheckCodePath(const std::string& path);

// Checks every path (no escape from the snapshot directory) and the size limits, then stores the
// files.
Result<Snapshot> StoreSnapshot(const std::string& snapshots_root, std::vector<CodeFile> files);

// The files of a stored snapshot (the Kubernetes backend ships them inside the run's object).
Result<std::vector<CodeFile>> ReadSnapshot(const std::string& snapshot_dir);

// Copies a snapshot into a run's private work directory, which appears complete or not at all (a
// copy cut short by a crash is redone).
Status CopySnapshot(const std::string& snapshot_dir, const std::string& work_dir);

}  // namespace tau::server
