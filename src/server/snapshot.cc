#include "server/snapshot.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "common/hash.h"
#include "common/strings.h"

namespace tau::server {

static Status CheckPath(const std::string& path) {
  if (path.empty() || path.size() > 4096)
    return InvalidArgument("code file with an empty or overlong path");
  if (path.find('\0') != std::string::npos) return InvalidArgument("code file path contains NUL");
  if (path.front() == '/')
    return InvalidArgument(fmt::format("code file path '{}' is absolute", path));
  for (const std::string& part : Split(path, '/')) {
    if (part.empty() || part == "." || part == "..")
      return InvalidArgument(fmt::format(
          "code file path '{}' is not a plain relative path (no '.', '..' or '//')", path));
  }
  return Status::Ok();
}

Result<Snapshot> StoreSnapshot(const std::string& root, std::vector<CodeFile> files) {
  if (files.size() > kMaxSnapshotFiles)
    return ResourceExhausted(fmt::format("the code directory has {} files; the limit is {}",
                                         files.size(), kMaxSnapshotFiles));
  size_t total = 0;
  for (const CodeFile& f : files) {
    TAU_RETURN_IF_ERROR(CheckPath(f.path));
    total += f.data.size();
  }
  if (total > kMaxSnapshotBytes)
    return ResourceExhausted(
        fmt::format("the code directory holds {} MiB; the limit is {} MiB (keep data out of the "
                    "code directory, "
                    "or list it in .tauignore)",
                    total >> 20, kMaxSnapshotBytes >> 20));
  std::sort(files.begin(), files.end(),
            [](const CodeFile& a, const CodeFile& b) { return a.path < b.path; });
  for (size_t i = 1; i < files.size(); ++i)
    if (files[i].path == files[i - 1].path)
      return InvalidArgument(fmt::format("code file '{}' appears twice", files[i].path));
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
  for (const CodeFile& f : files) {
    std::string path = tmp + "/" + f.path;
    TAU_RETURN_IF_ERROR(MakeDirs(std::filesystem::path(path).parent_path().string()));
    TAU_RETURN_IF_ERROR(WriteFileAtomic(path, f.data, (f.mode & 0111) ? 0755 : 0644));
  }
  TAU_RETURN_IF_ERROR(MakeDirs(tmp));
  if (::rename(tmp.c_str(), snap.dir.c_str()) != 0) {
    (void)RemoveTree(tmp);
    if (!PathExists(snap.dir)) return IoError("cannot store snapshot " + snap.dir, errno);
  }
  return snap;
}

Status CopySnapshot(const std::string& snapshot_dir, const std::string& work_dir) {
  std::error_code ec;
  std::filesystem::create_directories(work_dir, ec);
  if (ec) return Status(StatusCode::kIo, "cannot create " + work_dir + ": " + ec.message());
  std::filesystem::copy(
      snapshot_dir, work_dir,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing,
      ec);
  if (ec) return Status(StatusCode::kIo, "cannot copy the code snapshot: " + ec.message());
  return Status::Ok();
}

}  // namespace tau::server
