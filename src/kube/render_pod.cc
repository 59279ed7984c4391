// What every pod of a run has in common: the checks rendering needs beyond resolution, names and
// labels, env, volumes and the setup init container.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "common/strings.h"
#include "kube/internal.h"
#include "spec/workflow.h"

namespace tau::kube::internal {
namespace {

// Names of tau's own pod volumes; a platform storage volume may not take one.
constexpr const char* kCodeVolume = "tau-code";
constexpr const char* kPipVolume = "tau-pip";
constexpr const char* kScratchVolume = "tau-scratch";
constexpr const char* kShmVolume = "tau-shm";
constexpr const char* kMetricsVolume = "tau-metrics";

// The setup script of the init container. Its inputs come as arguments (the code archive, in
// pieces) and env (directories, requirements), never spliced into the script, so no quoting of
// user text is involved.
constexpr const char* kSetupScript = R"(set -eu
if [ "$#" -gt 0 ]; then
  printf '%s' "$@" | base64 -d | tar -x -o -f - -C /tau/code
fi
printf '%s\n' "${TAU_MAKE_DIRS:-}" | while IFS= read -r dir; do
  if [ -n "$dir" ]; then mkdir -p "$dir"; fi
done
if [ -n "${TAU_PIP_REQUIREMENTS:-}" ]; then
  printf '%s\n' "$TAU_PIP_REQUIREMENTS" > /tau/pip/requirements.txt
  python3 -m pip install --no-cache-dir --target /tau/pip -r /tau/pip/requirements.txt
fi
)";

// The metrics sidecar's script: it prints the metrics file as it grows. Asked to stop (the
// worker has ended), it gives tail a moment to print the worker's last lines first.
constexpr const char* kMetricsScript = R"(: >> "$TAU_METRICS_FILE"
tail -n +1 -F "$TAU_METRICS_FILE" 2>/dev/null &
trap 'sleep 2; kill "$!" 2>/dev/null' TERM
wait
wait
)";

bool IsDns1035Label(std::string_view s) {
  return IsDns1123Label(s) && s.front() >= 'a' && s.front() <= 'z';
}

// Secret keys are [-._a-zA-Z0-9]+.
bool IsSecretKey(std::string_view s) {
  return !s.empty() && s.size() <= 253 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

json EnvEntry(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

// Later settings replace earlier ones of the same name in place, so tau's variables win over the
// spec's and no name appears twice.
void SetEnv(std::vector<json>& env, json entry) {
  for (json& e : env) {
    if (e["name"] == entry["name"]) {
      e = std::move(entry);
      return;
    }
  }
  env.push_back(std::move(entry));
}

std::string JoinDir(const std::string& base, const std::string& sub) {
  return base.back() == '/' ? base + sub : base + "/" + sub;
}

// policy.topology against the platform's topology levels: which level the workers' pods must
// (or should) share, as Kueue's topology-aware scheduling places them.
Status PlaceTopology(const policy::Platform& platform, RunContext* ctx) {
  const std::string& placement = ctx->run->topology;
  // One pod is in one domain at every level, whatever the cluster: nothing to ask of it.
  if (ctx->run->workers <= 1) return Status::Ok();
  std::string level;
  bool required = true;
  if (placement == "single-node-nvlink" || placement == "same-host") {
    level = "host";
  } else if (placement == "same-accelerator-domain") {
    level = "accelerator-domain";
  } else if (placement == "same-network-domain") {
    level = "network-domain";
  } else if (placement == "same-site") {
    level = "site";
  } else if (placement == "multi-node-nccl") {
    // As close as the cluster allows: the narrowest level above the host, preferred (Kueue
    // widens the domain when the pods do not fit in one).
    required = false;
    for (const policy::TopologyLevel& t : platform.topology)
      if (t.level != "host" || level.empty()) level = t.level;
  } else {
    return Status::Ok();  // independent, elastic-workers, unconstrained
  }
  std::vector<std::string> defined;
  for (const policy::TopologyLevel& t : platform.topology) {
    defined.push_back(t.level);
    if (t.level != level) continue;
    ctx->topology_annotation =
        required ? kAnnotationRequiredTopology : kAnnotationPreferredTopology;
    ctx->topology_label = t.node_label;
    return Status::Ok();
  }
  return InvalidArgument(fmt::format(
      "policy.topology: '{}' needs the cluster's {} level, and the platform {}; an admin adds it "
      "to platform.yaml's topology (levels and their node labels, for Kueue's topology-aware "
      "scheduling), or the run uses policy.topology: independent",
      placement, level.empty() ? std::string("topology") : "'" + level + "'",
      defined.empty() ? std::string("defines no topology")
                      : "defines only " + Join(defined, ", ")));
}

// A service's model: the trained run's checkpoint or output directory on the workspace's storage,
// mounted read-only at kModelDir (a subPath of its volume: the replicas see that directory only).
Status PlaceModel(const policy::Platform& platform, const policy::Workspace& workspace,
                  RunContext* ctx) {
  const ServiceRenderOptions& o = *ctx->service;
  const spec::Serve* serve = ctx->spec->serve ? &*ctx->spec->serve : nullptr;
  ctx->model_run = !o.model_run.empty() ? o.model_run : serve != nullptr ? serve->from_run : "";
  if (ctx->model_run.empty()) return Status::Ok();
  const std::string role = serve != nullptr && serve->model == "output" ? "output" : "checkpoint";
  std::string path = o.model_path;
  if (!StartsWith(path, "/")) {
    // Relative to this service's own storage of the model's kind, where the workspace keeps its
    // runs' directories (MOUNT/RUN/checkpoints, MOUNT/RUN/output).
    const std::string& mount = role == "output" ? ctx->output_mount : ctx->checkpoint_mount;
    if (mount.empty()) {
      return InvalidArgument(fmt::format(
          "serve.from_run: the model of run '{}' is its {} directory, and this service has no {} "
          "storage to find it on (only pod-local scratch); give the workspace a default_{} "
          "volume with a pvc in platform.yaml, or set storage.{} to the volume the run wrote to",
          ctx->model_run, role, role, role, role));
    }
    if (path.empty()) path = ctx->model_run + (role == "output" ? "/output" : "/checkpoints");
    path = JoinDir(mount, path);
  }
  const std::vector<std::string> parts = Split(path, '/');
  if (std::find(parts.begin(), parts.end(), "..") != parts.end()) {
    return InvalidArgument(
        fmt::format("serve.from_run: the model's path '{}' has '..'; give the path of the run's "
                    "checkpoint or output directory itself",
                    path));
  }
  // The workspace's volume that holds the path (the longest mount path above it), with a PVC.
  const policy::StorageVolume* volume = nullptr;
  std::vector<std::string> mounts;
  for (const std::string& name : workspace.storage) {
    const policy::StorageVolume* v = platform.FindStorage(name);
    if (v == nullptr || v->mount_path.empty() || v->pvc.empty()) continue;
    mounts.push_back(fmt::format("{} ({})", v->mount_path, v->name));
    const std::string& m = v->mount_path;
    bool under = path == m || (StartsWith(path, m) && (m.back() == '/' || path[m.size()] == '/'));
    if (!under) continue;
    // Of two volumes mounted at the same path, the one this service mounts (its own storage).
    bool mounted = std::any_of(ctx->storage_mounts.begin(), ctx->storage_mounts.end(),
                               [&](const MountUse& u) { return u.volume == v->name; });
    if (volume == nullptr || m.size() > volume->mount_path.size() ||
        (m.size() == volume->mount_path.size() && mounted)) {
      volume = v;
    }
  }
  if (volume == nullptr) {
    return InvalidArgument(fmt::format(
        "serve.from_run: the model of run '{}' at '{}' is on none of workspace '{}''s storage "
        "volumes with a pvc (mount paths: {}); serve a run of this workspace whose {}s are on "
        "its storage",
        ctx->model_run, path, workspace.name, mounts.empty() ? "none" : Join(mounts, ", "), role));
  }
  std::string sub = path.substr(volume->mount_path.size());
  while (!sub.empty() && sub.front() == '/') sub.erase(0, 1);
  while (!sub.empty() && sub.back() == '/') sub.pop_back();
  ctx->model_mount = {volume->name, kModelDir, sub, true};
  // The run's own storage may already bring the volume (read-write, for its checkpoints): the
  // model's mount is read-only all the same. Otherwise the volume joins the pod read-only.
  bool present = std::any_of(ctx->storage_volumes.begin(), ctx->storage_volumes.end(),
                             [&](const json& v) { return v["name"] == volume->name; });
  if (!present) {
    ctx->model_volume = {
        {"name", volume->name},
        {"persistentVolumeClaim", {{"claimName", volume->pvc}, {"readOnly", true}}}};
  }
  return Status::Ok();
}

}  // namespace

Result<RunContext> MakeContext(const spec::RunSpec& spec, const policy::ResolvedRun& run,
                               const policy::Platform& platform, const RenderOptions& options,
                               const ServiceRenderOptions* service) {
  RunContext ctx;
  ctx.spec = &spec;
  ctx.run = &run;
  ctx.options = &options;
  ctx.service = service;
  std::vector<std::string> errors;

  const policy::Workspace* workspace = platform.FindWorkspace(run.workspace);
  if (workspace == nullptr) {
    return InvalidArgument(fmt::format(
        "workspace '{}' is not in this platform; resolve the run against the platform it is "
        "rendered for",
        run.workspace));
  }
  if (options.attempt < 1) return InvalidArgument("attempt numbers start at 1");

  if (service != nullptr) {
    ctx.run_name = service->service_name.empty() ? spec.name : service->service_name;
  } else {
    ctx.run_name = options.run_name.empty() ? spec.name : options.run_name;
  }
  std::string base =
      spec.resource_prefix.empty() ? ctx.run_name : spec.resource_prefix + "-" + ctx.run_name;
  // A service's objects live as long as it does, across its revisions: no attempt in the name.
  ctx.name = service != nullptr ? base : fmt::format("{}-{}", base, options.attempt);
  if (!IsDns1035Label(ctx.name) || ctx.name.size() > kMaxObjectNameLength) {
    errors.push_back(fmt::format(
        "name: the {}'s Kubernetes object would be named '{}' ({} characters); it must start "
        "with a lowercase letter, hold only lowercase letters, digits and '-', and have at most "
        "{} characters (KubeRay derives longer names from it): choose a shorter name{}",
        service != nullptr ? "service" : "run", ctx.name, ctx.name.size(), kMaxObjectNameLength,
        spec.resource_prefix.empty() ? "" : " or resource_naming.prefix"));
  }

  // The workspace's namespace holds its LocalQueues and its members' RBAC; a run elsewhere would
  // wait forever for a queue that does not exist there.
  ctx.namespace_name =
      options.namespace_name.empty() ? WorkspaceNamespace(*workspace) : options.namespace_name;
  if (!spec.policy.namespace_name.empty() && spec.policy.namespace_name != ctx.namespace_name) {
    errors.push_back(fmt::format(
        "policy.namespace: '{}' is not the namespace of workspace '{}' ('{}'), where its queues "
        "are; drop policy.namespace, or name the workspace that owns that namespace",
        spec.policy.namespace_name, workspace->name, ctx.namespace_name));
  }

  ctx.image = !spec.runtime.image.empty() ? spec.runtime.image : options.default_image;
  if (ctx.image.empty()) {
    errors.push_back(
        "runtime.image: a run on Kubernetes needs a container image; give runtime.image (the "
        "local backend runs on the host and needs none)");
  } else if (spec.runtime.image.empty() && !workspace->allowed_images.empty() &&
             std::none_of(workspace->allowed_images.begin(), workspace->allowed_images.end(),
                          [&](const std::string& p) { return policy::GlobMatch(p, ctx.image); })) {
    errors.push_back(
        fmt::format("runtime.image: the default image '{}' is not allowed in workspace '{}' "
                    "(allowed_images: {}); give runtime.image",
                    ctx.image, workspace->name, Join(workspace->allowed_images, ", ")));
  }

  if (!spec.compute.gpu_resource_mode.empty() && spec.compute.gpu_resource_mode != "full") {
    errors.push_back(fmt::format(
        "compute.gpu_resource_mode: '{}' is not supported on Kubernetes yet (whole GPUs only, "
        "as nvidia.com/gpu); remove it or use 'full'",
        spec.compute.gpu_resource_mode));
  }
  if (!spec.storage.image_assets.empty() && spec.kind != spec::WorkloadKind::kJob) {
    errors.push_back(
        "storage.image_assets: only an engine job stages files from images (Ray ships code "
        "through its runtime env); build the assets into runtime.image or use engine: job");
  }
  for (const spec::ImageAsset& a : spec.storage.image_assets) {
    // An asset is meant to be the same on every attempt: a tag could move under it.
    if (a.image.find("@sha256:") == std::string::npos)
      errors.push_back(
          fmt::format("storage.image_assets[{}].image: '{}' is not pinned; give it by digest "
                      "(IMAGE@sha256:...), so that every attempt gets the same files",
                      a.name, a.image));
  }
  for (const spec::EnvVar& var : spec.runtime.env) {
    if (var.secret_ref && !IsSecretKey(var.value)) {
      errors.push_back(fmt::format(
          "runtime.env.{}: 'SECRET:{}' is not a valid Secret key (letters, digits, '-', '_', "
          "'.')",
          var.name, var.value));
    }
  }

  ctx.gpus = run.gpus_per_worker > 0;
  ctx.node_selector = run.node_selector;
  // A run that can land on one flavor only is pinned to its nodes now; Kueue would add the same
  // labels on admission, and a pod that says so up front reads the same before and after.
  if (run.flavors.size() == 1) {
    if (const admission::ResourceFlavor* f = platform.FindFlavor(run.flavors.front())) {
      for (const auto& [k, v] : f->node_labels) {
        auto [it, inserted] = ctx.node_selector.emplace(k, v);
        if (!inserted && it->second != v) {
          errors.push_back(
              fmt::format("policy.node_selector: {}={} conflicts with flavor '{}' ({}={})", k,
                          it->second, f->name, k, v));
        }
      }
    }
  }

  // Storage: one pod volume per platform volume, one mount per distinct path.
  std::set<std::string> reserved = {kCodeVolume, kPipVolume, kScratchVolume, kShmVolume};
  std::set<std::string> added_volumes;
  for (const policy::Mount& m : run.mounts) {
    if (m.pvc.empty()) {
      errors.push_back(fmt::format(
          "storage.{}: storage volume '{}' has no pvc, so Kubernetes cannot mount it; give it "
          "`pvc:` in platform.yaml",
          m.role == "data" ? "data_pvc" : m.role, m.volume));
      continue;
    }
    if (reserved.count(m.volume)) {
      errors.push_back(fmt::format(
          "storage volume '{}': the name is reserved for tau's own pod volumes; rename it in "
          "platform.yaml",
          m.volume));
      continue;
    }
    if (added_volumes.insert(m.volume).second) {
      ctx.storage_volumes.push_back(
          {{"name", m.volume}, {"persistentVolumeClaim", {{"claimName", m.pvc}}}});
    }
    auto same = std::find_if(ctx.storage_mounts.begin(), ctx.storage_mounts.end(),
                             [&](const MountUse& u) { return u.mount_path == m.mount_path; });
    if (same == ctx.storage_mounts.end()) {
      ctx.storage_mounts.push_back({m.volume, m.mount_path, m.sub_path, m.read_only});
    } else if (same->volume != m.volume || same->sub_path != m.sub_path) {
      errors.push_back(fmt::format(
          "storage.{}: mounts '{}' at {}, where another of the run's volumes is mounted; give "
          "it another path",
          m.role == "data" ? "data_pvc" : m.role, m.volume, m.mount_path));
    } else {
      same->read_only = same->read_only && m.read_only;
    }
    // Checkpoints and outputs go into a directory of the run's own, the same on every attempt.
    if (m.role == "checkpoint") {
      ctx.checkpoint_mount = m.mount_path;
      ctx.checkpoint_dir = JoinDir(m.mount_path, ctx.run_name + "/checkpoints");
    }
    if (m.role == "output") {
      ctx.output_mount = m.mount_path;
      ctx.output_dir = JoinDir(m.mount_path, ctx.run_name + "/output");
    }
    if (m.role == "data") ctx.data_dir = m.mount_path;
  }
  if (ctx.checkpoint_dir.empty()) {
    ctx.checkpoint_dir = std::string(kScratchDir) + "/checkpoints";
    ctx.uses_scratch = true;
  }
  if (ctx.output_dir.empty()) {
    ctx.output_dir = std::string(kScratchDir) + "/output";
    ctx.uses_scratch = true;
  }

  if (!spec.source.image.empty()) {
    // The code is the image's: the submitted directory is not shipped.
    // The parser has checked it: an engine job's, with an image and an absolute path.
    ctx.code_from_image = true;
  } else if (!options.code.empty()) {
    auto chunks = CodeArchive(options.code);
    if (!chunks.ok()) {
      errors.push_back(chunks.status().message());
    } else {
      ctx.code_chunks = std::move(*chunks);
    }
  }
  if (Status s = PlaceTopology(platform, &ctx); !s.ok()) errors.push_back(s.message());
  if (service != nullptr) {
    if (Status s = PlaceModel(platform, *workspace, &ctx); !s.ok()) errors.push_back(s.message());
  }
  if (!errors.empty()) return InvalidArgument(Join(errors, "\n"));
  return ctx;
}

json WorkerTemplateMeta(const RunContext& ctx) {
  json meta = {{"labels", PodLabels(ctx)}};
  if (!ctx.topology_annotation.empty())
    meta["annotations"] = {{ctx.topology_annotation, ctx.topology_label}};
  return meta;
}

json ObjectMeta(const RunContext& ctx, bool kueue) {
  json labels = {{kLabelManagedBy, "tau"}, {kLabelWorkspace, ctx.run->workspace}};
  if (ctx.service != nullptr) {
    labels[kLabelService] = ctx.run_name;
  } else {
    labels[kLabelRun] = ctx.run_name;
    labels[kLabelAttempt] = std::to_string(ctx.options->attempt);
  }
  if (!ctx.options->installation.empty()) labels[kLabelInstallation] = ctx.options->installation;
  json annotations = {{kAnnotationConfigHash, spec::ConfigHash(*ctx.spec)}};
  if (ctx.service != nullptr) {
    annotations[kAnnotationRevision] = std::to_string(ctx.service->revision);
    if (!ctx.model_run.empty()) annotations[kAnnotationModelRun] = ctx.model_run;
  }
  if (kueue) {
    labels[kKueueQueueLabel] = ctx.run->queue;
    if (!ctx.run->priority_class.empty()) labels[kKueuePriorityLabel] = ctx.run->priority_class;
    const spec::RunSpec& s = *ctx.spec;
    if (!ctx.run->gpu_class.empty()) labels[ctx.run->node_labels.gpu_class] = ctx.run->gpu_class;
    // The placement as written, for people; Kueue reads it from the pod template (PlaceTopology).
    if (!ctx.run->topology.empty()) annotations["tau.dev/topology"] = ctx.run->topology;
    if (!s.experiment.project.empty())
      annotations["tau.dev/experiment-project"] = s.experiment.project;
    if (!s.experiment.name.empty()) annotations["tau.dev/experiment-name"] = s.experiment.name;
    if (!s.experiment.group.empty()) annotations["tau.dev/experiment-group"] = s.experiment.group;
  }
  return {{"name", ctx.name},
          {"namespace", ctx.namespace_name},
          {"labels", labels},
          {"annotations", annotations}};
}

json PodResourcesJson(const policy::PodResources& p) {
  return Resources(p.cpus, p.memory, p.cpu_limit, p.memory_limit, p.gpus);
}

json PodLabels(const RunContext& ctx) {
  json labels = {{kLabelWorkspace, ctx.run->workspace}};
  if (ctx.service != nullptr) {
    // A replica is no run's attempt: the Kubernetes backend follows pods labelled tau.dev/run.
    labels[kLabelService] = ctx.run_name;
    labels[kLabelManagedBy] = "tau";
  } else {
    labels[kLabelRun] = ctx.run_name;
    labels[kLabelAttempt] = std::to_string(ctx.options->attempt);
  }
  if (!ctx.options->installation.empty()) labels[kLabelInstallation] = ctx.options->installation;
  return labels;
}

json PodSpecBase(const RunContext& ctx, bool pip, bool gpu_pod) {
  json spec = json::object();
  json volumes = json::array();
  if (!ctx.code_chunks.empty() || ctx.code_from_image)
    volumes.push_back({{"name", kCodeVolume}, {"emptyDir", json::object()}});
  if (pip) volumes.push_back({{"name", kPipVolume}, {"emptyDir", json::object()}});
  if (ctx.uses_scratch) volumes.push_back({{"name", kScratchVolume}, {"emptyDir", json::object()}});
  // PyTorch's data loader workers and NCCL share memory through /dev/shm; a container runtime's
  // default is 64 MiB.
  volumes.push_back({{"name", kShmVolume}, {"emptyDir", {{"medium", "Memory"}}}});
  for (const json& v : ctx.storage_volumes) volumes.push_back(v);
  if (!ctx.model_volume.is_null()) volumes.push_back(ctx.model_volume);
  spec["volumes"] = volumes;
  // A GPU run's pods without GPUs (its control-only Ray head) keep off the GPU nodes: only the
  // spec's own selector applies to them, and they do not tolerate the GPU taint.
  const bool head_of_gpu_run = ctx.gpus && !gpu_pod;
  const std::map<std::string, std::string>& selector =
      head_of_gpu_run ? ctx.spec->policy.node_selector : ctx.node_selector;
  if (!selector.empty()) spec["nodeSelector"] = selector;
  // GPU nodes are usually tainted nvidia.com/gpu.
  if (gpu_pod) {
    spec["tolerations"] = json::array(
        {{{"key", policy::kGpuResource}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
  }
  if (ctx.spec->runtime.security_mode == "restricted") {
    spec["securityContext"] = {{"runAsNonRoot", true},
                               {"runAsUser", 65532},
                               {"runAsGroup", 65532},
                               {"fsGroup", 65532},
                               {"seccompProfile", {{"type", "RuntimeDefault"}}}};
  }
  return spec;
}

json VolumeMounts(const RunContext& ctx, bool pip) {
  json mounts = json::array();
  if (!ctx.code_chunks.empty() || ctx.code_from_image)
    mounts.push_back({{"name", kCodeVolume}, {"mountPath", kCodeDir}});
  if (pip) mounts.push_back({{"name", kPipVolume}, {"mountPath", kPipDir}});
  if (ctx.uses_scratch) mounts.push_back({{"name", kScratchVolume}, {"mountPath", kScratchDir}});
  mounts.push_back({{"name", kShmVolume}, {"mountPath", "/dev/shm"}});
  for (const MountUse& m : ctx.storage_mounts) {
    json mount = {{"name", m.volume}, {"mountPath", m.mount_path}};
    if (!m.sub_path.empty()) mount["subPath"] = m.sub_path;
    if (m.read_only) mount["readOnly"] = true;
    mounts.push_back(mount);
  }
  return mounts;
}

json ModelMount(const RunContext& ctx) {
  if (ctx.model_run.empty()) return nullptr;
  const MountUse& m = ctx.model_mount;
  json mount = {{"name", m.volume}, {"mountPath", m.mount_path}, {"readOnly", true}};
  if (!m.sub_path.empty()) mount["subPath"] = m.sub_path;
  return mount;
}

namespace {
json ContainerSecurity(const RunContext& ctx) {
  return {{"allowPrivilegeEscalation", false}, {"capabilities", {{"drop", {"ALL"}}}}};
}
}  // namespace

json SetupContainer(const RunContext& ctx, bool pip, const json& resources) {
  const bool has_pip = pip && !ctx.spec->runtime.pip.empty();
  std::vector<std::string> dirs = {ctx.checkpoint_dir, ctx.output_dir};
  json args = json::array({"-c", kSetupScript, kSetupContainer});
  for (const std::string& chunk : ctx.code_chunks) args.push_back(chunk);
  // No GPUs: it asks for none, and an image that says NVIDIA_VISIBLE_DEVICES=all (CUDA's do)
  // would otherwise see every GPU of the node while it runs pip, next to other runs' work.
  json env = json::array(
      {EnvEntry("TAU_MAKE_DIRS", Join(dirs, "\n")), EnvEntry("NVIDIA_VISIBLE_DEVICES", "void")});
  if (has_pip) env.push_back(EnvEntry("TAU_PIP_REQUIREMENTS", Join(ctx.spec->runtime.pip, "\n")));
  json c = {{"name", kSetupContainer},
            {"image", ctx.image},
            {"command", {"sh"}},
            {"args", args},
            {"env", env},
            {"volumeMounts", VolumeMounts(ctx, has_pip)}};
  // The same CPU and memory as the workload: Kueue and the scheduler charge a pod the larger of
  // its init and regular containers, so this adds nothing to the run's quota.
  json setup_resources = resources;
  for (const char* part : {"requests", "limits"}) {
    if (setup_resources.contains(part)) setup_resources[part].erase(policy::kGpuResource);
    if (setup_resources.contains(part) && setup_resources[part].empty())
      setup_resources.erase(part);
  }
  if (!setup_resources.empty()) c["resources"] = setup_resources;
  if (ctx.spec->runtime.security_mode == "restricted")
    c["securityContext"] = ContainerSecurity(ctx);
  return c;
}

json MetricsVolume() { return {{"name", kMetricsVolume}, {"emptyDir", json::object()}}; }

json MetricsMount() { return {{"name", kMetricsVolume}, {"mountPath", kMetricsDir}}; }

json MetricsSidecar(const RunContext& ctx) {
  // No requests: a sidecar's would add to the pod's, so to what Kueue charges the run's quota.
  json c = {
      {"name", kMetricsContainer},
      {"image", ctx.image},
      {"restartPolicy", "Always"},
      {"command", {"sh"}},
      {"args", {"-c", kMetricsScript, kMetricsContainer}},
      {"env",
       {EnvEntry("TAU_METRICS_FILE", kMetricsFile), EnvEntry("NVIDIA_VISIBLE_DEVICES", "void")}},
      {"volumeMounts", {MetricsMount()}}};
  if (ctx.spec->runtime.security_mode == "restricted")
    c["securityContext"] = ContainerSecurity(ctx);
  return c;
}

json CopyContainer(const RunContext& ctx, const std::string& name, const std::string& image,
                   const std::string& from, const std::string& volume, const std::string& into) {
  const std::string source = from.empty() ? "/" : from;
  json c = {{"name", name},
            {"image", image},
            {"command", {"/bin/cp", "-a", source + (source.back() == '/' ? "." : "/."), into}},
            {"volumeMounts", {{{"name", volume}, {"mountPath", into}}}}};
  // It copies files and needs no GPU, which an image that says NVIDIA_VISIBLE_DEVICES=all would
  // still be given by the NVIDIA runtime.
  c["env"] = json::array({EnvEntry("NVIDIA_VISIBLE_DEVICES", "void")});
  if (ctx.spec->runtime.security_mode == "restricted")
    c["securityContext"] = ContainerSecurity(ctx);
  return c;
}

json SourceContainer(const RunContext& ctx) {
  return CopyContainer(ctx, kSourceContainer, ctx.spec->source.image, ctx.spec->source.path,
                       kCodeVolume, kCodeDir);
}

json ContainerEnv(const RunContext& ctx, bool literal_env, bool gpu_container,
                  const std::vector<json>& extra) {
  std::vector<json> env;
  for (const spec::EnvVar& var : ctx.spec->runtime.env) {
    if (var.secret_ref) {
      SetEnv(env, {{"name", var.name},
                   {"valueFrom",
                    {{"secretKeyRef",
                      {{"name", var.secret_name.empty() ? kRunSecretName : var.secret_name},
                       {"key", var.value}}}}}});
    } else if (literal_env) {
      SetEnv(env, EnvEntry(var.name, var.value));
    }
  }
  if (ctx.service != nullptr) {
    SetEnv(env, EnvEntry("TAU_SERVICE_NAME", ctx.run_name));
    SetEnv(env, EnvEntry("TAU_SERVICE_REVISION", std::to_string(ctx.service->revision)));
    if (!ctx.model_run.empty()) {
      SetEnv(env, EnvEntry("TAU_SERVE_MODEL", kModelDir));
      SetEnv(env, EnvEntry("TAU_SERVE_MODEL_RUN", ctx.model_run));
    }
  } else {
    SetEnv(env, EnvEntry("TAU_RUN_NAME", ctx.run_name));
    SetEnv(env, EnvEntry("TAU_ATTEMPT", std::to_string(ctx.options->attempt)));
  }
  SetEnv(env, EnvEntry("TAU_CHECKPOINT_DIR", ctx.checkpoint_dir));
  SetEnv(env, EnvEntry("TAU_OUTPUT_DIR", ctx.output_dir));
  SetEnv(env, EnvEntry("TAU_METRICS_FILE", ctx.output_dir + "/metrics.jsonl"));
  if (!ctx.data_dir.empty()) SetEnv(env, EnvEntry("TAU_DATA_DIR", ctx.data_dir));
  if (ctx.options->array_index)
    SetEnv(env, EnvEntry("TAU_ARRAY_INDEX", std::to_string(*ctx.options->array_index)));
  for (const auto& [stage, run] : ctx.options->upstreams) {
    const std::string prefix = "TAU_UPSTREAM_" + spec::StageEnvName(stage);
    SetEnv(env, EnvEntry(prefix + "_RUN", run));
    // The upstream run's directories on the storage this pod mounts too (none on scratch).
    if (!ctx.checkpoint_mount.empty())
      SetEnv(env, EnvEntry(prefix + "_CHECKPOINT_DIR",
                           JoinDir(ctx.checkpoint_mount, run + "/checkpoints")));
    if (!ctx.output_mount.empty())
      SetEnv(env, EnvEntry(prefix + "_OUTPUT_DIR", JoinDir(ctx.output_mount, run + "/output")));
  }
  for (const json& e : extra) SetEnv(env, e);
  // Images built on NVIDIA's base images expose every GPU of the node unless told otherwise; a
  // container without GPUs must not see (and use) other pods' GPUs.
  if (!gpu_container) SetEnv(env, EnvEntry("NVIDIA_VISIBLE_DEVICES", "void"));
  SetEnv(env, EnvEntry("PYTHONUNBUFFERED", "1"));
  if (!ctx.options->resume_from.empty()) {
    SetEnv(env, EnvEntry("TAU_RESUME_FROM", ctx.options->resume_from));
  }
  if (!ctx.options->failure_reason.empty()) {
    SetEnv(env, EnvEntry("TAU_FAILURE_REASON", ctx.options->failure_reason));
  }
  return env;
}

json Resources(const std::optional<Quantity>& cpu, const std::optional<Quantity>& memory,
               const std::optional<Quantity>& cpu_limit,
               const std::optional<Quantity>& memory_limit, int gpus) {
  json requests = json::object(), limits = json::object();
  if (cpu) requests[policy::kCpuResource] = cpu->ToString();
  if (memory) requests[policy::kMemoryResource] = memory->ToString();
  if (cpu_limit) limits[policy::kCpuResource] = cpu_limit->ToString();
  // Memory is limited to what is requested unless the spec says otherwise: a run that outgrows
  // its request is OOM-killed (a clear failure class) instead of pressuring its node's neighbours.
  if (memory_limit) {
    limits[policy::kMemoryResource] = memory_limit->ToString();
  } else if (memory) {
    limits[policy::kMemoryResource] = memory->ToString();
  }
  if (gpus > 0) {
    requests[policy::kGpuResource] = std::to_string(gpus);
    limits[policy::kGpuResource] = std::to_string(gpus);
  }
  json out = json::object();
  if (!requests.empty()) out["requests"] = requests;
  if (!limits.empty()) out["limits"] = limits;
  return out;
}

// The spec's folder in the pod: the code directory, or the folder below it that an entrypoint such
// as ../train.py shipped the code above.
std::string SpecDir(const RunContext& ctx) {
  return ctx.run->code_subdir.empty() ? std::string(kCodeDir)
                                      : JoinDir(kCodeDir, ctx.run->code_subdir);
}

std::string WorkingDir(const RunContext& ctx) {
  if (!ctx.spec->runtime.working_dir.empty()) return ctx.spec->runtime.working_dir;
  if (ctx.code_from_image) return kCodeDir;
  return ctx.code_chunks.empty() ? "" : SpecDir(ctx);
}

std::vector<std::string> EntryArgv(const RunContext& ctx) {
  const std::string& entry = ctx.spec->entrypoint;
  // The entrypoint is relative to the spec's folder; the code's paths to its root.
  const std::string in_code =
      (std::filesystem::path(ctx.run->code_subdir) / entry).lexically_normal().string();
  // run.source: the image's code, not the submitted directory's, runs.
  const bool shipped =
      !ctx.code_from_image && std::any_of(ctx.options->code.begin(), ctx.options->code.end(),
                                          [&](const CodeFile& f) { return f.path == in_code; });
  // A shipped file is named by its absolute path when the container starts elsewhere.
  std::string path =
      shipped && WorkingDir(ctx) != SpecDir(ctx) ? JoinDir(kCodeDir, in_code) : entry;
  if (EndsWith(entry, ".py")) return {"python3", path};
  // Like the local backend: a shipped file runs from the code directory, anything else is a
  // command on PATH.
  return {shipped ? JoinDir(kCodeDir, in_code) : entry};
}

}  // namespace tau::kube::internal
