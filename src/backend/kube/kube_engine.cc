// The Kubernetes engine's registration (engines/engines.h): Jobs and RayJobs admitted by Kueue on
// the cluster its kubeconfig names (in a pod, its service account's).
#include <fmt/format.h>

#include "backend/kube/kube_backend.h"
#include "backend/kube/kube_cluster.h"
#include "common/strings.h"
#include "kube/kube.h"
#include "kubeapi/kubeapi.h"

namespace tau::server {

Capabilities KubeCapabilities() {
  Capabilities caps;
  caps.own_secrets = true;
  caps.runs_images = true;
  caps.kube_objects = true;
  return caps;
}

namespace {

Result<EngineMade> MakeKube(const EngineInputs& in) {
  auto option = [&in](const char* name) {
    auto it = in.options.find(name);
    return it == in.options.end() ? std::string() : it->second;
  };
  const std::string kubeconfig = option("kubeconfig"), context = option("context");
  auto config = kubeconfig.empty() ? kubeapi::LoadDefaultConfig(context)
                                   : kubeapi::LoadKubeconfig(kubeconfig, context);
  if (!config.ok()) return config.status();
  // Creating and deleting objects happens off the decision thread, one lane per namespace with
  // a budget per call (call_lanes.h); a request still waits at most this long.
  kubeapi::ClientOptions client_options;
  client_options.max_attempts = 3;
  client_options.connect_timeout_ms = 3000;
  client_options.request_timeout_ms = 15000;
  // The client outlives the cluster that uses it (members go in reverse order).
  struct Owned {
    std::unique_ptr<kubeapi::Client> client;
    std::unique_ptr<Cluster> cluster;
  };
  auto owned = std::make_shared<Owned>();
  TAU_ASSIGN_OR_RETURN(owned->client, kubeapi::Client::Create(std::move(*config), client_options));
  kubeapi::Client* client = owned->client.get();
  KubeClusterOptions kopts;
  kopts.default_image = option("default-image");
  kopts.check_access = option("kube-check-access") == "true";
  kopts.installation = option("kube-installation");
  owned->cluster = NewKubeCluster(client, kopts);
  EngineMade made;
  made.backend = NewKubeBackend(owned->cluster.get());
  made.owned = std::move(owned);
  if (in.log) in.log(fmt::format("kubernetes backend: API server {}", client->config().server));
  if (!in.platform_file) {
    // No platform: a baseline the size of the cluster's schedulable nodes, applied at start (a
    // bare cluster has no queue for runs to name).
    auto nodes = client->List("v1", "Node", "");
    if (nodes.ok()) {
      kube::ClusterSize size = kube::NodesAllocatable(nodes->items);
      made.default_platform_size = PlatformSize{size.gpus, size.cpu_milli, size.memory_bytes};
      if (in.log)
        in.log(
            fmt::format("kubernetes backend: no platform given; the baseline (one queue `default`) "
                        "is sized to the cluster's {} schedulable nodes: {} CPUs, {} GPUs",
                        size.nodes, size.cpu_milli / 1000, size.gpus));
    } else if (in.log) {
      in.log("kubernetes backend: no platform given, and the cluster's nodes cannot be read (" +
             nodes.status().message() + "): give one with --platform or `tau platform apply`");
    }
  }
  return made;
}

}  // namespace

Engine KubeEngine() {
  Engine e;
  e.name = "kubernetes";
  e.description = "Jobs and RayJobs admitted by Kueue; docs/kubernetes.md";
  e.caps = KubeCapabilities();
  auto option = [&e](std::string name, std::string help, bool flag) -> EngineOption& {
    EngineOption o;
    o.name = std::move(name);
    o.help = std::move(help);
    o.flag = flag;
    e.options.push_back(std::move(o));
    return e.options.back();
  };
  option("kubeconfig",
         "the kubeconfig (default $KUBECONFIG, ~/.kube/config, else the pod's service account)",
         false);
  option("context", "the kubeconfig context", false);
  option("default-image", "the image of runs whose spec names none (runtime.image)", false);
  option("kube-check-access",
         "refuse submitters whom the cluster's RBAC does not allow to create the run's Job or "
         "RayJob in its namespace (SubjectAccessReview)",
         true);
  option("kube-installation",
         "this installation's name, labelled on what it creates; it never adopts another "
         "installation's objects (the chart: its release name)",
         false)
      .check = [](const std::string& name) {
    return name.empty() || IsLabelValue(name)
               ? std::string()
               : "a label value: at most 63 letters, digits, '-', '_' or '.'";
  };
  e.make = MakeKube;
  return e;
}

}  // namespace tau::server
