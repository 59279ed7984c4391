#include "backend/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "common/files.h"
#include "common/hash.h"
#include "common/strings.h"

namespace tau::server {

namespace {

// A path as an error message can show it: control characters escaped, long ones cut, so that a
// hostile path cannot break the message (or the terminal that prints it).
std::string Shown(const std::string& path) {
  std::string out = Printable(std::string_view(path).substr(0, 120));
  if (path.size() > 120) out += fmt::format("... ({} bytes)", path.size());
  return out;
}

}  // namespace

Status CheckCodePath(const std::string& path) {
  if (path.empty()) return InvalidArgument("a code file has an empty path");
  if (path.size() > kMaxCodePathBytes)
    return InvalidArgument(fmt::format("code file path '{}' is {} bytes long; at most {} allowed",
                                       Shown(path), path.size(), kMaxCodePathBytes));
  if (path.find('\0') != std::string::npos)
    return InvalidArgument(fmt::format("code file path '{}' contains a NUL byte", Shown(path)));
  if (path.front() == '/')
    return InvalidArgument(fmt::format(
        "code file path '{}' is absolute; code paths are relative to the code directory",
        Shown(path)));
  for (const std::string& part : Split(path, '/')) {
    if (part.empty() || part == "." || part == "..")
      return InvalidArgument(fmt::format(
          "code file path '{}' is not a plain relative path (no '.', '..' or '//')", Shown(path)));
    // Past NAME_MAX the write would fail with an I/O error (a 500) instead of the client's 400.
    if (part.size() > kMaxCodePathPartBytes)
      return InvalidArgument(
          fmt::format("code file path '{}' has a part of {} bytes; at most {} "
                      "allowed",
                      Shown(path), part.size(), kMaxCodePathPartBytes));
  }
  return Status::Ok();
}

namespace {

// Creates a new file in the private temporary tree: O_EXCL and O_NOFOLLOW so that nothing already
// there (a link planted by anyone) is written through.
Status WriteNewFile(const std::string& path, const std::string& data, int mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return IoError("cannot create " + path, errno);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return IoError("cannot write " + path, err);
    }
    off += static_cast<size_t>(n);
  }
  // Durable before the run that names it is committed.
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot fsync " + path, err);
  }
  ::close(fd);
  return Status::Ok();
}

Status WriteTree(const std::string& tmp, const std::vector<CodeFile>& files) {
  TAU_RETURN_IF_ERROR(MakeDirs(tmp));
  for (const CodeFile& f : files) {
    std::string path = tmp + "/" + f.path;
    TAU_RETURN_IF_ERROR(MakeDirs(std::filesystem::path(path).parent_path().string()));
    TAU_RETURN_IF_ERROR(WriteNewFile(path, f.data, (f.mode & 0111) ? 0755 : 0644));
  }
  return Status::Ok();
}

}  // namespace

Result<Snapshot> StoreSnapshot(const std::string& root, std::vector<CodeFile> files) {
  if (files.size() > kMaxSnapshotFiles)
    return ResourceExhausted(fmt::format("the code directory has {} files; the limit is {}",
                                         files.size(), kMaxSnapshotFiles));
  size_t total = 0;
  for (const CodeFile& f : files) {
    TAU_RETURN_IF_ERROR(CheckCodePath(f.path));
    total += f.data.size();
  }
  if (total > kMaxSnapshotBytes)
    return ResourceExhausted(fmt::format(
        "the code files hold {} bytes; the limit is {} MiB (keep data sets and checkpoints out "
        "of the code directory, or list them in .tauignore)",
        total, kMaxSnapshotBytes >> 20));
  std::sort(files.begin(), files.end(),
            [](const CodeFile& a, const CodeFile& b) { return a.path < b.path; });
  for (size_t i = 1; i < files.size(); ++i)
    if (files[i].path == files[i - 1].path)
      return InvalidArgument(fmt::format("code file '{}' appears twice", Shown(files[i].path)));
  // "a" and "a/b" cannot both be stored: "a" would have to be a file and a directory.
  std::set<std::string> dirs;
  for (const CodeFile& f : files)
    for (size_t slash = f.path.find('/'); slash != std::string::npos;
         slash = f.path.find('/', slash + 1))
      dirs.insert(f.path.substr(0, slash));
  for (const CodeFile& f : files)
    if (dirs.count(f.path))
      return InvalidArgument(fmt::format(
          "code file '{}' is also the directory of other code files; send one or the other",
          Shown(f.path)));
  Snapshot snap;
  snap.files = nlohmann::json::array();
  Sha256 tree;
  for (const CodeFile& f : files) {
    std::string digest = Sha256Hex(f.data);
    int mode = (f.mode & 0111) ? 0755 : 0644;
    // NUL separates the fields: it cannot occur in a path.
    tree.Update(f.path + std::string(1, '\0') + fmt::format("{:o}", mode) + std::string(1, '\0') +
                digest + "\n");
    snap.files.push_back(
        {{"path", f.path}, {"size", f.data.size()}, {"sha256", digest}, {"mode", mode}});
  }
  snap.digest = tree.HexDigest();
  snap.dir = root + "/" + snap.digest;
  if (PathExists(snap.dir)) return snap;  // content-addressed: already stored
  std::string tmp = snap.dir + ".tmp." + RandomHex(8);
  if (Status s = WriteTree(tmp, files); !s.ok()) {
    (void)RemoveTree(tmp);  // a failed store leaves nothing behind
    return s;
  }
  if (::rename(tmp.c_str(), snap.dir.c_str()) != 0) {
    int err = errno;
    (void)RemoveTree(tmp);
    // Another submission of the same code may have stored it first.
    if (!PathExists(snap.dir)) return IoError("cannot store snapshot " + snap.dir, err);
  }
  return snap;
}

Result<std::vector<CodeFile>> ReadSnapshot(const std::string& snapshot_dir) {
  std::vector<CodeFile> files;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(snapshot_dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    // StoreSnapshot writes only directories and regular files; anything else is not the run's.
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    CodeFile f;
    f.path = std::filesystem::relative(it->path(), snapshot_dir, ec).generic_string();
    f.mode = (it->status(ec).permissions() & std::filesystem::perms::owner_exec) !=
                     std::filesystem::perms::none
                 ? 0755
                 : 0644;
    TAU_ASSIGN_OR_RETURN(f.data, ReadFile(it->path().string()));
    files.push_back(std::move(f));
  }
  if (ec) return Status(StatusCode::kIo, "cannot read the code snapshot: " + ec.message());
  std::sort(files.begin(), files.end(),
            [](const CodeFile& a, const CodeFile& b) { return a.path < b.path; });
  return files;
}

Status CopySnapshot(const std::string& snapshot_dir, const std::string& work_dir) {
  // Copied beside it and renamed into place: a server killed half-way leaves no work directory
  // that looks complete (the next try starts the copy again), only a partial one it removes.
  const std::string partial = work_dir + ".partial";
  std::error_code ec;
  std::filesystem::remove_all(partial, ec);
  if (ec) return Status(StatusCode::kIo, "cannot remove " + partial + ": " + ec.message());
  std::filesystem::create_directories(partial, ec);
  if (ec) return Status(StatusCode::kIo, "cannot create " + partial + ": " + ec.message());
  std::filesystem::copy(
      snapshot_dir, partial,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing,
      ec);
  if (ec) return Status(StatusCode::kIo, "cannot copy the code snapshot: " + ec.message());
  std::filesystem::rename(partial, work_dir, ec);
  if (ec) return Status(StatusCode::kIo, "cannot create " + work_dir + ": " + ec.message());
  return Status::Ok();
}

}  // namespace tau::server
