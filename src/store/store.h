// The store: tau's durable state in SQLite (WAL, synchronous=FULL), the only code that touches the
// database. Every state change is committed here before the server acts on it; a batch of changes
// commits as one transaction, so a crash leaves either all of it or none.
//
// Tables: runs (one row per run), attempts (one per attempt of a run), events (the per-run
// lifecycle log, append-only and hash-chained: each event's hash covers the previous event's hash).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tau::store {

// Lifecycle states of a run. Terminal: Succeeded, Failed, Cancelled.
enum class RunState { kQueued, kAdmitted, kRunning, kSucceeded, kFailed, kCancelled };
const char* RunStateName(RunState state);
Result<RunState> ParseRunState(std::string_view name);
bool IsTerminal(RunState state);

struct RunRecord {
  std::string name;  // unique: spec name + "-" + suffix
  int64_t seq = 0;   // submission order, assigned by InsertRun
  std::string spec_name;
  std::string spec_file;     // the file name as the user gave it (for messages)
  std::string spec_yaml;     // the spec as written
  nlohmann::json spec_json;  // canonical spec (spec::ToJson)
  std::string config_hash;
  std::string snapshot_digest;
  std::string snapshot_dir;
  std::string workspace, queue;
  int priority = 0;
  nlohmann::json resources;  // {"gpus": n, "cpu_milli": n, "memory_bytes": n, "workers": n}
  RunState state = RunState::kQueued;
  std::string reason;   // failure class or short reason ("UserError", "Cancelled", ...)
  std::string message;  // human-readable detail
  std::optional<int> exit_code;
  std::optional<int> signal;
  int attempts = 0;
  std::vector<int> gpus;  // GPUs held while admitted/running
  bool cancel_requested = false;
  int64_t created_ms = 0, updated_ms = 0;
  std::optional<int64_t> admitted_ms, started_ms, finished_ms;
  std::optional<int64_t> not_before_ms;  // a retry waits in the queue until then (its backoff)
  std::string owner;                     // the user who submitted it
  // The resolved settings with provenance (policy::ResolvedRun as JSON), fixed at submission.
  nlohmann::json resolved = nlohmann::json::object();
  // While it holds quota: the flavors the admission engine assigned, {podset: {resource: flavor}}.
  nlohmann::json flavors = nlohmann::json::object();
  int preemptions = 0;  // times it was preempted (these do not use up resilience.max_retries)
  // The idempotency key its submission carried ("" when none): a submission of the same owner
  // with the same key is the same run (unique per owner).
  std::string submit_key;
  // The system user its processes run as, decided at submission: "" for the server's own user;
  // unset for a run recorded before tau decided it then (the backend decides as it did).
  std::optional<std::string> run_as;
  // Its place in an array (`tau run --array`): {"name", "index", "first", "last", "step"}; null
  // for a run of its own.
  nlohmann::json array;
  // Its place in a workflow (`tau run workflow.yaml`): {"name", "stage", "after": [{"stage",
  // "run", "condition"}]} (the upstream runs it waits for, and whether they must have
  // "succeeded" or only "finished"); null for a run of its own.
  nlohmann::json workflow;
  // A service's replica (`tau serve deploy`): {"name", "revision", "port"}; null for a run.
  nlohmann::json service;
  // The spec's workload kind ("job", "rayjob"), a column of its own so that list pages need not
  // parse the spec.
  std::string kind;
  // The spec's experiment.project and experiment.group (filled from spec_json when empty),
  // columns of their own so that lists filter on them without parsing specs.
  std::string project, group;
  // When retention pruned the run's logs and its GPU samples (unset until then). Written by
  // MarkPruned only, never by a commit.
  std::optional<int64_t> logs_pruned_ms, samples_pruned_ms;
};

// A service (`tau serve deploy`): the columns lists read, and the rest as the service manager
// keeps it (`doc`: its spec, code, replicas, revision, model, history).
struct ServiceRecord {
  std::string name;
  std::string workspace, owner;
  std::string state;  // "Active" | "Deleting"
  int64_t created_ms = 0, updated_ms = 0;
  nlohmann::json doc = nlohmann::json::object();
};

// A system user of a workspace's pool given to one token user (Store::AssignRunUser).
struct RunUserRecord {
  std::string system_user, workspace, user;
  int64_t assigned_ms = 0;
};

enum class AttemptState { kStarting, kRunning, kFinished };
const char* AttemptStateName(AttemptState state);

struct AttemptRecord {
  std::string run;
  int number = 1;
  AttemptState state = AttemptState::kStarting;
  std::string dir;
  int shim_pid = 0;
  uint64_t shim_start_time = 0;
  std::vector<int> gpus;
  int64_t started_ms = 0;
  std::optional<int64_t> ended_ms;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string outcome;  // runtime::OutcomeKind name when finished
  std::string reason;   // failure class
  std::string message;
  nlohmann::json diagnosis = nlohmann::json::object();  // {"summary", "phase", "evidence": [...]}
};

// Webhooks (docs/webhooks.md): one POST of one event to one receiver, kept in the store's outbox
// until the receiver takes it.
struct Delivery {
  int64_t id = 0;  // assigned by the store; the order of a URL's deliveries
  std::string workspace, url;
  std::string secret;  // the name of the workspace secret that signs it
  int64_t event_id = 0;
  std::string body;  // the JSON sent
  int attempts = 0;  // tries that failed so far
  int64_t created_ms = 0, next_ms = 0;
  std::string last_error;
};

// A time a run held quota (admission to release: its Metered event), with its run's scope: the
// budgets' metering (Store::ListUsage).
struct UsageRecord {
  std::string run;
  int attempt = 1;
  std::string workspace, owner, queue;
  int64_t gpus = 0, cpu_milli = 0;  // what the run holds while admitted (runs.resources)
  int64_t memory_bytes = 0;         // 0 in Metered events older than the field
  // GPU time its samples saw, and of it idle (the Metered event's; 0 where none were taken).
  double sampled_gpu_hours = 0, idle_gpu_hours = 0;
  nlohmann::json flavors = nlohmann::json::object();  // pod set -> resource -> flavor
  int64_t started_ms = 0;
  std::optional<int64_t> ended_ms;  // unset while it runs
};

struct Event {
  int64_t id = 0;  // assigned by the store
  std::string run;
  int64_t ts_ms = 0;
  std::string type;  // Submitted, Queued, Admitted, Running, Succeeded, Failed, Cancelled, ...
  std::string message;
  nlohmann::json data = nlohmann::json::object();
  std::string prev_hash, hash;  // assigned by the store
};

// An event with its run's scope, which routes it to the workspace's webhooks and the run's own.
struct EventInScope {
  Event event;
  std::string workspace, owner;
  // The run's own receivers: its canonical spec's policy.webhooks (spec::ToJson), an array; empty
  // when it has none.
  nlohmann::json run_webhooks = nlohmann::json::array();
};

// What a commit changes of a run that exists: how far it got. What it was submitted with (spec,
// code snapshot, workspace, queue, priority, owner, resolution, resources) is written once, by
// InsertRun, and never again: a commit neither copies nor rewrites it.
struct RunProgress {
  RunProgress(const RunRecord& r)  // NOLINT(google-explicit-constructor): batch.runs.push_back(r)
      : name(r.name),
        state(r.state),
        reason(r.reason),
        message(r.message),
        exit_code(r.exit_code),
        signal(r.signal),
        attempts(r.attempts),
        gpus(r.gpus),
        cancel_requested(r.cancel_requested),
        updated_ms(r.updated_ms),
        admitted_ms(r.admitted_ms),
        started_ms(r.started_ms),
        finished_ms(r.finished_ms),
        not_before_ms(r.not_before_ms),
        flavors(r.flavors),
        preemptions(r.preemptions) {}
  std::string name;
  RunState state;
  std::string reason, message;
  std::optional<int> exit_code, signal;
  int attempts;
  std::vector<int> gpus;
  bool cancel_requested;
  int64_t updated_ms;
  std::optional<int64_t> admitted_ms, started_ms, finished_ms, not_before_ms;
  nlohmann::json flavors;
  int preemptions;
};

// Changes committed together in one transaction.
struct Batch {
  std::vector<RunProgress> runs;        // updated; NotFound for a run that does not exist
  std::vector<AttemptRecord> attempts;  // upserted
  std::vector<Event> events;            // appended, in order
  // False: committed without an fsync of its own, durable with the next commit that has one (WAL
  // frames reach the disk in order). Only for changes nothing is done on and no caller is told of
  // before that (a started attempt's pid: a restart finds a live supervisor by its lock anyway).
  bool sync = true;
  bool empty() const { return runs.empty() && attempts.empty() && events.empty(); }
};

struct RunFilter {
  std::optional<RunState> state;
  bool active_only = false;  // non-terminal runs
  std::string workspace;
  // When set, only runs of these workspaces (what the caller may see).
  std::optional<std::vector<std::string>> workspaces_in;
  std::string queue;
  std::string owner;           // the user who submitted them
  std::string project, group;  // the spec's experiment.project / experiment.group; "": any
  std::string workflow;        // only the runs of this workflow; "": any
  std::string service;         // only the replicas of this service; "": any
  int64_t limit = 0;           // 0 = no limit
  int64_t offset = 0;
  bool newest_first = true;
  // Rows for a list page: spec_yaml, spec_json, resolved and flavors are left empty (neither read
  // nor parsed); everything else, `kind` included, is filled from the row's typed columns.
  bool summary = false;
};

// What retention prunes of an ended run.
enum class PruneKind { kLogs, kGpuSamples };

// An ended run whose files retention may prune, and where a walk of the due list stands: the list
// is ordered by (finished_ms, seq), so the last one handled is where the next page starts.
struct RetentionDue {
  std::string name;
  int64_t finished_ms = 0;
  int64_t seq = 0;
};

struct RunCount {
  std::string state, workspace;
  int64_t runs = 0;
};

// An API token. Only its SHA-256 digest is kept; the token itself is shown once, at creation.
struct TokenRecord {
  std::string id;      // the digest's first 12 characters: safe to show and log
  std::string digest;  // SHA-256 hex of the token
  std::string user;
  std::vector<std::string> groups;
  std::string description;
  std::string created_by;
  int64_t created_ms = 0;
  std::optional<int64_t> expires_ms;
  std::optional<int64_t> revoked_ms;
};

// One audited decision: a denied request, or a change only some may make (policy, tokens,
// secrets).
struct AuditRecord {
  int64_t id = 0;
  int64_t ts_ms = 0;
  std::string user;  // "" anonymous
  std::string via;   // "unix", "token", ""
  std::string method, path;
  int status = 0;      // the HTTP status answered
  std::string action;  // "denied", "platform.apply", "token.create", ...
  std::string detail;
};

// A workspace secret's description; values are read only to start runs.
struct SecretInfo {
  std::string workspace, key;
  int64_t size = 0;
  int64_t updated_ms = 0;
  std::string updated_by;
};

class Store {
 public:
  // For tests of migrations: creates the database at `path` with the schema of `version` (an
  // older tau's store) and nothing else.
  static Status CreateSchemaForTest(const std::string& path, int64_t version);

  // Opens (creating when missing) the database at `path` and migrates its schema.
  static Result<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts a new run (assigning seq) with its first events; AlreadyExists when the name is taken.
  // Returns once the run is durable. Inserts from threads that call at the same time share a
  // transaction (group commit: one fsync for them all), each with its own outcome.
  Status InsertRun(RunRecord* run, std::vector<Event> events);
  // A batch's runs, each with its events (`events[i]` are `(*runs)[i]`'s): all of them or none
  // (AlreadyExists when a name is taken, naming it), in one transaction shared with the inserts
  // of other threads like InsertRun's, so one fsync. Returns once they are durable.
  Status InsertRuns(std::vector<RunRecord>* runs, std::vector<std::vector<Event>> events);
  // All or nothing. Unavailable when the disk is full (nothing is written; the same batch may be
  // committed again once there is space).
  Status Commit(const Batch& batch);
  // Write transactions committed since Open (each one fsync), for tests and benchmarks.
  int64_t TransactionsCommitted();

  Result<RunRecord> GetRun(const std::string& name);
  // The run `owner` submitted with idempotency key `key`; NotFound when there is none.
  Result<RunRecord> FindRunBySubmitKey(const std::string& owner, const std::string& key);
  Result<std::vector<RunRecord>> ListRuns(const RunFilter& filter);
  Result<int64_t> CountRuns(const RunFilter& filter);
  // Runs per (state, workspace), for metrics.
  Result<std::vector<RunCount>> CountRunsByStateAndWorkspace();
  Result<std::vector<AttemptRecord>> ListAttempts(const std::string& run);
  Result<std::vector<Event>> ListEvents(const std::string& run);

  // Retention's queue: ended runs whose `kind` is not pruned yet, finished at or before
  // `cutoff_ms`, oldest first, after `after` (the last one of the previous page; nullopt for the
  // first page), at most `limit`. Read from a partial index of exactly those runs: what has been
  // pruned, or is not due, is never read.
  Result<std::vector<RetentionDue>> ListRetentionDue(PruneKind kind, int64_t cutoff_ms,
                                                     const std::optional<RetentionDue>& after,
                                                     int64_t limit);
  // Records that `kind` of these runs was pruned at `pruned_ms` (one transaction); they leave the
  // due list. A run already marked keeps its first time.
  Status MarkPruned(PruneKind kind, const std::vector<std::string>& runs, int64_t pruned_ms);

  // Services: written whole, each write its own durable transaction. `create`: AlreadyExists
  // when the name is taken; else NotFound when it is not.
  Status PutService(const ServiceRecord& service, bool create);
  Result<ServiceRecord> GetService(const std::string& name);  // NotFound
  Result<std::vector<ServiceRecord>> ListServices();          // by name
  // The times runs held quota that ended at `since_ms` or later (their Metered events), by end.
  Result<std::vector<UsageRecord>> ListUsage(int64_t since_ms);
  Status DeleteService(const std::string& name);  // NotFound

  // Webhooks' outbox. The events after `after_id`, by id, at most `limit`, with their runs' scope.
  Result<std::vector<EventInScope>> ListEventsAfter(int64_t after_id, int64_t limit);
  // The last event routed to the outbox (at first, the newest event when the store learnt
  // webhooks).
  Result<int64_t> DeliveryCursor();
  // Adds deliveries and moves the cursor to `cursor`, in one transaction. A URL with more than
  // `max_per_url` waiting loses its oldest; `dropped` says how many.
  Status QueueDeliveries(const std::vector<Delivery>& add, int64_t cursor, int64_t max_per_url,
                         int64_t* dropped);
  // The oldest waiting delivery of each URL, where it is due at `now_ms`, by id.
  Result<std::vector<Delivery>> DueDeliveries(int64_t now_ms);
  Status DeleteDelivery(int64_t id);
  Status PostponeDelivery(int64_t id, int attempts, int64_t next_ms, const std::string& error);
  Result<int64_t> CountDeliveries();

  // Identity: tokens, the audit trail and workspace secrets.
  Status InsertToken(const TokenRecord& token);  // AlreadyExists on a repeated digest
  // The same, unless `token.user` already has `max_live` live tokens at `now_ms` (counted and
  // inserted under one lock, so that tokens created at once cannot pass it): ResourceExhausted.
  Status InsertToken(const TokenRecord& token, int64_t max_live, int64_t now_ms);
  Result<TokenRecord> FindToken(const std::string& digest);              // NotFound
  Result<std::vector<TokenRecord>> ListTokens(const std::string& user);  // "" for all users
  Status RevokeToken(const std::string& id, int64_t now_ms);             // NotFound
  Status AppendAudit(const AuditRecord& record);
  Result<std::vector<AuditRecord>> ListAudit(int64_t limit);  // newest first
  Status PutSecret(const SecretInfo& info, const std::string& value);
  Status DeleteSecret(const std::string& workspace, const std::string& key);  // NotFound
  Result<std::vector<SecretInfo>> ListSecrets(const std::string& workspace);
  Result<std::map<std::string, std::string>> SecretValues(const std::string& workspace);

  // Code blobs as capabilities (docs/security.md, "Code blobs"). `owner` uploaded blob `sha256`
  // of `size` bytes (its bytes proved they have it); a repeat keeps the first row.
  Status AddBlobOwner(const std::string& owner, const std::string& sha256, int64_t size,
                      int64_t now_ms);
  // Whether `owner` uploaded blob `sha256`.
  Result<bool> OwnsBlob(const std::string& owner, const std::string& sha256);
  // Snapshot `snapshot` is made of `blobs` (recorded once; later calls for it change nothing).
  Status AddSnapshotBlobs(const std::string& snapshot, const std::vector<std::string>& blobs);
  // Of `blobs`, those `owner` uploaded or that the snapshot of a run in one of `workspaces`
  // (nullopt: any workspace) is made of.
  Result<std::set<std::string>> UsableBlobs(
      const std::string& owner, const std::optional<std::vector<std::string>>& workspaces,
      const std::vector<std::string>& blobs);
  // Whether a run in one of `workspaces` (nullopt: any) uses snapshot `snapshot`.
  Result<bool> SnapshotUsedIn(const std::string& snapshot,
                              const std::optional<std::vector<std::string>>& workspaces);
  // The bytes of the blobs `owner` uploaded that no run's snapshot is made of yet.
  Result<int64_t> UnreferencedBlobBytes(const std::string& owner);
  // Blobs the store of files removed: nobody owns them any more.
  Status ForgetBlobs(const std::vector<std::string>& blobs);
  // The live tokens (not revoked, not expired at `now_ms`) of `user`.
  Result<int64_t> CountLiveTokens(const std::string& user, int64_t now_ms);

  // The system user `user`'s runs in `workspace` run as: of those they were given before, the
  // newest that is in `keep` or `pool`; else the first of `pool` never given to anyone (recorded
  // in the same transaction, so two submissions at once never get the same one).
  // ResourceExhausted when all are taken. `keep` names accounts they may go on using though the
  // pool no longer lists them (they still exist: once given, an account is never another's, so
  // a second one would only take a pool account from someone else).
  Result<std::string> AssignRunUser(const std::string& workspace, const std::string& user,
                                    const std::vector<std::string>& keep,
                                    const std::vector<std::string>& pool, int64_t now_ms);
  // Every assignment, by system user; or those of one token user in one workspace, newest first.
  Result<std::vector<RunUserRecord>> ListRunUsers();
  Result<std::vector<RunUserRecord>> RunUsersOf(const std::string& workspace,
                                                const std::string& user);

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  Status InsertRuns(RunRecord* runs, std::vector<Event>* events, size_t count);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tau::store
