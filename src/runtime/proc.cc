#include "runtime/proc.h"
#include <fcntl.h>

#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "common/files.h"

extern char** environ;

namespace tau::runtime::internal {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

std::optional<ProcStat> ParseProcStat(std::string_view text) {
  size_t close = text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  // Fields after the command name, space separated: [0] state (field 3), [1] ppid, [2] pgrp, [3]
  // session,
  // ..., [19] starttime (field 22).
  std::vector<std::string_view> fields;
  std::string_view rest = text.substr(close + 1);
  size_t pos = 0;
  while (pos < rest.size() && fields.size() < 20) {
    while (pos < rest.size() && (rest[pos] == ' ' || rest[pos] == '\n')) ++pos;
    size_t end = pos;
    while (end < rest.size() && rest[end] != ' ' && rest[end] != '\n') ++end;
    if (end > pos) fields.push_back(rest.substr(pos, end - pos));
    pos = end;
  }
  if (fields.size() < 20 || fields[0].size() != 1) return std::nullopt;
  ProcStat st;
  st.state = fields[0][0];
  if (!ParseNumber(fields[1], &st.ppid) || !ParseNumber(fields[2], &st.pgrp) ||
      !ParseNumber(fields[3], &st.session) || !ParseNumber(fields[19], &st.start_time)) {
    return std::nullopt;
  }
  return st;
}

std::optional<ProcStat> ReadProcStat(int pid) {
  if (pid <= 0) return std::nullopt;
  auto text = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return std::nullopt;
  return ParseProcStat(*text);
}

std::vector<int> ListPids() {
  std::vector<int> pids;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return pids;
  while (struct dirent* entry = ::readdir(dir)) {
    int pid = 0;
    std::string_view name(entry->d_name);
    if (ParseNumber(name, &pid) && pid > 0) pids.push_back(pid);
  }
  ::closedir(dir);
  return pids;
}

bool EnvironHas(int pid, std::string_view entry) {
  auto text = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  if (!text.ok()) return false;
  std::string_view all(*text);
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find('\0', start);
    if (end == std::string_view::npos) end = all.size();
    if (all.substr(start, end - start) == entry) return true;
    start = end + 1;
  }
  return false;
}

int PidfdOpen(int pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

int PidfdSendSignal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

bool SignalIfSame(const ProcessId& id, int sig) {
  if (id.pid <= 0) return false;
  UniqueFd pidfd(PidfdOpen(id.pid));
  if (!pidfd.valid()) return false;
  std::optional<ProcStat> st = ReadProcStat(id.pid);
  if (!st || st->state == 'Z' || st->start_time != id.start_time) return false;
  return PidfdSendSignal(pidfd.get(), sig) == 0;
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

sigset_t ShimSignalMask() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&mask, sig);
  return mask;
}

int StderrOr(int fallback) {
  return ::fcntl(STDERR_FILENO, F_GETFD) >= 0 ? STDERR_FILENO : fallback;
}

int SpawnDetached(const std::vector<std::string>& argv, const int (&stdio)[3],
                  const sigset_t& blocked, pid_t* pid) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  for (int fd = 0; fd < 3; ++fd) posix_spawn_file_actions_adddup2(&actions, stdio[fd], fd);
  // The caller's sockets, databases and pidfds must not leak into a process that outlives it.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  // Default dispositions: the caller may ignore signals the child relies on.
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &blocked);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int rc = ::posix_spawn(pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc;
}

}  // namespace tau::runtime::internal
