// An optional interface of a backend (Backend::services()): an engine that runs a service as its
// own objects (the Kubernetes backend: a Deployment or RayService behind a Service) rather than as
// replica runs that the service manager keeps, probes and serves on this machine. The calls are
// made on the service manager's thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "policy/policy.h"
#include "spec/spec.h"

namespace tau::server {

// A service's objects to render (docs/serving.md, "Kubernetes"): its spec with serve.replicas as
// the service is scaled, resolved as a replica's submission is.
struct ServiceLaunch {
  std::string service;
  int64_t revision = 1;
  const spec::RunSpec* spec = nullptr;
  const policy::ResolvedRun* resolved = nullptr;
  std::shared_ptr<const policy::Platform> platform;
  std::string snapshot_dir;
  std::map<std::string, std::string> secrets;  // as ClusterLaunch's
  std::string model_run;                       // serve.from (or --from); "" : none
};

// A replica pod of a service, as the API server has it.
struct ServicePod {
  std::string name;
  std::string phase;  // Pending, Running, Succeeded, Failed, Unknown
  std::string container;
  int64_t revision = 0;  // tau.dev/revision of the deploy that made it
  bool ready = false;    // its Ready condition
  int64_t restarts = 0;  // its containers' restart counts, summed
  // Why it is not ready or not running (a container's waiting or last termination reason, the
  // Ready condition's message), "" when it is.
  std::string reason;
  bool deleting = false;  // it has a deletionTimestamp
};

// A service's workload on the cluster (the Deployment or the RayService) and its replica pods.
struct ServiceObserved {
  bool found = false;  // the Deployment (RayService) exists
  int64_t desired = 0, ready = 0, updated = 0;
  // What the workload says of itself: a Deployment's failing condition, a RayService's
  // serviceStatus; "" when it has nothing to say.
  std::string message;
  std::vector<ServicePod> pods;
};

// How an attempt's or a replica's pod logs are kept (Cluster::KeepLogs, KeepServiceLog), as the
// shim keeps a local one.
struct AttemptLogs {
  // The values of the secrets the run's env refers to: masked as the logs are written.
  std::vector<std::string> secrets;
  // The attempt's cap for all its logs together (the resolved limits.max_log_bytes; 0: none),
  // split evenly among its `workers` ranks; the newest output is kept.
  int64_t max_bytes = 0;
  int workers = 1;
  // Where the lines a Job's pods write to $TAU_METRICS_FILE are appended (the run's
  // metrics.jsonl, which the evidence worker reads); "": not collected.
  std::string metrics_file;
};

class ServiceDriver {
 public:
  virtual ~ServiceDriver() = default;
  // The service's objects (kube::RenderService) in apply order; InvalidArgument says what to fix.
  virtual Result<std::vector<nlohmann::json>> RenderService(const ServiceLaunch& launch) = 0;
  // Server-side applies `objects` (RenderService's, with the workspace's secrets first when the
  // launch has any): a Deployment rolls its replicas over to a new revision by itself.
  virtual Status ApplyService(const ServiceLaunch& launch,
                              const std::vector<nlohmann::json>& objects) = 0;
  // Deletes the objects named by `refs` ({apiVersion, kind, namespace, name}); their pods go
  // with them. Deleting what is gone is not an error.
  virtual Status DeleteService(const std::vector<nlohmann::json>& refs) = 0;
  // The service's Deployment (`kind` "Deployment") or RayService, and the pods labelled
  // tau.dev/service=NAME in `ns`.
  virtual Result<ServiceObserved> ObserveService(const std::string& ns, const std::string& name,
                                                 const std::string& kind) = 0;
  // Keeps the log of a replica pod's `container` in `path` (masked and capped as `logs` says),
  // from its start, until the pod ends or the cluster stops; a later call for the same path
  // resumes where the kept log ends.
  virtual void KeepServiceLog(const std::string& ns, const std::string& pod,
                              const std::string& container, const std::string& path,
                              AttemptLogs logs) = 0;
};

}  // namespace tau::server
