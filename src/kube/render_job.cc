// A `job` run as a batch/v1 Job, the local launcher's rules carried over:
//   1 worker, 0 or 1 GPU   python3 ENTRY ARGS
//   1 worker, N > 1 GPUs   torchrun --standalone --nproc_per_node=N ENTRY ARGS
//   W > 1 workers          an Indexed Job of W pods (one per worker) behind a headless Service,
//                          each running python3 (or torchrun --nnodes=W when N > 1) with
//                          MASTER_ADDR = pod 0, RANK = the pod's completion index
// torchrun is started as `python3 -m torch.distributed.run` (the same program): when torch comes
// from runtime.pip it is installed under /tau/pip, where no `torchrun` script is on PATH.
#include <fmt/format.h>

#include "common/strings.h"
#include "kube/internal.h"

namespace tau::kube::internal {
namespace {

// A word the kubelet passes on as it is: every '$' doubled (it reads "$$" as a literal "$").
std::string KubeLiteral(const std::string& word) {
  std::string out;
  for (char c : word) {
    out += c;
    if (c == '$') out += '$';
  }
  return out;
}

constexpr int kRendezvousPort = 29500;

json EnvEntry(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

}  // namespace

std::vector<std::string> WorkerCommand(const RunContext& ctx,
                                       const std::vector<std::string>& launcher) {
  std::vector<std::string> argv = launcher;
  std::vector<std::string> entry = EntryArgv(ctx);
  // Behind a launcher, only the script: the launcher starts its Python.
  if (!launcher.empty()) entry = {entry.back()};
  // The kubelet expands $(VAR) (and turns $$ into $) in a container's command: the spec's words
  // are escaped, so they reach the process as written, as on the local backend and in a RayJob.
  for (const std::string& word : entry) argv.push_back(KubeLiteral(word));
  for (const std::string& word : ctx.spec->args) argv.push_back(KubeLiteral(word));
  return argv;
}

json WorkerPodSpec(const RunContext& ctx, const std::vector<std::string>& command,
                   std::vector<json> extra) {
  const spec::RunSpec& s = *ctx.spec;
  const int gpus = ctx.run->gpus_per_worker;
  const bool pip = !s.runtime.pip.empty();
  if (pip) {
    // Requirements are installed by the setup container into /tau/pip; the spec's own PYTHONPATH,
    // if any, stays after it.
    std::string path = kPipDir;
    for (const spec::EnvVar& var : s.runtime.env) {
      if (var.name == "PYTHONPATH" && !var.secret_ref) path += ":" + var.value;
    }
    extra.push_back(EnvEntry("PYTHONPATH", path));
  }
  // Metrics go to a volume of the pod's own, which the metrics sidecar prints (its log).
  extra.push_back(EnvEntry("TAU_METRICS_FILE", kMetricsFile));

  json resources = PodResourcesJson(ctx.run->worker);
  json container = {{"name", kWorkerContainer},
                    {"image", ctx.image},
                    {"command", command},
                    {"env", ContainerEnv(ctx, true, gpus > 0, extra)},
                    {"volumeMounts", VolumeMounts(ctx, pip)}};
  if (json model = ModelMount(ctx); !model.is_null()) container["volumeMounts"].push_back(model);
  if (!resources.empty()) container["resources"] = resources;
  if (std::string dir = WorkingDir(ctx); !dir.empty()) container["workingDir"] = dir;
  if (s.runtime.security_mode == "restricted") {
    container["securityContext"] = {{"allowPrivilegeEscalation", false},
                                    {"capabilities", {{"drop", {"ALL"}}}}};
  }

  json pod = PodSpecBase(ctx, pip, gpus > 0);
  pod["initContainers"] = json::array();
  if (ctx.code_from_image) pod["initContainers"].push_back(SourceContainer(ctx));
  pod["initContainers"].push_back(SetupContainer(ctx, true, resources));
  // storage.image_assets: each asset's files copied out of its (pinned) image into a volume of
  // their own by an init container, then mounted read-only where the spec says.
  for (const spec::ImageAsset& a : s.storage.image_assets) {
    const std::string volume = "tau-asset-" + a.name;
    pod["volumes"].push_back({{"name", volume}, {"emptyDir", json::object()}});
    pod["initContainers"].push_back(
        CopyContainer(ctx, volume, a.image, a.source_path, volume, "/tau/asset"));
    container["volumeMounts"].push_back(
        {{"name", volume}, {"mountPath", a.mount_path}, {"readOnly", true}});
  }
  pod["volumes"].push_back(MetricsVolume());
  container["volumeMounts"].push_back(MetricsMount());
  // After the setup (and asset copies): it runs beside the worker only.
  pod["initContainers"].push_back(MetricsSidecar(ctx));
  pod["containers"] = json::array({container});
  return pod;
}

std::vector<json> RenderJob(const RunContext& ctx) {
  const spec::RunSpec& s = *ctx.spec;
  const policy::ResolvedRun& run = *ctx.run;
  const int workers = run.workers;
  std::vector<json> out;

  std::vector<json> extra;
  std::vector<std::string> launcher;
  if (spec::UsesTorchrun(s)) {
    launcher = {"python3", "-m", "torch.distributed.run"};
    if (workers == 1) {
      launcher.push_back("--standalone");
    } else {
      launcher.push_back(fmt::format("--nnodes={}", workers));
      launcher.push_back("--node_rank=$(RANK)");  // the kubelet expands $(VAR) from the env below
      launcher.push_back("--master_addr=$(MASTER_ADDR)");
      launcher.push_back("--master_port=$(MASTER_PORT)");
    }
    launcher.push_back(fmt::format("--nproc_per_node={}", spec::ProcessesPerNode(s)));
  }

  if (workers > 1) {
    // Pod I of an Indexed Job is named NAME-I; with subdomain NAME and a headless Service NAME it
    // resolves as NAME-I.NAME, so every worker finds rank 0 before any of them is ready.
    json service = {
        {"apiVersion", "v1"},
        {"kind", "Service"},
        {"metadata", ObjectMeta(ctx, false)},
        {"spec",
         {{"clusterIP", "None"},
          {"publishNotReadyAddresses", true},
          {"selector", PodLabels(ctx)},
          {"ports", {{{"name", "rendezvous"}, {"port", kRendezvousPort}, {"protocol", "TCP"}}}}}}};
    out.push_back(service);
    extra.push_back(EnvEntry("MASTER_ADDR", fmt::format("{}-0.{}", ctx.name, ctx.name)));
    extra.push_back(EnvEntry("MASTER_PORT", std::to_string(kRendezvousPort)));
    extra.push_back(EnvEntry("WORLD_SIZE", std::to_string(workers)));
    extra.push_back({{"name", "RANK"},
                     {"valueFrom",
                      {{"fieldRef",
                        {{"fieldPath",
                          "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}}}});
    extra.push_back(EnvEntry("LOCAL_RANK", "0"));
  }

  json pod = WorkerPodSpec(ctx, WorkerCommand(ctx, launcher), std::move(extra));
  pod["restartPolicy"] = "Never";
  if (workers > 1) pod["subdomain"] = ctx.name;

  json spec = {
      // Kueue admits the Job by clearing suspend; created running, it would start before
      // admission.
      {"suspend", true},
      {"parallelism", workers},
      {"completions", workers},
      // tau's retry policy decides about another attempt; a Kubernetes retry would bypass it.
      {"backoffLimit", 0},
      {"ttlSecondsAfterFinished", s.ttl_seconds_after_finished.value_or(28800)},
      {"template", {{"metadata", WorkerTemplateMeta(ctx)}, {"spec", pod}}}};
  if (workers > 1) spec["completionMode"] = "Indexed";
  if (run.max_runtime_ms) spec["activeDeadlineSeconds"] = (*run.max_runtime_ms + 999) / 1000;

  out.push_back({{"apiVersion", "batch/v1"},
                 {"kind", "Job"},
                 {"metadata", ObjectMeta(ctx, true)},
                 {"spec", spec}});
  return out;
}

}  // namespace tau::kube::internal
