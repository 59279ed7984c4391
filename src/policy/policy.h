// Platform policy: platform.yaml, owned by the platform team, and the resolution of a run's
// effective settings against it. Pure code: no I/O beyond the text it is given.
//
// What it offers:
//   * Platform, the model of platform.yaml: the admission configuration (flavors, cohorts,
//     queues, fair sharing, the same keys as `tau admission simulate`), priority classes,
//     workspaces, compute profiles, storage volumes and platform-wide defaults;
//   * ParsePlatform: strict parsing with every error at once, as file:line:col diagnostics with
//     "did you mean" hints, cross-references checked;
//   * DefaultPlatform: the single-queue platform a server uses when it has no platform file;
//   * ToAdmissionConfig (for admission::Engine) and ToJson (for `tau platform show`);
//   * Resolve: a RunSpec plus the caller's identity -> ResolvedRun, every value with where it came
//     from (spec > compute profile > workspace default > platform default, capped by workspace
//     limits), and ExplainText to print that for `tau explain`.
// docs/platform.md is the reference of the file format and of the resolution rules.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/admission.h"
#include "common/quantity.h"
#include "common/status.h"
#include "spec/spec.h"

namespace tau::policy {

// Same shape and rendering as the spec's: "platform.yaml:7:3: error: message".
using Diagnostic = spec::Diagnostic;

// Kubernetes resource names tau requests for a run.
inline constexpr const char* kCpuResource = "cpu";
inline constexpr const char* kMemoryResource = "memory";
inline constexpr const char* kGpuResource = "nvidia.com/gpu";
// The flavor node label that names a flavor's GPU class (the spec's policy.gpu_class values), by
// default; a platform may choose TauGrid's keys instead (NodeLabels).
inline constexpr const char* kGpuClassLabel = "tau.dev/gpu-class";
inline constexpr const char* kGpuSeriesLabel = "tau.dev/gpu-series";
// TauGrid's keys (`node_labels: taugrid` in platform.yaml).
inline constexpr const char* kTauGridGpuClassLabel = "tau.azure.com/gpu-class";
inline constexpr const char* kTauGridGpuSeriesLabel = "kueue.azure.com/gpu-series";

// The node-label keys a platform's flavors, run selectors and workload labels use for a GPU's
// class and series.
struct NodeLabels {
  std::string gpu_class = kGpuClassLabel;
  std::string gpu_series = kGpuSeriesLabel;
};
// A member entry that admits every user.
inline constexpr const char* kEveryone = "*";

// Limits parsed files are held to.
inline constexpr size_t kMaxPlatformBytes = 1 << 20;

// A named priority, like Kueue's WorkloadPriorityClass.
struct PriorityClass {
  std::string name;
  int32_t value = 0;
  std::string description;
};

// Guardrails over a running run's GPU time (docs/budgets.md, "Idle and stalled runs"): a run whose
// GPUs all stay under `gpu_util_below_pct` is warned after `warn_after_ms`, and stopped as Idle
// after `stop_after_ms` when set.
struct IdleLimit {
  int gpu_util_below_pct = 5;
  int64_t warn_after_ms = 0;
  std::optional<int64_t> stop_after_ms;
};
// A run whose logs and metrics have not grown for `after_ms` is marked Stalled (its Python workers
// dump their stacks into their logs first), and stopped as Stalled after `stop_after_ms` when set.
struct StallLimit {
  int64_t after_ms = 0;
  std::optional<int64_t> stop_after_ms;
};

// A receiver of a workspace's run events: each event of the kinds it takes is POSTed to `url`
// as JSON, signed with HMAC-SHA256 under the workspace secret named `secret` (docs/webhooks.md).
struct Webhook {
  std::string url;                  // http:// or https://
  std::string secret;               // the name of a secret of the workspace (tau secret set)
  std::vector<std::string> events;  // kinds (spec::WebhookEventKinds; all when not given)
  int line = 0, column = 0;         // where the platform file gives it
};

struct WorkspaceLimits {
  std::optional<int> max_gpus_per_run;    // GPUs per worker x workers
  std::optional<int64_t> max_runtime_ms;  // caps run.max_runtime
  std::optional<int> max_workers;
  // What one run may make the server keep; unset: the platform defaults below.
  std::optional<int64_t> max_log_bytes;      // all its workers' logs together, per attempt
  std::optional<int64_t> max_metric_points;  // over all its attempts
  std::optional<int64_t> max_metric_series;  // distinct metric names (with their tags)
  std::optional<IdleLimit> idle;
  std::optional<StallLimit> stall;
};

// The limits a run gets when its workspace sets none: generous for a training run, small enough
// that one run cannot fill the disk or the server's memory.
constexpr int64_t kDefaultMaxLogBytes = int64_t{1} << 30;  // 1 GiB
constexpr int64_t kDefaultMaxMetricPoints = 5'000'000;
constexpr int64_t kDefaultMaxMetricSeries = 1'000;

struct Workspace {
  std::string name;
  std::string description;
  // Researchers: may submit runs here and see and cancel the workspace's runs. User names,
  // "group:NAME" for every member of a group, or "*" for everyone.
  std::vector<std::string> members;
  // Read-only: may see the workspace's runs, logs and evidence. Same syntax as members.
  std::vector<std::string> viewers;
  // Defaults for runs that do not say; "" when not set.
  std::string default_queue;
  std::string default_priority;
  std::string default_profile;
  std::string default_output;               // storage volume for storage.output
  std::string default_checkpoint;           // storage volume for storage.checkpoint
  std::vector<std::string> allowed_images;  // glob patterns ('*', '?'); empty: any image
  WorkspaceLimits limits;
  std::vector<std::string> storage;  // the storage volumes its runs may use
  // System users the runs of its token users without a system account run as, one user each
  // (assigned on first submission and kept); a name is in one workspace's pool at most.
  std::vector<std::string> run_users;
  // TauGrid's policy.lane: lane name -> the queue its runs go to.
  std::map<std::string, std::string> lanes;
  // Where the workspace's runs' events are posted, signed (docs/webhooks.md).
  std::vector<struct Webhook> webhooks;
  // The URLs a run's own webhooks (its spec's policy.webhooks) may post to: URL patterns
  // (UrlMatches); empty: none.
  std::vector<std::string> allowed_webhooks;
  // Its LocalQueues' weight under admission fair sharing (usage is divided by it); 0: always last.
  double fair_sharing_weight = 1.0;
};

// A run's idle and stall limits: its workspace's (which may be null), tightened by its spec's
// policy.guardrails: the lower threshold of time, the higher of utilisation; a stop never before
// the warning. nullopt: none.
std::optional<IdleLimit> EffectiveIdle(const Workspace* workspace, const spec::Policy& spec);
std::optional<StallLimit> EffectiveStall(const Workspace* workspace, const spec::Policy& spec);

// The LocalQueue a workspace's runs of a queue are in (admission fair sharing's unit of usage):
// "workspace/queue", as Kueue keys the LocalQueue named as its ClusterQueue in the workspace's
// namespace.
std::string LocalQueueName(const std::string& workspace, const std::string& queue);

// A named run shape. Unset fields leave the run's own (or the platform's default) value.
struct ComputeProfile {
  std::string name;
  std::string description;
  std::optional<int> gpus;  // per worker
  std::optional<Quantity> cpus;
  std::optional<Quantity> memory;
  std::string flavor;     // pins the run to this flavor; "" any
  std::string gpu_class;  // a flavor label value (kGpuClassLabel); "" any
};

// A durable volume: a host directory on the local backend, a PVC on Kubernetes (a platform file
// used with both backends gives both).
struct StorageVolume {
  std::string name;
  std::string host_path;   // absolute; "" when the volume exists only on Kubernetes
  std::string pvc;         // PersistentVolumeClaim name; "" when only local
  std::string mount_path;  // absolute path inside the run
  bool read_only = false;
};

// Platform-wide defaults, the last step of resolution; each may be unset.
struct Defaults {
  std::string workspace;
  std::string queue;
  std::string priority;
  std::optional<Quantity> cpus;    // per worker
  std::optional<Quantity> memory;  // per worker
};

// Who is who beyond the machine's own accounts: users that sign in with API tokens, their groups,
// and tokens provisioned declaratively (only their SHA-256, never the token itself).
struct User {
  std::string name;
  std::vector<std::string> groups;
  std::vector<std::string> token_sha256;  // lowercase hex
};

// Platform-wide roles (same member syntax as workspaces). Admins change policy and may see and
// cancel any run; viewers may read everything (runs of every workspace, metrics).
struct Access {
  std::vector<std::string> admins;
  std::vector<std::string> viewers;
};

// One level of the cluster's topology, for Kueue's topology-aware scheduling: the node label
// whose value names a node's domain at that level (its rack, its NVLink domain, ...).
struct TopologyLevel {
  std::string level;  // one of TopologyLevelNames(), broadest first
  std::string node_label;
};
// The levels a platform's topology may name, broadest first; policy.topology's placements are
// held to them (same-site, same-network-domain, same-accelerator-domain, same-host).
const std::vector<std::string>& TopologyLevelNames();

// A limit on the GPU-hours (and CPU-hours) one scope may hold over a period: platform.yaml's
// budgets (docs/budgets.md). Metered from what attempts held, from their start to their end.
struct Budget {
  std::string name;  // "" : named for its scope ("workspace vision", "user alice in vision", ...)
  // The scope: a workspace; a user in it (`user`; "*": each of its users alone); or a queue.
  std::string workspace, user, queue;
  std::optional<double> gpu_hours, cpu_hours;  // at least one of these and cost
  // An amount in the platform's currency (`costs`): what was held, priced at its flavors' rates
  // in force (budget::Price).
  std::optional<double> cost;
  std::string currency;  // costs.currency when cost is set, for messages
  // Over a calendar period in UTC ("day", "week" from Monday, "month"), or a rolling window.
  std::string period;
  int64_t window_ms = 0;
  double warn_at = 0.8;  // the share of a limit past which runs are warned (a soft limit)
  // "wait": a run whose budget is spent waits until it has room again; "refuse": also, a run
  // whose GPUs for its max_runtime can never fit what is left is refused at submission.
  std::string on_exceed = "wait";
  int line = 0, column = 0;  // where it is in the platform file (for messages)
};

// What an hour of a flavor's resources costs, in the platform's currency (docs/budgets.md,
// "Costs"): `tau usage` multiplies what was held by it.
struct FlavorCost {
  double gpu_hour = 0;  // per GPU
  double cpu_hour = 0;  // per CPU
};
struct Costs {
  std::string currency;                       // "USD", "EUR", credits: a name for people
  std::map<std::string, FlavorCost> flavors;  // empty: no costs
};

struct Platform {
  admission::Config admission;  // flavors, cohorts, queues, fair_sharing
  std::vector<PriorityClass> priorities;
  std::vector<Workspace> workspaces;
  std::vector<ComputeProfile> compute_profiles;
  std::vector<StorageVolume> storage;
  Defaults defaults;
  Access access;
  std::vector<User> users;
  NodeLabels node_labels;
  std::vector<TopologyLevel> topology;  // broadest first; empty: none (no placements on a cluster)
  std::vector<Budget> budgets;
  Costs costs;

  // Lookups by name; nullptr when absent.
  const Workspace* FindWorkspace(std::string_view name) const;
  const User* FindUser(std::string_view name) const;
  const PriorityClass* FindPriority(std::string_view name) const;
  const ComputeProfile* FindProfile(std::string_view name) const;
  const StorageVolume* FindStorage(std::string_view name) const;
  const admission::ClusterQueue* FindQueue(std::string_view name) const;
  const admission::ResourceFlavor* FindFlavor(std::string_view name) const;
};

struct PlatformOutcome {
  std::optional<Platform> platform;     // set when there are no errors
  std::vector<Diagnostic> diagnostics;  // every error found, in file order
  bool ok() const { return platform.has_value(); }
  std::string ErrorText() const;  // all diagnostics, one per line
};

// Parses and validates a platform file. `filename` is used only in diagnostics.
PlatformOutcome ParsePlatform(std::string_view text, std::string_view filename);

// The platform of a server without a platform file: flavor "default"; queue "default" whose
// nominal quota is the machine (cpu, memory, nvidia.com/gpu); priority class "default" (0);
// workspace "default" open to everyone, using that queue and priority.
Platform DefaultPlatform(int gpus, int64_t cpu_milli, int64_t memory_bytes);
// The same as a platform file: what `tau platform show` prints for it, and what DefaultPlatform
// parses.
std::string DefaultPlatformText(int gpus, int64_t cpu_milli, int64_t memory_bytes);

// The admission engine's configuration (Engine::Create accepts it for every parsed platform).
admission::Config ToAdmissionConfig(const Platform& platform);

// The whole platform as JSON, defaults filled in, for `tau platform show`.
nlohmann::json ToJson(const Platform& platform);

// ---------------------------------------------------------------------------------------------
// Resolution.

// Where a resolved value came from. `source` is one of "spec", "compute profile NAME",
// "workspace NAME default", "platform default", "platform limit (workspace NAME)".
struct Provenance {
  std::string field;  // the spec's dotted name: "compute.gpus", "policy.queue", ...
  std::string value;
  std::string source;
};

// A storage volume a run uses.
struct Mount {
  std::string role;       // "data" (storage.data_pvc), "output", "checkpoint"
  std::string volume;     // the platform's volume name
  std::string sub_path;   // within the volume ("" for all of it)
  std::string host_path;  // volume host_path joined with sub_path; "" when Kubernetes-only
  std::string pvc;
  std::string mount_path;  // inside the run (the volume's mount_path joined with sub_path)
  bool read_only = false;
};

// What one pod (or, locally, one worker process) of a run requests and is limited to.
struct PodResources {
  std::optional<Quantity> cpus, memory;             // requests; unset: none
  std::optional<Quantity> cpu_limit, memory_limit;  // limits; unset: none
  int gpus = 0;
};

struct ResolvedRun {
  std::string workspace;
  std::string queue;
  std::string priority_class;  // "" when no class applies (value 0)
  int32_t priority = 0;
  std::string compute_profile;  // "" when none applied
  int workers = 1;
  int gpus_per_worker = 0;
  std::optional<Quantity> cpus_per_worker;    // unset: no request (= worker.cpus)
  std::optional<Quantity> memory_per_worker;  // unset: no request (= worker.memory)
  // Each worker's pod: compute.worker_* when given (both shapes), else the per-worker shape.
  PodResources worker;
  // A rayjob's head pod (control-only: no GPUs); unset for a job. Locally the driver process.
  std::optional<PodResources> head;
  // Totals over all pods (workers x worker, plus the head) by Kubernetes resource name (cpu,
  // memory, nvidia.com/gpu); a resource the run does not request is absent.
  std::map<std::string, Quantity> total_requests;
  // Flavors the run may be admitted on (from the profile's flavor or the GPU class); empty: any
  // flavor of the queue.
  std::vector<std::string> flavors;
  std::map<std::string, std::string> node_selector;  // the spec's plus the GPU class label
  std::string gpu_class;   // "" when any; the normalised policy.gpu_class or the profile's
  NodeLabels node_labels;  // the platform's label keys (workload labels use them too)
  std::string topology;    // TauGrid's placement word ("" unconstrained; see docs/platform.md)
  std::string checkpoint_artifact;  // storage.checkpoint naming a file in the checkpoint dir
  // The spec's folder inside the code snapshot ("" at its root), where the run starts: set from the
  // submission (an entrypoint such as ../train.py ships the folder above), not by Resolve.
  std::string code_subdir;
  std::optional<int64_t> max_runtime_ms;
  int64_t max_log_bytes = kDefaultMaxLogBytes;
  int64_t max_metric_points = kDefaultMaxMetricPoints;
  int64_t max_metric_series = kDefaultMaxMetricSeries;
  std::string image;
  std::vector<Mount> mounts;
  std::vector<Provenance> provenance;  // one entry per resolved value, in a stable order

  // The provenance entry of `field`, or nullptr.
  const Provenance* Find(std::string_view field) const;
};

// Who submits the run.
struct Caller {
  std::string user;
  std::vector<std::string> groups;  // matched against "group:NAME" members
};

// Resolves the run's effective settings. On failure the status (PermissionDenied when the caller
// is not a member of the workspace, else InvalidArgument) lists every violation, one per line,
// each naming the field and the rule.
Result<ResolvedRun> Resolve(const spec::RunSpec& spec, const Platform& platform,
                            const Caller& caller);
Result<ResolvedRun> Resolve(const spec::RunSpec& spec, const Platform& platform,
                            const std::string& user);

// A resolution as JSON (quantities as Kubernetes strings) and back; the server records it with the
// run at submission.
nlohmann::json ToJson(const ResolvedRun& run);
Result<ResolvedRun> ResolvedRunFromJson(const nlohmann::json& json);

// The provenance as an aligned FIELD / VALUE / SOURCE table followed by the total requests.
std::string ExplainText(const ResolvedRun& run);

// A glob match where '*' matches any run of characters ('/' included) and '?' one character.
bool GlobMatch(std::string_view pattern, std::string_view text);
// Whether a URL pattern of allowed_webhooks allows `url`: its scheme, host and port glob-match
// the URL's ('*' cannot reach into the path: "https://*.example.com/*" does not allow
// "https://evil.net/x.example.com/"), and its path glob-matches the URL's (any path when the
// pattern has none).
bool UrlMatches(std::string_view pattern, std::string_view url);

}  // namespace tau::policy
