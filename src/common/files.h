// Small, durable file helpers: every write that records state goes through WriteFileAtomic.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace tau {

Result<std::string> ReadFile(const std::string& path);
// Writes to a temporary file beside `path`, fsyncs it, renames it over `path`, fsyncs the
// directory. Readers see the old content or the new one, never a half-written file, even after a
// crash.
Status WriteFileAtomic(const std::string& path, std::string_view content, int mode = 0644);
// mkdir -p with the given mode for the directories it creates.
Status MakeDirs(const std::string& path, int mode = 0755);
// Removes a tree; a missing path is not an error.
Status RemoveTree(const std::string& path);
bool PathExists(const std::string& path);
// $TAU_HOME, else ~/.tau.
std::string TauHome();

}  // namespace tau
