// Shared by the renderers of src/kube/: what every pod of a run has in common (names, labels, env,
// volumes, the setup init container), computed once per render.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/quantity.h"
#include "kube/kube.h"
#include "kube/service.h"

namespace tau::kube::internal {

using nlohmann::json;

// One volume mount of the run's pods (a platform storage volume or one of tau's own).
struct MountUse {
  std::string volume;  // pod volume name
  std::string mount_path;
  std::string sub_path;
  bool read_only = false;
};

struct RunContext {
  const spec::RunSpec* spec = nullptr;
  const policy::ResolvedRun* run = nullptr;
  const RenderOptions* options = nullptr;

  std::string run_name;  // tau's run name (labels, env)
  std::string name;      // the object's name: [prefix-]run-attempt
  std::string namespace_name;
  std::string image;
  std::vector<std::string> code_chunks;  // the base64 code archive in pieces; empty: no code
  bool code_from_image = false;          // run.source: the code is copied out of an image instead
  std::map<std::string, std::string> node_selector;
  bool gpus = false;  // whether the run's workers use GPUs
  std::string checkpoint_dir, output_dir, data_dir;
  // Where the checkpoint and output storage is mounted ("" on scratch): other runs' directories
  // are there too (a workflow stage's upstream runs).
  std::string checkpoint_mount, output_mount;
  std::vector<json> storage_volumes;  // pod volumes of platform storage
  std::vector<MountUse> storage_mounts;
  bool uses_scratch = false;  // checkpoints or outputs without a storage volume
  // policy.topology as Kueue topology-aware scheduling of the workers' pod set: the pod template
  // annotation (podset-required-topology or podset-preferred-topology) and its value, the node
  // label of the platform's level; "" when the placement asks nothing of the cluster.
  std::string topology_annotation, topology_label;

  // A service (RenderService): its options, or null for a run. The objects, pod labels and env
  // are then the service's (tau.dev/service, TAU_SERVICE_NAME) instead of a run's attempt's.
  const ServiceRenderOptions* service = nullptr;
  // A service's model (ServiceRenderOptions::model_run; "" : none): its read-only mount at
  // kModelDir, and the pod volume it is on when the run's own storage does not bring that volume
  // (null otherwise).
  std::string model_run;
  MountUse model_mount;
  json model_volume;
};

// The workers' pod template metadata: their labels, and the topology annotation when there is one.
json WorkerTemplateMeta(const RunContext& ctx);

// Checks what rendering needs beyond resolution and gathers the common parts. `service` set: the
// context of a service's objects (named after the service, no attempt), its model placed.
Result<RunContext> MakeContext(const spec::RunSpec& spec, const policy::ResolvedRun& run,
                               const policy::Platform& platform, const RenderOptions& options,
                               const ServiceRenderOptions* service = nullptr);

// Metadata of the top-level object: Kueue's queue and priority labels, tau's labels and the config
// hash. `kueue` false for helper objects (the gang's Service).
json ObjectMeta(const RunContext& ctx, bool kueue);
// Labels of the run's pods.
json PodLabels(const RunContext& ctx);

// The pod fields shared by every pod of the run: volumes, node selector, tolerations, security
// context. `pip` adds the volume pip installs into (Jobs; Ray installs pip itself).
json PodSpecBase(const RunContext& ctx, bool pip, bool gpu_pod);
// The volume mounts of a workload container.
json VolumeMounts(const RunContext& ctx, bool pip);
// A service's model, read-only at kModelDir: the workload containers' mount (the setup's has
// none); null when there is no model.
json ModelMount(const RunContext& ctx);
// The init container that unpacks the code, makes the checkpoint and output directories and (for
// Jobs) installs pip requirements; null when there is nothing to do.
json SetupContainer(const RunContext& ctx, bool pip, const json& resources);
// The native sidecar that prints what the worker appends to kMetricsFile (its log is the pod's
// metrics), the volume it shares with the worker, and the worker's mount of it.
json MetricsSidecar(const RunContext& ctx);
// An init container `name` that copies the files under `from` in `image` into `volume`, mounted
// at `into` (storage.image_assets, run.source's code).
json CopyContainer(const RunContext& ctx, const std::string& name, const std::string& image,
                   const std::string& from, const std::string& volume, const std::string& into);
// run.source: the init container that copies the code out of its image into the code volume.
json SourceContainer(const RunContext& ctx);
json MetricsVolume();
json MetricsMount();

// Container env: the spec's env (secret references become secretKeyRef), then tau's variables,
// then `extra` (launcher variables). `literal_env` false leaves the spec's literal values out (Ray
// gets them through its runtime env).
json ContainerEnv(const RunContext& ctx, bool literal_env, bool gpu_container,
                  const std::vector<json>& extra);

// Resources() of a resolved pod.
json PodResourcesJson(const policy::PodResources& p);

// requests/limits; GPUs go into both, as Kubernetes requires of extended resources.
json Resources(const std::optional<Quantity>& cpu, const std::optional<Quantity>& memory,
               const std::optional<Quantity>& cpu_limit,
               const std::optional<Quantity>& memory_limit, int gpus);

// The entrypoint as argv for a Job container (no launcher in front).
std::vector<std::string> EntryArgv(const RunContext& ctx);
// The working directory of workload containers; "" for the image's own.
std::string WorkingDir(const RunContext& ctx);

// A tar archive (ustar, mtime 0, sorted paths) of the files, base64-encoded and cut in pieces short
// enough to be single exec arguments.
Result<std::vector<std::string>> CodeArchive(const std::vector<CodeFile>& files);

// The words a Job's worker (or a service's replica) runs, for the kubelet: the entrypoint and the
// spec's args, each passed on as written (its '$' doubled); `launcher` the words in front
// (torchrun's), passed as they are.
std::vector<std::string> WorkerCommand(const RunContext& ctx,
                                       const std::vector<std::string>& launcher);
// The pod of a Job's worker and of a service's replica: the `worker` container running `command`
// with ContainerEnv(extra) (plus pip's PYTHONPATH and the metrics file), the code and pip setup,
// run.source and image assets' init containers, the metrics sidecar and their volumes. The
// caller sets restartPolicy and what is its own (a Job's subdomain, a replica's ports and
// probes on containers[0]).
json WorkerPodSpec(const RunContext& ctx, const std::vector<std::string>& command,
                   std::vector<json> extra);

// A rayjob's Ray cluster (a RayJob's rayClusterSpec, a RayService's rayClusterConfig): a
// control-only head and one worker group of the run's workers. `driver` the head runs the
// entrypoint as the Ray driver (a RayJob: its metrics sidecar and file); else (a RayService) the
// head and the workers declare the Serve port `serve_port` (KubeRay's serve Service and probes
// read it from the port named "serve").
json RayClusterSpec(const RunContext& ctx, bool driver, int serve_port);
// Ray's runtime env of the run: the spec's literal env (env_vars) and pip requirements; secrets
// stay in the pods' env. Empty when there are none.
json RayRuntimeEnv(const RunContext& ctx);

std::vector<json> RenderJob(const RunContext& ctx);  // [Service,] Job
json RenderRayJob(const RunContext& ctx);            // RayJob

}  // namespace tau::kube::internal
