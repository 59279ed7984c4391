// Kubernetes rendering: a resolved run becomes a batch/v1 Job or a ray.io/v1 RayJob labelled for
// Kueue, and a platform becomes its Kueue objects (ResourceFlavors, Cohorts, ClusterQueues,
// LocalQueues, WorkloadPriorityClasses) plus a namespace and RBAC per workspace. Pure code: no I/O,
// no clock; the same input always gives the same objects, so the tests compare them with golden
// files. docs/kubernetes.md says what each field is for.
//
// What it offers:
//   * RenderRun, RenderPlatform: the objects, as JSON, in the order they should be applied;
//   * RenderCluster, ParseClusterValues: tau's own install, the objects of the Helm chart
//     deploy/helm/taugrid from its values;
//   * ToYaml: multi-document YAML with a stable key order (apiVersion, kind, metadata first);
//   * ParseYaml: YAML text -> JSON (for CRDs and golden files);
//   * SchemaSet: a validator for the OpenAPI v3 structural schemas of CRDs (and of our own
//     description of the built-in kinds), strict about unknown fields as the API server is.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/code_file.h"
#include "common/status.h"
#include "policy/policy.h"
#include "spec/spec.h"

namespace tau::kube {

// Code travels inside the run's object (an init container unpacks it), so no object store is
// needed. The archive is base64 in the object, once per pod template; 256 KiB of archive keeps the
// largest object (a RayJob: head and workers) well under etcd's 1.5 MiB limit.
inline constexpr size_t kMaxInlineCodeBytes = 256 * 1024;
// KubeRay derives the RayCluster name (+6 characters) and its services (+10) from a RayJob's name
// and refuses names over 47 characters; Jobs are held to the same limit so both kinds behave alike.
inline constexpr size_t kMaxObjectNameLength = 47;

// Where tau puts things inside a run's pods.
inline constexpr const char* kCodeDir = "/tau/code";
inline constexpr const char* kPipDir = "/tau/pip";
inline constexpr const char* kScratchDir = "/tau/scratch";
// A Job pod's $TAU_METRICS_FILE: on a volume of the pod's own, so ranks that share an output
// volume never write (or are read) into one file.
inline constexpr const char* kMetricsDir = "/tau/metrics";
inline constexpr const char* kMetricsFile = "/tau/metrics/metrics.jsonl";
// Secret references in the spec's env ("SECRET:KEY") read key KEY of this Secret in the run's
// namespace.
inline constexpr const char* kRunSecretName = "tau-secrets";
// The containers of a Job's pod: the init container that unpacks the code and installs pip
// packages, the one that runs the entrypoint (whose logs are the rank's), and a native sidecar
// (an init container that restarts Always, Kubernetes 1.29+) whose log is what the worker writes
// to $TAU_METRICS_FILE: the server follows it into the run's metrics.
inline constexpr const char* kSetupContainer = "tau-setup";
inline constexpr const char* kWorkerContainer = "worker";
inline constexpr const char* kMetricsContainer = "tau-metrics";
// run.source: the init container that copies the code out of its image, before the setup.
inline constexpr const char* kSourceContainer = "tau-source";

// Kueue's topology-aware scheduling: a pod template annotation whose value is the node label of
// the level its pod set must (or should) share, and the Topology object (its levels) that the
// platform's flavors with node labels name.
inline constexpr const char* kAnnotationRequiredTopology =
    "kueue.x-k8s.io/podset-required-topology";
inline constexpr const char* kAnnotationPreferredTopology =
    "kueue.x-k8s.io/podset-preferred-topology";
inline constexpr const char* kTopologyName = "tau";

// Labels and annotations tau puts on what it renders.
inline constexpr const char* kLabelRun = "tau.dev/run";
inline constexpr const char* kLabelAttempt = "tau.dev/attempt";
inline constexpr const char* kLabelWorkspace = "tau.dev/workspace";
inline constexpr const char* kLabelManagedBy = "app.kubernetes.io/managed-by";
// Which tau installation (`tau server --kube-installation`) made an object or pod: a server
// adopts objects of its own installation and unlabelled ones (made before installations had
// names), never another's.
inline constexpr const char* kLabelInstallation = "tau.dev/installation";
inline constexpr const char* kAnnotationConfigHash = "tau.dev/config-hash";
inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";
inline constexpr const char* kKueuePriorityLabel = "kueue.x-k8s.io/priority-class";

struct RenderOptions {
  std::string run_name;        // "" : the spec's name
  int attempt = 1;             // 1-based
  std::string namespace_name;  // "" : the workspace's namespace (WorkspaceNamespace)
  // The image of runs whose spec gives none (the local backend needs none, Kubernetes does). It is
  // held to the workspace's allowed_images like a spec's own image.
  std::string default_image;
  std::vector<CodeFile> code;  // shipped inline; empty: the image holds the code
  // Set by recovery on later attempts (TAU_RESUME_FROM, TAU_FAILURE_REASON).
  std::string resume_from;
  std::string failure_reason;
  // A run of an array (`tau run --array`): its index, as TAU_ARRAY_INDEX.
  std::optional<int64_t> array_index;
  // A workflow stage's upstream runs, {stage, run}: TAU_UPSTREAM_<STAGE>_RUN, and where the
  // checkpoint and output storage the pod mounts keeps their directories (..._CHECKPOINT_DIR,
  // ..._OUTPUT_DIR).
  std::vector<std::pair<std::string, std::string>> upstreams;
  // The installation's name (kLabelInstallation) on every object and pod; "" : no label.
  std::string installation;
};

// The namespace of a workspace's runs and LocalQueues: the workspace's name.
std::string WorkspaceNamespace(const policy::Workspace& workspace);

// The objects of one attempt of a run, in apply order: for a multi-worker Job a headless Service
// (the workers' rendezvous names) first, then the Job or RayJob itself, created suspended for
// Kueue to admit. `resolved` must come from policy::Resolve(spec, platform, ...). InvalidArgument
// names the field and what to do when the run cannot be rendered (no image, an image the
// workspace does not allow, code over the inline limit, a storage volume without a PVC, ...).
Result<std::vector<nlohmann::json>> RenderRun(const spec::RunSpec& spec,
                                              const policy::ResolvedRun& resolved,
                                              const policy::Platform& platform,
                                              const RenderOptions& options);

// The platform's cluster objects, in apply order: per workspace a Namespace, a Role and a
// RoleBinding for its members; then ResourceFlavors, Cohorts, ClusterQueues,
// WorkloadPriorityClasses, and in each workspace namespace a LocalQueue per ClusterQueue.
Result<std::vector<nlohmann::json>> RenderPlatform(const policy::Platform& platform);
// What the platform needs of Kueue's own Configuration (kueue-manager-config), which is not an
// object tau applies: fairSharing, admissionFairSharing and its feature gate; {} when nothing.
nlohmann::json KueueConfiguration(const policy::Platform& platform);

// What the schedulable nodes (not cordoned) can hold together: the sum of their
// status.allocatable cpu, memory and nvidia.com/gpu. The Kubernetes backend sizes its baseline
// platform to it when none is given.
struct ClusterSize {
  int64_t cpu_milli = 0;
  int64_t memory_bytes = 0;
  int gpus = 0;
  int nodes = 0;
};
ClusterSize NodesAllocatable(const std::vector<nlohmann::json>& nodes);

// Multi-document YAML ("---" between objects). Keys are ordered apiVersion, kind, metadata, then
// alphabetically; strings that YAML 1.1 readers could take for something else are quoted.
std::string ToYaml(const std::vector<nlohmann::json>& objects);
std::string ToYaml(const nlohmann::json& object);

// Every document of a YAML text as JSON. Plain scalars become numbers, booleans or null where
// they read as such; quoted scalars stay strings.
Result<std::vector<nlohmann::json>> ParseYaml(std::string_view text);

// Validates objects against OpenAPI v3 structural schemas, the subset CRDs use: type,
// properties, required, items, additionalProperties, enum, format (int32, int64, date-time),
// nullable, x-kubernetes-int-or-string, x-kubernetes-preserve-unknown-fields, min/maxLength,
// pattern, min/maxItems, maxProperties, minimum/maximum, anyOf, and "$ref" to "#/definitions/X".
// A field the schema does not define is an error, as the API server rejects (or prunes) it.
// CEL rules (x-kubernetes-validations) are not evaluated.
class SchemaSet {
 public:
  SchemaSet();
  ~SchemaSet();
  SchemaSet(SchemaSet&&) noexcept;
  SchemaSet& operator=(SchemaSet&&) noexcept;

  // Adds every served version of a CustomResourceDefinition.
  Status AddCrd(const nlohmann::json& crd);
  // Adds built-in kinds: {"kinds": {"batch/v1/Job": SCHEMA, ...}, "definitions": {...}}.
  Status AddSchemas(const nlohmann::json& doc);
  // True when a schema for the object's apiVersion and kind is known.
  bool Knows(const nlohmann::json& object) const;
  // Ok, or InvalidArgument listing every violation, one per line:
  //   Job/quickstart-1: spec.template.spec.containers[0].resurces: unknown field (did you mean
  //   'resources'?)
  Status Validate(const nlohmann::json& object) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Reading an attempt's state back from the cluster (observe.cc; pure) ----

// What the cluster says of one attempt (one Job or RayJob that RenderRun made), from the object
// itself, the Kueue Workload that owns its admission and the attempt's pods.
struct AttemptObservation {
  enum class Phase {
    kPending,    // not admitted: waiting for quota (reason/message: Kueue's own), or for Kueue
    kAdmitted,   // Kueue reserved quota and admitted it; no pod runs yet
    kRunning,    // a pod of it runs (for a RayJob: the Ray job runs)
    kSucceeded,  // it completed
    kFailed,     // it failed: failure_class says why
    kEvicted,    // Kueue took its admission back (preemption, ...): its pods are being stopped
  };
  Phase phase = Phase::kPending;
  // kFailed and kEvicted: the name of one of tau's failure classes (recovery::FailureClassName:
  // "OOMKilled", "Evicted", "Preempted", "NodeLost", "UserError", "SetupError", "Timeout",
  // "GPUError"); "" otherwise.
  std::string failure_class;
  // kPending: Kueue's reason (condition reason, e.g. "Pending") and message ("couldn't assign
  // flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h200, 2 more
  // needed"); other phases: what happened, for the run's events.
  std::string reason;
  std::string message;
  std::optional<int> exit_code;  // the failed (or first) worker container's exit code, if known
  // kAdmitted and later: Kueue's assignment, {"POD_SET": {"RESOURCE": "FLAVOR"}}, and its
  // ClusterQueue; empty before admission.
  nlohmann::json flavors = nlohmann::json::object();
  std::string cluster_queue;
  // The object failed and its pods say how (rule 1's third row), so the class is only as good as
  // the view of the pods it was read from: the pod and object watches are separate streams, and
  // the object's failure can come before the pods' ends. The caller reads the pods again from the
  // API server after it has seen the failure, and tells the end from those (KubeCluster does).
  // Also set while the pods have not caught up (PodsNotCaughtUp; the phase is then theirs).
  bool read_from_pods = false;

  bool Terminal() const { return phase == Phase::kSucceeded || phase == Phase::kFailed; }
};
const char* PhaseName(AttemptObservation::Phase phase);

// `object` is the attempt's batch/v1 Job or ray.io/v1 RayJob as the API server returns it;
// `workload` the kueue.x-k8s.io/v1beta2 Workload owned by it (null when Kueue has not made one
// yet); `pods` the pods of the attempt (for a RayJob: its head, workers and submitter pods), in any
// order.
AttemptObservation ObserveAttempt(const nlohmann::json& object, const nlohmann::json* workload,
                                  const std::vector<nlohmann::json>& pods);

// Positions of pending Workloads in their LocalQueues, as Kueue orders them: higher
// spec.priority first, then older (creationTimestamp, then name). A Workload is pending while its
// QuotaReserved condition is not True and it has not Finished. Keys "NAMESPACE/NAME"; 1 = next.
std::map<std::string, int> PendingPositions(const std::vector<nlohmann::json>& workloads);

// The Workload among `workloads` that the Job or RayJob `object` owns the admission of (an
// ownerReference to its uid, or to its kind and name when the uid is absent); null when none.
const nlohmann::json* OwnedWorkload(const nlohmann::json& object,
                                    const std::vector<nlohmann::json>& workloads);

// ---- The cluster install: what the Helm chart deploy/helm/taugrid installs ----

// The taint the GPU health agent puts on a node with an unhealthy GPU (effect NoSchedule), so no
// new pod lands there until the GPU recovers; the agent itself tolerates it to keep watching.
inline constexpr const char* kGpuUnhealthyTaint = "tau.dev/gpu-unhealthy";
// The chart's appVersion: the image tag when the values give none. Chart.yaml says the same (a
// test checks it).
inline constexpr const char* kChartAppVersion = "0.1.0";

// The chart's values (deploy/helm/taugrid/values.yaml; the defaults here are the same).
struct ClusterValues {
  std::string release_name = "taugrid";  // Helm's release name; object names derive from it
  std::string namespace_name = "tau-system";
  std::string image_repository = "ghcr.io/taugrid/tau";
  std::string image_tag;  // "" : kChartAppVersion
  std::string image_pull_policy = "IfNotPresent";
  // server.resources, as a container's `resources` (requests/limits of quantities).
  nlohmann::json server_resources = {{"requests", {{"cpu", "500m"}, {"memory", "1Gi"}}},
                                     {"limits", {{"memory", "2Gi"}}}};
  std::string storage_size = "10Gi";
  std::string storage_class;  // "" : the cluster's default StorageClass
  std::string tls_secret = "tau-server-tls";
  std::string platform;  // platform.yaml text; "" : no ConfigMap, the server's default platform
  bool health_agent_enabled = true;
  std::map<std::string, std::string> health_agent_node_selector = {
      {"nvidia.com/gpu.present", "true"}};
  std::vector<nlohmann::json> health_agent_tolerations;  // besides the two the agent always has
  std::string health_agent_runtime_class = "nvidia";     // "" : the node's default runtime
  std::string health_agent_poll_interval = "10s";
  bool rbac_create = true;
  bool service_account_create = true;
  std::string server_service_account;        // "" : FULLNAME-server
  std::string health_agent_service_account;  // "" : FULLNAME-health-agent
};

// The chart's values from a values file (YAML, the shape of values.yaml), over the defaults.
// Unknown keys and mistyped values are InvalidArgument naming the key, as values.schema.json
// makes `helm install` refuse them.
Result<ClusterValues> ParseClusterValues(std::string_view yaml);

// The objects the chart installs, in Helm's install order: ServiceAccounts, the platform
// ConfigMap, ClusterRoles and their bindings, the server's Service, the GPU health agent's
// DaemonSet and the server's StatefulSet; then, when `platform` is given, RenderPlatform's
// objects (namespaces, RBAC and Kueue queues; the chart only carries the platform's text).
Result<std::vector<nlohmann::json>> RenderCluster(const ClusterValues& values,
                                                  const policy::Platform* platform);

}  // namespace tau::kube
