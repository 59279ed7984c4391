#include "recovery/recovery.h"

#include <sys/stat.h>

#include <filesystem>

#include "common/strings.h"

namespace tau::recovery {

static bool IsTemporaryName(const std::string& name) {
  return name.empty() || name[0] == '.' || EndsWith(name, ".tmp") || EndsWith(name, ".partial") ||
         EndsWith(name, ".incomplete");
}

std::string NewestCompleteCheckpoint(const std::string& dir) {
  std::error_code ec;
  std::string best;
  struct timespec best_time = {0, 0};
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (IsTemporaryName(name)) continue;
    std::string path = entry.path().string();
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (::stat((path + "/COMPLETE").c_str(), &st) != 0) continue;  // still being written
    } else if (!S_ISREG(st.st_mode)) {
      continue;
    }
    const struct timespec& t = st.st_mtim;
    bool newer = t.tv_sec > best_time.tv_sec ||
                 (t.tv_sec == best_time.tv_sec && t.tv_nsec > best_time.tv_nsec) ||
                 (t.tv_sec == best_time.tv_sec && t.tv_nsec == best_time.tv_nsec && path > best);
    if (best.empty() || newer) {
      best = path;
      best_time = t;
    }
  }
  return best;
}

std::string IncompleteCheckpointReason(const std::string& dir, const std::string& path) {
  std::filesystem::path rel = std::filesystem::path(path).lexically_relative(dir);
  if (rel.empty() || rel == ".")
    return "it is the checkpoint directory itself; name a checkpoint in it";
  for (const auto& part : rel) {
    if (IsTemporaryName(part.string()))
      return "'" + part.string() +
             "' is a temporary name (.tmp, .partial, .incomplete or a leading '.'): the checkpoint "
             "is still being written, or its writer died";
  }
  const std::string top = dir + "/" + rel.begin()->string();
  struct stat st;
  if (::stat(top.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
      ::stat((top + "/COMPLETE").c_str(), &st) != 0)
    return "the checkpoint directory " + rel.begin()->string() +
           " has no COMPLETE file: it was not finished";
  return "";
}

}  // namespace tau::recovery
