// Kubeconfig files and the in-cluster configuration.
#include <yaml-cpp/yaml.h>

#include <cstdlib>

#include <fmt/format.h>

#include "common/files.h"
#include "common/hash.h"
#include "kubeapi/internal.h"

namespace tau::kubeapi {
namespace {

std::string Scalar(const YAML::Node& node, const char* key) {
  const YAML::Node value = node[key];
  return value && value.IsScalar() ? value.as<std::string>() : "";
}

// The entry named `name` of a kubeconfig list (clusters, users, contexts), unwrapped
// ({name: x, cluster: {...}} -> {...}).
Result<YAML::Node> Named(const YAML::Node& root, const char* list, const char* inner,
                         const std::string& name) {
  const YAML::Node entries = root[list];
  if (entries && entries.IsSequence()) {
    for (const YAML::Node& entry : entries) {
      if (Scalar(entry, "name") != name) continue;
      const YAML::Node body = entry[inner];
      return body ? body : YAML::Node(YAML::NodeType::Map);
    }
  }
  return NotFound(fmt::format("kubeconfig has no {} named '{}'", inner, name));
}

std::string Resolve(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

Result<std::string> DecodeData(const std::string& base64, const char* field) {
  Result<std::string> decoded = Base64Decode(base64);
  if (!decoded.ok())
    return InvalidArgument(fmt::format("kubeconfig: {} is not valid base64", field));
  return decoded;
}

Result<ClusterConfig> ParseNode(const YAML::Node& root, const std::string& context_override,
                                const std::string& base_dir) {
  if (!root.IsMap()) return InvalidArgument("kubeconfig: the document is not a mapping");
  ClusterConfig config;
  config.context = context_override.empty() ? Scalar(root, "current-context") : context_override;
  if (config.context.empty())
    return InvalidArgument("kubeconfig has no current-context; name a context explicitly");
  TAU_ASSIGN_OR_RETURN(YAML::Node context, Named(root, "contexts", "context", config.context));
  const std::string cluster_name = Scalar(context, "cluster");
  const std::string user_name = Scalar(context, "user");
  if (std::string ns = Scalar(context, "namespace"); !ns.empty()) config.namespace_name = ns;

  TAU_ASSIGN_OR_RETURN(YAML::Node cluster, Named(root, "clusters", "cluster", cluster_name));
  config.server = Scalar(cluster, "server");
  if (config.server.empty())
    return InvalidArgument(fmt::format("kubeconfig: cluster '{}' has no server", cluster_name));
  while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
  config.ca_file = Resolve(Scalar(cluster, "certificate-authority"), base_dir);
  if (std::string data = Scalar(cluster, "certificate-authority-data"); !data.empty()) {
    TAU_ASSIGN_OR_RETURN(config.ca_data, DecodeData(data, "certificate-authority-data"));
  }
  config.insecure_skip_tls_verify = Scalar(cluster, "insecure-skip-tls-verify") == "true";
  config.tls_server_name = Scalar(cluster, "tls-server-name");

  if (user_name.empty()) return config;  // no credentials: anonymous
  TAU_ASSIGN_OR_RETURN(YAML::Node user, Named(root, "users", "user", user_name));
  config.token = Scalar(user, "token");
  config.token_file = Resolve(Scalar(user, "tokenFile"), base_dir);
  config.client_cert_file = Resolve(Scalar(user, "client-certificate"), base_dir);
  config.client_key_file = Resolve(Scalar(user, "client-key"), base_dir);
  if (std::string data = Scalar(user, "client-certificate-data"); !data.empty()) {
    TAU_ASSIGN_OR_RETURN(config.client_cert_data, DecodeData(data, "client-certificate-data"));
  }
  if (std::string data = Scalar(user, "client-key-data"); !data.empty()) {
    TAU_ASSIGN_OR_RETURN(config.client_key_data, DecodeData(data, "client-key-data"));
  }
  if (const YAML::Node exec = user["exec"]; exec && exec.IsMap()) {
    config.exec.command = Scalar(exec, "command");
    if (config.exec.command.empty())
      return InvalidArgument(fmt::format("kubeconfig: user '{}': exec has no command", user_name));
    if (std::string v = Scalar(exec, "apiVersion"); !v.empty()) config.exec.api_version = v;
    if (const YAML::Node args = exec["args"]; args && args.IsSequence())
      for (const YAML::Node& arg : args) config.exec.args.push_back(arg.as<std::string>());
    if (const YAML::Node env = exec["env"]; env && env.IsSequence())
      for (const YAML::Node& var : env)
        config.exec.env.emplace_back(Scalar(var, "name"), Scalar(var, "value"));
    // A command given as a relative path with a slash is relative to the kubeconfig, as kubectl
    // does; a bare name is looked up in PATH.
    if (config.exec.command.find('/') != std::string::npos)
      config.exec.command = Resolve(config.exec.command, base_dir);
  }
  const YAML::Node auth_provider = user["auth-provider"];
  if (auth_provider && config.token.empty() && config.exec.command.empty())
    return InvalidArgument(fmt::format(
        "kubeconfig: user '{}' uses an auth-provider, which tau does not support; use an exec "
        "plugin (e.g. gke-gcloud-auth-plugin, kubelogin)",
        user_name));
  return config;
}

}  // namespace

Result<ClusterConfig> ParseKubeconfig(std::string_view yaml, const std::string& context,
                                      const std::string& base_dir) {
  try {
    return ParseNode(YAML::Load(std::string(yaml)), context, base_dir);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(fmt::format("kubeconfig: {}", e.what()));
  }
}

Result<ClusterConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  Result<ClusterConfig> config = ParseKubeconfig(text, context, dir);
  if (!config.ok()) return config.status().WithContext(path);
  return config;
}

Result<ClusterConfig> LoadInClusterConfig(const std::string& service_account_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr || *host == '\0' || *port == '\0')
    return FailedPrecondition(
        "not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT are not set) and no "
        "kubeconfig was found; set KUBECONFIG or create ~/.kube/config");
  ClusterConfig config;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  config.server = fmt::format("https://{}:{}", h, port);
  config.token_file = service_account_dir + "/token";
  if (!PathExists(config.token_file))
    return FailedPrecondition(fmt::format("in-cluster: {} does not exist", config.token_file));
  if (PathExists(service_account_dir + "/ca.crt")) config.ca_file = service_account_dir + "/ca.crt";
  if (Result<std::string> ns = ReadFile(service_account_dir + "/namespace"); ns.ok()) {
    std::string name = *ns;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (!name.empty()) config.namespace_name = name;
  }
  return config;
}

Result<ClusterConfig> LoadDefaultConfig(const std::string& context) {
  if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
    // kubectl merges every file of the list; tau reads the first, which covers the usual case
    // of a single file.
    std::string list = env;
    std::string first = list.substr(0, list.find(':'));
    return LoadKubeconfig(first, context);
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    std::string path = std::string(home) + "/.kube/config";
    if (PathExists(path)) return LoadKubeconfig(path, context);
  }
  return LoadInClusterConfig();
}

}  // namespace tau::kubeapi
