// `tau plan`, `tau platform render` and `tau cluster render`: what a run, a platform or the cluster
// install becomes, printed without submitting anything (local commands; no server involved).
#pragma once

#include <string>

namespace tau::cli {

struct PlanOptions {
  std::string file = "tau.yaml";
  std::string backend = "local";  // local | kubernetes
  std::string platform;           // platform.yaml; "" : this machine's default platform
  std::string user;               // "" : the current user
  std::string namespace_name;     // kubernetes: "" : the workspace's namespace
  std::string image;              // kubernetes: image for specs without runtime.image
};

// local: the resolved run and the launch plan (one line per worker); kubernetes: the Job or RayJob
// (and a gang's Service) as YAML, the code directory shipped inline.
int CmdPlan(const PlanOptions& options);
// The platform's Kueue objects, namespaces and RBAC as YAML.
int CmdPlatformRender(const std::string& file);

struct ClusterRenderOptions {
  std::string values_file;     // the Helm chart's values (YAML); "" : the chart's defaults
  std::string platform_file;   // platform.yaml; "" : the values' `platform`, if any
  std::string namespace_name;  // "" : the values' (tau-system)
  std::string image;           // REPOSITORY[:TAG]; "" : the values' image
};

// The objects the Helm chart deploy/helm/taugrid installs (and, with a platform, the platform's
// objects) as YAML, for clusters installed without Helm.
int CmdClusterRender(const ClusterRenderOptions& options);

}  // namespace tau::cli
