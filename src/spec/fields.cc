// The field trees of both shapes. Each leaf's setter maps its value into the one RunSpec model, so
// everything shape-specific about field names lives in this file (the checks are in checks.cc).
#include <fmt/format.h>

#include <algorithm>

#include "common/hash.h"
#include "common/json_text.h"
#include "common/strings.h"
#include "recovery/failure_class.h"
#include "spec/checks.h"
#include "spec/walk.h"

namespace tau::spec::internal {
namespace {

constexpr size_t kMaxPrefixChars = 20;

constexpr const char* kLabelPattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
constexpr const char* kSubdomainPattern =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
constexpr const char* kEnvNamePattern = "^[A-Za-z_][A-Za-z0-9_]*$";
constexpr const char* kEntrypointPattern = "^[^/~\\s-]\\S*$";
constexpr const char* kModePattern = "^[a-z0-9][a-z0-9.-]*$";

// ---- small builders ----

FieldDef Leaf(std::string name, Kind kind, std::string doc, Setter set) {
  FieldDef f;
  f.name = std::move(name);
  f.kind = kind;
  f.doc = std::move(doc);
  f.set = std::move(set);
  return f;
}

FieldDef Str(std::string name, std::string doc, Setter set) {
  return Leaf(std::move(name), Kind::kString, std::move(doc), std::move(set));
}

FieldDef Patterned(FieldDef f, const char* pattern, std::optional<int64_t> max_len) {
  f.pattern = pattern;
  f.max = max_len;
  return f;
}

FieldDef Int(std::string name, int64_t min, int64_t max, std::string doc, Setter set) {
  FieldDef f = Leaf(std::move(name), Kind::kInt, std::move(doc), std::move(set));
  f.min = min;
  f.max = max;
  return f;
}

FieldDef Bool(std::string name, std::string doc, Setter set) {
  return Leaf(std::move(name), Kind::kBool, std::move(doc), std::move(set));
}

FieldDef Cpu(std::string name, std::string doc, Setter set) {
  return Leaf(std::move(name), Kind::kQuantity, std::move(doc), std::move(set));
}

FieldDef Bytes(std::string name, std::string doc, Setter set) {
  FieldDef f = Leaf(std::move(name), Kind::kQuantity, std::move(doc), std::move(set));
  f.whole_units = true;
  return f;
}

FieldDef Duration(std::string name, int64_t min_ms, std::string doc, Setter set) {
  FieldDef f = Leaf(std::move(name), Kind::kDuration, std::move(doc), std::move(set));
  f.min = min_ms;
  return f;
}

FieldDef Enum(std::string name, std::vector<std::string> values, std::string doc, Setter set) {
  FieldDef f = Leaf(std::move(name), Kind::kEnum, std::move(doc), std::move(set));
  f.enum_values = std::move(values);
  return f;
}

FieldDef List(std::string name, std::string doc, Setter set) {
  return Leaf(std::move(name), Kind::kStringList, std::move(doc), std::move(set));
}

FieldDef Obj(std::string name, std::string doc, std::vector<FieldDef> children,
             std::vector<std::string> required = {}) {
  FieldDef f = Leaf(std::move(name), Kind::kObject, std::move(doc), nullptr);
  f.children = std::move(children);
  f.required = std::move(required);
  return f;
}

// Accepted and kept in RunSpec::recorded_only at `pointer` (e.g. "/profiler/mode"), not acted on.
FieldDef Recorded(std::string name, std::string pointer, std::string doc) {
  return Leaf(std::move(name), Kind::kAny,
              doc + " (accepted and recorded; tau does not act on it yet)",
              [pointer](Ctx& c, const Value& v) {
                c.spec.recorded_only[nlohmann::json::json_pointer(pointer)] = v.any;
              });
}

// A recorded string field (direct shape's run.source, run.working_dir).
FieldDef RecordedString(std::string name, std::string pointer, std::string doc) {
  return Str(std::move(name), doc + " (recorded; the local backend does not use it)",
             [pointer](Ctx& c, const Value& v) {
               c.spec.recorded_only[nlohmann::json::json_pointer(pointer)] = v.text;
             });
}

ImageAsset& CurrentAsset(Ctx& c) { return c.spec.storage.image_assets.back(); }

// ---- shared subtrees (the same keys in both shapes) ----

FieldDef GpuResourceMode() {
  return Patterned(
      Str("gpu_resource_mode", "How GPUs are handed out, e.g. full or mig",
          [](Ctx& c, const Value& v) {
            bool ok = v.text.size() <= 63 &&
                      std::all_of(v.text.begin(), v.text.end(),
                                  [](char ch) {
                                    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                                           ch == '-' || ch == '.';
                                  }) &&
                      v.text[0] != '-' && v.text[0] != '.';
            if (!ok) {
              c.Error(v.pos, fmt::format("{}: '{}' must be lowercase letters, digits, '-' and '.'",
                                         v.path, v.text));
              return;
            }
            c.spec.compute.gpu_resource_mode = v.text;
          }),
      kModePattern, 63);
}

FieldDef PolicyObject() {
  auto plain = [](std::string name, std::string Policy::*member) {
    return Str(name, "Policy " + name,
               [member](Ctx& c, const Value& v) { c.spec.policy.*member = v.text; });
  };
  FieldDef node_selector =
      Leaf("node_selector", Kind::kStringMap, "Node labels the pods must match", SetNodeSelector);
  node_selector.allow_empty = true;
  return Obj(
      "policy", "Where and how the run is scheduled",
      {plain("workspace", &Policy::workspace),
       Patterned(Str("namespace", "Kubernetes namespace",
                     [](Ctx& c, const Value& v) {
                       if (CheckLabel(c, v, 63, "")) c.spec.policy.namespace_name = v.text;
                     }),
                 kLabelPattern, 63),
       Patterned(Str("queue", "Kueue LocalQueue",
                     [](Ctx& c, const Value& v) {
                       if (CheckSubdomain(c, v)) c.spec.policy.queue = v.text;
                     }),
                 kSubdomainPattern, kMaxSubdomainChars),
       plain("profile", &Policy::profile), plain("lane", &Policy::lane),
       plain("team", &Policy::team), plain("preset", &Policy::preset),
       Enum("gpu_class", GpuClasses(), "GPU class the run needs",
            [](Ctx& c, const Value& v) { c.spec.policy.gpu_class = v.text; }),
       Enum("topology", Topologies(), "How close the workers must be",
            [](Ctx& c, const Value& v) { c.spec.policy.topology = v.text; }),
       Enum("priority_tier", {"default", "priority"}, "Priority tier",
            [](Ctx& c, const Value& v) { c.spec.policy.priority_tier = v.text; }),
       Patterned(Str("priority", "A named priority class (tau extension)",
                     [](Ctx& c, const Value& v) {
                       if (CheckSubdomain(c, v)) c.spec.policy.priority = v.text;
                     }),
                 kSubdomainPattern, kMaxSubdomainChars),
       Bool("disable_default_priorities", "Do not create the default priority classes",
            [](Ctx& c, const Value& v) { c.spec.policy.disable_default_priorities = v.flag; }),
       node_selector});
}

FieldDef StorageObject() {
  FieldDef assets;
  assets.name = "image_assets";
  assets.kind = Kind::kObjectList;
  assets.doc = "Files copied out of container images into the pods";
  assets.required = {"name", "image", "mount_path"};
  assets.on_item = [](Ctx& c, Pos) { c.spec.storage.image_assets.emplace_back(); };
  assets.children = {
      Patterned(Str("name", "Asset name",
                    [](Ctx& c, const Value& v) {
                      if (CheckLabel(c, v, 63, "")) CurrentAsset(c).name = v.text;
                    }),
                kLabelPattern, 63),
      Str("image", "Image holding the files",
          [](Ctx& c, const Value& v) { CurrentAsset(c).image = v.text; }),
      Str("source_path", "Path inside the image",
          [](Ctx& c, const Value& v) { CurrentAsset(c).source_path = v.text; }),
      Patterned(Str("mount_path", "Absolute path in the pod",
                    [](Ctx& c, const Value& v) {
                      if (!StartsWith(v.text, "/")) {
                        c.Error(v.pos, v.path + ": must be an absolute path");
                        return;
                      }
                      CurrentAsset(c).mount_path = v.text;
                    }),
                "^/", std::nullopt),
  };
  return Obj("storage", "Data and outputs",
             {Patterned(Str("data_pvc", "PersistentVolumeClaim holding the data",
                            [](Ctx& c, const Value& v) {
                              if (CheckSubdomain(c, v)) c.spec.storage.data_pvc = v.text;
                            }),
                        kSubdomainPattern, kMaxSubdomainChars),
              Str("output", "Where outputs go",
                  [](Ctx& c, const Value& v) { c.spec.storage.output = v.text; }),
              Enum("publish", {"staged"}, "How outputs are published",
                   [](Ctx& c, const Value& v) { c.spec.storage.publish = v.text; }),
              Str("checkpoint", "Checkpoint location",
                  [](Ctx& c, const Value& v) { c.spec.storage.checkpoint = v.text; }),
              assets});
}

FieldDef ResilienceObject() {
  FieldDef retry_on =
      Leaf("retry_on", Kind::kEnumList,
           "Failure classes that are retried (default Preempted, Evicted, GPUError, NodeLost)",
           SetRetryOn);
  retry_on.enum_values = RetryableFailureClasses();
  return Obj(
      "resilience", "Automatic retries",
      {Int("max_retries", 0, 100, "Retries after the first attempt",
           [](Ctx& c, const Value& v) {
             c.spec.resilience.max_retries = static_cast<int>(v.number);
           }),
       retry_on,
       Duration("backoff_initial", 0, "First retry delay (default 30s)",
                [](Ctx& c, const Value& v) { c.spec.resilience.backoff_initial_ms = v.number; }),
       Duration("backoff_max", 0, "Longest retry delay (default 5m)",
                [](Ctx& c, const Value& v) { c.spec.resilience.backoff_max_ms = v.number; }),
       Duration("max_retry_duration", 1, "Stop retrying after this long",
                [](Ctx& c, const Value& v) { c.spec.resilience.max_retry_duration_ms = v.number; }),
       Str("checkpoint_path", "Checkpoint directory handed to the next attempt",
           [](Ctx& c, const Value& v) { c.spec.resilience.checkpoint_path = v.text; })});
}

FieldDef MetricsObject() {
  return Obj("metrics", "Training metrics",
             {List("history", "JSONL globs relative to storage.output", SetHistory),
              Obj("offload", "Metric offload",
                  {Bool("enabled", "Offload metrics",
                        [](Ctx& c, const Value& v) { c.spec.metrics.offload_enabled = v.flag; }),
                   Str("out", "Offload destination",
                       [](Ctx& c, const Value& v) { c.spec.metrics.offload_out = v.text; })})});
}

FieldDef ExperimentObject() {
  auto field = [](std::string name, std::string Experiment::*member) {
    return Str(name, "Experiment " + name,
               [member](Ctx& c, const Value& v) { c.spec.experiment.*member = v.text; });
  };
  return Obj("experiment", "Experiment tracking",
             {field("project", &Experiment::project), field("name", &Experiment::name),
              field("group", &Experiment::group)});
}

FieldDef NameField() {
  return Patterned(Str("name", "Run name: a DNS-1123 label", SetName), kLabelPattern,
                   kMaxNameChars);
}

FieldDef ArgsField() {
  FieldDef f = List("args", "Arguments appended to the entrypoint (tau extension)", SetArgs);
  f.scalar_text = true;
  return f;
}

FieldDef MaxRuntimeField() {
  return Duration("max_runtime", 1, "Wall-clock limit per attempt (tau extension)",
                  [](Ctx& c, const Value& v) { c.spec.max_runtime_ms = v.number; });
}

FieldDef TtlField() {
  return Int("ttl_seconds_after_finished", 1, 2147483647, "Seconds a finished workload is kept",
             [](Ctx& c, const Value& v) { c.spec.ttl_seconds_after_finished = v.number; });
}

FieldDef EnvField() {
  FieldDef f =
      Leaf("env", Kind::kEnv, "Environment variables; 'SECRET:KEY' is a secret reference", SetEnv);
  f.allow_empty = true;
  f.scalar_text = true;
  f.pattern = kEnvNamePattern;
  f.max = static_cast<int64_t>(kMaxEnvVars);
  return f;
}

FieldDef PipField() { return List("pip", "pip requirement specifiers", SetPip); }

FieldDef ImageField(Setter set) { return Str("image", "Container image", std::move(set)); }

FieldDef KindEnum(std::string name, std::string doc) {
  return Enum(std::move(name), {"job", "rayjob"}, std::move(doc), [](Ctx& c, const Value& v) {
    c.spec.kind = v.text == "job" ? WorkloadKind::kJob : WorkloadKind::kRayJob;
    c.kind_set = true;
  });
}

FieldDef EntrypointField(std::string name, const char* alias) {
  return Patterned(Str(std::move(name), "Script (relative to the code directory) or command",
                       [alias](Ctx& c, const Value& v) { SetEntrypoint(c, v, alias); }),
                   kEntrypointPattern, std::nullopt);
}

Setter SetQuantity(std::optional<Quantity> Compute::*member) {
  return [member](Ctx& c, const Value& v) { c.spec.compute.*member = v.quantity; };
}

// ---- the two shapes ----

std::vector<FieldDef> BuildManifest() {
  FieldDef schema_version =
      Leaf("schema_version", Kind::kInt, "Manifest schema version; must be 1",
           [](Ctx& c, const Value& v) {
             if (v.number != 1) {
               c.Error(v.pos, fmt::format("schema_version: unsupported version {}; tau reads "
                                          "schema_version 1",
                                          v.number));
             }
           });
  // No min/max: an unsupported version gets the clearer message from the setter.
  FieldDef eval = Recorded("eval", "/eval", "Evaluation settings");
  eval.must_be_mapping = true;
  return {
      schema_version,
      NameField(),
      Obj("resource_naming", "Generated object names",
          {Patterned(Str("prefix", "Prefix of generated object names",
                         [](Ctx& c, const Value& v) {
                           if (CheckLabel(c, v, kMaxPrefixChars, ""))
                             c.spec.resource_prefix = v.text;
                         }),
                     kLabelPattern, kMaxPrefixChars)}),
      Obj("run", "What to run",
          {EntrypointField("entrypoint", nullptr),
           KindEnum("workload_kind",
                    "job or rayjob (default rayjob, as in TauGrid: one driver process; write job "
                    "for a gang of workers)"),
           ArgsField(), MaxRuntimeField(), TtlField(),
           Recorded("smoke_pairs", "/run/smoke_pairs", "SDK smoke-test pairs")},
          {"entrypoint"}),
      Obj("compute", "Workers and their sizes",
          {Int("gpus", 0, kMaxGpusPerWorker, "GPUs per worker",
               [](Ctx& c, const Value& v) { c.spec.compute.gpus = static_cast<int>(v.number); }),
           Int("workers", 1, kMaxWorkers, "Number of workers",
               [](Ctx& c, const Value& v) { c.spec.compute.workers = static_cast<int>(v.number); }),
           Cpu("cpus", "CPUs per pod (the head's when worker_cpus is set)",
               SetQuantity(&Compute::cpus)),
           Bytes("memory", "Memory per pod (the head's when worker_memory is set)",
                 SetQuantity(&Compute::memory)),
           Cpu("worker_cpus", "CPUs per worker", SetQuantity(&Compute::worker_cpus)),
           Bytes("worker_memory", "Memory per worker", SetQuantity(&Compute::worker_memory)),
           GpuResourceMode()}),
      Obj("runtime", "The software environment",
          {ImageField([](Ctx& c, const Value& v) { c.spec.runtime.image = v.text; }), PipField(),
           EnvField()}),
      PolicyObject(),
      StorageObject(),
      ResilienceObject(),
      MetricsObject(),
      ExperimentObject(),
      Obj("artifacts", "Artifacts",
          {Recorded("checkpoint", "/artifacts/checkpoint", "Checkpoint")}),
      Obj("profiler", "Profiler",
          {Recorded("mode", "/profiler/mode", "Profiler mode"),
           Recorded("rank", "/profiler/rank", "Rank to profile"),
           Recorded("warmup", "/profiler/warmup", "Warmup steps"),
           Recorded("duration", "/profiler/duration", "Profiled steps")}),
      Obj("workflow", "Workflow",
          {Recorded("extra_scripts", "/workflow/extra_scripts", "Extra scripts"),
           // The payload may be secret material: only a digest of it is recorded.
           Leaf("secret_payload", Kind::kAny,
                "Secret payload (accepted; only its sha256 is recorded)",
                [](Ctx& c, const Value& v) {
                  c.spec.recorded_only["workflow"]["secret_payload"] = {
                      {"redacted", true}, {"sha256", Sha256Hex(JsonText(v.any))}};
                }),
           Recorded("upstream_checkpoint", "/workflow/upstream_checkpoint",
                    "Upstream checkpoint")}),
      eval,
  };
}

std::vector<FieldDef> BuildDirect() {
  // gpus vs gpus_per_worker: both mean GPUs per worker, exactly like the manifest shape's
  // compute.gpus, so the same line means the same thing in either shape (for engine job with one
  // worker, `gpus` is the pod's GPUs). Giving both with different values is an error; see
  // ResolveDirectAliases().
  return {
      NameField(),
      KindEnum("engine", "job or rayjob"),
      EntrypointField("entrypoint", "script"),
      EntrypointField("script", "entrypoint"),
      ImageField([](Ctx& c, const Value& v) { c.top_level_image = v.text; }),
      Obj("run", "Run settings",
          {TtlField(),
           Obj("source", "Where a Job's code comes from (engine job)",
               {RecordedString("image", "/run/source/image", "Image holding the code"),
                RecordedString("path", "/run/source/path", "Path of the code in that image")}),
           RecordedString("working_dir", "/run/working_dir",
                          "Local project directory packed for a Ray job (engine rayjob)"),
           ArgsField(), MaxRuntimeField()}),
      Obj("runtime", "The software environment",
          {ImageField([](Ctx& c, const Value& v) { c.spec.runtime.image = v.text; }),
           Str("working_dir", "Container working directory (engine job)",
               [](Ctx& c, const Value& v) { c.spec.runtime.working_dir = v.text; }),
           PipField(), EnvField(),
           Obj("security", "Pod security",
               {Enum("mode", {"restricted"}, "restricted: non-root UID/GID 65532",
                     [](Ctx& c, const Value& v) { c.spec.runtime.security_mode = v.text; })})}),
      Obj("compute", "Workers and their sizes",
          {Int("workers", 1, kMaxWorkers, "Number of workers",
               [](Ctx& c, const Value& v) { c.spec.compute.workers = static_cast<int>(v.number); }),
           Int("gpus_per_worker", 0, kMaxGpusPerWorker, "GPUs per worker",
               [](Ctx& c, const Value& v) { c.direct_gpus_per_worker = v.number; }),
           Int("gpus", 0, kMaxGpusPerWorker, "GPUs per worker (same as gpus_per_worker)",
               [](Ctx& c, const Value& v) { c.direct_gpus = v.number; }),
           Cpu("cpu_request", "CPUs per pod", SetQuantity(&Compute::cpus)),
           Bytes("memory_request", "Memory per pod", SetQuantity(&Compute::memory)),
           Cpu("head_cpu_request", "Ray head CPUs", SetQuantity(&Compute::head_cpus)),
           Bytes("head_memory_request", "Ray head memory", SetQuantity(&Compute::head_memory)),
           Cpu("head_cpu_limit", "Ray head CPU limit", SetQuantity(&Compute::head_cpu_limit)),
           Bytes("head_memory_limit", "Ray head memory limit",
                 SetQuantity(&Compute::head_memory_limit)),
           Cpu("worker_cpu_request", "CPUs per worker", SetQuantity(&Compute::worker_cpus)),
           Bytes("worker_memory_request", "Memory per worker",
                 SetQuantity(&Compute::worker_memory)),
           Cpu("worker_cpu_limit", "Worker CPU limit", SetQuantity(&Compute::worker_cpu_limit)),
           Bytes("worker_memory_limit", "Worker memory limit",
                 SetQuantity(&Compute::worker_memory_limit)),
           GpuResourceMode()}),
      PolicyObject(),
      StorageObject(),
      MetricsObject(),
      ResilienceObject(),
      ExperimentObject(),
  };
}

}  // namespace

const std::vector<std::string>& GpuClasses() {
  static const auto* values = new std::vector<std::string>{
      "any",       "a10-4gb",   "a10-8gb",   "a10-12gb",   "a10-24gb",    "a100-40gb",
      "a100-80gb", "h100-80gb", "h100-95gb", "h200-141gb", "gb200-192gb", "gb300-288gb"};
  return *values;
}

const std::vector<std::string>& Topologies() {
  static const auto* values = new std::vector<std::string>{
      "unconstrained", "same-host", "same-accelerator-domain", "same-network-domain", "same-site"};
  return *values;
}

const std::vector<std::string>& RetryableFailureClasses() {
  static const auto* values = new std::vector<std::string>(
      recovery::FailureClassNames(recovery::RetryableFailureClasses()));
  return *values;
}

const std::vector<FieldDef>& ManifestFields() {
  static const auto* fields = new std::vector<FieldDef>(BuildManifest());
  return *fields;
}

const std::vector<FieldDef>& DirectFields() {
  static const auto* fields = new std::vector<FieldDef>(BuildDirect());
  return *fields;
}

const std::vector<std::string>& ManifestRequired() {
  static const auto* names = new std::vector<std::string>{"schema_version", "name", "run"};
  return *names;
}

const std::vector<std::string>& DirectRequired() {
  static const auto* names = new std::vector<std::string>{"name", "engine"};
  return *names;
}

}  // namespace tau::spec::internal
