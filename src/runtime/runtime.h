// Local execution of one attempt of a run: a supervisor process (the "shim") that owns the
// attempt's worker processes, so that attempts survive a restart of the server and can be
// re-adopted.
//
//   server --StartAttempt--> zygote --fork--> shim (own session) --fork/exec--> workers 0..N-1
//     ^                     (`tau __zygote`,    |  (one process group per attempt)
//     |                      or an exec of      |  writes DIR/state.json (pids) and, atomically,
//     |                      `tau __shim DIR`)  |  DIR/result.json (outcome)
//     +--ProcessWatcher (pidfd: readable when the shim exits)
//
// Files in an attempt directory:
//   config.json   AttemptConfig, written before the shim starts when it is exec'd (a shim the
//                 zygote forks gets it in memory)
//   state.json    {"phase": "setup"} while pip runs, then
//                 {"phase": "running", "pgid", "workers": [{"rank","pid","start_time"}]}
//   result.json   AttemptOutcome, written once when the attempt is over
//   logs/rank-R.log  stdout and stderr of worker R (rank 0 also gets setup output such as pip's),
//                 written by the shim's log pump from a pipe: secrets masked, kept under the
//                 attempt's cap (the newest output; a marker line at the top says how much went)
//   notices.jsonl what the server should record as events of the run (LogTruncated,
//                 OutputDropped), one {"type","message","data"} a line; only when there are any
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mutex.h"
#include "common/status.h"
#include "spec/spec.h"

namespace tau::runtime {

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct WorkerLaunch {
  std::vector<std::string>
      argv;     // argv[0] is resolved on PATH (after the venv's bin) when it has no '/'
  EnvList env;  // the worker's whole environment
};

// What the server knows when it places an attempt; input of PlanLaunch.
struct LaunchContext {
  std::string run_name;
  int attempt = 1;
  std::string work_dir;  // the run's copy of the code snapshot; workers' cwd
  // Where PlanLaunch looks for an entrypoint shipped with the code: the snapshot that work_dir is
  // made from (the shim makes it later), in the same folder. Empty: work_dir itself.
  std::string shipped_dir;
  std::string checkpoint_dir;  // stable across attempts
  std::string output_dir;
  std::string metrics_file;
  std::vector<int> gpus;  // GPU indices handed to this attempt (workers * gpus-per-worker of them)
  int master_port = 0;    // for gangs and torchrun
  EnvList base_env;       // the server's pass-through environment (PATH, HOME, LANG, ...)
  EnvList extra_env;  // TAU_* variables of the run (TAU_ARRAY_INDEX, TAU_DATA_DIR) and of recovery
                      // (TAU_FAILURE_REASON, TAU_RESUME_FROM)
};

// Chooses the launcher (see docs/architecture.md and the spec reference):
//   job, 1 worker, <=1 GPU     python3 ENTRY ARGS
//   job, 1 worker, N>1 GPUs    torchrun --standalone --nproc_per_node=N ENTRY ARGS, or with a
//                              master_port: torchrun --nnodes=1 --nproc_per_node=N
//                              --master_addr=127.0.0.1 --master_port=PORT ENTRY ARGS
//   job, W>1 workers           a gang of W processes (python3, or torchrun --nnodes=W when N>1)
//   with
//                              MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK
//   rayjob                     python3 ENTRY ARGS once, as the Ray driver, with every GPU of the
//   run visible entrypoint not *.py        executed directly, ARGS appended
// Each worker's env: base_env, then the spec's env, then TAU_RUN_NAME, TAU_ATTEMPT,
// TAU_CHECKPOINT_DIR, TAU_OUTPUT_DIR, TAU_METRICS_FILE, CUDA_VISIBLE_DEVICES, PYTHONUNBUFFERED=1
// and extra_env; the shim adds TAU_ATTEMPT_DIR (the marker that finds the attempt's processes).
Result<std::vector<WorkerLaunch>> PlanLaunch(const spec::RunSpec& spec, const LaunchContext& ctx);

// A file of the code a run ships, relative to the code's root.
struct ShippedFile {
  std::string path;
  int mode = 0644;
};
// What a launch on this machine needs and would not find, known before the run is admitted: an
// entrypoint that is a directory of the code, not executable, not shipped or not on the PATH, and
// torchrun for a multi-GPU worker. `gpus_per_worker` is the resolved one (a profile may give it),
// `code_subdir` the spec's folder inside the code. A run with runtime.pip gets a virtualenv that
// may bring the programs, so its PATH is not judged. InvalidArgument names the field and the fix.
Status CheckStartable(const spec::RunSpec& spec, int gpus_per_worker,
                      const std::string& code_subdir, const std::vector<ShippedFile>& files,
                      const std::string& path_value);

struct AttemptConfig {
  std::string run_name;
  int attempt = 1;
  std::string attempt_dir;  // created by StartAttempt when missing
  std::string work_dir;
  // The run's code: the shim makes a tree at `root` from the read-only `snapshot` first thing in
  // setup (CloneTree), unless a former attempt made it, then creates work_dir in it and hands the
  // tree to run_as. In the shim, not the server: a large tree costs as long as its files, and the
  // server's decision thread waits for nothing of the kind.
  struct Code {
    std::string snapshot;
    std::string root;
    bool copy = false;  // each file a copy of its own (workers that run as root), not a link
  };
  std::optional<Code> code;
  std::vector<WorkerLaunch> workers;
  // What the workers may read but not write (a workflow stage's upstream checkpoints and outputs):
  // each worker bind-mounts these read-only in a mount namespace of its own before it drops to
  // run_as. Only a shim running as root can; the backend leaves it empty otherwise.
  std::vector<std::string> read_only;
  std::vector<std::string> pip;  // requirements; empty means no virtualenv
  std::string venv_cache_dir;    // where cached virtualenvs live, keyed by the requirement set
  std::optional<int64_t>
      memory_limit_bytes;  // whole attempt; enforced with cgroup v2 when possible
  std::optional<int64_t> cpu_limit_milli;
  std::optional<int64_t> max_runtime_ms;  // the attempt is stopped and reported TimedOut past this
  int64_t stop_grace_ms = 10'000;         // SIGTERM, then SIGKILL after this
  // On a multi-user machine the server runs as root and each run's processes as the user who
  // submitted it: the workers (and setup commands such as pip) drop to these ids before exec.
  // Unset: they run as the shim's own user.
  struct RunAs {
    uint32_t uid = 0;
    uint32_t gid = 0;
    std::vector<uint32_t> groups;  // supplementary groups
    std::string user;              // for messages
  };
  std::optional<RunAs> run_as;
  // What the workers print of these values is masked ("***") before it reaches the logs.
  std::vector<std::string> mask;
  // All the workers' logs together (split evenly per rank); 0: no cap.
  int64_t max_log_bytes = 0;

  nlohmann::json ToJson() const;
  static Result<AttemptConfig> FromJson(const nlohmann::json& j);
};

// The ids of a system user, for AttemptConfig::run_as; NotFound when the machine has no such user.
Result<AttemptConfig::RunAs> LookUpUser(const std::string& name);

// Identifies a live shim across server restarts: a pid alone can be reused, pid + start time
// cannot.
struct ProcessId {
  int pid = 0;
  uint64_t start_time = 0;  // /proc/PID/stat field 22 (clock ticks since boot)
};

// The supervisor lock in an attempt directory: the shim holds an exclusive flock on it for its
// whole life and writes "PID START_TIME" into it.
inline constexpr const char* kSupervisorLockFile = "supervisor.lock";

enum class SupervisorState {
  kNeverStarted,  // no supervisor ever ran in this directory
  kAlive,         // one holds the lock now
  kGone,          // one ran and is gone
};
// Tells, without signalling anything, whether the attempt in `attempt_dir` has a live supervisor;
// fills `live` with its identity when it does. The server uses it after a restart for attempts
// whose supervisor pid it never recorded.
SupervisorState ProbeSupervisor(const std::string& attempt_dir, struct ProcessId* live);

// Asks the Python processes of the attempt in `attempt_dir` (those carrying its marker in their
// environment) to write every thread's stack to their standard error, their log: SIGUSR1, sent
// only to a process whose argv[0] is a Python interpreter and that catches it (PythonHookSource's
// faulthandler does). Returns how many were asked.
int DumpPythonStacks(const std::string& attempt_dir);
// The text of the sitecustomize.py put first on the Python path of a run's workers where stack
// dumps are wanted: it registers faulthandler on SIGUSR1, then runs the sitecustomize it hides.
const std::string& PythonHookSource();

// Reads /proc/PID/stat; nullopt when the process does not exist (or is a zombie).
std::optional<uint64_t> ProcessStartTime(int pid);
// True when `id` still names the same, running process.
bool IsAlive(const ProcessId& id);

// The largest attempt config handed to a shim in memory (through the zygote) rather than in
// DIR/config.json: a gang's config, with every worker's environment, may be larger.
inline constexpr size_t kMaxInlineConfigBytes = 64 * 1024;

// A pre-started `tau __zygote` process that forks a shim for each attempt: a fork of an idle,
// initialised process instead of an exec of tau, which saves a few ms of CPU per attempt (see
// zygote.cc). The shims it forks are the same processes an exec'd `tau __shim DIR` would be, except
// that their parent is the zygote rather than the caller. Thread-safe.
class Zygote {
 public:
  static Result<std::unique_ptr<Zygote>> Start(const std::string& tau_binary);
  // Closes the request socket and reaps the zygote; the shims it forked keep running.
  ~Zygote();
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Forks a shim for the attempt in `attempt_dir`, with `config` (AttemptConfig JSON) handed to it
  // in memory, or, when empty, read from DIR/config.json. Unavailable once the zygote has died or
  // stopped answering (for 2 s); from then on it is broken for good, and its owner may start
  // another. ResourceExhausted for a config too large to send (write the file instead).
  Result<ProcessId> StartShim(const std::string& attempt_dir, std::string_view config = {});
  // StartShim in two halves, so that the zygote forks while the caller goes on: Send asks for a
  // shim, Receive waits for the answer to the oldest request not yet received (the zygote answers
  // in order). One caller at a time may have requests in flight.
  Status Send(const std::string& attempt_dir, std::string_view config = {});
  Result<ProcessId> Receive(const std::string& attempt_dir);
  bool broken();
  int pid() const { return pid_; }

 private:
  Zygote(int pid, int sock) : pid_(pid), sock_(sock) {}
  Status Broken(const std::string& what, int err) TAU_REQUIRES(mu_);
  const int pid_;
  const int sock_;
  Mutex mu_;
  bool broken_ TAU_GUARDED_BY(mu_) = false;
  int in_flight_ TAU_GUARDED_BY(mu_) = 0;  // requests sent and not yet answered
};

// Starts the shim of the attempt in its own session: forked by `zygote` when one is given and
// still answers (the config handed over in memory), otherwise by exec of `tau_binary __shim DIR`
// (the config written to DIR/config.json first, mode 0600). Returns once the shim is running;
// workers are started by the shim.
Result<ProcessId> StartAttempt(const AttemptConfig& config, const std::string& tau_binary,
                               Zygote* zygote = nullptr);

// Starts the shims of many attempts, as StartAttempt does one: each Add sends the zygote its
// request without waiting for the fork, so that the zygote forks while the caller prepares the next
// attempt; Wait collects the shims. Not thread-safe.
class ShimBatch {
 public:
  ShimBatch(std::string tau_binary, Zygote* zygote)
      : tau_binary_(std::move(tau_binary)), zygote_(zygote) {}
  // Returns the attempt's index in Wait's answer.
  size_t Add(const AttemptConfig& config);
  // Each added attempt's shim, in the order they were added.
  std::vector<Result<ProcessId>> Wait();

 private:
  void ReceiveOldest();
  struct Entry {
    std::string attempt_dir;
    std::string config;                     // the JSON, should the shim have to be exec'd
    std::optional<Result<ProcessId>> shim;  // unset while the zygote owes its answer
  };
  const std::string tau_binary_;
  Zygote* const zygote_;
  std::vector<Entry> entries_;
  size_t received_ = 0;  // entries_ before this one have their answer
};

// Asks the shim to stop the attempt (SIGTERM to the shim; it stops workers with the grace period).
// When the shim is gone, kills whatever worker processes state.json lists that are still alive.
Status StopAttempt(const ProcessId& shim, const std::string& attempt_dir);
// Kills the shim and every worker process state.json lists, at once: for a shim that does not
// stop when asked (stopped with SIGSTOP, or stuck).
Status KillAttempt(const ProcessId& shim, const std::string& attempt_dir);

enum class OutcomeKind {
  kSucceeded,    // every worker exited 0
  kFailed,       // a worker exited non-zero or was killed by a signal
  kSetupFailed,  // venv/pip failed, or a worker could not be started (exec failed, torchrun
                 // missing)
  kStopped,      // stopped by StopAttempt
  kTimedOut,     // max_runtime_ms passed
};
const char* OutcomeKindName(OutcomeKind kind);

struct WorkerOutcome {
  int rank = 0;
  int pid = 0;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
};

struct AttemptOutcome {
  OutcomeKind kind = OutcomeKind::kFailed;
  int exit_code = 0;  // the run's exit code: first failed worker's, 128+signal for signals
  int signal = 0;     // the first failed worker's signal, if any
  int failed_rank = -1;
  bool oom_killed = false;  // the cgroup saw an OOM kill
  std::string message;      // human-readable: "worker 1 exited with code 3; gang torn down"
  int64_t started_ms = 0, ended_ms = 0;
  std::vector<WorkerOutcome> workers;

  nlohmann::json ToJson() const;
  static Result<AttemptOutcome> FromJson(const nlohmann::json& j);
};

// DIR/result.json; NotFound while the attempt has not finished.
Result<AttemptOutcome> ReadOutcome(const std::string& attempt_dir);

// What the shim noticed that the run's events should say (DIR/notices.jsonl).
inline constexpr const char* kNoticesFile = "notices.jsonl";
struct AttemptNotice {
  std::string type;  // "LogTruncated", "OutputDropped"
  std::string message;
  nlohmann::json data;
};
// The notices after byte `*offset` of DIR/notices.jsonl (whole lines only: a line still being
// written waits), advancing `*offset` past them. None when there is no file.
std::vector<AttemptNotice> ReadNotices(const std::string& attempt_dir, int64_t* offset);

// Calls `on_exit(key)` from its own thread when a watched process exits. Works for processes that
// are not our children (re-adopted shims) through pidfd_open; reaps them when they are.
class ProcessWatcher {
 public:
  using Callback = std::function<void(const std::string& key)>;
  static Result<std::unique_ptr<ProcessWatcher>> Create(Callback on_exit);
  virtual ~ProcessWatcher() = default;
  // Watching a process that has already exited calls the callback promptly.
  virtual Status Watch(const std::string& key, const ProcessId& process) = 0;
  virtual void Stop() = 0;
};

// Entry point of `tau __shim DIR` (which reads DIR/config.json) and of a shim the zygote forked
// (which may have its config in memory). Returns the shim's exit code.
int ShimMain(const std::string& attempt_dir, const std::string& config = "");
// Entry point of `tau __zygote` (its request socket on fd 0). Returns when the socket closes.
// `role_arg` is the process's own argv[1] ("__zygote"): the shims it forks rewrite it to "__shim",
// so that `ps` tells them from the zygote.
int ZygoteMain(char* role_arg);

// Where the running tau binary is (/proc/self/exe).
std::string SelfExecutable();

// Keeps the loopback ports tau hands a run (a gang's rendezvous port, a service replica's port) for
// the run's user: on this machine a connect() to such a port at a loopback address (127/8, ::1, or
// the unspecified address, which reaches this host) succeeds only for the port's user and root
// (tau's own endpoint and probes); any other user's fails with EPERM. Two eBPF programs attached
// to the root of the cgroup v2 hierarchy check every connect against a map of guarded ports, so it
// needs root, a mounted cgroup v2 hierarchy and a kernel with cgroup BPF (Start says which is
// missing). The programs are named after `owner` (the server's home): a server killed without
// detaching its own leaves them attached, still guarding, until the next server of that home
// detaches them (DetachLeftOvers), once it has guarded what it re-adopted, or until a guard that
// finds the kernel's limit of 64 programs reached detaches those nobody holds (DetachOrphans).
// Thread-compatible.
class PortGuard {
 public:
  static Result<std::unique_ptr<PortGuard>> Start(const std::string& owner);
  // What the last Start in this process said, for whoever reports the machine's isolation: "" when
  // none was tried, "on", or why it is off.
  static std::string LastOutcome();
  ~PortGuard();  // detaches its programs: the ports are open to all again
  PortGuard(const PortGuard&) = delete;
  PortGuard& operator=(const PortGuard&) = delete;

  // Only `uid` (and root) may connect to `port` from now on.
  Status Allow(int port, uint32_t uid);
  void Release(int port);
  // Detaches the programs of `owner` that a former server left attached, all but `keep`'s (may be
  // null); returns how many.
  static int DetachLeftOvers(const std::string& owner, const PortGuard* keep);

 private:
  // Detaches every tau program attached at the cgroup `cgroup_fd` that no process holds: what
  // servers killed without a successor left. Start calls it when the kernel's limit of programs
  // per cgroup is reached. Returns how many.
  static int DetachOrphans(int cgroup_fd);
  PortGuard() = default;
  static Result<std::unique_ptr<PortGuard>> StartGuard(const std::string& owner);
  struct Attached {
    int prog_fd = -1;
    int type = 0;  // its bpf_attach_type
    std::string name;
  };
  std::string tag_;
  int cgroup_fd_ = -1;
  int map_fd_ = -1;
  std::vector<Attached> attached_;
};

}  // namespace tau::runtime
