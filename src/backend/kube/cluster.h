// A cluster that admits and runs attempts itself: the Kubernetes backend, where Kueue admits by
// quota and the kubelets run the pods. The controller keeps every decision about runs (records,
// retries, cancels, evidence) exactly as on the local backend; it hands the cluster the attempts
// to create and delete, and what the cluster says of them comes back as AttemptNews.
// kube_cluster.h is the implementation on the Kubernetes API.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/inbox.h"
#include "backend/service_driver.h"
#include "common/status.h"
#include "kube/kube.h"
#include "policy/policy.h"
#include "spec/spec.h"

namespace tau::server {

// One attempt to create on the cluster.
struct ClusterLaunch {
  std::string run;
  int attempt = 1;
  const spec::RunSpec* spec = nullptr;  // with the resolved shape applied
  const policy::ResolvedRun* resolved = nullptr;
  std::shared_ptr<const policy::Platform> platform;
  std::string snapshot_dir;  // the run's code, shipped inline
  // The workspace's secrets, when the spec's env refers to any (SECRET:KEY): the cluster keeps
  // them in the namespace's Secret that the pods read.
  std::map<std::string, std::string> secrets;
  std::string resume_from;             // TAU_RESUME_FROM of a later attempt
  std::string failure_reason;          // TAU_FAILURE_REASON of a later attempt
  std::optional<int64_t> array_index;  // TAU_ARRAY_INDEX of a run of an array
  std::vector<std::pair<std::string, std::string>> upstreams;  // a workflow stage's {stage, run}
};

using AttemptKey = std::pair<std::string, int>;  // run, attempt

class Cluster : public ServiceDriver {
 public:
  virtual ~Cluster() = default;

  // Reads what the cluster holds now and starts following it; news (AttemptNews) and what the
  // logs say of themselves (RunNotice: LogTruncated, OutputDropped) arrive on `post` from the
  // cluster's threads (it must only queue them). An attempt's pod logs are kept under
  // attempt_dir(run, attempt)/logs as rank-N.log once KeepLogs has said how. Returns the attempts
  // that exist now, so that the controller can tell which of its recorded attempts vanished while
  // it was away.
  virtual Result<std::set<AttemptKey>> Start(
      std::function<void(InboxMessage)> post,
      std::function<std::string(const std::string& run, int attempt)> attempt_dir) = 0;
  virtual void Stop() = 0;
  // How to keep the attempt's pod logs: said before Launch, and for an attempt re-adopted after a
  // restart. Until then its pods' logs are not followed (a log written unmasked, or uncapped,
  // could not be taken back); they are from their start once it is.
  virtual void KeepLogs(const std::string& run, int attempt, AttemptLogs logs) = 0;
  // Refuses, at submission, a run that cannot be created there (no image, code over the inline
  // limit, a volume without a claim, ...), with the renderer's message; and, where the cluster
  // is asked to, a caller whom its RBAC does not allow to create the run's objects there.
  // `run_name` is as long as the longest name the run may get.
  virtual Status Check(const spec::RunSpec& spec, const policy::ResolvedRun& resolved,
                       const policy::Platform& platform, const std::string& snapshot_dir,
                       const policy::Caller& caller, const std::string& run_name) = 0;
  // Renders the attempt's objects (an error here fails the attempt) and has them created,
  // suspended for Kueue to admit, off the caller's thread (one lane per namespace, each call with
  // a time budget; see call_lanes.h): the result comes as AttemptNews (Call::kLaunched),
  // Unavailable when the API server could not be reached in time (try again later).
  virtual Status Launch(const ClusterLaunch& launch) = 0;
  // Applies the platform's cluster objects (kube::RenderPlatform: workspace namespaces and RBAC,
  // Kueue's flavors, cohorts, queues and priority classes) with server-side apply. Objects a
  // later platform no longer names are left in place: removing a queue or a namespace is an
  // administrator's decision.
  virtual Status ApplyPlatform(const policy::Platform& platform) = 0;
  // Has the attempt's objects and their pods deleted (background propagation), which frees the
  // quota it holds, off the caller's thread and after the attempt's earlier calls: the result
  // comes as AttemptNews (Call::kDeleted). Deleting what is already gone is not an error.
  virtual void Delete(const std::string& run, int attempt) = 0;

  // Services (ServiceDriver): a cluster that cannot run services refuses them (FailedPrecondition).
  Result<std::vector<nlohmann::json>> RenderService(const ServiceLaunch& launch) override;
  Status ApplyService(const ServiceLaunch& launch,
                      const std::vector<nlohmann::json>& objects) override;
  Status DeleteService(const std::vector<nlohmann::json>& refs) override;
  Result<ServiceObserved> ObserveService(const std::string& ns, const std::string& name,
                                         const std::string& kind) override;
  void KeepServiceLog(const std::string& ns, const std::string& pod, const std::string& container,
                      const std::string& path, AttemptLogs logs) override;
};

}  // namespace tau::server
