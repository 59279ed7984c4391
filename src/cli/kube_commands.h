// `tau plan` and `tau platform render`: what a run or a platform becomes, printed without
// submitting anything (local commands; no server involved).
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

}  // namespace tau::cli
