// Small text helpers of the evidence module (internal.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>

#include <fmt/format.h>

#include "common/files.h"
#include "common/strings.h"
#include "evidence/internal.h"

namespace tau::evidence::internal {

ClosesFd::~ClosesFd() {
  if (fd >= 0) ::close(fd);
}

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"') {
      out->append("\\\"");
    } else if (c == '\\') {
      out->append("\\\\");
    } else if (u < 0x20) {
      switch (c) {
        case '\n':
          out->append("\\n");
          break;
        case '\t':
          out->append("\\t");
          break;
        case '\r':
          out->append("\\r");
          break;
        default:
          out->append(fmt::format("\\u{:04x}", u));
      }
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

void AppendJsonDouble(std::string* out, double v) {
  if (std::isnan(v)) {
    out->append("\"NaN\"");
  } else if (std::isinf(v)) {
    out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  } else {
    // fmt's "{}" is the shortest text that reads back to the same double, and always valid JSON
    // for finite values ("1e+20", "0.1", "3").
    fmt::format_to(std::back_inserter(*out), "{}", v);
  }
}

bool ParseNonFiniteWord(std::string_view s, double* out) {
  std::string w;
  for (char c : s) w.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  bool negative = false;
  std::string_view v = w;
  if (!v.empty() && (v[0] == '-' || v[0] == '+')) {
    negative = v[0] == '-';
    v.remove_prefix(1);
  }
  if (v == "nan") {
    *out = std::nan("");
    return true;
  }
  if (v == "inf" || v == "infinity") {
    *out = negative ? -HUGE_VAL : HUGE_VAL;
    return true;
  }
  return false;
}

Result<int> OpenRunFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no such file: " + path);
    if (errno == ELOOP)
      return InvalidArgument(
          fmt::format("{} is a symbolic link; tau reads only regular files there", path));
    return IoError("cannot open " + path, errno);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot stat " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(
        fmt::format("{} is not a regular file; tau reads only regular files there", path));
  }
  // Reads of a regular file never block; clear the flag anyway so that they behave as usual.
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Status ReadRunFileChunks(const std::string& path,
                         const std::function<void(std::string_view)>& chunk) {
  TAU_ASSIGN_OR_RETURN(int fd, OpenRunFile(path));
  return ReadChunksAndClose(fd, path, chunk);
}

bool IsTemporaryName(std::string_view name) {
  return StartsWith(name, ".") || EndsWith(name, ".tmp") || EndsWith(name, ".partial") ||
         EndsWith(name, ".incomplete");
}

bool SafeEntryName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '/' || name.back() == '/') return false;
  if (name.find('\\') != std::string_view::npos) return false;
  if (name.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace tau::evidence::internal
