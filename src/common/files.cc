#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace tau {

Status ReadFileChunks(const std::string& path, const std::function<void(std::string_view)>& chunk) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no such file: " + path);
    return IoError("cannot open " + path, errno);
  }
  return ReadChunksAndClose(fd, path, chunk);
}

Status ReadChunksAndClose(int fd, const std::string& path,
                          const std::function<void(std::string_view)>& chunk) {
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return IoError("cannot read " + path, err);
    }
    if (n == 0) break;
    chunk(std::string_view(buf, static_cast<size_t>(n)));
  }
  ::close(fd);
  return Status::Ok();
}

Result<std::string> ReadFile(const std::string& path) {
  std::string out;
  TAU_RETURN_IF_ERROR(ReadFileChunks(path, [&](std::string_view c) { out.append(c); }));
  return out;
}

Result<std::string> ReadFileAtMost(const std::string& path, size_t max_bytes,
                                   const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open " + path, errno);
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return IoError("cannot read " + path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      return ResourceExhausted(fmt::format("{} is over {} bytes; {} may be at most {} bytes", path,
                                           max_bytes, what, max_bytes));
    }
  }
  ::close(fd);
  return out;
}

static Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open directory " + dir, errno);
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, std::string_view content, int mode,
                       Durability durability) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return IoError("cannot create " + tmp, errno);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return IoError("cannot write " + tmp, err);
    }
    off += static_cast<size_t>(n);
  }
  if (durability == Durability::kSynced && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return IoError("cannot fsync " + tmp, err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return IoError("cannot rename " + tmp + " to " + path, err);
  }
  if (durability != Durability::kSynced) return Status::Ok();
  std::string dir = std::filesystem::path(path).parent_path().string();
  return FsyncDir(dir.empty() ? "." : dir);
}

Status WriteFileIfChanged(const std::string& path, std::string_view content, int mode) {
  if (auto current = ReadFile(path); current.ok() && *current == content) {
    if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0)
      return IoError("cannot chmod " + path, errno);
    return Status::Ok();
  }
  return WriteFileAtomic(path, content, mode);
}

void RemoveAbandonedTemporaries(const std::string& path) {
  std::filesystem::path target(path);
  std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(pid_text.c_str(), nullptr, 10);
    if (pid <= 0 || pid > INT32_MAX) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(entry.path().c_str());
  }
}

Status MakeDirs(const std::string& path, int mode) {
  if (path.empty()) return InvalidArgument("cannot create a directory with an empty name");
  // Each missing component in turn, so that none is left with the umask's mode (mkdir -p would
  // make the ones in between 0755, readable by everyone).
  size_t at = path.find_first_not_of('/');
  while (at != std::string::npos) {
    size_t end = path.find('/', at);
    std::string dir = path.substr(0, end);
    if (::mkdir(dir.c_str(), static_cast<mode_t>(mode)) == 0) {
      ::chmod(dir.c_str(), static_cast<mode_t>(mode));
    } else if (errno != EEXIST) {
      return IoError("cannot create directory " + dir, errno);
    } else if (struct stat st; ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Status(StatusCode::kIo, "cannot create directory " + path + ": " + dir +
                                         " exists and is not a directory");
    }
    at = end == std::string::npos ? end : path.find_first_not_of('/', end);
  }
  ::chmod(path.c_str(), static_cast<mode_t>(mode));
  return Status::Ok();
}

Status CheckRelativePath(std::string_view path) {
  if (path.empty()) return InvalidArgument("the path is empty");
  if (path.size() > 4096) return InvalidArgument("the path is longer than 4096 bytes");
  if (path.find('\0') != std::string_view::npos)
    return InvalidArgument("the path holds a NUL byte");
  if (path.front() == '/')
    return InvalidArgument("the path is absolute: name it relative to its directory");
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part == "..") return InvalidArgument("the path leaves its directory ('..')");
    if (part.empty() || part == ".")
      return InvalidArgument("the path has an empty or '.' component");
    start = end + 1;
  }
  return Status::Ok();
}

namespace {

// Without openat2 (kernels before 5.6, or a seccomp filter that refuses it): one component at a
// time, following no symbolic link at all.
Result<int> OpenNoLinks(int dir, const std::string& rel, const std::string& shown) {
  int at = ::dup(dir);
  if (at < 0) return IoError("cannot duplicate a descriptor", errno);
  size_t start = 0;
  while (true) {
    size_t end = rel.find('/', start);
    const bool last = end == std::string::npos;
    std::string part = rel.substr(start, last ? std::string::npos : end - start);
    int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (last ? O_NONBLOCK : O_DIRECTORY);
    int next = ::openat(at, part.c_str(), flags);
    const int err = errno;
    ::close(at);
    if (next < 0) {
      if (err == ENOENT) return NotFound(shown + ": no such file");
      if (err == ELOOP || err == ENOTDIR)
        return PermissionDenied(shown +
                                ": is or goes through a symbolic link, which is not "
                                "followed here");
      return IoError("cannot open " + shown, err);
    }
    if (last) return next;
    at = next;
    start = end + 1;
  }
}

}  // namespace

Result<int> OpenBeneath(const std::string& root, std::string_view rel) {
  TAU_RETURN_IF_ERROR(CheckRelativePath(rel));
  const std::string shown(rel);
  int dir = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    if (errno == ENOENT) return NotFound(shown + ": no such file (the directory is not there)");
    return IoError("cannot open " + root, errno);
  }
  struct open_how how;
  std::memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;  // a FIFO must not block the open
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, dir, shown.c_str(), &how, sizeof how);
  int err = errno;
  Result<int> opened = static_cast<int>(fd);
  if (fd < 0 && (err == ENOSYS || err == EPERM)) {
    opened = OpenNoLinks(dir, shown, shown);
  } else if (fd < 0) {
    if (err == ENOENT)
      opened = NotFound(shown + ": no such file");
    else if (err == EXDEV)
      opened = PermissionDenied(shown + ": leaves its directory through a symbolic link");
    else if (err == ELOOP)
      opened = PermissionDenied(shown + ": too many symbolic links, or a link tau does not follow");
    else
      opened = IoError("cannot open " + shown, err);
  }
  ::close(dir);
  if (!opened.ok()) return opened;
  struct stat st {};
  if (::fstat(*opened, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(*opened);
    return InvalidArgument(
        shown + (S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": is not a regular file"));
  }
  // Reads of a regular file never block; clear the flag all the same for the caller's reads.
  ::fcntl(*opened, F_SETFL, ::fcntl(*opened, F_GETFL) & ~O_NONBLOCK);
  return opened;
}

namespace {

// Closes a descriptor when it goes out of scope.
struct ClosesFd {
  int fd;
  ~ClosesFd() {
    if (fd >= 0) ::close(fd);
  }
};

// The names in the directory `fd` (at most `*budget` of them, which it counts down), sorted; `fd`
// stays open (the listing reads a duplicate).
Result<std::vector<std::string>> NamesIn(int fd, const std::string& shown, size_t* budget) {
  int listing = ::dup(fd);
  if (listing < 0) return IoError("cannot list " + shown, errno);
  DIR* d = ::fdopendir(listing);
  if (d == nullptr) {
    const int err = errno;
    ::close(listing);
    return IoError("cannot list " + shown, err);
  }
  ::rewinddir(d);
  std::vector<std::string> names;
  errno = 0;
  while (*budget > 0) {
    const dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
      --*budget;
    }
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return IoError("cannot list " + shown, err);
  std::sort(names.begin(), names.end());
  return names;
}

// Removes what the directory `dir_fd` holds, through descriptors only: a subdirectory is opened
// without following a link, so one swapped for a link meanwhile is removed as the link.
Status RemoveContents(int dir_fd, const std::string& shown, int depth) {
  if (depth > 4 * kMaxWalkDepth)
    return Status(StatusCode::kIo, "cannot remove " + shown + ": too deep");
  size_t all = SIZE_MAX;
  TAU_ASSIGN_OR_RETURN(std::vector<std::string> names, NamesIn(dir_fd, shown, &all));
  for (const std::string& name : names) {
    if (::unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM)
      return IoError("cannot remove " + shown + "/" + name, errno);
    int sub = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      if (errno == ENOENT) continue;
      return IoError("cannot open " + shown + "/" + name, errno);
    }
    Status emptied = RemoveContents(sub, shown + "/" + name, depth + 1);
    ::close(sub);
    TAU_RETURN_IF_ERROR(emptied);
    if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
      return IoError("cannot remove " + shown + "/" + name, errno);
  }
  return Status::Ok();
}

}  // namespace

Status RemoveTree(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::Ok();
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    return IoError("cannot remove " + path, errno);
  }
  Status emptied = RemoveContents(fd, path, 0);
  ::close(fd);
  TAU_RETURN_IF_ERROR(emptied);
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return IoError("cannot remove " + path, errno);
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string TauHome() {
  if (const char* home = std::getenv("TAU_HOME"); home && *home) return home;
  const char* user_home = std::getenv("HOME");
  std::string own = std::string(user_home && *user_home ? user_home : "/tmp") + "/.tau";
  // Root serves the machine: its home must be reachable by the users runs run as, which root's
  // own home directory (mode 0700) is not. A home root already has keeps being used.
  if (::geteuid() == 0 && !PathExists(own + "/tau.db")) return kMachineHome;
  return own;
}

namespace {

// Whether `dir` is on a file system that never clones (ext2/3/4, tmpfs): there CloneFile's probe
// would create a file and remove it for nothing, once per copy, and on an ext4 without a journal
// each inode removed slows the allocation of new ones for minutes after (the allocator skips
// recently deleted inodes), which every run's start pays for. Others are probed.
bool NeverClones(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return false;
  return fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == TMPFS_MAGIC;
}

// A reflink of `src` at `dst` (a new file of `mode`): OK, or false in `*supported` when this file
// system cannot clone (nothing is left at `dst` then).
Status CloneFile(const std::string& src, const std::string& dst, int mode, bool* supported) {
  int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (in < 0) return IoError("cannot open " + src, errno);
  int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (out < 0) {
    int err = errno;
    ::close(in);
    return IoError("cannot create " + dst, err);
  }
  int rc = ::ioctl(out, FICLONE, in);
  int err = errno;
  ::close(in);
  ::close(out);
  if (rc == 0) return Status::Ok();
  ::unlink(dst.c_str());
  if (err == EOPNOTSUPP || err == ENOTTY || err == EXDEV || err == EINVAL || err == EPERM) {
    *supported = false;
    return Status::Ok();
  }
  return IoError("cannot clone " + src, err);
}

}  // namespace

Status CloneTree(const std::string& from_dir, const std::string& to, TreeFiles how) {
  // Made beside it and renamed into place: a process killed half-way leaves no copy that looks
  // complete (the next try starts again), only a partial one it removes.
  const std::string partial = to + ".partial";
  TAU_RETURN_IF_ERROR(RemoveTree(partial));
  std::error_code ec;
  std::filesystem::create_directories(partial, ec);
  if (ec) return Status(StatusCode::kIo, "cannot create " + partial + ": " + ec.message());
  bool clones = !NeverClones(partial);  // until the file system says it has none
  std::string from = from_dir;
  while (from.size() > 1 && from.back() == '/') from.pop_back();
  std::filesystem::recursive_directory_iterator it(from, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string src = it->path().string();
    // The entry's path below `from`, by its prefix: filesystem::relative resolves every
    // component with readlink, which costs more than the link itself.
    const std::string dst = partial + src.substr(from.size());
    struct stat st;
    if (::lstat(src.c_str(), &st) != 0) return IoError("cannot read " + src, errno);
    if (S_ISDIR(st.st_mode)) {
      if (::mkdir(dst.c_str(), st.st_mode & 07777) != 0)
        return IoError("cannot create " + dst, errno);
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;  // nothing else is copied
    // The copy's file is writable, as the file the source was made from was.
    const int writable = (st.st_mode & 0111) ? 0755 : 0644;
    if (clones) {
      TAU_RETURN_IF_ERROR(CloneFile(src, dst, writable, &clones));
      if (clones) continue;
    }
    // A shared inode only while nobody can write it: the copy's user could otherwise change the
    // source under every other copy.
    if (how == TreeFiles::kLinkReadOnly && (st.st_mode & 0222) == 0 &&
        ::link(src.c_str(), dst.c_str()) == 0)
      continue;
    std::filesystem::copy_file(src, dst, ec);
    if (ec) return Status(StatusCode::kIo, "cannot copy " + src + ": " + ec.message());
    if (::chmod(dst.c_str(), writable) != 0) return IoError("chmod " + dst, errno);
  }
  if (ec) return Status(StatusCode::kIo, "cannot copy " + from + ": " + ec.message());
  std::filesystem::rename(partial, to, ec);
  if (ec) return Status(StatusCode::kIo, "cannot create " + to + ": " + ec.message());
  return Status::Ok();
}

namespace {

Status WalkBelow(int dir_fd, const std::string& rel, const std::string& shown, int depth,
                 const std::function<Result<bool>(const TreeEntry&)>& visit, size_t* budget) {
  if (*budget == 0) return Status::Ok();
  TAU_ASSIGN_OR_RETURN(std::vector<std::string> names, NamesIn(dir_fd, shown, budget));
  for (std::string& name : names) {
    TreeEntry e;
    e.rel = rel.empty() ? name : rel + "/" + name;
    e.dir_fd = dir_fd;
    if (::fstatat(dir_fd, name.c_str(), &e.st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed while we looked (a rotated checkpoint)
      return IoError("cannot stat " + shown + "/" + name, errno);
    }
    e.name = std::move(name);
    TAU_ASSIGN_OR_RETURN(bool enter, visit(e));
    if (!enter || !S_ISDIR(e.st.st_mode) || depth + 1 >= kMaxWalkDepth) continue;
    int sub = ::openat(dir_fd, e.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      // Gone, or swapped for a link or a file since its status was read: not entered.
      if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) continue;
      return IoError("cannot open " + shown + "/" + e.name, errno);
    }
    ClosesFd closes{sub};
    TAU_RETURN_IF_ERROR(WalkBelow(sub, e.rel, shown + "/" + e.name, depth + 1, visit, budget));
  }
  return Status::Ok();
}

// Gives the entry the descriptor `fd` refers to (an O_PATH one: a link itself) to uid:gid when
// tau made it (owned by this process's user, one link).
Status ChownIfOurs(int fd, const std::string& shown, unsigned uid, unsigned gid) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + shown, errno);
  if (st.st_uid != ::geteuid() || (st.st_uid == uid && st.st_gid == gid)) return Status::Ok();
  if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) return Status::Ok();
  if (::fchownat(fd, "", uid, gid, AT_EMPTY_PATH) != 0) return IoError("chown " + shown, errno);
  return Status::Ok();
}

}  // namespace

Status WalkTree(const std::string& root, const std::function<Result<bool>(const TreeEntry&)>& visit,
                size_t max_entries, bool* truncated) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open " + root, errno);
  ClosesFd closes{fd};
  size_t budget = max_entries;
  Status walked = WalkBelow(fd, "", root, 0, visit, &budget);
  if (truncated) *truncated = budget == 0;
  return walked;
}

Result<int> OpenRegularAt(int dir_fd, const std::string& name, const std::string& shown) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no such file: " + shown);
    if (errno == ELOOP)
      return InvalidArgument(shown + " is a symbolic link; tau reads only regular files there");
    return IoError("cannot open " + shown, errno);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(shown + " is not a regular file; tau reads only regular files there");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Status ChownTree(const std::string& root, unsigned uid, unsigned gid) {
  {
    int top = ::open(root.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (top < 0) return IoError("cannot open " + root, errno);
    ClosesFd closes{top};
    TAU_RETURN_IF_ERROR(ChownIfOurs(top, root, uid, gid));
  }
  return WalkTree(root, [&](const TreeEntry& e) -> Result<bool> {
    // The entry itself, pinned: what is chowned is what was looked at.
    int fd = ::openat(e.dir_fd, e.name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return false;
      return IoError("cannot open " + root + "/" + e.rel, errno);
    }
    ClosesFd closes{fd};
    TAU_RETURN_IF_ERROR(ChownIfOurs(fd, root + "/" + e.rel, uid, gid));
    return true;
  });
}

}  // namespace tau
