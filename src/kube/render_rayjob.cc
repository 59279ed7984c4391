// A `rayjob` run as a KubeRay RayJob (ray.io/v1), shaped as TauGrid shapes it: a control-only head
// (no CPUs or GPUs offered to Ray, so no task lands there), one worker group with a pod per
// worker, the entrypoint run once as the Ray driver, pip and env through Ray's runtime env,
// HTTPMode submission, and no retries by KubeRay (tau's retry policy decides).
#include <fmt/format.h>

#include <regex>

#include "common/strings.h"
#include "kube/internal.h"

namespace tau::kube::internal {
namespace {

// The Ray head runs the GCS, the dashboard and the driver, not the workload.
const Quantity kDefaultHeadCpu = Quantity::FromUnits(1);
const Quantity kDefaultHeadMemory = Quantity::FromUnits(int64_t{4} << 30);

// "ray:2.9.0-py310", "ray:py3.12-ray2.56.0-cuda13.0" -> "2.9.0", "2.56.0"; "" when the image does
// not say.
std::string RayVersion(const std::string& image) {
  static const std::regex kVersion("ray[:-]?([0-9]+\\.[0-9]+\\.[0-9]+)");
  std::string last = image.substr(image.rfind('/') == std::string::npos ? 0 : image.rfind('/') + 1);
  std::smatch m;
  return std::regex_search(last, m, kVersion) ? m[1].str() : "";
}

// `driver`: the head container, where a RayJob's driver runs.
json Container(const RunContext& ctx, const std::string& name, const json& resources,
               bool gpu_container, bool driver, int serve_port) {
  std::vector<json> extra = {
      {{"name", "TAU_RAY_WORKERS"}, {"value", std::to_string(ctx.run->workers)}}};
  // The driver runs on the head, under its env: its metrics go to the head's metrics volume,
  // which the metrics sidecar prints.
  if (driver) extra.push_back({{"name", "TAU_METRICS_FILE"}, {"value", kMetricsFile}});
  for (const auto& [k, v] : spec::LauncherEnv(*ctx.spec))
    extra.push_back({{"name", k}, {"value", v}});
  if (!ctx.code_chunks.empty()) {
    // Ray's workers import the driver's modules from the same shipped code. A Ray Serve
    // application (a RayService) is imported by its import path from the spec's folder first,
    // where a local run finds it.
    std::string path = kCodeDir;
    if (std::string dir = WorkingDir(ctx); serve_port > 0 && !dir.empty() && dir != kCodeDir)
      path = dir + ":" + path;
    for (const spec::EnvVar& var : ctx.spec->runtime.env) {
      if (var.name == "PYTHONPATH" && !var.secret_ref) path += ":" + var.value;
    }
    extra.push_back({{"name", "PYTHONPATH"}, {"value", path}});
  }
  json c = {{"name", name},
            {"image", ctx.image},
            {"env", ContainerEnv(ctx, false, gpu_container, extra)},
            {"volumeMounts", VolumeMounts(ctx, false)}};
  if (driver) c["volumeMounts"].push_back(MetricsMount());
  if (json model = ModelMount(ctx); !model.is_null()) c["volumeMounts"].push_back(model);
  if (serve_port > 0)
    c["ports"] =
        json::array({{{"name", "serve"}, {"containerPort", serve_port}, {"protocol", "TCP"}}});
  if (!resources.empty()) c["resources"] = resources;
  if (ctx.spec->runtime.security_mode == "restricted") {
    c["securityContext"] = {{"allowPrivilegeEscalation", false},
                            {"capabilities", {{"drop", {"ALL"}}}}};
  }
  return c;
}

json PodTemplate(const RunContext& ctx, const json& container, const json& resources, bool gpu_pod,
                 bool workers, bool driver) {
  json pod = PodSpecBase(ctx, false, gpu_pod);
  json setup = SetupContainer(ctx, false, resources);
  pod["initContainers"] = json::array({setup});
  if (driver) {
    pod["volumes"].push_back(MetricsVolume());
    pod["initContainers"].push_back(MetricsSidecar(ctx));
  }
  pod["containers"] = json::array({container});
  // The placement is the workers' (the head only coordinates).
  json meta = workers ? WorkerTemplateMeta(ctx) : json{{"labels", PodLabels(ctx)}};
  return {{"metadata", meta}, {"spec", pod}};
}

std::string Entrypoint(const RunContext& ctx) {
  const spec::RunSpec& s = *ctx.spec;
  std::vector<std::string> words = EntryArgv(ctx);
  words.insert(words.end(), s.args.begin(), s.args.end());
  std::vector<std::string> quoted;
  for (const std::string& w : words) quoted.push_back(ShellQuote(w));
  // Ray runs the entrypoint with a shell on the head; the driver starts in the code directory as
  // a local run does.
  std::string dir = WorkingDir(ctx);
  std::string command = Join(quoted, " ");
  return dir.empty() ? command : fmt::format("cd {} && {}", ShellQuote(dir), command);
}

}  // namespace

// Secrets stay in the pods' env, never in the RayJob (or RayService) object.
json RayRuntimeEnv(const RunContext& ctx) {
  const spec::RunSpec& s = *ctx.spec;
  json env = json::object();
  for (const spec::EnvVar& var : s.runtime.env) {
    if (!var.secret_ref) env[var.name] = var.value;
  }
  json runtime = json::object();
  if (!env.empty()) runtime["env_vars"] = env;
  if (!s.runtime.pip.empty()) runtime["pip"] = s.runtime.pip;
  return runtime;
}

json RayClusterSpec(const RunContext& ctx, bool driver, int serve_port) {
  const policy::ResolvedRun& run = *ctx.run;
  const int gpus = run.gpus_per_worker;

  // The pods' sizes are the resolution's (policy::ResolvedRun::worker and head); a head the spec
  // does not size gets a small default.
  json worker_resources = PodResourcesJson(run.worker);
  policy::PodResources head_pod = run.head
                                      ? *run.head
                                      : policy::PodResources{kDefaultHeadCpu, kDefaultHeadMemory,
                                                             std::nullopt, std::nullopt, 0};
  if (!head_pod.cpus) head_pod.cpus = kDefaultHeadCpu;
  if (!head_pod.memory) head_pod.memory = kDefaultHeadMemory;
  json head_resources = PodResourcesJson(head_pod);

  json head = {
      // Control-only: Ray schedules no task on the head, so every task runs on a worker.
      {"rayStartParams", {{"num-cpus", "0"}, {"num-gpus", "0"}}},
      {"template",
       PodTemplate(ctx, Container(ctx, "ray-head", head_resources, false, driver, serve_port),
                   head_resources, false, false, driver)}};
  json worker_group = {
      {"groupName", "workers"},
      {"replicas", run.workers},
      {"minReplicas", run.workers},
      {"maxReplicas", run.workers},
      {"rayStartParams", {{"num-gpus", std::to_string(gpus)}}},
      {"template",
       PodTemplate(ctx, Container(ctx, "ray-worker", worker_resources, gpus > 0, false, serve_port),
                   worker_resources, gpus > 0, true, false)}};
  json cluster = {{"headGroupSpec", head}, {"workerGroupSpecs", json::array({worker_group})}};
  if (std::string version = RayVersion(ctx.image); !version.empty()) {
    cluster["rayVersion"] = version;
  }
  return cluster;
}

json RenderRayJob(const RunContext& ctx) {
  const spec::RunSpec& s = *ctx.spec;
  const policy::ResolvedRun& run = *ctx.run;
  json cluster = RayClusterSpec(ctx, true, 0);

  json spec = {
      {"entrypoint", Entrypoint(ctx)},
      // Kueue admits the RayJob by clearing suspend; until then no RayCluster exists.
      {"suspend", true},
      // Kueue requires it: the cluster goes when the job ends, and with it the quota.
      {"shutdownAfterJobFinishes", true},
      {"ttlSecondsAfterFinished", s.ttl_seconds_after_finished.value_or(15)},
      {"submissionMode", "HTTPMode"},
      // No KubeRay retries: each would be a new cluster outside tau's record. With its default
      // (2) a submitter re-attached to a finished Ray job once reported a failed job as succeeded.
      {"backoffLimit", 0},
      {"submitterConfig", {{"backoffLimit", 0}}},
      {"rayClusterSpec", cluster}};
  if (json env = RayRuntimeEnv(ctx); !env.empty()) spec["runtimeEnvYAML"] = ToYaml(env);
  if (run.max_runtime_ms) spec["activeDeadlineSeconds"] = (*run.max_runtime_ms + 999) / 1000;

  return {{"apiVersion", "ray.io/v1"},
          {"kind", "RayJob"},
          {"metadata", ObjectMeta(ctx, true)},
          {"spec", spec}};
}

}  // namespace tau::kube::internal
