#include "cli/code.h"

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "common/limits.h"
#include "common/strings.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

// Never part of a code snapshot: version control, caches and virtualenvs.
const char* kAlwaysSkipped[] = {".git",         ".hg",          ".svn",
                                "__pycache__",  ".venv",        "venv",
                                "node_modules", ".tau",         ".ipynb_checkpoints",
                                ".mypy_cache",  ".pytest_cache"};

struct Walker {
  std::string root;
  std::vector<std::string> ignore;  // .tauignore patterns
  std::string canonical_root;       // `root` with its own links resolved, to compare link targets
  size_t max_bytes = 0;
  CodeWalk out;
};

bool Ignored(const Walker& w, const std::string& rel, const std::string& base) {
  for (const char* skip : kAlwaysSkipped)
    if (base == skip) return true;
  if (EndsWith(base, ".pyc")) return true;
  for (const std::string& p : w.ignore) {
    std::string pat = p;
    if (!pat.empty() && pat.back() == '/') pat.pop_back();
    if (fnmatch(pat.c_str(), rel.c_str(), FNM_PATHNAME) == 0 ||
        fnmatch(pat.c_str(), base.c_str(), 0) == 0)
      return true;
  }
  return false;
}

Status Walk(Walker& w, const std::string& rel_dir) {
  std::string dir = rel_dir.empty() ? w.root : w.root + "/" + rel_dir;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    names.push_back(entry.path().filename());
  if (ec) return Status(StatusCode::kIo, "cannot read " + dir + ": " + ec.message());
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
    if (Ignored(w, rel, name)) continue;
    // The snapshot goes to the server as JSON text, which holds UTF-8 only: a name in another
    // encoding would arrive as a different name.
    if (FindInvalidUtf8(name) != std::string::npos)
      return InvalidArgument(
          fmt::format("'{}' in the code directory {} has a name that is not UTF-8; rename it, or "
                      "list it in .tauignore",
                      Printable(rel), w.root));
    std::string path = w.root + "/" + rel;
    struct stat lst;
    if (::lstat(path.c_str(), &lst) != 0) continue;
    struct stat st = lst;
    if (S_ISLNK(lst.st_mode)) {
      // A link inside the code directory is stored as its target's content. A link that leaves it
      // is refused rather than skipped: following it would upload whatever it points at (a key, a
      // home directory), and skipping it quietly would give the run different code than the user
      // sees; either way the user decides.
      std::error_code lec;
      std::string target = fs::read_symlink(path, lec).string();
      fs::path resolved = fs::canonical(path, lec);
      if (lec == std::errc::too_many_symbolic_link_levels)
        return InvalidArgument(fmt::format(
            "'{}' in the code directory {} is a symbolic link loop (-> '{}'); remove it "
            "or list it in .tauignore",
            rel, w.root, target));
      if (lec) {
        // Dangling: nothing to upload and nothing leaks.
        w.out.warnings.push_back(fmt::format(
            "skipped '{}': a symbolic link to '{}', which does not exist", rel, target));
        continue;
      }
      std::string t = resolved.string(), r = w.canonical_root + "/";
      if (!StartsWith(t, r))
        return InvalidArgument(fmt::format(
            "'{}' in the code directory {} is a symbolic link to '{}', outside the code directory; "
            "tau does not follow it: copy what the run needs into the directory, or list '{}' in "
            ".tauignore",
            rel, w.root, target, rel));
      if (::stat(path.c_str(), &st) != 0) continue;
    }
    if (S_ISDIR(st.st_mode)) {
      if (S_ISLNK(lst.st_mode)) {
        // Not entered: a link to a directory inside can form a cycle or duplicate the tree.
        w.out.warnings.push_back(fmt::format("skipped '{}': a symbolic link to a directory ('{}')",
                                             rel, fs::read_symlink(path, ec).string()));
        continue;
      }
      TAU_RETURN_IF_ERROR(Walk(w, rel));
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    if (w.out.files.size() >= kMaxSnapshotFiles)
      return ResourceExhausted(fmt::format(
          "the code directory {} has more than {} files; list what the run does not need in "
          ".tauignore",
          w.root, kMaxSnapshotFiles));
    w.out.bytes += static_cast<size_t>(st.st_size);
    if (w.out.bytes > w.max_bytes)
      return ResourceExhausted(
          fmt::format("the code directory {} holds more than {} MiB; keep data sets and "
                      "checkpoints out of it or "
                      "list them in .tauignore (gitignore-style patterns)",
                      w.root, w.max_bytes >> 20));
    TAU_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
    w.out.files.push_back({rel, static_cast<int>(st.st_mode & 0777), std::move(data)});
  }
  return Status::Ok();
}

}  // namespace

Result<CodeWalk> CollectCode(const std::string& root, size_t max_bytes) {
  Walker w;
  w.root = root;
  w.max_bytes = max_bytes;
  std::error_code ec;
  w.canonical_root = fs::canonical(root, ec).string();
  if (ec)
    return Status(StatusCode::kIo, "cannot read the code directory " + root + ": " + ec.message());
  if (auto ignore = ReadFile(root + "/.tauignore"); ignore.ok()) {
    for (std::string line : Split(*ignore, '\n')) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') w.ignore.push_back(line);
    }
  }
  TAU_RETURN_IF_ERROR(Walk(w, ""));
  return std::move(w.out);
}

}  // namespace tau::cli
