// The REST operations: paths, query parameters and bodies per the Kubernetes API conventions.
#include <fmt/format.h>

#include "common/json_text.h"
#include "kubeapi/internal.h"

namespace tau::kubeapi {
namespace {

struct ObjectRef {
  std::string api_version;
  std::string kind;
  std::string ns;
  std::string name;
};

Result<ObjectRef> RefOf(const nlohmann::json& object) {
  if (!object.is_object()) return InvalidArgument("a Kubernetes object must be a JSON object");
  ObjectRef ref;
  const nlohmann::json metadata = object.value("metadata", nlohmann::json::object());
  if (!metadata.is_object()) return InvalidArgument("metadata must be an object");
  ref.api_version = object.value("apiVersion", "");
  ref.kind = object.value("kind", "");
  ref.ns = metadata.value("namespace", "");
  ref.name = metadata.value("name", "");
  if (ref.api_version.empty() || ref.kind.empty())
    return InvalidArgument("a Kubernetes object needs apiVersion and kind");
  return ref;
}

}  // namespace

Result<nlohmann::json> Client::Get(std::string_view api_version, std::string_view kind,
                                   std::string_view ns, std::string_view name) {
  if (name.empty()) return InvalidArgument("Get needs a name");
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(api_version, kind, ns, name));
  return Call(Request{"GET", path, "", "", false});
}

Result<ObjectList> Client::List(std::string_view api_version, std::string_view kind,
                                std::string_view ns, const ListOptions& options) {
  TAU_ASSIGN_OR_RETURN(std::string base, ResourcePath(api_version, kind, ns, ""));
  ObjectList out;
  std::string continue_token = options.continue_token;
  for (;;) {
    std::vector<std::string> query;
    if (!options.label_selector.empty())
      query.push_back("labelSelector=" + QueryEscape(options.label_selector));
    if (options.limit > 0) query.push_back(fmt::format("limit={}", options.limit));
    if (!continue_token.empty()) query.push_back("continue=" + QueryEscape(continue_token));
    std::string path = base;
    for (size_t i = 0; i < query.size(); ++i) path += (i == 0 ? "?" : "&") + query[i];
    TAU_ASSIGN_OR_RETURN(nlohmann::json page, Call(Request{"GET", path, "", "", false}));
    if (!page.is_object()) return Internal(fmt::format("GET {}: the answer is not a List", path));
    const nlohmann::json items = page.value("items", nlohmann::json::array());
    if (items.is_array())
      for (size_t i = 0; i < items.size(); ++i) {
        // A List's items carry no apiVersion and kind (built-in kinds; the List has them): put
        // them back, so that every caller holds whole objects it can act on (delete, apply).
        nlohmann::json item = items[i];
        if (item.is_object()) {
          item["apiVersion"] = std::string(api_version);
          item["kind"] = std::string(kind);
        }
        out.items.push_back(std::move(item));
      }
    const nlohmann::json metadata = page.value("metadata", nlohmann::json::object());
    out.resource_version = metadata.value("resourceVersion", "");
    continue_token = metadata.value("continue", "");
    // With a limit the caller asked for one page; without one, a server may still page.
    if (options.limit > 0 || continue_token.empty()) break;
  }
  out.continue_token = continue_token;
  return out;
}

Result<std::string> Client::ServiceProxyGet(std::string_view ns, std::string_view service,
                                            std::string_view port, std::string_view path) {
  TAU_ASSIGN_OR_RETURN(std::string base,
                       ResourcePath("v1", "Service", ns, fmt::format("{}:{}", service, port)));
  std::string full = base + "/proxy";
  if (path.empty() || path.front() != '/') full += "/";
  full += path;
  Transfer transfer;
  TAU_RETURN_IF_ERROR(Exchange(Request{"GET", full, "", "", false}, &transfer, nullptr, nullptr));
  return std::move(transfer.body);
}

Result<nlohmann::json> Client::Create(const nlohmann::json& object) {
  TAU_ASSIGN_OR_RETURN(ObjectRef ref, RefOf(object));
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref.api_version, ref.kind, ref.ns, ""));
  return Call(Request{"POST", path, JsonText(object), "application/json", false});
}

Result<nlohmann::json> Client::Replace(const nlohmann::json& object) {
  TAU_ASSIGN_OR_RETURN(ObjectRef ref, RefOf(object));
  if (ref.name.empty()) return InvalidArgument("Replace needs metadata.name");
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref.api_version, ref.kind, ref.ns, ref.name));
  return Call(Request{"PUT", path, JsonText(object), "application/json", false});
}

Result<nlohmann::json> Client::UpdateStatus(const nlohmann::json& object) {
  TAU_ASSIGN_OR_RETURN(ObjectRef ref, RefOf(object));
  if (ref.name.empty()) return InvalidArgument("UpdateStatus needs metadata.name");
  TAU_ASSIGN_OR_RETURN(std::string path,
                       ResourcePath(ref.api_version, ref.kind, ref.ns, ref.name, "status"));
  return Call(Request{"PUT", path, JsonText(object), "application/json", false});
}

Result<nlohmann::json> Client::Apply(const nlohmann::json& object, const ApplyOptions& options) {
  TAU_ASSIGN_OR_RETURN(ObjectRef ref, RefOf(object));
  if (ref.name.empty()) return InvalidArgument("Apply needs metadata.name");
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(ref.api_version, ref.kind, ref.ns, ref.name));
  path += "?fieldManager=" + QueryEscape(options_.field_manager);
  if (options.force) path += "&force=true";
  if (options.dry_run) path += "&dryRun=All";
  // JSON is YAML, and the API server takes either under the apply content type.
  return Call(Request{"PATCH", path, JsonText(object), "application/apply-patch+yaml", false});
}

Result<nlohmann::json> Client::MergePatch(std::string_view api_version, std::string_view kind,
                                          std::string_view ns, std::string_view name,
                                          const nlohmann::json& patch,
                                          std::string_view subresource) {
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(api_version, kind, ns, name, subresource));
  return Call(Request{"PATCH", path, JsonText(patch), "application/merge-patch+json", false});
}

Status Client::Delete(std::string_view api_version, std::string_view kind, std::string_view ns,
                      std::string_view name, const DeleteOptions& options) {
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(api_version, kind, ns, name));
  switch (options.propagation) {
    case Propagation::kForeground:
      path += "?propagationPolicy=Foreground";
      break;
    case Propagation::kBackground:
      path += "?propagationPolicy=Background";
      break;
    case Propagation::kOrphan:
      path += "?propagationPolicy=Orphan";
      break;
    case Propagation::kDefault:
      break;
  }
  Result<nlohmann::json> result = Call(Request{"DELETE", path, "", "", false});
  if (!result.ok() && result.status().code() == StatusCode::kNotFound && options.ignore_not_found)
    return Status::Ok();
  return result.ok() ? Status::Ok() : result.status();
}

Result<bool> Client::CheckAccess(const std::string& user, const std::vector<std::string>& groups,
                                 const std::string& verb, const std::string& group,
                                 const std::string& resource, const std::string& ns) {
  nlohmann::json attributes = {{"verb", verb}, {"group", group}, {"resource", resource}};
  if (!ns.empty()) attributes["namespace"] = ns;
  nlohmann::json review = {
      {"apiVersion", "authorization.k8s.io/v1"},
      {"kind", "SubjectAccessReview"},
      {"spec", {{"user", user}, {"groups", groups}, {"resourceAttributes", attributes}}}};
  TAU_ASSIGN_OR_RETURN(nlohmann::json answer, Create(review));
  const nlohmann::json status = answer.value("status", nlohmann::json::object());
  if (!status.is_object()) return Internal("SubjectAccessReview: the answer has no status");
  return status.value("allowed", false);
}

}  // namespace tau::kubeapi
