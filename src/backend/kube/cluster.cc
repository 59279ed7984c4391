// What a Cluster that cannot run services answers (cluster.h).
#include "backend/kube/cluster.h"

namespace tau::server {
namespace {
Status NoServices() {
  return FailedPrecondition("this cluster cannot run services (docs/serving.md, \"Kubernetes\")");
}
}  // namespace

Result<std::vector<nlohmann::json>> Cluster::RenderService(const ServiceLaunch&) {
  return NoServices();
}
Status Cluster::ApplyService(const ServiceLaunch&, const std::vector<nlohmann::json>&) {
  return NoServices();
}
Status Cluster::DeleteService(const std::vector<nlohmann::json>&) { return NoServices(); }
Result<ServiceObserved> Cluster::ObserveService(const std::string&, const std::string&,
                                                const std::string&) {
  return NoServices();
}
void Cluster::KeepServiceLog(const std::string&, const std::string&, const std::string&,
                             const std::string&, AttemptLogs) {}

}  // namespace tau::server
