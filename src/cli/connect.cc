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
#include "common/layout.h"
#include "common/mutex.h"
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
  std::string log = layout::ServerLog(home);
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
  // The usual cause is the log file: $TAU_HOME exists but is not writable.
  if (rc != 0)
    return IoError(fmt::format("cannot start a local tau server (home {}, log {})", home, log), rc);
  return Status::Ok();
}

}  // namespace

std::string ClientConfigPath() {
  if (const char* p = std::getenv("TAU_CONFIG"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x)
    return std::string(x) + "/tau/config.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.config/tau/config.json";
}

ClientConfig LoadClientConfig() {
  ClientConfig config;
  auto text = ReadFile(ClientConfigPath());
  if (!text.ok()) return config;
  // The client's own config.json, not an API reply: read by key, forgiving of what it lacks.
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object()) return config;
  if (auto it = j.find("current"); it != j.end() && it->is_string()) config.current = *it;
  if (auto it = j.find("servers"); it != j.end() && it->is_object())
    for (const auto& [address, e] : it->items()) {
      if (!e.is_object()) continue;
      ServerEntry entry;
      if (auto t = e.find("token"); t != e.end() && t->is_string()) entry.token = *t;
      if (auto c = e.find("ca_file"); c != e.end() && c->is_string()) entry.ca_file = *c;
      config.servers[address] = std::move(entry);
    }
  return config;
}

Status SaveClientConfig(const ClientConfig& config) {
  nlohmann::json servers = nlohmann::json::object();
  for (const auto& [address, e] : config.servers)
    servers[address] = {{"token", e.token}, {"ca_file", e.ca_file}};
  nlohmann::json j = {{"current", config.current}, {"servers", servers}};
  std::string path = ClientConfigPath();
  TAU_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.rfind('/')), 0700));
  return WriteFileAtomic(path, j.dump(2) + "\n", 0600);
}

int ClientTimeoutMillis() {
  constexpr int kDefault = 5'000;
  const char* env = std::getenv("TAU_TIMEOUT");
  if (env == nullptr || *env == '\0') return kDefault;
  auto ms = ParseDurationMillis(env);
  if (!ms.ok() || *ms <= 0 || *ms > 3'600'000) {
    static bool warned = false;
    if (!warned)
      std::fprintf(stderr,
                   "tau: warning: TAU_TIMEOUT=%s is not a duration from 1ms to 1h (like 30s); "
                   "waiting 5s\n",
                   env);
    warned = true;
    return kDefault;
  }
  return static_cast<int>(*ms);
}

Result<std::unique_ptr<client::Connection>> ConnectWith(const std::string& address,
                                                        const ServerEntry& entry) {
  TAU_ASSIGN_OR_RETURN(client::Endpoint endpoint, client::ParseEndpoint(address));
  client::TlsOptions tls;  // https://: the system's CAs, or a private CA
  tls.ca_file = entry.ca_file;
  auto conn = client::Connection::Open(endpoint, tls, ClientTimeoutMillis());
  if (!conn.ok())
    return Status(conn.status().code(),
                  conn.status().message() + " (is the server running? check --server/TAU_SERVER)");
  if (!entry.token.empty()) (*conn)->set_bearer_token(entry.token);
  return conn;
}

bool SignsInWithAToken(const std::string& server_flag) {
  auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
  return !server_flag.empty() || set("TAU_SERVER") || set("TAU_TOKEN") ||
         !LoadClientConfig().current.empty();
}

Result<std::unique_ptr<client::Connection>> ConnectToServer(const std::string& server_flag,
                                                            bool start_local) {
  std::string address = server_flag;
  if (address.empty())
    if (const char* env = std::getenv("TAU_SERVER"); env && *env) address = env;
  const char* env_token = std::getenv("TAU_TOKEN");
  const char* env_ca = std::getenv("TAU_CA_FILE");
  ClientConfig config;
  // The config is read only when it can matter: the local socket needs no token.
  if (address.empty() || !(env_token && *env_token)) config = LoadClientConfig();
  if (address.empty()) address = config.current;
  if (!address.empty()) {
    ServerEntry entry = config.servers[address];
    if (env_token && *env_token) entry.token = env_token;
    if (env_ca && *env_ca) entry.ca_file = env_ca;
    return ConnectWith(address, entry);
  }
  std::string home = TauHome();
  client::Endpoint local;
  local.path = layout::SocketPath(home);
  // A token on the local socket signs in as its user instead of the socket's (an admin acting
  // as someone, or a test).
  std::string token = env_token && *env_token ? env_token : "";
  auto conn = client::Connection::Open(local, ClientTimeoutMillis());
  if (conn.ok()) {
    if (!token.empty()) (*conn)->set_bearer_token(token);
    return conn;
  }
  // A user with no server of their own, on a machine whose root serves everyone, uses that one.
  const char* env_home = std::getenv("TAU_HOME");
  if (!(env_home && *env_home) && home != kMachineHome) {
    client::Endpoint shared;
    shared.path = layout::SocketPath(kMachineHome);
    if (PathExists(shared.path)) {
      auto machine = client::Connection::Open(shared, ClientTimeoutMillis());
      if (machine.ok()) {
        if (!token.empty()) (*machine)->set_bearer_token(token);
        return machine;
      }
    }
  }
  if (!start_local) return conn.status();
  TAU_RETURN_IF_ERROR(SpawnLocalServer(home));
  int64_t deadline = MonotonicMillis() + kStartTimeoutMs;
  int sleep_ms = 2;
  while (MonotonicMillis() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 100);
    conn = client::Connection::Open(local, ClientTimeoutMillis());
    if (conn.ok()) {
      if (!token.empty()) (*conn)->set_bearer_token(token);
      return conn;
    }
  }
  return Unavailable(
      fmt::format("started a local tau server but it did not answer on {} within {} s; see {}",
                  local.path, kStartTimeoutMs / 1000, layout::ServerLog(home)));
}

std::string QueuedLine(const api::Run& run) {
  if (run.state != "Queued" || !run.pending) return "";
  const api::Pending& p = *run.pending;
  return fmt::format("queued{}: {}", p.position ? fmt::format(" (position {})", *p.position) : "",
                     p.reason);
}

std::string QueuedKey(const api::Run& run) {
  if (run.state != "Queued" || !run.pending) return "";
  return fmt::format("{}/{}", run.pending->code.value_or(""), run.pending->position.value_or(0));
}

namespace {

// Says on stderr what a followed run does while its log is silent: where it waits in the queue,
// an attempt that failed and when it is retried, a preemption, a resume. Its own connection and
// thread, polling the run about once a second; stdout stays the log's alone.
class RunNarrator {
 public:
  // `from_start`: what happened since the run was submitted; else from now on.
  RunNarrator(std::string server_flag, std::string run, bool from_start)
      : server_flag_(std::move(server_flag)),
        run_(std::move(run)),
        from_start_(from_start),
        thread_([this] { Loop(); }) {}
  ~RunNarrator() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

 private:
  // False once stopped.
  bool Sleep(int ms) {
    MutexLock lock(&mu_);
    return !cv_.WaitFor(&mu_, std::chrono::milliseconds(ms),
                        [this]() TAU_REQUIRES(mu_) { return stop_; });
  }
  void Loop() {
    auto conn = ConnectToServer(server_flag_, /*start_local=*/false);
    if (!conn.ok()) return;  // the log stream says what is wrong with the server
    size_t seen = 0;
    bool first = true;
    std::string said_queued;  // the code and position last said, not the countdown in the text
    do {
      auto got = client::TauApi(conn->get()).GetRun(run_);
      if (!got.ok()) continue;
      // The run's earlier history is `tau describe`'s.
      if (first && !from_start_) seen = got->events.size();
      first = false;
      for (; seen < got->events.size(); ++seen) {
        const api::Event& e = got->events[seen];
        if (!e.message.empty() && !Routine(e.type))
          std::fprintf(stderr, "tau: %s\n", e.message.c_str());
      }
      const api::Run& r = got->run;
      const std::string key = QueuedKey(r);
      if (!key.empty() && key != said_queued) {
        std::fprintf(stderr, "tau: %s\n", QueuedLine(r).c_str());
        said_queued = key;
      } else if (r.state != "Queued") {
        said_queued.clear();
      }
      if (r.IsTerminal()) return;
    } while (Sleep(1000));
  }

  // What every run does, or what the log and the command's last line say already.
  static bool Routine(const std::string& type) {
    for (const char* t :
         {"Submitted", "Queued", "Admitted", "Running", "Succeeded", "Failed", "Cancelled"})
      if (type == t) return true;
    return false;
  }

  const std::string server_flag_, run_;
  const bool from_start_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ TAU_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace

Result<int> FollowLog(const std::string& server_flag, std::unique_ptr<client::Connection>* conn,
                      const std::string& run, client::LogQuery query, bool since_submitted) {
  RunNarrator narrator(server_flag, run, since_submitted);
  while (true) {
    auto streamed = client::TauApi(conn->get()).StreamLog(run, query, [&](std::string_view data) {
      std::fwrite(data.data(), 1, data.size(), stdout);
      std::fflush(stdout);
      query.skip += static_cast<int64_t>(data.size());
      return true;
    });
    const bool lost = !streamed.ok() && (streamed.status().code() == StatusCode::kUnavailable ||
                                         streamed.status().code() == StatusCode::kIo);
    if (!lost) return streamed;
    std::fprintf(stderr,
                 "tau: lost the connection to the server (%s); the run goes on. "
                 "Reconnecting...\n",
                 streamed.status().message().c_str());
    const int64_t give_up = MonotonicMillis() + 60'000;
    Status last = streamed.status();
    bool back = false;
    while (!back && MonotonicMillis() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      auto again = ConnectToServer(server_flag);
      if (again.ok()) {
        *conn = std::move(*again);
        back = true;
      } else {
        last = again.status();
      }
    }
    if (!back)
      return Status(last.code(), fmt::format("{}; follow the run again with: tau logs -f {}",
                                             last.message(), run));
    std::fprintf(stderr, "tau: reconnected; following %s again\n", run.c_str());
  }
}

}  // namespace tau::cli
