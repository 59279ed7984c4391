#include "server/controller.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/layout.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "recovery/failure_class.h"
#include "recovery/recovery.h"
#include "recovery/retry.h"
#include "server/host_info.h"
#include "server/redact.h"
#include "server/run_storage.h"

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

// Hands a directory tree to the user a run runs as (symlinks themselves, never their targets).
Status ChownTree(const std::string& root, uid_t uid, gid_t gid) {
  if (::lchown(root.c_str(), uid, gid) != 0) return IoError("chown " + root, errno);
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (::lchown(it->path().c_str(), uid, gid) != 0)
      return IoError("chown " + it->path().string(), errno);
  if (ec) return Internal("walking " + root + ": " + ec.message());
  return Status::Ok();
}

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

// A free TCP port for a gang's rendezvous (MASTER_PORT). The kernel picks it; the window in which
// another program could take it before the gang binds it is small and only costs that attempt.
int PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

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

Controller::Controller(ControllerOptions options, store::Store* store, health::GpuInventory gpus)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : SystemClock()),
      store_(store),
      gpus_(std::move(gpus)) {
  evidence_ = std::make_unique<EvidenceWorker>(
      options_.home, store_, clock_, gpus_,
      [this](const RunRecord& r, bool final_save, const evidence::RecordInput* prev,
             evidence::RuntimeInfo* rt) { DescribeRuntime(r, final_save, prev, rt); });
  cpu_capacity_milli_ = options_.cpu_capacity_milli > 0
                            ? options_.cpu_capacity_milli
                            : static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN)) * 1000;
  memory_capacity_bytes_ =
      options_.memory_capacity_bytes > 0 ? options_.memory_capacity_bytes : DetectMemoryBytes();
  free_cpu_milli_ = cpu_capacity_milli_;
  free_memory_bytes_ = memory_capacity_bytes_;
  for (const auto& d : gpus_.devices) free_gpus_.insert(d.index);
}

Controller::~Controller() { Stop(); }

std::string Controller::StorageDir(const RunRecord& r, const std::string& role) const {
  return server::StorageDir(options_.home, r, role);
}

void Controller::DescribeRuntime(const RunRecord& r, bool final_save,
                                 const evidence::RecordInput* prev,
                                 evidence::RuntimeInfo* rt) const {
  if (options_.cluster) {
    // The run's pods ran on the cluster's nodes, in its image: nothing of this machine describes
    // them, so nothing of it is recorded (the image is).
    rt->host = "kubernetes";
    return;
  }
  // The cache the run's attempts used: runs of other users have their own (RunAsSubmitter).
  std::string venvs = VenvCacheDir(std::nullopt);
  if (!rt->pip.empty())
    if (auto ids = SubmitterIds(r); ids.ok()) venvs = VenvCacheDir(*ids);
  DescribeThisMachine(gpus_, venvs, rt->pip, final_save, prev, rt);
}

std::string Controller::AttemptDir(const std::string& name, int attempt) const {
  return layout::AttemptDir(options_.home, name, attempt);
}

Status Controller::Start() {
  auto watcher = runtime::ProcessWatcher::Create(
      [this](const std::string& key) { inbox_.Push(AttemptExited{key}); });
  if (!watcher.ok()) return watcher.status();
  watcher_ = std::move(*watcher);
  if (!options_.cluster) StartZygote();
  TAU_RETURN_IF_ERROR(LoadPlatformFile());
  RebuildEngine();
  std::set<AttemptKey> on_cluster;
  if (options_.cluster) {
    auto existing = options_.cluster->Start(
        [this](ClusterNews news) { inbox_.Push(std::move(news)); },
        [this](const std::string& run, int attempt) { return AttemptDir(run, attempt); });
    if (!existing.ok()) return existing.status();
    on_cluster = std::move(*existing);
    // An applied platform (not the built-in default, which describes this machine) makes sure
    // the cluster has its queues, e.g. after `tau server --platform FILE` in the chart's pod.
    if (!options_.platform_file.empty() && PathExists(options_.platform_file)) {
      if (Status s = options_.cluster->ApplyPlatform(*CurrentPlatform().platform); !s.ok())
        std::fprintf(stderr,
                     "tau server: the platform could not be applied to the cluster (runs wait "
                     "for its queues until it is): %s\n",
                     s.ToString().c_str());
    }
  }
  Batch batch;
  Recover(&batch, on_cluster);
  CommitOrDie(std::move(batch));
  RefreshPending();
  evidence_->Start();
  if (options_.loop_thread) thread_ = std::thread(&Controller::Loop, this);
  return Status::Ok();
}

void Controller::StartZygote() {
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

void Controller::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    platform_cv_.SignalAll();
  }
  inbox_.Close();
  if (thread_.joinable()) thread_.join();
  // The worker finishes the records already queued (ended runs) before it stops.
  evidence_->Stop();
  if (watcher_) watcher_->Stop();
  zygote_.reset();
  if (options_.cluster) options_.cluster->Stop();
}

Resources Controller::Needs(const policy::ResolvedRun& resolved) {
  Resources r;
  r.gpus = resolved.gpus_per_worker * resolved.workers;
  auto total = [&](const char* name) -> const Quantity* {
    auto it = resolved.total_requests.find(name);
    return it == resolved.total_requests.end() ? nullptr : &it->second;
  };
  if (const Quantity* q = total(policy::kCpuResource)) r.cpu_milli = q->milli();
  if (const Quantity* q = total(policy::kMemoryResource)) r.memory_bytes = q->CeilUnits();
  return r;
}

// Why a run can never fit on this machine, or "" when it can.
std::string Controller::Refusal(const Resources& need) const {
  int total_gpus = static_cast<int>(gpus_.devices.size());
  if (need.gpus > 0 && total_gpus == 0)
    return fmt::format(
        "this run asks for {} but this machine has none ({}). tau never runs a GPU job on the CPU "
        "silently: run it on a machine with NVIDIA GPUs, or set compute.gpus: 0 to run on the CPU",
        Plural(need.gpus, "GPU", "GPUs"), gpus_.note.empty() ? "no GPUs found" : gpus_.note);
  if (need.gpus > total_gpus)
    return fmt::format("this run asks for {} in all but this machine has only {}",
                       Plural(need.gpus, "GPU", "GPUs"), total_gpus);
  if (need.cpu_milli > cpu_capacity_milli_)
    return fmt::format("this run asks for {:g} CPUs in all but this machine has {:g}",
                       static_cast<double>(need.cpu_milli) / 1000,
                       static_cast<double>(cpu_capacity_milli_) / 1000);
  if (need.memory_bytes > memory_capacity_bytes_)
    return fmt::format("this run asks for {} of memory in all but this machine has {}",
                       FormatBytes(need.memory_bytes), FormatBytes(memory_capacity_bytes_));
  return "";
}

Status Controller::InsertWithUniqueName(
    RunRecord* r, const std::string& base,
    const std::function<std::vector<Event>(const std::string& name)>& events) {
  Status inserted;
  for (int attempt = 0; attempt < 8; ++attempt) {
    // Four hex digits read well; widen them when the name space gets crowded.
    r->name = fmt::format("{}-{}", base, RandomHex(attempt < 4 ? 4 : 8));
    inserted = store_->InsertRun(r, events(r->name));
    if (inserted.code() != StatusCode::kAlreadyExists) break;
  }
  return inserted;
}

Result<RunRecord> Controller::Submit(SubmitRequest request, SubmitError* error) {
  spec::ParseOutcome parsed = spec::ParseSpec(request.spec_yaml, request.spec_file);
  if (!parsed.ok()) {
    error->diagnostics = parsed.diagnostics;
    error->status = InvalidArgument(parsed.ErrorText());
    return error->status;
  }
  const spec::RunSpec& spec = *parsed.spec;
  std::shared_ptr<const policy::Platform> platform = CurrentPlatform().platform;
  auto resolved = policy::Resolve(spec, *platform, request.caller);
  if (!resolved.ok()) {
    error->status = resolved.status();
    return error->status;
  }
  if (Status s = CheckSecrets(spec, resolved->workspace, nullptr); !s.ok()) {
    error->status = s;
    return error->status;
  }
  Resources need = Needs(*resolved);
  // On a cluster, Kueue's quota and the nodes decide what fits; this machine's size does not.
  if (std::string why = options_.cluster ? "" : Refusal(need); !why.empty()) {
    error->status = FailedPrecondition(why);
    return error->status;
  }
  auto snapshot = StoreSnapshot(layout::SnapshotsDir(options_.home), std::move(request.code));
  if (!snapshot.ok()) {
    error->status = snapshot.status();
    return error->status;
  }
  // A Python entrypoint, or one given as a path, must be a file of the code: caught now rather than
  // as a failed run. (On a cluster the image may hold it.)
  if (!options_.cluster &&
      (EndsWith(spec.entrypoint, ".py") ||
       (spec.entrypoint.find('/') != std::string::npos && spec.entrypoint[0] != '/'))) {
    bool shipped = false;
    for (const nlohmann::json& f : snapshot->files) {
      auto path = f.is_object() ? f.find("path") : f.end();
      shipped = shipped || (path != f.end() && *path == spec.entrypoint);
    }
    if (!shipped) {
      error->status = InvalidArgument(fmt::format(
          "{}: run.entrypoint '{}' is not among the {} file(s) of the code directory sent with "
          "the run; check the path (relative to the directory of the spec) and .tauignore",
          request.spec_file, spec.entrypoint, snapshot->files.size()));
      return error->status;
    }
  }
  if (options_.cluster) {
    if (Status s =
            options_.cluster->Check(spec, *resolved, *platform, snapshot->dir, request.caller);
        !s.ok()) {
      error->status = s;
      return error->status;
    }
  }
  RunRecord r;
  r.spec_name = spec.name;
  r.spec_file = request.spec_file;
  r.spec_yaml = request.spec_yaml;
  r.spec_json = spec::ToJson(spec);
  r.config_hash = spec::ConfigHash(r.spec_json);
  r.snapshot_digest = snapshot->digest;
  r.snapshot_dir = snapshot->dir;
  r.workspace = resolved->workspace;
  r.queue = resolved->queue;
  r.priority = resolved->priority;
  r.owner = request.caller.user;
  r.resolved = policy::ToJson(*resolved);
  r.resources = {{"gpus", need.gpus},
                 {"cpu_milli", need.cpu_milli},
                 {"memory_bytes", need.memory_bytes},
                 {"workers", spec.compute.workers}};
  r.created_ms = r.updated_ms = Now();
  nlohmann::json submitted = {{"config_hash", r.config_hash},
                              {"snapshot_digest", r.snapshot_digest},
                              {"files", snapshot->files.size()}};
  Status inserted = InsertWithUniqueName(&r, spec.name, [&](const std::string& name) {
    return std::vector<Event>{
        {0, name, r.created_ms, "Submitted", "submitted from " + r.spec_file, submitted, "", ""},
        {0, name, r.created_ms, "Queued", "queued in " + r.queue, nlohmann::json::object(), "",
         ""}};
  });
  if (!inserted.ok()) {
    error->status = inserted;
    return inserted;
  }
  Count("tau_runs_submitted_total", {{"workspace", r.workspace}, {"queue", r.queue}});
  // The loop's view of the run is made here, from the spec just parsed, exactly as Load would make
  // it from the store after a restart: the decision loop, which every run passes through, neither
  // reads the run back nor parses its spec again.
  auto prepared = Load(r, std::move(*parsed.spec));
  {
    MutexLock lock(&mu_);
    pending_info_[r.name] = {{"position", nullptr}, {"reason", "waiting for the scheduler"}};
  }
  inbox_.Push(NewRun{r.name, prepared.ok() ? std::make_optional(std::move(*prepared))
                                           : std::optional<ActiveRun>()});
  return r;
}

Status Controller::Cancel(const std::string& name) {
  TAU_ASSIGN_OR_RETURN(RunRecord r, store_->GetRun(name));
  if (store::IsTerminal(r.state))
    return FailedPrecondition(
        fmt::format("run '{}' has already finished ({})", name, store::RunStateName(r.state)));
  inbox_.Push(CancelRequest{name});
  return Status::Ok();
}

Result<RunRecord> Controller::Rerun(const std::string& name, std::string* warning) {
  TAU_ASSIGN_OR_RETURN(RunRecord from, store_->GetRun(name));
  spec::ParseOutcome parsed = spec::ParseSpec(from.spec_yaml, from.spec_file);
  if (!parsed.ok())
    return FailedPrecondition("the recorded spec of '" + name + "' no longer validates:\n" +
                              parsed.ErrorText());
  if (!PathExists(from.snapshot_dir))
    return FailedPrecondition("the code snapshot of '" + name + "' is gone from " +
                              from.snapshot_dir);
  const spec::RunSpec& spec = *parsed.spec;
  RunRecord r;
  r.spec_name = spec.name;
  r.spec_file = from.spec_file;
  r.spec_yaml = from.spec_yaml;
  r.spec_json = spec::ToJson(spec);
  r.config_hash = spec::ConfigHash(spec);
  if (r.config_hash != from.config_hash)
    *warning = fmt::format(
        "the recorded spec now gives config hash {} where '{}' recorded {}: this tau reads it "
        "differently",
        r.config_hash.substr(0, 12), name, from.config_hash.substr(0, 12));
  r.snapshot_digest = from.snapshot_digest;
  r.snapshot_dir = from.snapshot_dir;
  r.workspace = from.workspace;
  r.queue = from.queue;
  r.priority = from.priority;
  r.resources = from.resources;
  r.owner = from.owner;
  r.resolved = from.resolved;  // the same queue, priority and shape as the run it reproduces
  r.created_ms = r.updated_ms = Now();
  Status inserted = InsertWithUniqueName(&r, spec.name, [&](const std::string& run) {
    return std::vector<Event>{
        {0,
         run,
         r.created_ms,
         "Submitted",
         "rerun of " + name,
         {{"rerun_of", name},
          {"config_hash", r.config_hash},
          {"snapshot_digest", r.snapshot_digest}},
         "",
         ""},
        {0, run, r.created_ms, "Queued", "queued in " + r.queue, nlohmann::json::object(), "", ""}};
  });
  TAU_RETURN_IF_ERROR(inserted);
  inbox_.Push(NewRun{r.name, std::nullopt});
  return r;
}

Status Controller::Resume(const std::string& name, const std::string& from, bool force) {
  TAU_ASSIGN_OR_RETURN(RunRecord r, store_->GetRun(name));
  if (!store::IsTerminal(r.state))
    return FailedPrecondition(
        fmt::format("run '{}' is still {}", name, store::RunStateName(r.state)));
  if (r.state == RunState::kSucceeded)
    return FailedPrecondition(
        fmt::format("run '{}' succeeded; `tau rerun {}` starts it again as a new run", name, name));
  if (r.reason == recovery::FailureClassName(FailureClass::kOOMKilled) && !force)
    return FailedPrecondition(
        fmt::format("run '{}' was OOMKilled: another attempt with the same memory will likely die "
                    "the same way. "
                    "Give it more memory and `tau rerun`, or resume anyway with --force",
                    name));
  std::string checkpoint;
  if (!from.empty()) {
    // Only the run's own checkpoints: a resume must not read other runs' or the server's files.
    std::string dir = StorageDir(r, "checkpoint");
    std::string candidate = from.front() == '/' ? from : dir + "/" + from;
    std::error_code ec;
    std::string real = std::filesystem::weakly_canonical(candidate, ec).string();
    std::string root = std::filesystem::weakly_canonical(dir, ec).string() + "/";
    if (ec || !StartsWith(real, root) || !PathExists(real))
      return InvalidArgument(fmt::format(
          "checkpoint '{}' is not in run '{}''s checkpoint directory {}", from, name, dir));
    checkpoint = real;
  }
  inbox_.Push(ResumeRequest{name, checkpoint});
  return Status::Ok();
}

void Controller::HandleResume(const ResumeRequest& request, Batch* batch) {
  if (active_.count(request.name)) return;  // resumed twice: the first one won
  auto record = store_->GetRun(request.name);
  if (!record.ok() || !store::IsTerminal(record->state) || record->state == RunState::kSucceeded)
    return;
  auto loaded = Load(*record);
  if (!loaded.ok()) return;
  ActiveRun& run = active_[request.name] = std::move(*loaded);
  RunRecord& r = run.record;
  r.cancel_requested = false;
  r.finished_ms.reset();
  r.not_before_ms.reset();
  r.exit_code.reset();
  r.signal.reset();
  run.resume_from = request.from;
  run.queued_since_ms = Now();
  Transition(
      run, RunState::kQueued, "Resumed",
      request.from.empty() ? "resumed by request" : "resumed by request from " + request.from,
      batch, {{"from", request.from}});
  batch->runs.push_back(r);
}

void Controller::OnGpuVerdict(int gpu, bool placeable, const std::string& why) {
  inbox_.Push(GpuNews{gpu, placeable, why});
}

void Controller::OnGpuSamples(std::vector<evidence::GpuSample> samples) {
  if (!samples.empty()) inbox_.Push(GpuSamples{std::move(samples)});
}

void Controller::HandleGpuNews(const GpuNews& news, Batch* batch) {
  if (news.placeable) {
    if (!unplaceable_gpus_.erase(news.gpu)) return;
    bool held = false;
    for (const auto& [name, run] : active_)
      for (int g : run.record.gpus) held = held || g == news.gpu;
    if (!held) free_gpus_.insert(news.gpu);
    return;
  }
  unplaceable_gpus_[news.gpu] = news.why;
  free_gpus_.erase(news.gpu);
  for (auto& [name, run] : active_) {
    if (!run.shim || !run.gpu_error.empty() || store::IsTerminal(run.record.state)) continue;
    const std::vector<int>& held = run.record.gpus;
    if (std::find(held.begin(), held.end(), news.gpu) == held.end()) continue;
    run.gpu_error = fmt::format("GPU {} turned unhealthy: {}", news.gpu, news.why);
    batch->events.push_back({0,
                             name,
                             Now(),
                             "GPUError",
                             run.gpu_error + "; stopping the attempt",
                             {{"gpu", news.gpu}, {"error", run.gpu_error}},
                             "",
                             ""});
    StopAfterCommit(name);
  }
}

nlohmann::json Controller::PendingInfo(const std::string& name) {
  MutexLock lock(&mu_);
  auto it = pending_info_.find(name);
  return it == pending_info_.end() ? nlohmann::json() : it->second;
}

nlohmann::json Controller::Capacity() {
  MutexLock lock(&mu_);
  return capacity_info_;
}

void Controller::Count(const std::string& name, const Labels& labels) {
  if (options_.metrics) options_.metrics->Count(name, labels);
}

void Controller::CountAttempt(const AttemptRecord& a) {
  Count("tau_attempts_total",
        {{"failure_class",
          a.reason.empty() ? recovery::FailureClassName(FailureClass::kUnknown) : a.reason}});
}

void Controller::CommitOrDie(Batch batch) {
  if (batch.empty()) return;
  auto start = std::chrono::steady_clock::now();
  Status s = store_->Commit(batch);
  if (options_.metrics) {
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    options_.metrics->Observe("tau_store_commit_duration_seconds", {}, took.count());
  }
  // A full disk: decisions wait (attempts keep running, the API keeps answering) until there is
  // room, rather than the server stopping for what a user can fix.
  for (int waited_s = 0; s.code() == StatusCode::kUnavailable; ++waited_s) {
    if (waited_s % 60 == 0)
      std::fprintf(stderr, "tau server: cannot commit, waiting for space: %s\n",
                   s.ToString().c_str());
    // Stopping now loses nothing: the last committed state is what a restart recovers.
    if (inbox_.WaitClosed(1000)) std::_Exit(70);
    s = store_->Commit(batch);
    if (s.ok()) std::fprintf(stderr, "tau server: committed again after waiting for space\n");
  }
  if (!s.ok()) {
    // Acting on a state change that is not durable could lose or duplicate a run: stop instead. A
    // restart recovers from the last committed state.
    std::fprintf(stderr, "tau server: fatal: cannot commit to the store: %s\n",
                 s.ToString().c_str());
    std::_Exit(70);
  }
}

void Controller::Transition(ActiveRun& run, RunState state, const std::string& event_type,
                            const std::string& message, Batch* batch, nlohmann::json data) {
  int64_t now = Now();
  run.record.state = state;
  run.record.updated_ms = now;
  batch->events.push_back({0, run.record.name, now, event_type, message, std::move(data), "", ""});
}

void Controller::Finish(ActiveRun& run, RunState state, const std::string& reason,
                        const std::string& message, Batch* batch) {
  RunRecord& r = run.record;
  r.reason = reason;
  r.message = message;
  r.finished_ms = Now();
  nlohmann::json data = {{"reason", reason}};
  if (r.exit_code) data["exit_code"] = *r.exit_code;
  if (r.signal) data["signal"] = *r.signal;
  Transition(run, state, store::RunStateName(state), message, batch, data);
  if (options_.metrics && r.started_ms)
    options_.metrics->Observe("tau_run_duration_seconds", {{"state", store::RunStateName(state)}},
                              static_cast<double>(*r.finished_ms - *r.started_ms) / 1000.0);
  ReleaseResources(run);
  batch->runs.push_back(r);
}

void Controller::ReleaseResources(ActiveRun& run) {
  RunRecord& r = run.record;
  for (int g : r.gpus)
    if (!unplaceable_gpus_.count(g)) free_gpus_.insert(g);
  if (run.holds_machine) {
    free_cpu_milli_ += run.need.cpu_milli;
    free_memory_bytes_ += run.need.memory_bytes;
    run.holds_machine = false;
  }
  r.gpus.clear();
  // A run that ends keeps the time of its last admission; one that goes back to the queue waits
  // for a new one.
  if (!store::IsTerminal(r.state)) r.admitted_ms.reset();
  r.flavors = nlohmann::json::object();
  if (in_engine_.erase(r.name)) (void)engine_->RemoveWorkload(r.name);
  outside_engine_.erase(r.name);
}

void Controller::FailAttempt(ActiveRun& run, FailureClass failure_class, const std::string& message,
                             Batch* batch) {
  RunRecord& r = run.record;
  const recovery::RetryPolicy policy = spec::RetryPolicyOf(run.spec.resilience);
  const recovery::AttemptHistory history{r.attempts, r.started_ms};
  const int64_t now = Now();
  const recovery::RetryDecision decision = recovery::Decide(policy, history, failure_class, now);
  if (!decision.retry) {
    Finish(run, RunState::kFailed, recovery::FailureClassName(failure_class),
           recovery::StopMessage(policy, decision, message), batch);
    return;
  }
  ReleaseResources(run);
  r.reason = recovery::FailureClassName(failure_class);
  r.message = message;
  r.not_before_ms = now + decision.backoff_ms;
  run.queued_since_ms = *r.not_before_ms;
  Transition(run, RunState::kQueued, "Retrying",
             recovery::RetryingMessage(policy, history, failure_class, decision), batch,
             {{"failure_class", recovery::FailureClassName(failure_class)},
              {"backoff_ms", decision.backoff_ms}});
  batch->runs.push_back(r);
}

Result<ActiveRun> Controller::Load(const RunRecord& record) {
  spec::ParseOutcome parsed = spec::ParseSpec(record.spec_yaml, record.spec_file);
  if (!parsed.ok())
    return InvalidArgument("the recorded spec no longer parses: " + parsed.ErrorText());
  return Load(record, std::move(*parsed.spec));
}

Result<ActiveRun> Controller::Load(const RunRecord& record, spec::RunSpec spec) {
  ActiveRun run;
  run.record = record;
  run.spec = std::move(spec);
  if (record.resolved.empty()) {
    // Recorded before platform policy existed: its queue and shape are the spec's own.
    run.resolved.workspace = record.workspace;
    run.resolved.queue = record.queue;
    run.resolved.priority = record.priority;
    run.resolved.workers = run.spec.compute.workers;
    run.resolved.gpus_per_worker = run.spec.compute.gpus;
    run.resolved.cpus_per_worker = run.spec.compute.cpus;
    run.resolved.memory_per_worker = run.spec.compute.memory;
    run.resolved.max_runtime_ms = run.spec.max_runtime_ms;
    int w = run.resolved.workers;
    if (run.spec.compute.cpus)
      run.resolved.total_requests[policy::kCpuResource] =
          Quantity::FromMilli(run.spec.compute.cpus->milli() * w);
    if (run.spec.compute.memory)
      run.resolved.total_requests[policy::kMemoryResource] =
          Quantity::FromMilli(run.spec.compute.memory->milli() * w);
    if (run.spec.compute.gpus > 0)
      run.resolved.total_requests[policy::kGpuResource] =
          Quantity::FromUnits(int64_t{run.spec.compute.gpus} * w);
  } else {
    TAU_ASSIGN_OR_RETURN(run.resolved, policy::ResolvedRunFromJson(record.resolved));
  }
  // The run executes with its resolved shape (a compute profile may set GPUs, CPUs and memory; a
  // workspace limit may cap the runtime).
  run.spec.compute.workers = run.resolved.workers;
  run.spec.compute.gpus = run.resolved.gpus_per_worker;
  run.spec.compute.cpus = run.resolved.cpus_per_worker;
  run.spec.compute.memory = run.resolved.memory_per_worker;
  run.spec.max_runtime_ms = run.resolved.max_runtime_ms;
  run.need = Needs(run.resolved);
  run.queued_since_ms = record.not_before_ms.value_or(record.updated_ms);
  // The engine's view: one pod set of `workers` pods. Its queue-order timestamp is the submission
  // sequence, so runs submitted within the same millisecond keep their order.
  admission::Workload& wl = run.workload;
  wl.name = record.name;
  wl.queue = run.resolved.queue;
  wl.priority = run.resolved.priority;
  wl.created_ms = record.seq;
  admission::PodSet ps;
  ps.count = std::max(1, run.resolved.workers);
  if (run.resolved.cpus_per_worker)
    ps.requests[policy::kCpuResource] = *run.resolved.cpus_per_worker;
  if (run.resolved.memory_per_worker)
    ps.requests[policy::kMemoryResource] = *run.resolved.memory_per_worker;
  if (run.resolved.gpus_per_worker > 0)
    ps.requests[policy::kGpuResource] = Quantity::FromUnits(run.resolved.gpus_per_worker);
  ps.node_selector = run.resolved.node_selector;
  ps.allowed_flavors = run.resolved.flavors;
  wl.pod_sets = {std::move(ps)};
  return run;
}

void Controller::Recover(Batch* batch, const std::set<AttemptKey>& on_cluster) {
  store::RunFilter filter;
  filter.active_only = true;
  filter.newest_first = false;
  auto runs = store_->ListRuns(filter);
  if (!runs.ok()) {
    std::fprintf(stderr, "tau server: cannot list runs: %s\n", runs.status().ToString().c_str());
    std::_Exit(70);
  }
  for (const RunRecord& record : *runs) {
    auto loaded = Load(record);
    if (!loaded.ok()) {
      ActiveRun broken;
      broken.record = record;
      Finish(broken, RunState::kFailed, recovery::FailureClassName(FailureClass::kUnknown),
             loaded.status().message(), batch);
      continue;
    }
    ActiveRun& run = active_[record.name] = std::move(*loaded);
    if (options_.cluster) {
      RecoverOnCluster(run, on_cluster, batch);
      if (store::IsTerminal(run.record.state)) active_.erase(record.name);
      continue;
    }
    if (record.state == RunState::kQueued) continue;
    // Admitted or running: it holds resources.
    for (int g : record.gpus) free_gpus_.erase(g);
    free_cpu_milli_ -= run.need.cpu_milli;
    free_memory_bytes_ -= run.need.memory_bytes;
    run.holds_machine = true;
    auto attempts = store_->ListAttempts(record.name);
    // Admitted, but no attempt was ever recorded, or only finished ones: the next one never
    // started.
    if (!attempts.ok() || attempts->empty() || attempts->back().state == AttemptState::kFinished)
      continue;
    AttemptRecord last = attempts->back();
    RestoreStopRequest(run, last.started_ms);
    runtime::ProcessId shim{last.shim_pid, last.shim_start_time};
    bool alive = last.shim_pid > 0 && runtime::IsAlive(shim);
    if (last.shim_pid == 0) {
      // Recorded as starting, but the server stopped before it learnt the supervisor's pid: the
      // supervisor lock in the attempt directory says whether one runs.
      runtime::SupervisorState probe = runtime::ProbeSupervisor(last.dir, &shim);
      if (probe == runtime::SupervisorState::kNeverStarted) continue;  // start it now
      run.record.attempts = last.number;
      alive = probe == runtime::SupervisorState::kAlive && runtime::IsAlive(shim);
      if (alive) {
        last.state = AttemptState::kRunning;
        last.shim_pid = shim.pid;
        last.shim_start_time = shim.start_time;
        batch->attempts.push_back(last);
        if (!run.record.started_ms) run.record.started_ms = last.started_ms;
        Transition(run, RunState::kRunning, "Running",
                   fmt::format("attempt {} re-adopted after a server restart", last.number), batch,
                   {{"attempt", last.number}, {"shim_pid", shim.pid}});
        batch->runs.push_back(run.record);
      }
    }
    if (alive) {
      run.shim = shim;  // re-adopted: the attempt kept running while the server was away
      Status s = watcher_->Watch(record.name, shim);
      if (!s.ok()) std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
      // Asked to stop before the restart: the request may never have reached it.
      if (run.record.cancel_requested || !run.preempted_by.empty() || !run.gpu_error.empty())
        StopAfterCommit(record.name);
      continue;
    }
    if (runtime::ReadOutcome(last.dir).ok()) {
      // It finished while the server was away; handle it like any exit.
      inbox_.Push(AttemptExited{record.name});
      continue;
    }
    // Its supervisor is gone and left no result: the attempt's processes vanished.
    (void)runtime::StopAttempt(shim, last.dir);
    evidence_->PollMetrics(record.name, last.number);  // its points, not the next attempt's
    run.shim.reset();
    LoseAttempt(run, last, "the attempt's processes vanished while the server was down", batch);
    if (store::IsTerminal(run.record.state)) active_.erase(record.name);
  }
}

void Controller::RestoreStopRequest(ActiveRun& run, int64_t attempt_started_ms) {
  auto events = store_->ListEvents(run.record.name);
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

void Controller::Loop() {
  InboxTake take;
  while (inbox_.Take(NextWakeMillis(), &take)) Pass(std::exchange(take, {}));
}

void Controller::RunOnce() { Pass(inbox_.TakeNow()); }

void Controller::Pass(InboxTake take) {
  if (take.platform) {
    loop_platform_ = take.platform->platform;
    loop_generation_ = take.platform->generation;
    RebuildEngine();
  }
  Batch batch;
  for (NewRun& n : take.new_runs) {
    if (active_.count(n.name)) continue;
    if (n.run) {
      active_[n.name] = std::move(*n.run);
      continue;
    }
    auto record = store_->GetRun(n.name);
    if (!record.ok()) continue;
    auto loaded = Load(*record);
    if (loaded.ok()) active_[n.name] = std::move(*loaded);
  }
  for (const GpuNews& g : take.gpu_news) HandleGpuNews(g, &batch);
  for (const ResumeRequest& r : take.resumes) HandleResume(r, &batch);
  for (const AttemptExited& e : take.exits) HandleExit(e.name, &batch);
  for (const ClusterNews& n : take.cluster_news) HandleClusterNews(n, &batch);
  for (const CancelRequest& c : take.cancels) HandleCancel(c.name, &batch);
  std::vector<std::string> to_start, to_launch;
  if (options_.cluster) {
    LaunchQueued(&batch, &to_launch);
  } else {
    AdmitQueued(&batch, &to_start);
  }
  EscalateStops(&batch);
  // Durable first: admissions, exits, cancels and new attempts are committed before any process
  // is started or stopped, or any object created on the cluster.
  CommitOrDie(std::move(batch));
  StopCommitted();
  Batch started;
  StartAttempts(to_start, &started);
  for (const std::string& name : to_launch) LaunchOnCluster(name, &started);
  CommitOrDie(std::move(started));
  for (const std::string& name : to_start) {
    auto it = active_.find(name);
    if (it != active_.end() && it->second.shim) {
      Status s = watcher_->Watch(name, *it->second.shim);
      if (!s.ok()) std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
    }
  }
  std::vector<std::vector<evidence::GpuSample>> samples;
  for (GpuSamples& s : take.samples) samples.push_back(std::move(s.samples));
  evidence_->Tick(RunningAttempts(), samples);
  // Terminal runs leave the active set once their final state is committed (the store has
  // assigned the events' hashes their records hold): their records, and collectors, go to the
  // evidence worker, which compacts the metrics and saves the final record.
  for (auto it = active_.begin(); it != active_.end();) {
    if (!store::IsTerminal(it->second.record.state)) {
      ++it;
      continue;
    }
    evidence_->HandOff(it->first, std::move(it->second.record));
    it = active_.erase(it);
  }
  RefreshPending();
}

std::vector<EvidenceWorker::RunningAttempt> Controller::RunningAttempts() const {
  std::vector<EvidenceWorker::RunningAttempt> running;
  for (const auto& [name, run] : active_)
    if (!store::IsTerminal(run.record.state) && run.shim)
      running.push_back({name, run.record.attempts, run.record.gpus});
  return running;
}

// How long the loop may sleep: until the earliest retry's backoff ends or stop request expires, at
// most a second.
int64_t Controller::NextWakeMillis() const {
  int64_t now = Now();
  int64_t wake = 1000;
  for (const auto& [name, run] : active_) {
    if (run.record.state == RunState::kQueued && run.record.not_before_ms)
      wake = std::min(wake, std::max<int64_t>(0, *run.record.not_before_ms - now));
    if (run.stop_deadline_ms >= 0)
      wake = std::min(wake, std::max<int64_t>(0, run.stop_deadline_ms - now));
  }
  return wake;
}

void Controller::StopAfterCommit(const std::string& name) { stops_.push_back(name); }

void Controller::StopCommitted() {
  for (const std::string& name : std::exchange(stops_, {})) {
    auto it = active_.find(name);
    if (it == active_.end() || !it->second.shim) continue;
    ActiveRun& run = it->second;
    // A run with a supervisor is on its latest attempt.
    Status s = runtime::StopAttempt(*run.shim, AttemptDir(name, run.record.attempts));
    if (!s.ok())
      std::fprintf(stderr, "tau server: stop %s: %s\n", name.c_str(), s.ToString().c_str());
    // The shim gives its workers the grace period; one that is itself stopped or stuck never
    // ends them, so the server does, a little after the shim should have.
    if (run.stop_deadline_ms < 0)
      run.stop_deadline_ms = Now() + options_.stop_grace_ms + kStopMarginMs;
  }
}

void Controller::EscalateStops(Batch* batch) {
  const int64_t now = Now();
  for (auto& [name, run] : active_) {
    if (!run.shim || run.stop_deadline_ms < 0 || now < run.stop_deadline_ms) continue;
    run.stop_deadline_ms = now + kStopMarginMs;  // until the watcher reports the exit
    batch->events.push_back(
        {0,
         name,
         now,
         "StopForced",
         fmt::format("the attempt's supervisor (pid {}) did not end the attempt within {} of the "
                     "request; killing it and the attempt's processes",
                     run.shim->pid, FormatDuration(options_.stop_grace_ms + kStopMarginMs)),
         {{"shim_pid", run.shim->pid}},
         "",
         ""});
    // Killed at once rather than after the commit: the event only explains, and a stuck
    // supervisor must not hold GPUs any longer than it has.
    Status s = runtime::KillAttempt(*run.shim, AttemptDir(name, run.record.attempts));
    if (!s.ok())
      std::fprintf(stderr, "tau server: kill %s: %s\n", name.c_str(), s.ToString().c_str());
  }
}

Status Controller::CheckSecrets(const spec::RunSpec& spec, const std::string& workspace,
                                spec::RunSpec* resolved_spec) {
  bool refers = std::any_of(spec.runtime.env.begin(), spec.runtime.env.end(),
                            [](const spec::EnvVar& v) { return v.secret_ref; });
  if (!refers) return Status::Ok();
  TAU_ASSIGN_OR_RETURN(auto values, store_->SecretValues(workspace));
  std::vector<std::string> missing;
  for (const spec::EnvVar& var : spec.runtime.env)
    if (var.secret_ref && !values.count(var.value)) missing.push_back(var.value);
  if (!missing.empty())
    return FailedPrecondition(fmt::format(
        "runtime.env refers to secret(s) {} that workspace '{}' does not have; set each with "
        "`tau secret set {} KEY` (the value is read from the terminal or stdin)",
        Join(missing, ", "), workspace, workspace));
  if (resolved_spec != nullptr)
    for (spec::EnvVar& var : resolved_spec->runtime.env)
      if (var.secret_ref) {
        var.value = values.at(var.value);
        var.secret_ref = false;
      }
  return Status::Ok();
}

// A server running as root serves a multi-user machine: each run's processes run as the user who
// submitted it (a token user without a system account as `nobody`), never as root unless root
// submitted it. What the run writes to is handed to that user first; its virtualenvs are built as
// that user too (pip runs a package's own code), in a cache of their own.
Result<std::optional<runtime::AttemptConfig::RunAs>> Controller::SubmitterIds(const RunRecord& r) {
  using Ids = std::optional<runtime::AttemptConfig::RunAs>;
  if (::geteuid() != 0) return Ids();  // runs run as the server's user
  std::string user = r.owner.empty() ? "root" : r.owner;
  auto run_as = runtime::LookUpUser(user);
  if (!run_as.ok()) run_as = runtime::LookUpUser("nobody");
  if (!run_as.ok()) return FailedPrecondition("no system user to run as: " + user);
  if (run_as->uid == 0) return Ids();
  return Ids(std::move(*run_as));
}

std::string Controller::VenvCacheDir(
    const std::optional<runtime::AttemptConfig::RunAs>& ids) const {
  return ids ? layout::VenvsDir(options_.home, ids->uid) : layout::VenvsDir(options_.home);
}

Status Controller::RunAsSubmitter(const RunRecord& r, const runtime::LaunchContext& ctx,
                                  runtime::AttemptConfig* config) {
  TAU_ASSIGN_OR_RETURN(std::optional<runtime::AttemptConfig::RunAs> run_as, SubmitterIds(r));
  if (!run_as) return Status::Ok();
  uid_t uid = run_as->uid;
  gid_t gid = run_as->gid;
  for (const std::string& dir : {ctx.work_dir, ctx.checkpoint_dir, ctx.output_dir})
    TAU_RETURN_IF_ERROR(ChownTree(dir, uid, gid));
  // The user must reach its working directory through the server's (traversable, not listable),
  // and no other user may read it.
  for (const std::string& dir : {options_.home, layout::RunsDir(options_.home), RunDir(r.name)})
    if (::chmod(dir.c_str(), 0711) != 0) return IoError("chmod " + dir, errno);
  if (::chmod(ctx.work_dir.c_str(), 0700) != 0) return IoError("chmod " + ctx.work_dir, errno);
  // The metrics file lives in the run's directory, which stays the server's.
  int fd = ::open(ctx.metrics_file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("creating " + ctx.metrics_file, errno);
  int rc = ::fchown(fd, uid, gid);
  ::close(fd);
  if (rc != 0) return IoError("chown " + ctx.metrics_file, errno);
  config->venv_cache_dir = VenvCacheDir(run_as);
  TAU_RETURN_IF_ERROR(MakeDirs(config->venv_cache_dir, 0700));
  TAU_RETURN_IF_ERROR(ChownTree(config->venv_cache_dir, uid, gid));
  config->run_as = std::move(*run_as);
  return Status::Ok();
}

runtime::EnvList Controller::BaseEnv() const {
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

void Controller::FailStart(ActiveRun& run, AttemptRecord a, FailureClass reason,
                           const std::string& message, Batch* batch) {
  a.state = AttemptState::kFinished;
  a.ended_ms = Now();
  a.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kSetupFailed);
  a.reason = recovery::FailureClassName(reason);
  a.message = message;
  batch->attempts.push_back(a);
  CountAttempt(a);
  run.record.attempts = a.number;
  run.record.exit_code = std::nullopt;
  FailAttempt(run, reason, message, batch);
}

void Controller::StartAttempts(const std::vector<std::string>& names, Batch* batch) {
  runtime::ShimBatch shims(options_.tau_binary, zygote_.get());
  std::vector<StartingAttempt> starting;
  for (const std::string& name : names)
    if (auto s = PrepareAttempt(name, &shims, batch)) starting.push_back(std::move(*s));
  std::vector<Result<runtime::ProcessId>> started = shims.Wait();
  // A zygote that died or got stuck is replaced at once, so that later attempts are forked again;
  // if its replacements keep breaking, a new one is tried at most every 10 s.
  if (zygote_ && zygote_->broken() &&
      (zygote_restarted_ms_ == 0 || Now() - zygote_restarted_ms_ >= 10'000)) {
    zygote_restarted_ms_ = Now();
    StartZygote();
  }
  for (StartingAttempt& s : starting) {
    const size_t index = s.index;
    AttemptStarted(std::move(s), started[index], batch);
  }
}

std::optional<Controller::StartingAttempt> Controller::PrepareAttempt(const std::string& name,
                                                                      runtime::ShimBatch* shims,
                                                                      Batch* batch) {
  ActiveRun& run = active_.at(name);
  RunRecord& r = run.record;
  int number = r.attempts + 1;
  std::string run_dir = RunDir(name);
  AttemptRecord a;
  a.run = name;
  a.number = number;
  a.dir = AttemptDir(name, number);
  a.gpus = r.gpus;
  a.started_ms = Now();
  auto fail = [&](FailureClass reason,
                  const std::string& message) -> std::optional<StartingAttempt> {
    FailStart(run, a, reason, message, batch);
    return std::nullopt;
  };
  runtime::LaunchContext ctx;
  ctx.run_name = name;
  ctx.attempt = number;
  ctx.work_dir = layout::WorkDir(run_dir);
  ctx.checkpoint_dir = StorageDir(r, "checkpoint");
  ctx.output_dir = StorageDir(r, "output");
  for (const policy::Mount& m : run.resolved.mounts)
    if (m.role == "data" && !m.host_path.empty())
      ctx.extra_env.emplace_back("TAU_DATA_DIR", m.host_path);
  ctx.metrics_file = layout::MetricsFile(run_dir);
  ctx.gpus = r.gpus;
  if (run.spec.compute.workers > 1) ctx.master_port = PickFreePort();  // only gangs rendezvous
  ctx.base_env = BaseEnv();
  if (number > 1) {
    // What the next attempt needs to recover: why the last one failed, and where to resume from.
    ctx.extra_env.emplace_back("TAU_FAILURE_REASON", r.reason);
    std::string resume = run.resume_from.empty()
                             ? recovery::NewestCompleteCheckpoint(ctx.checkpoint_dir)
                             : run.resume_from;
    run.resume_from.clear();
    if (!resume.empty()) ctx.extra_env.emplace_back("TAU_RESUME_FROM", resume);
    // The last attempt may have died in the middle of a metrics line: end it, so this attempt's
    // first point starts a line of its own.
    EndPartialLine(ctx.metrics_file);
  }
  for (const std::string& dir : {ctx.checkpoint_dir, ctx.output_dir, a.dir}) {
    if (Status s = MakeDirs(dir); !s.ok()) return fail(FailureClass::kSetupError, s.message());
  }
  if (!PathExists(ctx.work_dir)) {
    if (Status s = CopySnapshot(r.snapshot_dir, ctx.work_dir); !s.ok())
      return fail(FailureClass::kSetupError, s.message());
  }
  // Secret values exist only in the workers' environment (and the attempt's config, in memory, or
  // in a file of mode 0600 for a shim that is exec'd): never in the spec, the store's run records,
  // events or evidence.
  spec::RunSpec launch_spec = run.spec;
  if (Status s = CheckSecrets(run.spec, r.workspace, &launch_spec); !s.ok())
    return fail(FailureClass::kSecretNotFound, s.message());
  auto workers = runtime::PlanLaunch(launch_spec, ctx);
  if (!workers.ok()) return fail(FailureClass::kSetupError, workers.status().message());
  runtime::AttemptConfig config;
  config.run_name = name;
  config.attempt = number;
  config.attempt_dir = a.dir;
  config.work_dir = ctx.work_dir;
  config.workers = std::move(*workers);
  config.pip = run.spec.runtime.pip;
  config.venv_cache_dir = VenvCacheDir(std::nullopt);
  if (Status s = RunAsSubmitter(r, ctx, &config); !s.ok())
    return fail(FailureClass::kSetupError, s.message());
  if (run.need.memory_bytes > 0) config.memory_limit_bytes = run.need.memory_bytes;
  if (run.need.cpu_milli > 0) config.cpu_limit_milli = run.need.cpu_milli;
  config.max_runtime_ms = run.spec.max_runtime_ms;
  config.stop_grace_ms = options_.stop_grace_ms;
  size_t index = shims->Add(config);
  return StartingAttempt{name, std::move(a), config.workers.size(), index};
}

void Controller::AttemptStarted(StartingAttempt s, const Result<runtime::ProcessId>& shim,
                                Batch* batch) {
  ActiveRun& run = active_.at(s.name);
  RunRecord& r = run.record;
  AttemptRecord& a = s.attempt;
  const int number = a.number;
  if (!shim.ok())
    return FailStart(run, std::move(a), FailureClass::kSetupError, shim.status().message(), batch);
  run.shim = *shim;
  a.state = AttemptState::kRunning;
  a.shim_pid = shim->pid;
  a.shim_start_time = shim->start_time;
  batch->attempts.push_back(a);
  r.attempts = number;
  if (!r.started_ms) r.started_ms = a.started_ms;  // the run's start: its first attempt's
  // The run's exit code is its last attempt's: none while this one runs.
  r.exit_code.reset();
  r.signal.reset();
  r.not_before_ms.reset();
  Transition(run, RunState::kRunning, "Running",
             fmt::format("attempt {} started ({})", number,
                         Plural(static_cast<int64_t>(s.processes), "process", "processes")),
             batch, {{"attempt", number}, {"shim_pid", shim->pid}});
  batch->runs.push_back(r);
}

namespace {

// The last bytes of each rank's log of an attempt, for diagnosis.
std::vector<std::string> LogTails(const std::string& attempt_dir, size_t ranks) {
  constexpr size_t kTailBytes = 64 * 1024;
  std::vector<std::string> tails;
  for (size_t r = 0; r < std::max<size_t>(ranks, 1); ++r) {
    auto text = ReadFile(fmt::format("{}/logs/rank-{}.log", attempt_dir, r));
    std::string t = text.ok() ? std::move(*text) : "";
    if (t.size() > kTailBytes) t = t.substr(t.size() - kTailBytes);
    tails.push_back(std::move(t));
  }
  return tails;
}

}  // namespace

nlohmann::json Controller::DiagnosisJson(const std::string& attempt_dir, size_t ranks,
                                         const std::string& phase) {
  recovery::Diagnosis d = recovery::Diagnose(LogTails(attempt_dir, ranks));
  nlohmann::json evidence = nlohmann::json::array();
  for (const auto& e : d.evidence)
    evidence.push_back({{"signature", e.signature}, {"rank", e.rank}, {"line", e.line}});
  return {{"summary", d.summary}, {"phase", phase}, {"evidence", evidence}};
}

void Controller::HandleExit(const std::string& name, Batch* batch) {
  auto it = active_.find(name);
  if (it == active_.end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (store::IsTerminal(r.state)) return;
  auto attempts = store_->ListAttempts(name);
  if (!attempts.ok() || attempts->empty()) return;
  AttemptRecord a = attempts->back();
  // The attempt's last metric points, before another attempt may append to the same file.
  evidence_->PollMetrics(name, a.number);
  MaskSecretsInLogs(run, a);

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
      run.shim = other;
      Status s = watcher_->Watch(name, other);
      if (!s.ok()) std::fprintf(stderr, "tau server: %s\n", s.ToString().c_str());
      return;
    }
  }
  run.shim.reset();
  run.stop_deadline_ms = -1;
  a.state = AttemptState::kFinished;
  a.ended_ms = Now();
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
  }
  run.gpu_error.clear();
  run.preempted_by.clear();
  run.preemption_reason.clear();
  const bool preemption_requeues =
      recovery::PreemptionRequeues(spec::RetryPolicyOf(run.spec.resilience));
  if (!outcome.ok()) {
    // The supervisor died without a result (killed from outside, or by us when it would not
    // stop): make sure nothing of it survives.
    (void)runtime::StopAttempt({a.shim_pid, a.shim_start_time}, a.dir);
    const FailureClass cls = stop_reason.value_or(FailureClass::kNodeLost);
    a.outcome = "Lost";
    a.reason = recovery::FailureClassName(cls);
    a.message = stop_message.empty() ? "the attempt's supervisor exited without recording a result"
                                     : stop_message;
    batch->attempts.push_back(a);
    CountAttempt(a);
    if (cls == FailureClass::kCancelled)
      Finish(run, RunState::kCancelled, a.reason, "cancelled by request", batch);
    else if (cls == FailureClass::kPreempted && preemption_requeues)
      Requeue(run, a.message, batch);
    else
      FailAttempt(run, cls, a.message, batch);
    return;
  }
  const runtime::AttemptOutcome& o = *outcome;
  FailureClass cls = ClassOf(o, r.cancel_requested);
  a.outcome = runtime::OutcomeKindName(o.kind);
  a.message = o.message;
  if (stop_reason && *stop_reason != FailureClass::kCancelled &&
      o.kind != runtime::OutcomeKind::kSucceeded) {
    cls = *stop_reason;
    a.message = stop_message;
  }
  a.reason = recovery::FailureClassName(cls);
  // An attempt whose setup failed never ran the job: it has no exit code (a 0 would read as a
  // success to scripts).
  if (o.kind != runtime::OutcomeKind::kSetupFailed &&
      (o.kind != runtime::OutcomeKind::kStopped || !r.cancel_requested))
    a.exit_code = o.exit_code;
  if (o.signal) a.signal = o.signal;
  a.ended_ms = o.ended_ms ? o.ended_ms : Now();
  if (o.kind != runtime::OutcomeKind::kSucceeded && cls != FailureClass::kCancelled &&
      cls != FailureClass::kPreempted) {
    // The first failed transition and what the logs say about it.
    const std::string phase = o.kind == runtime::OutcomeKind::kSetupFailed
                                  ? "Running: setup failed before the job started"
                              : cls == FailureClass::kGPUError
                                  ? "Running: stopped because " + a.message
                                  : "Running: the job failed while running";
    a.diagnosis = DiagnosisJson(a.dir, o.workers.size(), phase);
  }
  batch->attempts.push_back(a);
  CountAttempt(a);
  r.exit_code = a.exit_code;
  r.signal = a.signal;
  if (o.kind == runtime::OutcomeKind::kSucceeded) {
    Finish(run, RunState::kSucceeded, recovery::FailureClassName(FailureClass::kSucceeded),
           "all processes exited with code 0", batch);
  } else if (cls == FailureClass::kCancelled) {
    Finish(run, RunState::kCancelled, recovery::FailureClassName(FailureClass::kCancelled),
           "cancelled by request", batch);
  } else if (cls == FailureClass::kPreempted && preemption_requeues) {
    Requeue(run, a.message, batch);
  } else {
    FailAttempt(run, cls, a.message, batch);
  }
}

void Controller::LoseAttempt(ActiveRun& run, AttemptRecord attempt, const std::string& message,
                             Batch* batch) {
  attempt.state = AttemptState::kFinished;
  attempt.ended_ms = Now();
  attempt.outcome = "Lost";
  attempt.reason = recovery::FailureClassName(FailureClass::kNodeLost);
  attempt.message = message;
  batch->attempts.push_back(attempt);
  CountAttempt(attempt);
  FailAttempt(run, FailureClass::kNodeLost, message, batch);
}

void Controller::MaskSecretsInLogs(const ActiveRun& run, const AttemptRecord& a) {
  auto secrets = SecretValuesOf(store_, run.record);
  if (!secrets.ok() || secrets->empty()) return;
  for (size_t rank = 0; rank < std::max<size_t>(run.spec.compute.workers, 1); ++rank)
    if (Status s = RedactFile(fmt::format("{}/logs/rank-{}.log", a.dir, rank), *secrets); !s.ok())
      std::fprintf(stderr, "tau server: run %s: masking secrets in its logs failed: %s\n",
                   run.record.name.c_str(), s.ToString().c_str());
}

void Controller::HandleCancel(const std::string& name, Batch* batch) {
  auto it = active_.find(name);
  if (it == active_.end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (store::IsTerminal(r.state) || r.cancel_requested) return;
  r.cancel_requested = true;
  if (options_.cluster) return CancelOnCluster(run, batch);
  if (r.state == RunState::kQueued || (r.state == RunState::kAdmitted && !run.shim)) {
    Finish(run, RunState::kCancelled, recovery::FailureClassName(FailureClass::kCancelled),
           r.attempts == 0 ? "cancelled before it started"
                           : fmt::format("cancelled before attempt {} started", r.attempts + 1),
           batch);
    return;
  }
  batch->runs.push_back(r);
  batch->events.push_back({0, name, Now(), "CancelRequested", "stopping the attempt's processes",
                           nlohmann::json::object(), "", ""});
  if (run.shim) StopAfterCommit(name);
}

}  // namespace tau::server
