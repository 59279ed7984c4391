#include "backend/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
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

bool IsSha256Hex(std::string_view text) {
  return text.size() == 64 && text.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

namespace {

// Creates a new file in a private temporary tree: O_EXCL and O_NOFOLLOW so that nothing already
// there (a link planted by anyone) is written through. Durable before anything names it.
Status WriteNewFile(const std::string& path, std::string_view data, int mode) {
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
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot fsync " + path, err);
  }
  ::close(fd);
  return Status::Ok();
}

std::string BlobPath(const std::string& blobs_root, const std::string& sha256) {
  return blobs_root + "/" + sha256;
}

int StoredMode(int mode) { return (mode & 0111) ? 0555 : 0444; }

void FsyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

Result<Manifest> CheckManifest(std::vector<CodeManifestEntry> files) {
  if (files.size() > kMaxSnapshotFiles)
    return ResourceExhausted(fmt::format("the code directory has {} files; the limit is {}",
                                         files.size(), kMaxSnapshotFiles));
  uint64_t total = 0;
  for (CodeManifestEntry& f : files) {
    TAU_RETURN_IF_ERROR(CheckCodePath(f.path));
    if (!IsSha256Hex(f.sha256))
      return InvalidArgument(
          fmt::format("code file '{}': sha256 must be 64 lowercase hex digits", Shown(f.path)));
    if (f.size < 0 || static_cast<uint64_t>(f.size) > kMaxSnapshotBytes)
      return ResourceExhausted(fmt::format(
          "code file '{}' holds {} bytes; the limit is {} MiB for all of a run's code (keep data "
          "sets and checkpoints out of the code directory, or list them in .tauignore)",
          Shown(f.path), f.size, kMaxSnapshotBytes >> 20));
    total += static_cast<uint64_t>(f.size);
    f.mode = (f.mode & 0111) ? 0755 : 0644;
  }
  if (total > kMaxSnapshotBytes)
    return ResourceExhausted(fmt::format(
        "the code files hold {} bytes; the limit is {} MiB (keep data sets and checkpoints out "
        "of the code directory, or list them in .tauignore)",
        total, kMaxSnapshotBytes >> 20));
  std::sort(files.begin(), files.end(),
            [](const CodeManifestEntry& a, const CodeManifestEntry& b) { return a.path < b.path; });
  for (size_t i = 1; i < files.size(); ++i)
    if (files[i].path == files[i - 1].path)
      return InvalidArgument(fmt::format("code file '{}' appears twice", Shown(files[i].path)));
  // "a" and "a/b" cannot both be stored: "a" would have to be a file and a directory.
  std::set<std::string> dirs;
  for (const CodeManifestEntry& f : files)
    for (size_t slash = f.path.find('/'); slash != std::string::npos;
         slash = f.path.find('/', slash + 1))
      dirs.insert(f.path.substr(0, slash));
  for (const CodeManifestEntry& f : files)
    if (dirs.count(f.path))
      return InvalidArgument(fmt::format(
          "code file '{}' is also the directory of other code files; send one or the other",
          Shown(f.path)));
  Manifest m;
  Sha256 tree;
  for (const CodeManifestEntry& f : files)
    // NUL separates the fields: it cannot occur in a path.
    tree.Update(f.path + std::string(1, '\0') + fmt::format("{:o}", f.mode) + std::string(1, '\0') +
                f.sha256 + "\n");
  m.digest = tree.HexDigest();
  m.files = std::move(files);
  return m;
}

Result<bool> StoreBlob(const std::string& blobs_root, const std::string& sha256,
                       std::string_view data) {
  if (!IsSha256Hex(sha256))
    return InvalidArgument(
        fmt::format("'{}' is not a blob name: a blob is named by the sha256 of its content (64 "
                    "lowercase hex digits)",
                    Shown(sha256)));
  if (data.size() > kMaxSnapshotBytes)
    return ResourceExhausted(
        fmt::format("a blob of {} bytes is over the limit of {} MiB for all of a run's code",
                    data.size(), kMaxSnapshotBytes >> 20));
  const std::string actual = Sha256Hex(data);
  if (actual != sha256)
    return InvalidArgument(fmt::format(
        "the blob sent as {} has sha256 {}: send each file's content under its own digest", sha256,
        actual));
  const std::string path = BlobPath(blobs_root, sha256);
  if (PathExists(path)) return false;  // content-addressed: already stored
  TAU_RETURN_IF_ERROR(MakeDirs(blobs_root));
  // A random name beside it: two uploads of one blob at once each write their own.
  const std::string tmp = path + ".tmp." + RandomHex(8);
  if (Status s = WriteNewFile(tmp, data, 0444); !s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // The directory is not fsynced: a blob whose name a crash lost is only missing, and the client
  // is asked for it again. A snapshot links the file itself, which is durable.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return IoError("cannot store blob " + path, err);
  }
  return true;
}

std::vector<std::string> MissingBlobs(const std::string& snapshots_root,
                                      const std::string& blobs_root, const Manifest& manifest) {
  std::set<std::string> missing;
  if (PathExists(snapshots_root + "/" + manifest.digest)) return {};
  for (const CodeManifestEntry& f : manifest.files)
    if (!missing.count(f.sha256) && !PathExists(BlobPath(blobs_root, f.sha256)))
      missing.insert(f.sha256);
  return {missing.begin(), missing.end()};
}

int RemoveUnreferencedBlobs(const std::string& blobs_root, int64_t min_age_s,
                            std::vector<std::string>* removed_names) {
  int removed = 0;
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(blobs_root, ec)) {
    struct stat st;
    if (::lstat(entry.path().c_str(), &st) != 0) continue;
    // One link: the blob store's own; no snapshot holds it. A temporary a killed upload left
    // behind is garbage too.
    const bool temporary = entry.path().filename().string().find(".tmp.") != std::string::npos;
    if (!S_ISREG(st.st_mode) || (st.st_nlink != 1 && !temporary)) continue;
    if (now - static_cast<int64_t>(st.st_mtime) < min_age_s) continue;
    if (::unlink(entry.path().c_str()) != 0) continue;
    ++removed;
    if (removed_names && !temporary) removed_names->push_back(entry.path().filename().string());
  }
  return removed;
}

namespace {

Snapshot SnapshotOf(const std::string& root, const Manifest& m) {
  Snapshot snap;
  snap.digest = m.digest;
  snap.dir = root + "/" + m.digest;
  snap.files = nlohmann::json::array();
  for (const CodeManifestEntry& f : m.files)
    snap.files.push_back(
        {{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}, {"mode", f.mode}});
  return snap;
}

Status AssembleTree(const std::string& tmp, const std::string& blobs_root, const Manifest& m) {
  TAU_RETURN_IF_ERROR(MakeDirs(tmp));
  std::set<std::string> dirs = {tmp};
  for (const CodeManifestEntry& f : m.files) {
    const std::string path = tmp + "/" + f.path;
    const std::string parent = std::filesystem::path(path).parent_path().string();
    if (dirs.insert(parent).second) TAU_RETURN_IF_ERROR(MakeDirs(parent));
    const std::string blob = BlobPath(blobs_root, f.sha256);
    struct stat st;
    if (::lstat(blob.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return FailedPrecondition(
          fmt::format("code file '{}': its content (blob {}) is not stored; upload it (PUT "
                      "/api/v1/blobs/{}) and submit again",
                      Shown(f.path), f.sha256, f.sha256));
    if (st.st_size != f.size)
      return FailedPrecondition(fmt::format(
          "code file '{}' is declared as {} bytes but its blob {} holds {}; send the manifest of "
          "the files as they are",
          Shown(f.path), f.size, f.sha256, static_cast<int64_t>(st.st_size)));
    const int mode = StoredMode(f.mode);
    // The blob's own inode where the modes agree (blobs are 0444); an executable file is a copy.
    if ((st.st_mode & 07777) == static_cast<mode_t>(mode) &&
        ::link(blob.c_str(), path.c_str()) == 0)
      continue;
    TAU_ASSIGN_OR_RETURN(std::string data, ReadFile(blob));
    TAU_RETURN_IF_ERROR(WriteNewFile(path, data, mode));
  }
  // The links are entries of these directories: durable before the snapshot is named.
  for (const std::string& dir : dirs) FsyncDirectory(dir);
  return Status::Ok();
}

}  // namespace

Result<Snapshot> StoreSnapshot(const std::string& root, const std::string& blobs_root,
                               const Manifest& manifest) {
  Snapshot snap = SnapshotOf(root, manifest);
  if (PathExists(snap.dir)) return snap;  // content-addressed: already stored
  std::string tmp = snap.dir + ".tmp." + RandomHex(8);
  if (Status s = AssembleTree(tmp, blobs_root, manifest); !s.ok()) {
    (void)RemoveTree(tmp);  // a failed store leaves nothing behind
    return s;
  }
  if (::rename(tmp.c_str(), snap.dir.c_str()) != 0) {
    int err = errno;
    (void)RemoveTree(tmp);
    // Another submission of the same code may have stored it first.
    if (!PathExists(snap.dir)) return IoError("cannot store snapshot " + snap.dir, err);
  }
  FsyncDirectory(root);
  return snap;
}

Result<Snapshot> StoreSnapshot(const std::string& root, const std::string& blobs_root,
                               std::vector<CodeFile> files) {
  if (files.size() > kMaxSnapshotFiles)
    return ResourceExhausted(fmt::format("the code directory has {} files; the limit is {}",
                                         files.size(), kMaxSnapshotFiles));
  std::vector<CodeManifestEntry> entries;
  entries.reserve(files.size());
  for (const CodeFile& f : files)
    entries.push_back({f.path, f.mode, static_cast<int64_t>(f.data.size()), Sha256Hex(f.data)});
  TAU_ASSIGN_OR_RETURN(Manifest manifest, CheckManifest(std::move(entries)));
  if (!PathExists(root + "/" + manifest.digest))
    for (const CodeFile& f : files) {
      auto stored = StoreBlob(blobs_root, Sha256Hex(f.data), f.data);
      if (!stored.ok()) return stored.status();
    }
  return StoreSnapshot(root, blobs_root, manifest);
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

}  // namespace tau::server
