// Internal helpers of the runtime module: /proc parsing, pidfds and an owning file descriptor. Not
// part of the public interface (runtime.h).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace tau::runtime::internal {

// Closes the descriptor it owns.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// The fields of /proc/PID/stat the runtime needs.
struct ProcStat {
  char state = '?';  // 'R', 'S', 'Z' (zombie), ...
  int ppid = 0;
  int pgrp = 0;
  int session = 0;
  uint64_t start_time = 0;  // field 22, clock ticks since boot
};

// Parses the text of /proc/PID/stat. The command name (field 2) is in parentheses and may itself
// contain spaces and parentheses, so the fields are counted from the last ')'.
std::optional<ProcStat> ParseProcStat(std::string_view text);
// Reads /proc/PID/stat; zombies included (state 'Z'). nullopt when there is no such process.
std::optional<ProcStat> ReadProcStat(int pid);
// The pids of every process visible in /proc.
std::vector<int> ListPids();
// Whether the environment process `pid` started with holds `entry` ("NAME=VALUE") exactly; false
// when it cannot be read (gone, or another user's without the right to read it).
bool EnvironHas(int pid, std::string_view entry);
// The environment variable every worker of an attempt carries: the attempt's directory. It finds
// the processes of an attempt whose supervisor died, even those that left its session (setsid).
inline constexpr char kAttemptMarker[] = "TAU_ATTEMPT_DIR";

// pidfd_open(2) and pidfd_send_signal(2); -1 with errno on failure.
int PidfdOpen(int pid);
int PidfdSendSignal(int pidfd, int sig);
// Sends `sig` to `id` only if it is still the same process: the pidfd pins the process, so the
// start-time check cannot race with pid reuse. Returns false when the process is gone or is another
// one.
bool SignalIfSame(const ProcessId& id, int sig);

// The signals a shim starts with blocked, however it is started: it reads SIGTERM, SIGINT and
// SIGCHLD from a signalfd, and a stop request that arrives before it has set that up stays pending
// instead of killing it before it writes result.json.
sigset_t ShimSignalMask();

// Standard error when this process has one open, else `fallback`: what a process started for
// the caller gets as its own standard error.
int StderrOr(int fallback);

// Starts `argv` (argv[0] a path) with posix_spawn in a session of its own, with `stdio` as its
// descriptors 0, 1 and 2 and no other descriptor of ours, every signal at its default disposition,
// and `blocked` as its signal mask: a process that outlives the caller and is reached by no signal
// meant for the caller's terminal or process group. posix_spawn runs no code of ours in the child,
// which is what a multi-threaded caller needs. Returns 0 and sets *pid, or returns the errno.
int SpawnDetached(const std::vector<std::string>& argv, const int (&stdio)[3],
                  const sigset_t& blocked, pid_t* pid);

// Pretty JSON plus a newline for the attempt's files. Invalid UTF-8 (an env value, a path) is
// replaced rather than thrown about: nlohmann's dump() throws on it by default.
std::string DumpJson(const nlohmann::json& j);

// Writes all of `data`, retrying on EINTR and short writes. Best effort: errors are ignored.
void WriteAll(int fd, std::string_view data);

}  // namespace tau::runtime::internal
