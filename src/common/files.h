// Small, durable file helpers: every write that records state goes through WriteFileAtomic.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <sys/stat.h>

#include "common/status.h"

namespace tau {

Result<std::string> ReadFile(const std::string& path);
// Reads at most `max_bytes`: a longer file (or an endless one, /dev/zero, a FIFO that keeps
// writing) is ResourceExhausted after reading max_bytes + 1 bytes, naming the limit and `what`
// ("a spec").
Result<std::string> ReadFileAtMost(const std::string& path, size_t max_bytes,
                                   const std::string& what);
// Reads a file in chunks, handing each to `chunk` (for hashing or copying without holding it all).
Status ReadFileChunks(const std::string& path, const std::function<void(std::string_view)>& chunk);
// Reads an open file to its end in chunks, then closes it; `path` is for messages.
Status ReadChunksAndClose(int fd, const std::string& path,
                          const std::function<void(std::string_view)>& chunk);
enum class Durability {
  kSynced,        // fsync the file and its directory: survives a crash of the machine
  kProcessCrash,  // no fsync: survives a crash of any process (the page cache outlives it), not of
                  // the machine
};
// Writes to a temporary file beside `path`, renames it over `path`. Readers see the old content or
// the new one, never a half-written file. kSynced (the default) also fsyncs the file before and the
// directory after.
Status WriteFileAtomic(const std::string& path, std::string_view content, int mode = 0644,
                       Durability durability = Durability::kSynced);
// WriteFileAtomic unless `path` already holds `content` (then only its mode is set): what a
// process writes at every start must not need free space when nothing changed (a full disk).
Status WriteFileIfChanged(const std::string& path, std::string_view content, int mode = 0644);
// Removes the temporary files WriteFileAtomic(path) leaves behind when its writer is killed
// between creating and renaming one (`path.tmp.PID` of a process that no longer exists).
void RemoveAbandonedTemporaries(const std::string& path);
// mkdir -p: every directory it creates gets `mode` exactly (whatever the umask), and so does
// `path` itself when it exists already. Private by default: what tau makes under its home is
// opened to others only where a caller says so.
Status MakeDirs(const std::string& path, int mode = 0700);
// Removes a tree; a missing path is not an error. Through descriptors (no link below `path` is
// followed, even one swapped in while it runs), so root may remove a tree another user can change.
Status RemoveTree(const std::string& path);
bool PathExists(const std::string& path);

// How CloneTree makes each file of the copy. Either way the copy's directories are its own (files
// may be added, removed and renamed there); they differ in what a file is.
enum class TreeFiles {
  // A reflink (copy-on-write clone, writable) where the file system has them, else a hard link to
  // the source's file when that is read-only (shared: the copy's owner cannot write it, only
  // replace it), else a copy. Only for a copy whose users are not root, whom read-only modes do not
  // stop.
  kLinkReadOnly,
  // A reflink where the file system has them, else a copy: each file the copy's own, writable.
  kCopy,
};
// Makes `to` a copy of the tree `from` (directories and regular files; a file is writable in the
// copy, 0755 or 0644 by its owner's execute bit). It appears complete or not at all: made at
// `to`.partial and renamed, so a copy cut short by a crash is redone.
Status CloneTree(const std::string& from, const std::string& to, TreeFiles how);
// One entry WalkTree visits: its path below the root, the directory it is in (a descriptor, open
// while the visitor runs), its name there, and its own status (a link's, never its target's).
struct TreeEntry {
  std::string rel;
  int dir_fd = -1;
  std::string name;
  struct stat st;
};
// Visits every entry below `root` (not `root` itself), each directory's entries in name order,
// entirely through descriptors: a directory is opened relative to its parent's descriptor without
// following a link (O_NOFOLLOW | O_DIRECTORY) and an entry's status is read relative to its
// directory, so a directory another user swaps for a symbolic link while the walk runs is seen as
// the link and never entered, and no path is resolved again after it was checked. `visit` answers
// whether to enter a directory (ignored for anything else); directories deeper than kMaxWalkDepth
// are not entered. An entry removed while the walk runs is passed over.
// `max_entries` bounds the entries read in all (each directory's are taken as the kernel lists them
// up to what is left, then sorted): past it the walk stops, and `*truncated` (if given) says so.
inline constexpr int kMaxWalkDepth = 128;
Status WalkTree(const std::string& root, const std::function<Result<bool>(const TreeEntry&)>& visit,
                size_t max_entries = SIZE_MAX, bool* truncated = nullptr);
// Opens the regular file `name` in the directory `dir_fd` for reading: never through a link,
// never waiting on a FIFO. NotFound when gone, InvalidArgument when it is not a regular file
// (`shown` names it in messages). The caller closes it.
Result<int> OpenRegularAt(int dir_fd, const std::string& name, const std::string& shown);
// Hands what tau made in a tree to a user. It is meant for trees that user can already change
// while it runs (a retried attempt's code, checkpoints, the user's virtualenvs), so it works only
// through descriptors (WalkTree's rules) and changes each entry through a descriptor of that very
// entry (O_PATH, no link followed, then fchownat with AT_EMPTY_PATH): a swap between the look and
// the change changes the swapped-in entry, never what a link points at. It changes only entries
// owned by the caller (what tau made: another user's file moved into the tree stays theirs) with a
// single link (in a CloneTree copy a file with more links is the source's read-only file, which
// the user must never own; a hard link to some other file is left alone too); symlinks themselves.
Status ChownTree(const std::string& root, unsigned uid, unsigned gid);
// A path a client named inside a directory (a run's output file): relative, '/'-separated, at
// most 4096 bytes, no NUL, no empty, "." or ".." component. InvalidArgument says what is wrong
// (the caller prefixes what the path is).
Status CheckRelativePath(std::string_view path);
// Opens `rel` (CheckRelativePath) under the directory `root` for reading without ever leaving it:
// a symbolic link on the way that resolves outside `root` is refused (openat2's RESOLVE_BENEATH;
// on a kernel without openat2, no symbolic link is followed at all), and so is anything but a
// regular file (a FIFO is not waited on). NotFound when it is not there; PermissionDenied for a
// path that leaves `root`; InvalidArgument for a directory, FIFO or device. The caller closes it.
Result<int> OpenBeneath(const std::string& root, std::string_view rel);

// The home of the machine's shared server (one run by root): other users' CLIs find it there.
inline constexpr const char* kMachineHome = "/var/lib/tau";
// $TAU_HOME, else ~/.tau; for root, kMachineHome unless ~/.tau already holds a store.
std::string TauHome();

}  // namespace tau
