// The shim (`tau __shim DIR`): supervises one attempt. Its one other thread is the log pump
// (log_pump.h), so the code between fork and exec in its children makes only plain system calls;
// everything it learns goes to files in the attempt directory.
//
//   setup     the run's code tree, venv + pip (cached, flock-guarded), resolve every worker's
//   argv[0] start     fork all workers into one process group, hold them at a barrier, release them
//   together supervise first failure / stop request / deadline -> SIGTERM the group, SIGKILL after
//   the grace period cleanup   kill and reap every descendant (the shim is a child subreaper),
//   write result.json
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/strings.h"
#include "common/users.h"
#include "runtime/log_pump.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

using internal::UniqueFd;
using internal::WriteAll;
using json = nlohmann::json;

constexpr char kDefaultPath[] = "/usr/local/bin:/usr/bin:/bin";

// argv/envp for execve, built before fork so the child only passes pointers along.
class CStrings {
 public:
  explicit CStrings(std::vector<std::string> strings) : strings_(std::move(strings)) {
    for (std::string& s : strings_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
  }
  static CStrings FromEnv(const EnvList& env) {
    std::vector<std::string> out;
    for (const auto& [name, value] : env) out.push_back(name + "=" + value);
    return CStrings(std::move(out));
  }
  char* const* get() const { return ptrs_.data(); }
  CStrings(CStrings&&) = default;

 private:
  std::vector<std::string> strings_;
  std::vector<char*> ptrs_;
};

std::string EnvGet(const EnvList& env, const std::string& name, const std::string& fallback = "") {
  for (const auto& [key, value] : env) {
    if (key == name) return value;
  }
  return fallback;
}

void EnvSet(EnvList& env, const std::string& name, const std::string& value) {
  for (auto& [key, old] : env) {
    if (key == name) {
      old = value;
      return;
    }
  }
  env.emplace_back(name, value);
}

// Like execvp's search, done in the shim so a missing program is a setup error with a clear message
// rather than an exec failure in a child; for the user the program runs as (the shim may be root,
// who may execute what they may not), or the shim's own. `why`, when the search fails for a
// run's user, says what was found and why it is not theirs.
std::optional<std::string> FindOnPath(const std::string& program, const EnvList& env,
                                      const AttemptConfig::RunAs* run_as,
                                      std::string* why = nullptr) {
  if (program.find('/') != std::string::npos) return program;
  const std::string dirs = EnvGet(env, "PATH", kDefaultPath);
  if (run_as != nullptr) {
    SystemUser user{run_as->user, run_as->uid, run_as->gid, run_as->groups, {}};
    user.gids.push_back(run_as->gid);
    auto found = FindExecutableFor(program, dirs, user);
    if (found.ok()) return *found;
    if (why != nullptr) *why = found.status().message();
    return std::nullopt;
  }
  for (const std::string& dir : Split(dirs, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + program;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return std::nullopt;
}

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// What a child reports through the CLOEXEC error pipe when it cannot reach exec (or exec fails).
struct ChildError {
  int rank;
  int step;  // ChildStep
  int err;
};
enum ChildStep {
  kStepSetpgid,
  kStepCgroup,
  kStepStdio,
  kStepChdir,
  kStepBarrier,
  kStepExec,
  kStepCredentials,
  kStepReadOnly,
  kStepPrivateMounts
};

const char* ChildStepName(int step) {
  switch (step) {
    case kStepSetpgid:
      return "join the process group";
    case kStepCgroup:
      return "join the attempt's cgroup";
    case kStepStdio:
      return "redirect output";
    case kStepChdir:
      return "enter the working directory";
    case kStepBarrier:
      return "wait for the gang";
    case kStepCredentials:
      return "switch to the submitting user";
    case kStepReadOnly:
      return "mount the upstream stages' files read-only";
    case kStepPrivateMounts:
      return "enter the attempt's private /tmp and /dev/shm";
    default:
      return "execute";
  }
}

// Everything a forked child needs, prepared by the parent.
struct ChildPlan {
  int rank = 0;
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const char* cwd = nullptr;  // nullptr: stay
  pid_t pgid = 0;             // 0: lead a new process group
  pid_t parent = 0;
  int stdin_fd = -1, out_fd = -1;
  int barrier_fd = -1;  // read one byte before exec; EOF means "do not start"
  int cgroup_procs_fd = -1;
  int error_fd = -1;                             // CLOEXEC write end; closed by a successful exec
  const AttemptConfig::RunAs* run_as = nullptr;  // nullptr: keep the shim's user
  // Paths bind-mounted read-only over themselves in a mount namespace of the child's own
  // (null-terminated; nullptr: none).
  char* const* read_only = nullptr;
  // The attempt's mount namespace (its private /tmp and /dev/shm), entered first; -1: none.
  int mount_ns_fd = -1;
};

[[noreturn]] void ChildFail(const ChildPlan& p, int step) {
  ChildError e{p.rank, step, errno};
  [[maybe_unused]] ssize_t n = ::write(p.error_fd, &e, sizeof e);
  ::_exit(127);
}

// Runs in the child between fork (or vfork) and exec. Only plain system calls: a vfork child runs
// on the shim's memory until it execs.
[[noreturn]] void RunChild(const ChildPlan& p) {
  if (::setpgid(0, p.pgid) != 0) ChildFail(p, kStepSetpgid);
  // The workers must not outlive a shim that is SIGKILLed; checking the parent after the prctl
  // closes the window where the shim died before it was armed.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != p.parent) ::_exit(127);
  if (p.cgroup_procs_fd >= 0 && ::write(p.cgroup_procs_fd, "0", 1) != 1) ChildFail(p, kStepCgroup);
  // Before the credentials change: only root may make a mount namespace. Mounts made in it
  // propagate nowhere (private), so the rest of the machine keeps its view.
  if (p.mount_ns_fd >= 0 && ::setns(p.mount_ns_fd, CLONE_NEWNS) != 0)
    ChildFail(p, kStepPrivateMounts);
  // What a worker creates is its own: files it leaves in a shared place (a /tmp that is not
  // private, a storage volume) are not readable by other users unless it says so.
  ::umask(077);
  if (p.read_only != nullptr) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      ChildFail(p, kStepReadOnly);
    for (char* const* path = p.read_only; *path != nullptr; ++path)
      if (::mount(*path, *path, nullptr, MS_BIND | MS_REC, nullptr) != 0 ||
          ::mount(nullptr, *path, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
        ChildFail(p, kStepReadOnly);
  }
  if (::dup2(p.stdin_fd, 0) < 0 || ::dup2(p.out_fd, 1) < 0 || ::dup2(p.out_fd, 2) < 0) {
    ChildFail(p, kStepStdio);
  }
  // Groups first, then the gid, then the uid: after setuid the others can no longer change. The
  // raw system calls: glibc's wrappers may coordinate with other threads of the process, whose
  // memory a vfork child shares.
  if (p.run_as != nullptr) {
    static_assert(std::is_same_v<gid_t, uint32_t>, "RunAs keeps gids as uint32_t");
    if (::syscall(SYS_setgroups, p.run_as->groups.size(), p.run_as->groups.data()) != 0 ||
        ::syscall(SYS_setgid, p.run_as->gid) != 0 || ::syscall(SYS_setuid, p.run_as->uid) != 0)
      ChildFail(p, kStepCredentials);
  }
  if (p.cwd != nullptr && ::chdir(p.cwd) != 0) ChildFail(p, kStepChdir);
  if (p.barrier_fd >= 0) {
    char go = 0;
    ssize_t n;
    do {
      n = ::read(p.barrier_fd, &go, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) ::_exit(127);  // the shim gave up on the gang
  }
  // The shim blocks and ignores signals for its own use; a worker starts with the defaults.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(p.path, p.argv, p.envp);
  ChildFail(p, kStepExec);
}

// Starts the child that runs `plan`; returns its pid (or -1 and errno) in the parent only. With
// `share_memory` (vfork) the parent waits until the child has exec'd or failed: for a worker that
// waits at no barrier. Apart from its caller so that no variable of the caller lives across vfork.
pid_t StartChild(const ChildPlan& plan, bool share_memory) {
  pid_t pid = share_memory ? ::vfork() : ::fork();
  if (pid == 0) RunChild(plan);
  return pid;
}

// The attempt's cgroup v2 directory, when the machine lets us have one.
class Cgroup {
 public:
  // Returns nullopt and sets `why` when cgroup v2 with the memory controller is not delegated to
  // us.
  static std::optional<Cgroup> Create(const std::string& name, std::string* why) {
    auto controllers = ReadFile("/sys/fs/cgroup/cgroup.controllers");
    auto self = ReadFile("/proc/self/cgroup");
    if (!controllers.ok() || !self.ok()) {
      *why = "cgroup v2 not available";
      return std::nullopt;
    }
    std::string relative;
    for (const std::string& line : Split(*self, '\n')) {
      if (StartsWith(line, "0::")) relative = line.substr(3);
    }
    std::string parent = "/sys/fs/cgroup" + (relative == "/" ? std::string() : relative);
    auto subtree = ReadFile(parent + "/cgroup.subtree_control");
    if (relative.empty() || !subtree.ok() || subtree->find("memory") == std::string::npos) {
      *why = "cgroup v2 not available";
      return std::nullopt;
    }
    Cgroup cg;
    cg.dir_ = parent + "/" + name;
    if (::mkdir(cg.dir_.c_str(), 0755) != 0 && errno != EEXIST) {
      *why = "cannot create " + cg.dir_ + ": " + std::strerror(errno);
      return std::nullopt;
    }
    cg.procs_ = UniqueFd(::open((cg.dir_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!cg.procs_.valid()) {
      *why = "cannot open " + cg.dir_ + "/cgroup.procs: " + std::strerror(errno);
      ::rmdir(cg.dir_.c_str());
      return std::nullopt;
    }
    return cg;
  }

  Status SetLimits(const std::optional<int64_t>& memory_bytes,
                   const std::optional<int64_t>& cpu_milli) {
    if (memory_bytes) {
      TAU_RETURN_IF_ERROR(Write("memory.max", std::to_string(*memory_bytes)));
      // Without this the limit only pushes the attempt into swap instead of an OOM kill we can
      // report.
      (void)Write("memory.swap.max", "0");
    }
    if (cpu_milli) {
      constexpr int64_t kPeriodUs = 100'000;
      int64_t quota = std::max<int64_t>(1000, *cpu_milli * kPeriodUs / 1000);
      TAU_RETURN_IF_ERROR(
          Write("cpu.max", std::to_string(quota) + " " + std::to_string(kPeriodUs)));
    }
    return Status::Ok();
  }

  int procs_fd() const { return procs_.get(); }

  bool OomKilled() const {
    auto events = ReadFile(dir_ + "/memory.events");
    if (!events.ok()) return false;
    for (const std::string& line : Split(*events, '\n')) {
      if (StartsWith(line, "oom_kill ")) return line.substr(9) != "0";
    }
    return false;
  }

  // Kills whatever is left in the cgroup, including processes that left the attempt's process
  // group.
  void KillAll() {
    if (Write("cgroup.kill", "1").ok()) return;
    auto procs = ReadFile(dir_ + "/cgroup.procs");
    if (!procs.ok()) return;
    for (const std::string& line : Split(*procs, '\n')) {
      int pid = 0;
      auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), pid);
      if (ec == std::errc() && pid > 0) ::kill(pid, SIGKILL);
    }
  }

  void Remove() {
    procs_.Reset();
    // The kernel removes a cgroup only once its last process is gone, which trails SIGKILL a
    // little.
    for (int i = 0; i < 50 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(20'000);
  }

 private:
  Status Write(const std::string& file, const std::string& value) {
    std::string path = dir_ + "/" + file;
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return IoError("cannot open " + path, errno);
    if (::write(fd.get(), value.data(), value.size()) < 0)
      return IoError("cannot write " + path, errno);
    return Status::Ok();
  }

  std::string dir_;
  UniqueFd procs_;
};

struct Worker {
  int rank = 0;
  pid_t pid = 0;
  uint64_t start_time = 0;
  bool done = false;
  int status = 0;  // waitpid status
};

bool ExitedCleanly(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Why setup did not finish: a failure (kSetupFailed) or an interruption (kStopped / kTimedOut).
struct SetupError {
  OutcomeKind kind;
  std::string message;
};

class Shim {
 public:
  Shim(std::string dir, std::string config)
      : dir_(std::move(dir)), config_text_(std::move(config)) {}

  int Run() {
    outcome_.started_ms = NowMillis();
    if (Status locked = TakeSupervisorLock(); !locked.ok()) {
      // Another supervisor owns this attempt: leave its files alone.
      Log("not starting: " + locked.ToString());
      return 1;
    }
    Status init = Init();
    if (!init.ok()) {
      Log("cannot start: " + init.ToString());
      return Finish(OutcomeKind::kSetupFailed, init.message());
    }
    if (auto err = Setup()) {
      Cleanup();
      return Finish(err->kind, err->message);
    }
    if (auto err = StartGang()) {
      Cleanup();
      return Finish(err->kind, err->message);
    }
    Supervise();
    Cleanup();
    return Finish(outcome_.kind, outcome_.message);
  }

  // Whether the attempt needs the machine's /tmp: its home, code, caches or directories are there
  // (tau's own tests keep TAU_HOME there), so a private /tmp would hide them.
  bool NeedsSharedTmp() const {
    auto under_tmp = [](const std::string& path) {
      return path == "/tmp" || StartsWith(path, "/tmp/");
    };
    char real[PATH_MAX];
    if (::realpath(dir_.c_str(), real) == nullptr || under_tmp(real) || under_tmp(dir_))
      return true;
    if (under_tmp(config_.work_dir) || under_tmp(config_.venv_cache_dir)) return true;
    if (config_.code && under_tmp(config_.code->root)) return true;
    for (const std::string& path : config_.read_only)
      if (under_tmp(path)) return true;
    for (const WorkerLaunch& w : config_.workers)
      for (const auto& [name, value] : w.env)
        if (StartsWith(name, "TAU_") && under_tmp(value)) return true;
    return false;
  }

  // Where the shim is root and the workers another user: a mount namespace for the attempt, which
  // every worker and setup command enters before it drops to that user, with a /dev/shm of its own
  // (a new tmpfs, the user's, mode 0700) and a /tmp of its own (DIR/tmp bound over it, unless the
  // attempt needs the machine's /tmp: NeedsSharedTmp). The ranks share them; other users' processes
  // never see them, and they go with the attempt's last process. A helper process makes the
  // namespace (unshare would move only the calling thread of this one) and the shim keeps a
  // descriptor of it, which keeps it alive.
  Status MakePrivateMounts() {
    if (!config_.run_as || ::geteuid() != 0) return Status::Ok();
    const uint32_t uid = config_.run_as->uid, gid = config_.run_as->gid;
    const bool own_tmp = !NeedsSharedTmp();
    const std::string tmp = dir_ + "/tmp";
    if (own_tmp) {
      if (::mkdir(tmp.c_str(), 0700) != 0 && errno != EEXIST) return IoError("mkdir " + tmp, errno);
      UniqueFd fd(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid() || ::fchown(fd.get(), uid, gid) != 0 || ::fchmod(fd.get(), 0700) != 0)
        return IoError("preparing " + tmp, errno);
    }
    struct stat st;
    const bool own_shm = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode);
    if (!own_tmp && !own_shm) return Status::Ok();
    const std::string shm_options = fmt::format("mode=0700,uid={},gid={}", uid, gid);
    int report[2], hold[2];
    if (::pipe2(report, O_CLOEXEC) != 0) return IoError("pipe", errno);
    UniqueFd report_read(report[0]), report_write(report[1]);
    if (::pipe2(hold, O_CLOEXEC) != 0) return IoError("pipe", errno);
    UniqueFd hold_read(hold[0]), hold_write(hold[1]);
    pid_t pid = ::fork();
    if (pid < 0) return IoError("fork", errno);
    if (pid == 0) {
      // Only system calls: the shim has other threads. Its own copy of the hold pipe's write end
      // would keep it from ever seeing the shim close its end.
      ::close(hold[1]);
      ::close(report[0]);
      int err = 0;
      if (::unshare(CLONE_NEWNS) != 0 ||
          ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        err = errno;
      if (err == 0 && own_shm &&
          ::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, shm_options.c_str()) != 0)
        err = errno;
      if (err == 0 && own_tmp && ::mount(tmp.c_str(), "/tmp", nullptr, MS_BIND, nullptr) != 0)
        err = errno;
      [[maybe_unused]] ssize_t n = ::write(report[1], &err, sizeof err);
      char byte;
      while (::read(hold[0], &byte, 1) < 0 && errno == EINTR) {
      }
      ::_exit(0);
    }
    report_write.Reset();
    int err = -1;
    ssize_t n;
    do {
      n = ::read(report_read.get(), &err, sizeof err);
    } while (n < 0 && errno == EINTR);
    if (n == sizeof err && err == 0)
      mount_ns_ = UniqueFd(
          ::open(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
    const int open_err = errno;
    hold_write.Reset();  // the helper exits; the descriptor keeps its namespace
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    if (n != sizeof err) return Internal("the helper that makes the mount namespace died");
    if (err != 0) return IoError("cannot make the attempt's mounts", err);
    if (!mount_ns_.valid()) return IoError("cannot keep the attempt's mount namespace", open_err);
    return Status::Ok();
  }

 private:
  // ---- init ----

  Status TakeSupervisorLock() {
    // The supervisor lock: held for the shim's whole life (the kernel drops it when the shim dies),
    // so the server can tell a live supervisor of this attempt from a dead one even when it never
    // learnt its pid.
    lock_ = UniqueFd(
        ::open((dir_ + "/" + kSupervisorLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!lock_.valid()) return IoError("cannot open the supervisor lock", errno);
    // A server probing the lock holds it shared for an instant; only a lock that stays taken means
    // another supervisor.
    int tries = 0;
    while (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
      if (++tries == 20) return FailedPrecondition("another supervisor already runs this attempt");
      ::usleep(5'000);
    }
    std::string me = std::to_string(::getpid()) + " " +
                     std::to_string(ProcessStartTime(::getpid()).value_or(0)) + "\n";
    if (::pwrite(lock_.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
      return IoError("cannot write the supervisor lock", errno);
    return Status::Ok();
  }

  Status Init() {
    // Blocked signals are delivered through the signalfd, so a stop request is an ordinary event in
    // the loops below; SIGCHLD wakes them when a child exits.
    sigset_t mask;
    sigemptyset(&mask);
    for (int sig : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&mask, sig);
    if (::sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) return IoError("sigprocmask", errno);
    sigfd_ = UniqueFd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!sigfd_.valid()) return IoError("signalfd", errno);
    ::signal(SIGPIPE, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    // Orphaned grandchildren are re-parented to us, so we can kill and reap all of them at the end.
    if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return IoError("PR_SET_CHILD_SUBREAPER", errno);

    // Handed over in memory by the zygote, or written beside us for an exec'd shim.
    const bool inline_config = !config_text_.empty();
    if (!inline_config) {
      TAU_ASSIGN_OR_RETURN(config_text_, ReadFile(dir_ + "/config.json"));
    }
    json j = json::parse(config_text_, nullptr, /*allow_exceptions=*/false);
    config_text_.clear();
    if (j.is_discarded())
      return InvalidArgument(inline_config ? "the attempt's config is not valid JSON"
                                           : dir_ + "/config.json is not valid JSON");
    TAU_ASSIGN_OR_RETURN(config_, AttemptConfig::FromJson(j));
    if (config_.workers.empty()) return InvalidArgument("config.json lists no workers");
    if (config_.max_runtime_ms) deadline_ = MonotonicMillis() + *config_.max_runtime_ms;

    TAU_RETURN_IF_ERROR(MakeDirs(dir_ + "/logs"));
    devnull_ = UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!devnull_.valid()) return IoError("cannot open /dev/null", errno);
    // Every byte a worker (or setup, or the shim itself) writes for a rank's log goes through the
    // pump: masked, capped, and never blocking the writer on the disk.
    TAU_ASSIGN_OR_RETURN(pump_, internal::LogPump::Create(dir_, config_.workers.size(),
                                                          config_.max_log_bytes, config_.mask));
    config_.mask.clear();
    pump_->Start();
    // Only a setup that takes time (pip) is worth a file: state.json's readers need the workers,
    // which come later, and creating a file costs a noticeable share of a trivial attempt.
    if (config_.pip.empty()) return Status::Ok();
    return WriteState(json{{"phase", "setup"}, {"shim_pid", ::getpid()}});
  }

  // ---- events ----

  // Waits up to `timeout_ms` (-1: no limit) for a signal, but never past a deadline still ahead;
  // records stop requests. Returns early on SIGCHLD so callers can reap.
  void WaitForEvent(int64_t timeout_ms) {
    const int64_t left = deadline_ - MonotonicMillis();
    if (deadline_ >= 0 && left > 0) timeout_ms = timeout_ms < 0 ? left : std::min(timeout_ms, left);
    pollfd pfd{sigfd_.get(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(timeout_ms, 1 << 30)));
    if (rc <= 0) return;
    signalfd_siginfo info;
    while (::read(sigfd_.get(), &info, sizeof info) == sizeof info) {
      if (info.ssi_signo == SIGTERM || info.ssi_signo == SIGINT) stop_requested_ = true;
    }
  }

  // kStopped / kTimedOut when the attempt must end now, whatever phase it is in.
  std::optional<OutcomeKind> Interrupted() const {
    if (stop_requested_) return OutcomeKind::kStopped;
    if (deadline_ >= 0 && MonotonicMillis() >= deadline_) return OutcomeKind::kTimedOut;
    return std::nullopt;
  }

  std::string InterruptMessage(OutcomeKind kind, const std::string& phase) const {
    if (kind == OutcomeKind::kStopped) return "stopped on request during " + phase;
    return "max runtime " + FormatDuration(*config_.max_runtime_ms) + " exceeded during " + phase;
  }

  // ---- setup ----

  std::optional<SetupError> Setup() {
    if (Status s = MakeCodeTree(); !s.ok())
      return SetupError{OutcomeKind::kSetupFailed, "the run's code: " + s.message()};
    // A machine that lets root make no mount namespace (a container without CAP_SYS_ADMIN) still
    // runs the attempt, and its log says what it lacks.
    if (Status s = MakePrivateMounts(); !s.ok())
      WriteAll(LogFd(0), "[tau] /tmp and /dev/shm are shared with the machine's other users: " +
                             s.message() + "\n");
    std::string venv;
    if (!config_.pip.empty()) {
      // The cache is the run user's, who may plant links in it: everything done there (the lock,
      // the marker, publishing, removing a stale build) is done as that user.
      std::optional<ActingAsUser> as_user;
      if (const AttemptConfig::RunAs* ids = RunAs())
        as_user.emplace(ids->uid, ids->gid, ids->groups);
      auto built = EnsureVenv();
      as_user.reset();
      if (std::holds_alternative<SetupError>(built)) return std::get<SetupError>(built);
      venv = std::get<std::string>(built);
    }
    for (size_t rank = 0; rank < config_.workers.size(); ++rank) {
      WorkerLaunch& w = config_.workers[rank];
      // What finds the attempt's processes if this supervisor dies (KillOrphanedWorkers).
      EnvSet(w.env, internal::kAttemptMarker, config_.attempt_dir);
      if (!venv.empty()) {
        EnvSet(w.env, "VIRTUAL_ENV", venv);
        EnvSet(w.env, "PATH", venv + "/bin:" + EnvGet(w.env, "PATH", kDefaultPath));
        std::erase_if(w.env, [](const auto& kv) { return kv.first == "PYTHONHOME"; });
      }
      if (w.argv.empty()) return SetupError{OutcomeKind::kSetupFailed, "worker has an empty argv"};
      std::string why;
      std::optional<std::string> path = FindOnPath(w.argv[0], w.env, RunAs(), &why);
      if (!path)
        return SetupError{OutcomeKind::kSetupFailed,
                          why.empty() ? NotFoundMessage(rank, w.argv[0])
                                      : "worker " + std::to_string(rank) + ": " + why};
      resolved_.push_back(*path);
    }
    if (!config_.work_dir.empty()) {
      struct stat st;
      if (::stat(config_.work_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return SetupError{OutcomeKind::kSetupFailed,
                          "working directory " + config_.work_dir + " does not exist"};
      }
    }
    return std::nullopt;
  }

  Status MakeCodeTree() {
    if (!config_.code) return Status::Ok();
    const AttemptConfig::Code& code = *config_.code;
    if (!PathExists(code.root))
      TAU_RETURN_IF_ERROR(CloneTree(code.snapshot, code.root,
                                    code.copy ? TreeFiles::kCopy : TreeFiles::kLinkReadOnly));
    if (!config_.run_as) {
      // The spec's folder holds no file when .tauignore leaves the spec out.
      if (!config_.work_dir.empty()) TAU_RETURN_IF_ERROR(MakeDirs(config_.work_dir));
      return Status::Ok();
    }
    // What the run writes is its user's, and no one else's. A retried attempt finds the tree as
    // the last one left it, the user's to change while this runs: handed over by descriptors
    // (ChownTree), and the spec's folder made as that user.
    TAU_RETURN_IF_ERROR(ChownTree(code.root, config_.run_as->uid, config_.run_as->gid));
    if (::chmod(code.root.c_str(), 0700) != 0) return IoError("chmod " + code.root, errno);
    if (!config_.work_dir.empty()) {
      ActingAsUser as_user(config_.run_as->uid, config_.run_as->gid, config_.run_as->groups);
      TAU_RETURN_IF_ERROR(MakeDirs(config_.work_dir));
    }
    return Status::Ok();
  }

  const AttemptConfig::RunAs* RunAs() const { return config_.run_as ? &*config_.run_as : nullptr; }

  static std::string NotFoundMessage(size_t rank, const std::string& program) {
    if (program == "torchrun") {
      return "torchrun not found on PATH: multi-GPU runs need PyTorch; add torch to runtime.pip";
    }
    return "worker " + std::to_string(rank) + ": command '" + program + "' not found on PATH";
  }

  // Runs a setup command (python3, pip) in its own process group with output to `out_fd` and cwd
  // work_dir, waiting for it while honouring stop requests and the deadline. Returns its wait
  // status.
  std::variant<int, SetupError> RunSetupCommand(const std::vector<std::string>& argv, int out_fd) {
    const EnvList& env = config_.workers[0].env;
    std::string why;
    std::optional<std::string> path = FindOnPath(argv[0], env, RunAs(), &why);
    if (!path)
      return SetupError{OutcomeKind::kSetupFailed,
                        why.empty() ? argv[0] + " not found on PATH" : why};
    CStrings c_argv(argv), c_env = CStrings::FromEnv(env);
    int err_pipe[2];
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      return SetupError{OutcomeKind::kSetupFailed, std::string("pipe: ") + std::strerror(errno)};
    }
    UniqueFd err_read(err_pipe[0]), err_write(err_pipe[1]);
    ChildPlan plan;
    plan.path = path->c_str();
    plan.argv = c_argv.get();
    plan.envp = c_env.get();
    plan.cwd = config_.work_dir.empty() ? nullptr : config_.work_dir.c_str();
    plan.parent = ::getpid();
    plan.stdin_fd = devnull_.get();
    plan.out_fd = out_fd;
    plan.error_fd = err_write.get();
    plan.run_as = config_.run_as ? &*config_.run_as : nullptr;
    plan.mount_ns_fd = mount_ns_.get();
    pid_t pid = ::fork();
    if (pid < 0)
      return SetupError{OutcomeKind::kSetupFailed, std::string("fork: ") + std::strerror(errno)};
    if (pid == 0) RunChild(plan);
    err_write.Reset();
    ChildError child_error{};
    bool exec_failed =
        ::read(err_read.get(), &child_error, sizeof child_error) == sizeof child_error;

    int64_t kill_at = -1;
    std::optional<OutcomeKind> interrupted;
    while (true) {
      int status = 0;
      pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        if (exec_failed) {
          return SetupError{OutcomeKind::kSetupFailed,
                            "cannot " + std::string(ChildStepName(child_error.step)) + " " + *path +
                                ": " + std::strerror(child_error.err)};
        }
        if (interrupted) return SetupError{*interrupted, InterruptMessage(*interrupted, "setup")};
        return status;
      }
      if (!interrupted && (interrupted = Interrupted())) {
        ::kill(-pid, SIGTERM);
        kill_at = MonotonicMillis() + config_.stop_grace_ms;
      }
      if (kill_at >= 0 && MonotonicMillis() >= kill_at) ::kill(-pid, SIGKILL);
      WaitForEvent(kill_at >= 0 ? std::max<int64_t>(1, kill_at - MonotonicMillis()) : -1);
    }
  }

  // Creates or reuses the virtualenv for the requirement set; returns its directory.
  std::variant<std::string, SetupError> EnsureVenv() {
    int log = LogFd(0);
    // The key: the sorted requirements and the interpreter that builds the venv.
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      return SetupError{OutcomeKind::kSetupFailed, std::string("pipe: ") + std::strerror(errno)};
    }
    UniqueFd version_read(out[0]), version_write(out[1]);
    auto version_run = RunSetupCommand({"python3", "--version"}, version_write.get());
    version_write.Reset();
    if (auto* err = std::get_if<SetupError>(&version_run)) {
      if (err->kind == OutcomeKind::kSetupFailed) {
        err->message = "runtime.pip needs python3 to build a virtualenv: " + err->message;
      }
      return *err;
    }
    if (!ExitedCleanly(std::get<int>(version_run))) {
      return SetupError{OutcomeKind::kSetupFailed, "python3 --version failed"};
    }
    char buf[256];
    ssize_t n = ::read(version_read.get(), buf, sizeof buf);
    std::string version(buf, n > 0 ? static_cast<size_t>(n) : 0);
    std::vector<std::string> sorted = config_.pip;
    std::sort(sorted.begin(), sorted.end());
    const std::string key = Sha256Hex(Join(sorted, "\n") + "\n--\n" + version).substr(0, 32);

    std::string cache =
        config_.venv_cache_dir.empty() ? dir_ + "/venv-cache" : config_.venv_cache_dir;
    if (Status s = MakeDirs(cache); !s.ok())
      return SetupError{OutcomeKind::kSetupFailed, s.message()};
    const std::string link = cache + "/" + key;
    UniqueFd lock(::open((link + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!lock.valid()) {
      return SetupError{OutcomeKind::kSetupFailed,
                        "cannot open " + link + ".lock: " + std::strerror(errno)};
    }
    if (auto err = AcquireLock(lock.get())) return *err;

    char target[4096];
    ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
    if (len > 0) {
      std::string dir = cache + "/" + std::string(target, static_cast<size_t>(len));
      if (PathExists(dir + "/tau-venv.json")) {
        WriteAll(log, "[tau] reusing cached virtualenv " + dir + "\n");
        return dir;
      }
    }
    return BuildVenv(cache, key, sorted);
  }

  // Blocks until we hold the flock, without becoming deaf to stop requests.
  std::optional<SetupError> AcquireLock(int fd) {
    bool told = false;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        return SetupError{OutcomeKind::kSetupFailed, std::string("flock: ") + std::strerror(errno)};
      }
      if (!told) {
        WriteAll(LogFd(0), "[tau] waiting for another attempt to build the same virtualenv\n");
        told = true;
      }
      if (auto kind = Interrupted()) return SetupError{*kind, InterruptMessage(*kind, "setup")};
      WaitForEvent(100);
    }
    return std::nullopt;
  }

  // Virtualenvs embed their own absolute path (pyvenv.cfg, the shebangs of bin/ scripts such as
  // torchrun), so one cannot be built elsewhere and renamed. It is built in a fresh directory that
  // never moves, and published by renaming a symlink into place: readers see no venv or a complete
  // one. Called with the lock held, so leftovers of a crashed build of this key can be removed.
  std::variant<std::string, SetupError> BuildVenv(const std::string& cache, const std::string& key,
                                                  const std::vector<std::string>& requirements) {
    int log = LogFd(0);
    RemoveStaleBuilds(cache, key);
    const std::string name = key + "-" + RandomHex(8);
    const std::string dir = cache + "/" + name;
    WriteAll(log, "[tau] creating virtualenv " + dir + " for " + Join(requirements, " ") + "\n");
    auto fail = [&](std::variant<int, SetupError> run,
                    const std::string& what) -> std::optional<SetupError> {
      if (auto* err = std::get_if<SetupError>(&run)) return *err;
      int status = std::get<int>(run);
      if (ExitedCleanly(status)) return std::nullopt;
      std::string how = WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                          : SignalName(WTERMSIG(status));
      return SetupError{OutcomeKind::kSetupFailed,
                        what + " failed (" + how + "); see logs/rank-0.log"};
    };
    std::optional<SetupError> err =
        fail(RunSetupCommand({"python3", "-m", "venv", dir}, log), "python3 -m venv");
    const std::string requirements_file = dir + "/tau-requirements.txt";
    if (!err) {
      Status s = WriteFileAtomic(requirements_file, Join(requirements, "\n") + "\n");
      if (!s.ok()) err = SetupError{OutcomeKind::kSetupFailed, s.message()};
    }
    if (!err) {
      err = fail(RunSetupCommand({dir + "/bin/python", "-m", "pip", "install",
                                  "--disable-pip-version-check", "-r", requirements_file},
                                 log),
                 "pip install");
    }
    if (!err) {
      json marker = {{"requirements", requirements}, {"built_ms", NowMillis()}};
      Status s = WriteFileAtomic(dir + "/tau-venv.json", internal::DumpJson(marker));
      if (s.ok()) s = PublishLink(cache + "/" + key, name);
      if (!s.ok()) err = SetupError{OutcomeKind::kSetupFailed, s.message()};
    }
    if (err) {
      (void)RemoveTree(dir);
      WriteAll(log, "[tau] virtualenv setup failed: " + err->message + "\n");
      return *err;
    }
    WriteAll(log, "[tau] virtualenv ready\n");
    return dir;
  }

  static Status PublishLink(const std::string& link, const std::string& target) {
    std::string tmp = link + ".link-" + std::to_string(::getpid());
    ::unlink(tmp.c_str());
    if (::symlink(target.c_str(), tmp.c_str()) != 0) return IoError("cannot create " + tmp, errno);
    if (::rename(tmp.c_str(), link.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      return IoError("cannot publish " + link, err);
    }
    return Status::Ok();
  }

  // Build directories of `key` that no symlink points at: a build that crashed half-way.
  static void RemoveStaleBuilds(const std::string& cache, const std::string& key) {
    char target[4096];
    ssize_t len = ::readlink((cache + "/" + key).c_str(), target, sizeof target - 1);
    std::string live = len > 0 ? std::string(target, static_cast<size_t>(len)) : "";
    DIR* d = ::opendir(cache.c_str());
    if (d == nullptr) return;
    std::vector<std::string> stale;
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (StartsWith(name, key + "-") && name != live) stale.push_back(name);
    }
    ::closedir(d);
    for (const std::string& name : stale) (void)RemoveTree(cache + "/" + name);
  }

  // ---- start ----

  void SetUpCgroup() {
    const bool limited = config_.memory_limit_bytes || config_.cpu_limit_milli;
    std::string why;
    cgroup_ = Cgroup::Create("tau-" + config_.run_name + "-" + std::to_string(config_.attempt) +
                                 "-" + std::to_string(::getpid()),
                             &why);
    if (cgroup_) {
      Status s = cgroup_->SetLimits(config_.memory_limit_bytes, config_.cpu_limit_milli);
      if (s.ok()) return;
      why = s.message();
      cgroup_->Remove();
      cgroup_.reset();
    }
    if (limited) WriteAll(LogFd(0), "[tau] memory/cpu limits not enforced: " + why + "\n");
  }

  // Forks every worker, holds them at a barrier until all exist, then releases them together. Any
  // failure before or at exec kills the whole gang: the attempt starts all-or-none.
  std::optional<SetupError> StartGang() {
    if (auto kind = Interrupted()) return SetupError{*kind, InterruptMessage(*kind, "setup")};
    SetUpCgroup();
    std::vector<CStrings> argvs, envps;
    for (const WorkerLaunch& w : config_.workers) {
      argvs.emplace_back(w.argv);
      envps.push_back(CStrings::FromEnv(w.env));
    }
    // Those of the read-only paths that exist (an upstream stage may have written no checkpoint).
    std::vector<std::string> existing;
    for (const std::string& path : config_.read_only)
      if (PathExists(path)) existing.push_back(path);
    std::optional<CStrings> read_only_paths;
    if (!existing.empty()) read_only_paths.emplace(existing);
    char* const* read_only = read_only_paths ? read_only_paths->get() : nullptr;
    int barrier[2], errors[2];
    if (::pipe2(barrier, O_CLOEXEC) != 0 || ::pipe2(errors, O_CLOEXEC) != 0) {
      return SetupError{OutcomeKind::kSetupFailed, std::string("pipe: ") + std::strerror(errno)};
    }
    UniqueFd barrier_read(barrier[0]), barrier_write(barrier[1]);
    UniqueFd error_read(errors[0]), error_write(errors[1]);

    for (size_t rank = 0; rank < config_.workers.size(); ++rank) {
      ChildPlan plan;
      plan.rank = static_cast<int>(rank);
      plan.path = resolved_[rank].c_str();
      plan.argv = argvs[rank].get();
      plan.envp = envps[rank].get();
      plan.cwd = config_.work_dir.empty() ? nullptr : config_.work_dir.c_str();
      plan.pgid = pgid_;
      plan.parent = ::getpid();
      plan.stdin_fd = devnull_.get();
      plan.out_fd = LogFd(rank);
      // A gang waits at the barrier until every worker exists; a single worker has nobody to wait
      // for, so it is started with vfork: no copy of the shim's page tables, which costs more than
      // the rest of the start on a virtual machine.
      const bool single = config_.workers.size() == 1;
      plan.barrier_fd = single ? -1 : barrier_read.get();
      plan.cgroup_procs_fd = cgroup_ ? cgroup_->procs_fd() : -1;
      plan.error_fd = error_write.get();
      plan.run_as = config_.run_as ? &*config_.run_as : nullptr;
      plan.read_only = read_only;
      plan.mount_ns_fd = mount_ns_.get();
      // A child that makes a mount namespace is forked: its own copy of everything, vfork's
      // shared memory included.
      pid_t pid = StartChild(plan, /*share_memory=*/single && plan.read_only == nullptr);
      if (pid < 0) {
        int err = errno;
        AbortGang();
        return SetupError{OutcomeKind::kSetupFailed, "cannot start worker " + std::to_string(rank) +
                                                         ": fork: " + std::strerror(err)};
      }
      // Both sides call setpgid so the group exists before the next worker tries to join it.
      if (pgid_ == 0) pgid_ = pid;
      ::setpgid(pid, pgid_);
      Worker w;
      w.rank = static_cast<int>(rank);
      w.pid = pid;
      if (auto st = internal::ReadProcStat(pid)) w.start_time = st->start_time;
      workers_.push_back(w);
    }

    // Release: one byte per worker. Then the error pipe reaches EOF once every worker has exec'd
    // (CLOEXEC closes its copy) or died trying.
    std::string go(workers_.size(), 'g');
    WriteAll(barrier_write.get(), go);
    barrier_write.Reset();
    error_write.Reset();
    ChildError e{};
    std::optional<ChildError> first_error;
    ssize_t n;
    while ((n = ::read(error_read.get(), &e, sizeof e)) != 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n != sizeof e) break;
      if (!first_error) first_error = e;
    }
    if (first_error) {
      AbortGang();
      const WorkerLaunch& w = config_.workers[static_cast<size_t>(first_error->rank)];
      const std::string& path = resolved_[static_cast<size_t>(first_error->rank)];
      // The program as the spec named it, when that differs from the file found for it.
      const std::string named = path == w.argv[0] ? "" : " (" + w.argv[0] + ")";
      return SetupError{OutcomeKind::kSetupFailed,
                        "worker " + std::to_string(first_error->rank) + ": cannot " +
                            ChildStepName(first_error->step) + " " + path + named + ": " +
                            std::strerror(first_error->err)};
    }

    json workers_json = json::array();
    for (const Worker& w : workers_) {
      workers_json.push_back({{"rank", w.rank}, {"pid", w.pid}, {"start_time", w.start_time}});
    }
    Status s = WriteState({{"phase", "running"},
                           {"shim_pid", ::getpid()},
                           {"pgid", pgid_},
                           {"workers", workers_json}});
    if (!s.ok()) Log("cannot write state.json: " + s.ToString());
    return std::nullopt;
  }

  void AbortGang() {
    for (const Worker& w : workers_) ::kill(w.pid, SIGKILL);
    if (pgid_ > 0) ::kill(-pgid_, SIGKILL);
    for (Worker& w : workers_) {
      if (::waitpid(w.pid, &w.status, 0) == w.pid) w.done = true;
    }
  }

  // ---- supervise ----

  void Supervise() {
    size_t running = workers_.size();
    bool tearing_down = false;
    int64_t kill_at = -1;
    std::optional<size_t> failed;
    while (running > 0) {
      int status = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        // Grandchildren re-parented to us (subreaper) are reaped here too and otherwise ignored.
        for (size_t i = 0; i < workers_.size(); ++i) {
          Worker& w = workers_[i];
          if (w.pid != pid || w.done) continue;
          w.done = true;
          w.status = status;
          --running;
          if (!tearing_down && !ExitedCleanly(status)) {
            failed = i;
            outcome_.kind = OutcomeKind::kFailed;
            tearing_down = true;
            kill_at = BeginTeardown();
          }
        }
      }
      if (running == 0) break;
      if (!tearing_down) {
        if (auto kind = Interrupted()) {
          outcome_.kind = *kind;
          tearing_down = true;
          kill_at = BeginTeardown();
        }
      }
      if (tearing_down && !sigkill_sent_ && MonotonicMillis() >= kill_at) {
        sigkill_sent_ = true;
        ::kill(-pgid_, SIGKILL);
        for (const Worker& w : workers_) {
          if (!w.done) ::kill(w.pid, SIGKILL);
        }
      }
      int64_t timeout =
          tearing_down && !sigkill_sent_ ? std::max<int64_t>(1, kill_at - MonotonicMillis()) : -1;
      WaitForEvent(timeout);
    }
    if (!tearing_down) outcome_.kind = OutcomeKind::kSucceeded;
    Describe(failed);
  }

  int64_t BeginTeardown() {
    ::kill(-pgid_, SIGTERM);
    // A worker that moved to its own process group still gets the request.
    for (const Worker& w : workers_) {
      if (!w.done) ::kill(w.pid, SIGTERM);
    }
    return MonotonicMillis() + config_.stop_grace_ms;
  }

  void Describe(std::optional<size_t> failed) {
    for (const Worker& w : workers_) {
      WorkerOutcome o;
      o.rank = w.rank;
      o.pid = w.pid;
      if (WIFEXITED(w.status)) o.exit_code = WEXITSTATUS(w.status);
      if (WIFSIGNALED(w.status)) o.signal = WTERMSIG(w.status);
      outcome_.workers.push_back(o);
    }
    const std::string gang =
        workers_.size() > 1 ? "; gang of " + std::to_string(workers_.size()) + " torn down" : "";
    int killed = 0;
    for (const Worker& w : workers_) {
      if (sigkill_sent_ && WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGKILL) ++killed;
    }
    const std::string forced =
        killed > 0 ? "; " + std::to_string(killed) + " worker(s) ignored SIGTERM for " +
                         FormatDuration(config_.stop_grace_ms) + " and were killed"
                   : "";
    if (outcome_.kind == OutcomeKind::kTimedOut || outcome_.kind == OutcomeKind::kStopped) {
      // Stopped from outside: the run's exit code is how its first worker that did not exit 0
      // ended (128 + the signal that stopped it), as for a worker that failed on its own.
      for (const WorkerOutcome& o : outcome_.workers) {
        if (o.exit_code == 0 && o.signal == 0) continue;
        outcome_.signal = o.signal;
        outcome_.exit_code = o.signal ? 128 + o.signal : o.exit_code;
        break;
      }
    }
    switch (outcome_.kind) {
      case OutcomeKind::kSucceeded:
        outcome_.message = std::to_string(workers_.size()) + " worker(s) exited 0";
        break;
      case OutcomeKind::kFailed: {
        const Worker& w = workers_[*failed];
        const WorkerOutcome& o = outcome_.workers[*failed];
        outcome_.failed_rank = w.rank;
        outcome_.signal = o.signal;
        outcome_.exit_code = o.signal ? 128 + o.signal : o.exit_code;
        outcome_.message = "worker " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
                           ") " +
                           (o.signal ? "was killed by " + SignalName(o.signal)
                                     : "exited with code " + std::to_string(o.exit_code)) +
                           gang + forced;
        break;
      }
      case OutcomeKind::kStopped:
        outcome_.message = "stopped on request" + gang + forced;
        break;
      case OutcomeKind::kTimedOut:
        outcome_.message =
            "max runtime " + FormatDuration(*config_.max_runtime_ms) + " exceeded" + gang + forced;
        break;
      case OutcomeKind::kSetupFailed:
        break;
    }
  }

  // ---- cleanup ----

  // Nothing of the attempt may outlive it: kill the process group and the cgroup, then every
  // descendant, which (subreaper) ends up as our child once its parent is gone.
  // Our live children, orphaned descendants included (we are their subreaper). The kernel lists
  // them in /proc/self/task/TID/children; without that file, every process's parent is checked.
  static std::vector<int> Children(int self) {
    std::vector<int> out;
    auto listed = ReadFile("/proc/self/task/" + std::to_string(self) + "/children");
    if (listed.ok()) {
      for (const std::string& word : Split(*listed, ' '))
        if (!word.empty() && word != "\n") out.push_back(std::atoi(word.c_str()));
      return out;
    }
    for (int pid : internal::ListPids()) {
      std::optional<internal::ProcStat> st = internal::ReadProcStat(pid);
      if (st && st->ppid == self && st->state != 'Z') out.push_back(pid);
    }
    return out;
  }

  void Cleanup() {
    if (pgid_ > 0) ::kill(-pgid_, SIGKILL);
    if (cgroup_) {
      cgroup_->KillAll();
      outcome_.oom_killed = cgroup_->OomKilled();
    }
    const int64_t give_up = MonotonicMillis() + 10'000;
    const int self = ::getpid();
    while (MonotonicMillis() < give_up) {
      // Reap first: in the common case the workers are gone and so is everything they started, and
      // the loop ends without looking further.
      pid_t r;
      while ((r = ::waitpid(-1, nullptr, WNOHANG)) > 0) {
      }
      if (r < 0 && errno == ECHILD) break;
      for (int pid : Children(self)) ::kill(pid, SIGKILL);
      WaitForEvent(20);
    }
    if (cgroup_) cgroup_->Remove();
  }

  // ---- files ----

  // Where rank R's output goes: its pipe to the log pump.
  int LogFd(size_t rank) const { return pump_->write_fd(rank); }

  Status WriteState(const json& state) {
    // An attempt does not outlive a crash of its machine, so its files need only survive process
    // crashes.
    return WriteFileAtomic(dir_ + "/state.json", internal::DumpJson(state), 0644,
                           Durability::kProcessCrash);
  }

  int Finish(OutcomeKind kind, const std::string& message) {
    // The private /tmp goes with the attempt (its /dev/shm went with its namespace). Removed by
    // descriptors: it is the run user's tree.
    mount_ns_.Reset();
    if (const std::string tmp = dir_ + "/tmp"; config_.run_as && PathExists(tmp))
      if (Status s = RemoveTree(tmp); !s.ok())
        Log("cannot remove the private /tmp: " + s.ToString());
    outcome_.kind = kind;
    outcome_.message = message;
    if (outcome_.oom_killed) outcome_.message += " (the attempt's cgroup saw an OOM kill)";
    outcome_.ended_ms = NowMillis();
    if (kind == OutcomeKind::kSetupFailed && pump_) {
      WriteAll(LogFd(0), "[tau] setup failed: " + message + "\n");
    }
    // The logs are complete before result.json says the attempt is over: the server reads them
    // (diagnosis, evidence) once it sees the result. Every process that could write them is gone
    // (Cleanup), so the pipes are closed at once; the timeout is for one that escaped.
    if (pump_) pump_->Finish(/*timeout_ms=*/2000);
    // What became of the attempt is result.json's to say; the log is for what went wrong.
    if (kind != OutcomeKind::kSucceeded)
      Log(std::string("attempt ") + OutcomeKindName(kind) + ": " + message);
    const std::string result = internal::DumpJson(outcome_.ToJson());
    Status s = WriteFileAtomic(dir_ + "/result.json", result, 0644, Durability::kProcessCrash);
    // A full disk: the result is what the server classes the attempt by, so wait for space (an
    // hour at most) rather than leave the attempt looking lost.
    for (int waited_s = 0; s.code() == StatusCode::kUnavailable && waited_s < 3600; ++waited_s) {
      if (waited_s == 0) Log("cannot write result.json yet, waiting for space: " + s.ToString());
      ::sleep(1);
      // Notices first, so the server that sees the result finds them.
      if (pump_) pump_->FlushNotices();
      s = WriteFileAtomic(dir_ + "/result.json", result, 0644, Durability::kProcessCrash);
    }
    if (!s.ok()) {
      Log("cannot write result.json: " + s.ToString());
      return 1;
    }
    return 0;
  }

  // DIR/shim.log, made when there is something to say: an attempt that goes as it should leaves
  // none (a file made for every attempt costs every attempt an inode). Standard error (the server's
  // log, for a shim the zygote forked) when the file cannot be made.
  void Log(const std::string& line) {
    if (!log_.valid())
      log_ = UniqueFd(
          ::open((dir_ + "/shim.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    WriteAll(log_.valid() ? log_.get() : 2,
             "[tau-shim " + FormatRfc3339(NowMillis()) + "] " + line + "\n");
  }

  const std::string dir_;
  std::string config_text_;  // the config as handed over, until Init parses it
  AttemptConfig config_;
  AttemptOutcome outcome_;
  UniqueFd lock_;  // the supervisor lock, held until the shim exits
  UniqueFd log_;   // shim.log, once opened
  UniqueFd sigfd_, devnull_;
  UniqueFd mount_ns_;  // the attempt's private mounts (MakePrivateMounts); invalid: none
  std::unique_ptr<internal::LogPump> pump_;  // logs/rank-R.log, one per worker
  std::vector<std::string> resolved_;        // each worker's argv[0], resolved on its PATH
  std::optional<Cgroup> cgroup_;
  std::vector<Worker> workers_;
  pid_t pgid_ = 0;
  int64_t deadline_ = -1;  // MonotonicMillis() past which the attempt times out; -1: none
  bool stop_requested_ = false;
  bool sigkill_sent_ = false;
};

}  // namespace

int ShimMain(const std::string& attempt_dir, const std::string& config) {
  Shim shim(attempt_dir, config);
  return shim.Run();
}

}  // namespace tau::runtime
