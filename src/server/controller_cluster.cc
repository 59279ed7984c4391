// The controller on the Kubernetes backend: Kueue admits, the cluster runs. The run's records,
// retries, cancels and evidence follow the same rules as on the local backend; what differs is
// where an attempt comes from (a Job or RayJob created suspended) and how its end is learnt (the
// cluster's news, classified by kube::ObserveAttempt).
#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "recovery/failure_class.h"
#include "recovery/retry.h"
#include "server/controller.h"

namespace tau::server {

using store::AttemptRecord;
using store::AttemptState;
using store::Batch;
using store::RunRecord;
using store::RunState;
using Phase = kube::AttemptObservation::Phase;
using recovery::FailureClass;

namespace {}  // namespace

void Controller::RecoverOnCluster(ActiveRun& run, const std::set<AttemptKey>& existing,
                                  Batch* batch) {
  RunRecord& r = run.record;
  auto attempts = store_->ListAttempts(r.name);
  if (!attempts.ok() || attempts->empty() || attempts->back().state == AttemptState::kFinished) {
    // No attempt on the cluster: a queued run gets one on the next pass (one recorded as admitted
    // goes back to the queue first; this is no preemption).
    if (r.state != RunState::kQueued && !r.cancel_requested) {
      ReleaseResources(run);
      Transition(run, RunState::kQueued, "Requeued",
                 "back in the queue: its attempt had not been created when the server stopped",
                 batch);
      batch->runs.push_back(r);
    }
    return;
  }
  AttemptRecord last = attempts->back();
  r.attempts = last.number;
  if (existing.count({r.name, last.number})) {
    run.cluster_attempt = last.number;  // the watch's news brings it up to date
    return;
  }
  if (last.state == AttemptState::kStarting && r.state == RunState::kQueued) {
    // Recorded, but the server stopped before the cluster took it: create it now.
    run.cluster_relaunch = true;
    return;
  }
  LoseAttempt(run, last, "the attempt's Job vanished from the cluster while the server was down",
              batch);
}

void Controller::LaunchQueued(Batch* batch, std::vector<std::string>* to_launch) {
  // Kueue decides; tau's engine only mirrors what it admitted, for `tau queues`.
  SyncEngine();
  int64_t now = Now();
  for (auto& [name, run] : active_) {
    RunRecord& r = run.record;
    if (store::IsTerminal(r.state)) continue;
    if (r.cancel_requested) {
      // A cancel whose delete failed earlier (the API server was unreachable): again.
      CancelOnCluster(run, batch);
      continue;
    }
    if (r.state != RunState::kQueued || run.cluster_attempt != 0) continue;
    if (r.not_before_ms && *r.not_before_ms > now) continue;
    if (!run.cluster_relaunch) {
      AttemptRecord a;
      a.run = name;
      a.number = r.attempts + 1;
      a.dir = AttemptDir(name, a.number);
      a.state = AttemptState::kStarting;
      a.started_ms = now;
      batch->attempts.push_back(a);
      r.attempts = a.number;
    }
    run.cluster_relaunch = false;
    r.not_before_ms.reset();
    r.updated_ms = now;
    batch->runs.push_back(r);
    run.cluster_attempt = r.attempts;
    run.cluster_pending = nullptr;
    to_launch->push_back(name);
  }
}

void Controller::LaunchOnCluster(const std::string& name, Batch* batch) {
  ActiveRun& run = active_.at(name);
  RunRecord& r = run.record;
  ClusterLaunch launch;
  launch.run = name;
  launch.attempt = run.cluster_attempt;
  launch.spec = &run.spec;
  launch.resolved = &run.resolved;
  launch.platform = loop_platform_;
  launch.snapshot_dir = r.snapshot_dir;
  const std::string attempt_dir = AttemptDir(name, launch.attempt);
  if (launch.attempt > 1) {
    launch.failure_reason = r.reason;
    launch.resume_from = run.resume_from;  // on a cluster the job finds its newest checkpoint
  }
  Status s = MakeDirs(attempt_dir + "/logs");
  if (s.ok()) s = CheckSecrets(run.spec, r.workspace, nullptr);
  bool refers = std::any_of(run.spec.runtime.env.begin(), run.spec.runtime.env.end(),
                            [](const spec::EnvVar& v) { return v.secret_ref; });
  if (s.ok() && refers) {
    // All of them: the namespace's Secret mirrors the workspace's secrets for every run there.
    auto values = store_->SecretValues(r.workspace);
    if (values.ok()) {
      launch.secrets = std::move(*values);
    } else {
      s = values.status();
    }
  }
  if (s.ok()) s = options_.cluster->Launch(launch);
  if (s.ok()) {
    run.resume_from.clear();
    batch->events.push_back(
        {0,
         name,
         Now(),
         "Created",
         fmt::format("attempt {} created on the cluster; Kueue admits it from queue {}",
                     launch.attempt, r.queue),
         {{"attempt", launch.attempt}},
         "",
         ""});
    return;
  }
  if (s.code() == StatusCode::kUnavailable) {
    // The API server is away: the attempt stays recorded and is created when it answers again.
    run.cluster_attempt = 0;
    run.cluster_relaunch = true;
    r.not_before_ms = Now() + 5000;
    run.cluster_pending = {{"position", nullptr},
                           {"queue", r.queue},
                           {"code", "ClusterUnavailable"},
                           {"reason", fmt::format("cannot reach the Kubernetes API server ({}); "
                                                  "tau tries again every 5s",
                                                  s.message())}};
    batch->runs.push_back(r);
    return;
  }
  auto attempts = store_->ListAttempts(name);
  AttemptRecord a;
  if (attempts.ok() && !attempts->empty()) a = attempts->back();
  a.run = name;
  a.number = launch.attempt;
  a.dir = attempt_dir;
  a.state = AttemptState::kFinished;
  a.ended_ms = Now();
  a.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kSetupFailed);
  a.reason = recovery::FailureClassName(FailureClass::kSetupError);
  a.message = fmt::format("the cluster refused the attempt: {}", s.message());
  batch->attempts.push_back(a);
  CountAttempt(a);
  run.cluster_attempt = 0;
  FailAttempt(run, FailureClass::kSetupError, a.message, batch);
}

void Controller::HandleClusterNews(const ClusterNews& news, Batch* batch) {
  auto it = active_.find(news.run);
  if (it == active_.end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (store::IsTerminal(r.state) || r.cancel_requested || news.attempt != run.cluster_attempt)
    return;
  const kube::AttemptObservation& o = news.observed;
  if (o.phase == Phase::kPending) {
    run.cluster_pending = {{"position", news.position ? nlohmann::json(*news.position) : nullptr},
                           {"queue", r.queue},
                           {"code", o.reason},
                           {"reason", o.message}};
    return;
  }
  if (o.Terminal() || o.phase == Phase::kEvicted) return EndClusterAttempt(run, o, batch);
  if (r.state == RunState::kQueued) {
    r.admitted_ms = Now();
    // tau's view of the queues (`tau queues`) counts the run against its quota with Kueue's
    // flavors, folded into tau's one pod set (a RayJob's head and worker groups are one there).
    admission::FlavorAssignment kueue = AssignmentFromJson(o.flavors);
    admission::FlavorAssignment folded;
    if (!run.workload.pod_sets.empty())
      for (const auto& [pod_set, assigned] : kueue)
        for (const auto& [resource, flavor] : assigned)
          folded[run.workload.pod_sets.front().name].emplace(resource, flavor);
    r.flavors = AssignmentJson(folded);
    Transition(run, RunState::kAdmitted, "Admitted",
               fmt::format("admitted by Kueue (ClusterQueue {}{})", o.cluster_queue,
                           kueue.empty() ? "" : "; " + FlavorsText(kueue)),
               batch, {{"flavors", o.flavors}, {"cluster_queue", o.cluster_queue}});
    batch->runs.push_back(r);
  }
  // Admitted but held up (an image that does not pull yet): said once per reason. Plain
  // admission ("Admitted") and a pod that ended before its Job's condition arrived are not news.
  const bool held_up = o.phase == Phase::kAdmitted && !o.reason.empty() && o.reason != "Admitted" &&
                       o.reason != "QuotaReserved";
  if (held_up && o.reason != r.reason) {
    r.reason = o.reason;
    batch->events.push_back(
        {0, r.name, Now(), o.reason, o.message, {{"attempt", run.cluster_attempt}}, "", ""});
    batch->runs.push_back(r);
  }
  if (o.phase == Phase::kRunning && r.state == RunState::kAdmitted) {
    auto attempts = store_->ListAttempts(r.name);
    if (attempts.ok() && !attempts->empty() && attempts->back().number == run.cluster_attempt) {
      AttemptRecord a = attempts->back();
      a.state = AttemptState::kRunning;
      a.started_ms = Now();
      batch->attempts.push_back(a);
    }
    if (!r.started_ms) r.started_ms = Now();
    r.reason.clear();
    Transition(run, RunState::kRunning, "Running",
               fmt::format("attempt {} running on the cluster", run.cluster_attempt), batch,
               {{"attempt", run.cluster_attempt}});
    batch->runs.push_back(r);
  }
}

void Controller::EndClusterAttempt(ActiveRun& run, const kube::AttemptObservation& o,
                                   Batch* batch) {
  RunRecord& r = run.record;
  auto attempts = store_->ListAttempts(r.name);
  if (!attempts.ok() || attempts->empty() || attempts->back().number != run.cluster_attempt) return;
  AttemptRecord a = attempts->back();
  MaskSecretsInLogs(run, a);
  a.state = AttemptState::kFinished;
  a.ended_ms = Now();
  a.exit_code = o.exit_code;
  a.message = o.message;
  const int number = run.cluster_attempt;
  run.cluster_attempt = 0;
  run.cluster_pending = nullptr;
  if (o.phase == Phase::kSucceeded) {
    a.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kSucceeded);
    a.reason = recovery::FailureClassName(FailureClass::kSucceeded);
    if (!a.exit_code) a.exit_code = 0;
    batch->attempts.push_back(a);
    CountAttempt(a);
    r.exit_code = a.exit_code;
    Finish(run, RunState::kSucceeded, a.reason, "the attempt completed on the cluster", batch);
    return;
  }
  a.outcome = runtime::OutcomeKindName(o.phase == Phase::kEvicted ? runtime::OutcomeKind::kStopped
                                                                  : runtime::OutcomeKind::kFailed);
  const FailureClass cls =
      recovery::ParseFailureClass(o.failure_class).value_or(FailureClass::kUnknown);
  a.reason = recovery::FailureClassName(cls);
  if (cls != FailureClass::kPreempted)
    a.diagnosis = DiagnosisJson(a.dir, std::max(1, run.spec.compute.workers),
                                "Running: the job failed on the cluster");
  batch->attempts.push_back(a);
  CountAttempt(a);
  r.exit_code = a.exit_code;
  if (o.phase == Phase::kEvicted) {
    // Kueue would admit the same Job again later; tau makes each attempt a Job of its own, so
    // this one goes (its pods are being stopped anyway) and the next attempt is a new one.
    if (Status s = options_.cluster->Delete(r.name, number); !s.ok())
      std::fprintf(stderr, "tau server: run %s: deleting evicted attempt %d: %s\n", r.name.c_str(),
                   number, s.ToString().c_str());
  }
  if (cls == FailureClass::kPreempted &&
      recovery::PreemptionRequeues(spec::RetryPolicyOf(run.spec.resilience))) {
    Requeue(run, a.message.empty() ? "preempted by Kueue" : a.message, batch);
  } else {
    FailAttempt(run, cls, a.message, batch);
  }
}

void Controller::CancelOnCluster(ActiveRun& run, Batch* batch) {
  RunRecord& r = run.record;
  if (run.cluster_attempt > 0) {
    if (Status s = options_.cluster->Delete(r.name, run.cluster_attempt); !s.ok()) {
      // Kept cancel-requested: the next pass deletes again (LaunchQueued).
      batch->runs.push_back(r);
      batch->events.push_back(
          {0, r.name, Now(), "CancelRequested",
           fmt::format("deleting its Kubernetes objects failed ({}); trying again", s.message()),
           nlohmann::json::object(), "", ""});
      return;
    }
    auto attempts = store_->ListAttempts(r.name);
    if (attempts.ok() && !attempts->empty() && attempts->back().number == run.cluster_attempt &&
        attempts->back().state != AttemptState::kFinished) {
      AttemptRecord a = attempts->back();
      a.state = AttemptState::kFinished;
      a.ended_ms = Now();
      a.outcome = runtime::OutcomeKindName(runtime::OutcomeKind::kStopped);
      a.reason = recovery::FailureClassName(FailureClass::kCancelled);
      a.message = "cancelled: its Kubernetes objects were deleted";
      batch->attempts.push_back(a);
      CountAttempt(a);
    }
    run.cluster_attempt = 0;
  }
  Finish(run, RunState::kCancelled, recovery::FailureClassName(FailureClass::kCancelled),
         r.started_ms ? "cancelled by request; its Kubernetes objects were deleted"
                      : "cancelled before it started",
         batch);
}

}  // namespace tau::server
