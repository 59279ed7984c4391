// The controller: owns the life of every run on the local backend. One thread makes every decision
// (admission, starting attempts, handling exits, cancels), so decisions never race; API threads
// hand it work through an inbox. Each decision is committed to the store before it is acted on.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/admission.h"
#include "common/clock.h"
#include "common/layout.h"
#include "common/mutex.h"
#include "evidence/evidence.h"
#include "health/health.h"
#include "policy/policy.h"
#include "recovery/failure_class.h"
#include "runtime/runtime.h"
#include "server/active_run.h"
#include "server/cluster.h"
#include "server/evidence_worker.h"
#include "server/inbox.h"
#include "server/metrics.h"
#include "server/snapshot.h"
#include "spec/spec.h"
#include "store/store.h"

namespace tau::server {

struct ControllerOptions {
  std::string home;        // TAU_HOME
  std::string tau_binary;  // `tau __zygote` forks a shim per attempt, or `tau __shim DIR` is exec'd
  int64_t stop_grace_ms = 10'000;
  int64_t cpu_capacity_milli = 0;     // 0: detect
  int64_t memory_capacity_bytes = 0;  // 0: detect
  // The platform file `tau platform apply` writes and a restarted server reads; when it does not
  // exist the server uses policy::DefaultPlatform sized to this machine.
  std::string platform_file;
  Metrics* metrics = nullptr;  // counters and histograms to feed; may be null
  // The Kubernetes backend: runs are admitted by Kueue and run on this cluster instead of this
  // machine (no local admission, placement or processes). Null: the local backend.
  Cluster* cluster = nullptr;
  // Where decisions read the time (backoffs, stop deadlines, records); null: the system clock.
  Clock* clock = nullptr;
  // False: Start starts no decision thread, and the caller drives the loop with RunOnce (tests
  // that must not sleep).
  bool loop_thread = true;
};

struct SubmitRequest {
  std::string spec_file;  // for messages
  std::string spec_yaml;
  std::vector<CodeFile> code;
  policy::Caller caller;  // who submits: resolution checks workspace membership
};

// A submission that was refused: the diagnostics (spec errors) or a single message.
struct SubmitError {
  Status status;
  std::vector<spec::Diagnostic> diagnostics;
};

// A run's flavor assignment ({"POD_SET": {"RESOURCE": "FLAVOR"}}, as RunRecord.flavors keeps it)
// and its text ("cpu on default, nvidia.com/gpu on h200"; admit.cc).
nlohmann::json AssignmentJson(const admission::FlavorAssignment& a);
admission::FlavorAssignment AssignmentFromJson(const nlohmann::json& j);
std::string FlavorsText(const admission::FlavorAssignment& a);

class Controller {
 public:
  Controller(ControllerOptions options, store::Store* store, health::GpuInventory gpus);
  ~Controller();

  // Recovers the state left by a previous server (re-adopting live attempts), then starts the loop.
  Status Start();
  void Stop();
  // One pass of the decision loop on the caller's thread, without waiting: what the inbox holds,
  // then admission, commits and acts. Only for a controller started with loop_thread = false.
  void RunOnce();

  // Validates, snapshots and records a new run; it is queued when this returns.
  Result<store::RunRecord> Submit(SubmitRequest request, SubmitError* error);
  Status Cancel(const std::string& name);
  // A new run from a finished run's recorded spec and code snapshot. `warning` is set when the
  // recorded spec no longer gives the recorded config hash (tau changed how it reads it).
  Result<store::RunRecord> Rerun(const std::string& name, std::string* warning);
  // Another attempt of a failed or cancelled run, resuming from `from` (a checkpoint inside the
  // run's checkpoint directory; empty: the newest complete one). Refused after OOMKilled unless
  // `force`.
  Status Resume(const std::string& name, const std::string& from, bool force);
  // A GPU's health verdict changed (called from the GPU monitor's threads; only queues the news). A
  // GPU that is not placeable is given to no run, and attempts using it are stopped as GPUError.
  void OnGpuVerdict(int gpu, bool placeable, const std::string& why);

  // For queued runs: {"position": n (1 = next), "reason": "..."}; null when the run is not pending.
  nlohmann::json PendingInfo(const std::string& name);
  nlohmann::json Capacity();
  // Queues: usage against quota per flavor and resource, admitted and pending runs with their
  // positions and reasons, as of the last scheduling pass.
  nlohmann::json Queues();

  // The platform in force and where it came from.
  struct PlatformView {
    std::shared_ptr<const policy::Platform> platform;
    std::string source;  // the applied file's name, or "default"
    int64_t applied_ms = 0;
  };
  PlatformView CurrentPlatform();
  // Validates `yaml` as a platform, writes it durably to the platform file, then makes it the one
  // every later decision uses (no restart). Accepted runs keep the resolution they were given.
  Status ApplyPlatform(const std::string& yaml, const std::string& filename,
                       std::vector<spec::Diagnostic>* diagnostics);
  const health::GpuInventory& gpus() const { return gpus_; }
  // "local" or "kubernetes": where this server's runs run.
  const char* BackendName() const { return options_.cluster ? "kubernetes" : "local"; }
  std::string RunDir(const std::string& name) const { return layout::RunDir(options_.home, name); }
  std::string AttemptDir(const std::string& name, int attempt) const;
  // Where a run's checkpoints ("checkpoint") or outputs ("output") go.
  std::string StorageDir(const store::RunRecord& run, const std::string& role) const;

  // Evidence (controller_evidence.cc, docs/evidence.md). Callable from any thread: these read the
  // store and the run's files, never the loop's state.
  std::string EvidenceDir(const std::string& name) const {
    return layout::EvidenceDir(options_.home, name);
  }
  // The record: assembled now for a run that has not ended, else the one saved when it ended.
  Result<nlohmann::json> EvidenceRecord(const std::string& name) { return evidence_->Record(name); }
  // What ExportBundle needs: the record's input and where the logs and metrics are.
  Status EvidenceSources(const std::string& name, evidence::RecordInput* input,
                         evidence::BundleSources* sources) {
    return evidence_->Sources(name, input, sources);
  }
  // The latest GPU samples of the monitor (called by the server's sampling thread; only queues
  // them): appended to the evidence of the runs holding those GPUs.
  void OnGpuSamples(std::vector<evidence::GpuSample> samples);
  // Prunes the logs and GPU samples of runs that ended longer ago than the policy keeps them; the
  // record keeps their hashes. Called periodically by the server (not from the loop).
  Status ApplyRetention(const evidence::RetentionPolicy& policy, int64_t now_ms) {
    return evidence_->ApplyRetention(policy, now_ms);
  }

 private:
  Status RunAsSubmitter(const store::RunRecord& r, const runtime::LaunchContext& ctx,
                        runtime::AttemptConfig* config);
  // Whom a run's processes run as: nullopt for the server's own user (a server not running as
  // root, or a run root submitted).
  static Result<std::optional<runtime::AttemptConfig::RunAs>> SubmitterIds(
      const store::RunRecord& r);
  // Where the virtualenvs of the runs of `ids` are cached (each user its own: pip runs a package's
  // own code, as that user).
  std::string VenvCacheDir(const std::optional<runtime::AttemptConfig::RunAs>& ids) const;
  // Checks that every SECRET:KEY of `spec`'s env exists in the workspace; with `resolved_spec`,
  // also puts the values in its env (for launching only).
  Status CheckSecrets(const spec::RunSpec& spec, const std::string& workspace,
                      spec::RunSpec* resolved_spec);
  void HandleResume(const ResumeRequest& request, store::Batch* batch);
  void HandleGpuNews(const GpuNews& news, store::Batch* batch);
  // The evidence worker's view of the attempts running now.
  std::vector<EvidenceWorker::RunningAttempt> RunningAttempts() const;
  void DescribeRuntime(const store::RunRecord& r, bool final_save,
                       const evidence::RecordInput* prev, evidence::RuntimeInfo* rt) const;

  // One pass of the loop over what the inbox gave it.
  void Pass(InboxTake take);
  int64_t Now() const { return clock_->NowMillis(); }
  void Loop();
  // Inserts `r` as "<base>-<random hex>", drawing again while the name is taken.
  Status InsertWithUniqueName(
      store::RunRecord* r, const std::string& base,
      const std::function<std::vector<store::Event>(const std::string&)>& events);
  void Recover(store::Batch* batch, const std::set<AttemptKey>& on_cluster);
  void AdmitQueued(store::Batch* batch, std::vector<std::string>* to_start);
  // Starts the next attempt of each run: prepared one after another while the zygote forks their
  // shims (runtime::ShimBatch), then recorded as Running, or failed with SetupError.
  void StartAttempts(const std::vector<std::string>& names, store::Batch* batch);
  struct StartingAttempt {
    std::string name;
    store::AttemptRecord attempt;
    size_t processes = 0;
    size_t index = 0;  // in the ShimBatch
  };
  std::optional<StartingAttempt> PrepareAttempt(const std::string& name, runtime::ShimBatch* shims,
                                                store::Batch* batch);
  void AttemptStarted(StartingAttempt s, const Result<runtime::ProcessId>& shim,
                      store::Batch* batch);
  void FailStart(ActiveRun& run, store::AttemptRecord a, recovery::FailureClass reason,
                 const std::string& message, store::Batch* batch);
  void HandleExit(const std::string& name, store::Batch* batch);
  void HandleCancel(const std::string& name, store::Batch* batch);
  // Stopping an attempt acts on a decision, so it waits for the decision's commit: the loop calls
  // StopCommitted after each commit of its batch. A supervisor that has not ended its attempt
  // kStopMarginMs after the grace period is killed, with its workers (EscalateStops).
  void StopAfterCommit(const std::string& name);
  void StopCommitted();
  void EscalateStops(store::Batch* batch);
  // Recovery: the stop the server asked of a running attempt before it restarted (cancel,
  // preemption, a failed GPU), from the run's events; the attempt is asked again.
  void RestoreStopRequest(ActiveRun& run, int64_t attempt_started_ms);
  static constexpr int64_t kStopMarginMs = 5'000;
  // The Kubernetes backend (controller_cluster.cc).
  void RecoverOnCluster(ActiveRun& run, const std::set<AttemptKey>& existing, store::Batch* batch);
  void LaunchQueued(store::Batch* batch, std::vector<std::string>* to_launch);
  void LaunchOnCluster(const std::string& name, store::Batch* batch);
  void HandleClusterNews(const ClusterNews& news, store::Batch* batch);
  void EndClusterAttempt(ActiveRun& run, const kube::AttemptObservation& o, store::Batch* batch);
  void CancelOnCluster(ActiveRun& run, store::Batch* batch);
  // Masks what the attempt printed of the run's secrets in its stored logs, before anything reads
  // them (diagnosis, evidence hashes, bundles).
  void MaskSecretsInLogs(const ActiveRun& run, const store::AttemptRecord& attempt);
  // An attempt that vanished while the server was down (its processes, or its Job): it ends
  // NodeLost and the run is retried or fails by its resilience policy.
  void LoseAttempt(ActiveRun& run, store::AttemptRecord attempt, const std::string& message,
                   store::Batch* batch);
  // What the logs of a failed attempt say about why (its ranks' log tails).
  static nlohmann::json DiagnosisJson(const std::string& attempt_dir, size_t ranks,
                                      const std::string& phase);
  void Finish(ActiveRun& run, store::RunState state, const std::string& reason,
              const std::string& message, store::Batch* batch);
  // A failed attempt: retried when the spec's resilience policy allows it (recovery::Decide), else
  // the run fails. A preempted run goes back to its queue instead (Requeue) unless its retry_on
  // leaves Preempted out (recovery::PreemptionRequeues).
  void FailAttempt(ActiveRun& run, recovery::FailureClass failure_class, const std::string& message,
                   store::Batch* batch);
  void ReleaseResources(ActiveRun& run);
  int64_t NextWakeMillis() const;
  void Transition(ActiveRun& run, store::RunState state, const std::string& event_type,
                  const std::string& message, store::Batch* batch,
                  nlohmann::json data = nlohmann::json::object());
  void RefreshPending();
  Result<ActiveRun> Load(const store::RunRecord& record);
  // The same, with the record's spec already parsed (by Submit).
  Result<ActiveRun> Load(const store::RunRecord& record, spec::RunSpec spec);
  void CommitOrDie(store::Batch batch);
  void Count(const std::string& name, const Labels& labels);
  void CountAttempt(const store::AttemptRecord& attempt);
  static Resources Needs(const policy::ResolvedRun& resolved);
  // The admission engine side of a loop iteration (admit.cc).
  void RebuildEngine();
  void SyncEngine();
  void HandlePreemption(const admission::PreemptedInfo& p, store::Batch* batch);
  void Requeue(ActiveRun& run, const std::string& message, store::Batch* batch);
  bool Place(ActiveRun& run, store::Batch* batch);
  nlohmann::json PendingJson(const ActiveRun& run, int64_t now);
  // `pending` holds PendingJson of every queued run, as RefreshPending computed it.
  nlohmann::json QueuesJson(int64_t now, const std::map<std::string, nlohmann::json>& pending);
  Status LoadPlatformFile();
  std::string Refusal(const Resources& need) const;
  runtime::EnvList BaseEnv() const;
  void StartZygote();

  const ControllerOptions options_;
  Clock* const clock_;
  store::Store* const store_;
  const health::GpuInventory gpus_;
  std::unique_ptr<runtime::ProcessWatcher> watcher_;
  std::unique_ptr<runtime::Zygote> zygote_;  // forks the shims; null on a cluster
  std::vector<std::string> stops_;           // runs whose attempt stops after the next commit
  int64_t zygote_restarted_ms_ = 0;          // the last restart of a broken zygote; 0: none yet
  std::thread thread_;

  Inbox inbox_;
  std::unique_ptr<EvidenceWorker> evidence_;

  Mutex mu_;
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  std::map<std::string, nlohmann::json> pending_info_ TAU_GUARDED_BY(mu_);
  nlohmann::json capacity_info_ TAU_GUARDED_BY(mu_);
  nlohmann::json queues_info_ TAU_GUARDED_BY(mu_);
  PlatformView platform_ TAU_GUARDED_BY(mu_);
  // ApplyPlatform returns once the loop decides with the new platform (and its queue view is
  // fresh).
  int64_t platform_generation_ TAU_GUARDED_BY(mu_) = 0;
  int64_t platform_in_use_ TAU_GUARDED_BY(mu_) = 0;
  CondVar platform_cv_;

  // Owned by the loop thread.
  std::map<std::string, ActiveRun> active_;
  std::shared_ptr<const policy::Platform> loop_platform_;
  int64_t loop_generation_ = 0;
  std::optional<admission::Engine> engine_;
  std::map<std::string, bool> in_engine_;  // run -> holds quota (else pending in the engine)
  std::map<std::string, std::string> outside_engine_;  // run -> why the engine cannot take it
  std::map<std::string, admission::PendingInfo> engine_pending_;  // as of the last cycle
  std::set<int> free_gpus_;
  std::map<int, std::string> unplaceable_gpus_;  // GPU index -> why (Unhealthy or Unknown verdict)
  int64_t free_cpu_milli_ = 0;
  int64_t free_memory_bytes_ = 0;
  int64_t cpu_capacity_milli_ = 0;
  int64_t memory_capacity_bytes_ = 0;
};

}  // namespace tau::server
