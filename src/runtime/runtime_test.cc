// The runtime with real processes: the shim (tau_test_shim), workers, process groups, signals,
// venvs.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/strings.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

extern char** environ;

namespace tau::runtime {
namespace {

using json = nlohmann::json;

::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not in:\n" << haystack;
}

// Runs argv (no shell) and returns its stdout; exit status in *status.
std::string Capture(const std::vector<std::string>& argv, int* status = nullptr) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while (rc == 0 && (n = ::read(out[0], buf, sizeof buf)) > 0)
    text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int st = -1;
  if (rc == 0) ::waitpid(pid, &st, 0);
  if (status) *status = st;
  return text;
}

// Processes in the shim's session: every process of the attempt unless it called setsid itself.
std::vector<int> SessionMembers(int shim_pid) {
  std::vector<int> out;
  for (int pid : internal::ListPids()) {
    auto st = internal::ReadProcStat(pid);
    if (st && st->session == shim_pid && st->state != 'Z') out.push_back(pid);
  }
  return out;
}

bool WaitUntil(const std::function<bool()>& done, int64_t timeout_ms) {
  const int64_t until = MonotonicMillis() + timeout_ms;
  while (MonotonicMillis() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

class RuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Put the real interpreter first on the workers' PATH: a pyenv shim costs a second per start.
    std::string exe = Capture({"python3", "-c", "import sys; print(sys.executable)"});
    while (!exe.empty() && exe.back() == '\n') exe.pop_back();
    python_dir_ = exe.substr(0, exe.rfind('/'));
  }

  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "tau-runtime-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    work_ = root_ + "/code";
    ASSERT_TRUE(MakeDirs(work_).ok());
  }

  void TearDown() override {
    // A test that failed half-way must not leave its attempts running: stop them and give the shims
    // a moment to clean up, then kill what remains.
    for (const ProcessId& shim : shims_) {
      if (Gone(shim)) continue;
      (void)StopAttempt(shim, "");
      if (!WaitUntil([&] { return Gone(shim); }, 3'000)) {
        for (int pid : SessionMembers(shim.pid)) ::kill(pid, SIGKILL);
        ::kill(shim.pid, SIGKILL);
        ::waitpid(shim.pid, nullptr, 0);
      }
    }
    if (HasFailure()) {
      std::fprintf(stderr, "kept %s for inspection\n", root_.c_str());
    } else {
      (void)RemoveTree(root_);
    }
  }

  // True once the shim has exited: reaped when it is our child, not alive when a zygote forked it.
  static bool Gone(const ProcessId& shim) {
    pid_t r = ::waitpid(shim.pid, nullptr, WNOHANG);
    return r == shim.pid || (r < 0 && errno == ECHILD && !IsAlive(shim));
  }

  static std::string Path() {
    const char* path = std::getenv("PATH");
    return python_dir_ + ":" + (path ? path : "/usr/bin:/bin");
  }

  EnvList BaseEnv() const {
    const char* home = std::getenv("HOME");
    return {{"PATH", Path()},
            {"HOME", home ? home : root_},
            {"PIP_NO_INDEX", "1"},
            {"PIP_DISABLE_PIP_VERSION_CHECK", "1"},
            {"PYTHONDONTWRITEBYTECODE", "1"}};
  }

  WorkerLaunch Worker(std::vector<std::string> argv) const { return {std::move(argv), BaseEnv()}; }
  WorkerLaunch Python(const std::string& code) const { return Worker({"python3", "-c", code}); }
  WorkerLaunch Shell(const std::string& script) const { return Worker({"/bin/sh", "-c", script}); }

  AttemptConfig Config(std::vector<WorkerLaunch> workers, const std::string& name = "a1") const {
    AttemptConfig c;
    c.run_name = "test-run";
    c.attempt = 1;
    c.attempt_dir = root_ + "/" + name;
    c.work_dir = work_;
    c.workers = std::move(workers);
    c.venv_cache_dir = root_ + "/venvs";
    c.stop_grace_ms = 200;
    return c;
  }

  LaunchContext Context() const {
    LaunchContext ctx;
    ctx.run_name = "test-run";
    ctx.attempt = 2;
    ctx.work_dir = work_;
    ctx.checkpoint_dir = root_ + "/ckpt";
    ctx.output_dir = root_ + "/out";
    ctx.metrics_file = root_ + "/out/metrics.jsonl";
    ctx.master_port = 29555;
    ctx.base_env = BaseEnv();
    return ctx;
  }

  static spec::RunSpec Job(int workers, int gpus, const std::string& entry,
                           std::vector<std::string> args = {}) {
    spec::RunSpec s;
    s.name = "test-run";
    s.kind = spec::WorkloadKind::kJob;
    s.entrypoint = entry;
    s.args = std::move(args);
    s.compute.workers = workers;
    s.compute.gpus = gpus;
    return s;
  }

  ProcessId Start(const AttemptConfig& c) {
    auto shim = StartAttempt(c, TAU_TEST_SHIM_PATH);
    EXPECT_TRUE(shim.ok()) << shim.status().ToString();
    if (shim.ok()) shims_.push_back(*shim);
    return shim.ok() ? *shim : ProcessId{};
  }

  // Waits for the shim (our child) to exit and returns the attempt's outcome.
  AttemptOutcome Wait(const ProcessId& shim, const std::string& dir, int64_t timeout_ms = 20'000) {
    int status = 0;
    bool exited =
        WaitUntil([&] { return ::waitpid(shim.pid, &status, WNOHANG) == shim.pid; }, timeout_ms);
    if (!exited) {
      ADD_FAILURE() << "shim did not finish within " << timeout_ms << " ms; shim.log:\n"
                    << ShimLog(dir);
      ::kill(shim.pid, SIGKILL);
      for (int pid : SessionMembers(shim.pid)) ::kill(pid, SIGKILL);
      ::waitpid(shim.pid, &status, 0);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "shim status " << status;
    auto outcome = ReadOutcome(dir);
    EXPECT_TRUE(outcome.ok()) << outcome.status().ToString();
    return outcome.ok() ? *outcome : AttemptOutcome{};
  }

  AttemptOutcome Run(const AttemptConfig& c) { return Wait(Start(c), c.attempt_dir); }

  static std::string ShimLog(const std::string& dir) {
    auto text = ReadFile(dir + "/shim.log");
    return text.ok() ? *text : "(none)";
  }

  static std::string Log(const std::string& dir, int rank) {
    auto text = ReadFile(dir + "/logs/rank-" + std::to_string(rank) + ".log");
    return text.ok() ? *text : "";
  }

  static bool WaitForLog(const std::string& dir, int rank, const std::string& needle) {
    return WaitUntil([&] { return Log(dir, rank).find(needle) != std::string::npos; }, 10'000);
  }

  static json State(const std::string& dir) {
    auto text = ReadFile(dir + "/state.json");
    json state = text.ok() ? json::parse(*text, nullptr, false) : json();
    return state.is_object() ? state : json::object();
  }

  // The workers recorded in state.json.
  static std::vector<ProcessId> Workers(const std::string& dir) {
    std::vector<ProcessId> out;
    json state = State(dir);
    if (!state.is_object() || !state.contains("workers")) return out;
    for (const json& w : state["workers"]) {
      out.push_back({w.value("pid", 0), w.value("start_time", uint64_t{0})});
    }
    return out;
  }

  // The pid printed after `key=` in a log, with its start time while it is alive.
  static ProcessId PidFromLog(const std::string& dir, int rank, const std::string& key) {
    std::string log = Log(dir, rank);
    size_t at = log.find(key + "=");
    if (at == std::string::npos) return {};
    int pid = std::atoi(log.c_str() + at + key.size() + 1);
    auto start = ProcessStartTime(pid);
    return {pid, start.value_or(0)};
  }

  std::string Write(const std::string& name, const std::string& content) {
    std::string path = work_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(path, content).ok());
    return path;
  }

  static inline std::string python_dir_;
  std::string root_, work_;
  std::vector<ProcessId> shims_;  // every shim started by the test, for TearDown
};

TEST_F(RuntimeTest, SucceedingPythonWorker) {
  Write("main.py",
        "import os, sys\n"
        "print('hello from rank0')\n"
        "print('attempt=' + os.environ['TAU_ATTEMPT'])\n"
        "print('cvd=[' + os.environ['CUDA_VISIBLE_DEVICES'] + ']')\n"
        "print('cwd=' + os.getcwd())\n"
        "print('args=' + ','.join(sys.argv[1:]))\n"
        "print('to stderr', file=sys.stderr)\n");
  auto plan = PlanLaunch(Job(1, 0, "main.py", {"x", "y z"}), Context());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  AttemptConfig c = Config(*plan);
  AttemptOutcome o = Run(c);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.failed_rank, -1);
  ASSERT_EQ(o.workers.size(), 1u);
  EXPECT_EQ(o.workers[0].exit_code, 0);
  EXPECT_LE(o.started_ms, o.ended_ms);
  std::string log = Log(c.attempt_dir, 0);
  EXPECT_TRUE(Contains(log, "hello from rank0"));
  EXPECT_TRUE(Contains(log, "attempt=2"));
  EXPECT_TRUE(Contains(log, "cvd=[]"));
  EXPECT_TRUE(Contains(log, "cwd=" + work_));
  EXPECT_TRUE(Contains(log, "args=x,y z"));
  EXPECT_TRUE(Contains(log, "to stderr"));
  json state = State(c.attempt_dir);
  EXPECT_EQ(state["phase"], "running");
  EXPECT_EQ(state["workers"][0]["pid"], o.workers[0].pid);
  EXPECT_EQ(state["pgid"], o.workers[0].pid);
  EXPECT_TRUE(PathExists(c.attempt_dir + "/config.json"));
}

// The workers' output reaches the log through the shim's pump: masked as it is written (visible
// on disk while the worker still runs) and kept under the attempt's cap with the newest output.
TEST_F(RuntimeTest, TheLogIsMaskedAsItIsWrittenAndKeptUnderTheCap) {
  AttemptConfig c = Config({Python("import sys, time\n"
                                   "print('key=s3cr3t-value', flush=True)\n"
                                   "time.sleep(0.3)\n"
                                   "for i in range(40000): print('line', i)\n"
                                   "print('the end')\n"),
                            Python("print('rank one')")});
  c.mask = {"s3cr3t-value"};
  c.max_log_bytes = 128 << 10;  // 64 KiB each
  ProcessId shim = Start(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "key=***"));
  EXPECT_EQ(Log(c.attempt_dir, 0).find("s3cr3t"), std::string::npos);
  AttemptOutcome o = Wait(shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  std::string log = Log(c.attempt_dir, 0);
  EXPECT_LE(log.size(), (64u << 10) + 256);
  EXPECT_TRUE(Contains(log, "bytes of earlier output dropped: the log reached its cap of 65536"));
  EXPECT_TRUE(Contains(log, "line 39999\nthe end\n"));
  EXPECT_EQ(Log(c.attempt_dir, 1), "rank one\n");
  int64_t offset = 0;
  auto notices = ReadNotices(c.attempt_dir, &offset);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].type, "LogTruncated");
  EXPECT_EQ(notices[0].data["rank"], 0);
}

TEST_F(RuntimeTest, ExitCodeIsRecorded) {
  AttemptOutcome o = Run(Config({Python("import sys; print('bye'); sys.exit(3)")}));
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_EQ(o.exit_code, 3);
  EXPECT_EQ(o.signal, 0);
  EXPECT_EQ(o.failed_rank, 0);
  EXPECT_TRUE(Contains(
      o.message, "worker 0 (pid " + std::to_string(o.workers.at(0).pid) + ") exited with code 3"));
}

TEST_F(RuntimeTest, KilledBySignalIsRecorded) {
  for (int sig : {SIGSEGV, SIGKILL}) {
    AttemptConfig c =
        Config({Python("import os; os.kill(os.getpid(), " + std::to_string(sig) + ")")},
               "sig" + std::to_string(sig));
    AttemptOutcome o = Run(c);
    EXPECT_EQ(o.kind, OutcomeKind::kFailed);
    EXPECT_EQ(o.signal, sig);
    EXPECT_EQ(o.exit_code, 128 + sig);
    ASSERT_EQ(o.workers.size(), 1u);
    EXPECT_EQ(o.workers[0].exit_code, -1);
    EXPECT_EQ(o.workers[0].signal, sig);
    EXPECT_TRUE(Contains(o.message, sig == SIGKILL ? "SIGKILL" : "SIGSEGV"));
  }
}

constexpr char kGangScript[] =
    "import os, sys, time\n"
    "rank = int(os.environ['RANK'])\n"
    "print('rank=%d world=%s local=%s master=%s:%s' % (rank, os.environ['WORLD_SIZE'],\n"
    "      os.environ['LOCAL_RANK'], os.environ['MASTER_ADDR'], os.environ['MASTER_PORT']), "
    "flush=True)\n"
    "if sys.argv[1] == 'fail':\n"
    "    if rank == 1:\n"
    "        time.sleep(0.3)\n"
    "        sys.exit(5)\n"
    "    time.sleep(60)\n";

TEST_F(RuntimeTest, GangAllSucceedWithRanks) {
  Write("gang.py", kGangScript);
  auto plan = PlanLaunch(Job(3, 0, "gang.py", {"ok"}), Context());
  ASSERT_TRUE(plan.ok());
  AttemptConfig c = Config(*plan);
  AttemptOutcome o = Run(c);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  ASSERT_EQ(o.workers.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(o.workers[static_cast<size_t>(r)].rank, r);
    EXPECT_EQ(o.workers[static_cast<size_t>(r)].exit_code, 0);
    EXPECT_TRUE(Contains(Log(c.attempt_dir, r), "rank=" + std::to_string(r) + " world=3 local=" +
                                                    std::to_string(r) + " master=127.0.0.1:29555"));
  }
  // One process group for the whole gang, led by rank 0.
  json state = State(c.attempt_dir);
  EXPECT_EQ(state["pgid"], state["workers"][0]["pid"]);
}

TEST_F(RuntimeTest, GangFailureTearsDownTheRest) {
  Write("gang.py", kGangScript);
  auto plan = PlanLaunch(Job(3, 0, "gang.py", {"fail"}), Context());
  ASSERT_TRUE(plan.ok());
  AttemptConfig c = Config(*plan);
  const int64_t begin = MonotonicMillis();
  ProcessId shim = Start(c);
  AttemptOutcome o = Wait(shim, c.attempt_dir);
  EXPECT_LT(MonotonicMillis() - begin, 5'000);
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_EQ(o.failed_rank, 1);
  EXPECT_EQ(o.exit_code, 5);
  ASSERT_EQ(o.workers.size(), 3u);
  EXPECT_TRUE(Contains(o.message, "worker 1 (pid " + std::to_string(o.workers[1].pid) +
                                      ") exited with code 5; gang of 3 torn down"));
  EXPECT_EQ(o.workers[0].signal, SIGTERM);
  EXPECT_EQ(o.workers[2].signal, SIGTERM);
  ASSERT_EQ(Workers(c.attempt_dir).size(), c.workers.size());
  for (const ProcessId& w : Workers(c.attempt_dir)) EXPECT_FALSE(IsAlive(w)) << w.pid;
  EXPECT_TRUE(SessionMembers(shim.pid).empty());
}

TEST_F(RuntimeTest, ExecFailureIsASetupFailure) {
  AttemptOutcome missing = Run(Config({Worker({"/nonexistent/tau-no-such-binary"})}, "abs"));
  EXPECT_EQ(missing.kind, OutcomeKind::kSetupFailed);
  EXPECT_TRUE(Contains(missing.message, "cannot execute /nonexistent/tau-no-such-binary"));
  EXPECT_TRUE(Contains(missing.message, "No such file or directory"));

  AttemptOutcome not_on_path = Run(Config({Worker({"tau-no-such-command"})}, "path"));
  EXPECT_EQ(not_on_path.kind, OutcomeKind::kSetupFailed);
  EXPECT_TRUE(
      Contains(not_on_path.message, "worker 0: command 'tau-no-such-command' not found on PATH"));

  std::string not_executable = Write("data.txt", "just data\n");
  AttemptOutcome denied = Run(Config({Worker({not_executable})}, "denied"));
  EXPECT_EQ(denied.kind, OutcomeKind::kSetupFailed);
  EXPECT_TRUE(Contains(denied.message, "Permission denied"));
  EXPECT_TRUE(Contains(Log(root_ + "/denied", 0), "[tau] setup failed"));
}

TEST_F(RuntimeTest, TheShimMakesTheRunsCodeTreeOnceFromItsSnapshot) {
  // A snapshot as the server stores it: read-only files.
  const std::string snapshot = root_ + "/snapshot";
  ASSERT_TRUE(MakeDirs(snapshot + "/sub").ok());
  ASSERT_TRUE(WriteFileAtomic(snapshot + "/sub/run.sh", "#!/bin/sh\ncat data.txt\n", 0555).ok());
  ASSERT_TRUE(WriteFileAtomic(snapshot + "/sub/data.txt", "from the snapshot\n", 0444).ok());
  const std::string code_root = root_ + "/run/work";
  ASSERT_TRUE(MakeDirs(root_ + "/run").ok());
  LaunchContext ctx = Context();
  ctx.work_dir = code_root + "/sub";
  ctx.shipped_dir = snapshot + "/sub";  // the tree does not exist yet: the snapshot says it ships
  auto plan = PlanLaunch(Job(1, 0, "run.sh"), ctx);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ((*plan)[0].argv[0], code_root + "/sub/run.sh");
  AttemptConfig c = Config(*plan, "first");
  c.work_dir = ctx.work_dir;
  AttemptConfig::Code code;
  code.snapshot = snapshot;
  code.root = code_root;
  code.copy = true;
  c.code = code;
  AttemptOutcome o = Run(c);
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_TRUE(Contains(Log(c.attempt_dir, 0), "from the snapshot"));
  struct stat st;
  ASSERT_EQ(::stat((code_root + "/sub/data.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);  // the run's own, writable copy

  // A later attempt finds the tree made, with what the run changed in it: it is not made again.
  ASSERT_TRUE(WriteFileAtomic(code_root + "/sub/data.txt", "changed by the run\n").ok());
  c.attempt_dir = root_ + "/second";
  o = Run(c);
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_TRUE(Contains(Log(c.attempt_dir, 0), "changed by the run"));

  // A snapshot that is gone fails the attempt's setup, and says what it was making.
  AttemptConfig lost = Config({Worker({"/bin/true"})}, "lost");
  code.snapshot = root_ + "/no-such-snapshot";
  code.root = root_ + "/run/lost-work";
  code.copy = false;
  lost.code = code;
  o = Run(lost);
  EXPECT_EQ(o.kind, OutcomeKind::kSetupFailed);
  EXPECT_TRUE(Contains(o.message, "the run's code: ")) << o.message;
  EXPECT_FALSE(PathExists(root_ + "/run/lost-work"));
}

TEST_F(RuntimeTest, GangStartsAllOrNone) {
  AttemptConfig c = Config({Python("import time; print('started', flush=True); time.sleep(60)"),
                            Worker({"/nonexistent/tau-no-such-binary"})});
  ProcessId shim = Start(c);
  AttemptOutcome o = Wait(shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kSetupFailed);
  EXPECT_TRUE(Contains(o.message, "worker 1: cannot execute"));
  EXPECT_TRUE(SessionMembers(shim.pid).empty());
  EXPECT_NE(State(c.attempt_dir).value("phase", ""), "running");
}

TEST_F(RuntimeTest, MissingTorchrunIsExplained) {
  LaunchContext ctx = Context();
  ctx.gpus = {0, 1};
  for (auto& [name, value] : ctx.base_env) {
    if (name == "PATH") value = python_dir_ + ":/usr/bin:/bin";
  }
  auto plan = PlanLaunch(Job(1, 2, "train.py"), ctx);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ((*plan)[0].argv[0], "torchrun");
  AttemptOutcome o = Run(Config(*plan));
  EXPECT_EQ(o.kind, OutcomeKind::kSetupFailed);
  EXPECT_EQ(o.message,
            "torchrun not found on PATH: multi-GPU runs need PyTorch; add torch to runtime.pip");
}

// Each worker leaves a grandchild in its process group and one that escaped into its own session.
constexpr char kSpawner[] =
    "sleep 1000 & echo gc=$!; setsid sleep 1000 & echo escaped=$!; echo started; wait";

TEST_F(RuntimeTest, StopKillsTheWholeGang) {
  AttemptConfig c = Config({Shell(kSpawner), Shell(kSpawner)});
  ProcessId shim = Start(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "started"));
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 1, "started"));
  std::vector<ProcessId> descendants;
  for (int r = 0; r < 2; ++r) {
    descendants.push_back(PidFromLog(c.attempt_dir, r, "gc"));
    descendants.push_back(PidFromLog(c.attempt_dir, r, "escaped"));
  }
  for (const ProcessId& d : descendants) ASSERT_TRUE(IsAlive(d)) << d.pid;
  const int64_t begin = MonotonicMillis();
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  AttemptOutcome o = Wait(shim, c.attempt_dir);
  EXPECT_LT(MonotonicMillis() - begin, 2'000);
  EXPECT_EQ(o.kind, OutcomeKind::kStopped) << o.message;
  EXPECT_TRUE(Contains(o.message, "stopped on request; gang of 2 torn down"));
  ASSERT_EQ(Workers(c.attempt_dir).size(), c.workers.size());
  for (const ProcessId& w : Workers(c.attempt_dir)) EXPECT_FALSE(IsAlive(w)) << w.pid;
  for (const ProcessId& d : descendants) EXPECT_FALSE(IsAlive(d)) << d.pid;
  EXPECT_TRUE(SessionMembers(shim.pid).empty());
}

// A stalled attempt's stack dump: only the Python worker that runs tau's hook is signalled (a shell
// or a Python worker without the hook would die of SIGUSR1), its stacks land in its log, and a
// sitecustomize further along its path still ran.
TEST_F(RuntimeTest, StackDumpsReachOnlyPythonWorkersWithTheHook) {
  const std::string hook = root_ + "/hook", user_site = root_ + "/site";
  ASSERT_TRUE(MakeDirs(hook).ok() && MakeDirs(user_site).ok());
  ASSERT_TRUE(WriteFileAtomic(hook + "/sitecustomize.py", PythonHookSource()).ok());
  ASSERT_TRUE(
      WriteFileAtomic(user_site + "/sitecustomize.py", "print('user sitecustomize ran')\n").ok());
  const std::string code =
      "import time\n"
      "def wait_here():\n"
      "    print('ready', flush=True)\n"
      "    time.sleep(60)\n"
      "wait_here()\n";
  WorkerLaunch hooked = Python(code);
  hooked.env.emplace_back("PYTHONPATH", hook + ":" + user_site);
  AttemptConfig c = Config({hooked, Shell("echo ready; sleep 60"), Python(code)});
  ProcessId shim = Start(c);
  for (int rank = 0; rank < 3; ++rank) ASSERT_TRUE(WaitForLog(c.attempt_dir, rank, "ready"));
  EXPECT_TRUE(Contains(Log(c.attempt_dir, 0), "user sitecustomize ran"));
  EXPECT_EQ(DumpPythonStacks(c.attempt_dir), 1);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "(most recent call first):"));
  EXPECT_TRUE(WaitForLog(c.attempt_dir, 0, "in wait_here"));
  EXPECT_FALSE(Contains(Log(c.attempt_dir, 2), "most recent call first"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const ProcessId& w : Workers(c.attempt_dir)) EXPECT_TRUE(IsAlive(w)) << w.pid;
  EXPECT_EQ(DumpPythonStacks(root_ + "/no-such-attempt"), 0);
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  Wait(shim, c.attempt_dir);
}

TEST_F(RuntimeTest, WorkerIgnoringSigtermIsKilledAfterGrace) {
  AttemptConfig c =
      Config({Python("import signal, time\n"
                     "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                     "print('ready', flush=True)\n"
                     "time.sleep(60)\n")});
  c.stop_grace_ms = 300;
  ProcessId shim = Start(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "ready"));
  const int64_t begin = MonotonicMillis();
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  AttemptOutcome o = Wait(shim, c.attempt_dir);
  const int64_t took = MonotonicMillis() - begin;
  EXPECT_GE(took, 300);
  EXPECT_LT(took, 3'000);
  EXPECT_EQ(o.kind, OutcomeKind::kStopped);
  EXPECT_EQ(o.workers.at(0).signal, SIGKILL);
  EXPECT_TRUE(Contains(o.message, "1 worker(s) ignored SIGTERM for 300ms and were killed"));
}

TEST_F(RuntimeTest, MaxRuntimeTimesOut) {
  AttemptConfig c = Config({Python("import time; time.sleep(60)")});
  c.max_runtime_ms = 500;
  const int64_t begin = MonotonicMillis();
  AttemptOutcome o = Run(c);
  const int64_t took = MonotonicMillis() - begin;
  EXPECT_EQ(o.kind, OutcomeKind::kTimedOut) << o.message;
  EXPECT_GE(took, 500);
  EXPECT_LT(took, 4'000);
  EXPECT_TRUE(Contains(o.message, "max runtime 500ms exceeded"));
  EXPECT_EQ(o.workers.at(0).signal, SIGTERM);
  // The run's exit code says how it ended, as for a worker killed by a signal.
  EXPECT_EQ(o.signal, SIGTERM);
  EXPECT_EQ(o.exit_code, 128 + SIGTERM);
}

TEST_F(RuntimeTest, KilledShimTakesWorkersAlongAndStopCleansUp) {
  AttemptConfig c = Config({Shell(kSpawner), Shell(kSpawner)});
  ProcessId shim = Start(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "started"));
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 1, "started"));
  ProcessId grandchild = PidFromLog(c.attempt_dir, 0, "gc");
  ASSERT_TRUE(IsAlive(grandchild));
  // The workers run (and print) a moment before the shim records them.
  ASSERT_TRUE(
      WaitUntil([&] { return State(c.attempt_dir).value("phase", "") == "running"; }, 5'000));
  std::vector<ProcessId> workers = Workers(c.attempt_dir);
  ASSERT_EQ(workers.size(), 2u);
  // Who escaped, with their start times, read while they surely live: read later, a pid could name
  // another process by then.
  std::vector<ProcessId> escaped;
  for (int r = 0; r < 2; ++r) {
    escaped.push_back(PidFromLog(c.attempt_dir, r, "escaped"));
    ASSERT_TRUE(IsAlive(escaped.back())) << escaped.back().pid;
  }

  ASSERT_EQ(::kill(shim.pid, SIGKILL), 0);
  ::waitpid(shim.pid, nullptr, 0);
  // PR_SET_PDEATHSIG: the workers die with the shim.
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(workers[0]) && !IsAlive(workers[1]); }, 3'000));
  // Their orphaned grandchildren are found through state.json (process group + session).
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(grandchild); }, 3'000));
  EXPECT_TRUE(WaitUntil([&] { return SessionMembers(shim.pid).empty(); }, 3'000));
  EXPECT_EQ(ReadOutcome(c.attempt_dir).status().code(), StatusCode::kNotFound);
  // Those that escaped into a session of their own (setsid) are found by the attempt's marker in
  // their environment.
  for (const ProcessId& e : escaped) {
    EXPECT_TRUE(WaitUntil([&] { return !IsAlive(e); }, 3'000)) << e.pid;
    if (IsAlive(e)) ::kill(e.pid, SIGKILL);
  }
}

TEST_F(RuntimeTest, StartAttemptReportsAMissingTauBinary) {
  AttemptConfig c = Config({Python("pass")});
  auto shim = StartAttempt(c, root_ + "/no-such-tau");
  ASSERT_FALSE(shim.ok());
  EXPECT_EQ(shim.status().code(), StatusCode::kIo);
  EXPECT_TRUE(PathExists(c.attempt_dir + "/config.json"));
  EXPECT_FALSE(PathExists(c.attempt_dir + "/logs"));  // the shim makes it, and none started
}

TEST_F(RuntimeTest, StopChecksTheShimIdentity) {
  // Our own pid with a wrong start time stands for a shim whose pid was reused: it must not be
  // signalled.
  auto start = ProcessStartTime(::getpid());
  ASSERT_TRUE(start.has_value());
  ASSERT_TRUE(MakeDirs(root_ + "/empty").ok());
  EXPECT_TRUE(StopAttempt({::getpid(), *start + 1}, root_ + "/empty").ok());
  EXPECT_EQ(ReadOutcome(root_ + "/empty").status().code(), StatusCode::kNotFound);
}

TEST_F(RuntimeTest, FailingPipRequirementIsASetupFailure) {
  AttemptConfig c = Config({Python("print('never runs')")});
  c.pip = {root_ + "/wheels/tau_missing-1.0-py3-none-any.whl"};
  AttemptOutcome o = Run(c);
  EXPECT_EQ(o.kind, OutcomeKind::kSetupFailed);
  EXPECT_TRUE(Contains(o.message, "pip install failed"));
  std::string log = Log(c.attempt_dir, 0);
  EXPECT_TRUE(Contains(log, "ERROR"));
  EXPECT_TRUE(Contains(log, "[tau] setup failed"));
  EXPECT_FALSE(Contains(log, "never runs"));
  // The failed build leaves nothing behind but its lock file.
  int entries = 0;
  for (const std::string& name : Split(Capture({"ls", "-A", c.venv_cache_dir}), '\n')) {
    if (!name.empty()) {
      ++entries;
      EXPECT_TRUE(EndsWith(name, ".lock")) << name;
    }
  }
  EXPECT_EQ(entries, 1);
}

constexpr char kWheelBuilder[] =
    "import base64, hashlib, sys, zipfile\n"
    "files = {\n"
    "  'tau_testpkg/__init__.py': 'VALUE = 42\\n',\n"
    "  'tau_testpkg-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\\nName: tau-testpkg\\nVersion: "
    "1.0\\n',\n"
    "  'tau_testpkg-1.0.dist-info/WHEEL':\n"
    "      'Wheel-Version: 1.0\\nGenerator: tau-test\\nRoot-Is-Purelib: true\\nTag: "
    "py3-none-any\\n',\n"
    "}\n"
    "def digest(data):\n"
    "    return 'sha256=' + "
    "base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()\n"
    "record = ''.join('%s,%s,%d\\n' % (n, digest(c.encode()), len(c.encode())) for n, c in "
    "files.items())\n"
    "record += 'tau_testpkg-1.0.dist-info/RECORD,,\\n'\n"
    "with zipfile.ZipFile(sys.argv[1], 'w') as z:\n"
    "    for n, c in files.items():\n"
    "        z.writestr(n, c)\n"
    "    z.writestr('tau_testpkg-1.0.dist-info/RECORD', record)\n";

TEST_F(RuntimeTest, PipInstallsALocalWheelAndReusesTheVenv) {
  ASSERT_TRUE(MakeDirs(root_ + "/wheels").ok());
  std::string wheel = root_ + "/wheels/tau_testpkg-1.0-py3-none-any.whl";
  std::string builder = Write("build_wheel.py", kWheelBuilder);
  int status = -1;
  Capture({python_dir_ + "/python3", builder, wheel}, &status);
  ASSERT_EQ(status, 0);

  const std::string code =
      "import os, sys, tau_testpkg\n"
      "print('value', tau_testpkg.VALUE)\n"
      "print('venv', os.environ['VIRTUAL_ENV'])\n"
      "print('prefix', sys.prefix)\n";
  AttemptConfig first = Config({Python(code)}, "first");
  first.pip = {wheel};
  AttemptConfig second = Config({Python(code)}, "second");
  second.attempt = 2;
  second.pip = {wheel};
  AttemptConfig third = Config({Python(code)}, "third");
  third.attempt = 3;
  third.pip = {wheel};

  ProcessId first_shim = Start(first);
  ASSERT_TRUE(WaitForLog(first.attempt_dir, 0, "[tau] creating virtualenv"));
  // While the first attempt builds the venv, attempts with the same requirements wait for its lock,
  // and still listen to stop requests.
  ProcessId second_shim = Start(second);
  ProcessId third_shim = Start(third);
  ASSERT_TRUE(WaitForLog(second.attempt_dir, 0, "waiting for another attempt"));
  ASSERT_TRUE(WaitForLog(third.attempt_dir, 0, "waiting for another attempt"));
  ASSERT_TRUE(StopAttempt(third_shim, third.attempt_dir).ok());
  AttemptOutcome stopped = Wait(third_shim, third.attempt_dir);
  EXPECT_EQ(stopped.kind, OutcomeKind::kStopped);
  EXPECT_EQ(stopped.message, "stopped on request during setup");

  AttemptOutcome o = Wait(first_shim, first.attempt_dir);
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message << "\n" << Log(first.attempt_dir, 0);
  std::string log = Log(first.attempt_dir, 0);
  EXPECT_TRUE(Contains(log, "value 42"));
  EXPECT_TRUE(Contains(log, "venv " + first.venv_cache_dir + "/"));
  EXPECT_TRUE(Contains(log, "prefix " + first.venv_cache_dir + "/"));
  EXPECT_TRUE(Contains(log, "[tau] virtualenv ready"));

  // The published venv: a symlink named by the key, pointing at the directory it was built in.
  std::string listing = Capture({"ls", first.venv_cache_dir});
  std::string key;
  for (const std::string& name : Split(listing, '\n')) {
    if (name.size() == 32) key = name;
  }
  ASSERT_FALSE(key.empty()) << listing;
  char target[4096];
  ssize_t len = ::readlink((first.venv_cache_dir + "/" + key).c_str(), target, sizeof target - 1);
  ASSERT_GT(len, 0);
  std::string built = std::string(target, static_cast<size_t>(len));
  struct stat before;
  ASSERT_EQ(::stat((first.venv_cache_dir + "/" + built + "/tau-venv.json").c_str(), &before), 0);

  AttemptOutcome again = Wait(second_shim, second.attempt_dir);
  ASSERT_EQ(again.kind, OutcomeKind::kSucceeded) << again.message;
  std::string log2 = Log(second.attempt_dir, 0);
  EXPECT_TRUE(
      Contains(log2, "[tau] reusing cached virtualenv " + first.venv_cache_dir + "/" + built));
  EXPECT_TRUE(Contains(log2, "value 42"));
  EXPECT_FALSE(Contains(log2, "creating virtualenv"));
  len = ::readlink((first.venv_cache_dir + "/" + key).c_str(), target, sizeof target - 1);
  ASSERT_GT(len, 0);
  EXPECT_EQ(std::string(target, static_cast<size_t>(len)), built);
  struct stat after;
  ASSERT_EQ(::stat((first.venv_cache_dir + "/" + built + "/tau-venv.json").c_str(), &after), 0);
  EXPECT_EQ(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
}

TEST_F(RuntimeTest, LimitsWithoutCgroupV2AreReportedNotFatal) {
  AttemptConfig c = Config({Python("print('ran')")});
  c.memory_limit_bytes = int64_t{1} << 30;
  c.cpu_limit_milli = 500;
  AttemptOutcome o = Run(c);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_FALSE(o.oom_killed);
  std::string log = Log(c.attempt_dir, 0);
  EXPECT_TRUE(Contains(log, "ran"));
  if (!PathExists("/sys/fs/cgroup/cgroup.controllers")) {
    EXPECT_TRUE(Contains(log, "[tau] memory/cpu limits not enforced: cgroup v2 not available\n"));
  }
}

// ---- ProcessWatcher ----

class Fired {
 public:
  void Add(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    keys_.insert(key);
    cv_.notify_all();
  }
  bool WaitFor(const std::string& key, int64_t timeout_ms = 5'000) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return keys_.count(key) > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> keys_;
};

std::unique_ptr<ProcessWatcher> MakeWatcher(Fired& fired) {
  auto watcher = ProcessWatcher::Create([&fired](const std::string& key) { fired.Add(key); });
  EXPECT_TRUE(watcher.ok());
  return watcher.ok() ? std::move(watcher).value() : nullptr;
}

TEST(ProcessWatcherTest, FiresForAnExitingChildAndReapsIt) {
  Fired fired;
  auto watcher = MakeWatcher(fired);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::usleep(100'000);
    ::_exit(0);
  }
  auto start = internal::ReadProcStat(pid);
  ASSERT_TRUE(start.has_value());
  ASSERT_TRUE(watcher->Watch("child", {pid, start->start_time}).ok());
  EXPECT_TRUE(fired.WaitFor("child"));
  errno = 0;
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);  // already reaped by the watcher
  EXPECT_EQ(errno, ECHILD);
}

TEST(ProcessWatcherTest, FiresForAProcessAlreadyGone) {
  Fired fired;
  auto watcher = MakeWatcher(fired);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  ASSERT_TRUE(watcher->Watch("gone", {pid, 1}).ok());
  EXPECT_TRUE(fired.WaitFor("gone"));
  // A live pid with another start time is a different process: as good as gone.
  auto self = ProcessStartTime(::getpid());
  ASSERT_TRUE(watcher->Watch("reused", {::getpid(), *self + 1}).ok());
  EXPECT_TRUE(fired.WaitFor("reused"));
}

TEST(ProcessWatcherTest, FiresForANonChild) {
  Fired fired;
  auto watcher = MakeWatcher(fired);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::usleep(300'000);
      ::_exit(0);
    }
    [[maybe_unused]] ssize_t n = ::write(pipefd[1], &grandchild, sizeof grandchild);
    ::_exit(0);
  }
  ::close(pipefd[1]);
  pid_t grandchild = 0;
  ASSERT_EQ(::read(pipefd[0], &grandchild, sizeof grandchild),
            static_cast<ssize_t>(sizeof grandchild));
  ::close(pipefd[0]);
  ::waitpid(child, nullptr, 0);
  auto st = internal::ReadProcStat(grandchild);
  ASSERT_TRUE(st.has_value());
  EXPECT_NE(st->ppid, ::getpid());
  ASSERT_TRUE(watcher->Watch("orphan", {grandchild, st->start_time}).ok());
  EXPECT_TRUE(fired.WaitFor("orphan"));
}

TEST(ProcessWatcherTest, StopEndsTheThreadAndRefusesNewWatches) {
  Fired fired;
  auto watcher = MakeWatcher(fired);
  auto self = ProcessStartTime(::getpid());
  ASSERT_TRUE(watcher->Watch("self", {::getpid(), *self}).ok());  // never fires
  watcher->Stop();
  EXPECT_FALSE(watcher->Watch("late", {::getpid(), *self}).ok());
  watcher.reset();  // the destructor after Stop() is fine too
}

TEST_F(RuntimeTest, WatcherSeesTheShimExit) {
  Fired fired;
  auto watcher = MakeWatcher(fired);
  AttemptConfig c = Config({Python("print('done')")});
  ProcessId shim = Start(c);
  ASSERT_TRUE(watcher->Watch("run/1", shim).ok());
  ASSERT_TRUE(fired.WaitFor("run/1", 20'000));
  auto outcome = ReadOutcome(c.attempt_dir);
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  EXPECT_EQ(outcome->kind, OutcomeKind::kSucceeded);
  EXPECT_FALSE(IsAlive(shim));
}

}  // namespace
}  // namespace tau::runtime

namespace tau::runtime {
namespace {

TEST_F(RuntimeTest, SupervisorLockTellsLiveFromGone) {
  AttemptConfig c = Config({Python("import time; print('started', flush=True); time.sleep(60)")});
  ProcessId none;
  EXPECT_EQ(ProbeSupervisor(c.attempt_dir, &none), SupervisorState::kNeverStarted);
  ProcessId shim = Start(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "started"));
  ProcessId seen;
  EXPECT_EQ(ProbeSupervisor(c.attempt_dir, &seen), SupervisorState::kAlive);
  EXPECT_EQ(seen.pid, shim.pid);
  EXPECT_EQ(seen.start_time, shim.start_time);
  // A second supervisor for the same attempt refuses to run.
  EXPECT_NE(ShimMain(c.attempt_dir), 0);
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  Wait(shim, c.attempt_dir);
  EXPECT_EQ(ProbeSupervisor(c.attempt_dir, &seen), SupervisorState::kGone);
}

// ---- the zygote: shims forked from a pre-started process ----

class ZygoteTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    auto zygote = Zygote::Start(TAU_TEST_SHIM_PATH);
    ASSERT_TRUE(zygote.ok()) << zygote.status().ToString();
    zygote_ = std::move(*zygote);
  }

  ProcessId StartForked(const AttemptConfig& c) {
    auto shim = StartAttempt(c, TAU_TEST_SHIM_PATH, zygote_.get());
    EXPECT_TRUE(shim.ok()) << shim.status().ToString();
    if (!shim.ok()) return {};
    shims_.push_back(*shim);
    return *shim;
  }

  AttemptOutcome WaitForked(const ProcessId& shim, const std::string& dir) {
    EXPECT_TRUE(WaitUntil([&] { return Gone(shim); }, 20'000)) << ShimLog(dir);
    auto outcome = ReadOutcome(dir);
    EXPECT_TRUE(outcome.ok()) << outcome.status().ToString();
    return outcome.ok() ? *outcome : AttemptOutcome{};
  }

  // The zygote's children that are not shims of an attempt: its spare, once it has forked one.
  std::vector<int> Spares() const {
    std::vector<int> out;
    for (int pid : internal::ListPids()) {
      auto st = internal::ReadProcStat(pid);
      if (!st || st->ppid != zygote_->pid() || st->state == 'Z') continue;
      bool shim = std::any_of(shims_.begin(), shims_.end(),
                              [&](const ProcessId& s) { return s.pid == pid; });
      if (!shim) out.push_back(pid);
    }
    return out;
  }

  // The zygote's one spare, once it has forked it, with its start time; {} when there is none.
  ProcessId TheSpare() const {
    std::vector<int> spares;
    EXPECT_TRUE(WaitUntil([&] { return !(spares = Spares()).empty(); }, 3'000));
    EXPECT_EQ(spares.size(), 1u);
    if (spares.size() != 1) return {};
    std::optional<uint64_t> start = ProcessStartTime(spares[0]);
    EXPECT_TRUE(start.has_value());
    return start ? ProcessId{spares[0], *start} : ProcessId{};
  }

  std::unique_ptr<Zygote> zygote_;
};

TEST_F(ZygoteTest, ForkedShimRunsTheAttemptInItsOwnSession) {
  // The worker takes a moment, so that the shim is still there to be looked at.
  AttemptConfig c =
      Config({Python("import time; time.sleep(0.5); print('hello from a forked shim')")});
  ProcessId shim = StartForked(c);
  auto st = internal::ReadProcStat(shim.pid);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->ppid, zygote_->pid());  // forked, not exec'd by us
  // Named a shim in `ps` (a child just forked may not have got that far yet).
  std::string cmdline;
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto text = ReadFile("/proc/" + std::to_string(shim.pid) + "/cmdline");
        cmdline = text.ok() ? *text : "";
        return cmdline.find(std::string("__shim\0", 7)) != std::string::npos;
      },
      2'000))
      << cmdline;
  EXPECT_EQ(cmdline.find("__zygote"), std::string::npos);
  AttemptOutcome o = WaitForked(shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_TRUE(Contains(Log(c.attempt_dir, 0), "hello from a forked shim"));
  // An attempt that went as it should leaves no shim log.
  EXPECT_FALSE(PathExists(c.attempt_dir + "/shim.log"));
}

TEST_F(ZygoteTest, AForkedShimGetsItsConfigInMemory) {
  // Secrets in the workers' environment reach no file, and the attempt costs no config file.
  AttemptConfig c = Config({Shell("echo \"token=$TAU_TEST_TOKEN\"")});
  c.workers[0].env.emplace_back("TAU_TEST_TOKEN", "s3cr3t-in-memory");
  ProcessId shim = StartForked(c);
  AttemptOutcome o = WaitForked(shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_EQ(Log(c.attempt_dir, 0), "token=s3cr3t-in-memory\n");
  EXPECT_FALSE(PathExists(c.attempt_dir + "/config.json"));
}

TEST_F(ZygoteTest, AConfigTooLargeToSendGoesThroughTheFile) {
  // The worker takes a moment: a shim that had ended would be reaped by the zygote, and its pid
  // could name another process by the time it is looked at.
  AttemptConfig c = Config({Shell("sleep 1; echo \"${#TAU_TEST_BIG}\"")});
  c.workers[0].env.emplace_back("TAU_TEST_BIG", std::string(kMaxInlineConfigBytes, 'x'));
  ProcessId shim = StartForked(c);
  auto st = internal::ReadProcStat(shim.pid);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->ppid, zygote_->pid());  // forked all the same
  AttemptOutcome o = WaitForked(shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_EQ(Log(c.attempt_dir, 0), std::to_string(kMaxInlineConfigBytes) + "\n");
  EXPECT_TRUE(PathExists(c.attempt_dir + "/config.json"));
}

TEST_F(ZygoteTest, WorkersInheritNothingFromTheZygote) {
  // The zygote's request socket, its blocked SIGCHLD and the shim's own signal set-up must not
  // reach the workers: they start like processes of an exec'd shim.
  AttemptConfig c =
      Config({Shell("ls /proc/self/fd | tr '\\n' ' '; echo; "
                    "grep -E '^(SigBlk|SigIgn):' /proc/self/status; "
                    "ps -o sid= -p $$")});
  ProcessId shim = StartForked(c);
  AttemptOutcome o = WaitForked(shim, c.attempt_dir);
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  std::string log = Log(c.attempt_dir, 0);
  // 0, 1, 2, and the descriptor `ls` opens on /proc/self/fd.
  EXPECT_TRUE(Contains(log, "0 1 2 3 \n"));
  EXPECT_TRUE(Contains(log, "SigBlk:\t0000000000000000"));
  // No standard signal ignored (the shim ignores SIGPIPE and SIGHUP); glibc's two internal signals
  // above them are ignored in exec'd shims too.
  size_t ign = log.find("SigIgn:\t");
  ASSERT_NE(ign, std::string::npos);
  EXPECT_EQ(std::stoull(log.substr(ign + 8, 16), nullptr, 16) & 0x7fffffffULL, 0u) << log;
  EXPECT_TRUE(Contains(log, std::to_string(shim.pid)));  // the shim's session
}

TEST_F(ZygoteTest, StopReachesAForkedShimAndItOutlivesTheZygote) {
  AttemptConfig c = Config({Python("import time; print('started', flush=True); time.sleep(60)")});
  ProcessId shim = StartForked(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "started"));
  std::vector<int> spares;
  ASSERT_TRUE(WaitUntil([&] { return !(spares = Spares()).empty(); }, 3'000));
  zygote_.reset();  // what a server restart does to it
  EXPECT_TRUE(IsAlive(shim));
  // The spare waiting for the next attempt goes with the zygote.
  EXPECT_TRUE(WaitUntil([&] { return !ProcessStartTime(spares[0]).has_value(); }, 3'000));
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  AttemptOutcome o = WaitForked(shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kStopped) << o.message;
  EXPECT_TRUE(WaitUntil([&] { return SessionMembers(shim.pid).empty(); }, 3'000));
}

TEST_F(ZygoteTest, AGoneZygoteFallsBackToExec) {
  ASSERT_EQ(::kill(zygote_->pid(), SIGKILL), 0);
  AttemptConfig c = Config({Python("print('ran anyway')")});
  auto shim = StartAttempt(c, TAU_TEST_SHIM_PATH, zygote_.get());
  ASSERT_TRUE(shim.ok()) << shim.status().ToString();
  shims_.push_back(*shim);
  EXPECT_EQ(internal::ReadProcStat(shim->pid)->ppid, ::getpid());  // exec'd by us
  AttemptOutcome o = Wait(*shim, c.attempt_dir);
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
  EXPECT_EQ(zygote_->StartShim(c.attempt_dir).status().code(), StatusCode::kUnavailable);
  // Reaped, not left a zombie.
  EXPECT_FALSE(internal::ReadProcStat(zygote_->pid()).has_value());
}

TEST_F(ZygoteTest, AStoppedZygoteIsGivenUpWithinSecondsAndTheAttemptStillRuns) {
  ASSERT_EQ(::kill(zygote_->pid(), SIGSTOP), 0);
  AttemptConfig c = Config({Python("print('ran without the zygote')")});
  const int64_t t0 = MonotonicMillis();
  auto shim = StartAttempt(c, TAU_TEST_SHIM_PATH, zygote_.get());
  const int64_t waited = MonotonicMillis() - t0;
  ASSERT_TRUE(shim.ok()) << shim.status().ToString();
  shims_.push_back(*shim);
  EXPECT_GE(waited, 1'500);
  EXPECT_LT(waited, 5'000);  // not the caller's whole patience
  EXPECT_TRUE(zygote_->broken());
  EXPECT_EQ(Wait(*shim, c.attempt_dir).kind, OutcomeKind::kSucceeded);
  EXPECT_FALSE(internal::ReadProcStat(zygote_->pid()).has_value());  // killed and reaped
}

TEST_F(ZygoteTest, KillAttemptEndsAStoppedShimAndItsWorkers) {
  AttemptConfig c = Config({Shell("echo started; sleep 60")});
  ProcessId shim = StartForked(c);
  ASSERT_TRUE(WaitForLog(c.attempt_dir, 0, "started"));
  ASSERT_EQ(::kill(shim.pid, SIGSTOP), 0);
  // Asking is not enough: a stopped shim never passes the request on.
  ASSERT_TRUE(StopAttempt(shim, c.attempt_dir).ok());
  ::usleep(300'000);
  EXPECT_FALSE(SessionMembers(shim.pid).empty());
  ASSERT_TRUE(KillAttempt(shim, c.attempt_dir).ok());
  EXPECT_TRUE(WaitUntil([&] { return Gone(shim); }, 3'000));
  EXPECT_TRUE(WaitUntil([&] { return SessionMembers(shim.pid).empty(); }, 3'000));
  EXPECT_FALSE(ReadOutcome(c.attempt_dir).ok());  // it never got to write one
}

TEST_F(ZygoteTest, AnAttemptDirectoryThatCannotHoldTheLogIsAnError) {
  auto shim = zygote_->StartShim(root_ + "/no-such-dir");
  ASSERT_FALSE(shim.ok());
  EXPECT_EQ(shim.status().code(), StatusCode::kIo);
  EXPECT_TRUE(Contains(shim.status().message(), "no-such-dir"));
  // The zygote still answers.
  AttemptConfig c = Config({Python("pass")});
  ProcessId ok = StartForked(c);
  EXPECT_EQ(WaitForked(ok, c.attempt_dir).kind, OutcomeKind::kSucceeded);
}

TEST_F(ZygoteTest, AKilledSpareIsReplacedByAFork) {
  const ProcessId spare = TheSpare();
  ASSERT_GT(spare.pid, 0);
  ASSERT_EQ(::kill(spare.pid, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return !ProcessStartTime(spare.pid).has_value(); }, 3'000));
  AttemptConfig c = Config({Python("print('after the spare died')")});
  ProcessId shim = StartForked(c);
  // Another process (a pid may come round again on a busy machine; its start time does not).
  EXPECT_FALSE(shim.pid == spare.pid && shim.start_time == spare.start_time);
  EXPECT_EQ(WaitForked(shim, c.attempt_dir).kind, OutcomeKind::kSucceeded);
  EXPECT_TRUE(Contains(Log(c.attempt_dir, 0), "after the spare died"));
}

TEST_F(ZygoteTest, AStoppedSpareIsKilledAndTheAttemptRunsOnce) {
  const ProcessId spare = TheSpare();
  ASSERT_GT(spare.pid, 0);
  ASSERT_EQ(::kill(spare.pid, SIGSTOP), 0);
  AttemptConfig c = Config({Python("print('run once')")});
  ProcessId shim = StartForked(c);
  EXPECT_FALSE(shim.pid == spare.pid && shim.start_time == spare.start_time);
  EXPECT_EQ(WaitForked(shim, c.attempt_dir).kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(Log(c.attempt_dir, 0), "run once\n");
  EXPECT_FALSE(IsAlive(spare));  // killed and reaped, not left stopped
}

TEST_F(ZygoteTest, AttemptsInQuickSuccessionAllRun) {
  // More attempts than spares: the first takes the spare, the others are forked on request.
  std::vector<std::pair<ProcessId, std::string>> started;
  for (int i = 0; i < 4; ++i) {
    AttemptConfig c =
        Config({Python("print('attempt " + std::to_string(i) + "')")}, "q" + std::to_string(i));
    started.emplace_back(StartForked(c), c.attempt_dir);
  }
  for (size_t i = 0; i < started.size(); ++i) {
    EXPECT_EQ(WaitForked(started[i].first, started[i].second).kind, OutcomeKind::kSucceeded);
    EXPECT_TRUE(Contains(Log(started[i].second, 0), "attempt " + std::to_string(i)));
  }
}

TEST_F(ZygoteTest, ABatchStartsEachAttemptOnceWithItsOwnShim) {
  // More attempts than the zygote may owe answers for at once (16): each gets its own shim, and
  // the answers come back to the attempt they belong to.
  constexpr int kAttempts = 40;
  ShimBatch batch(TAU_TEST_SHIM_PATH, zygote_.get());
  std::vector<std::string> dirs;
  for (int i = 0; i < kAttempts; ++i) {
    AttemptConfig c = Config({Shell("echo batch " + std::to_string(i))}, "b" + std::to_string(i));
    EXPECT_EQ(batch.Add(c), static_cast<size_t>(i));
    dirs.push_back(c.attempt_dir);
  }
  std::vector<Result<ProcessId>> shims = batch.Wait();
  ASSERT_EQ(shims.size(), static_cast<size_t>(kAttempts));
  std::set<int> pids;
  for (int i = 0; i < kAttempts; ++i) {
    ASSERT_TRUE(shims[i].ok()) << shims[i].status().ToString();
    shims_.push_back(*shims[i]);
    pids.insert(shims[i]->pid);
  }
  EXPECT_EQ(pids.size(), static_cast<size_t>(kAttempts));
  for (int i = 0; i < kAttempts; ++i) {
    AttemptOutcome o = WaitForked(*shims[i], dirs[i]);
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
    EXPECT_EQ(Log(dirs[i], 0), "batch " + std::to_string(i) + "\n");
    // The pid the batch answered for this attempt is the one that holds its supervisor lock.
    ProcessId holder;
    EXPECT_EQ(ProbeSupervisor(dirs[i], &holder), SupervisorState::kGone);
    auto lock = ReadFile(dirs[i] + "/" + kSupervisorLockFile);
    ASSERT_TRUE(lock.ok());
    EXPECT_EQ(std::atoi(lock->c_str()), shims[i]->pid) << *lock;
  }
  EXPECT_TRUE(batch.Wait().empty());  // emptied: the batch may be used again
}

TEST_F(ZygoteTest, ABatchWhoseZygoteStopsExecsTheRest) {
  // Stopped: the requests are sent but never answered. The batch gives up on the zygote within
  // seconds (not seconds per attempt) and execs the shims it owed.
  ASSERT_EQ(::kill(zygote_->pid(), SIGSTOP), 0);
  ShimBatch batch(TAU_TEST_SHIM_PATH, zygote_.get());
  AttemptConfig first = Config({Python("print('first')")}, "s0");
  batch.Add(first);
  AttemptConfig second = Config({Python("print('second')")}, "s1");
  AttemptConfig bad = Config({Python("print('never')")}, "s2");
  bad.workers.clear();  // refused before anything starts
  AttemptConfig third = Config({Python("print('third')")}, "s3");
  batch.Add(second);
  batch.Add(bad);
  batch.Add(third);
  const int64_t t0 = MonotonicMillis();
  std::vector<Result<ProcessId>> shims = batch.Wait();
  EXPECT_LT(MonotonicMillis() - t0, 5'000);
  ASSERT_EQ(shims.size(), 4u);
  EXPECT_TRUE(zygote_->broken());
  EXPECT_EQ(shims[2].status().code(), StatusCode::kInvalidArgument);
  const std::vector<std::pair<int, std::string>> ran = {{0, "first"}, {1, "second"}, {3, "third"}};
  for (const auto& [i, word] : ran) {
    ASSERT_TRUE(shims[i].ok()) << shims[i].status().ToString();
    shims_.push_back(*shims[i]);
  }
  for (const auto& [i, word] : ran) {
    const std::string& dir = i == 0   ? first.attempt_dir
                             : i == 1 ? second.attempt_dir
                                      : third.attempt_dir;
    EXPECT_EQ(internal::ReadProcStat(shims[i]->pid)->ppid, ::getpid());  // exec'd by us
    EXPECT_TRUE(PathExists(dir + "/config.json"));  // which reads its config from the file
    AttemptOutcome o = Wait(*shims[i], dir);
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.message;
    EXPECT_TRUE(Contains(Log(dir, 0), word)) << Log(dir, 0);
  }
}

}  // namespace
}  // namespace tau::runtime
