// The Kubernetes backend (backend.h): Kueue admits, the cluster runs. The run's records,
// retries, cancels and evidence follow the same rules as on the local backend; what differs is
// where an attempt comes from (a Job or RayJob created suspended) and how its end is learnt (the
// cluster's news, classified by kube::ObserveAttempt).
#include "backend/kube/kube_backend.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "common/files.h"
#include "common/layout.h"
#include "recovery/failure_class.h"
#include "runtime/runtime.h"

namespace tau::server {

using store::AttemptRecord;
using store::AttemptState;
using store::Batch;
using store::RunRecord;
using store::RunState;
using Phase = AttemptFact::Phase;
using recovery::FailureClass;

namespace {

class KubeBackend final : public Backend {
 public:
  explicit KubeBackend(Cluster* cluster) : cluster_(cluster) {}
  ~KubeBackend() override { Stop(); }

  const char* Name() const override { return "kubernetes"; }
  Capabilities Caps() const override { return KubeCapabilities(); }
  ServiceDriver* services() override { return cluster_; }
  Status Start(RunHost* host, const policy::Platform* applied) override;
  void Stop() override {
    if (host_ && !stopped_) cluster_->Stop();
    stopped_ = true;
  }
  // On a cluster, Kueue's quota and the nodes decide what fits; this machine's size does not.
  Status CheckFits(const Resources&) override { return Status::Ok(); }
  Status Check(const SubmissionCheck& c) override {
    return cluster_->Check(*c.spec, *c.resolved, *c.platform, c.snapshot_dir, *c.caller,
                           c.run_name);
  }
  Status ApplyPlatform(const policy::Platform& platform) override {
    return cluster_->ApplyPlatform(platform);
  }
  void Recover(ActiveRun& run, Batch* batch) override;
  void HandleExit(const std::string&, Batch*) override {}
  void HandleNews(const AttemptNews& news, Batch* batch) override;
  // This machine's GPUs run nothing of the cluster's.
  void HandleGpuNews(const GpuNews&, Batch*) override {}
  void Cancel(ActiveRun& run, Batch* batch) override;
  // The stall guardrail's stop (services run on the local backend only, and a pod's liveness
  // probe is the kubelet's): the attempt ends with the class, its Job goes.
  void StopAttempt(ActiveRun& run, FailureClass cls, const std::string& why, Batch* batch) override;
  // The kept pod logs (KeepLogs) and the run's metrics file, which the cluster appends to.
  std::optional<int64_t> OutputBytes(const ActiveRun& run) override {
    const RunRecord& r = run.record;
    auto it = runs_.find(r.name);
    if (it == runs_.end() || it->second.attempt == 0 || it->second.attempt != r.attempts)
      return std::nullopt;
    return WrittenBytes(host_->AttemptDir(r.name, r.attempts),
                        layout::MetricsFile(host_->RunDir(r.name)));
  }
  void Schedule(Batch* batch) override;
  // Deletes are acted on once the pass that decided them (a cancel, an eviction) is committed.
  void Committed() override {
    for (const auto& [run, attempt] : std::exchange(to_delete_, {})) cluster_->Delete(run, attempt);
  }
  void Launch(Batch* batch) override {
    for (const std::string& name : std::exchange(to_launch_, {})) LaunchOne(name, batch);
  }
  void Launched() override {}
  void Release(ActiveRun&) override {}
  nlohmann::json PendingReason(const ActiveRun& run, int64_t now) override {
    const RunRecord& r = run.record;
    if (r.not_before_ms && *r.not_before_ms > now) return nullptr;  // backing off
    // Kueue decides: its own reason and the run's place in its LocalQueue.
    if (Of(run).pending.is_object()) return Of(run).pending;
    return PendingEntry(0, r.queue, "Creating", "being created on the cluster", "");
  }
  // On a cluster the job finds its newest checkpoint itself.
  std::string RequeueNote(const ActiveRun&) override { return ""; }
  int64_t NextWakeMillis(int64_t, int64_t limit) const override { return limit; }
  // The attempts whose pods' metrics the cluster appends to their runs' metrics files (their
  // GPUs are the cluster's to watch).
  std::vector<RunningAttempt> RunningAttempts() const override;
  void DescribeRuntime(const RunRecord&, bool, const evidence::RecordInput*,
                       evidence::RuntimeInfo* rt) const override {
    // The run's pods ran on the cluster's nodes, in its image: nothing of this machine describes
    // them, so nothing of it is recorded (the image is).
    rt->host = "kubernetes";
  }
  void FillCapacity(MachineCapacity*) const override {}
  void Forget(const std::string& run) override { runs_.erase(run); }

 private:
  // What this backend keeps of a run beside the controller's ActiveRun.
  struct ClusterRun {
    int attempt = 0;         // the attempt whose objects exist on the cluster (0: none)
    bool relaunch = false;   // its last attempt was recorded but never created: create it
    nlohmann::json pending;  // what Kueue says while it waits
    // A cancel's delete: the attempt whose delete is in flight (0: none), when a failed one is
    // tried again, and the failure last told in the run's events (each new one is told once).
    int deleting = 0;
    int64_t delete_not_before = 0;
    std::string delete_error;
  };
  ClusterRun& Of(const ActiveRun& run) { return runs_[run.record.name]; }

  void LaunchOne(const std::string& name, Batch* batch);
  // How creating the attempt's objects ended (at once, or as the cluster's news).
  void Launched(ActiveRun& run, int attempt, const Status& s, Batch* batch);
  void HandleCall(ActiveRun& run, const AttemptNews& news, Batch* batch);
  // The cancel's delete is done: the attempt ends as cancelled, and the run with it.
  void FinishCancel(ActiveRun& run, Batch* batch);
  // Tells the cluster how to keep the attempt's pod logs (masked of the run's secrets, capped).
  Status KeepLogs(const ActiveRun& run, int attempt);
  void EndAttempt(ActiveRun& run, const AttemptFact& o, Batch* batch);

  Cluster* const cluster_;
  RunHost* host_ = nullptr;
  bool stopped_ = false;
  std::set<AttemptKey> existing_;  // the attempts on the cluster when the server started
  // Attempts ended while their objects stayed (a stop, an eviction), whose objects must go. Kept
  // past the run's end: a stopped Job holds its GPUs and its quota until it is deleted.
  struct Orphan {
    int64_t not_before = 0;  // when the next delete may be tried (-1: one is in flight)
    bool told = false;       // a failed delete was said in the server's log
  };
  std::map<AttemptKey, Orphan> orphans_;
  // Asks for the attempt's objects to go once this pass is committed, and again until they have.
  void DeleteOrphan(const AttemptKey& key) {
    to_delete_.push_back(key);
    orphans_[key].not_before = -1;
  }
  std::vector<std::string> to_launch_;
  std::vector<AttemptKey> to_delete_;       // decided this pass; asked for in Committed
  std::map<std::string, ClusterRun> runs_;  // by run name, until the run ends (Forget)
};

}  // namespace

std::vector<RunningAttempt> KubeBackend::RunningAttempts() const {
  std::vector<RunningAttempt> running;
  for (const auto& [name, cluster_run] : runs_) {
    if (cluster_run.attempt == 0) continue;
    auto it = host_->active().find(name);
    if (it == host_->active().end()) continue;
    const RunRecord& r = it->second.record;
    if (r.state == RunState::kRunning && r.attempts == cluster_run.attempt)
      running.push_back({name, r.attempts, {}});
  }
  return running;
}

Status KubeBackend::Start(RunHost* host, const policy::Platform* applied) {
  host_ = host;
  auto existing = cluster_->Start(
      [host](InboxMessage message) { host->Post(std::move(message)); },
      [host](const std::string& run, int attempt) { return host->AttemptDir(run, attempt); });
  if (!existing.ok()) return existing.status();
  existing_ = std::move(*existing);
  // An attempt stopped, or evicted, just before the server stopped may have kept its objects.
  for (const AttemptKey& key : existing_) {
    auto attempts = host->store()->ListAttempts(key.first);
    if (!attempts.ok()) continue;
    for (const AttemptRecord& a : *attempts)
      if (a.number == key.second && a.state == AttemptState::kFinished &&
          a.outcome == runtime::OutcomeKindName(runtime::OutcomeKind::kStopped))
        orphans_[key] = Orphan{};
  }
  // An applied platform (not the built-in default, which describes this machine) makes sure
  // the cluster has its queues, e.g. after `tau server --platform FILE` in the chart's pod.
  if (applied)
    if (Status s = cluster_->ApplyPlatform(*applied); !s.ok())
      std::fprintf(stderr,
                   "tau server: the platform could not be applied to the cluster (runs wait "
                   "for its queues until it is): %s\n",
                   s.ToString().c_str());
  return Status::Ok();
}

void KubeBackend::Recover(ActiveRun& run, Batch* batch) {
  const std::set<AttemptKey>& existing = existing_;
  RunRecord& r = run.record;
  auto attempts = host_->store()->ListAttempts(r.name);
  if (!attempts.ok() || attempts->empty() || attempts->back().state == AttemptState::kFinished) {
    // No attempt on the cluster: a queued run gets one on the next pass (one recorded as admitted
    // goes back to the queue first; this is no preemption).
    if (r.state != RunState::kQueued && !r.cancel_requested)
      host_->ReturnToQueue(
          run, "back in the queue: its attempt had not been created when the server stopped",
          batch);
    return;
  }
  AttemptRecord last = attempts->back();
  r.attempts = last.number;
  if (existing.count({r.name, last.number})) {
    Of(run).attempt = last.number;  // the watch's news brings it up to date
    // Its logs are followed again from where they were kept.
    if (Status s = KeepLogs(run, last.number); !s.ok())
      std::fprintf(stderr, "tau server: run %s: its pod logs are not kept: %s\n", r.name.c_str(),
                   s.ToString().c_str());
    return;
  }
  if (last.state == AttemptState::kStarting && r.state == RunState::kQueued) {
    // Recorded, but the server stopped before the cluster took it: create it now.
    Of(run).relaunch = true;
    return;
  }
  host_->AttemptVanished(
      run, last, "the attempt's Job vanished from the cluster while the server was down", batch);
}

void KubeBackend::Schedule(Batch* batch) {
  std::vector<std::string>* to_launch = &to_launch_;
  int64_t now = host_->Now();
  for (auto& [key, orphan] : orphans_)
    if (orphan.not_before >= 0 && orphan.not_before <= now) DeleteOrphan(key);
  for (auto& [name, run] : host_->active()) {
    RunRecord& r = run.record;
    if (store::IsTerminal(r.state)) continue;
    if (r.cancel_requested) {
      // A cancel whose delete failed earlier (the API server was unreachable): again.
      Cancel(run, batch);
      continue;
    }
    if (r.state != RunState::kQueued || Of(run).attempt != 0) continue;
    if (r.not_before_ms && *r.not_before_ms > now) continue;
    if (HeldBack(run)) continue;  // created once the controller lets it in
    if (!Of(run).relaunch) {
      AttemptRecord a;
      a.run = name;
      a.number = r.attempts + 1;
      a.dir = host_->AttemptDir(name, a.number);
      a.state = AttemptState::kStarting;
      a.started_ms = now;
      batch->attempts.push_back(a);
      r.attempts = a.number;
    }
    Of(run).relaunch = false;
    r.not_before_ms.reset();
    r.updated_ms = now;
    batch->runs.push_back(r);
    Of(run).attempt = r.attempts;
    Of(run).pending = nullptr;
    to_launch->push_back(name);
  }
}

void KubeBackend::LaunchOne(const std::string& name, Batch* batch) {
  ActiveRun& run = host_->active().at(name);
  RunRecord& r = run.record;
  ClusterLaunch launch;
  launch.run = name;
  launch.attempt = Of(run).attempt;
  launch.spec = &run.spec;
  launch.resolved = &run.resolved;
  launch.platform = host_->platform();
  launch.snapshot_dir = r.snapshot_dir;
  if (r.array.is_object() && r.array.value("index", nlohmann::json()).is_number_integer())
    launch.array_index = r.array["index"].get<int64_t>();
  if (run.upstreams)
    for (const UpstreamRun& u : *run.upstreams) launch.upstreams.emplace_back(u.stage, u.run);
  const std::string attempt_dir = host_->AttemptDir(name, launch.attempt);
  if (launch.attempt > 1) {
    launch.failure_reason = PreviousAttemptReason(host_->store(), name, launch.attempt);
    launch.resume_from = run.resume_from;  // on a cluster the job finds its newest checkpoint
  }
  Status s = MakeDirs(attempt_dir + "/logs");
  if (s.ok()) s = host_->CheckSecrets(run.spec, r.workspace, nullptr);
  // runtime.env_secret names the namespace's own Secrets; only SECRET:KEY comes from tau's store.
  bool refers =
      std::any_of(run.spec.runtime.env.begin(), run.spec.runtime.env.end(),
                  [](const spec::EnvVar& v) { return v.secret_ref && v.secret_name.empty(); });
  if (s.ok() && refers) {
    // All of them: the namespace's Secret mirrors the workspace's secrets for every run there.
    auto values = host_->store()->SecretValues(r.workspace);
    if (values.ok()) {
      launch.secrets = std::move(*values);
    } else {
      s = values.status();
    }
  }
  if (s.ok()) s = KeepLogs(run, launch.attempt);
  if (s.ok()) s = cluster_->Launch(launch);
  // Created off this thread: the cluster's news says how it went (HandleCall).
  if (!s.ok()) Launched(run, launch.attempt, s, batch);
}

void KubeBackend::Launched(ActiveRun& run, int attempt, const Status& s, Batch* batch) {
  RunRecord& r = run.record;
  const std::string& name = r.name;
  // The watches may have seen the objects before the call's answer came (an answer lost on the
  // way): the attempt exists whatever the call said.
  if (s.ok() || r.state != RunState::kQueued) {
    run.resume_from.clear();
    batch->events.push_back(
        {0,
         name,
         host_->Now(),
         "Created",
         fmt::format("attempt {} created on the cluster; Kueue admits it from queue {}", attempt,
                     r.queue),
         {{"attempt", attempt}},
         "",
         ""});
    return;
  }
  if (s.code() == StatusCode::kUnavailable) {
    // The API server is away: the attempt stays recorded and is created when it answers again.
    Of(run).attempt = 0;
    Of(run).relaunch = true;
    r.not_before_ms = host_->Now() + 5000;
    Of(run).pending = {{"position", nullptr},
                       {"queue", r.queue},
                       {"code", "ClusterUnavailable"},
                       {"reason", fmt::format("cannot reach the Kubernetes API server ({}); "
                                              "tau tries again every 5s",
                                              s.message())}};
    batch->runs.push_back(r);
    return;
  }
  auto attempts = host_->store()->ListAttempts(name);
  AttemptRecord a;
  if (attempts.ok() && !attempts->empty()) a = attempts->back();
  a.run = name;
  a.number = attempt;
  a.dir = host_->AttemptDir(name, attempt);
  run::AttemptEnd end;
  end.failure_class = FailureClass::kSetupError;
  end.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kSetupFailed);
  end.exit_code = a.exit_code;
  end.message = fmt::format("the cluster refused the attempt: {}", s.message());
  Of(run).attempt = 0;
  host_->AttemptEnded(run, std::move(a), end, batch);
}

Status KubeBackend::KeepLogs(const ActiveRun& run, int attempt) {
  AttemptLogs logs;
  TAU_ASSIGN_OR_RETURN(logs.secrets, host_->LogSecrets(run.record));
  logs.max_bytes = run.resolved.max_log_bytes;
  logs.workers = std::max(1, run.spec.compute.workers);
  logs.metrics_file = layout::MetricsFile(host_->RunDir(run.record.name));
  cluster_->KeepLogs(run.record.name, attempt, std::move(logs));
  return Status::Ok();
}

void KubeBackend::HandleNews(const AttemptNews& news, Batch* batch) {
  if (news.call == AttemptNews::Call::kDeleted)
    if (auto o = orphans_.find({news.run, news.attempt}); o != orphans_.end()) {
      if (news.result.ok()) {
        orphans_.erase(o);
        return;
      }
      if (!o->second.told)  // said once, then tried again every 5s
        std::fprintf(stderr,
                     "tau server: run %s: deleting attempt %d on the cluster: %s (trying again "
                     "every 5s)\n",
                     news.run.c_str(), news.attempt, news.result.ToString().c_str());
      o->second = Orphan{host_->Now() + 5000, true};
      return;
    }
  auto it = host_->active().find(news.run);
  if (it == host_->active().end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (news.call != AttemptNews::Call::kNone) return HandleCall(run, news, batch);
  if (store::IsTerminal(r.state) || r.cancel_requested || news.attempt != Of(run).attempt) return;
  const AttemptFact& o = news.fact;
  if (o.phase == Phase::kPending) {
    Of(run).pending = {{"position", o.position ? nlohmann::json(*o.position) : nullptr},
                       {"queue", r.queue},
                       {"code", o.reason},
                       {"reason", o.message}};
    return;
  }
  if (o.Ended()) return EndAttempt(run, o, batch);
  if (r.state == RunState::kQueued) {
    r.admitted_ms = host_->Now();
    // tau's view of the queues (`tau queues`) counts the run against its quota with Kueue's
    // flavors, folded into tau's pod sets: a RayJob's head group is tau's "head" pod set when the
    // run has one, every other group (the workers) the first.
    admission::FlavorAssignment kueue = AssignmentFromJson(o.flavors);
    admission::FlavorAssignment folded;
    const bool has_head = run.workload.pod_sets.size() > 1;
    if (!run.workload.pod_sets.empty())
      for (const auto& [pod_set, assigned] : kueue)
        for (const auto& [resource, flavor] : assigned) {
          const std::string& ours = has_head && pod_set == "head"
                                        ? run.workload.pod_sets.back().name
                                        : run.workload.pod_sets.front().name;
          folded[ours].emplace(resource, flavor);
        }
    r.flavors = AssignmentJson(folded);
    host_->RunAdmitted(run,
                       fmt::format("admitted by Kueue (ClusterQueue {}{})", o.admitted_by,
                                   kueue.empty() ? "" : "; " + FlavorsText(kueue)),
                       {{"flavors", o.flavors}, {"cluster_queue", o.admitted_by}}, batch);
  }
  // Admitted but held up (an image that does not pull yet): said once per reason. Plain
  // admission ("Admitted") and a pod that ended before its Job's condition arrived are not news.
  const bool held_up = o.phase == Phase::kAdmitted && !o.reason.empty() && o.reason != "Admitted" &&
                       o.reason != "QuotaReserved";
  if (held_up && o.reason != r.reason) {
    r.reason = o.reason;
    batch->events.push_back(
        {0, r.name, host_->Now(), o.reason, o.message, {{"attempt", Of(run).attempt}}, "", ""});
    batch->runs.push_back(r);
  }
  if (o.phase == Phase::kRunning && r.state == RunState::kAdmitted) {
    auto attempts = host_->store()->ListAttempts(r.name);
    AttemptRecord a;
    if (attempts.ok() && !attempts->empty() && attempts->back().number == Of(run).attempt) {
      a = attempts->back();
    } else {
      a.run = r.name;
      a.number = Of(run).attempt;
      a.dir = host_->AttemptDir(r.name, a.number);
    }
    a.started_ms = host_->Now();
    host_->AttemptRunning(run, std::move(a),
                          fmt::format("attempt {} running on the cluster", Of(run).attempt),
                          {{"attempt", Of(run).attempt}}, batch);
  }
}

void KubeBackend::EndAttempt(ActiveRun& run, const AttemptFact& o, Batch* batch) {
  RunRecord& r = run.record;
  auto attempts = host_->store()->ListAttempts(r.name);
  if (!attempts.ok() || attempts->empty() || attempts->back().number != Of(run).attempt) return;
  AttemptRecord a = attempts->back();
  const int number = Of(run).attempt;
  Of(run).attempt = 0;
  Of(run).pending = nullptr;
  run::AttemptEnd end;
  end.exit_code = o.exit_code;
  end.message = o.message;
  if (o.phase == Phase::kSucceeded) {
    end.failure_class = FailureClass::kSucceeded;
    end.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kSucceeded);
    if (!end.exit_code) end.exit_code = 0;
    end.run_message = "the attempt completed on the cluster";
    return host_->AttemptEnded(run, std::move(a), end, batch);
  }
  end.outcome = runtime::OutcomeKindName(
      o.phase == Phase::kStopped ? runtime::OutcomeKind::kStopped : runtime::OutcomeKind::kFailed);
  end.failure_class = o.failure_class;
  if (end.failure_class != FailureClass::kPreempted)
    end.diagnosis = AttemptDiagnosis(a.dir, std::max(1, run.spec.compute.workers),
                                     "Running: the job failed on the cluster");
  else if (o.message.empty())
    end.run_message = "preempted by Kueue";
  if (o.phase == Phase::kStopped) {
    // Kueue would admit the same Job again later; tau makes each attempt a Job of its own, so
    // this one goes (its pods are being stopped anyway) and the next attempt is a new one.
    DeleteOrphan({r.name, number});
  }
  host_->AttemptEnded(run, std::move(a), end, batch);
}

void KubeBackend::StopAttempt(ActiveRun& run, FailureClass cls, const std::string& why,
                              Batch* batch) {
  RunRecord& r = run.record;
  ClusterRun& c = Of(run);
  if (c.attempt == 0 || r.cancel_requested || store::IsTerminal(r.state)) return;
  auto attempts = host_->store()->ListAttempts(r.name);
  if (!attempts.ok() || attempts->empty() || attempts->back().number != c.attempt) return;
  AttemptRecord a = attempts->back();
  run::AttemptEnd end;
  end.failure_class = cls;
  end.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kStopped);
  end.exit_code = a.exit_code;
  end.message = why;
  end.diagnosis = AttemptDiagnosis(a.dir, std::max(1, run.spec.compute.workers),
                                   "Running: stopped by the server");
  batch->events.push_back({0,
                           r.name,
                           host_->Now(),
                           recovery::FailureClassName(cls),
                           why + "; deleting the attempt's Kubernetes objects",
                           {{"attempt", c.attempt}},
                           "",
                           ""});
  // As an eviction: the run goes on (to a retry or its end) now, and the attempt's Job is deleted
  // once this is committed (again until it is gone); the deleted Job's news is then of an attempt
  // that is not the run's.
  DeleteOrphan({r.name, c.attempt});
  c.attempt = 0;
  c.pending = nullptr;
  host_->AttemptEnded(run, std::move(a), end, batch);
}

void KubeBackend::HandleCall(ActiveRun& run, const AttemptNews& news, Batch* batch) {
  RunRecord& r = run.record;
  ClusterRun& c = Of(run);
  if (news.call == AttemptNews::Call::kLaunched) {
    // A cancel deletes what the create made: its delete comes after it in the namespace's lane.
    if (store::IsTerminal(r.state) || r.cancel_requested || news.attempt != c.attempt) return;
    return Launched(run, news.attempt, news.result, batch);
  }
  // Only a cancel's delete is the run's to finish (a stopped or evicted attempt's is an orphan's,
  // HandleNews).
  if (!r.cancel_requested || news.attempt != c.deleting) return;
  c.deleting = 0;
  if (news.result.ok()) return FinishCancel(run, batch);
  // Kept cancel-requested: Schedule deletes again after a pause; each new failure is told once.
  c.delete_not_before = host_->Now() + 5000;
  if (news.result.message() == c.delete_error) return;
  c.delete_error = news.result.message();
  batch->events.push_back(
      {0, r.name, host_->Now(), "CancelRequested",
       fmt::format("deleting its Kubernetes objects failed ({}); tau tries again every 5s",
                   news.result.message()),
       nlohmann::json::object(), "", ""});
}

void KubeBackend::Cancel(ActiveRun& run, Batch* batch) {
  RunRecord& r = run.record;
  ClusterRun& c = Of(run);
  if (c.attempt > 0) {
    // In flight, or waiting to be tried again.
    if (c.deleting == c.attempt || host_->Now() < c.delete_not_before) return;
    if (c.delete_error.empty() && c.delete_not_before == 0) {
      // The first try: the request is recorded before it is acted on.
      batch->runs.push_back(r);
      batch->events.push_back({0,
                               r.name,
                               host_->Now(),
                               "CancelRequested",
                               fmt::format("deleting attempt {}'s Kubernetes objects", c.attempt),
                               {{"attempt", c.attempt}},
                               "",
                               ""});
    }
    c.deleting = c.attempt;
    to_delete_.emplace_back(r.name, c.attempt);
    return;
  }
  host_->RunCancelled(run, "cancelled before it started", batch);
}

void KubeBackend::FinishCancel(ActiveRun& run, Batch* batch) {
  RunRecord& r = run.record;
  const std::string message =
      r.started_ms ? "cancelled by request; its Kubernetes objects were deleted"
                   : "cancelled before it started; its Kubernetes objects were deleted";
  auto attempts = host_->store()->ListAttempts(r.name);
  const bool open = attempts.ok() && !attempts->empty() &&
                    attempts->back().number == Of(run).attempt &&
                    attempts->back().state != AttemptState::kFinished;
  Of(run).attempt = 0;
  if (!open) return host_->RunCancelled(run, message, batch);
  AttemptRecord a = attempts->back();
  run::AttemptEnd end;
  end.failure_class = FailureClass::kCancelled;
  end.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kStopped);
  end.exit_code = a.exit_code;
  end.message = "cancelled: its Kubernetes objects were deleted";
  end.run_message = message;
  host_->AttemptEnded(run, std::move(a), end, batch);
}

std::unique_ptr<Backend> NewKubeBackend(Cluster* cluster) {
  return std::make_unique<KubeBackend>(cluster);
}

}  // namespace tau::server
