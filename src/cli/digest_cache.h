// What `tau run` remembers of the code files it hashed, so that resubmitting unchanged code reads
// none of it (as git's index spares `git status` from reading the work tree). A file is known by
// its inode, size and change time (ctime: no user can set it back, unlike mtime); an entry is
// kept only for a file whose ctime was at least kSettledSeconds old when it was hashed, so a
// change made later, within the file system's timestamp granularity, still moves its ctime past
// the recorded one.
#pragma once

#include <sys/stat.h>

#include <map>
#include <string>

namespace tau::cli {

class DigestCache {
 public:
  static constexpr int64_t kSettledSeconds = 2;

  // The cache of code directory `root` for this user, under $XDG_CACHE_HOME/tau/code-digests (or
  // ~/.cache/...); empty, and never saved, when there is no such place. A cache that cannot be
  // read is empty: it only saves work.
  static DigestCache Open(const std::string& root);

  // The sha256 recorded for `path` (relative to the root) as `st` describes it, or "".
  std::string Find(const std::string& path, const struct stat& st) const;
  // Records the digest of `path`'s content, read while it was as `st` describes it (unless it
  // had changed too recently to be told apart from a later change).
  void Record(const std::string& path, const struct stat& st, const std::string& sha256);
  // Keeps what was found or recorded since Open (files no longer in the directory are dropped);
  // writes nothing when that is what the file holds already (an unchanged directory). Best
  // effort: a cache that cannot be written costs only a slower next run.
  void Save() const;

 private:
  struct Entry {
    uint64_t dev = 0, ino = 0;
    int64_t size = 0, ctime_ns = 0;
    std::string sha256;
  };
  std::string root_;
  std::string file_;  // "" when there is nowhere to keep it
  std::map<std::string, Entry> known_;
  mutable std::map<std::string, Entry> used_;
  bool recorded_ = false;  // Record added or changed an entry
};

}  // namespace tau::cli
