#include "backend/local/local_backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "backend/local/host_info.h"
#include "backend/snapshot.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/layout.h"
#include "common/ports.h"
#include "common/strings.h"
#include "common/users.h"
#include "recovery/failure_class.h"
#include "recovery/recovery.h"
#include "spec/workflow.h"

extern char** environ;

namespace tau::server {

using recovery::FailureClass;
using store::AttemptRecord;
using store::AttemptState;
using store::Batch;
using store::Event;
using store::RunRecord;
using store::RunState;

namespace {

// Scheduling cycles per pass at most: each cycle admits at most one run per queue head, as Kueue's
// scheduler does; the loop runs again right away when work is left.
constexpr int kMaxCyclesPerPass = 256;

// Appends a newline to a file that does not end with one (a missing or empty file is left alone).
void EndPartialLine(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  struct stat st;
  char last = '\n';
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n')
    (void)!::write(fd, "\n", 1);
  ::close(fd);
}

// A free TCP port for a gang's rendezvous (MASTER_PORT). The kernel picks it; the window in which
// another program could take it before the gang binds it is small and only costs that attempt.
std::string Plural(int64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// The failure class of a finished attempt (see docs/architecture.md, "Failure classes").
FailureClass ClassOf(const runtime::AttemptOutcome& o, bool cancel_requested) {
  switch (o.kind) {
    case runtime::OutcomeKind::kSucceeded:
      return FailureClass::kSucceeded;
    case runtime::OutcomeKind::kSetupFailed:
      return FailureClass::kSetupError;
    case runtime::OutcomeKind::kTimedOut:
      return FailureClass::kTimeout;
    case runtime::OutcomeKind::kStopped:
      return cancel_requested ? FailureClass::kCancelled : FailureClass::kEvicted;
    case runtime::OutcomeKind::kFailed:
      return o.oom_killed ? FailureClass::kOOMKilled : FailureClass::kUserError;
  }
  return FailureClass::kUnknown;
}

}  // namespace

class LocalBackend final : public Backend {
 public:
  explicit LocalBackend(LocalBackendOptions options) : options_(std::move(options)) {
    free_cpu_milli_ = options_.cpu_capacity_milli;
    free_memory_bytes_ = options_.memory_capacity_bytes;
    for (const auto& d : options_.gpus.devices) free_gpus_.insert(d.index);
  }
  ~LocalBackend() override { Stop(); }

  const char* Name() const override { return "local"; }
  Capabilities Caps() const override { return LocalCapabilities(); }
  Status Start(RunHost* host, const policy::Platform* applied) override;
  void Stop() override;
  Status CheckFits(const Resources& need) override;
  Status Check(const SubmissionCheck& check) override;
  Status ApplyPlatform(const policy::Platform&) override { return Status::Ok(); }
  void Recover(ActiveRun& run, Batch* batch) override;
  void HandleExit(const std::string& name, Batch* batch) override;
  void HandleNews(const AttemptNews&, Batch*) override {}
  void HandleGpuNews(const GpuNews& news, Batch* batch) override;
  void Cancel(ActiveRun& run, Batch* batch) override;
  void StopAttempt(ActiveRun& run, FailureClass cls, const std::string& why, Batch* batch) override;
  void Schedule(Batch* batch) override {
    if (!left_overs_detached_) {
      // After every re-adopted attempt's ports are guarded again (Recover): what a killed server
      // of this home left attached goes.
      left_overs_detached_ = true;
      if (::geteuid() == 0) runtime::PortGuard::DetachLeftOvers(options_.home, port_guard_.get());
    }
    AdmitQueued(batch, &to_start_);
    EscalateStops(batch);
    PollNotices(batch);
  }
  void Committed() override { StopCommitted(); }
  void Launch(Batch* batch) override { StartAttempts(to_start_, batch); }
  void Launched() override;
  void Release(ActiveRun& run) override;
  nlohmann::json PendingReason(const ActiveRun& run, int64_t now) override;
  std::string RequeueNote(const ActiveRun& run) override;
  int64_t NextWakeMillis(int64_t now, int64_t limit) const override;
  std::vector<RunningAttempt> RunningAttempts() const override;
  std::optional<int64_t> OutputBytes(const ActiveRun& run) override;
  std::optional<int> DumpStacks(const ActiveRun& run) override;
  void DescribeRuntime(const RunRecord& r, bool final_save, const evidence::RecordInput* prev,
                       evidence::RuntimeInfo* rt) const override;
  void FillCapacity(MachineCapacity* capacity) const override;
  void Forget(const std::string& run) override {
    UnguardPorts(run);
    runs_.erase(run);
  }

 private:
  // What this backend keeps of a run beside the controller's ActiveRun.
  struct LocalRun {
    std::optional<runtime::ProcessId> shim;  // its attempt's supervisor, while there is one
    // Set once its attempt was asked to stop: past it, the server kills the supervisor itself.
    int64_t stop_deadline_ms = -1;
    bool holds_machine = false;  // its CPUs and memory are taken from this machine's free ones
    // How far its attempt's notices.jsonl has been read, and which attempt's.
    int notices_attempt = 0;
    int64_t notices_offset = 0;
    std::vector<int> guarded_ports;  // its attempt's loopback ports, its user's alone
  };
  LocalRun& Of(const ActiveRun& run) { return runs_[run.record.name]; }

  QuotaBook& quota() { return host_->quota(); }
  // Why a run can never fit on this machine, or "" when it can; it starts with the field, which the
  // CLI follows to where it was set (the file's line, or the --set).
  std::string Refusal(const Resources& need) const;
  // Gives the run's storage directories to the submitter, and the attempt's processes their ids
  // (the shim hands over the code tree it makes).
  Status RunAsSubmitter(const RunRecord& r, const runtime::LaunchContext& ctx,
                        runtime::AttemptConfig* config);
  static Status CheckSupported(const SubmissionCheck& c);
  Status CheckEntrypoint(const SubmissionCheck& c);
  Result<std::string> DecideRunAs(const SubmissionCheck& c) const;
  Status CheckReachableFor(const std::string& run_as, const SubmissionCheck& c) const;
  // Accounts from uid 1000 up are people's (login.defs' UID_MIN); below are the system's own.
  static constexpr uint32_t kFirstPersonUid = 1000;
  static constexpr uint32_t kNobodyUid = 65534;
  // Whom a run's processes run as: nullopt for the server's own user (a server not running as
  // root, or a run root submitted).
  static Result<std::optional<runtime::AttemptConfig::RunAs>> SubmitterIds(const RunRecord& r);
  // Where the virtualenvs of the runs of `ids` are cached (each user its own: pip runs a package's
  // own code, as that user).
  std::string VenvCacheDir(const std::optional<runtime::AttemptConfig::RunAs>& ids) const;
  runtime::EnvList BaseEnv() const;
  void StartZygote();
  void AdmitQueued(Batch* batch, std::vector<std::string>* to_start);
  // Puts a run that holds quota on this machine when its GPUs, CPUs and memory are free.
  bool Place(ActiveRun& run, Batch* batch);
  void HandlePreemption(const admission::PreemptedInfo& p, Batch* batch);
  // Starts the next attempt of each run: prepared one after another while the zygote forks their
  // shims (runtime::ShimBatch), then recorded as Running, or failed with SetupError.
  void StartAttempts(const std::vector<std::string>& names, Batch* batch);
  struct StartingAttempt {
    std::string name;
    AttemptRecord attempt;
    size_t processes = 0;
    size_t index = 0;  // in the ShimBatch
  };
  std::optional<StartingAttempt> PrepareAttempt(const std::string& name, runtime::ShimBatch* shims,
                                                Batch* batch);
  void AttemptStarted(StartingAttempt s, const Result<runtime::ProcessId>& shim, Batch* batch);
  void FailStart(ActiveRun& run, AttemptRecord a, FailureClass reason, const std::string& message,
                 Batch* batch);
  // Stopping an attempt acts on a decision, so it waits for the decision's commit: the loop calls
  // StopCommitted after each commit of its batch. A supervisor that has not ended its attempt
  // kStopMarginMs after the grace period is killed, with its workers (EscalateStops).
  void StopAfterCommit(const std::string& name);
  void StopCommitted();
  void EscalateStops(Batch* batch);
  // Recovery: the stop the server asked of a running attempt before it restarted (cancel,
  // preemption, a failed GPU), from the run's events; the attempt is asked again.
  void RestoreStopRequest(ActiveRun& run, int64_t attempt_started_ms);
  static constexpr int64_t kStopMarginMs = 5'000;
  // What the attempts' shims noticed (a log cut at its cap, output a full disk dropped) becomes
  // events of their runs: read here, on the decision thread, because the file is small (one open
  // that finds nothing, for most attempts) and an event read here is never posted after its run
  // ended. Each running attempt's every second, and the rest at its exit.
  void PollNotices(Batch* batch);
  void ReadNotices(ActiveRun& run, int attempt, const std::string& dir, Batch* batch);
  static constexpr int64_t kNoticePollMs = 1'000;
  // The loopback ports an attempt is handed (its gang's rendezvous port, its replica's port) are
  // reachable only by its user and root (runtime::PortGuard), where the server is root and the
  // machine can guard them; kept in the attempt's directory (kGuardedPortsFile) for a restart.
  Status GuardPorts(ActiveRun& run, const std::string& attempt_dir, const std::vector<int>& ports,
                    uint32_t uid);
  void UnguardPorts(const std::string& run);
  void ReguardAfterRestart(ActiveRun& run, const std::string& attempt_dir);
  runtime::PortGuard* Guard();
  static constexpr const char* kGuardedPortsFile = "guarded-ports";
  std::unique_ptr<runtime::PortGuard> port_guard_;
  bool port_guard_tried_ = false;
  bool left_overs_detached_ = false;
  std::map<int, std::string> guarded_by_;  // port -> the run whose attempt holds it
  int64_t last_notice_poll_ms_ = 0;

  const LocalBackendOptions options_;
  RunHost* host_ = nullptr;
  std::unique_ptr<runtime::ProcessWatcher> watcher_;
  std::unique_ptr<runtime::Zygote> zygote_;  // forks the shims
  int64_t zygote_restarted_ms_ = 0;          // the last restart of a broken zygote; 0: none yet
  std::vector<std::string> stops_;           // runs whose attempt stops after the next commit
  std::vector<std::string> to_start_;        // admitted this pass: started after the commit
  std::set<int> free_gpus_;
  std::map<int, std::string> unplaceable_gpus_;  // GPU index -> why (Unhealthy or Unknown verdict)
  int64_t free_cpu_milli_ = 0;
  int64_t free_memory_bytes_ = 0;
  std::map<std::string, LocalRun> runs_;  // by run name, until the run ends (Forget)
};

Status LocalBackend::Start(RunHost* host, const policy::Platform*) {
  host_ = host;
  auto watcher = runtime::ProcessWatcher::Create(
      [host](const std::string& key) { host->Post(AttemptExited{key}); });
  if (!watcher.ok()) return watcher.status();
  watcher_ = std::move(*watcher);
  // The Python hook of stack dumps, put first on a worker's path where its workspace watches for
  // stalls (PrepareAttempt). Readable by every run's user.
  const std::string hook = layout::PythonHookDir(options_.home);
  TAU_RETURN_IF_ERROR(MakeDirs(hook, 0755));
  TAU_RETURN_IF_ERROR(
      WriteFileIfChanged(hook + "/sitecustomize.py", runtime::PythonHookSource(), 0644));
  StartZygote();
  return Status::Ok();
}

runtime::PortGuard* LocalBackend::Guard() {
  if (!port_guard_tried_) {
    port_guard_tried_ = true;
    auto started = runtime::PortGuard::Start(options_.home);
    if (started.ok()) {
      port_guard_ = std::move(*started);
    } else {
      std::fprintf(stderr,
                   "tau server: runs' loopback ports (rendezvous, replicas) are not guarded: any "
                   "local user may connect to them: %s\n",
                   started.status().ToString().c_str());
    }
  }
  return port_guard_.get();
}

Status LocalBackend::GuardPorts(ActiveRun& run, const std::string& attempt_dir,
                                const std::vector<int>& ports, uint32_t uid) {
  if (ports.empty() || ::geteuid() != 0) return Status::Ok();
  runtime::PortGuard* guard = Guard();
  if (guard == nullptr) return Status::Ok();  // said once; serve status says so
  std::string kept;
  for (int port : ports) {
    TAU_RETURN_IF_ERROR(guard->Allow(port, uid));
    guarded_by_[port] = run.record.name;
    Of(run).guarded_ports.push_back(port);
    kept += fmt::format("{} {}\n", port, uid);
  }
  return WriteFileAtomic(attempt_dir + "/" + kGuardedPortsFile, kept, 0600,
                         Durability::kProcessCrash);
}

void LocalBackend::UnguardPorts(const std::string& run) {
  auto it = runs_.find(run);
  if (it == runs_.end()) return;
  for (int port : it->second.guarded_ports) {
    auto held = guarded_by_.find(port);
    // A port handed to another run since is that run's now.
    if (held == guarded_by_.end() || held->second != run) continue;
    guarded_by_.erase(held);
    if (port_guard_) port_guard_->Release(port);
  }
  it->second.guarded_ports.clear();
}

void LocalBackend::ReguardAfterRestart(ActiveRun& run, const std::string& attempt_dir) {
  auto kept = ReadFileAtMost(attempt_dir + "/" + kGuardedPortsFile, 4096, "guarded ports");
  if (!kept.ok()) return;  // none were guarded
  for (const std::string& line : Split(*kept, '\n')) {
    int port = 0;
    unsigned uid = 0;
    if (std::sscanf(line.c_str(), "%d %u", &port, &uid) != 2) continue;
    runtime::PortGuard* guard = Guard();
    if (guard == nullptr) return;
    if (Status s = guard->Allow(port, uid); !s.ok()) {
      std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
      continue;
    }
    guarded_by_[port] = run.record.name;
    Of(run).guarded_ports.push_back(port);
  }
}

void LocalBackend::Stop() {
  if (watcher_) watcher_->Stop();
  zygote_.reset();
}

Status LocalBackend::CheckFits(const Resources& need) {
  if (std::string why = Refusal(need); !why.empty()) return FailedPrecondition(why);
  return Status::Ok();
}

Status LocalBackend::Check(const SubmissionCheck& c) {
  TAU_RETURN_IF_ERROR(CheckSupported(c));
  TAU_RETURN_IF_ERROR(CheckEntrypoint(c));
  TAU_ASSIGN_OR_RETURN(std::string run_as, DecideRunAs(c));
  if (!run_as.empty()) TAU_RETURN_IF_ERROR(CheckReachableFor(run_as, c));
  if (c.run_as != nullptr) *c.run_as = std::move(run_as);
  return Status::Ok();
}

// What only a cluster can do is refused here, at submission, rather than accepted and ignored. Each
// message starts with the field, so that the CLI prints it at the field's position.
Status LocalBackend::CheckSupported(const SubmissionCheck& c) {
  if (!c.spec->source.image.empty() || !c.spec->source.path.empty())
    return InvalidArgument(
        "run.source: the local backend runs the code sent with the run; code inside a container "
        "image needs the Kubernetes backend (remove run.source to run this directory's code)");
  if (!c.spec->storage.image_assets.empty())
    return InvalidArgument(
        "storage.image_assets: the local backend runs no container images, so it cannot copy "
        "files out of them; this needs the Kubernetes backend");
  return Status::Ok();
}

Status LocalBackend::CheckEntrypoint(const SubmissionCheck& c) {
  // What is known before admission is refused before admission: a run whose entrypoint cannot
  // start would otherwise be admitted, perhaps preempt others, and fail a moment later. (On a
  // cluster the image may hold what the snapshot lacks, so this is the local backend's check.)
  std::vector<runtime::ShippedFile> files;
  for (const nlohmann::json& f : *c.snapshot_files) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string()) continue;
    files.push_back({f["path"].get<std::string>(), f.value("mode", 0644)});
  }
  Status s = runtime::CheckStartable(*c.spec, c.resolved->gpus_per_worker, c.resolved->code_subdir,
                                     files, std::getenv("PATH") ? std::getenv("PATH") : "");
  // The message starts with the field it is about: the client names the line that set it (or
  // the --set that did), which the spec's file name alone would not.
  return s;
}

// Whom a run's processes run as, decided once at submission: on a server that is not root, its
// own user (""); else the submitter's system account, and for a token user without one (or with
// only a system account, uid below 1000, that was never meant for a person) a user of the
// workspace's run_users pool of their own. Two users never share a uid.
Result<std::string> LocalBackend::DecideRunAs(const SubmissionCheck& c) const {
  if (::geteuid() != 0) return std::string();
  const std::string& user = c.caller->user;
  if (!c.token_user) return user == "root" ? std::string() : user;  // the kernel said who
  auto self = LookUpUserById(::geteuid());
  if (self.ok() && self->name == user) return std::string();  // the server's own user
  if (auto account = LookUpUserByName(user);
      account.ok() && account->uid >= kFirstPersonUid && account->uid != kNobodyUid)
    return user;
  const policy::Workspace* w = c.platform->FindWorkspace(c.resolved->workspace);
  const std::string where =
      fmt::format("workspaces[{}].run_users in platform.yaml", c.resolved->workspace);
  if (w == nullptr || w->run_users.empty())
    return FailedPrecondition(fmt::format(
        "token user '{}' has no account on this machine and workspace '{}' has no run_users "
        "for such users (runs of different users never share a uid): give '{}' a system "
        "account, or add system users to {} (docs/platform.md)",
        user, c.resolved->workspace, user, where));
  std::vector<std::string> usable, missing, keep;
  for (const std::string& name : w->run_users) {
    auto account = LookUpUserByName(name);
    (account.ok() && account->uid != 0 ? usable : missing).push_back(name);
  }
  // One the platform has since dropped from the pool stays theirs while it exists (it is never
  // another's), rather than taking a second account of the pool from someone else for good.
  auto held = host_->store()->RunUsersOf(w->name, user);
  if (!held.ok()) return held.status();
  for (const store::RunUserRecord& r : *held) {
    auto account = LookUpUserByName(r.system_user);
    if (account.ok() && account->uid != 0 && account->uid < kFirstPersonUid)
      keep.push_back(r.system_user);
  }
  if (usable.empty() && keep.empty())
    return FailedPrecondition(
        fmt::format("none of the system users of {} exists on this machine ({}): create them, e.g. "
                    "`useradd --system --no-create-home --shell /usr/sbin/nologin {}`",
                    where, Join(missing, ", "), missing.front()));
  auto assigned = host_->store()->AssignRunUser(w->name, user, keep, usable, host_->Now());
  if (assigned.status().code() == StatusCode::kResourceExhausted)
    return FailedPrecondition(fmt::format(
        "every system user of {} ({}) already runs another user's runs, and token user '{}' "
        "needs one of their own: add system users there{}",
        where, Join(usable, ", "), user,
        missing.empty() ? "" : " (or create the missing " + Join(missing, ", ") + ")"));
  return assigned;
}

// The run's user must reach what the run uses: the server's home (whose own directories tau
// opens to them), and the storage volumes it mounts; and, for Python, a python3 of its own.
Status LocalBackend::CheckReachableFor(const std::string& run_as, const SubmissionCheck& c) const {
  auto account = LookUpUserByName(run_as);
  if (!account.ok())
    return FailedPrecondition(
        fmt::format("runs of '{}' run as the system user of that name, and there is none: {}",
                    run_as, account.status().message()));
  const std::string hint =
      " (the run's processes run as that user; make the directory searchable for them, or use a "
      "home outside private directories, e.g. `tau server --home /var/lib/tau`, root's default)";
  std::string above_home = std::filesystem::path(options_.home).parent_path().string();
  if (Status s = CheckReachable(above_home, *account, false); !s.ok())
    return FailedPrecondition(s.message() + hint);
  for (const policy::Mount& m : c.resolved->mounts) {
    if (m.host_path.empty()) continue;
    if (Status s = CheckReachable(m.host_path, *account, m.role == "data"); !s.ok())
      return FailedPrecondition(fmt::format("storage volume '{}': {}", m.volume, s.message()));
  }
  if (EndsWith(c.spec->entrypoint, ".py") || !c.spec->runtime.pip.empty()) {
    const char* path = std::getenv("PATH");
    auto python = FindExecutableFor("python3", path ? path : "/usr/bin:/bin", *account);
    if (!python.ok())
      return FailedPrecondition(fmt::format(
          "the run needs python3 as user {}: {}; put a python3 they may run on the server's "
          "PATH",
          run_as, python.status().message()));
  }
  return Status::Ok();
}

// Why a run can never fit on this machine, or "" when it can; it starts with the field, which the
// CLI follows to where it was set (the file's line, or the --set).
std::string LocalBackend::Refusal(const Resources& need) const {
  int total_gpus = static_cast<int>(options_.gpus.devices.size());
  if (need.gpus > 0 && total_gpus == 0)
    return fmt::format(
        "compute.gpus: this run asks for {} but this machine has none ({}). tau never runs a GPU "
        "job on the CPU "
        "silently: run it on a machine with NVIDIA GPUs, or set compute.gpus: 0 to run on the CPU",
        Plural(need.gpus, "GPU", "GPUs"),
        options_.gpus.note.empty() ? "no GPUs found" : options_.gpus.note);
  if (need.gpus > total_gpus)
    return fmt::format("compute.gpus: this run asks for {} in all but this machine has only {}",
                       Plural(need.gpus, "GPU", "GPUs"), total_gpus);
  if (need.cpu_milli > options_.cpu_capacity_milli)
    return fmt::format("compute.cpus: this run asks for {:g} CPUs in all but this machine has {:g}",
                       static_cast<double>(need.cpu_milli) / 1000,
                       static_cast<double>(options_.cpu_capacity_milli) / 1000);
  if (need.memory_bytes > options_.memory_capacity_bytes)
    return fmt::format(
        "compute.memory: this run asks for {} of memory in all but this machine has {}",
        FormatBytes(need.memory_bytes), FormatBytes(options_.memory_capacity_bytes));
  return "";
}

// A server running as root serves a multi-user machine: each run's processes run as the user who
// submitted it (a token user without a system account as `nobody`), never as root unless root
// submitted it. What the run writes to is handed to that user first; its virtualenvs are built as
// that user too (pip runs a package's own code), in a cache of their own.
Result<std::optional<runtime::AttemptConfig::RunAs>> LocalBackend::SubmitterIds(
    const RunRecord& r) {
  using Ids = std::optional<runtime::AttemptConfig::RunAs>;
  if (::geteuid() != 0) return Ids();  // runs run as the server's user
  if (r.run_as && r.run_as->empty()) return Ids();
  if (r.run_as) {
    auto run_as = runtime::LookUpUser(*r.run_as);
    if (!run_as.ok())
      return FailedPrecondition(
          fmt::format("this run runs as system user '{}', which no longer exists: {}", *r.run_as,
                      run_as.status().message()));
    if (run_as->uid == 0) return Ids();
    return Ids(std::move(*run_as));
  }
  // A run submitted before tau decided this at submission: as it was decided then.
  std::string user = r.owner.empty() ? "root" : r.owner;
  auto run_as = runtime::LookUpUser(user);
  if (!run_as.ok()) run_as = runtime::LookUpUser("nobody");
  if (!run_as.ok()) return FailedPrecondition("no system user to run as: " + user);
  if (run_as->uid == 0) return Ids();
  return Ids(std::move(*run_as));
}

std::string LocalBackend::VenvCacheDir(
    const std::optional<runtime::AttemptConfig::RunAs>& ids) const {
  return ids ? layout::VenvsDir(options_.home, ids->uid) : layout::VenvsDir(options_.home);
}

Status LocalBackend::RunAsSubmitter(const RunRecord& r, const runtime::LaunchContext& ctx,
                                    runtime::AttemptConfig* config) {
  TAU_ASSIGN_OR_RETURN(std::optional<runtime::AttemptConfig::RunAs> run_as, SubmitterIds(r));
  if (!run_as) return Status::Ok();
  uid_t uid = run_as->uid;
  gid_t gid = run_as->gid;
  // What the run writes is its user's, and no one else's: another user who knows the run's name
  // finds every entry of its directory closed (the attempts' logs and the evidence stay the
  // server's, mode 0700). The shim hands the code tree over when it has made it.
  for (const std::string& dir : {ctx.checkpoint_dir, ctx.output_dir}) {
    TAU_RETURN_IF_ERROR(ChownTree(dir, uid, gid));
    if (::chmod(dir.c_str(), 0700) != 0) return IoError("chmod " + dir, errno);
  }
  // The user reaches them through the server's directories: searchable, not listable.
  for (const std::string& dir :
       {options_.home, layout::RunsDir(options_.home), layout::RunDir(options_.home, r.name)})
    if (::chmod(dir.c_str(), 0711) != 0) return IoError("chmod " + dir, errno);
  // The metrics file lives in the run's directory, which stays the server's.
  int fd = ::open(ctx.metrics_file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return IoError("creating " + ctx.metrics_file, errno);
  int rc = ::fchown(fd, uid, gid);
  if (rc == 0) rc = ::fchmod(fd, 0600);
  ::close(fd);
  if (rc != 0) return IoError("chown " + ctx.metrics_file, errno);
  config->venv_cache_dir = VenvCacheDir(run_as);
  if (::chmod(layout::VenvsDir(options_.home).c_str(), 0711) != 0)
    return IoError("chmod " + layout::VenvsDir(options_.home), errno);
  TAU_RETURN_IF_ERROR(MakeDirs(config->venv_cache_dir, 0700));
  TAU_RETURN_IF_ERROR(ChownTree(config->venv_cache_dir, uid, gid));
  config->run_as = std::move(*run_as);
  return Status::Ok();
}

runtime::EnvList LocalBackend::BaseEnv() const {
  // What a run inherits from the server: enough to find programs and behave, not the server's
  // secrets.
  static const char* kPassThrough[] = {
      "PATH",       "HOME",        "USER",     "LOGNAME",         "SHELL",
      "LANG",       "TZ",          "TMPDIR",   "LD_LIBRARY_PATH", "CUDA_HOME",
      "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY",      "HTTPS_PROXY",
      "NO_PROXY"};
  runtime::EnvList env;
  for (const char* name : kPassThrough)
    if (const char* v = std::getenv(name)) env.emplace_back(name, v);
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    if (StartsWith(kv, "LC_") || StartsWith(kv, "PIP_") || StartsWith(kv, "NVIDIA_")) {
      size_t eq = kv.find('=');
      if (eq != std::string_view::npos)
        env.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
  }
  return env;
}

void LocalBackend::StartZygote() {
  auto zygote = runtime::Zygote::Start(options_.tau_binary);
  if (!zygote.ok()) {
    std::fprintf(stderr, "tau server: shims will be exec'd, not forked: %s\n",
                 zygote.status().ToString().c_str());
    return;
  }
  if (zygote_)
    std::fprintf(stderr, "tau server: started another zygote (pid %d)\n", (*zygote)->pid());
  zygote_ = std::move(*zygote);
}

void LocalBackend::RestoreStopRequest(ActiveRun& run, int64_t attempt_started_ms) {
  auto events = host_->store()->ListEvents(run.record.name);
  if (!events.ok()) return;
  auto text = [](const Event& e, const char* key, const std::string& fallback) {
    auto it = e.data.find(key);
    return it != e.data.end() && it->is_string() ? it->get<std::string>() : fallback;
  };
  for (const Event& e : *events) {
    if (e.ts_ms < attempt_started_ms) continue;
    if (e.type == "Preempted") {
      run.preempted_by = text(e, "preemptor", "another run");
      run.preemption_reason = text(e, "reason", "");
    } else if (e.type == "GPUError") {
      run.gpu_error = text(e, "error", e.message);
    }
  }
}

void LocalBackend::HandleGpuNews(const GpuNews& news, Batch* batch) {
  if (news.placeable) {
    if (!unplaceable_gpus_.erase(news.gpu)) return;
    bool held = false;
    for (const auto& [name, run] : host_->active())
      for (int g : run.record.gpus) held = held || g == news.gpu;
    if (!held) free_gpus_.insert(news.gpu);
    return;
  }
  unplaceable_gpus_[news.gpu] = news.why;
  free_gpus_.erase(news.gpu);
  // Unknown (a read that failed), or a repair pending until the next reset: what runs finishes.
  if (!news.stop_running) return;
  for (auto& [name, local] : runs_) {
    auto it = host_->active().find(name);
    if (!local.shim || it == host_->active().end()) continue;
    ActiveRun& run = it->second;
    if (!run.gpu_error.empty() || store::IsTerminal(run.record.state)) continue;
    const std::vector<int>& held = run.record.gpus;
    if (std::find(held.begin(), held.end(), news.gpu) == held.end()) continue;
    run.gpu_error = fmt::format("GPU {} turned unhealthy: {}", news.gpu, news.why);
    batch->events.push_back({0,
                             name,
                             host_->Now(),
                             "GPUError",
                             run.gpu_error + "; stopping the attempt",
                             {{"gpu", news.gpu}, {"error", run.gpu_error}},
                             "",
                             ""});
    StopAfterCommit(name);
  }
}

void LocalBackend::StopAfterCommit(const std::string& name) { stops_.push_back(name); }

void LocalBackend::StopCommitted() {
  for (const std::string& name : std::exchange(stops_, {})) {
    auto it = host_->active().find(name);
    if (it == host_->active().end() || !Of(it->second).shim) continue;
    ActiveRun& run = it->second;
    // A run with a supervisor is on its latest attempt.
    Status s = runtime::StopAttempt(*Of(run).shim, host_->AttemptDir(name, run.record.attempts));
    if (!s.ok())
      std::fprintf(stderr, "tau server: stop %s: %s\n", name.c_str(), s.ToString().c_str());
    // The shim gives its workers the grace period; one that is itself stopped or stuck never
    // ends them, so the server does, a little after the shim should have.
    if (Of(run).stop_deadline_ms < 0)
      Of(run).stop_deadline_ms = host_->Now() + options_.stop_grace_ms + kStopMarginMs;
  }
}

void LocalBackend::EscalateStops(Batch* batch) {
  const int64_t now = host_->Now();
  for (auto& [name, local] : runs_) {
    auto it = host_->active().find(name);
    if (!local.shim || local.stop_deadline_ms < 0 || now < local.stop_deadline_ms ||
        it == host_->active().end())
      continue;
    const ActiveRun& run = it->second;
    local.stop_deadline_ms = now + kStopMarginMs;  // until the watcher reports the exit
    batch->events.push_back(
        {0,
         name,
         now,
         "StopForced",
         fmt::format("the attempt's supervisor (pid {}) did not end the attempt within {} of the "
                     "request; killing it and the attempt's processes",
                     Of(run).shim->pid, FormatDuration(options_.stop_grace_ms + kStopMarginMs)),
         {{"shim_pid", Of(run).shim->pid}},
         "",
         ""});
    // Killed at once rather than after the commit: the event only explains, and a stuck
    // supervisor must not hold GPUs any longer than it has.
    Status s = runtime::KillAttempt(*Of(run).shim, host_->AttemptDir(name, run.record.attempts));
    if (!s.ok())
      std::fprintf(stderr, "tau server: kill %s: %s\n", name.c_str(), s.ToString().c_str());
  }
}

void LocalBackend::FailStart(ActiveRun& run, AttemptRecord a, FailureClass reason,
                             const std::string& message, Batch* batch) {
  run::AttemptEnd end;
  end.failure_class = reason;
  end.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kSetupFailed);
  end.message = message;  // never ran the job: no exit code
  host_->AttemptEnded(run, std::move(a), end, batch);
}

void LocalBackend::StartAttempts(const std::vector<std::string>& names, Batch* batch) {
  runtime::ShimBatch shims(options_.tau_binary, zygote_.get());
  std::vector<StartingAttempt> starting;
  for (const std::string& name : names)
    if (auto s = PrepareAttempt(name, &shims, batch)) starting.push_back(std::move(*s));
  std::vector<Result<runtime::ProcessId>> started = shims.Wait();
  // A zygote that died or got stuck is replaced at once, so that later attempts are forked again;
  // if its replacements keep breaking, a new one is tried at most every 10 s.
  if (zygote_ && zygote_->broken() &&
      (zygote_restarted_ms_ == 0 || host_->Now() - zygote_restarted_ms_ >= 10'000)) {
    zygote_restarted_ms_ = host_->Now();
    StartZygote();
  }
  for (StartingAttempt& s : starting) {
    const size_t index = s.index;
    AttemptStarted(std::move(s), started[index], batch);
  }
}

std::optional<LocalBackend::StartingAttempt> LocalBackend::PrepareAttempt(const std::string& name,
                                                                          runtime::ShimBatch* shims,
                                                                          Batch* batch) {
  ActiveRun& run = host_->active().at(name);
  RunRecord& r = run.record;
  int number = r.attempts + 1;
  std::string run_dir = layout::RunDir(options_.home, name);
  AttemptRecord a;
  a.run = name;
  a.number = number;
  a.dir = host_->AttemptDir(name, number);
  a.gpus = r.gpus;
  a.started_ms = host_->Now();
  auto fail = [&](FailureClass reason,
                  const std::string& message) -> std::optional<StartingAttempt> {
    FailStart(run, a, reason, message, batch);
    return std::nullopt;
  };
  runtime::LaunchContext ctx;
  ctx.run_name = name;
  ctx.attempt = number;
  // The snapshot's copy; the run starts in the spec's folder inside it.
  const std::string code_root = layout::WorkDir(run_dir);
  ctx.work_dir =
      run.resolved.code_subdir.empty() ? code_root : code_root + "/" + run.resolved.code_subdir;
  ctx.shipped_dir = run.resolved.code_subdir.empty()
                        ? r.snapshot_dir
                        : r.snapshot_dir + "/" + run.resolved.code_subdir;
  ctx.checkpoint_dir = host_->StorageDir(r, "checkpoint");
  ctx.output_dir = host_->StorageDir(r, "output");
  for (const policy::Mount& m : run.resolved.mounts)
    if (m.role == "data" && !m.host_path.empty())
      ctx.extra_env.emplace_back("TAU_DATA_DIR", m.host_path);
  ctx.metrics_file = layout::MetricsFile(run_dir);
  if (r.array.is_object() && r.array.value("index", nlohmann::json()).is_number_integer())
    ctx.extra_env.emplace_back("TAU_ARRAY_INDEX", std::to_string(r.array["index"].get<int64_t>()));
  std::vector<std::string> read_only;
  if (run.upstreams) {
    // A workflow stage reads what the stages before it left, as they left it.
    for (const UpstreamRun& u : *run.upstreams) {
      const std::string prefix = "TAU_UPSTREAM_" + spec::StageEnvName(u.stage);
      ctx.extra_env.emplace_back(prefix + "_RUN", u.run);
      ctx.extra_env.emplace_back(prefix + "_CHECKPOINT_DIR", u.checkpoint_dir);
      ctx.extra_env.emplace_back(prefix + "_OUTPUT_DIR", u.output_dir);
      if (!u.checkpoint.empty()) ctx.extra_env.emplace_back(prefix + "_CHECKPOINT", u.checkpoint);
      read_only.push_back(u.checkpoint_dir);
      read_only.push_back(u.output_dir);
    }
  }
  if (r.service.is_object()) {
    // A service's replica listens on the port the service manager gave it, and serves the model
    // of the run it was deployed from.
    const std::string port = std::to_string(r.service.value("port", 0));
    ctx.extra_env.emplace_back("PORT", port);
    ctx.extra_env.emplace_back("TAU_SERVE_PORT", port);
    // The names the Kubernetes rendering gives a Deployment's replicas too (kube/service.h).
    ctx.extra_env.emplace_back("TAU_SERVICE_NAME", r.service.value("name", ""));
    ctx.extra_env.emplace_back("TAU_SERVICE_REVISION",
                               std::to_string(r.service.value("revision", int64_t{0})));
    if (run.upstreams && !run.upstreams->empty() && run.spec.serve) {
      const UpstreamRun& model = run.upstreams->front();
      ctx.extra_env.emplace_back("TAU_SERVE_MODEL_RUN", model.run);
      ctx.extra_env.emplace_back("TAU_SERVE_MODEL", run.spec.serve->model == "output"
                                                        ? model.output_dir
                                                        : model.checkpoint);
    }
  }
  if (policy::EffectiveStall(host_->platform()->FindWorkspace(r.workspace), run.spec.policy)) {
    // A stalled run's Python workers can be asked for their stacks (DumpStacks): tau's hook goes
    // first on their path, before the spec's own PYTHONPATH.
    std::string path = layout::PythonHookDir(options_.home);
    for (const spec::EnvVar& var : run.spec.runtime.env)
      if (var.name == "PYTHONPATH" && !var.secret_ref && !var.value.empty())
        path += ":" + var.value;
    ctx.extra_env.emplace_back("PYTHONPATH", path);
  }
  ctx.gpus = r.gpus;
  // Gangs and torchrun rendezvous, on a port of the run's user's alone (GuardPorts); torchrun's
  // default port when none could be had.
  if (run.spec.compute.workers > 1 || spec::UsesTorchrun(run.spec))
    if (ctx.master_port = FreeLoopbackPort(); ctx.master_port == 0) ctx.master_port = 29500;
  ctx.base_env = BaseEnv();
  if (number > 1) {
    // What the next attempt needs to recover: why the last one failed, and where to resume from.
    ctx.extra_env.emplace_back("TAU_FAILURE_REASON",
                               PreviousAttemptReason(host_->store(), name, number));
    std::string resume = run.resume_from.empty()
                             ? recovery::NewestCompleteCheckpoint(ctx.checkpoint_dir)
                             : run.resume_from;
    run.resume_from.clear();
    if (!resume.empty()) ctx.extra_env.emplace_back("TAU_RESUME_FROM", resume);
    // The last attempt may have died in the middle of a metrics line: end it, so this attempt's
    // first point starts a line of its own.
    EndPartialLine(ctx.metrics_file);
  }
  // A storage volume's directory that does not exist yet is made searchable (not listable), as
  // each run's user must pass through it to their own; the run's directories are private.
  for (const std::string& dir : {ctx.checkpoint_dir, ctx.output_dir}) {
    std::string volume = std::filesystem::path(dir).parent_path().string();
    if (!StartsWith(dir, run_dir + "/") && !PathExists(volume))
      if (Status s = MakeDirs(volume, 0711); !s.ok())
        return fail(FailureClass::kSetupError, s.message());
  }
  for (const std::string& dir : {ctx.checkpoint_dir, ctx.output_dir, a.dir}) {
    if (Status s = MakeDirs(dir); !s.ok()) return fail(FailureClass::kSetupError, s.message());
  }
  // Secret values exist only in the workers' environment (and the attempt's config, in memory, or
  // in a file of mode 0600 for a shim that is exec'd): never in the spec, the store's run records,
  // events or evidence.
  spec::RunSpec launch_spec = run.spec;
  if (Status s = host_->CheckSecrets(run.spec, r.workspace, &launch_spec); !s.ok())
    return fail(FailureClass::kSecretNotFound, s.message());
  auto workers = runtime::PlanLaunch(launch_spec, ctx);
  if (!workers.ok()) return fail(FailureClass::kSetupError, workers.status().message());
  runtime::AttemptConfig config;
  config.run_name = name;
  config.attempt = number;
  config.attempt_dir = a.dir;
  config.work_dir = ctx.work_dir;
  // Hard links to the snapshot's read-only files, unless the run's processes run as root, whom file
  // modes do not stop: they get copies. The shim makes them (docs/performance.md, "Code upload").
  auto ids = SubmitterIds(r);
  runtime::AttemptConfig::Code code;
  code.snapshot = r.snapshot_dir;
  code.root = code_root;
  code.copy = ids.ok() ? (*ids ? (*ids)->uid == 0 : ::geteuid() == 0) : true;
  config.code = std::move(code);
  config.workers = std::move(*workers);
  // Mounts need root; a server of one user's own leaves the files as their modes make them.
  if (::geteuid() == 0) config.read_only = std::move(read_only);
  config.pip = run.spec.runtime.pip;
  config.venv_cache_dir = VenvCacheDir(std::nullopt);
  if (Status s = RunAsSubmitter(r, ctx, &config); !s.ok())
    return fail(FailureClass::kSetupError, s.message());
  std::vector<int> ports;
  if (ctx.master_port > 0) ports.push_back(ctx.master_port);
  if (r.service.is_object() && r.service.value("port", 0) > 0)
    ports.push_back(r.service.value("port", 0));
  if (Status s = GuardPorts(run, a.dir, ports, config.run_as ? config.run_as->uid : ::geteuid());
      !s.ok())
    return fail(FailureClass::kSetupError, s.message());
  if (run.need.memory_bytes > 0) config.memory_limit_bytes = run.need.memory_bytes;
  if (run.need.cpu_milli > 0) config.cpu_limit_milli = run.need.cpu_milli;
  config.max_runtime_ms = run.spec.max_runtime_ms;
  config.stop_grace_ms = options_.stop_grace_ms;
  // The shim masks what the workers print of the secret values as it writes their logs.
  for (size_t i = 0; i < run.spec.runtime.env.size(); ++i)
    if (run.spec.runtime.env[i].secret_ref) config.mask.push_back(launch_spec.runtime.env[i].value);
  config.max_log_bytes = run.resolved.max_log_bytes;
  size_t index = shims->Add(config);
  return StartingAttempt{name, std::move(a), config.workers.size(), index};
}

void LocalBackend::AttemptStarted(StartingAttempt s, const Result<runtime::ProcessId>& shim,
                                  Batch* batch) {
  ActiveRun& run = host_->active().at(s.name);
  AttemptRecord& a = s.attempt;
  const int number = a.number;
  if (!shim.ok())
    return FailStart(run, std::move(a), FailureClass::kSetupError, shim.status().message(), batch);
  Of(run).shim = *shim;
  a.shim_pid = shim->pid;
  a.shim_start_time = shim->start_time;
  host_->AttemptRunning(
      run, std::move(a),
      fmt::format("attempt {} started ({})", number,
                  Plural(static_cast<int64_t>(s.processes), "process", "processes")),
      {{"attempt", number}, {"shim_pid", shim->pid}}, batch);
}

void LocalBackend::HandleExit(const std::string& name, Batch* batch) {
  auto it = host_->active().find(name);
  if (it == host_->active().end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (store::IsTerminal(r.state)) return;
  auto attempts = host_->store()->ListAttempts(name);
  if (!attempts.ok() || attempts->empty()) return;
  AttemptRecord a = attempts->back();
  // The attempt's last metric points, before another attempt may append to the same file.
  host_->AttemptMetricsEnded(name, a.number);
  // The shim masked the run's secrets as it wrote its logs (AttemptConfig::mask): nothing to
  // rewrite here.
  ReadNotices(run, a.number, a.dir, batch);

  auto outcome = runtime::ReadOutcome(a.dir);
  if (!outcome.ok()) {
    // The supervisor we watched is gone without a result. Another one may hold the attempt (a shim
    // exec'd after the zygote stopped answering, while the zygote's fork went ahead): follow it.
    runtime::ProcessId other;
    if (runtime::ProbeSupervisor(a.dir, &other) == runtime::SupervisorState::kAlive &&
        other.pid != a.shim_pid && runtime::IsAlive(other)) {
      a.shim_pid = other.pid;
      a.shim_start_time = other.start_time;
      batch->attempts.push_back(a);
      Of(run).shim = other;
      Status s = watcher_->Watch(name, other);
      if (!s.ok()) std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
      return;
    }
  }
  Of(run).shim.reset();
  Of(run).stop_deadline_ms = -1;
  UnguardPorts(name);
  // Why the server stopped the attempt, if it did: that, not how the processes ended, classes it.
  std::optional<FailureClass> stop_reason;
  std::string stop_message;
  if (r.cancel_requested) {
    stop_reason = FailureClass::kCancelled;
  } else if (!run.preempted_by.empty()) {
    // Stopped to make room for a run the admission engine chose over it.
    stop_reason = FailureClass::kPreempted;
    stop_message = fmt::format("preempted by {} ({})", run.preempted_by, run.preemption_reason);
  } else if (!run.gpu_error.empty()) {
    // Stopped (or crashed) because its GPU failed: not the job's fault.
    stop_reason = FailureClass::kGPUError;
    stop_message = run.gpu_error;
  } else if (run.stop_class) {
    stop_reason = run.stop_class;
    stop_message = run.stop_message;
  }
  run.gpu_error.clear();
  run.stop_class.reset();
  run.stop_message.clear();
  run.preempted_by.clear();
  run.preemption_reason.clear();
  run::AttemptEnd end;
  if (!outcome.ok()) {
    // The supervisor died without a result (killed from outside, or by us when it would not
    // stop): make sure nothing of it survives.
    (void)runtime::StopAttempt({a.shim_pid, a.shim_start_time}, a.dir);
    end.failure_class = stop_reason.value_or(FailureClass::kNodeLost);
    end.outcome = "Lost";
    end.exit_code = a.exit_code;
    end.signal = a.signal;
    end.message = stop_message.empty()
                      ? "the attempt's supervisor exited without recording a result"
                      : stop_message;
    if (end.failure_class == FailureClass::kCancelled) end.run_message = "cancelled by request";
    return host_->AttemptEnded(run, std::move(a), end, batch);
  }
  const runtime::AttemptOutcome& o = *outcome;
  FailureClass cls = ClassOf(o, r.cancel_requested);
  end.outcome = runtime::OutcomeKindName(o.kind);
  end.message = o.message;
  if (stop_reason && *stop_reason != FailureClass::kCancelled &&
      o.kind != runtime::OutcomeKind::kSucceeded) {
    cls = *stop_reason;
    end.message = stop_message;
  }
  end.failure_class = cls;
  // An attempt whose setup failed never ran the job: it has no exit code (a 0 would read as a
  // success to scripts).
  end.exit_code = a.exit_code;
  if (o.kind != runtime::OutcomeKind::kSetupFailed &&
      (o.kind != runtime::OutcomeKind::kStopped || !r.cancel_requested))
    end.exit_code = o.exit_code;
  end.signal = o.signal ? o.signal : a.signal;
  if (o.ended_ms) end.ended_ms = o.ended_ms;
  if (o.kind != runtime::OutcomeKind::kSucceeded && cls != FailureClass::kCancelled &&
      cls != FailureClass::kPreempted) {
    // The first failed transition and what the logs say about it.
    const std::string phase = o.kind == runtime::OutcomeKind::kSetupFailed
                                  ? "Running: setup failed before the job started"
                              : cls == FailureClass::kGPUError
                                  ? "Running: stopped because " + a.message
                                  : "Running: the job failed while running";
    end.diagnosis = AttemptDiagnosis(a.dir, o.workers.size(), phase);
  }
  if (cls == FailureClass::kSucceeded) end.run_message = "all processes exited with code 0";
  if (cls == FailureClass::kCancelled) end.run_message = "cancelled by request";
  host_->AttemptEnded(run, std::move(a), end, batch);
}

void LocalBackend::AdmitQueued(Batch* batch, std::vector<std::string>* to_start) {
  // Only runs holding quota are placed or started: few, whatever the queues' depth.
  for (const std::string& name : quota().holders()) {
    auto it = host_->active().find(name);
    if (it != host_->active().end() && it->second.record.state == RunState::kAdmitted &&
        !Of(it->second).shim)
      to_start->push_back(name);  // recovered: admitted before the restart, never started
  }
  std::set<std::string> reserved_now;
  for (int cycle = 0; cycle < kMaxCyclesPerPass; ++cycle) {
    admission::CycleResult result =
        quota().engine->RunCycle({host_->Now(), /*report_pending=*/false});
    for (const admission::PreemptedInfo& p : result.preempted) HandlePreemption(p, batch);
    for (const admission::AdmittedInfo& a : result.admitted) {
      auto it = host_->active().find(a.name);
      if (it == host_->active().end()) {
        (void)quota().engine->RemoveWorkload(a.name);
        continue;
      }
      it->second.record.flavors = AssignmentJson(a.flavors);
      quota().SetInEngine(a.name, true);
      reserved_now.insert(a.name);
    }
    if (result.admitted.empty() && result.preempted.empty()) break;
  }
  quota().pending_stale = true;

  // Placement, in submission order: every run that holds quota and is not yet on the machine.
  std::vector<ActiveRun*> holding;
  for (const std::string& name : quota().holders()) {
    auto it = host_->active().find(name);
    if (it != host_->active().end() && it->second.record.state == RunState::kQueued)
      holding.push_back(&it->second);
  }
  std::sort(holding.begin(), holding.end(),
            [](const ActiveRun* a, const ActiveRun* b) { return a->record.seq < b->record.seq; });
  for (ActiveRun* run : holding) {
    if (Place(*run, batch)) {
      to_start->push_back(run->record.name);
    } else if (reserved_now.count(run->record.name)) {
      // Holds quota but waits for this machine (GPUs kept out by health checks, or a platform
      // whose quota is larger than the machine). Recorded, so a restart keeps the reservation.
      RunRecord& r = run->record;
      r.updated_ms = host_->Now();
      batch->events.push_back({0,
                               r.name,
                               r.updated_ms,
                               "QuotaReserved",
                               fmt::format("admitted by queue {} ({}); waiting for this machine",
                                           r.queue, FlavorsText(AssignmentFromJson(r.flavors))),
                               {{"flavors", r.flavors}},
                               "",
                               ""});
      batch->runs.push_back(r);
    }
  }
}

// Puts a run that holds quota on this machine when its GPUs, CPUs and memory are free.
bool LocalBackend::Place(ActiveRun& run, Batch* batch) {
  const Resources& need = run.need;
  if (need.gpus > static_cast<int>(free_gpus_.size()) || need.cpu_milli > free_cpu_milli_ ||
      need.memory_bytes > free_memory_bytes_)
    return false;
  RunRecord& r = run.record;
  r.gpus.assign(free_gpus_.begin(), std::next(free_gpus_.begin(), need.gpus));
  for (int g : r.gpus) free_gpus_.erase(g);
  free_cpu_milli_ -= need.cpu_milli;
  free_memory_bytes_ -= need.memory_bytes;
  Of(run).holds_machine = true;
  r.admitted_ms = host_->Now();
  if (host_->metrics())
    host_->metrics()->Observe(
        "tau_admission_wait_seconds", {{"cluster_queue", r.queue}},
        static_cast<double>(std::max<int64_t>(0, *r.admitted_ms - run.queued_since_ms)) / 1000.0);
  std::vector<std::string> gpu_names;
  for (int g : r.gpus) gpu_names.push_back(std::to_string(g));
  std::string where = r.gpus.empty() ? "no GPUs" : "GPUs " + Join(gpu_names, ",");
  host_->RunAdmitted(run,
                     fmt::format("admitted by queue {} ({}); placed on this machine with {}",
                                 r.queue, FlavorsText(AssignmentFromJson(r.flavors)), where),
                     {{"gpus", r.gpus}, {"queue", r.queue}, {"flavors", r.flavors}}, batch);
  // The attempt is recorded before its supervisor starts, so a restart in between can find it.
  AttemptRecord starting;
  starting.run = r.name;
  starting.number = r.attempts + 1;
  starting.dir = host_->AttemptDir(r.name, starting.number);
  starting.gpus = r.gpus;
  starting.started_ms = host_->Now();
  batch->attempts.push_back(starting);
  return true;
}

void LocalBackend::HandlePreemption(const admission::PreemptedInfo& p, Batch* batch) {
  auto it = host_->active().find(p.name);
  if (it == host_->active().end()) {
    (void)quota().engine->RemoveWorkload(p.name);
    quota().EraseFromEngine(p.name);
    return;
  }
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (r.state == RunState::kQueued) {
    // Quota reserved in an earlier cycle of this pass (or waiting for the machine) and taken back
    // before the run was admitted: to the user it never left the queue, so it was not preempted.
    (void)quota().engine->RemoveWorkload(p.name);
    quota().EraseFromEngine(p.name);
    r.flavors = nlohmann::json::object();
    r.updated_ms = host_->Now();
    batch->events.push_back(
        {0,
         r.name,
         r.updated_ms,
         "QuotaWithdrawn",
         fmt::format("the quota reserved in queue {} went to {} ({}) before this run was admitted; "
                     "still queued",
                     p.queue, p.preemptor, p.reason),
         {{"preemptor", p.preemptor}, {"reason", p.reason}},
         "",
         ""});
    batch->runs.push_back(r);
    return;
  }
  // Already being stopped for a preemption that the engine, rebuilt after a restart, has just
  // decided again.
  if (Of(run).shim && !run.preempted_by.empty()) return;
  host_->Count("tau_preemptions_total", {{"cluster_queue", p.queue}, {"reason", p.reason}});
  std::string message =
      fmt::format("preempted by {} ({}) in queue {}", p.preemptor, p.reason, p.queue);
  batch->events.push_back({0,
                           r.name,
                           host_->Now(),
                           "Preempted",
                           Of(run).shim ? message + "; stopping the attempt" : message,
                           {{"preemptor", p.preemptor}, {"reason", p.reason}},
                           "",
                           ""});
  if (Of(run).shim) {
    // Its quota stays taken until its processes are gone (the preemptor waits meanwhile,
    // WaitingForPreemptedWorkloads): never two runs on the same GPUs.
    run.preempted_by = p.preemptor;
    run.preemption_reason = p.reason;
    StopAfterCommit(r.name);
    return;
  }
  // Held quota without processes (reserved, or admitted and not started): give it back now.
  host_->Requeue(run, message, batch);
}

void LocalBackend::Recover(ActiveRun& run, Batch* batch) {
  RunRecord& record = run.record;
  if (record.state == RunState::kQueued) return;
  // Admitted or running: it holds resources.
  for (int g : record.gpus) free_gpus_.erase(g);
  free_cpu_milli_ -= run.need.cpu_milli;
  free_memory_bytes_ -= run.need.memory_bytes;
  Of(run).holds_machine = true;
  auto attempts = host_->store()->ListAttempts(record.name);
  // Admitted, but no attempt was ever recorded, or only finished ones: the next one never
  // started.
  if (!attempts.ok() || attempts->empty() || attempts->back().state == AttemptState::kFinished)
    return;
  AttemptRecord last = attempts->back();
  RestoreStopRequest(run, last.started_ms);
  runtime::ProcessId shim{last.shim_pid, last.shim_start_time};
  bool alive = last.shim_pid > 0 && runtime::IsAlive(shim);
  if (last.shim_pid == 0) {
    // Recorded as starting, but the server stopped before it learnt the supervisor's pid: the
    // supervisor lock in the attempt directory says whether one runs.
    runtime::SupervisorState probe = runtime::ProbeSupervisor(last.dir, &shim);
    if (probe == runtime::SupervisorState::kNeverStarted) return;  // start it now
    record.attempts = last.number;
    alive = probe == runtime::SupervisorState::kAlive && runtime::IsAlive(shim);
    if (alive) {
      last.shim_pid = shim.pid;
      last.shim_start_time = shim.start_time;
      host_->AttemptRunning(
          run, last, fmt::format("attempt {} re-adopted after a server restart", last.number),
          {{"attempt", last.number}, {"shim_pid", shim.pid}}, batch);
    }
  }
  if (alive) {
    ReguardAfterRestart(run, last.dir);
    Of(run).shim = shim;  // re-adopted: the attempt kept running while the server was away
    Status s = watcher_->Watch(record.name, shim);
    if (!s.ok()) std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
    // Asked to stop before the restart: the request may never have reached it.
    if (record.cancel_requested || !run.preempted_by.empty() || !run.gpu_error.empty())
      StopAfterCommit(record.name);
    return;
  }
  if (runtime::ReadOutcome(last.dir).ok()) {
    // It finished while the server was away; handle it like any exit.
    host_->Post(AttemptExited{record.name});
    return;
  }
  // Its supervisor is gone and left no result: the attempt's processes vanished.
  (void)runtime::StopAttempt(shim, last.dir);
  host_->AttemptMetricsEnded(record.name, last.number);  // its points, not the next attempt's
  Of(run).shim.reset();
  host_->AttemptVanished(run, last, "the attempt's processes vanished while the server was down",
                         batch);
}

void LocalBackend::Cancel(ActiveRun& run, Batch* batch) {
  RunRecord& r = run.record;
  if (r.state == RunState::kQueued || (r.state == RunState::kAdmitted && !Of(run).shim)) {
    host_->RunCancelled(run,
                        r.attempts == 0
                            ? "cancelled before it started"
                            : fmt::format("cancelled before attempt {} started", r.attempts + 1),
                        batch);
    return;
  }
  batch->runs.push_back(r);
  batch->events.push_back({0, r.name, host_->Now(), "CancelRequested",
                           "stopping the attempt's processes", nlohmann::json::object(), "", ""});
  if (Of(run).shim) StopAfterCommit(r.name);
}

void LocalBackend::StopAttempt(ActiveRun& run, FailureClass cls, const std::string& why,
                               Batch* batch) {
  if (!Of(run).shim || run.stop_class || !run.gpu_error.empty()) return;
  run.stop_class = cls;
  run.stop_message = why;
  batch->events.push_back({0, run.record.name, host_->Now(), recovery::FailureClassName(cls),
                           why + "; stopping the attempt", nlohmann::json::object(), "", ""});
  StopAfterCommit(run.record.name);
}

void LocalBackend::Launched() {
  for (const std::string& name : std::exchange(to_start_, {})) {
    auto it = host_->active().find(name);
    if (it != host_->active().end() && Of(it->second).shim) {
      Status s = watcher_->Watch(name, *Of(it->second).shim);
      if (!s.ok()) std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
    }
  }
}

void LocalBackend::Release(ActiveRun& run) {
  for (int g : run.record.gpus)
    if (!unplaceable_gpus_.count(g)) free_gpus_.insert(g);
  if (Of(run).holds_machine) {
    free_cpu_milli_ += run.need.cpu_milli;
    free_memory_bytes_ += run.need.memory_bytes;
    Of(run).holds_machine = false;
  }
}

nlohmann::json LocalBackend::PendingReason(const ActiveRun& run, int64_t) {
  // Holds quota, but waits for this machine.
  const RunRecord& r = run.record;
  if (!quota().holders().count(r.name)) return nullptr;
  const Resources& need = run.need;
  std::vector<std::string> short_of;
  if (need.gpus > static_cast<int>(free_gpus_.size()))
    short_of.push_back(fmt::format(
        "{} GPU(s) ({} of {} free{})", need.gpus, free_gpus_.size(), options_.gpus.devices.size(),
        unplaceable_gpus_.empty()
            ? ""
            : fmt::format(", {} kept out by health checks", unplaceable_gpus_.size())));
  if (need.cpu_milli > free_cpu_milli_)
    short_of.push_back(
        fmt::format("{} CPUs ({} free)", Quantity::FromMilli(need.cpu_milli).ToString(),
                    Quantity::FromMilli(std::max<int64_t>(0, free_cpu_milli_)).ToString()));
  if (need.memory_bytes > free_memory_bytes_)
    short_of.push_back(
        fmt::format("{} memory ({} free)", Quantity::FromUnits(need.memory_bytes).ToString(),
                    Quantity::FromUnits(std::max<int64_t>(0, free_memory_bytes_)).ToString()));
  return PendingEntry(
      0, r.queue, "WaitingForMachine",
      fmt::format("admitted by queue {}; waiting for this machine: needs {}", r.queue,
                  short_of.empty() ? "a scheduling pass" : Join(short_of, ", ")),
      "");
}

std::string LocalBackend::RequeueNote(const ActiveRun& run) {
  // What the next attempt will be given as TAU_RESUME_FROM, as things stand.
  std::string newest =
      recovery::NewestCompleteCheckpoint(host_->StorageDir(run.record, "checkpoint"));
  return newest.empty() ? "; no complete checkpoint yet, so the next attempt starts over"
                        : ", the next attempt resumes from " + newest;
}

void LocalBackend::PollNotices(Batch* batch) {
  const int64_t now = host_->Now();
  if (now - last_notice_poll_ms_ < kNoticePollMs) return;
  last_notice_poll_ms_ = now;
  for (auto& [name, local] : runs_) {
    auto it = host_->active().find(name);
    if (!local.shim || it == host_->active().end()) continue;
    ActiveRun& run = it->second;
    if (store::IsTerminal(run.record.state) || run.record.attempts <= 0) continue;
    ReadNotices(run, run.record.attempts, host_->AttemptDir(name, run.record.attempts), batch);
  }
}

void LocalBackend::ReadNotices(ActiveRun& run, int attempt, const std::string& dir, Batch* batch) {
  LocalRun& local = Of(run);
  if (local.notices_attempt != attempt) {
    local.notices_attempt = attempt;
    local.notices_offset = 0;
  }
  for (runtime::AttemptNotice& n : runtime::ReadNotices(dir, &local.notices_offset)) {
    n.data["attempt"] = attempt;
    batch->events.push_back({0, run.record.name, host_->Now(), std::move(n.type),
                             std::move(n.message), std::move(n.data), "", ""});
  }
}

int64_t LocalBackend::NextWakeMillis(int64_t now, int64_t limit) const {
  int64_t wake = limit;
  for (const auto& [name, local] : runs_)
    if (local.stop_deadline_ms >= 0)
      wake = std::min(wake, std::max<int64_t>(0, local.stop_deadline_ms - now));
  return wake;
}

std::optional<int64_t> LocalBackend::OutputBytes(const ActiveRun& run) {
  if (!Of(run).shim) return std::nullopt;
  // The pump writes its workers' logs as the output comes.
  return WrittenBytes(host_->AttemptDir(run.record.name, run.record.attempts),
                      layout::MetricsFile(layout::RunDir(options_.home, run.record.name)));
}

std::optional<int> LocalBackend::DumpStacks(const ActiveRun& run) {
  if (!Of(run).shim) return std::nullopt;
  return runtime::DumpPythonStacks(host_->AttemptDir(run.record.name, run.record.attempts));
}

std::vector<RunningAttempt> LocalBackend::RunningAttempts() const {
  std::vector<RunningAttempt> running;
  for (const auto& [name, local] : runs_) {
    auto it = host_->active().find(name);
    if (!local.shim || it == host_->active().end()) continue;
    const RunRecord& r = it->second.record;
    if (!store::IsTerminal(r.state)) running.push_back({name, r.attempts, r.gpus});
  }
  return running;
}

void LocalBackend::DescribeRuntime(const RunRecord& r, bool final_save,
                                   const evidence::RecordInput* prev,
                                   evidence::RuntimeInfo* rt) const {
  // The cache the run's attempts used: runs of other users have their own (RunAsSubmitter). Only
  // a run with pip requirements has a virtualenv to look for.
  auto venvs = [&] {
    if (!rt->pip.empty())
      if (auto ids = SubmitterIds(r); ids.ok()) return VenvCacheDir(*ids);
    return VenvCacheDir(std::nullopt);
  };
  DescribeThisMachine(options_.gpus, venvs, rt->pip, final_save, prev, rt);
}

void LocalBackend::FillCapacity(MachineCapacity* c) const {
  c->gpus_free = static_cast<int64_t>(free_gpus_.size());
  c->gpus_unplaceable = static_cast<int64_t>(unplaceable_gpus_.size());
  c->cpu_milli_free = free_cpu_milli_;
  c->memory_bytes_free = free_memory_bytes_;
}

std::unique_ptr<Backend> NewLocalBackend(LocalBackendOptions options) {
  return std::make_unique<LocalBackend>(std::move(options));
}

int64_t DetectCpuMilli() { return static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN)) * 1000; }

int64_t DetectMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

}  // namespace tau::server
