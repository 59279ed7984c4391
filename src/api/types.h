// The replies of tau's REST API (v1) as types, shared by the server, which builds them, and the
// client, which reads them. The wire format is nlohmann's object order (keys sorted) and is pinned
// by tests/integration/test_api_golden.py.
//
// FromJson is strict about what it knows: a member that is missing or of the wrong type is
// InvalidArgument naming the member ("attempts[1].exit_code"). Members it does not know are kept
// in `extra` and written back by ToJson, so a reply read and written again is the same JSON, and
// `-o json` shows what a newer server sent.
//
// Times are the server's RFC 3339 text; quantities the Kubernetes text ("1Gi"). Open-ended parts
// (a run's spec and resources, an event's data, flavor assignments, the platform, the GPU monitor's
// snapshot) stay JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tau::api {

// Why a queued run waits (`pending` of a run, and of a queue's pending runs).
// A run just submitted has only position (null) and reason until the controller's next pass: its
// queue and code are absent then.
struct Pending {
  std::optional<int> position;  // 1-based place in its queue; null when it has none
  std::optional<std::string> queue;
  std::optional<std::string> code;    // WaitingForQuota, BackingOff, Kueue's reason, ...
  std::string reason;                 // in plain words
  std::optional<std::string> detail;  // the admission engine's own message, when it has one
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Pending> FromJson(const nlohmann::json& j);
};

// A run's place in an array (`tau run --array A-B[:S]`): the array's name (the runs' names are it
// and the index), the run's index, and the range.
struct RunArray {
  std::string name;
  int64_t index = 0;
  int64_t first = 0, last = 0, step = 1;
  std::optional<int64_t> max_parallel;  // at most this many of its runs in play at once
  nlohmann::json extra = nlohmann::json::object();

  std::string Range() const;  // "0-99", or "0-99:2" with a step, then "%N" with max_parallel
  nlohmann::json ToJson() const;
  static Result<RunArray> FromJson(const nlohmann::json& j);
};

// A run's place in a workflow (`tau run workflow.yaml`): the workflow's name, the run's stage, and
// the upstream runs it waits for, each with the condition it needs ("succeeded" or "finished").
struct WorkflowUpstream {
  std::string stage, run, condition;
  nlohmann::json extra = nlohmann::json::object();
};
struct RunWorkflow {
  std::string name, stage;
  std::vector<WorkflowUpstream> after;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<RunWorkflow> FromJson(const nlohmann::json& j);
};

struct Run {
  std::string name;
  std::string spec_name;
  std::string spec_file;
  std::string state;  // store::RunStateName
  std::string reason;
  std::string message;
  std::optional<int> exit_code;
  std::optional<int> signal;
  int attempts = 0;
  std::string workspace;
  std::string user;  // who submitted it
  std::string queue;
  int64_t priority = 0;
  std::vector<int> gpus;
  nlohmann::json resources = nlohmann::json::object();  // gpus, cpu_milli, memory_bytes, workers
  std::string config_hash;
  std::string snapshot_digest;
  bool cancel_requested = false;
  std::string created;
  std::optional<std::string> admitted, started, finished;
  std::string kind;
  std::string project, group;  // the spec's experiment.project and experiment.group; "" if none
  std::string backend;
  // Queued runs carry `pending`: null until a scheduling pass has seen the run.
  bool has_pending = false;
  std::optional<Pending> pending;
  std::optional<nlohmann::json> spec;   // the canonical spec, in the reply of one run only
  std::optional<RunArray> array;        // only for a run of an array
  std::optional<RunWorkflow> workflow;  // only for a run of a workflow's stage
  nlohmann::json extra = nlohmann::json::object();

  bool IsTerminal() const;  // Succeeded, Failed or Cancelled
  // resources.workers and resources.gpus, or their defaults (1 and 0) when absent.
  int Workers() const;
  int64_t Gpus() const;
  // The spec's runtime.image; "" without a spec or an image.
  std::string Image() const;

  nlohmann::json ToJson() const;
  static Result<Run> FromJson(const nlohmann::json& j);
};

// What the logs of a failed attempt say (recovery::Diagnose).
struct DiagnosisEvidence {
  std::string signature;
  int rank = 0;
  std::string line;
  nlohmann::json extra = nlohmann::json::object();
};
struct Diagnosis {
  std::string phase;
  std::string summary;
  std::vector<DiagnosisEvidence> evidence;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Diagnosis> FromJson(const nlohmann::json& j);  // {} is refused: no diagnosis
};

struct Attempt {
  int number = 0;
  std::string state;  // store::AttemptStateName
  std::vector<int> gpus;
  std::string started;
  std::optional<std::string> ended;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string outcome;
  std::string reason;  // the failure class
  std::string message;
  int64_t supervisor_pid = 0;
  std::optional<Diagnosis> diagnosis;  // {} on the wire when there is none
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Attempt> FromJson(const nlohmann::json& j);
};

// One entry of a run's hash-chained lifecycle.
struct Event {
  std::string time;
  std::string type;
  std::string message;
  nlohmann::json data = nlohmann::json::object();
  std::string hash;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Event> FromJson(const nlohmann::json& j);
};

// GET /api/v1/runs/NAME: the run (with its spec), its attempts and events.
struct RunDetail {
  Run run;
  std::vector<Attempt> attempts;
  std::vector<Event> events;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<RunDetail> FromJson(const nlohmann::json& j);
};

// GET /api/v1/runs.
struct RunList {
  std::vector<Run> runs;
  int64_t total = 0;
  int64_t limit = 0;
  int64_t offset = 0;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<RunList> FromJson(const nlohmann::json& j);
};

// POST /api/v1/runs and POST /api/v1/runs/NAME/rerun.
struct Submitted {
  Run run;
  std::optional<std::string> warning;  // rerun: what differs from the original
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Submitted> FromJson(const nlohmann::json& j);
};

// POST /api/v1/runs/batch: the runs, in the order of the request's items.
struct SubmittedBatch {
  std::vector<Run> runs;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<SubmittedBatch> FromJson(const nlohmann::json& j);
};

// A `run` event of GET /api/v1/events.
struct RunEvent {
  std::string name;
  std::string state;
  std::string reason;
  std::string message;
  std::string queue;
  std::string workspace;
  int attempts = 0;
  std::string updated;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<RunEvent> FromJson(const nlohmann::json& j);
};

// Quota of one flavor and resource in a queue or cohort. Cohorts have no `borrowed`.
struct Usage {
  std::string flavor;
  std::string resource;
  std::string nominal;
  std::string usage;
  std::optional<std::string> borrowed;
  nlohmann::json extra = nlohmann::json::object();
};

// A workspace's LocalQueue in a queue with admission fair sharing: its decayed usage orders the
// queue (the lowest goes first).
struct FairUsage {
  std::string workspace;
  std::optional<double> usage;  // null: weight 0, always last
  double weight = 1;
  nlohmann::json consumed = nlohmann::json::object();  // resource -> decayed usage, in units
  nlohmann::json held = nlohmann::json::object();      // resource -> held now, in units
  nlohmann::json extra = nlohmann::json::object();
};

// A run of a workspace the caller may not read is `hidden`: only its place (position, priority,
// state) is sent, and the other members keep their defaults here.
struct AdmittedRun {
  bool hidden = false;
  std::string name;
  std::string workspace;
  std::string state;
  int64_t priority = 0;
  nlohmann::json flavors;  // pod set -> resource -> flavor
  nlohmann::json extra = nlohmann::json::object();
};
struct PendingRun {
  bool hidden = false;
  std::string name;
  std::string workspace;
  int64_t priority = 0;
  Pending pending;  // hidden: its position only
};

struct Queue {
  std::string name;
  std::string cohort;  // "" when none
  std::string queueing_strategy;
  std::vector<Usage> usage;
  int64_t admitted = 0;  // runs holding quota
  int64_t pending = 0;   // runs waiting
  std::vector<AdmittedRun> admitted_runs;
  std::vector<PendingRun> pending_runs;
  std::vector<FairUsage> fair_usage;  // admission fair sharing only, lowest usage first
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Queue> FromJson(const nlohmann::json& j);
};

struct Cohort {
  std::string name;
  std::vector<Usage> usage;
  nlohmann::json extra = nlohmann::json::object();
};

// A run whose queue the platform no longer has.
struct UnqueuedRun {
  std::string name;
  std::string why;
  nlohmann::json extra = nlohmann::json::object();
};

// GET /api/v1/queues (and the `queues` event of GET /api/v1/events).
struct Queues {
  std::vector<Queue> queues;
  std::vector<Cohort> cohorts;
  std::vector<UnqueuedRun> unqueued_runs;  // admins only; empty for others
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Queues> FromJson(const nlohmann::json& j);
};

// GET /api/v1/queues/NAME.
struct QueueReply {
  Queue queue;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<QueueReply> FromJson(const nlohmann::json& j);
};

// GET /api/v1/capacity: the machine as of the controller's last pass.
struct Capacity {
  int64_t gpus_total = 0;
  int64_t gpus_free = 0;
  int64_t gpus_unplaceable = 0;  // kept out by health checks
  int64_t cpu_milli_total = 0;
  int64_t cpu_milli_free = 0;
  int64_t memory_bytes_total = 0;
  int64_t memory_bytes_free = 0;
  int64_t queued = 0;
  int64_t active = 0;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Capacity> FromJson(const nlohmann::json& j);
};

// GET /api/v1/version.
struct Version {
  std::string version;
  std::string api;
  std::string backend;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Version> FromJson(const nlohmann::json& j);
};

// POST /api/v1/code/missing: the digest of a manifest's snapshot, whether the server stores it,
// and the sha256 of each blob it lacks (none when the snapshot is stored).
struct CodeMissing {
  std::string digest;
  bool stored = false;
  std::vector<std::string> missing;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<CodeMissing> FromJson(const nlohmann::json& j);
};

// GET /api/v1/runs/NAME/artifacts: the run's checkpoints and outputs, a page of them.
struct ArtifactEntry {
  std::string path;  // "checkpoint/REL" or "output/REL": what GET .../artifacts/file?path= takes
  std::string kind;  // "checkpoint" or "output"
  int64_t size = 0;
  std::optional<std::string> sha256;  // null: not computed (ask with ?digest=1)
  std::string modified;               // RFC 3339
  nlohmann::json extra = nlohmann::json::object();
};
struct ArtifactList {
  std::string run;
  std::vector<ArtifactEntry> artifacts;
  int64_t total = 0;  // files listed over every page
  int64_t offset = 0;
  int64_t limit = 0;
  // The walk stopped at `max_listed` files of a directory: more are there, not listed.
  bool truncated = false;
  int64_t max_listed = 0;
  int64_t undigested = 0;  // files of this page without a digest (not asked, or past the budget)
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<ArtifactList> FromJson(const nlohmann::json& j);
};

// GET /api/v1/services/NAME (and each of GET /api/v1/services): a service (docs/serving.md) with
// its replicas as the service manager sees them now.
struct ServiceReplica {
  std::string run;    // the replica's run
  std::string state;  // the run's state (Queued, Admitted, Running, ...)
  int64_t revision = 0;
  int64_t port = 0;
  bool ready = false;     // passes its readiness probe: requests go to it
  bool draining = false;  // being removed: no new requests, stopped once idle
  int64_t restarts = 0;   // attempts after its first
  std::string probe;      // why its last probe failed ("" when it passed or none ran yet)
  std::string reason;     // its run's reason (the last failure class)
  nlohmann::json extra = nlohmann::json::object();
};
struct Service {
  std::string name, workspace, owner;
  std::string state;     // Active, Deleting
  int64_t replicas = 0;  // wanted
  int64_t ready = 0;     // replicas ready now
  int64_t revision = 0;  // bumped by each update
  std::string endpoint;  // "/serve/NAME/" on the server's sockets
  std::string spec_file, config_hash, snapshot_digest;
  // The model it serves: {"run", "kind" (checkpoint|output), "path", "sha256"}; null when none.
  nlohmann::json model;
  nlohmann::json serve;                      // the spec's serve section (spec::ServeJson)
  std::vector<ServiceReplica> replica_list;  // "replica_list"
  int64_t restarts = 0;                      // of every replica it has had
  // Requests through the endpoint since the server started: {"total", "failed", "retried"}.
  nlohmann::json requests = nlohmann::json::object();
  nlohmann::json history = nlohmann::json::array();  // [{"time", "type", "message"}], oldest first
  std::string created, updated;                      // RFC 3339
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Service> FromJson(const nlohmann::json& j);
};
// GET /api/v1/services: the services the caller may see.
struct ServiceList {
  std::vector<Service> services;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<ServiceList> FromJson(const nlohmann::json& j);
};

// GET /api/v1/whoami: who the server thinks the caller is, and their roles.
struct WorkspaceRole {
  std::string name;
  std::string role;  // viewer, researcher or admin
  nlohmann::json extra = nlohmann::json::object();
};
struct Whoami {
  std::string user;
  std::vector<std::string> groups;
  std::string via;       // unix, token, ...
  std::string token_id;  // "" unless signed in with a token
  bool admin = false;
  bool platform_viewer = false;
  std::vector<WorkspaceRole> workspaces;  // those the caller has a role in
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Whoami> FromJson(const nlohmann::json& j);
};

// An API token as POST and GET /api/v1/tokens show it: never the token itself, except in the
// reply that created it.
struct Token {
  std::string id;
  std::string user;
  std::vector<std::string> groups;
  std::string description;
  std::string created_by;
  std::string created;
  std::optional<std::string> expires, revoked;  // null: never, not yet
  std::optional<std::string> token;             // POST only: shown this once
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Token> FromJson(const nlohmann::json& j);
};

// GET /api/v1/tokens.
struct TokenList {
  std::vector<Token> tokens;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<TokenList> FromJson(const nlohmann::json& j);
};

// GET /api/v1/audit: denials and policy changes, newest first.
struct AuditRecord {
  std::string time;
  std::string user;  // "" when the caller was not signed in
  std::string via;
  std::string method;
  std::string path;
  int status = 0;  // the HTTP status answered
  std::string action;
  std::string detail;
  nlohmann::json extra = nlohmann::json::object();
};
struct AuditList {
  std::vector<AuditRecord> audit;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<AuditList> FromJson(const nlohmann::json& j);
};

// GET /api/v1/workspaces/WS/secrets: the keys of a workspace's secrets, never their values.
struct SecretInfo {
  std::string key;
  int64_t size = 0;  // bytes
  std::string updated;
  std::string updated_by;
  nlohmann::json extra = nlohmann::json::object();
};
struct SecretList {
  std::string workspace;
  std::vector<SecretInfo> secrets;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<SecretList> FromJson(const nlohmann::json& j);
};

// GET /api/v1/platform: the policy in force and where it came from.
struct PlatformView {
  std::string source;  // the applied file, or "default"
  std::string applied;
  nlohmann::json platform = nlohmann::json::object();  // policy::ToJson's form
  std::string text;  // as a platform file (what was applied): `tau platform validate` takes it
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<PlatformView> FromJson(const nlohmann::json& j);
};

// A GPU's health verdict (health::GpuVerdict) and the conditions behind it.
struct HealthReason {
  std::string check;
  std::string status;  // warn, fail, error
  std::string action;
  std::string clear;
  std::string message;
  std::string threshold;
  std::string source;
  std::string first_seen, last_seen;  // "" when never
  int count = 0;
  nlohmann::json extra = nlohmann::json::object();
};
struct XidSeen {
  int64_t xid = 0;
  std::string at;
  nlohmann::json extra = nlohmann::json::object();
};
struct GpuHealth {
  int gpu = 0;
  std::string verdict;  // Healthy, Degraded, Unhealthy, Unknown
  bool placeable = false;
  std::string since;                  // "" when never observed
  std::vector<HealthReason> reasons;  // active conditions, worst first
  std::vector<HealthReason> pending;  // failing but not yet debounced
  std::vector<XidSeen> recent_application_xids;
  nlohmann::json extra = nlohmann::json::object();
};

// The GPUs NVML found (health::GpuInventory).
struct GpuDevice {
  int index = 0;
  std::string uuid;
  std::string name;
  int64_t memory_total_bytes = 0;
  std::string pci_bus_id;
  std::optional<int> minor_number;               // absent when unknown
  std::optional<bool> mig_enabled, mig_pending;  // null without MIG support
  std::optional<GpuHealth> health;               // GET /api/v1/gpus, when verdicts are known
  nlohmann::json extra = nlohmann::json::object();
};
struct GpuInventory {
  std::vector<GpuDevice> devices;
  bool driver_loaded = false;
  std::string driver_version;
  std::string cuda_driver_version;
  std::string nvml_version;
  std::string library;
  std::string note;   // why there are no GPUs, when there are none
  std::string error;  // the driver is there but unusable: a failed health check ("" when fine)
  nlohmann::json extra = nlohmann::json::object();
};

// GET /api/v1/gpus: the inventory's members, each device with its verdict, and the monitor's
// whole snapshot (health::ToJson(HealthSnapshot): samples and all).
struct Gpus {
  GpuInventory inventory;  // its `extra`: the reply's members unknown here
  nlohmann::json snapshot = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<Gpus> FromJson(const nlohmann::json& j);
};

// The active probe of one GPU (health::RunActiveProbe).
struct ProbeResult {
  int cuda_ordinal = 0;
  bool passed = false;
  std::optional<std::string> name;   // absent when the device could not be opened
  std::optional<std::string> error;  // the first failing step
  double ms = 0;
  nlohmann::json extra = nlohmann::json::object();
};
struct ActiveProbe {
  bool ran = false;
  std::optional<std::string> note;  // why it did not run
  bool has_gpus = true;             // false: the probe process itself failed
  std::vector<ProbeResult> gpus;
  nlohmann::json extra = nlohmann::json::object();
};

// POST /api/v1/health/check[?active=1]: the passive checks run now, and the active probe.
struct HealthCheck {
  std::vector<GpuHealth> gpus;
  GpuInventory inventory;
  std::optional<ActiveProbe> active;  // with active=1 only
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json ToJson() const;
  static Result<HealthCheck> FromJson(const nlohmann::json& j);
};

}  // namespace tau::api
