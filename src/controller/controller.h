// The controller: owns the life of every run, on any backend (backend.h). One thread makes every
// decision (admission, starting attempts, handling exits, cancels), so decisions never race; API
// threads hand it work through an inbox. Each decision is committed to the store before it is acted
// on.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/admission.h"
#include "backend/active_run.h"
#include "backend/backend.h"
#include "backend/inbox.h"
#include "backend/snapshot.h"
#include "budget/budget.h"
#include "common/clock.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "controller/evidence_worker.h"
#include "controller/pass.h"
#include "evidence/evidence.h"
#include "guard/guard.h"
#include "health/health.h"
#include "policy/policy.h"
#include "recovery/failure_class.h"
#include "spec/spec.h"
#include "spec/workflow.h"
#include "store/store.h"

namespace tau::server {

struct ControllerOptions {
  std::string home;  // TAU_HOME
  // This machine's size: the built-in default platform is sized to it, /api/v1/capacity says it.
  int64_t cpu_capacity_milli = 0;
  int64_t memory_capacity_bytes = 0;
  // The platform file `tau platform apply` writes and a restarted server reads; when it does not
  // exist the server uses policy::DefaultPlatform sized to this machine.
  std::string platform_file;
  // When set, the default platform is sized to this instead (the Kubernetes backend: the cluster's
  // schedulable nodes), and the backend applies it at start as it does a platform file, so that
  // the cluster has the queue and priority class that runs name (a bare cluster has none).
  struct DefaultSize {
    int gpus = 0;
    int64_t cpu_milli = 0;
    int64_t memory_bytes = 0;
  };
  std::optional<DefaultSize> default_platform_size;
  Metrics* metrics = nullptr;  // counters and histograms to feed; may be null
  // Where runs are admitted and run (local_backend.h: this machine; kube_backend.h: a Kubernetes
  // cluster). Required.
  Backend* backend = nullptr;
  // Where decisions read the time (backoffs, stop deadlines, records); null: the system clock.
  Clock* clock = nullptr;
  // False: Start starts no decision thread, and the caller drives the loop with RunOnce (tests
  // that must not sleep).
  bool loop_thread = true;
  // The bytes of code blobs one identity may have uploaded that no run uses yet (docs/security.md,
  // "Code blobs"), and the live API tokens one user may hold.
  int64_t max_unreferenced_blob_bytes = int64_t{1} << 30;
  int64_t max_tokens_per_user = 100;
};

// The workspaces whose runs a caller may read (nullopt: every one): a manifest may name the blobs
// of those runs' code as well as the blobs the caller uploaded.
using ReadableWorkspaces = std::optional<std::vector<std::string>>;

struct SubmitRequest {
  std::string spec_file;  // for messages
  std::string spec_yaml;
  std::vector<spec::Override> spec_overrides;  // tau run --set, applied to the YAML when parsed
  // The code: its files inline, or (`manifest` set) a manifest whose blobs the server holds.
  std::vector<CodeFile> code;
  std::optional<std::vector<CodeManifestEntry>> manifest;
  std::string code_dir;  // the spec's folder inside the code ("" at its root): the run starts there
  policy::Caller caller;    // who submits: resolution checks workspace membership
  bool token_user = false;  // signed in with a token, not known to the kernel as a local user
  // The client's idempotency key ("" for none): a submission by the same user with a key already
  // used is the run that key made (the same spec and code), not a new one.
  std::string idempotency_key;
  // Whose runs' code a manifest may name besides the blobs `caller` uploaded; none unless set.
  ReadableWorkspaces readable_workspaces = std::vector<std::string>();
};

// A submission that was refused: the diagnostics (spec errors) or a single message.
struct SubmitError {
  Status status;
  std::vector<spec::Diagnostic> diagnostics;
  // A manifest's blobs the server lacks (sorted): the client uploads them and submits again, so
  // that unchanged code costs one request (the reply's "missing").
  std::vector<std::string> missing_blobs;
};

// What Submit did: made the run, or found the one an earlier submission with the same
// idempotency key made (`replayed`).
struct SubmitOutcome {
  store::RunRecord run;
  bool replayed = false;
};

// A batch of submissions (POST /api/v1/runs/batch): validated whole before anything is written,
// then inserted in one transaction, all or none.
constexpr size_t kMaxBatchRuns = 10'000;
struct BatchCode {  // one code directory that items share: checked and snapshotted once
  std::vector<CodeFile> files;
  std::optional<std::vector<CodeManifestEntry>> manifest;
  std::string dir;  // as SubmitRequest::code_dir
};
struct BatchItem {
  std::string spec_file, spec_yaml;
  std::vector<spec::Override> spec_overrides;  // as SubmitRequest's
  size_t code = 0;                             // index into BatchRequest::codes
  std::optional<int64_t> array_index;          // required in an array, refused outside one
  // In a workflow (BatchRequest::workflow): the item's stage, and the stages it waits for.
  std::string stage;
  std::vector<spec::StageDependency> after;
};
struct BatchArray {  // the items are one array: item i has index first + i * step
  int64_t first = 0, last = 0, step = 1;
  // At most this many of its runs in play at once (admitted, running, or queued for quota); the
  // others wait out of their queue, in index order.
  std::optional<int64_t> max_parallel;
};
struct BatchRequest {
  std::vector<BatchCode> codes;
  std::vector<BatchItem> items;
  std::optional<BatchArray> array;
  // A workflow's name: the items are its stages, run i named "<workflow>-<hex>-<stage i>" and
  // held in its queue until the runs of the stages it waits for have ended (spec/workflow.h).
  std::string workflow;
  policy::Caller caller;
  bool token_user = false;
  // For the whole batch: run i is recorded with the key "KEY/i" (a client's key never holds a
  // '/'), so a batch sent again gets its runs back, and a single submission's key is another.
  std::string idempotency_key;
  ReadableWorkspaces readable_workspaces = std::vector<std::string>();  // as SubmitRequest's
};
// A batch that was refused: `index` is the item at fault (none: the batch as a whole).
struct BatchError {
  std::optional<size_t> index;
  Status status;
  std::vector<spec::Diagnostic> diagnostics;
};
struct BatchOutcome {
  std::vector<store::RunRecord> runs;  // in the order of the items
  bool replayed = false;
};

// A replica of a service (Controller::SubmitReplica; server/services.h keeps the services).
struct ReplicaRequest {
  std::string service;
  int64_t revision = 1;
  int port = 0;  // the replica's $PORT
  std::string spec_file, spec_yaml;
  std::vector<spec::Override> overrides;
  std::string code_dir;         // as SubmitRequest::code_dir
  std::string snapshot_digest;  // the service's code, stored at deploy (StoreCode)
  std::string from_run;         // the trained run it serves ("" : none)
  policy::Caller caller;        // the service's owner
  bool token_user = false;
  bool dry_run = false;  // checked as a submission is, returned unnamed, not recorded
};

// A replica checked as a submission is (Controller::PrepareReplica): what a cluster renders a
// service's objects from.
struct PreparedReplica {
  store::RunRecord record;  // unnamed, not recorded
  spec::RunSpec spec;
  nlohmann::json submitted;  // the Submitted event's data
  policy::ResolvedRun resolved;
  std::shared_ptr<const policy::Platform> platform;
  // The workspace's secrets when the spec's env refers to any (SECRET:KEY), else none.
  std::map<std::string, std::string> secrets;
};

// Which part of the queues view a caller wants (Controller::Queues).
struct QueuesQuery {
  bool summary = false;     // without the runs (their counts stay): `tau queues`, the metrics
  std::string queue;        // only this queue ("": every queue)
  size_t offset = 0;        // each queue's pending runs from this position (0: the head) ...
  size_t limit = SIZE_MAX;  // ... and at most this many of them
};

class Controller : private RunHost, private PassHost {
 public:
  Controller(ControllerOptions options, store::Store* store, health::GpuInventory gpus);
  ~Controller() override;

  // Recovers the state left by a previous server (re-adopting live attempts), then starts the loop.
  Status Start();
  void Stop();
  // One pass of the decision loop on the caller's thread, without waiting: what the inbox holds,
  // then admission, commits and acts. Only for a controller started with loop_thread = false.
  void RunOnce();

  // Validates, snapshots and records a new run; it is queued when this returns.
  Result<SubmitOutcome> Submit(SubmitRequest request, SubmitError* error);
  // Many submissions at once (BatchRequest): every item is checked as Submit checks one (an item
  // that repeats an earlier one's spec and code is checked once), then all are inserted in one
  // transaction, or none when one is refused (`error` names it).
  Result<BatchOutcome> SubmitBatch(BatchRequest request, BatchError* error);
  // Code upload (POST /api/v1/code/missing, PUT /api/v1/blobs/SHA256): the digest of a manifest's
  // snapshot and the blobs of it `user` must upload: those the server lacks and those that are
  // not theirs to name (neither uploaded by them nor used by a run of `readable`), told apart
  // from nothing, so that no caller learns what others stored. A blob checked against its digest
  // and stored for `user` (true when it was not theirs before, whoever else had it), within their
  // quota of bytes that no run uses yet.
  struct CodeCheck {
    std::string digest;
    bool stored = false;  // the snapshot is stored and `user` may use it: nothing to upload
    std::vector<std::string> missing;
  };
  Result<CodeCheck> CheckCode(std::vector<CodeManifestEntry> manifest, const std::string& user,
                              const ReadableWorkspaces& readable);
  Result<bool> StoreCodeBlob(const std::string& user, const std::string& sha256,
                             std::string_view data);
  int64_t MaxTokensPerUser() const { return options_.max_tokens_per_user; }
  // Answered once the loop has committed the cancel (CancelRequested, or the run Cancelled), so
  // that a server killed right after the answer still cancels the run when it restarts. When that
  // takes longer than kDurableWaitMs (a full disk holds every commit) the cancel stays queued, to
  // take effect once committed, and `pending` (when given) says it is not durable yet and why.
  Status Cancel(const std::string& name, std::string* pending = nullptr);
  // Below the CLI's 5 s wait for an answer (TAU_TIMEOUT); a pass takes milliseconds.
  static constexpr int64_t kDurableWaitMs = 3000;
  // A new run from a finished run's recorded spec (with its --set overrides) and code snapshot.
  // `warning` is set when the recorded spec no longer gives the recorded config hash (tau changed
  // how it reads it). With `overrides` (tau rerun --set) they are applied over the run's own and
  // the spec is resolved again for `caller`, since what they set may change its queue or shape;
  // without, the run's resolution is reused.
  Result<store::RunRecord> Rerun(const std::string& name, std::string* warning,
                                 const std::vector<spec::Override>& overrides = {},
                                 const policy::Caller* caller = nullptr, bool token_user = false,
                                 SubmitError* error = nullptr);
  // Services (service.cc). The snapshot of a service's code, stored once at deploy.
  // A manifest names only blobs `user` may use (CheckCode).
  Result<Snapshot> StoreCode(std::vector<CodeFile> files,
                             std::optional<std::vector<CodeManifestEntry>> manifest,
                             const std::string& user, const ReadableWorkspaces& readable);
  // A replica: the service's spec checked and resolved as a submission is, recorded with its place
  // (RunRecord::service) and queued; with a from_run it waits for that run to end and serves its
  // model (the upstream stage kModelStage).
  static constexpr const char* kModelStage = "model";
  Result<store::RunRecord> SubmitReplica(const ReplicaRequest& request, SubmitError* error);
  // What SubmitReplica checks, with the spec, its resolution on the current platform and the
  // secrets it refers to (a service on the Kubernetes backend, whose replicas are not runs).
  Result<PreparedReplica> PrepareReplica(const ReplicaRequest& request, SubmitError* error);
  // A replica that failed its liveness probe: its running attempt is stopped as LivenessFailed,
  // and restarted after its backoff (only queues the request).
  void RestartReplica(const std::string& name, const std::string& why);
  // Workflows (workflow.cc). Cancels every run of the workflow that has not ended; their names.
  // Answered as Cancel is: once committed, or with `pending` set.
  Result<std::vector<std::string>> CancelWorkflow(const std::string& workflow,
                                                  std::string* pending = nullptr);
  // Runs `stage` of the workflow again: a new run of its newest run's spec, code and resolution,
  // and a new run of each stage after it whose newest run never ran because of it
  // (UpstreamFailed), all waiting as the workflow says. Refused while the stage's newest run has
  // not ended or when it succeeded.
  Result<std::vector<store::RunRecord>> RetryStage(const std::string& workflow,
                                                   const std::string& stage);
  // Another attempt of a failed or cancelled run, resuming from `from` (a checkpoint inside the
  // run's checkpoint directory; empty: the newest complete one). Refused after OOMKilled unless
  // `force`.
  // Answered as Cancel is: once committed, or with `pending` set.
  Status Resume(const std::string& name, const std::string& from, bool force,
                std::string* pending = nullptr);
  // A GPU's health verdict changed (called from the GPU monitor's threads; only queues the news). A
  // GPU that is not placeable is given to no run; attempts using it are stopped as GPUError only
  // when `stop_running` (health::StopsRunningWork).
  void OnGpuVerdict(int gpu, bool placeable, bool stop_running, const std::string& why);

  // For queued runs: {"position": n (1 = next), "reason": "..."}; null when the run is not pending.
  nlohmann::json PendingInfo(const std::string& name);
  // The pending entry of a run the views have not seen yet (one just submitted).
  static nlohmann::json WaitingForScheduler();
  nlohmann::json Capacity();
  // Queues: usage against quota per flavor and resource, admitted and pending runs with their
  // positions and reasons, as of the last scheduling pass. A deep queue's runs are most of it, so
  // a caller asks for the part it shows (QueuesQuery).
  nlohmann::json Queues(const QueuesQuery& query = {});
  // Budgets (docs/budgets.md): every budget's state as last checked (at most a second old):
  // [{"name", "scope", "workspace", "user", "queue", "gpu_hours", "cpu_hours", "used":
  // {"gpu_hours", "cpu_hours"}, "from", "resets", "spent", "warn", "message"}].
  nlohmann::json Budgets();
  // What was held since `since_ms` (ended holdings from the store, open ones as last checked), by
  // "workspace", "user", "queue", "flavor" or "run": [{"key", "gpu_hours", "cpu_hours",
  // "idle_gpu_hours", "idle_share", "cost", "runs"}], the most GPU-hours first.
  // Only `workspaces`' runs when given.
  Result<nlohmann::json> Usage(const std::string& by, int64_t since_ms,
                               const std::optional<std::vector<std::string>>& workspaces = {});
  // The same over time: {"buckets": [start of each, RFC 3339], "series": [{"key", "gpu_hours":
  // [per bucket], "cpu_hours": [...]}]}, buckets of `bucket_ms` from `since_ms` rounded down to
  // one (UTC days for a day) until now; at most kMaxUsageBuckets.
  Result<nlohmann::json> UsageSeries(
      const std::string& by, int64_t since_ms, int64_t bucket_ms,
      const std::optional<std::vector<std::string>>& workspaces = {});
  static constexpr int64_t kMaxUsageBuckets = 2000;

  // The platform in force and where it came from.
  struct PlatformView {
    std::shared_ptr<const policy::Platform> platform;
    std::string source;  // the applied file's name, or "default"
    int64_t applied_ms = 0;
    std::string text;  // as a platform file: what was applied, or the default's text
  };
  PlatformView CurrentPlatform();
  // Validates `yaml` as a platform, writes it durably to the platform file, then makes it the one
  // every later decision uses (no restart). Accepted runs keep the resolution they were given.
  Status ApplyPlatform(const std::string& yaml, const std::string& filename,
                       std::vector<spec::Diagnostic>* diagnostics);
  const health::GpuInventory& gpus() const { return gpus_; }
  // The engine's name (what records and replies say): where this server's runs run.
  const char* BackendName() const { return backend_->Name(); }
  // What the backend can do (backend/capabilities.h): asked instead of its name.
  Capabilities Caps() const { return backend_->Caps(); }
  std::string RunDir(const std::string& name) const override {
    return layout::RunDir(options_.home, name);
  }
  std::string AttemptDir(const std::string& name, int attempt) const override;
  // Where a run's checkpoints ("checkpoint") or outputs ("output") go.
  std::string StorageDir(const store::RunRecord& run, const std::string& role) const override;

  // Evidence (evidence_worker.h, docs/evidence.md). Callable from any thread: these read the
  // store and the run's files, never the loop's state.
  std::string EvidenceDir(const std::string& name) const {
    return layout::EvidenceDir(options_.home, name);
  }
  // The record: assembled now for a run that has not ended, else the one saved when it ended.
  Result<nlohmann::json> EvidenceRecord(const std::string& name) { return evidence_->Record(name); }
  // The totals of a run's metric ingestion, refused points included.
  Result<evidence::MetricsStats> MetricsStats(const std::string& name) {
    return evidence_->MetricsStats(name);
  }
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
  // The backend's view of the controller (backend.h).
  std::map<std::string, ActiveRun>& active() override { return active_; }
  QuotaBook& quota() override { return quota_; }
  int64_t Now() override { return clock_->NowMillis(); }
  store::Store* store() override { return store_; }
  Metrics* metrics() override { return options_.metrics; }
  std::shared_ptr<const policy::Platform> platform() override { return loop_platform_; }
  void Post(InboxMessage message) override { inbox_.Push(std::move(message)); }
  // What a backend says of a run's attempts (backend.h), written through the run machine.
  void RunAdmitted(ActiveRun& run, const std::string& message, nlohmann::json data,
                   store::Batch* batch) override;
  void AttemptRunning(ActiveRun& run, store::AttemptRecord attempt, const std::string& message,
                      nlohmann::json data, store::Batch* batch) override;
  void AttemptEnded(ActiveRun& run, store::AttemptRecord attempt, const run::AttemptEnd& end,
                    store::Batch* batch) override;
  void AttemptVanished(ActiveRun& run, store::AttemptRecord attempt, const std::string& message,
                       store::Batch* batch) override;
  void RunCancelled(ActiveRun& run, const std::string& message, store::Batch* batch) override;
  void Requeue(ActiveRun& run, const std::string& message, store::Batch* batch) override;
  void ReturnToQueue(ActiveRun& run, const std::string& message, store::Batch* batch) override;

  // The run machine's moves (run::Transition), as this controller makes them: a move the table
  // refuses is a bug, said in the server's log and counted, and changes nothing.
  void Transition(ActiveRun& run, store::RunState state, const std::string& event_type,
                  const std::string& message, store::Batch* batch,
                  nlohmann::json data = nlohmann::json::object());
  void Finish(ActiveRun& run, store::RunState state, const std::string& reason,
              const std::string& message, store::Batch* batch);
  // A failed attempt: retried when the spec's resilience policy allows it (recovery::Decide), else
  // the run fails.
  void FailAttempt(ActiveRun& run, recovery::FailureClass failure_class, const std::string& message,
                   store::Batch* batch);
  // Gives back what the run holds (quota, and the backend's share): it ended or is requeued. The
  // time it held quota is metered (a Metered event in `batch`, and the budgets' ledger).
  void ReleaseResources(ActiveRun& run, store::Batch* batch);
  void CountAttempt(const store::AttemptRecord& attempt);
  void Count(const std::string& name, const Labels& labels) override;
  Status CheckSecrets(const spec::RunSpec& spec, const std::string& workspace,
                      spec::RunSpec* resolved_spec) override;
  Result<std::vector<std::string>> LogSecrets(const store::RunRecord& run) override;
  void AttemptMetricsEnded(const std::string& run, int attempt) override {
    evidence_->AttemptEnded(run, attempt);
  }

  // A submission checked and ready to insert: its record (without a name), its spec, the data of
  // its Submitted event.
  struct PreparedRun {
    store::RunRecord record;
    spec::RunSpec spec;
    nlohmann::json submitted;
    policy::ResolvedRun resolved;
    std::shared_ptr<const policy::Platform> platform;  // the one it was resolved against
  };
  // Everything Submit does before the insert: parse, resolve, the checks, the snapshot
  // (`snapshot` makes it, once the checks that need no code have passed). The run's name will be
  // `name_base` (the spec's name when "") and a suffix as long as `name_suffix`.
  Result<PreparedRun> PrepareRun(const std::string& spec_yaml, const std::string& spec_file,
                                 const std::vector<spec::Override>& overrides,
                                 const std::string& code_dir, const policy::Caller& caller,
                                 bool token_user, const std::function<Result<Snapshot>()>& snapshot,
                                 const std::string& name_base, const std::string& name_suffix,
                                 SubmitError* error);
  // Rerun with --set: the recorded spec parsed with `recorded` and `overrides` over them, resolved
  // for `caller` as a submission is, on the run's stored snapshot.
  Result<store::RunRecord> RerunWithOverrides(const store::RunRecord& from,
                                              const std::vector<spec::Override>& recorded,
                                              const std::vector<spec::Override>& overrides,
                                              const policy::Caller* caller, bool token_user,
                                              SubmitError* error);
  // After a run's insert: counted, and handed to the loop with its view already made.
  void Accepted(const store::RunRecord& r, spec::RunSpec spec);
  void HandleResume(const ResumeRequest& request, store::Batch* batch);
  void HandleCancel(const std::string& name, store::Batch* batch);
  void HandleRestart(const RestartRequest& request, store::Batch* batch);
  // The passes (pass.h), told of a run that enters the loop and of one that ends.
  void RunAdded(ActiveRun& run, bool recovered) {
    for (const auto& pass : passes_) pass->RunAdded(run, recovered);
  }
  void RunEnded(const store::RunRecord& r) {
    for (const auto& pass : passes_) pass->RunEnded(r);
  }
  void EngineChanged(const std::string& run) override { sync_changed_.insert(run); }
  void EndRun(ActiveRun& run, store::RunState state, const std::string& reason,
              const std::string& message, store::Batch* batch) override {
    Finish(run, state, reason, message, batch);
  }
  // Budgets (budgets.cc). The ledger of what runs held, read back at start; each pass holds back
  // the queued runs a spent budget covers (ActiveRun::budget_hold) and lets them go when it has
  // room again; a release meters the run's time on quota (a Metered event).
  Status LoadLedger();
  // Admission fair sharing's usage of each LocalQueue, rebuilt at start from what runs held.
  Status RestoreFairUsage();
  void ApplyBudgets(store::Batch* batch);
  // Idle and stalled runs (guardrails.cc): the pass's GPU samples and each running attempt's
  // output against its workspace's limits.idle and limits.stall; warnings and marks as events,
  // stops through the backend.
  void ApplyGuardrails(const std::vector<GpuSamples>& samples, store::Batch* batch);
  void Meter(ActiveRun& run, store::Batch* batch);
  // What the runs holding quota hold now.
  std::vector<budget::Holding> OpenHoldings() const;
  // What usage reports read: the holdings that ended since `since_ms` and those open now.
  Status UsageInputs(int64_t since_ms, std::vector<store::UsageRecord>* ended,
                     std::vector<budget::Holding>* open);
  // At submission: a budget with on_exceed: refuse that the run cannot fit (its GPUs for its
  // max_runtime beyond what is left; without a max_runtime, a spent budget) refuses it.
  Status CheckBudgets(const policy::Platform& platform, const policy::ResolvedRun& run,
                      const std::string& user);
  // A new run from a finished run's recorded spec, code and resolution (no name yet): what Rerun
  // and RetryStage insert. `warning` is set when the spec now gives another config hash.
  Result<store::RunRecord> RecordFrom(const store::RunRecord& from, std::string* warning);
  void Loop();
  // One pass of the loop over what the inbox gave it.
  void Pass(InboxTake take);
  // Of `manifest`'s blobs, those `user` must upload before it can be stored (CheckCode).
  Result<std::vector<std::string>> BlobsToUpload(const Manifest& manifest, const std::string& user,
                                                 const ReadableWorkspaces& readable);
  // `manifest` stored as a snapshot, when `user` may name every blob of it.
  Result<Snapshot> StoreManifest(const Manifest& manifest, const std::string& user,
                                 const ReadableWorkspaces& readable,
                                 std::vector<std::string>* missing);
  // Records which blobs a stored snapshot is made of (once per snapshot).
  Status RecordSnapshot(const Snapshot& snapshot);
  // Inserts `r` as "<base>-<random hex>", drawing again while the name is taken.
  Status InsertWithUniqueName(
      store::RunRecord* r, const std::string& base,
      const std::function<std::vector<store::Event>(const std::string&)>& events);
  void Recover(store::Batch* batch);
  int64_t NextWakeMillis();
  // At the end of a pass that took `writes` of the API's writes: the views change (they are built
  // when an API call wants them).
  void RefreshPending(int64_t writes);
  // Posts an API call's write (a new run, a cancel, a resume): views read after it include it.
  // Its number among the writes, for WaitCommitted.
  int64_t PostWrite(InboxMessage message);
  // On an API thread: waits up to kDurableWaitMs for the loop to have committed the pass that took
  // `write` (and every write before it). Else sets `pending` (when given) to why it is not.
  void WaitCommitted(int64_t write, std::string* pending);
  // Builds the views API calls read (pending_info_, capacity_info_, queues_info_): O(queued
  // runs), so the loop builds them when asked (or, driven by hand, on every pass), never on every
  // pass of a running server: that made a deep queue's drain quadratic.
  void BuildViews();
  // On an API thread: makes the views at most kViewsMaxAgeMs old (or current, when nothing has
  // changed since they were built; with `now`, built after this call), asking the loop and
  // waiting for it (at most 2 s: else the last ones).
  // `own_writes`: the views include the writes posted before this call.
  void FreshViews(bool now = false, bool own_writes = true) TAU_REQUIRES(mu_);
  Result<ActiveRun> Load(const store::RunRecord& record);
  // The same, with the record's spec already parsed (by Submit).
  Result<ActiveRun> Load(const store::RunRecord& record, spec::RunSpec spec);
  void CommitOrDie(store::Batch batch);
  static Resources Needs(const policy::ResolvedRun& resolved);
  // The admission engine's side of a pass (quota.cc): the engine is built from the platform, and
  // its workloads are kept in step with the runs.
  void RebuildEngine();
  void SyncEngine();
  // One run's step of SyncEngine, in its pass for runs holding quota (`holders`) or for the
  // others. Returns whether it changed the engine's workloads (`dry`: whether it would, doing
  // nothing).
  bool SyncRun(ActiveRun& run, bool holders, int64_t now, bool dry);
  // The queues view as BuildViews keeps it: each queue's fields apart from its runs, so that
  // reading a page of a deep queue costs that page, not the queue.
  struct QueueView {
    nlohmann::json fields;  // name, cohort, queueing_strategy, usage, and the counts
    nlohmann::json admitted_runs = nlohmann::json::array();
    struct Waiting {
      std::string name, workspace;
      int64_t priority = 0;
      nlohmann::json pending;  // why it waits, when it is not queued (a queued run's is in
                               // pending_info_)
    };
    std::vector<Waiting> pending_runs;  // by position
  };
  struct QueuesView {
    std::vector<QueueView> queues;
    nlohmann::json cohorts = nlohmann::json::array();
    nlohmann::json unqueued_runs = nlohmann::json::array();
  };
  // Why `run` waits. `usage` caches the engine's usage of each queue for one build.
  nlohmann::json PendingJson(const ActiveRun& run, int64_t now,
                             std::map<std::string, std::vector<admission::ResourceUsage>>* usage);
  // `pending` holds PendingJson of every queued run.
  QueuesView BuildQueuesView(int64_t now, const std::map<std::string, nlohmann::json>& pending);
  Status LoadPlatformFile();

  const ControllerOptions options_;
  Clock* const clock_;
  store::Store* const store_;
  const health::GpuInventory gpus_;
  int64_t cpu_capacity_milli_ = 0;
  int64_t memory_capacity_bytes_ = 0;
  Backend* backend_ = nullptr;
  std::thread thread_;
  Inbox inbox_;
  std::unique_ptr<EvidenceWorker> evidence_;

  // SyncEngine's work (decision thread only): runs changed since it last looked, runs backing off
  // (by the time their backoff ends), runs whose last attempt's metrics are still being read, and
  // whether to look at every run (the engine was rebuilt).
  std::set<std::string> sync_changed_;
  std::set<std::pair<int64_t, std::string>> sync_backoff_;
  std::set<std::string> sync_draining_;
  bool sync_all_ = true;
  // The features that are passes, in the order they are asked (decision thread only): the array
  // gate (workflow_gate.h), the array throttle (array_throttle.h).
  std::vector<std::unique_ptr<RunPass>> passes_;
  // Budgets (decision thread only): the ledger, when every queued run was last checked against
  // the budgets (they are checked again at least every second, and at once after a release or a
  // new platform), and the runs told that a budget of theirs nears its limit.
  budget::Ledger ledger_;
  int64_t budgets_checked_ms_ = 0;
  bool budgets_dirty_ = true;
  std::set<std::string> budget_warned_;
  // Guardrails (decision thread only): each running attempt watched, and when output was last read
  // (every kGuardOutputMs).
  std::map<std::string, guard::Watch> watches_;
  int64_t guard_output_ms_ = 0;
  // The GPU time each running run's GPUs were sampled, and how much of it they were idle (under
  // kIdleSharePct), until its Meter says so in its Metered event (decision thread only).
  struct GpuTime {
    int64_t last_sample_ms = 0;
    int64_t sampled_gpu_ms = 0, idle_gpu_ms = 0;
  };
  std::map<std::string, GpuTime> gpu_time_;
  // Where the usage report's idle share draws the line; the idle guardrail has its own threshold.
  static constexpr double kIdleSharePct = 5;
  // Adds the GPU samples of a pass to the runs holding those GPUs (gpu_time_).
  void AccountGpuTime(const std::vector<RunningAttempt>& running,
                      const std::vector<GpuSamples>& samples);

  Mutex mu_;
  // Held across a keyed submission's lookup and insert, so that two submissions with one key make
  // one run.
  Mutex submit_mu_;
  // Uploads under way, by uploader: their bytes count against the quota until they are recorded.
  Mutex blob_mu_;
  std::map<std::string, int64_t> blob_bytes_in_flight_ TAU_GUARDED_BY(blob_mu_);
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  // The budgets as last checked, and what was held then: for the API (Budgets, Usage) and the
  // submission check.
  nlohmann::json budget_view_ TAU_GUARDED_BY(mu_) = nlohmann::json::array();
  std::vector<budget::Holding> open_view_ TAU_GUARDED_BY(mu_);
  std::map<std::string, nlohmann::json> pending_info_ TAU_GUARDED_BY(mu_);
  nlohmann::json capacity_info_ TAU_GUARDED_BY(mu_);
  QueuesView queues_info_ TAU_GUARDED_BY(mu_);
  int64_t views_build_ms_ TAU_GUARDED_BY(mu_) = 0;    // the last build's CPU time
  int64_t views_generation_ TAU_GUARDED_BY(mu_) = 0;  // bumped at the end of every pass
  int64_t views_built_generation_ TAU_GUARDED_BY(mu_) = -1;
  int64_t views_built_ms_ TAU_GUARDED_BY(mu_) = 0;  // monotonic
  bool views_wanted_ TAU_GUARDED_BY(mu_) = false;
  // API writes posted, taken by passes, and included in the views built last: a caller reads its
  // own writes, whatever the views' age.
  int64_t writes_posted_ TAU_GUARDED_BY(mu_) = 0;
  int64_t writes_taken_ TAU_GUARDED_BY(mu_) = 0;
  int64_t views_built_writes_ TAU_GUARDED_BY(mu_) = 0;
  CondVar views_cv_;
  // Signalled when a pass has committed the writes it took (writes_taken_).
  CondVar committed_cv_;
  // Why the loop cannot commit (a full disk), while it waits to; empty otherwise.
  std::string commit_trouble_ TAU_GUARDED_BY(mu_);
  PlatformView platform_ TAU_GUARDED_BY(mu_);
  // ApplyPlatform returns once the loop decides with the new platform (and its queue view is
  // fresh).
  int64_t platform_generation_ TAU_GUARDED_BY(mu_) = 0;
  int64_t platform_in_use_ TAU_GUARDED_BY(mu_) = 0;
  CondVar platform_cv_;

  // Owned by the loop thread.
  std::map<std::string, ActiveRun> active_;
  QuotaBook quota_;
  std::shared_ptr<const policy::Platform> loop_platform_;
  int64_t loop_generation_ = 0;
  // What Start recovered but could not commit (a full disk): the first pass commits it before
  // anything else, waiting for space, while the API serves what the store holds.
  std::optional<store::Batch> recovered_;
};

}  // namespace tau::server
