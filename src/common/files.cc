#include "common/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Status(StatusCode::kIo, "cannot remove " + path + ": " + ec.message());
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

}  // namespace tau
