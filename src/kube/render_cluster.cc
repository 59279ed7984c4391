// The cluster install, as the Helm chart deploy/helm/taugrid renders it: the tau server (a
// StatefulSet with its store on a volume, a Service, TLS from a Secret, the platform from a
// ConfigMap), its RBAC, and the GPU health agent (a DaemonSet on GPU nodes). The chart's templates
// and this file describe the same objects; tests/integration/test_helm_chart.py compares them
// when `helm` is at hand.
#include <fmt/format.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/quantity.h"
#include "common/strings.h"
#include "kube/kube.h"

namespace tau::kube {
namespace {

using nlohmann::json;

constexpr const char* kChartName = "taugrid";
constexpr const char* kRbacApi = "rbac.authorization.k8s.io/v1";
// Where the server keeps its store (the volume) and reads its certificate and platform.
constexpr const char* kServerHome = "/var/lib/tau";
constexpr const char* kTlsDir = "/etc/tau/tls";
constexpr const char* kPlatformPath = "/etc/tau/platform.yaml";
constexpr int kServerPort = 8443;

struct Names {
  std::string full;  // Helm's "fullname": the release, or RELEASE-taugrid
  std::string server, agent, platform;
  std::string server_account, agent_account;
  std::string image, version;
};

Names MakeNames(const ClusterValues& v) {
  Names n;
  // Helm's usual rule: a release whose name already says "taugrid" is not prefixed twice.
  n.full = v.release_name.find(kChartName) != std::string::npos
               ? v.release_name
               : fmt::format("{}-{}", v.release_name, kChartName);
  n.server = n.full + "-server";
  n.agent = n.full + "-health-agent";
  n.platform = n.full + "-platform";
  n.server_account = v.server_service_account.empty() ? n.server : v.server_service_account;
  n.agent_account =
      v.health_agent_service_account.empty() ? n.agent : v.health_agent_service_account;
  n.version = v.image_tag.empty() ? kChartAppVersion : v.image_tag;
  n.image = fmt::format("{}:{}", v.image_repository, n.version);
  return n;
}

json SelectorLabels(const ClusterValues& v, const std::string& component) {
  return {{"app.kubernetes.io/name", kChartName},
          {"app.kubernetes.io/instance", v.release_name},
          {"app.kubernetes.io/component", component}};
}

json Meta(const ClusterValues& v, const Names& n, const std::string& name,
          const std::string& component, bool namespaced) {
  json labels = SelectorLabels(v, component);
  labels["app.kubernetes.io/version"] = n.version;
  // The chart says "Helm" here (Helm's own convention); objects applied from `tau cluster render`
  // are tau's.
  labels[kLabelManagedBy] = "tau";
  json m = {{"name", name}, {"labels", labels}};
  if (namespaced) m["namespace"] = v.namespace_name;
  return m;
}

json Rule(std::vector<std::string> groups, std::vector<std::string> resources,
          std::vector<std::string> verbs) {
  return {{"apiGroups", groups}, {"resources", resources}, {"verbs", verbs}};
}

// What the server does with the API: submit, follow and cancel runs (Jobs, RayJobs, a gang's
// headless Service, Kueue's Workloads, a RayJob's driver log through the service proxy), deploy,
// follow and delete services (a Deployment behind a Service, or a RayService), apply the platform
// (namespaces, the members' Role and RoleBinding, Kueue's queue objects), read node health, and ask
// the API server whether a user may act in a namespace. It holds every permission of the member
// Role it creates, so it needs neither `escalate` nor `bind`. No `delete` on namespaces: removing a
// workspace from the platform must not delete its runs' history; an administrator does that.
json ServerRules() {
  // Runs and services are created with server-side apply (a PATCH).
  const std::vector<std::string> submit = {"get", "list", "watch", "create", "patch", "delete"};
  const std::vector<std::string> read = {"get", "list", "watch"};
  const std::vector<std::string> apply = {"get",    "list",  "watch", "create",
                                          "update", "patch", "delete"};
  return json::array({
      Rule({"batch"}, {"jobs"}, submit),
      Rule({"ray.io"}, {"rayjobs"}, submit),
      Rule({""}, {"services"}, submit),
      // Services: a `job` service's Deployment, a `rayjob` service's RayService.
      Rule({"apps"}, {"deployments"}, submit),
      Rule({"ray.io"}, {"rayservices"}, submit),
      Rule({"ray.io"}, {"rayclusters"}, read),
      Rule({""}, {"pods", "pods/log", "events"}, read),
      // A RayJob's driver log: Ray's job API on the head's dashboard, through the API server.
      Rule({""}, {"services/proxy"}, {"get"}),
      Rule({"kueue.x-k8s.io"}, {"workloads"}, read),
      Rule({"kueue.x-k8s.io"},
           {"localqueues", "clusterqueues", "resourceflavors", "cohorts", "workloadpriorityclasses",
            "topologies"},
           apply),
      Rule({""}, {"namespaces"}, {"get", "list", "watch", "create", "update", "patch"}),
      Rule({"rbac.authorization.k8s.io"}, {"roles", "rolebindings"}, apply),
      // The workspace secrets of runs are written to each namespace's tau-secrets (server-side
      // apply); no list or watch, so no other Secret is ever read in bulk.
      Rule({""}, {"secrets"}, {"get", "create", "patch"}),
      Rule({""}, {"nodes"}, read),
      Rule({"authorization.k8s.io"}, {"subjectaccessreviews"}, {"create"}),
  });
}

// The agent reads its node and writes two things: a node condition per verdict (nodes/status)
// and the NoSchedule taint kGpuUnhealthyTaint (the node's spec).
json AgentRules() {
  return json::array({
      Rule({""}, {"nodes"}, {"get", "list", "patch"}),
      Rule({""}, {"nodes/status"}, {"patch"}),
  });
}

json ServiceAccount(const ClusterValues& v, const Names& n, const std::string& name,
                    const std::string& component) {
  return {{"apiVersion", "v1"},
          {"kind", "ServiceAccount"},
          {"metadata", Meta(v, n, name, component, true)}};
}

json ClusterRole(const ClusterValues& v, const Names& n, const std::string& name,
                 const std::string& component, json rules) {
  return {{"apiVersion", kRbacApi},
          {"kind", "ClusterRole"},
          {"metadata", Meta(v, n, name, component, false)},
          {"rules", std::move(rules)}};
}

json ClusterRoleBinding(const ClusterValues& v, const Names& n, const std::string& name,
                        const std::string& component, const std::string& account) {
  return {{"apiVersion", kRbacApi},
          {"kind", "ClusterRoleBinding"},
          {"metadata", Meta(v, n, name, component, false)},
          {"roleRef",
           {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", name}}},
          {"subjects",
           {{{"kind", "ServiceAccount"}, {"name", account}, {"namespace", v.namespace_name}}}}};
}

json PlatformConfigMap(const ClusterValues& v, const Names& n) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", Meta(v, n, n.platform, "server", true)},
          {"data", {{"platform.yaml", v.platform}}}};
}

json ServerService(const ClusterValues& v, const Names& n) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", Meta(v, n, n.server, "server", true)},
          {"spec",
           {{"type", "ClusterIP"},
            {"selector", SelectorLabels(v, "server")},
            {"ports",
             {{{"name", "https"},
               {"port", kServerPort},
               {"targetPort", "https"},
               {"protocol", "TCP"}}}}}}};
}

json RestrictedContainerSecurity() {
  return {{"allowPrivilegeEscalation", false},
          {"readOnlyRootFilesystem", true},
          {"capabilities", {{"drop", {"ALL"}}}}};
}

json ServerStatefulSet(const ClusterValues& v, const Names& n) {
  std::vector<std::string> command = {
      "tau", "server", "--backend", "kubernetes", "--home", kServerHome, "--listen",
      fmt::format("0.0.0.0:{}", kServerPort), "--tls-cert", fmt::format("{}/tls.crt", kTlsDir),
      "--tls-key", fmt::format("{}/tls.key", kTlsDir),
      // Two releases on one cluster never adopt each other's runs.
      "--kube-installation", v.release_name};
  json mounts = json::array({{{"name", "data"}, {"mountPath", kServerHome}},
                             {{"name", "tls"}, {"mountPath", kTlsDir}, {"readOnly", true}}});
  json volumes = json::array(
      {{{"name", "tls"}, {"secret", {{"secretName", v.tls_secret}, {"defaultMode", 0440}}}}});
  json pod_meta = {{"labels", SelectorLabels(v, "server")}};
  if (!v.platform.empty()) {
    command.insert(command.end(), {"--platform", kPlatformPath});
    mounts.push_back({{"name", "platform"},
                      {"mountPath", kPlatformPath},
                      {"subPath", "platform.yaml"},
                      {"readOnly", true}});
    volumes.push_back({{"name", "platform"}, {"configMap", {{"name", n.platform}}}});
    // A subPath mount does not follow ConfigMap updates: a new platform restarts the server
    // (its digest changes the pod template), which reads it again at start.
    pod_meta["annotations"] = {{"tau.dev/platform-sha256", Sha256Hex(v.platform)}};
  }
  json container = {
      {"name", "server"},
      {"image", n.image},
      {"imagePullPolicy", v.image_pull_policy},
      {"command", command},
      {"ports", {{{"name", "https"}, {"containerPort", kServerPort}, {"protocol", "TCP"}}}},
      {"readinessProbe", {{"tcpSocket", {{"port", "https"}}}, {"periodSeconds", 10}}},
      {"resources", v.server_resources},
      {"securityContext", RestrictedContainerSecurity()},
      {"volumeMounts", mounts}};
  json claim_spec = {{"accessModes", {"ReadWriteOnce"}},
                     {"resources", {{"requests", {{"storage", v.storage_size}}}}}};
  if (!v.storage_class.empty()) claim_spec["storageClassName"] = v.storage_class;
  json pod_spec = {{"serviceAccountName", n.server_account},
                   // One server per store: SQLite on a ReadWriteOnce volume, and a StatefulSet
                   // never runs two pods of the same ordinal, unlike a Deployment during a rollout.
                   {"securityContext",
                    {{"runAsNonRoot", true},
                     {"runAsUser", 65532},
                     {"runAsGroup", 65532},
                     {"fsGroup", 65532},
                     {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
                   {"containers", {container}},
                   {"volumes", volumes}};
  return {{"apiVersion", "apps/v1"},
          {"kind", "StatefulSet"},
          {"metadata", Meta(v, n, n.server, "server", true)},
          {"spec",
           {{"replicas", 1},
            {"serviceName", n.server},
            {"selector", {{"matchLabels", SelectorLabels(v, "server")}}},
            {"template", {{"metadata", pod_meta}, {"spec", pod_spec}}},
            {"volumeClaimTemplates", {{{"metadata", {{"name", "data"}}}, {"spec", claim_spec}}}}}}};
}

json AgentDaemonSet(const ClusterValues& v, const Names& n) {
  // The agent must run where GPUs are, including on nodes it (or the GPU operator) tainted.
  json tolerations = json::array(
      {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}},
       {{"key", kGpuUnhealthyTaint}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
  for (const json& t : v.health_agent_tolerations) tolerations.push_back(t);
  json container = {
      {"name", "health-agent"},
      {"image", n.image},
      {"imagePullPolicy", v.image_pull_policy},
      {"command",
       {"tau", "health", "agent", "--node", "$(NODE_NAME)", "--poll-interval",
        v.health_agent_poll_interval}},
      {"env",
       {{{"name", "NODE_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
        // The NVIDIA container runtime mounts the driver's libraries (NVML) and every GPU's
        // device node without the pod requesting nvidia.com/gpu: the agent watches GPUs that
        // runs hold, and must not take one from them.
        {{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "all"}},
        {{"name", "NVIDIA_DRIVER_CAPABILITIES"}, {"value", "utility"}}}},
      {"resources",
       {{"requests", {{"cpu", "50m"}, {"memory", "64Mi"}}}, {"limits", {{"memory", "128Mi"}}}}},
      {"securityContext", RestrictedContainerSecurity()}};
  json pod_spec = {{"serviceAccountName", n.agent_account},
                   // A node's health report must survive the node running short of memory.
                   {"priorityClassName", "system-node-critical"},
                   {"tolerations", tolerations},
                   {"containers", {container}}};
  if (!v.health_agent_node_selector.empty())
    pod_spec["nodeSelector"] = v.health_agent_node_selector;
  if (!v.health_agent_runtime_class.empty())
    pod_spec["runtimeClassName"] = v.health_agent_runtime_class;
  return {
      {"apiVersion", "apps/v1"},
      {"kind", "DaemonSet"},
      {"metadata", Meta(v, n, n.agent, "health-agent", true)},
      {"spec",
       {{"selector", {{"matchLabels", SelectorLabels(v, "health-agent")}}},
        {"updateStrategy", {{"type", "RollingUpdate"}}},
        {"template",
         {{"metadata", {{"labels", SelectorLabels(v, "health-agent")}}}, {"spec", pod_spec}}}}}};
}

Status CheckQuantity(const std::string& what, const std::string& text) {
  auto q = Quantity::Parse(text);
  if (!q.ok() || *q <= Quantity()) {
    return InvalidArgument(
        fmt::format("{}: '{}' is not a positive Kubernetes quantity (like 10Gi)", what, text));
  }
  return Status::Ok();
}

Status CheckValues(const ClusterValues& v) {
  if (!IsDns1123Label(v.release_name, 53)) {
    return InvalidArgument(
        fmt::format("release name '{}': lower-case letters, digits and '-', at most 53 characters",
                    v.release_name));
  }
  if (!IsDns1123Label(v.namespace_name)) {
    return InvalidArgument(fmt::format("namespace '{}' is not a DNS label", v.namespace_name));
  }
  if (v.image_repository.empty()) return InvalidArgument("image.repository is empty");
  if (v.image_pull_policy != "Always" && v.image_pull_policy != "IfNotPresent" &&
      v.image_pull_policy != "Never") {
    return InvalidArgument(
        fmt::format("image.pullPolicy '{}': Always, IfNotPresent or Never", v.image_pull_policy));
  }
  if (v.tls_secret.empty()) {
    return InvalidArgument(
        "server.tls.secretName is empty: the server listens with TLS only (docs/kubernetes.md "
        "says how to make the Secret)");
  }
  TAU_RETURN_IF_ERROR(CheckQuantity("server.storage.size", v.storage_size));
  if (!v.server_resources.is_object()) return InvalidArgument("server.resources is not a map");
  for (const char* part : {"requests", "limits"}) {
    if (!v.server_resources.contains(part)) continue;
    const json& m = v.server_resources[part];
    if (!m.is_object()) return InvalidArgument(fmt::format("server.resources.{}: a map", part));
    for (const auto& [resource, quantity] : m.items()) {
      if (!quantity.is_string()) {
        return InvalidArgument(
            fmt::format("server.resources.{}.{}: a quantity string", part, resource));
      }
      TAU_RETURN_IF_ERROR(CheckQuantity(fmt::format("server.resources.{}.{}", part, resource),
                                        quantity.get<std::string>()));
    }
  }
  // The API server refuses a pod whose request is above its limit; Helm merges a values file's
  // requests into the defaults' limits, which makes one easily (a 4Gi request, the default 2Gi
  // limit). Said here, where it can be fixed, not at install time by a StatefulSet that never
  // gets its pod.
  if (v.server_resources.contains("requests") && v.server_resources.contains("limits")) {
    for (const auto& [resource, text] : v.server_resources["requests"].items()) {
      auto limit = v.server_resources["limits"].find(resource);
      if (limit == v.server_resources["limits"].end()) continue;
      auto want = Quantity::Parse(text.get<std::string>());
      auto most = Quantity::Parse(limit->get<std::string>());
      if (want.ok() && most.ok() && *want > *most)
        return InvalidArgument(fmt::format(
            "server.resources: the {} request ({}) is above its limit ({}); the API server would "
            "refuse the server's pod. Raise server.resources.limits.{} or lower the request",
            resource, text.get<std::string>(), limit->get<std::string>(), resource));
    }
  }
  auto poll = ParseDurationMillis(v.health_agent_poll_interval);
  if (!poll.ok() || *poll <= 0) {
    return InvalidArgument(fmt::format("healthAgent.pollInterval '{}': a duration like 10s",
                                       v.health_agent_poll_interval));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<nlohmann::json>> RenderCluster(const ClusterValues& values,
                                                  const policy::Platform* platform) {
  TAU_RETURN_IF_ERROR(CheckValues(values));
  const ClusterValues& v = values;
  const Names n = MakeNames(v);
  const bool agent = v.health_agent_enabled;
  std::vector<json> out;
  if (v.service_account_create) {
    out.push_back(ServiceAccount(v, n, n.server_account, "server"));
    if (agent) out.push_back(ServiceAccount(v, n, n.agent_account, "health-agent"));
  }
  if (!v.platform.empty()) out.push_back(PlatformConfigMap(v, n));
  if (v.rbac_create) {
    out.push_back(ClusterRole(v, n, n.server, "server", ServerRules()));
    if (agent) out.push_back(ClusterRole(v, n, n.agent, "health-agent", AgentRules()));
    out.push_back(ClusterRoleBinding(v, n, n.server, "server", n.server_account));
    if (agent) {
      out.push_back(ClusterRoleBinding(v, n, n.agent, "health-agent", n.agent_account));
    }
  }
  out.push_back(ServerService(v, n));
  if (agent) out.push_back(AgentDaemonSet(v, n));
  out.push_back(ServerStatefulSet(v, n));
  if (platform != nullptr) {
    TAU_ASSIGN_OR_RETURN(std::vector<json> objects, RenderPlatform(*platform));
    for (json& o : objects) out.push_back(std::move(o));
  }
  return out;
}

}  // namespace tau::kube
