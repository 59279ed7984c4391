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
#include "cli/code.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/json_text.h"
#include "common/limits.h"
#include "common/strings.h"
#include "spec/spec.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

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
  auto text = ReadFileAtMost(file, spec::kMaxSpecBytes, "a spec");
  if (!text.ok()) return Fail(text.status().message());
  spec::ParseOutcome parsed = spec::ParseSpec(*text, file);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
    return kExitInvalid;
  }
  std::string root = fs::path(file).parent_path().string();
  if (root.empty()) root = ".";
  auto code = CollectCode(root, kMaxSnapshotBytes);
  if (!code.ok()) return Fail(code.status().message());
  for (const std::string& w : code->warnings) std::fprintf(stderr, "tau: warning: %s\n", w.c_str());
  nlohmann::json files = nlohmann::json::array();
  for (const CodeFile& f : code->files)
    files.push_back({{"path", f.path}, {"mode", f.mode}, {"data", Base64Encode(f.data)}});
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  nlohmann::json body = {{"spec", {{"file", file}, {"yaml", *text}}},
                         {"code", {{"files", std::move(files)}}}};
  auto submitted = CallJson(**conn, "POST", "/api/v1/runs", JsonText(body));
  if (!submitted.ok()) return Fail(submitted.status().message());
  nlohmann::json run = (*submitted)["run"];
  std::string name = run["name"].get<std::string>();
  if (detach) {
    std::puts(name.c_str());
    return 0;
  }
  bool tty = StderrIsTerminal();
  std::fprintf(stderr, "tau: run %s submitted\n", name.c_str());
  std::snprintf(
      g_detach_message, sizeof g_detach_message,
      "\ntau: detached; run %s goes on without this terminal. Follow it: tau logs -f %s   "
      "Stop it: tau cancel %s\n",
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
  auto streamed = FollowLog(g.server, &*conn, name, "/api/v1/runs/" + name + "/logs?follow=1");
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
    // Only rank 0's output was streamed here; the rank that failed may be another.
    int workers = 1;
    if (auto res = run.find("resources"); res != run.end() && res->is_object()) {
      auto w = res->find("workers");
      if (w != res->end() && w->is_number_integer()) workers = w->get<int>();
    }
    if (workers > 1)
      std::fprintf(stderr,
                   "tau: this terminal showed rank 0; each rank's log: tau logs %s --rank R\n",
                   name.c_str());
  }
  return ExitCodeOf(run);
}

}  // namespace tau::cli
