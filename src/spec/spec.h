// The run spec: both tau.yaml shapes (manifest `schema_version: 1` and direct `engine:`), parsed
// strictly into one RunSpec. Pure code: no I/O beyond the text it is given.
//
// Errors read like a compiler's, one per line, all of them at once:
//   tau.yaml:7:3: error: unknown field 'worker' in 'compute' (did you mean 'workers'?)
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/quantity.h"
#include "common/status.h"
#include "recovery/failure_class.h"
#include "recovery/retry.h"

namespace tau::spec {

enum class Shape { kManifest, kDirect };
enum class WorkloadKind { kJob, kRayJob };

const char* ShapeName(Shape shape);            // "manifest" | "direct"
const char* WorkloadKindName(WorkloadKind k);  // "job" | "rayjob"

struct Diagnostic {
  std::string file;
  int line = 0;    // 1-based; 0 when unknown
  int column = 0;  // 1-based; 0 when unknown
  std::string message;
  bool warning = false;  // a warning does not fail the parse
  // "file:line:col: error: message" ("warning:" for a warning)
  std::string ToString() const;
};

struct Compute {
  int gpus = 0;  // GPUs per worker
  int workers = 1;
  std::optional<Quantity> cpus;    // per worker (manifest `cpus`, direct `cpu_request`)
  std::optional<Quantity> memory;  // per worker (manifest `memory`, direct `memory_request`)
  // Ray head sizing and per-worker overrides (both shapes; optional).
  std::optional<Quantity> worker_cpus, worker_memory, worker_cpu_limit, worker_memory_limit;
  std::optional<Quantity> head_cpus, head_memory, head_cpu_limit, head_memory_limit;
  // Per-pod limits of a Job's pods (TauGrid's compute.cpu_limit / memory_limit); the local backend
  // enforces them per worker with cgroup v2.
  std::optional<Quantity> cpu_limit, memory_limit;
  std::string gpu_resource_mode;  // "" | "full" | "mig" ...
};

struct EnvVar {
  std::string name;
  std::string value;        // literal value, or the reference when secret_ref is set
  bool secret_ref = false;  // value was "SECRET:KEY"; `value` then holds KEY
  // runtime.env_secret (TauGrid's `VAR: "NAME:KEY"`): the Kubernetes Secret NAME holding KEY
  // (`value`); "" for tau's own SECRET:KEY references. The local backend reads it from tau's
  // secret store as "NAME.KEY" (SecretStoreKey).
  std::string secret_name;
};

// The key tau's secret store holds a secret reference under: KEY, or NAME.KEY for env_secret.
std::string SecretStoreKey(const EnvVar& var);

struct Runtime {
  std::string image;             // recorded; not used by the local backend
  std::vector<std::string> pip;  // pip requirement specifiers
  std::vector<EnvVar> env;       // in file order
  std::string working_dir;
  std::string security_mode;  // "" | "restricted"
};

// policy.guardrails (tau extension): a run's own idle and stall limits. They only tighten its
// workspace's limits.idle and limits.stall (policy::EffectiveIdle / EffectiveStall).
struct IdleGuard {
  std::optional<int> gpu_util_below;  // percent, 1-100
  std::optional<int64_t> warn_after_ms, stop_after_ms;
};
struct StallGuard {
  std::optional<int64_t> after_ms, stop_after_ms;
};

// policy.webhooks (tau extension): a receiver of this run's own events, POSTed and signed as its
// workspace's webhooks are (docs/webhooks.md), under the workspace secret named `secret`.
struct Webhook {
  std::string url;                  // http:// or https:// (WebhookUrlProblem)
  std::string secret;               // the name of a secret of the run's workspace
  std::vector<std::string> events;  // kinds (WebhookEventKinds); all of them when not given
};
// The kinds of events a webhook may take, in the order the docs list them: "state", "guardrail",
// "budget".
const std::vector<std::string>& WebhookEventKinds();
// Why `url` cannot be a webhook's receiver ("" when it can): http(s), a host, a port from 1 to
// 65535, no credentials (the payload is signed instead), no white space.
std::string WebhookUrlProblem(const std::string& url);

struct Policy {
  std::string workspace, namespace_name, queue, profile, lane, team, preset;
  std::optional<IdleGuard> idle;
  std::optional<StallGuard> stall;
  std::vector<Webhook> webhooks;
  std::string gpu_class;      // "any", "a100-80gb", ...
  std::string topology;       // "unconstrained", "same-host", ...
  std::string priority_tier;  // "default" | "priority"
  std::string priority;       // a named priority class (tau extension)
  bool disable_default_priorities = false;
  std::map<std::string, std::string> node_selector;
};

struct ImageAsset {
  std::string name, image, source_path, mount_path;
};

struct Storage {
  std::string data_pvc, output, checkpoint, publish;
  std::vector<ImageAsset> image_assets;
};

// Failure classes retried when a spec does not say `retry_on` (recovery::DefaultRetryOn, by
// name): the ones that are not the job's own fault.
inline const std::vector<std::string>& DefaultRetryOn() {
  static const auto* names =
      new std::vector<std::string>(recovery::FailureClassNames(recovery::DefaultRetryOn()));
  return *names;
}

struct Resilience {
  int max_retries = 0;
  std::vector<std::string> retry_on;  // failure classes; DefaultRetryOn() unless retry_on_set
  bool retry_on_set = false;          // whether the file said retry_on at all
  int64_t backoff_initial_ms = 30'000;
  int64_t backoff_max_ms = 300'000;
  std::optional<int64_t> max_retry_duration_ms;
  std::string checkpoint_path;
};

// The retry policy of a spec's resilience (retry_on as classes; the spec validated their names).
recovery::RetryPolicy RetryPolicyOf(const Resilience& resilience);

struct Experiment {
  std::string project, name, group;
};

// TauGrid's execution block: how the entrypoint is launched.
struct Execution {
  std::string launcher;  // "" (tau chooses, see runtime.h) | "torchrun" | "python" | "ray-train" |
                         // "ray-tune"
  std::optional<int> nodes;               // torchrun nodes; sets compute.workers
  std::optional<int> processes_per_node;  // torchrun --nproc_per_node (default: GPUs per worker)
  // Ray Tune, handed to the driver as TAU_TUNE_* variables.
  std::string tune_mode;    // "min" | "max"
  std::string tune_metric;  // metric name
  std::optional<int> num_samples, max_concurrent_trials;
  nlohmann::json configs;            // launcher configs / Tune search space; null when not given
  bool allow_nccl_override = false;  // runtime.env may set NCCL_* variables
};

// One `--set PATH=VALUE` of `tau run` and `tau rerun`: a field given on the command line. It is
// applied to the parsed YAML before the walk, so every check a file's value gets applies to it, and
// its diagnostics say `--set PATH=VALUE` instead of a file position. PATH is dotted in the spec's
// own shape: a field (compute.gpus), an entry of a mapping (runtime.env.LR,
// policy.node_selector.kubernetes.io/arch: the rest of the path is the key), an item of a list
// (run.args[1], storage.image_assets[0].image) or a key inside a free-form field
// (execution.configs.lr). VALUE is read as the field's type: text for strings, enums, durations
// and quantities; YAML's integers and booleans for those; a flow list ([a, b]) or mapping
// ({K: v}) for a whole list or mapping.
struct Override {
  std::string path;
  std::string value;
  std::string Text() const { return path + "=" + value; }  // as the flag took it
};

struct Metrics {
  std::vector<std::string> history;  // JSONL globs relative to storage.output
  bool offload_enabled = false;
  std::string offload_out;
  std::string offload_image;
};

// A probe of a service's replica (serve.readiness, serve.liveness): an HTTP GET of `http_path`
// answered 2xx or 3xx, or (http_path empty) a TCP connection to the replica's port.
struct Probe {
  std::string http_path;         // "/healthz"; "": a TCP connect
  int64_t initial_delay_ms = 0;  // after the replica's attempt starts
  int64_t period_ms = 1'000;
  int64_t timeout_ms = 1'000;
  int failure_threshold = 3;  // failures in a row that make it fail
  int success_threshold = 1;  // successes in a row that make it pass (readiness only)
};

// A service (`kind: service`, the `serve:` section; docs/serving.md): the program is a server, run
// as `replicas` copies that are restarted whenever they stop, behind one endpoint.
// A service's replicas are restarted without a limit: its resilience says this many retries.
inline constexpr int kServiceRestarts = 1'000'000'000;
struct Serve {
  int replicas = 1;
  // The port the program listens on in a pod (Kubernetes). Locally every replica gets a port of
  // its own, handed to it as $PORT (on Kubernetes $PORT is this one).
  int port = 8080;
  // A trained run whose newest complete checkpoint (model "checkpoint") or output directory
  // ("output") the replicas serve, read-only ($TAU_SERVE_MODEL); "" : none. `tau serve deploy
  // --from RUN` sets it.
  std::string from_run;
  std::string model = "checkpoint";
  Probe readiness;
  std::optional<Probe> liveness;
  // How long a replica that stopped waits before it starts again: doubling from the first to the
  // longest, restarting forever (a service has no max_retries).
  int64_t restart_backoff_initial_ms = 1'000;
  int64_t restart_backoff_max_ms = 30'000;
  // Ray Serve (run.workload_kind: rayjob, rendered as a RayService): the application's import
  // path ("module:app"); the local backend runs the entrypoint instead.
  std::string import_path;
};

struct RunSpec {
  Shape shape = Shape::kManifest;
  std::string name;  // DNS-1123 label
  WorkloadKind kind = WorkloadKind::kRayJob;
  std::string entrypoint;         // path relative to the code directory, or a command
  std::vector<std::string> args;  // appended to the entrypoint
  std::optional<int64_t> ttl_seconds_after_finished;
  // run.source (engine job): the code is in this image at this path, not in the submitted
  // directory. The Kubernetes backend copies it into the pods; the local backend refuses it.
  struct CodeSource {
    std::string image, path;
  } source;
  std::optional<int64_t> max_runtime_ms;  // run.max_runtime (tau extension)
  std::string resource_prefix;            // resource_naming.prefix
  Compute compute;
  Runtime runtime;
  Policy policy;
  Storage storage;
  Resilience resilience;
  Experiment experiment;
  Metrics metrics;
  Execution execution;
  // run.working_dir_excludes: globs (relative to the code directory) left out of the snapshot.
  std::vector<std::string> code_excludes;
  // Fields tau accepts and records but does not act on yet (profiler, workflow, eval, ...), as
  // JSON.
  nlohmann::json recorded_only = nlohmann::json::object();
  // The --set overrides the spec was parsed with, in the order given (ToJson's "overrides").
  std::vector<Override> overrides;
  // Set for a service (`kind: service`): what makes it one. A run spec has none.
  std::optional<Serve> serve;
};

// Where a field is in the file, by its canonical dotted name (the names resolution messages start
// with: "compute.gpus", "compute.cpus", "policy.queue", ...), for diagnostics found after parsing.
struct FieldPosition {
  int line = 0;
  int column = 0;
  std::string origin;  // "--set PATH=VALUE" when a --set gave the field (line and column are 0)
};

struct ParseOutcome {
  std::optional<RunSpec> spec;          // set when there are no errors
  std::vector<Diagnostic> diagnostics;  // every error found, in file order
  std::vector<Diagnostic> warnings;  // accepted, but the author should know (deprecated, ignored)
  std::map<std::string, FieldPosition> positions;  // canonical dotted name -> the key's position
  bool ok() const { return spec.has_value(); }
  // All diagnostics, one per line.
  std::string ErrorText() const;
};

// Limits enforced by the parser (the server applies its own request limits on top).
inline constexpr size_t kMaxSpecBytes = 1 << 20;         // 1 MiB of YAML
inline constexpr size_t kMaxEnvValueBytes = 64 * 1024;   // one literal env value
inline constexpr size_t kMaxEnvTotalBytes = 128 * 1024;  // all literal env values
inline constexpr size_t kMaxEnvVars = 1024;
inline constexpr int kMaxWorkers = 4096;
inline constexpr int kMaxGpusPerWorker = 64;

// Parses and validates one spec. `filename` is used only in diagnostics. `overrides` (--set) are
// applied to the YAML before it is validated; a path the spec's shape has not, or a value of the
// wrong type, is an error at "--set PATH=VALUE".
ParseOutcome ParseSpec(std::string_view text, std::string_view filename,
                       const std::vector<Override>& overrides = {});

// `--set` texts ("PATH=VALUE") as overrides: InvalidArgument naming --set for one without '=' or
// with an empty or malformed path, and for a path given twice.
Result<std::vector<Override>> ParseOverrides(const std::vector<std::string>& texts);
// The overrides a canonical spec (ToJson) was parsed with, to parse its YAML again as submitted.
std::vector<Override> RecordedOverrides(const nlohmann::json& canonical);
// `base` with `more` applied: an override of `more` replaces the one of `base` with its path, the
// others are added after (tau rerun RUN --set: the run's own overrides, then the new ones).
std::vector<Override> MergeOverrides(std::vector<Override> base, const std::vector<Override>& more);
// The canonical dotted name of a field path as written (compute.gpus_per_worker -> compute.gpus,
// run.script -> run.entrypoint, ...), the names resolution and provenance use; other paths as
// they are.
std::string CanonicalField(std::string_view path);

// The spec as canonical JSON (sorted keys, defaults filled in, shape-independent), used for the
// config hash and for display. Both shapes of the same run give the same JSON except for "shape".
// A spec parsed with --set overrides has them in "overrides" ([{"path", "value"}]); the values
// they set are in the fields themselves.
nlohmann::json ToJson(const RunSpec& spec);
// A service's section as canonical JSON (ToJson's "serve"; the API's service replies).
nlohmann::json ServeJson(const Serve& serve);
// sha256 of the canonical JSON without the "shape" and "overrides" keys: the hash is of the
// effective settings, however they were given.
std::string ConfigHash(const RunSpec& spec);
// The same, of ToJson's result (which a caller that keeps the JSON has already).
std::string ConfigHash(const nlohmann::json& canonical);

// A JSON Schema (draft 2020-12) describing both shapes (`oneOf`), for editors and `tau schema -o
// json`.
nlohmann::json JsonSchema();

// Prefixes each line of `message` (resolution errors, one per line, each "FIELD: text") with the
// file position of FIELD when `positions` has it (or its closest enclosing section): the same
// file:line:col form as parse errors. Lines without a known field keep "FILE: error: ".
std::string LocateFieldErrors(std::string_view message, std::string_view filename,
                              const std::map<std::string, FieldPosition>& positions);

// What the launcher hands the entrypoint of execution's settings, as TauGrid names them: Ray Tune's
// TAU_TUNE_METRIC, TAU_TUNE_MODE, TAU_TUNE_NUM_SAMPLES, TAU_TUNE_MAX_CONCURRENT_TRIALS and
// TAU_TUNE_PARAM_SPACE (execution.configs as JSON); Ray Train's TAU_RAY_TRAIN_CONFIG_JSON. Both
// backends set them on the driver.
std::vector<std::pair<std::string, std::string>> LauncherEnv(const RunSpec& spec);

// Whether a job's workers start under torchrun: execution.launcher says so (torchrun or python),
// else a Python entrypoint with more than one GPU per worker does; and with how many processes
// per node (execution.processes_per_node, else the GPUs per worker, at least 1).
bool UsesTorchrun(const RunSpec& spec);
int ProcessesPerNode(const RunSpec& spec);

// The TauGrid compatibility table: one markdown row per run-config field of either shape (path,
// the shapes it is in, what the local and the Kubernetes backend do with it), from the annotations
// of the field trees. docs/taugrid-compat.md holds it below its marker line.
std::string CompatibilityTable();
// Fields of either shape ("manifest compute.gpus") that lack a compatibility annotation; empty
// when every field has one.
std::vector<std::string> UnannotatedFields();

// A secret reference's key ("SECRET:KEY"): letters, digits, '-', '_' and '.', as a Kubernetes
// Secret key.
bool IsSecretKey(std::string_view key);

}  // namespace tau::spec
