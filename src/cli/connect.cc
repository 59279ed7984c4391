#include "cli/connect.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "runtime/runtime.h"

extern char** environ;

namespace tau::cli {
namespace {

constexpr int kStartTimeoutMs = 15000;

// Starts `tau server` detached from this terminal (own session), its output in
// $TAU_HOME/server.log.
Status SpawnLocalServer(const std::string& home) {
  TAU_RETURN_IF_ERROR(MakeDirs(home, 0700));
  std::string exe = runtime::SelfExecutable();
  std::string log = home + "/server.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  std::string home_arg = "--home=" + home;
  char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>("server"),
                  const_cast<char*>(home_arg.c_str()), nullptr};
  pid_t pid;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return IoError("cannot start a local tau server", rc);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<client::Connection>> ConnectToServer(const std::string& server_flag) {
  std::string address = server_flag;
  if (address.empty())
    if (const char* env = std::getenv("TAU_SERVER"); env && *env) address = env;
  if (!address.empty()) {
    TAU_ASSIGN_OR_RETURN(client::Endpoint endpoint, client::ParseEndpoint(address));
    auto conn = client::Connection::Open(endpoint);
    if (!conn.ok())
      return Status(
          conn.status().code(),
          conn.status().message() + " (is the server running? check --server/TAU_SERVER)");
    return conn;
  }
  std::string home = TauHome();
  client::Endpoint local;
  local.path = home + "/tau.sock";
  auto conn = client::Connection::Open(local);
  if (conn.ok()) return conn;
  TAU_RETURN_IF_ERROR(SpawnLocalServer(home));
  int64_t deadline = MonotonicMillis() + kStartTimeoutMs;
  int sleep_ms = 2;
  while (MonotonicMillis() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 100);
    conn = client::Connection::Open(local);
    if (conn.ok()) return conn;
  }
  return Unavailable(fmt::format(
      "started a local tau server but it did not answer on {} within {} s; see {}/server.log",
      local.path, kStartTimeoutMs / 1000, home));
}

Result<nlohmann::json> CallJson(client::Connection& conn, const std::string& method,
                                const std::string& path, const std::string& body) {
  TAU_ASSIGN_OR_RETURN(client::Response resp, conn.Call(method, path, body));
  if (resp.status < 200 || resp.status >= 300) return client::ErrorFromResponse(resp);
  auto j = nlohmann::json::parse(resp.body, nullptr, false);
  if (j.is_discarded()) return Internal("the server's answer is not JSON");
  return j;
}

}  // namespace tau::cli
