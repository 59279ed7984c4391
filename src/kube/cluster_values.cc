// ParseClusterValues: a Helm values file (the shape of deploy/helm/taugrid/values.yaml) over the
// defaults. Strict like the chart's values.schema.json: an unknown key is an error naming it,
// since a misspelt value that is silently ignored installs something other than what was asked.
#include <fmt/format.h>

#include <algorithm>

#include "common/strings.h"
#include "kube/kube.h"

namespace tau::kube {
namespace {

using nlohmann::json;

// Walks one map of the values file, remembering its path for messages.
class Section {
 public:
  Section(const json& node, std::string path) : node_(node), path_(std::move(path)) {}

  // Every key must be one of `known`.
  Status OnlyKeys(const std::vector<std::string>& known) const {
    for (const auto& [key, unused] : node_.items()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string hint = ClosestMatch(key, known);
      return InvalidArgument(
          fmt::format("{}: unknown key{}", Path(key),
                      hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint)));
    }
    return Status::Ok();
  }

  bool Has(const std::string& key) const { return node_.contains(key); }

  Result<Section> Map(const std::string& key) const {
    static const json kEmpty = json::object();
    if (!node_.contains(key) || node_[key].is_null()) return Section(kEmpty, Path(key));
    if (!node_[key].is_object()) return InvalidArgument(fmt::format("{}: a map", Path(key)));
    return Section(node_[key], Path(key));
  }

  Status String(const std::string& key, std::string* out) const {
    if (!node_.contains(key) || node_[key].is_null()) return Status::Ok();
    if (!node_[key].is_string()) return InvalidArgument(fmt::format("{}: a string", Path(key)));
    *out = node_[key].get<std::string>();
    return Status::Ok();
  }

  Status Bool(const std::string& key, bool* out) const {
    if (!node_.contains(key) || node_[key].is_null()) return Status::Ok();
    if (!node_[key].is_boolean()) {
      return InvalidArgument(fmt::format("{}: true or false", Path(key)));
    }
    *out = node_[key].get<bool>();
    return Status::Ok();
  }

  // `numbers` takes numbers as their text (resource quantities such as `cpu: 2`).
  Status StringMap(const std::string& key, std::map<std::string, std::string>* out,
                   bool numbers = false) const {
    if (!node_.contains(key) || node_[key].is_null()) return Status::Ok();
    if (!node_[key].is_object()) return InvalidArgument(fmt::format("{}: a map", Path(key)));
    // Helm merges maps into the defaults; a null value removes a default entry.
    for (const auto& [k, value] : node_[key].items()) {
      if (value.is_null()) {
        out->erase(k);
        continue;
      }
      if (numbers && value.is_number()) {
        (*out)[k] = value.dump();
        continue;
      }
      if (!value.is_string()) {
        return InvalidArgument(
            fmt::format("{}.{}: a string (quote \"true\" and numbers)", Path(key), k));
      }
      (*out)[k] = value.get<std::string>();
    }
    return Status::Ok();
  }

  Status Objects(const std::string& key, std::vector<json>* out) const {
    if (!node_.contains(key) || node_[key].is_null()) return Status::Ok();
    if (!node_[key].is_array()) return InvalidArgument(fmt::format("{}: a list", Path(key)));
    out->clear();
    for (const json& item : node_[key]) {
      if (!item.is_object()) {
        return InvalidArgument(fmt::format("{}: a list of maps", Path(key)));
      }
      out->push_back(item);
    }
    return Status::Ok();
  }

  const json& node() const { return node_; }
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  const json& node_;
  std::string path_;
};

// The chart once installed Kueue and KubeRay as subcharts under these keys; it no longer does
// (it would not lint or render without the network). Said, not ignored.
Status NoDependency(const Section& root, const std::string& key, const char* what) {
  if (!root.Has(key)) return Status::Ok();
  return InvalidArgument(
      fmt::format("{}: the chart does not install {}; install it from its own chart first "
                  "(docs/kubernetes.md, Quickstart) and remove this key",
                  key, what));
}

}  // namespace

Result<ClusterValues> ParseClusterValues(std::string_view yaml) {
  TAU_ASSIGN_OR_RETURN(std::vector<json> docs, ParseYaml(yaml));
  ClusterValues v;
  if (docs.empty() || docs.front().is_null()) return v;
  if (docs.size() > 1) return InvalidArgument("a values file is one YAML document");
  if (!docs.front().is_object()) return InvalidArgument("a values file is a map");
  const Section root(docs.front(), "");
  TAU_RETURN_IF_ERROR(root.OnlyKeys({"image", "server", "platform", "healthAgent", "kueue",
                                     "kuberay", "rbac", "serviceAccount", "global"}));

  TAU_ASSIGN_OR_RETURN(Section image, root.Map("image"));
  TAU_RETURN_IF_ERROR(image.OnlyKeys({"repository", "tag", "pullPolicy"}));
  TAU_RETURN_IF_ERROR(image.String("repository", &v.image_repository));
  TAU_RETURN_IF_ERROR(image.String("tag", &v.image_tag));
  TAU_RETURN_IF_ERROR(image.String("pullPolicy", &v.image_pull_policy));

  TAU_ASSIGN_OR_RETURN(Section server, root.Map("server"));
  TAU_RETURN_IF_ERROR(server.OnlyKeys({"resources", "storage", "tls"}));
  if (server.node().contains("resources") && !server.node()["resources"].is_null()) {
    TAU_ASSIGN_OR_RETURN(Section resources, server.Map("resources"));
    TAU_RETURN_IF_ERROR(resources.OnlyKeys({"requests", "limits"}));
    // Merged into the defaults as Helm merges maps (null removes an entry).
    for (const char* part : {"requests", "limits"}) {
      std::map<std::string, std::string> quantities;
      if (v.server_resources.contains(part)) {
        for (const auto& [k, q] : v.server_resources[part].items())
          quantities[k] = q.get<std::string>();
      }
      TAU_RETURN_IF_ERROR(resources.StringMap(part, &quantities, /*numbers=*/true));
      if (quantities.empty()) {
        v.server_resources.erase(part);
      } else {
        v.server_resources[part] = quantities;
      }
    }
  }
  TAU_ASSIGN_OR_RETURN(Section storage, server.Map("storage"));
  TAU_RETURN_IF_ERROR(storage.OnlyKeys({"size", "storageClassName"}));
  TAU_RETURN_IF_ERROR(storage.String("size", &v.storage_size));
  TAU_RETURN_IF_ERROR(storage.String("storageClassName", &v.storage_class));
  TAU_ASSIGN_OR_RETURN(Section tls, server.Map("tls"));
  TAU_RETURN_IF_ERROR(tls.OnlyKeys({"secretName"}));
  TAU_RETURN_IF_ERROR(tls.String("secretName", &v.tls_secret));

  TAU_RETURN_IF_ERROR(root.String("platform", &v.platform));

  TAU_ASSIGN_OR_RETURN(Section agent, root.Map("healthAgent"));
  TAU_RETURN_IF_ERROR(agent.OnlyKeys(
      {"enabled", "nodeSelector", "tolerations", "runtimeClassName", "pollInterval"}));
  TAU_RETURN_IF_ERROR(agent.Bool("enabled", &v.health_agent_enabled));
  TAU_RETURN_IF_ERROR(agent.StringMap("nodeSelector", &v.health_agent_node_selector));
  TAU_RETURN_IF_ERROR(agent.Objects("tolerations", &v.health_agent_tolerations));
  TAU_RETURN_IF_ERROR(agent.String("runtimeClassName", &v.health_agent_runtime_class));
  TAU_RETURN_IF_ERROR(agent.String("pollInterval", &v.health_agent_poll_interval));

  TAU_RETURN_IF_ERROR(NoDependency(root, "kueue", "Kueue"));
  TAU_RETURN_IF_ERROR(NoDependency(root, "kuberay", "KubeRay"));

  TAU_ASSIGN_OR_RETURN(Section rbac, root.Map("rbac"));
  TAU_RETURN_IF_ERROR(rbac.OnlyKeys({"create"}));
  TAU_RETURN_IF_ERROR(rbac.Bool("create", &v.rbac_create));

  TAU_ASSIGN_OR_RETURN(Section accounts, root.Map("serviceAccount"));
  TAU_RETURN_IF_ERROR(accounts.OnlyKeys({"create", "server", "healthAgent"}));
  TAU_RETURN_IF_ERROR(accounts.Bool("create", &v.service_account_create));
  TAU_RETURN_IF_ERROR(accounts.String("server", &v.server_service_account));
  TAU_RETURN_IF_ERROR(accounts.String("healthAgent", &v.health_agent_service_account));
  return v;
}

}  // namespace tau::kube
