// (apiVersion, kind) -> REST path for the kinds tau uses, and API errors -> Status.
#include <fmt/format.h>

#include "kubeapi/internal.h"

namespace tau::kubeapi {

const std::vector<ResourceInfo>& KnownResources() {
  static const std::vector<ResourceInfo> kResources = {
      {"v1", "Namespace", "namespaces", false},
      {"v1", "Pod", "pods", true},
      {"v1", "Secret", "secrets", true},
      {"v1", "ConfigMap", "configmaps", true},
      {"v1", "ServiceAccount", "serviceaccounts", true},
      {"v1", "Service", "services", true},
      {"v1", "Node", "nodes", false},
      {"batch/v1", "Job", "jobs", true},
      {"apps/v1", "Deployment", "deployments", true},
      {"ray.io/v1", "RayJob", "rayjobs", true},
      {"ray.io/v1", "RayService", "rayservices", true},
      {"kueue.x-k8s.io/v1beta1", "Workload", "workloads", true},
      {"kueue.x-k8s.io/v1beta1", "LocalQueue", "localqueues", true},
      {"kueue.x-k8s.io/v1beta1", "ClusterQueue", "clusterqueues", false},
      {"kueue.x-k8s.io/v1beta1", "ResourceFlavor", "resourceflavors", false},
      {"kueue.x-k8s.io/v1beta1", "WorkloadPriorityClass", "workloadpriorityclasses", false},
      {"kueue.x-k8s.io/v1alpha1", "Cohort", "cohorts", false},
      // Kueue's storage version since 0.15 (what `tau platform render` writes); v1beta1 is still
      // served.
      {"kueue.x-k8s.io/v1beta2", "Workload", "workloads", true},
      {"kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues", true},
      {"kueue.x-k8s.io/v1beta2", "ClusterQueue", "clusterqueues", false},
      {"kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors", false},
      {"kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses", false},
      {"kueue.x-k8s.io/v1beta2", "Cohort", "cohorts", false},
      {"rbac.authorization.k8s.io/v1", "Role", "roles", true},
      {"rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", true},
      {"rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", false},
      {"rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", false},
      {"authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", false},
  };
  return kResources;
}

Result<ResourceInfo> LookupResource(std::string_view api_version, std::string_view kind) {
  for (const ResourceInfo& info : KnownResources())
    if (info.api_version == api_version && info.kind == kind) return info;
  return NotFound(fmt::format("tau's Kubernetes client does not know kind {} of apiVersion {}",
                              kind, api_version));
}

Result<std::string> ResourcePath(std::string_view api_version, std::string_view kind,
                                 std::string_view ns, std::string_view name,
                                 std::string_view subresource) {
  TAU_ASSIGN_OR_RETURN(ResourceInfo info, LookupResource(api_version, kind));
  // The core group lives under /api, the others under /apis.
  std::string path = api_version.find('/') == std::string_view::npos
                         ? fmt::format("/api/{}", api_version)
                         : fmt::format("/apis/{}", api_version);
  if (info.namespaced && !ns.empty()) path += fmt::format("/namespaces/{}", ns);
  path += "/" + info.resource;
  if (!name.empty()) path += fmt::format("/{}", name);
  if (!subresource.empty()) {
    if (name.empty()) return InvalidArgument("a subresource needs an object name");
    path += fmt::format("/{}", subresource);
  }
  return path;
}

std::string StatusMessage(const std::string& body, std::string* reason) {
  nlohmann::json status = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!status.is_object() || status.value("kind", "") != "Status") return "";
  if (reason != nullptr) *reason = status.value("reason", "");
  return status.value("message", "");
}

bool IsConflict(const Status& status) {
  return status.code() == StatusCode::kFailedPrecondition &&
         status.message().find("HTTP 409") != std::string::npos;
}

Status HttpError(int http_status, const std::string& what, const std::string& body) {
  std::string reason;
  std::string message = StatusMessage(body, &reason);
  if (message.empty()) message = body.size() > 300 ? body.substr(0, 300) + "..." : body;
  std::string text =
      fmt::format("{}: HTTP {}{}{}", what, http_status, reason.empty() ? "" : " " + reason,
                  message.empty() ? "" : ": " + message);
  switch (http_status) {
    case 400:
    case 422:
      return Status(StatusCode::kInvalidArgument, text);
    case 401:
      return Status(StatusCode::kUnauthenticated,
                    text + " (the credentials were refused; check the kubeconfig's user)");
    case 403:
      return Status(StatusCode::kPermissionDenied, text);
    case 404:
      return Status(StatusCode::kNotFound, text);
    case 409:
      return Status(
          reason == "AlreadyExists" ? StatusCode::kAlreadyExists : StatusCode::kFailedPrecondition,
          text);
    case 410:
      return Status(StatusCode::kResourceExhausted, text);
    default:
      break;
  }
  if (http_status == 429 || http_status >= 500) return Status(StatusCode::kUnavailable, text);
  return Status(StatusCode::kInternal, text);
}

}  // namespace tau::kubeapi
