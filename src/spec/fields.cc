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
  f.local = f.kube = "section";
  return f;
}

// The compatibility annotation (docs/taugrid-compat.md): what the local and the Kubernetes backend
// do with the field.
FieldDef On(FieldDef f, std::string local, std::string kube) {
  f.local = std::move(local);
  f.kube = std::move(kube);
  return f;
}
FieldDef Both(FieldDef f, const std::string& both) { return On(std::move(f), both, both); }
FieldDef TauOnly(FieldDef f, std::string local, std::string kube) {
  f = On(std::move(f), std::move(local), std::move(kube));
  f.tau_extension = true;
  return f;
}

constexpr const char* kRecordedNote = "recorded in the run config; not acted on (warns)";
constexpr const char* kResolved = "resolved against platform.yaml";

// Accepted and kept in RunSpec::recorded_only at `pointer` (e.g. "/profiler/mode"), not acted on.
FieldDef Recorded(std::string name, std::string pointer, std::string doc) {
  return Both(Leaf(std::move(name), Kind::kAny,
                   doc + " (accepted and recorded; tau does not act on it yet)",
                   [pointer](Ctx& c, const Value& v) {
                     c.spec.recorded_only[nlohmann::json::json_pointer(pointer)] = v.any;
                     // Never ignored in silence: said at validate, run and plan.
                     c.Warn(v.key_pos, fmt::format("{}: accepted and recorded in the run's config, "
                                                   "but tau does not act on it yet",
                                                   v.path));
                   }),
              kRecordedNote);
}

constexpr const char* kSourceLocal = "refused: the local backend runs the submitted code";
constexpr const char* kSourceKube = "copied from the image into the pods (engine job)";

// A recorded string field (direct shape's run.source, run.working_dir). `warning`, when given, is
// said once at the field: what tau does instead.
FieldDef RecordedString(std::string name, std::string pointer, std::string doc,
                        std::string warning = "") {
  return Both(Str(std::move(name), doc + " (recorded; the local backend does not use it)",
                  [pointer, warning](Ctx& c, const Value& v) {
                    c.spec.recorded_only[nlohmann::json::json_pointer(pointer)] = v.text;
                    if (!warning.empty()) c.Warn(v.key_pos, warning);
                  }),
              warning.empty() ? kRecordedNote : "recorded; warns: " + warning);
}

ImageAsset& CurrentAsset(Ctx& c) { return c.spec.storage.image_assets.back(); }

// ---- shared subtrees (the same keys in both shapes) ----

FieldDef GpuResourceMode() {
  return On(Patterned(Str("gpu_resource_mode", "How GPUs are handed out, e.g. full or mig",
                          [](Ctx& c, const Value& v) {
                            bool ok = v.text.size() <= 63 &&
                                      std::all_of(v.text.begin(), v.text.end(),
                                                  [](char ch) {
                                                    return (ch >= 'a' && ch <= 'z') ||
                                                           (ch >= '0' && ch <= '9') || ch == '-' ||
                                                           ch == '.';
                                                  }) &&
                                      v.text[0] != '-' && v.text[0] != '.';
                            if (!ok) {
                              c.Error(v.pos,
                                      fmt::format(
                                          "{}: '{}' must be lowercase letters, digits, '-' and '.'",
                                          v.path, v.text));
                              return;
                            }
                            c.spec.compute.gpu_resource_mode = v.text;
                          }),
                      kModePattern, 63),
            "recorded; every GPU is handed out whole", "GPU resource name of the pods (e.g. MIG)");
}

// TauGrid's spelling rules for a GPU class: trimmed, lowercased, '_' and ' ' read as '-', then the
// legacy aliases. Returns the class the text stands for when that differs from the text itself.
std::optional<std::string> NormalizeGpuClass(const std::string& text) {
  std::string s(Trim(text));
  for (char& ch : s) {
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (ch == '_' || ch == ' ') ch = '-';
  }
  for (const auto& [alias, canonical] : GpuClassAliases()) {
    if (s == alias) return canonical;
  }
  const std::vector<std::string>& classes = GpuClasses();
  if (s != text && std::find(classes.begin(), classes.end(), s) != classes.end()) return s;
  return std::nullopt;
}

// policy.guardrails: the run's own idle and stall limits, tightening its workspace's.
FieldDef GuardrailsObject() {
  constexpr const char* kLocal = "tightens the workspace's limits (docs/budgets.md)";
  constexpr const char* kKube = "not watched: the Kubernetes backend samples no GPUs";
  constexpr const char* kKubeStall =
      "watched from the kept pod logs and metrics; no stack dump; a stop deletes the attempt's Job";
  auto idle = [](Ctx& c) -> IdleGuard& {
    if (!c.spec.policy.idle) c.spec.policy.idle.emplace();
    return *c.spec.policy.idle;
  };
  auto stall = [](Ctx& c) -> StallGuard& {
    if (!c.spec.policy.stall) c.spec.policy.stall.emplace();
    return *c.spec.policy.stall;
  };
  FieldDef obj = Obj(
      "guardrails", "The run's own idle and stall limits: they only tighten its workspace's",
      {Obj("idle", "Warn about, then stop, a run whose GPUs stay under a utilisation",
           {TauOnly(Int("gpu_util_below", 1, 100, "Busiest GPU's utilisation, percent",
                        [=](Ctx& c, const Value& v) {
                          idle(c).gpu_util_below = static_cast<int>(v.number);
                        }),
                    kLocal, kKube),
            TauOnly(Duration("warn_after", 1000, "Warned after this long under it",
                             [=](Ctx& c, const Value& v) { idle(c).warn_after_ms = v.number; }),
                    kLocal, kKube),
            TauOnly(Duration("stop_after", 1000, "Stopped as Idle after this long under it",
                             [=](Ctx& c, const Value& v) { idle(c).stop_after_ms = v.number; }),
                    kLocal, kKube)}),
       Obj("stall", "Mark, then stop, a run whose logs and metrics stop growing",
           {TauOnly(Duration("after", 1000, "Marked Stalled (stacks dumped) after this long quiet",
                             [=](Ctx& c, const Value& v) { stall(c).after_ms = v.number; }),
                    kLocal, kKubeStall),
            TauOnly(Duration("stop_after", 1000, "Stopped as Stalled after this long quiet",
                             [=](Ctx& c, const Value& v) { stall(c).stop_after_ms = v.number; }),
                    kLocal, kKubeStall)})});
  return TauOnly(obj, kLocal,
                 "stall watched from the kept pod logs; idle not watched (no GPU samples)");
}

// policy.webhooks: receivers of the run's own events, as its workspace's webhooks.
FieldDef WebhooksList() {
  constexpr const char* kBoth = "the run's events POSTed, signed (docs/webhooks.md)";
  auto current = [](Ctx& c) -> Webhook& { return c.spec.policy.webhooks.back(); };
  FieldDef hooks;
  hooks.name = "webhooks";
  hooks.kind = Kind::kObjectList;
  hooks.doc = "Receivers of this run's events, besides its workspace's webhooks";
  hooks.required = {"url", "secret"};
  hooks.on_item = [](Ctx& c, Pos) {
    c.spec.policy.webhooks.emplace_back();
    c.spec.policy.webhooks.back().events = WebhookEventKinds();
  };
  FieldDef events = Leaf(
      "events", Kind::kEnumList, "The kinds of events it takes (default: all)",
      [=](Ctx& c, const Value& v) {
        std::vector<std::string>& kinds = current(c).events;
        kinds.clear();
        for (size_t i = 0; i < v.list.size(); ++i) {
          const std::string path = fmt::format("{}[{}]", v.path, i);
          const auto& known = WebhookEventKinds();
          if (std::find(known.begin(), known.end(), v.list[i]) == known.end()) {
            const std::string close = Suggest(v.list[i], known);
            c.Error(v.list_pos[i],
                    fmt::format("{}: unknown event kind '{}'{}; allowed: {}", path, v.list[i],
                                close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close),
                                Join(known, ", ")));
          } else if (std::find(kinds.begin(), kinds.end(), v.list[i]) != kinds.end()) {
            c.Error(v.list_pos[i], fmt::format("{}: '{}' is listed twice", path, v.list[i]));
          } else {
            kinds.push_back(v.list[i]);
          }
        }
        if (v.list.empty()) c.Error(v.pos, v.path + ": must name at least one kind");
      });
  events.enum_values = WebhookEventKinds();
  hooks.children = {
      TauOnly(Str("url", "http:// or https:// URL of the receiver",
                  [=](Ctx& c, const Value& v) {
                    if (std::string why = WebhookUrlProblem(v.text); !why.empty())
                      c.Error(v.pos, fmt::format("{}: '{}' {}", v.path, Printable(v.text), why));
                    else
                      current(c).url = v.text;
                  }),
              kBoth, kBoth),
      TauOnly(Str("secret", "Workspace secret that signs the payload (tau secret set)",
                  [=](Ctx& c, const Value& v) { current(c).secret = v.text; }),
              kBoth, kBoth),
      TauOnly(events, kBoth, kBoth)};
  return TauOnly(hooks, kBoth, kBoth);
}

FieldDef PolicyObject() {
  auto plain = [](std::string name, std::string Policy::*member) {
    return Str(name, "Policy " + name,
               [member](Ctx& c, const Value& v) { c.spec.policy.*member = v.text; });
  };
  // Accepted, but tau has nothing that acts on it: say so where the field is.
  auto warned = [](std::string name, std::string Policy::*member, std::string warning) {
    return Both(Str(name, "Policy " + name + " (accepted with a warning)",
                    [member, warning](Ctx& c, const Value& v) {
                      c.spec.policy.*member = v.text;
                      c.Warn(v.key_pos, warning);
                    }),
                "recorded; warns: " + warning);
  };
  FieldDef node_selector =
      Leaf("node_selector", Kind::kStringMap, "Node labels the pods must match", SetNodeSelector);
  node_selector.allow_empty = true;
  FieldDef gpu_class = Enum("gpu_class", GpuClasses(), "GPU class the run needs",
                            [](Ctx& c, const Value& v) { c.spec.policy.gpu_class = v.text; });
  gpu_class.normalize = NormalizeGpuClass;
  for (const auto& [alias, canonical] : GpuClassAliases()) {
    gpu_class.deprecated_values.push_back(alias);
  }
  return Obj(
      "policy", "Where and how the run is scheduled",
      {On(plain("workspace", &Policy::workspace), kResolved,
          "resolved against platform.yaml; sets the namespace and quota"),
       On(Patterned(Str("namespace", "Kubernetes namespace",
                        [](Ctx& c, const Value& v) {
                          if (CheckLabel(c, v, 63, "")) c.spec.policy.namespace_name = v.text;
                        }),
                    kLabelPattern, 63),
          "recorded; one machine has no namespaces", "namespace of the rendered objects"),
       Both(Patterned(Str("queue", "Kueue LocalQueue",
                          [](Ctx& c, const Value& v) {
                            if (CheckSubdomain(c, v)) c.spec.policy.queue = v.text;
                          }),
                      kSubdomainPattern, kMaxSubdomainChars),
            "resolved against platform.yaml's queues (Kueue LocalQueue on Kubernetes)"),
       Both(plain("profile", &Policy::profile),
            "resolved against platform.yaml's compute profiles"),
       Both(plain("lane", &Policy::lane),
            "resolved to a queue by the workspace's lanes in platform.yaml"),
       warned(
           "team", &Policy::team,
           "policy.team: tau has no teams; the queue, quota and priority come from policy.queue, "
           "policy.workspace and platform.yaml"),
       Both(plain("preset", &Policy::preset),
            "resolved as a compute profile of platform.yaml (a TauGrid preset's shape)"),
       On(gpu_class, "resolved against platform.yaml's flavors",
          "flavor choice and the pods' gpu-class node selector"),
       On(Enum("topology", Topologies(), "How close the workers must be",
               [](Ctx& c, const Value& v) { c.spec.policy.topology = v.text; }),
          "checked; one machine satisfies every placement",
          "Kueue topology-aware scheduling at platform.yaml's topology levels (refused where it "
          "has not the level)"),
       Both(Enum("priority_tier", {"default", "priority"}, "Priority tier",
                 [](Ctx& c, const Value& v) { c.spec.policy.priority_tier = v.text; }),
            "resolved against platform.yaml's priorities"),
       TauOnly(Patterned(Str("priority", "A named priority class (tau extension)",
                             [](Ctx& c, const Value& v) {
                               if (CheckSubdomain(c, v)) c.spec.policy.priority = v.text;
                             }),
                         kSubdomainPattern, kMaxSubdomainChars),
               "admission priority", "admission priority and WorkloadPriorityClass"),
       Both(Bool("disable_default_priorities", "Do not create the default priority classes",
                 [](Ctx& c, const Value& v) { c.spec.policy.disable_default_priorities = v.flag; }),
            kResolved),
       On(node_selector, "checked against the machine's labels", "pods' nodeSelector"),
       GuardrailsObject(), WebhooksList()});
}

FieldDef StorageObject() {
  FieldDef assets;
  assets.name = "image_assets";
  assets.kind = Kind::kObjectList;
  assets.doc = "Files copied out of container images into the pods";
  assets.required = {"name", "image", "mount_path"};
  assets.on_item = [](Ctx& c, Pos) { c.spec.storage.image_assets.emplace_back(); };
  assets.local = "refused at resolution (no images locally)";
  assets.kube = "init container copies the files";
  assets.children = {
      Both(Patterned(Str("name", "Asset name",
                         [](Ctx& c, const Value& v) {
                           if (CheckLabel(c, v, 63, "")) CurrentAsset(c).name = v.text;
                         }),
                     kLabelPattern, 63),
           "as image_assets"),
      Both(Str("image", "Image holding the files",
               [](Ctx& c, const Value& v) { CurrentAsset(c).image = v.text; }),
           "as image_assets"),
      Both(Str("source_path", "Path inside the image",
               [](Ctx& c, const Value& v) { CurrentAsset(c).source_path = v.text; }),
           "as image_assets"),
      Both(Patterned(Str("mount_path", "Absolute path in the pod",
                         [](Ctx& c, const Value& v) {
                           if (!StartsWith(v.text, "/")) {
                             c.Error(v.pos, v.path + ": must be an absolute path");
                             return;
                           }
                           CurrentAsset(c).mount_path = v.text;
                         }),
                     "^/", std::nullopt),
           "as image_assets"),
  };
  return Obj("storage", "Data and outputs",
             {On(Patterned(Str("data_pvc", "PersistentVolumeClaim holding the data",
                               [](Ctx& c, const Value& v) {
                                 if (CheckSubdomain(c, v)) c.spec.storage.data_pvc = v.text;
                               }),
                           kSubdomainPattern, kMaxSubdomainChars),
                 "resolved to the platform's local data directory", "PVC mounted at /data"),
              Both(Str("output", "Where outputs go",
                       [](Ctx& c, const Value& v) { c.spec.storage.output = v.text; }),
                   "TAU_OUTPUT_DIR of every attempt"),
              Both(Enum("publish", {"staged"}, "How outputs are published",
                        [](Ctx& c, const Value& v) {
                          c.spec.storage.publish = v.text;
                          // Never ignored in silence: no backend stages outputs yet.
                          c.Warn(v.key_pos,
                                 "storage.publish: recorded, but tau does not stage outputs yet: "
                                 "a run writes them in place (TAU_OUTPUT_DIR), a failed one too");
                        }),
                   "recorded; warns: outputs are written in place, not staged"),
              Both(Str("checkpoint", "Checkpoint location",
                       [](Ctx& c, const Value& v) { c.spec.storage.checkpoint = v.text; }),
                   "artifact under the run's checkpoint directory"),
              assets});
}

FieldDef ResilienceObject() {
  FieldDef retry_on =
      Leaf("retry_on", Kind::kEnumList,
           "Failure classes that are retried (default Preempted, Evicted, GPUError, NodeLost)",
           SetRetryOn);
  retry_on.enum_values = RetryableFailureClasses();
  constexpr const char* kRetries = "retries in the server";
  return Obj(
      "resilience", "Automatic retries",
      {Both(Int("max_retries", 0, 100, "Retries after the first attempt",
                [](Ctx& c, const Value& v) {
                  c.spec.resilience.max_retries = static_cast<int>(v.number);
                }),
            kRetries),
       Both(retry_on, "retries these failure classes (tau's classes, more than TauGrid's three)"),
       Both(Duration(
                "backoff_initial", 0, "First retry delay (default 30s)",
                [](Ctx& c, const Value& v) { c.spec.resilience.backoff_initial_ms = v.number; }),
            kRetries),
       Both(Duration("backoff_max", 0, "Longest retry delay (default 5m)",
                     [](Ctx& c, const Value& v) { c.spec.resilience.backoff_max_ms = v.number; }),
            kRetries),
       TauOnly(Duration("max_retry_duration", 1, "Stop retrying after this long",
                        [](Ctx& c, const Value& v) {
                          c.spec.resilience.max_retry_duration_ms = v.number;
                        }),
               kRetries, kRetries),
       Both(Str("checkpoint_path", "Checkpoint directory handed to the next attempt",
                [](Ctx& c, const Value& v) {
                  c.spec.resilience.checkpoint_path = v.text;
                  c.Warn(v.key_pos,
                         "resilience.checkpoint_path: tau hands every attempt TAU_CHECKPOINT_DIR "
                         "(stable across attempts); this path is not used");
                }),
            "recorded; warns: TAU_CHECKPOINT_DIR is used instead")});
}

FieldDef MetricsObject() {
  FieldDef history = List("history",
                          "JSONL globs relative to storage.output: files of TauGrid's metric "
                          "rows (one JSON object per line with \"_step\"; each numeric key "
                          "becomes a series), ingested while the run runs",
                          [](Ctx& c, const Value& v) { SetHistory(c, v); });
  constexpr const char* kOffload = "recorded; warns: no offload sidecar";
  return Obj("metrics", "Training metrics",
             {On(history,
                 "ingested: each numeric key of a matching file's lines is a series at its _step, "
                 "as TAU_METRICS_FILE's points are",
                 "recorded; not ingested (the files are on the cluster's volume): write metrics "
                 "to TAU_METRICS_FILE"),
              Obj("offload", "Metric offload",
                  {Both(Bool("enabled", "Offload metrics",
                             [](Ctx& c, const Value& v) {
                               c.spec.metrics.offload_enabled = v.flag;
                               if (v.flag) {
                                 c.Warn(
                                     v.key_pos,
                                     "metrics.offload: tau keeps every metric point in the run's "
                                     "evidence record; no offload sidecar is started");
                               }
                             }),
                        kOffload),
                   Both(Str("out", "Offload destination",
                            [](Ctx& c, const Value& v) { c.spec.metrics.offload_out = v.text; }),
                        kOffload),
                   Both(Str("image", "Offload sidecar image",
                            [](Ctx& c, const Value& v) { c.spec.metrics.offload_image = v.text; }),
                        kOffload)})});
}

FieldDef ExperimentObject() {
  auto field = [](std::string name, std::string Experiment::*member) {
    return Both(Str(name, "Experiment " + name,
                    [member](Ctx& c, const Value& v) { c.spec.experiment.*member = v.text; }),
                "recorded in the evidence record");
  };
  return Obj("experiment", "Experiment tracking",
             {field("project", &Experiment::project), field("name", &Experiment::name),
              field("group", &Experiment::group)});
}

FieldDef ExecutionObject() {
  auto count = [](std::string name, int64_t max, std::optional<int> Execution::*member,
                  std::string doc) {
    return Int(std::move(name), 1, max, std::move(doc), [member](Ctx& c, const Value& v) {
      c.spec.execution.*member = static_cast<int>(v.number);
    });
  };
  FieldDef configs = Leaf("configs", Kind::kAny,
                          "Launcher flags (python, torchrun), Ray Train sections or the Tune "
                          "search space (ray-tune)",
                          [](Ctx& c, const Value& v) { c.spec.execution.configs = v.any; });
  configs.must_be_mapping = true;
  constexpr const char* kTune = "Ray Tune driver setting (TAU_TUNE_*)";
  return Obj(
      "execution", "How the entrypoint is launched",
      {On(Enum("launcher", {"python", "torchrun", "ray-train", "ray-tune"},
               "python or torchrun (engine job); ray-train or ray-tune (engine rayjob)",
               [](Ctx& c, const Value& v) { c.spec.execution.launcher = v.text; }),
          "chooses the launcher", "chooses the pod command"),
       On(count("nodes", kMaxWorkers, &Execution::nodes, "torchrun nodes (sets compute.workers)"),
          "sets compute.workers (a local gang)", "sets compute.workers (an Indexed Job)"),
       Both(count("processes_per_node", 256, &Execution::processes_per_node,
                  "Processes per node (torchrun --nproc_per_node)"),
            "torchrun --nproc_per_node"),
       Both(Enum("mode", {"min", "max"}, "Ray Tune: minimise or maximise the metric",
                 [](Ctx& c, const Value& v) { c.spec.execution.tune_mode = v.text; }),
            kTune),
       Both(Str("metric", "Ray Tune: the metric to optimise",
                [](Ctx& c, const Value& v) { c.spec.execution.tune_metric = v.text; }),
            kTune),
       Both(count("num_samples", 1'000'000, &Execution::num_samples, "Ray Tune: trials"), kTune),
       Both(count("max_concurrent_trials", 1'000'000, &Execution::max_concurrent_trials,
                  "Ray Tune: trials at once"),
            kTune),
       Both(configs, "launcher flags / Tune search space"),
       Both(Bool("allow_nccl_override", "runtime.env may set NCCL_* variables",
                 [](Ctx& c, const Value& v) { c.spec.execution.allow_nccl_override = v.flag; }),
            "lets runtime.env set NCCL_*")});
}

// ---- services (kind: service) ----

Serve& ServeOf(Ctx& c) {
  if (!c.spec.serve) c.spec.serve.emplace();
  return *c.spec.serve;
}

FieldDef ProbeObject(std::string name, bool liveness) {
  constexpr const char* kProbeLocal = "the server probes each replica";
  constexpr const char* kProbeKube = "the container's probe";
  auto probe = [liveness](Ctx& c) -> Probe& {
    Serve& s = ServeOf(c);
    if (!liveness) return s.readiness;
    if (!s.liveness) s.liveness.emplace();
    return *s.liveness;
  };
  auto duration = [probe](std::string field, int64_t min_ms, std::string doc,
                          int64_t Probe::*member) {
    return TauOnly(
        Duration(std::move(field), min_ms, std::move(doc),
                 [probe, member](Ctx& c, const Value& v) { probe(c).*member = v.number; }),
        kProbeLocal, kProbeKube);
  };
  auto count = [probe](std::string field, std::string doc, int Probe::*member) {
    return TauOnly(Int(std::move(field), 1, 100, std::move(doc),
                       [probe, member](Ctx& c, const Value& v) {
                         probe(c).*member = static_cast<int>(v.number);
                       }),
                   kProbeLocal, kProbeKube);
  };
  std::vector<FieldDef> fields = {
      TauOnly(Patterned(Str("http_path",
                            "Path of an HTTP GET that a healthy replica answers 2xx or 3xx (none: "
                            "a TCP connection to its port)",
                            [probe](Ctx& c, const Value& v) {
                              if (v.text[0] != '/' ||
                                  v.text.find_first_of(" \t\r\n") != std::string::npos) {
                                c.Error(v.pos, fmt::format("{}: '{}' is not a path: write it as "
                                                           "the URL's path, e.g. /healthz",
                                                           v.path, Printable(v.text)));
                                return;
                              }
                              probe(c).http_path = v.text;
                            }),
                        "^/\\S*$", 1024),
              kProbeLocal, kProbeKube),
      duration("initial_delay", 0, "Wait this long after the replica starts (default 0s)",
               &Probe::initial_delay_ms),
      duration("period", 100, "Time between probes (default 1s)", &Probe::period_ms),
      duration("timeout", 100, "A probe not answered in this long failed (default 1s)",
               &Probe::timeout_ms),
      count("failure_threshold", "Failures in a row that fail the probe (default 3)",
            &Probe::failure_threshold)};
  if (!liveness)
    fields.push_back(count("success_threshold",
                           "Successes in a row that make a replica ready (default 1)",
                           &Probe::success_threshold));
  FieldDef f = Obj(std::move(name),
                   liveness ? "Liveness: a replica that fails it is restarted"
                            : "Readiness: requests go only to replicas that pass it",
                   std::move(fields));
  f.set = [probe](Ctx& c, const Value&) { probe(c); };  // an empty probe is the default one
  return f;
}

FieldDef ServeObject() {
  constexpr const char* kReplicas = "replicas: long-running admitted runs";
  FieldDef from =
      Patterned(Str("from",
                    "A trained run whose model the replicas serve, read-only "
                    "($TAU_SERVE_MODEL; tau serve deploy --from RUN)",
                    [](Ctx& c, const Value& v) {
                      // The shape tau serve deploy --from takes: a run's name.
                      if (!IsDns1123Label(v.text)) {
                        c.Error(v.pos, fmt::format("{}: '{}' is not a run's name (lowercase "
                                                   "letters, digits and '-', as tau list "
                                                   "shows them)",
                                                   v.path, v.text));
                        return;
                      }
                      ServeOf(c).from_run = v.text;
                    }),
                kLabelPattern, 63);
  return Obj(
      "serve", "A service: replicas of a server behind one endpoint (kind: service)",
      {TauOnly(
           Int("replicas", 0, 64, "Replicas of the server (default 1)",
               [](Ctx& c, const Value& v) { ServeOf(c).replicas = static_cast<int>(v.number); }),
           kReplicas, "the Deployment's replicas (a RayService's Serve replicas)"),
       TauOnly(Int("port", 1, 65535,
                   "The port the program listens on in a pod (default 8080); locally each "
                   "replica gets its own, always in $PORT",
                   [](Ctx& c, const Value& v) { ServeOf(c).port = static_cast<int>(v.number); }),
               "replaced: each replica listens on the port in $PORT", "the container's port"),
       TauOnly(from, "mounted read-only, lineage in the evidence",
               "the storage volume mounted read-only"),
       TauOnly(Enum("model", {"checkpoint", "output"},
                    "What of the `from` run is served: its newest complete checkpoint (default) "
                    "or its output directory",
                    [](Ctx& c, const Value& v) { ServeOf(c).model = v.text; }),
               "$TAU_SERVE_MODEL", "$TAU_SERVE_MODEL"),
       ProbeObject("readiness", false), ProbeObject("liveness", true),
       TauOnly(Duration("restart_backoff_initial", 0,
                        "Wait before restarting a replica that stopped (default 1s, doubling)",
                        [](Ctx& c, const Value& v) {
                          ServeOf(c).restart_backoff_initial_ms = v.number;
                        }),
               "restart backoff", "the kubelet's own backoff applies"),
       TauOnly(
           Duration("restart_backoff_max", 0, "Longest wait before a restart (default 30s)",
                    [](Ctx& c, const Value& v) { ServeOf(c).restart_backoff_max_ms = v.number; }),
           "restart backoff", "the kubelet's own backoff applies"),
       TauOnly(Str("import_path",
                   "Ray Serve application (module:app) of a rayjob service on Kubernetes",
                   [](Ctx& c, const Value& v) { ServeOf(c).import_path = v.text; }),
               "not used: the entrypoint runs", "the RayService's application")});
}

FieldDef NameField(const char* other) {
  return Both(Patterned(Str("name", "Run name: a DNS-1123 label",
                            [other](Ctx& c, const Value& v) {
                              SetName(c, v);
                              if (other != nullptr) c.spelled[v.path] = {v.text, v.pos};
                            }),
                        kLabelPattern, kMaxNameChars),
              "the run's name (a suffix is added)");
}

FieldDef ArgsField() {
  FieldDef f = List("args", "Arguments appended to the entrypoint (tau extension)", SetArgs);
  f.scalar_text = true;
  return TauOnly(f, "appended to the command", "appended to the command");
}

FieldDef MaxRuntimeField() {
  return TauOnly(Duration("max_runtime", 1, "Wall-clock limit per attempt (tau extension)",
                          [](Ctx& c, const Value& v) { c.spec.max_runtime_ms = v.number; }),
                 "attempt killed after it (Timeout)", "activeDeadlineSeconds");
}

FieldDef TtlField() {
  return On(Int("ttl_seconds_after_finished", 1, 2147483647, "Seconds a finished workload is kept",
                [](Ctx& c, const Value& v) { c.spec.ttl_seconds_after_finished = v.number; }),
            "recorded; runs are kept in tau's store", "ttlSecondsAfterFinished");
}

FieldDef EnvField() {
  FieldDef f = Leaf("env", Kind::kEnv,
                    "Environment variables, a mapping or a list of {name, value}; 'SECRET:KEY' is "
                    "a secret reference (tau extension)",
                    SetEnv);
  f.allow_empty = true;
  f.scalar_text = true;
  f.pattern = kEnvNamePattern;
  f.max = static_cast<int64_t>(kMaxEnvVars);
  return Both(f, "set for every worker (reserved names refused)");
}

FieldDef EnvSecretField() {
  FieldDef f =
      Leaf("env_secret", Kind::kStringMap,
           "Environment variables from Kubernetes Secrets: VAR: \"SECRET_NAME:KEY\"", SetEnvSecret);
  f.pattern = kEnvNamePattern;
  f.max = static_cast<int64_t>(kMaxEnvVars);
  return On(f, "read from tau's secret store as NAME.KEY", "secretKeyRef env");
}

FieldDef PipField() {
  return On(List("pip", "pip requirement specifiers", SetPip), "installed in a cached venv",
            "installed at pod start");
}

FieldDef ImageField(std::string doc, Setter set) {
  return On(Str("image", std::move(doc), std::move(set)), "recorded; not used (no containers)",
            "the pods' image");
}

FieldDef KindEnum(std::string name, std::vector<std::string> values, std::string doc) {
  return Both(Enum(std::move(name), std::move(values), std::move(doc),
                   [](Ctx& c, const Value& v) {
                     // `ray` is TauGrid's compatibility alias of rayjob.
                     c.spec.kind = v.text == "job" ? WorkloadKind::kJob : WorkloadKind::kRayJob;
                     c.kind_set = true;
                     c.spelled[v.path] = {WorkloadKindName(c.spec.kind), v.pos};
                   }),
              "job: a gang of workers; rayjob: one driver process");
}

FieldDef EntrypointField(std::string name, const char* alias) {
  return Both(Patterned(Str(std::move(name), "Script (relative to the code directory) or command",
                            [alias](Ctx& c, const Value& v) { SetEntrypoint(c, v, alias); }),
                        kEntrypointPattern, std::nullopt),
              "the command run in the code snapshot, from the spec's folder (from the "
              "repository root for a spec in a repository's tau/ folder); a path that leaves "
              "the spec's folder (../train.py) ships the folder it reaches");
}

FieldDef ExcludesField() {
  return On(
      List("working_dir_excludes",
           "Globs (relative to the code directory) left out of the code snapshot", SetCodeExcludes),
      "left out of the code snapshot", "left out of the code snapshot");
}

Setter SetQuantity(std::optional<Quantity> Compute::*member) {
  return [member](Ctx& c, const Value& v) { c.spec.compute.*member = v.quantity; };
}

FieldDef PodLimit(bool cpu) {
  FieldDef f =
      cpu ? Cpu("cpu_limit", "CPU limit of each pod", SetQuantity(&Compute::cpu_limit))
          : Bytes("memory_limit", "Memory limit of each pod", SetQuantity(&Compute::memory_limit));
  return On(f, "cgroup v2 limit per worker", "container limit");
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
  constexpr const char* kSize = "worker size (admission, cgroup v2)";
  constexpr const char* kPodSize = "pod requests";
  return {
      Both(schema_version, "selects the manifest shape"),
      TauOnly(Enum("kind", {"run", "service"},
                   "run (default) or service: a server kept running behind an endpoint (tau "
                   "serve deploy; see serve)",
                   [](Ctx& c, const Value& v) {
                     c.spelled["kind"] = {v.text, v.pos};
                     if (v.text == "service") ServeOf(c);
                   }),
              "service: replicas behind the server's endpoint",
              "service: a Deployment and Service, or a RayService"),
      NameField(nullptr),
      Obj("resource_naming", "Generated object names",
          {On(Patterned(Str("prefix", "Prefix of generated object names",
                            [](Ctx& c, const Value& v) {
                              if (CheckLabel(c, v, kMaxPrefixChars, ""))
                                c.spec.resource_prefix = v.text;
                            }),
                        kLabelPattern, kMaxPrefixChars),
              "recorded; not used", "prefix of the rendered objects' names")}),
      Obj("run", "What to run",
          {EntrypointField("entrypoint", nullptr),
           KindEnum("workload_kind", {"job", "rayjob"},
                    "job or rayjob (default rayjob, as in TauGrid: one driver process; write job "
                    "for a gang of workers)"),
           ArgsField(), MaxRuntimeField(), TtlField(), ExcludesField(),
           Recorded("smoke_pairs", "/run/smoke_pairs", "SDK smoke-test pairs")},
          {"entrypoint"}),
      Obj("compute", "Workers and their sizes",
          {Both(Int("gpus", 0, kMaxGpusPerWorker, "GPUs per worker",
                    [](Ctx& c, const Value& v) {
                      c.spec.compute.gpus = static_cast<int>(v.number);
                    }),
                "GPUs per worker"),
           On(Int("workers", 1, kMaxWorkers, "Number of workers",
                  [](Ctx& c, const Value& v) {
                    c.spec.compute.workers = static_cast<int>(v.number);
                  }),
              "workers of the gang", "pods of the gang (Ray workers)"),
           On(Cpu("cpus", "CPUs per pod (the head's when worker_cpus is set)",
                  SetQuantity(&Compute::cpus)),
              kSize, kPodSize),
           On(Bytes("memory", "Memory per pod (the head's when worker_memory is set)",
                    SetQuantity(&Compute::memory)),
              kSize, kPodSize),
           PodLimit(true), PodLimit(false),
           On(Cpu("worker_cpus", "CPUs per worker", SetQuantity(&Compute::worker_cpus)), kSize,
              "Ray worker requests"),
           On(Bytes("worker_memory", "Memory per worker", SetQuantity(&Compute::worker_memory)),
              kSize, "Ray worker requests"),
           GpuResourceMode()}),
      Obj("runtime", "The software environment",
          {ImageField("Container image",
                      [](Ctx& c, const Value& v) { c.spec.runtime.image = v.text; }),
           PipField(), EnvField(), EnvSecretField()}),
      PolicyObject(),
      StorageObject(),
      ResilienceObject(),
      MetricsObject(),
      ExperimentObject(),
      ExecutionObject(),
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
           Both(Leaf("secret_payload", Kind::kAny,
                     "Secret payload (accepted; only its sha256 is recorded)",
                     [](Ctx& c, const Value& v) {
                       c.spec.recorded_only["workflow"]["secret_payload"] = {
                           {"redacted", true}, {"sha256", Sha256Hex(JsonText(v.any))}};
                     }),
                "only its sha256 is recorded; not acted on"),
           Recorded("upstream_checkpoint", "/workflow/upstream_checkpoint",
                    "Upstream checkpoint")}),
      eval,
      ServeObject(),
  };
}

std::vector<FieldDef> BuildDirect() {
  // gpus vs gpus_per_worker: both mean GPUs per worker, exactly like the manifest shape's
  // compute.gpus, so the same line means the same thing in either shape (for engine job with one
  // worker, `gpus` is the pod's GPUs). Giving both with different values is an error; see
  // ResolveDirectAliases(). name, engine, entrypoint/script and image may also be written under
  // run: (TauGrid's examples do); the two levels must agree.
  const std::vector<std::string> engines = {"job", "rayjob", "ray"};
  auto spelled_image = [](Ctx& c, const Value& v) { c.spelled[v.path] = {v.text, v.pos}; };
  constexpr const char* kSize = "worker size (admission, cgroup v2)";
  constexpr const char* kRay = "recorded; no Ray head locally";
  return {
      NameField("run.name"),
      KindEnum("engine", engines, "job, rayjob, or ray (an alias of rayjob)"),
      EntrypointField("entrypoint", "script"),
      EntrypointField("script", "entrypoint"),
      ImageField("Container image (runtime.image and run.image take precedence)", spelled_image),
      Obj("run", "Run settings",
          {NameField("name"), KindEnum("engine", engines, "Same as the top-level engine"),
           EntrypointField("entrypoint", "run.script"), EntrypointField("script", "run.entrypoint"),
           ImageField("Same as the top-level image", spelled_image), TtlField(),
           Obj("source", "Where a Job's code comes from (engine job)",
               {On(Str("image", "Image holding the code",
                       [](Ctx& c, const Value& v) { c.spec.source.image = v.text; }),
                   kSourceLocal, kSourceKube),
                On(Str("path", "Absolute path of the code in that image",
                       [](Ctx& c, const Value& v) { c.spec.source.path = v.text; }),
                   kSourceLocal, kSourceKube)}),
           RecordedString("working_dir", "/run/working_dir",
                          "Local project directory packed for a Ray job (engine rayjob)"),
           ExcludesField(), ArgsField(), MaxRuntimeField()}),
      Obj("runtime", "The software environment",
          {ImageField("Container image",
                      [](Ctx& c, const Value& v) { c.spec.runtime.image = v.text; }),
           On(Str("working_dir", "Container working directory (engine job)",
                  [](Ctx& c, const Value& v) { c.spec.runtime.working_dir = v.text; }),
              "recorded; attempts start in the code snapshot", "the container's workingDir"),
           PipField(), EnvField(), EnvSecretField(),
           Obj("security", "Pod security",
               {On(Enum("mode", {"restricted"}, "restricted: non-root UID/GID 65532",
                        [](Ctx& c, const Value& v) { c.spec.runtime.security_mode = v.text; }),
                   "recorded; processes run as the server's user",
                   "restricted securityContext")})}),
      Obj("compute", "Workers and their sizes",
          {On(Int("workers", 1, kMaxWorkers, "Number of workers",
                  [](Ctx& c, const Value& v) {
                    c.spec.compute.workers = static_cast<int>(v.number);
                  }),
              "workers of the gang", "pods of the gang (Ray workers)"),
           Both(Int("gpus_per_worker", 0, kMaxGpusPerWorker, "GPUs per worker",
                    [](Ctx& c, const Value& v) { c.direct_gpus_per_worker = v.number; }),
                "GPUs per worker"),
           Both(Int("gpus", 0, kMaxGpusPerWorker, "GPUs per worker (same as gpus_per_worker)",
                    [](Ctx& c, const Value& v) { c.direct_gpus = v.number; }),
                "GPUs per worker"),
           On(Cpu("cpu_request", "CPUs per pod", SetQuantity(&Compute::cpus)), kSize,
              "pod requests"),
           On(Bytes("memory_request", "Memory per pod", SetQuantity(&Compute::memory)), kSize,
              "pod requests"),
           PodLimit(true), PodLimit(false),
           On(Cpu("head_cpu_request", "Ray head CPUs", SetQuantity(&Compute::head_cpus)), kRay,
              "Ray head requests"),
           On(Bytes("head_memory_request", "Ray head memory", SetQuantity(&Compute::head_memory)),
              kRay, "Ray head requests"),
           On(Cpu("head_cpu_limit", "Ray head CPU limit", SetQuantity(&Compute::head_cpu_limit)),
              kRay, "Ray head limits"),
           On(Bytes("head_memory_limit", "Ray head memory limit",
                    SetQuantity(&Compute::head_memory_limit)),
              kRay, "Ray head limits"),
           On(Cpu("worker_cpu_request", "CPUs per worker", SetQuantity(&Compute::worker_cpus)),
              kSize, "Ray worker requests"),
           On(Bytes("worker_memory_request", "Memory per worker",
                    SetQuantity(&Compute::worker_memory)),
              kSize, "Ray worker requests"),
           On(Cpu("worker_cpu_limit", "Worker CPU limit", SetQuantity(&Compute::worker_cpu_limit)),
              "cgroup v2 limit per worker", "Ray worker limits"),
           On(Bytes("worker_memory_limit", "Worker memory limit",
                    SetQuantity(&Compute::worker_memory_limit)),
              "cgroup v2 limit per worker", "Ray worker limits"),
           GpuResourceMode()}),
      PolicyObject(),
      StorageObject(),
      MetricsObject(),
      ResilienceObject(),
      ExperimentObject(),
      ExecutionObject(),
  };
}

}  // namespace

// GPU classes. TauGrid's newest docs read model-only classes (a100, h100, ...) and treat the
// memory-specific ones as legacy spellings of them. tau does not fold them: its platforms label
// flavors with the memory-specific classes, and a100-40gb and a100-80gb are different machines. So
// both kinds are exact classes of their own ("a100" is any A100, as the platform defines it); only
// the legacy aliases below are normalised, with a warning.
const std::vector<std::string>& GpuClasses() {
  static const auto* values = new std::vector<std::string>{
      "any",       "a10",       "a100",      "h100",       "h200",        "gb200",
      "gb300",     "a10-4gb",   "a10-8gb",   "a10-12gb",   "a10-24gb",    "a100-40gb",
      "a100-80gb", "h100-80gb", "h100-95gb", "h200-141gb", "gb200-192gb", "gb300-288gb"};
  return *values;
}

const std::vector<std::pair<std::string, std::string>>& GpuClassAliases() {
  static const auto* values =
      new std::vector<std::pair<std::string, std::string>>{{"a100-nvlink-80gb", "a100-80gb"},
                                                           {"h100-standalone-95gb", "h100-95gb"},
                                                           {"h200-nvlink-141gb", "h200-141gb"}};
  return *values;
}

// TauGrid's run-config topologies first; then tau's placement words (an extension: TauGrid uses
// them in workload profiles, not run configs).
const std::vector<std::string>& Topologies() {
  static const auto* values = new std::vector<std::string>{
      "independent",   "single-node-nvlink", "multi-node-nccl",         "elastic-workers",
      "unconstrained", "same-host",          "same-accelerator-domain", "same-network-domain",
      "same-site"};
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
  // name and engine may also be under run:; ResolveDirectAliases() requires them.
  static const auto* names = new std::vector<std::string>{};
  return *names;
}

}  // namespace tau::spec::internal
