// The zygote: a `tau __zygote` process, started once by the server, that forks a shim for each
// attempt, ahead of time: one forked shim (the spare) waits for the next attempt. Starting a shim
// by exec costs a whole process start-up (loading, relocation, static initialisers, page faults on
// a fresh address space): about 4.5 ms of CPU on a small VM, more than the trivial workloads it
// supervises. A fork of an idle process that has done all that already costs about 1 ms. The server
// itself cannot be the one to fork: it is multi-threaded, and only async-signal-safe calls are
// allowed between fork and exec there.
//
// Protocol, over a SOCK_SEQPACKET pair (one message per request, one per reply):
//   server -> zygote   the attempt directory, then a NUL and the attempt's config (JSON) when it
//                      comes inline; without one, the shim reads DIR/config.json
//   zygote -> server   ZygoteReply: the shim's pid and start time, or an errno
//   zygote -> spare    the same request, with the shim's stdin and stdout/stderr descriptors
//                      (SCM_RIGHTS)
//   spare -> zygote    one byte: taken
// The zygote exits when the server's end closes, including when the server dies, and its spare
// with it; shims it forked live on (own session), re-parented like any orphan.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>

#include "common/clock.h"
#include "common/mutex.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

using internal::UniqueFd;

struct ZygoteReply {
  int32_t err = 0;  // errno of a failed fork or open; 0 on success
  int32_t pid = 0;
  uint64_t start_time = 0;
};

// How long the zygote waits, after a spare was used, before it forks the next one: the fork is
// kept off the path of the attempt that just started, which on a small machine shares the CPUs.
constexpr int kRefillDelayMs = 20;

// How long the server waits for the zygote's answer before it gives up on it.
constexpr int kAnswerTimeoutMs = 2'000;

// One message of the zygote to a spare: the attempt directory as the payload, the shim's stdin
// and its stdout/stderr as SCM_RIGHTS descriptors.
class AttemptMessage {
 public:
  AttemptMessage(char* data, size_t size) : iov_{data, size} {
    msg_.msg_iov = &iov_;
    msg_.msg_iovlen = 1;
    msg_.msg_control = control_;
    msg_.msg_controllen = sizeof control_;
  }
  msghdr* msg() { return &msg_; }
  // The descriptors' slot, or null when a received message carries no (or other) descriptors.
  int* fds() {
    cmsghdr* c = CMSG_FIRSTHDR(&msg_);
    if (c == nullptr) return nullptr;
    if (c->cmsg_len == 0) {  // sending: lay the header out
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int[2]));
    }
    if (c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int[2]))) return nullptr;
    return reinterpret_cast<int*>(CMSG_DATA(c));
  }

 private:
  iovec iov_;
  alignas(cmsghdr) char control_[CMSG_SPACE(sizeof(int[2]))] = {};
  msghdr msg_{};
};

// The largest request: a directory path, its NUL, and an inline config.
constexpr size_t kMaxRequestBytes = PATH_MAX + 1 + kMaxInlineConfigBytes;

// A request's attempt directory and inline config ("" when the config is in DIR/config.json).
std::pair<std::string_view, std::string_view> SplitRequest(std::string_view request) {
  size_t nul = request.find('\0');
  if (nul == std::string_view::npos) return {request, {}};
  return {request.substr(0, nul), request.substr(nul + 1)};
}

bool SendAttempt(int sock, std::string request, int stdin_fd, int log_fd) {
  AttemptMessage m(request.data(), request.size());
  int fds[2] = {stdin_fd, log_fd};
  std::memcpy(m.fds(), fds, sizeof fds);
  return ::sendmsg(sock, m.msg(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
}

// A shim forked before its attempt exists, waiting for it: taking one off the shelf puts neither a
// fork nor the new process's first page faults on the path from admission to the workload.
struct Spare {
  int pid = 0;
  uint64_t start_time = 0;
  UniqueFd sock;  // the zygote's end of the spare's request socket
};

// The spare's side of SendAttempt. False when the zygote closed the socket instead.
bool ReceiveAttempt(int sock, std::string* request, int fds[2]) {
  std::string buf(kMaxRequestBytes, '\0');
  AttemptMessage m(buf.data(), buf.size());
  ssize_t n;
  while ((n = ::recvmsg(sock, m.msg(), MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  const int* received = n > 0 ? m.fds() : nullptr;
  if (received == nullptr) return false;
  std::memcpy(fds, received, sizeof(int[2]));
  request->assign(buf.data(), static_cast<size_t>(n));
  // Taken: the zygote hands this attempt to no one else (see HandToSpare).
  const char ack = 1;
  return ::send(sock, &ack, 1, MSG_NOSIGNAL) == 1;
}

// How long the zygote waits for a spare to say it took an attempt before it gives up on it: well
// inside the server's wait for the zygote (kAnswerTimeoutMs), which must still see the fresh fork.
constexpr int kSpareAckTimeoutMs = 1'000;
static_assert(kSpareAckTimeoutMs < kAnswerTimeoutMs);

// Gives the attempt to the spare; true once the spare said it took it. A spare that is dead (killed
// while it waited) may still accept the message, so a sent message is not enough: only its answer
// proves it alive. One that does not answer is killed, so that the attempt runs once at most.
bool HandToSpare(const Spare& spare, const std::string& request, int stdin_fd, int log_fd) {
  if (!SendAttempt(spare.sock.get(), request, stdin_fd, log_fd)) return false;
  pollfd p{spare.sock.get(), POLLIN, 0};
  int ready;
  while ((ready = ::poll(&p, 1, kSpareAckTimeoutMs)) < 0 && errno == EINTR) {
  }
  char ack = 0;
  if (ready == 1 && ::recv(spare.sock.get(), &ack, 1, MSG_DONTWAIT) == 1 && ack == 1) return true;
  // Dead before the fresh fork starts, so that the two never run the attempt side by side.
  ::kill(spare.pid, SIGKILL);
  ::waitpid(spare.pid, nullptr, 0);
  return false;
}

char* g_role_arg = nullptr;  // the zygote's argv[1], rewritten in each shim it forks

// In a forked child: becomes the same process an exec'd `tau __shim DIR` would be (own session,
// default signal dispositions, the shim's signal mask, no descriptor but its stdin and its
// stdout/stderr), waits on `request_sock` for its attempt when it is a spare, runs the
// shim, and exits without returning into the zygote's loop.
[[noreturn]] void BecomeShim(int request_sock, std::string request, int stdin_fd, int log_fd) {
  ::setsid();
  if (g_role_arg != nullptr) {
    // "__zygote" becomes "__shim" in /proc/PID/cmdline (same memory, padded with NULs), and the
    // name `top` and `pgrep` show becomes tau-shim.
    const size_t room = std::strlen(g_role_arg);
    std::memset(g_role_arg, 0, room);
    std::memcpy(g_role_arg, "__shim", std::min<size_t>(room, 6));
    ::prctl(PR_SET_NAME, "tau-shim");
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);
  }
  sigset_t mask = internal::ShimSignalMask();
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  if (request_sock >= 0) {
    // A spare holds nothing of the zygote's while it waits, the server's socket least of all: a
    // zygote that dies must look dead to the server.
    ::dup2(request_sock, 3);
    ::closefrom(4);
    int fds[2];
    if (!ReceiveAttempt(3, &request, fds)) ::_exit(0);  // retired: the zygote is gone
    stdin_fd = fds[0];
    log_fd = fds[1];
  }
  ::dup2(stdin_fd, 0);
  ::dup2(log_fd, 1);
  ::dup2(log_fd, 2);
  ::closefrom(3);
  auto [attempt_dir, config] = SplitRequest(request);
  int code = ShimMain(std::string(attempt_dir), std::string(config));
  std::fflush(nullptr);
  ::_exit(code);
}

std::optional<Spare> ForkSpare() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return std::nullopt;
  UniqueFd ours(pair[0]), theirs(pair[1]);
  pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) BecomeShim(theirs.get(), "", -1, -1);
  std::optional<internal::ProcStat> st = internal::ReadProcStat(pid);
  return Spare{pid, st ? st->start_time : 0, std::move(ours)};
}

ZygoteReply StartShim(const std::string& request, std::optional<Spare>* spare) {
  ZygoteReply reply;
  const std::string attempt_dir(SplitRequest(request).first);
  // A directory that is not there is the caller's mistake, said now rather than by a shim that
  // cannot take its lock.
  struct stat dir;
  if (::stat(attempt_dir.c_str(), &dir) != 0) {
    reply.err = errno;
    return reply;
  }
  if (!S_ISDIR(dir.st_mode)) {
    reply.err = ENOTDIR;
    return reply;
  }
  // The shim writes its own log (shim.log, when it has something to say); what else reaches its
  // standard output or error (a crash message) goes where the zygote's goes: the server's log.
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull.valid()) {
    reply.err = errno;
    return reply;
  }
  const int log = STDERR_FILENO;
  if (spare->has_value()) {
    std::optional<Spare> taken = std::move(*spare);
    spare->reset();
    // A spare that is gone (someone killed it) does not take the attempt; a fresh fork does.
    if (HandToSpare(*taken, request, devnull.get(), log)) {
      reply.pid = taken->pid;
      reply.start_time = taken->start_time;
      return reply;
    }
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    reply.err = errno;
    return reply;
  }
  if (pid == 0) BecomeShim(-1, request, devnull.get(), log);
  reply.pid = pid;
  // Not reaped yet (that waits for SIGCHLD), so even a shim that already exited has a stat.
  std::optional<internal::ProcStat> st = internal::ReadProcStat(pid);
  if (st) reply.start_time = st->start_time;
  return reply;
}

}  // namespace

int ZygoteMain(char* role_arg) {
  g_role_arg = role_arg;
  const int sock = 0;  // the server's end of the request socket
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  UniqueFd sigfd(::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) {
    std::perror("tau __zygote: signalfd");
    return 1;
  }
  std::optional<Spare> spare = ForkSpare();
  std::string request(kMaxRequestBytes, '\0');
  while (true) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {sigfd.get(), POLLIN, 0}};
    int ready = ::poll(fds, 2, spare ? -1 : kRefillDelayMs);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (ready == 0) {
      spare = ForkSpare();
      continue;
    }
    if (fds[1].revents != 0) {
      signalfd_siginfo info;
      while (::read(sigfd.get(), &info, sizeof info) > 0) {
      }
      // A spare reaped here is dead: forget it now, rather than rely on a message to it failing
      // (it need not, while another process still holds its end of the socket).
      for (pid_t reaped; (reaped = ::waitpid(-1, nullptr, WNOHANG)) > 0;)
        if (spare && spare->pid == reaped) spare.reset();
    }
    if (fds[0].revents == 0) continue;
    ssize_t n = ::recv(sock, request.data(), request.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;  // the server is gone; so is the spare, once its socket closes
    ZygoteReply reply = StartShim(request.substr(0, static_cast<size_t>(n)), &spare);
    if (::send(sock, &reply, sizeof reply, MSG_NOSIGNAL) != sizeof reply) return 0;
  }
}

Result<std::unique_ptr<Zygote>> Zygote::Start(const std::string& tau_binary) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    return IoError("socketpair", errno);
  UniqueFd ours(pair[0]), theirs(pair[1]);
  UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull.valid()) return IoError("cannot open /dev/null", errno);

  // Own session, like the shims it forks: a Ctrl-C at the server's terminal does not reach it.
  sigset_t none;
  sigemptyset(&none);
  pid_t pid = 0;
  // Its standard error is the server's (the server's log), and so is that of the shims it forks.
  int rc = internal::SpawnDetached({tau_binary, "__zygote"},
                                   {theirs.get(), devnull.get(), internal::StderrOr(devnull.get())},
                                   none, &pid);
  if (rc != 0) return IoError("cannot start the zygote " + tau_binary, rc);
  return std::unique_ptr<Zygote>(new Zygote(pid, ours.Release()));
}

Zygote::~Zygote() {
  ::close(sock_);  // the zygote sees EOF and exits; the shims it forked keep running
  MutexLock lock(&mu_);
  if (!broken_) ::waitpid(pid_, nullptr, 0);  // a broken one was reaped already
}

bool Zygote::broken() {
  MutexLock lock(&mu_);
  return broken_;
}

Status Zygote::Broken(const std::string& what, int err) {
  broken_ = true;
  in_flight_ = 0;  // the answers still owed will never come
  Status gone = Unavailable("the zygote (pid " + std::to_string(pid_) + ") " + what + ": " +
                            std::strerror(err));
  // Dead or stuck, it is of no more use: make sure it is gone, and reap it rather than leave a
  // zombie for the server's lifetime. Said once in the server's log, since every later attempt
  // pays for an exec.
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  std::fprintf(stderr, "tau: %s; shims are exec'd until another zygote starts\n",
               gone.message().c_str());
  return gone;
}

Status Zygote::Send(const std::string& attempt_dir, std::string_view config) {
  MutexLock lock(&mu_);
  if (broken_) return Unavailable("the zygote is gone");
  if (config.size() > kMaxInlineConfigBytes)
    return ResourceExhausted("the attempt's config is too large to send inline");
  std::string request = attempt_dir;
  if (!config.empty()) request.append(1, '\0').append(config);
  // Requests wait in the socket while the zygote forks: a zygote that stopped reading must not
  // hold the caller either, so the send waits for room at most as long as an answer.
  const int64_t deadline = MonotonicMillis() + kAnswerTimeoutMs;
  while (::send(sock_, request.data(), request.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
         static_cast<ssize_t>(request.size())) {
    const int err = errno;
    if (err == EINTR) continue;
    // The socket's buffer cannot hold one message this large: the caller writes the file instead.
    if (err == EMSGSIZE && !config.empty())
      return ResourceExhausted("the attempt's config is too large to send inline");
    const int64_t left = deadline - MonotonicMillis();
    if (err != EAGAIN) return Broken("took no request", err);
    if (left <= 0)
      return Broken("took no request within " + std::to_string(kAnswerTimeoutMs / 1000) + " s",
                    ETIMEDOUT);
    pollfd pfd{sock_, POLLOUT, 0};
    ::poll(&pfd, 1, static_cast<int>(left));
  }
  ++in_flight_;
  return Status::Ok();
}

Result<ProcessId> Zygote::Receive(const std::string& attempt_dir) {
  MutexLock lock(&mu_);
  if (broken_ || in_flight_ == 0) return Unavailable("the zygote is gone");
  // A fork takes milliseconds; a zygote that is stopped or stuck must not hold the caller (the
  // server's decision loop) for long. If it was merely slow and its shim starts after all, the
  // supervisor lock keeps the attempt to one shim, and the server follows whichever holds it.
  pollfd pfd{sock_, POLLIN, 0};
  int ready;
  while ((ready = ::poll(&pfd, 1, kAnswerTimeoutMs)) < 0 && errno == EINTR) {
  }
  if (ready <= 0)
    return Broken("did not answer within " + std::to_string(kAnswerTimeoutMs / 1000) + " s",
                  ready < 0 ? errno : ETIMEDOUT);
  ZygoteReply reply;
  ssize_t n = ::recv(sock_, &reply, sizeof reply, 0);
  if (n != sizeof reply) return Broken("did not answer", n < 0 ? errno : EPIPE);
  --in_flight_;
  if (reply.err != 0) return IoError("cannot start the shim in " + attempt_dir, reply.err);
  return ProcessId{reply.pid, reply.start_time};
}

Result<ProcessId> Zygote::StartShim(const std::string& attempt_dir, std::string_view config) {
  TAU_RETURN_IF_ERROR(Send(attempt_dir, config));
  return Receive(attempt_dir);
}

}  // namespace tau::runtime
