#include "cli/code.h"

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "common/limits.h"
#include "common/strings.h"
#include "runtime/runtime.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

// Never part of a code snapshot: version control, caches and virtualenvs.
const char* kAlwaysSkipped[] = {".git",         ".hg",          ".svn",
                                "__pycache__",  ".venv",        "venv",
                                "node_modules", ".tau",         ".ipynb_checkpoints",
                                ".mypy_cache",  ".pytest_cache"};

// One line of .tauignore, with gitignore's rules: `!` re-includes what an earlier line excluded, a
// trailing `/` matches directories only, a pattern with a `/` before its end is anchored at the
// code directory (a leading `/` only anchors), any other matches a name at any depth, and `**`
// stands for any number of directories.
struct IgnoreRule {
  std::vector<std::string> segments;  // the pattern split at '/'
  bool negate = false, dir_only = false, anchored = false;
};

std::vector<IgnoreRule> ParseIgnore(const std::string& text) {
  std::vector<IgnoreRule> rules;
  for (std::string line : Split(text, '\n')) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    IgnoreRule rule;
    if (line[0] == '!') {
      rule.negate = true;
      line.erase(0, 1);
    } else if (line[0] == '\\' && line.size() > 1 && (line[1] == '!' || line[1] == '#')) {
      line.erase(0, 1);
    }
    while (!line.empty() && line.back() == '/') {
      rule.dir_only = true;
      line.pop_back();
    }
    if (line.empty()) continue;
    rule.anchored = line.find('/') != std::string::npos;
    while (!line.empty() && line[0] == '/') line.erase(0, 1);
    rule.segments = Split(line, '/');
    rules.push_back(std::move(rule));
  }
  return rules;
}

bool SegmentsMatch(const std::vector<std::string>& pattern, size_t i,
                   const std::vector<std::string>& path, size_t j) {
  if (i == pattern.size()) return j == path.size();
  if (pattern[i] == "**") {
    for (size_t k = j; k <= path.size(); ++k)
      if (SegmentsMatch(pattern, i + 1, path, k)) return true;
    return false;
  }
  if (j == path.size() || fnmatch(pattern[i].c_str(), path[j].c_str(), 0) != 0) return false;
  return SegmentsMatch(pattern, i + 1, path, j + 1);
}

bool RuleMatches(const IgnoreRule& rule, const std::string& rel, const std::string& base,
                 bool is_dir) {
  if (rule.dir_only && !is_dir) return false;
  if (!rule.anchored) return fnmatch(rule.segments[0].c_str(), base.c_str(), 0) == 0;
  return SegmentsMatch(rule.segments, 0, Split(rel, '/'), 0);
}

Status TooBig(const std::string& root, size_t max_bytes) {
  return ResourceExhausted(
      fmt::format("the code directory {} holds more than {} MiB; keep data sets and checkpoints "
                  "out of it or list them in .tauignore (gitignore-style patterns)",
                  root, max_bytes >> 20));
}

struct Walker {
  std::string root;
  std::vector<IgnoreRule> ignore;  // .tauignore
  std::string canonical_root;      // `root` with its own links resolved, to compare link targets
  size_t max_bytes = 0;
  CodeWalk out;
};

bool Ignored(const Walker& w, const std::string& rel, const std::string& base, bool is_dir) {
  for (const char* skip : kAlwaysSkipped)
    if (base == skip) return true;
  if (EndsWith(base, ".pyc")) return true;
  bool ignored = false;  // the last line that matches decides
  for (const IgnoreRule& rule : w.ignore)
    if (RuleMatches(rule, rel, base, is_dir)) ignored = !rule.negate;
  return ignored;
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
    std::string path = w.root + "/" + rel;
    struct stat lst;
    if (::lstat(path.c_str(), &lst) != 0) continue;
    if (Ignored(w, rel, name, S_ISDIR(lst.st_mode))) continue;
    // The snapshot goes to the server as JSON text, which holds UTF-8 only: a name in another
    // encoding would arrive as a different name.
    if (FindInvalidUtf8(name) != std::string::npos)
      return InvalidArgument(
          fmt::format("'{}' in the code directory {} has a name that is not UTF-8; rename it, or "
                      "list it in .tauignore",
                      Printable(rel), w.root));
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
    if (!S_ISREG(st.st_mode)) {
      // A FIFO, socket or device: reading it could block or never end; it is no code.
      w.out.warnings.push_back(fmt::format("skipped '{}': a {}, not a regular file", rel,
                                           S_ISFIFO(st.st_mode)   ? "FIFO"
                                           : S_ISSOCK(st.st_mode) ? "socket"
                                                                  : "device"));
      continue;
    }
    if (w.out.files.size() >= kMaxSnapshotFiles)
      return ResourceExhausted(fmt::format(
          "the code directory {} has more than {} files; list what the run does not need in "
          ".tauignore",
          w.root, kMaxSnapshotFiles));
    w.out.bytes += static_cast<size_t>(st.st_size);
    if (w.out.bytes > w.max_bytes) return TooBig(w.root, w.max_bytes);
    w.out.files.push_back({rel, static_cast<int>(st.st_mode & 0777), ""});
    w.out.sizes.push_back(static_cast<size_t>(st.st_size));
  }
  return Status::Ok();
}

}  // namespace

std::string FindRepositoryRoot(const std::string& dir) {
  std::error_code ec;
  fs::path at = fs::weakly_canonical(fs::absolute(dir.empty() ? "." : dir), ec);
  if (ec) return "";
  while (true) {
    if (fs::exists(at / ".git", ec)) return at.string();
    if (at == at.root_path() || at.parent_path() == at) return "";
    at = at.parent_path();
  }
}

Result<std::string> ResolveSpecTarget(const std::string& target, const std::string& code_dir) {
  std::error_code ec;
  // A directory means the spec in it, as `tau run` with no file means ./tau.yaml.
  if (fs::is_directory(target, ec)) {
    for (const char* name : {"tau.yaml", "tau.yml"})
      if (fs::is_regular_file(fs::path(target) / name, ec))
        return (fs::path(target) / name).string();
    return NotFound(
        fmt::format("'{}' is a directory with no tau.yaml in it: name the spec's file", target));
  }
  if (fs::exists(target, ec) || target.find('/') != std::string::npos ||
      EndsWith(target, ".yaml") || EndsWith(target, ".yml"))
    return target;
  std::string root = code_dir;
  if (root.empty()) {
    root = FindRepositoryRoot(".");
    if (root.empty())
      return NotFound(fmt::format(
          "no file '{}' here, and no repository to look for tau/{}.yaml in (no folder from {} up "
          "holds .git); name the spec's file, or give --code-dir DIR",
          target, target, fs::current_path(ec).string()));
  }
  const fs::path yaml = fs::path(root) / "tau" / (target + ".yaml");
  const fs::path yml = fs::path(root) / "tau" / (target + ".yml");
  const bool has_yaml = fs::is_regular_file(yaml, ec), has_yml = fs::is_regular_file(yml, ec);
  // Named from here, as the user would name it (diagnostics print it).
  auto shown = [&](const fs::path& p) {
    fs::path rel = fs::absolute(p, ec).lexically_proximate(fs::current_path(ec));
    return (rel.empty() ? p : rel).string();
  };
  if (has_yaml && has_yml)
    return InvalidArgument(
        fmt::format("both {} and {} exist; name the one to run", shown(yaml), shown(yml)));
  if (!has_yaml && !has_yml)
    return NotFound(fmt::format("no file '{}' here, and neither {} nor {} exists{}", target,
                                shown(yaml), shown(yml),
                                code_dir.empty() ? " (in the repository root)" : ""));
  return shown(has_yaml ? yaml : yml);
}

namespace {

// How many folders up a relative entrypoint reaches once "a/../" pairs cancel; 0 for one that
// stays in the spec's folder, an absolute path or a command.
int LevelsUp(const std::string& entry) {
  if (entry.empty() || entry[0] == '/' || entry.find(' ') != std::string::npos) return 0;
  int up = 0;
  for (const fs::path& part : fs::path(entry).lexically_normal()) {
    if (part != "..") break;
    ++up;
  }
  return up;
}

bool Inside(const fs::path& path, const fs::path& root) {
  fs::path rel = path.lexically_relative(root);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

Result<CodeRoot> FindCodeRoot(const std::string& spec_file, const spec::RunSpec& spec,
                              const std::string& code_dir) {
  fs::path spec_dir = fs::path(spec_file).parent_path();
  if (spec_dir.empty()) spec_dir = ".";
  CodeRoot out{spec_dir.string(), ""};
  const std::string& entry = spec.entrypoint;
  const int up = LevelsUp(entry);
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(fs::absolute(spec_dir), ec);
  if (ec) return Status(StatusCode::kIo, "cannot read " + spec_dir.string() + ": " + ec.message());
  // TauGrid's repository layout: the code is the repository (or --code-dir), run from its root.
  fs::path repo;
  std::string what;
  if (!code_dir.empty()) {
    if (!fs::is_directory(code_dir, ec))
      return InvalidArgument(fmt::format("--code-dir {}: not a directory", code_dir));
    repo = fs::weakly_canonical(fs::absolute(code_dir), ec);
    what = "--code-dir " + code_dir;
  } else if (dir.filename() == "tau" && fs::exists(dir.parent_path() / ".git", ec)) {
    repo = dir.parent_path();
    what = "the repository root " + repo.string();
  }
  if (!repo.empty()) {
    out.root = repo.string();
    if (up == 0) return out;
    // ../train.py from the spec's folder, as before; the run starts in that folder.
    fs::path reached = dir;
    for (int i = 0; i < up && reached != reached.root_path(); ++i) reached = reached.parent_path();
    if (!Inside(dir, repo) || !(reached == repo || Inside(reached, repo)))
      return InvalidArgument(fmt::format(
          "run.entrypoint: '{}' leaves {}; name it relative to {}", entry, what,
          code_dir.empty() ? "the repository root (tau runs it from there)" : "that folder"));
    out.subdir = dir.lexically_relative(repo).string();
    return out;
  }
  if (up == 0) return out;
  fs::path root = dir;
  for (int i = 0; i < up; ++i) {
    if (root == root.root_path())
      return InvalidArgument(fmt::format(
          "run.entrypoint: '{}' leaves the file system's root; name it relative to the spec's "
          "folder",
          entry));
    root = root.parent_path();
  }
  out.root = root.string();
  out.subdir = dir.lexically_relative(root).string();
  return out;
}

namespace {

// Paths, modes and sizes from lstat and stat: the limits are checked before any file is read.
Result<CodeWalk> WalkCode(const std::string& root, size_t max_bytes,
                          const std::vector<std::string>& excludes) {
  Walker w;
  w.root = root;
  w.max_bytes = max_bytes;
  std::error_code ec;
  w.canonical_root = fs::canonical(root, ec).string();
  if (ec)
    return Status(StatusCode::kIo, "cannot read the code directory " + root + ": " + ec.message());
  if (auto ignore = ReadFile(root + "/.tauignore"); ignore.ok()) w.ignore = ParseIgnore(*ignore);
  for (IgnoreRule& rule : ParseIgnore(Join(excludes, "\n"))) w.ignore.push_back(std::move(rule));
  TAU_RETURN_IF_ERROR(Walk(w, ""));
  return std::move(w.out);
}

}  // namespace

Result<CodeWalk> CollectCode(const std::string& root, size_t max_bytes,
                             const std::vector<std::string>& excludes) {
  TAU_ASSIGN_OR_RETURN(CodeWalk walk, WalkCode(root, max_bytes, excludes));
  size_t total = 0;
  for (CodeFile& f : walk.files) {
    // A file that grew since the walk is held to what is left of the limit.
    auto data = ReadFileAtMost(root + "/" + f.path, max_bytes - total, "the code directory");
    if (!data.ok() && data.status().code() == StatusCode::kResourceExhausted)
      return TooBig(root, max_bytes);
    if (!data.ok()) return data.status();
    total += data->size();
    f.data = std::move(*data);
  }
  walk.bytes = total;
  return walk;
}

Result<CodeWalk> ListCode(const std::string& root, const std::vector<std::string>& excludes) {
  return WalkCode(root, kMaxSnapshotBytes, excludes);
}

std::optional<spec::Diagnostic> CannotStartWarning(const std::string& spec_file,
                                                   const spec::ParseOutcome& parsed,
                                                   int gpus_per_worker) {
  if (!parsed.ok()) return std::nullopt;
  auto root = FindCodeRoot(spec_file, *parsed.spec);
  if (!root.ok()) return std::nullopt;
  auto code = ListCode(root->root, parsed.spec->code_excludes);
  if (!code.ok()) return std::nullopt;
  std::vector<runtime::ShippedFile> files;
  for (const CodeFile& f : code->files) files.push_back({f.path, f.mode});
  const char* path = std::getenv("PATH");
  Status s =
      runtime::CheckStartable(*parsed.spec, gpus_per_worker, root->subdir, files, path ? path : "");
  if (s.ok()) return std::nullopt;
  // The message starts with the field it is about: the warning is put at that field.
  const std::string& message = s.message();
  spec::Diagnostic d{spec_file, 0, 0, message + " (tau run would refuse it on the local backend)",
                     true};
  if (auto at = parsed.positions.find(message.substr(0, message.find_first_of(": ")));
      at != parsed.positions.end()) {
    d.line = at->second.line;
    d.column = at->second.column;
  }
  return d;
}

}  // namespace tau::cli
