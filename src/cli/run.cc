// `tau run`: validate locally, snapshot the code directory, submit, then follow the run to its end.
#include <dirent.h>
#include <fnmatch.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/limits.h"
#include "common/strings.h"
#include "spec/spec.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

// Never part of a code snapshot: version control, caches and virtualenvs.
const char* kAlwaysSkipped[] = {".git",         ".hg",          ".svn",
                                "__pycache__",  ".venv",        "venv",
                                "node_modules", ".tau",         ".ipynb_checkpoints",
                                ".mypy_cache",  ".pytest_cache"};

struct CodeWalk {
  std::string root;
  std::vector<std::string> ignore;  // .tauignore patterns
  nlohmann::json files = nlohmann::json::array();
  size_t bytes = 0;
  std::vector<std::string> warnings;
};

bool Ignored(const CodeWalk& w, const std::string& rel, const std::string& base) {
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

Status Walk(CodeWalk& w, const std::string& rel_dir) {
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
    std::string path = w.root + "/" + rel;
    struct stat lst;
    if (::lstat(path.c_str(), &lst) != 0) continue;
    struct stat st = lst;
    if (S_ISLNK(lst.st_mode)) {
      // A link is followed only when it stays inside the code directory; its target is copied.
      fs::path target = fs::weakly_canonical(path, ec);
      fs::path root = fs::weakly_canonical(w.root, ec);
      std::string t = target.string(), r = root.string() + "/";
      if (ec || !StartsWith(t, r) || ::stat(path.c_str(), &st) != 0) {
        w.warnings.push_back(
            fmt::format("skipped '{}': a link that leaves the code directory", rel));
        continue;
      }
    }
    if (S_ISDIR(st.st_mode)) {
      if (S_ISLNK(lst.st_mode)) {
        w.warnings.push_back(fmt::format("skipped '{}': a link to a directory", rel));
        continue;
      }
      TAU_RETURN_IF_ERROR(Walk(w, rel));
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    if (w.files.size() >= kMaxSnapshotFiles)
      return ResourceExhausted(fmt::format(
          "the code directory {} has more than {} files; list what the run does not need in "
          ".tauignore",
          w.root, kMaxSnapshotFiles));
    w.bytes += static_cast<size_t>(st.st_size);
    if (w.bytes > kMaxSnapshotBytes)
      return ResourceExhausted(
          fmt::format("the code directory {} holds more than {} MiB; keep data sets and "
                      "checkpoints out of it or "
                      "list them in .tauignore (gitignore-style patterns)",
                      w.root, kMaxSnapshotBytes >> 20));
    TAU_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
    w.files.push_back({{"path", rel},
                       {"mode", static_cast<int>(st.st_mode & 0777)},
                       {"data", Base64Encode(data)}});
  }
  return Status::Ok();
}

Result<CodeWalk> CollectCode(const std::string& root) {
  CodeWalk w;
  w.root = root;
  if (auto ignore = ReadFile(root + "/.tauignore"); ignore.ok()) {
    for (std::string line : Split(*ignore, '\n')) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') w.ignore.push_back(line);
    }
  }
  TAU_RETURN_IF_ERROR(Walk(w, ""));
  return w;
}

// Ctrl-C while following a run detaches; the run goes on in the server.
char g_detach_message[512];
void OnInterrupt(int) {
  (void)!::write(STDERR_FILENO, g_detach_message, std::strlen(g_detach_message));
  ::_exit(130);
}

std::string StatusLine(const nlohmann::json& run) {
  std::string state = run.value("state", "");
  if (state == "Queued" && run.contains("pending") && run["pending"].is_object()) {
    const auto& p = run["pending"];
    std::string pos = p.contains("position") && p["position"].is_number()
                          ? fmt::format(" (position {})", p["position"].get<int>())
                          : "";
    return fmt::format("queued{}: {}", pos, p.value("reason", ""));
  }
  return state;
}

int ExitCodeOf(const nlohmann::json& run) {
  std::string state = run.value("state", "");
  if (state == "Succeeded") return 0;
  if (run.contains("exit_code") && run["exit_code"].is_number_integer()) {
    int code = run["exit_code"].get<int>();
    if (code > 0 && code < 256) return code;
  }
  return kExitInvalid;
}

}  // namespace

int CmdRun(const Global& g, const std::string& file, bool detach) {
  auto text = ReadFile(file);
  if (!text.ok()) return Fail(text.status().message());
  spec::ParseOutcome parsed = spec::ParseSpec(*text, file);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
    return kExitInvalid;
  }
  std::string root = fs::path(file).parent_path().string();
  if (root.empty()) root = ".";
  auto code = CollectCode(root);
  if (!code.ok()) return Fail(code.status().message());
  for (const std::string& w : code->warnings) std::fprintf(stderr, "tau: warning: %s\n", w.c_str());
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  nlohmann::json body = {{"spec", {{"file", file}, {"yaml", *text}}},
                         {"code", {{"files", std::move(code->files)}}}};
  auto submitted = CallJson(**conn, "POST", "/api/v1/runs", body.dump());
  if (!submitted.ok()) return Fail(submitted.status().message());
  nlohmann::json run = (*submitted)["run"];
  std::string name = run["name"].get<std::string>();
  if (detach) {
    std::puts(name.c_str());
    return 0;
  }
  bool tty = StderrIsTerminal();
  std::fprintf(stderr, "tau: run %s submitted\n", name.c_str());
  std::snprintf(g_detach_message, sizeof g_detach_message,
                "\ntau: detached; run %s keeps running. Follow it: tau logs -f %s   Stop it: tau "
                "cancel %s\n",
                name.c_str(), name.c_str(), name.c_str());
  ::signal(SIGINT, OnInterrupt);
  // While it waits for admission, show where it stands (on a terminal only).
  std::string last_line;
  int64_t started = MonotonicMillis();
  while (true) {
    auto now = CallJson(**conn, "GET", "/api/v1/runs/" + name);
    if (!now.ok()) return Fail(now.status().message());
    run = (*now)["run"];
    std::string state = run.value("state", "");
    if (state != "Queued" && state != "Admitted") break;
    std::string line = StatusLine(run);
    if (tty && line != last_line) {
      std::fprintf(stderr, "\r\033[Ktau: %s", line.c_str());
      last_line = line;
    }
    int64_t waited = MonotonicMillis() - started;
    std::this_thread::sleep_for(std::chrono::milliseconds(waited < 1000 ? 20 : 250));
  }
  if (tty && !last_line.empty()) std::fprintf(stderr, "\r\033[K");
  auto streamed =
      (*conn)->Stream("GET", "/api/v1/runs/" + name + "/logs?follow=1", [](std::string_view data) {
        std::fwrite(data.data(), 1, data.size(), stdout);
        std::fflush(stdout);
        return true;
      });
  if (!streamed.ok()) return Fail("lost the log stream: " + streamed.status().message());
  // The stream ends when the run does; the final state may take a moment to be recorded.
  for (int i = 0; i < 600; ++i) {
    auto now = CallJson(**conn, "GET", "/api/v1/runs/" + name);
    if (!now.ok()) return Fail(now.status().message());
    run = (*now)["run"];
    std::string state = run.value("state", "");
    if (state == "Succeeded" || state == "Failed" || state == "Cancelled") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string state = run.value("state", "");
  std::string detail = run.value("message", "");
  if (state == "Succeeded") {
    std::fprintf(stderr, "tau: run %s succeeded\n", name.c_str());
  } else {
    std::fprintf(stderr, "tau: run %s %s (%s): %s\n", name.c_str(),
                 state == "Cancelled" ? "was cancelled" : "failed", run.value("reason", "").c_str(),
                 detail.c_str());
    std::fprintf(stderr, "tau: details: tau describe %s\n", name.c_str());
  }
  return ExitCodeOf(run);
}

}  // namespace tau::cli
