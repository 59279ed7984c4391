// The server's side of an attempt: the JSON files in the attempt directory, starting the shim,
// stopping it, and identifying processes across restarts.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "common/files.h"
#include "common/users.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

using internal::UniqueFd;
using json = nlohmann::json;

json EnvToJson(const EnvList& env) {
  json out = json::array();
  for (const auto& [name, value] : env) out.push_back(json::array({name, value}));
  return out;
}

EnvList EnvFromJson(const json& j) {
  EnvList env;
  for (const json& pair : j) env.push_back(pair.get<std::pair<std::string, std::string>>());
  return env;
}

json OptionalToJson(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

std::optional<int64_t> OptionalFromJson(const json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return j.at(key).get<int64_t>();
}

template <typename T>
T ValueOr(const json& j, const char* key, T fallback) {
  return j.contains(key) ? j.at(key).get<T>() : fallback;
}

std::optional<OutcomeKind> OutcomeKindFromName(const std::string& name) {
  for (OutcomeKind k : {OutcomeKind::kSucceeded, OutcomeKind::kFailed, OutcomeKind::kSetupFailed,
                        OutcomeKind::kStopped, OutcomeKind::kTimedOut}) {
    if (name == OutcomeKindName(k)) return k;
  }
  return std::nullopt;
}

// Kills the workers state.json records; returns the attempt's process group (0: none recorded,
// as for a shim that died before it recorded any worker).
Result<int> KillRecordedWorkers(const std::string& attempt_dir) {
  auto text = ReadFile(attempt_dir + "/state.json");
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return 0;
    return text.status();
  }
  json state = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object()) return Internal("corrupt " + attempt_dir + "/state.json");
  try {
    if (state.contains("workers")) {
      for (const json& w : state.at("workers")) {
        ProcessId id{w.at("pid").get<int>(), w.at("start_time").get<uint64_t>()};
        internal::SignalIfSame(id, SIGKILL);
      }
    }
    return ValueOr<int>(state, "pgid", 0);
  } catch (const json::exception& e) {
    return Internal("corrupt " + attempt_dir + "/state.json: " + e.what());
  }
}

// The shim is gone, so nobody supervises the workers any more: kill what is provably still ours.
Status KillOrphanedWorkers(const ProcessId& shim, const std::string& attempt_dir) {
  Result<int> pgid = KillRecordedWorkers(attempt_dir);
  // Then one pass over every process. Grandchildren outlive the workers' PDEATHSIG: a process in
  // the attempt's process group *and* in the shim's session is ours (both ids stay reserved while
  // any member lives, so neither can have been reused). Those that left the session (setsid, a
  // daemon's double fork) still carry the attempt's marker in the environment they started with,
  // unless they replaced it themselves (a cgroup, where there is one, holds them all; see the
  // shim); the marker needs nothing the shim wrote, so it also finds the workers of a shim that
  // died before it recorded them.
  const int group = pgid.ok() && shim.pid > 0 ? *pgid : 0;
  const std::string marker = std::string(internal::kAttemptMarker) + "=" + attempt_dir;
  // Again while a pass finds one: a process forked during a pass may take a pid the pass has gone
  // by (pids come round), and is found by the next.
  bool found = true;
  for (int pass = 0; pass < 3 && found; ++pass) {
    found = false;
    for (int pid : internal::ListPids()) {
      if (pid == ::getpid()) continue;
      std::optional<internal::ProcStat> st;
      if (group > 0) st = internal::ReadProcStat(pid);
      if (st && st->state == 'Z') continue;  // dead already, waiting for its parent
      if ((st && st->pgrp == group && st->session == shim.pid) ||
          internal::EnvironHas(pid, marker)) {
        ::kill(pid, SIGKILL);
        found = true;
      }
    }
  }
  return pgid.ok() ? Status::Ok() : pgid.status();
}

}  // namespace

const char* OutcomeKindName(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kSucceeded:
      return "Succeeded";
    case OutcomeKind::kFailed:
      return "Failed";
    case OutcomeKind::kSetupFailed:
      return "SetupFailed";
    case OutcomeKind::kStopped:
      return "Stopped";
    case OutcomeKind::kTimedOut:
      return "TimedOut";
  }
  return "Unknown";
}

json AttemptConfig::ToJson() const {
  json workers_json = json::array();
  for (const WorkerLaunch& w : workers) {
    workers_json.push_back({{"argv", w.argv}, {"env", EnvToJson(w.env)}});
  }
  return {
      {"run_name", run_name},
      {"attempt", attempt},
      {"attempt_dir", attempt_dir},
      {"work_dir", work_dir},
      {"code", code ? json{{"snapshot", code->snapshot}, {"root", code->root}, {"copy", code->copy}}
                    : json(nullptr)},
      {"workers", workers_json},
      {"read_only", read_only},
      {"pip", pip},
      {"venv_cache_dir", venv_cache_dir},
      {"memory_limit_bytes", OptionalToJson(memory_limit_bytes)},
      {"cpu_limit_milli", OptionalToJson(cpu_limit_milli)},
      {"max_runtime_ms", OptionalToJson(max_runtime_ms)},
      {"stop_grace_ms", stop_grace_ms},
      {"run_as", run_as ? json{{"uid", run_as->uid},
                               {"gid", run_as->gid},
                               {"groups", run_as->groups},
                               {"user", run_as->user}}
                        : json(nullptr)},
      {"mask", mask},
      {"max_log_bytes", max_log_bytes}};
}

Result<AttemptConfig> AttemptConfig::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("attempt config must be a JSON object");
  try {
    AttemptConfig c;
    c.run_name = j.at("run_name").get<std::string>();
    c.attempt = j.at("attempt").get<int>();
    c.attempt_dir = j.at("attempt_dir").get<std::string>();
    c.work_dir = ValueOr<std::string>(j, "work_dir", "");
    if (auto it = j.find("code"); it != j.end() && it->is_object()) {
      AttemptConfig::Code code;
      code.snapshot = it->at("snapshot").get<std::string>();
      code.root = it->at("root").get<std::string>();
      code.copy = ValueOr<bool>(*it, "copy", false);
      c.code = std::move(code);
    }
    for (const json& w : j.at("workers")) {
      WorkerLaunch launch;
      launch.argv = w.at("argv").get<std::vector<std::string>>();
      launch.env = EnvFromJson(w.at("env"));
      c.workers.push_back(std::move(launch));
    }
    c.read_only = ValueOr<std::vector<std::string>>(j, "read_only", {});
    c.pip = ValueOr<std::vector<std::string>>(j, "pip", {});
    c.venv_cache_dir = ValueOr<std::string>(j, "venv_cache_dir", "");
    c.memory_limit_bytes = OptionalFromJson(j, "memory_limit_bytes");
    c.cpu_limit_milli = OptionalFromJson(j, "cpu_limit_milli");
    c.max_runtime_ms = OptionalFromJson(j, "max_runtime_ms");
    c.stop_grace_ms = ValueOr<int64_t>(j, "stop_grace_ms", c.stop_grace_ms);
    if (auto it = j.find("run_as"); it != j.end() && it->is_object()) {
      AttemptConfig::RunAs r;
      r.uid = it->at("uid").get<uint32_t>();
      r.gid = it->at("gid").get<uint32_t>();
      r.groups = it->at("groups").get<std::vector<uint32_t>>();
      r.user = ValueOr<std::string>(*it, "user", "");
      c.run_as = std::move(r);
    }
    c.mask = ValueOr<std::vector<std::string>>(j, "mask", {});
    c.max_log_bytes = ValueOr<int64_t>(j, "max_log_bytes", 0);
    return c;
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("invalid attempt config: ") + e.what());
  }
}

json AttemptOutcome::ToJson() const {
  json workers_json = json::array();
  for (const WorkerOutcome& w : workers) {
    workers_json.push_back(
        {{"rank", w.rank}, {"pid", w.pid}, {"exit_code", w.exit_code}, {"signal", w.signal}});
  }
  return {{"kind", OutcomeKindName(kind)}, {"exit_code", exit_code},   {"signal", signal},
          {"failed_rank", failed_rank},    {"oom_killed", oom_killed}, {"message", message},
          {"started_ms", started_ms},      {"ended_ms", ended_ms},     {"workers", workers_json}};
}

Result<AttemptOutcome> AttemptOutcome::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("attempt outcome must be a JSON object");
  try {
    AttemptOutcome o;
    std::string kind = j.at("kind").get<std::string>();
    std::optional<OutcomeKind> parsed = OutcomeKindFromName(kind);
    if (!parsed) return InvalidArgument("unknown outcome kind '" + kind + "'");
    o.kind = *parsed;
    o.exit_code = ValueOr<int>(j, "exit_code", 0);
    o.signal = ValueOr<int>(j, "signal", 0);
    o.failed_rank = ValueOr<int>(j, "failed_rank", -1);
    o.oom_killed = ValueOr<bool>(j, "oom_killed", false);
    o.message = ValueOr<std::string>(j, "message", "");
    o.started_ms = ValueOr<int64_t>(j, "started_ms", 0);
    o.ended_ms = ValueOr<int64_t>(j, "ended_ms", 0);
    if (j.contains("workers")) {
      for (const json& w : j.at("workers")) {
        o.workers.push_back({w.at("rank").get<int>(), w.at("pid").get<int>(),
                             w.at("exit_code").get<int>(), w.at("signal").get<int>()});
      }
    }
    return o;
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("invalid attempt outcome: ") + e.what());
  }
}

Result<AttemptOutcome> ReadOutcome(const std::string& attempt_dir) {
  const std::string path = attempt_dir + "/result.json";
  TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Internal(path + " is not valid JSON");
  auto outcome = AttemptOutcome::FromJson(j);
  if (!outcome.ok()) return outcome.status().WithContext(path);
  return outcome;
}

std::vector<AttemptNotice> ReadNotices(const std::string& attempt_dir, int64_t* offset) {
  std::vector<AttemptNotice> out;
  const std::string path = attempt_dir + "/" + kNoticesFile;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return out;
  std::string text;
  char buf[16384];
  // A notice is a short line; a file that grew past this is not the shim's.
  constexpr size_t kMaxRead = 1 << 20;
  for (off_t at = *offset; text.size() < kMaxRead;) {
    ssize_t n = ::pread(fd.get(), buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    json j = json::parse(text.substr(start, nl - start), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) continue;
    AttemptNotice n;
    n.type = j["type"].get<std::string>();
    if (j.contains("message") && j["message"].is_string()) n.message = j["message"];
    n.data = j.contains("data") && j["data"].is_object() ? j["data"] : json::object();
    out.push_back(std::move(n));
  }
  *offset += static_cast<int64_t>(start);
  return out;
}

std::optional<uint64_t> ProcessStartTime(int pid) {
  std::optional<internal::ProcStat> st = internal::ReadProcStat(pid);
  if (!st || st->state == 'Z' || st->state == 'X') return std::nullopt;
  return st->start_time;
}

bool IsAlive(const ProcessId& id) {
  if (id.pid <= 0) return false;
  std::optional<uint64_t> start = ProcessStartTime(id.pid);
  return start.has_value() && *start == id.start_time;
}

std::string SelfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

// Checks the config and makes the attempt directory; returns the config as JSON.
Result<std::string> PrepareConfig(const AttemptConfig& config) {
  if (config.attempt_dir.empty()) return InvalidArgument("attempt_dir is empty");
  if (config.workers.empty()) return InvalidArgument("an attempt needs at least one worker");
  // The shim makes logs/ itself (it opens the logs), off the caller's path.
  TAU_RETURN_IF_ERROR(MakeDirs(config.attempt_dir));
  return internal::DumpJson(config.ToJson());
}

Status WriteConfig(const std::string& attempt_dir, const std::string& config) {
  // 0600: the workers' env may hold secrets.
  return WriteFileAtomic(attempt_dir + "/config.json", config, 0600, Durability::kProcessCrash);
}

// The shim of an attempt whose config is written, by exec of `tau_binary __shim DIR`.
Result<ProcessId> ExecShim(const std::string& attempt_dir, const std::string& tau_binary) {
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull.valid()) return IoError("cannot open /dev/null", errno);

  pid_t pid = 0;
  // Like a forked shim's: its own log it writes itself; stray output goes to the caller's standard
  // error (the server's log).
  const int err = internal::StderrOr(devnull.get());
  int rc = internal::SpawnDetached({tau_binary, "__shim", attempt_dir}, {devnull.get(), err, err},
                                   internal::ShimSignalMask(), &pid);
  if (rc != 0) return IoError("cannot start the shim " + tau_binary, rc);

  // A shim that already exited is a zombie until the watcher reaps it; its start time is still
  // readable.
  std::optional<internal::ProcStat> st = internal::ReadProcStat(pid);
  if (!st) return Internal("the shim (pid " + std::to_string(pid) + ") vanished right after start");
  return ProcessId{pid, st->start_time};
}

// A zygote that is gone is no reason to fail a run: the shim is exec'd instead.
bool ZygoteGone(const Result<ProcessId>& forked) {
  return !forked.ok() && forked.status().code() == StatusCode::kUnavailable;
}

// How many requests may wait for the zygote's answer at once: enough to keep it forking while the
// caller prepares more, few enough that neither side's socket buffer fills (which would stall
// both).
constexpr size_t kMaxZygoteRequestsInFlight = 16;

// The shim by exec, its config written to the attempt directory first.
Result<ProcessId> WriteAndExec(const std::string& attempt_dir, const std::string& config,
                               const std::string& tau_binary) {
  TAU_RETURN_IF_ERROR(WriteConfig(attempt_dir, config));
  return ExecShim(attempt_dir, tau_binary);
}

// Asks the zygote for the shim, the config inline (no file: a file made for every attempt costs
// every attempt an inode), or in the file when it is too large to send.
Status SendToZygote(Zygote* zygote, const std::string& attempt_dir, const std::string& config) {
  Status sent = zygote->Send(attempt_dir, config);
  if (sent.code() != StatusCode::kResourceExhausted) return sent;
  TAU_RETURN_IF_ERROR(WriteConfig(attempt_dir, config));
  return zygote->Send(attempt_dir);
}

}  // namespace

Result<ProcessId> StartAttempt(const AttemptConfig& config, const std::string& tau_binary,
                               Zygote* zygote) {
  ShimBatch batch(tau_binary, zygote);
  batch.Add(config);
  return std::move(batch.Wait().front());
}

size_t ShimBatch::Add(const AttemptConfig& config) {
  entries_.push_back({config.attempt_dir, "", std::nullopt});
  Entry& e = entries_.back();
  auto json = PrepareConfig(config);
  if (!json.ok()) {
    e.shim = json.status();
    return entries_.size() - 1;
  }
  e.config = std::move(*json);
  if (zygote_ == nullptr) {
    e.shim = WriteAndExec(e.attempt_dir, e.config, tau_binary_);
    return entries_.size() - 1;
  }
  // Never more than a few answers owed: wait for the oldest before asking again.
  while (entries_.size() - 1 - received_ >= kMaxZygoteRequestsInFlight) ReceiveOldest();
  Status sent = SendToZygote(zygote_, e.attempt_dir, e.config);
  if (sent.code() == StatusCode::kUnavailable) {
    e.shim = WriteAndExec(e.attempt_dir, e.config, tau_binary_);
  } else if (!sent.ok()) {
    e.shim = sent;
  }
  return entries_.size() - 1;
}

void ShimBatch::ReceiveOldest() {
  Entry& e = entries_[received_++];
  if (e.shim) return;  // answered without the zygote
  Result<ProcessId> forked = zygote_->Receive(e.attempt_dir);
  e.shim =
      ZygoteGone(forked) ? WriteAndExec(e.attempt_dir, e.config, tau_binary_) : std::move(forked);
}

std::vector<Result<ProcessId>> ShimBatch::Wait() {
  while (received_ < entries_.size()) ReceiveOldest();
  std::vector<Result<ProcessId>> out;
  for (Entry& e : entries_) out.push_back(std::move(*e.shim));
  entries_.clear();
  received_ = 0;
  return out;
}

Status StopAttempt(const ProcessId& shim, const std::string& attempt_dir) {
  if (internal::SignalIfSame(shim, SIGTERM)) return Status::Ok();
  return KillOrphanedWorkers(shim, attempt_dir);
}

Status KillAttempt(const ProcessId& shim, const std::string& attempt_dir) {
  internal::SignalIfSame(shim, SIGKILL);
  return KillOrphanedWorkers(shim, attempt_dir);
}

SupervisorState ProbeSupervisor(const std::string& attempt_dir, ProcessId* live) {
  std::string path = attempt_dir + "/" + kSupervisorLockFile;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SupervisorState::kNeverStarted;
  SupervisorState state = SupervisorState::kGone;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    state = SupervisorState::kAlive;
    char buf[64] = {0};
    if (::pread(fd, buf, sizeof buf - 1, 0) > 0 && live != nullptr) {
      unsigned long long start = 0;
      int pid = 0;
      if (std::sscanf(buf, "%d %llu", &pid, &start) == 2) *live = ProcessId{pid, start};
    }
  }
  ::close(fd);
  return state;
}

Result<AttemptConfig::RunAs> LookUpUser(const std::string& name) {
  TAU_ASSIGN_OR_RETURN(SystemUser user, LookUpUserByName(name));
  return AttemptConfig::RunAs{user.uid, user.gid, user.gids, user.name};
}

}  // namespace tau::runtime
