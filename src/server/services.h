// Services (`tau serve`, docs/serving.md): a service's replicas are runs of its spec (the
// controller admits, places, restarts and re-adopts them like any run), and this manager keeps
// each service's replicas as its record says: as many as wanted at its newest revision, probed
// for readiness and liveness, rolled one at a time on an update, drained before they are stopped.
// The endpoint (/serve/NAME/...) asks it for a ready replica per request.
//
// Every change of a service is written to the store before it is acted on; what it knows of its
// replicas beyond their runs (probe results, draining) is rebuilt after a restart by probing them.
//
// On an engine that offers a ServiceDriver (Options::driver; the Kubernetes backend) a service is
// its Deployment (or RayService) and Service on the cluster instead (kube::RenderService): the
// manager applies its objects when its revision or replica count changes, reads their status and
// pods back every observe_ms, keeps each replica pod's log under layout::ServiceLogsDir, and
// deletes the objects on delete; the Deployment controller rolls replicas and the kubelet probes
// and restarts them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/types.h"
#include "backend/service_driver.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "controller/controller.h"
#include "store/store.h"

namespace tau::server {

// A deploy or an update (POST /api/v1/services, PUT /api/v1/services/NAME): a submission's spec and
// code, the service's name (the spec's name when "") and the run it serves (overrides the spec's
// serve.from when set).
struct DeployRequest {
  SubmitRequest submit;
  std::string name;
  std::string from_run;
};

class ServiceManager {
 public:
  struct Options {
    Clock* clock = nullptr;  // null: the system clock
    // How often replicas' runs are read back and the services reconciled (probes keep their
    // own periods).
    int64_t tick_ms = 100;
    // How long a draining replica may finish the requests it has before it is stopped anyway.
    int64_t drain_ms = 5'000;
    // The backend's ServiceDriver (Backend::services()): services are the engine's own objects
    // (null: replicas are runs, on an engine whose processes run here).
    ServiceDriver* driver = nullptr;
    std::string home;  // where the replica pods' logs are kept (with a cluster)
    // How often a service's objects and pods are read back from the cluster.
    int64_t observe_ms = 2'000;
  };
  ServiceManager(Options options, Controller* controller, store::Store* store, Metrics* metrics);
  ~ServiceManager();

  // Reads the services back from the store and starts reconciling them.
  Status Start();
  void Stop();

  // Validates the spec as a replica's submission, stores the code once and records the service;
  // its replicas are submitted by the manager next. FailedPrecondition on a backend that cannot
  // run services.
  Result<api::Service> Deploy(DeployRequest request, SubmitError* error);
  // A new revision from a new spec and code: replicas replaced one at a time, each new one ready
  // before an old one leaves.
  Result<api::Service> Update(DeployRequest request, SubmitError* error);
  // Makes a revision the service kept current again: `to`, or (0) the one before the current
  // one. Its replicas (those still running of it included) are rolled in as an update's are.
  Result<api::Service> Rollback(const std::string& name, int64_t to);
  Result<api::Service> Scale(const std::string& name, int64_t replicas);
  // Drains and stops every replica, then forgets the service.
  Result<api::Service> Delete(const std::string& name);
  Result<api::Service> Get(const std::string& name);
  // A replica pod's kept log from byte `offset` (at most `limit` bytes) and the log's size; on the
  // Kubernetes backend only (a local replica is a run: `tau logs RUN`).
  struct LogPart {
    std::string data;
    int64_t size = 0;
  };
  Result<LogPart> ReplicaLog(const std::string& name, const std::string& pod, int64_t offset,
                             int64_t limit);
  // Every service, or those of `workspaces`.
  std::vector<api::Service> List(const std::optional<std::vector<std::string>>& workspaces);

  // The endpoint's side. A ready replica of the service (round robin), not one of `tried`; its
  // in-flight count is raised until Done.
  struct Lease {
    std::string service, replica;
    int port = 0;
  };
  struct Pick {
    std::string workspace;         // the service's (the caller's access is checked against it)
    std::optional<Lease> lease;    // none when no replica is ready
    std::string cluster_endpoint;  // a service on Kubernetes: its address in the cluster
  };
  // nullopt when there is no such service. One lock for the whole choice: it is taken per request.
  std::optional<Pick> Acquire(const std::string& service, const std::set<std::string>& tried);
  // `reached`: the replica answered; false takes it out of rotation until a probe passes again.
  void Done(const Lease& lease, bool reached);
  // What the endpoint counts per service (the service's `requests`).
  void CountRequest(const std::string& service, int status, bool retried, double seconds);

  // One reconcile pass, on the caller's thread (the probes it sends end on threads of their own).
  void ReconcileOnce();

 private:
  struct Replica {
    std::string run;
    std::string state;
    std::string reason;
    int64_t revision = 0;
    int port = 0;
    int attempts = 0;                // the run's attempts when last read
    std::optional<int64_t> started;  // when the current attempt started running
    bool ready = false;
    bool was_ready = false;  // this attempt passed readiness once: liveness applies from then
    bool draining = false;
    bool cancel_sent = false;
    int64_t drain_since = 0;
    int successes = 0, failures = 0;  // readiness, in a row
    int live_failures = 0;            // liveness, in a row
    int64_t next_ready_probe = 0, next_live_probe = 0;
    bool ready_probing = false, live_probing = false;  // a probe is in flight
    std::string probe;                                 // the last failure
    int in_flight = 0;
    int ready_attempt = 0;  // the last attempt that passed readiness
    // Attempts in a row that ended before they were ready, and how the last one ended: its
    // exit code (or signal) and the last line of its log.
    int failed_starts = 0;
    std::optional<int> exit_code, exit_signal;
    std::string last_line;
  };
  struct Service {
    store::ServiceRecord record;
    spec::Serve serve;  // of the current revision's spec
    std::map<std::string, Replica> replicas;
    size_t next = 0;  // round robin
    int64_t requests = 0, failed = 0, retried = 0;
    int64_t restarts = 0;  // of replicas since the service was recorded (kept in the record)
    // New replicas wait until then after replicas ended on their own or were refused (doubling
    // backoff, reset when one is ready).
    int64_t add_not_before = 0;
    int64_t add_backoff_ms = 0;
    std::string last_add_error;
    // On a cluster: what was read back last, when to read again, and the applies that failed.
    ServiceObserved observed;
    std::map<std::string, ServicePod> pods;  // by name, as last read
    int64_t next_observe = 0;
    int64_t apply_not_before = 0, apply_backoff_ms = 0;
    std::string last_cluster_error;  // of an apply or a delete
    std::string last_observe_error;
    std::set<std::string> kept_logs;  // pods whose logs are being kept
    bool observed_once = false;  // pods read before (after a restart the first read says nothing)
  };

  int64_t Now();
  void Loop();
  // Reads the service's replica runs back from the store; the ones that ended are dropped.
  void Refresh(Service& s);
  struct DueProbe {
    std::string run;
    int port = 0;
    int attempt = 0;  // the replica's attempts when it was sent
    bool liveness = false;
    spec::Probe probe;
  };
  // The service's due probes, each sent on a thread of its own; ProbeDone applies its result.
  void StartProbes(Service& s);
  std::vector<DueProbe> DueProbes(Service& s);
  void ProbeDone(const std::string& service, const DueProbe& probe, const std::string& failed);
  void Converge(Service& s) TAU_REQUIRES(mu_);
  // A pass over a service on the cluster; true once a deleted service's objects are gone.
  bool ReconcileOnCluster(Service& s);
  // Renders the current revision and applies it; its objects are recorded first.
  Status ApplyOnCluster(Service& s);
  void ObserveOnCluster(Service& s);
  // Said once per distinct error in the history; applies are tried again after a doubling wait.
  void ClusterFailed(Service& s, const std::string& type, const Status& status);
  // Submits one replica of the current revision.
  Status AddReplica(Service& s) TAU_REQUIRES(mu_);
  void StartDrain(Service& s, Replica& r, const std::string& why);
  // Stops a rollout whose new replicas keep failing before they are ready: they are drained and
  // the old revision's replicas keep serving (recorded as the record's "rollout").
  void HaltRollout(Service& s, const Replica& failing) TAU_REQUIRES(mu_);
  void AppendHistory(Service& s, const std::string& type, const std::string& message);
  Status Save(Service& s);
  api::Service View(const Service& s) const;
  // What a service on a cluster shows: its pods as replicas, its objects in extra.cluster.
  void ClusterView(const Service& s, api::Service* v) const;
  int FreePort(const Service& s) TAU_REQUIRES(mu_);
  // The checked service of a deploy or update (its spec as a replica would be submitted).
  // `serve` gets the spec's serve section.
  Result<store::ServiceRecord> Prepare(DeployRequest& request, int64_t revision,
                                       const store::ServiceRecord* previous, spec::Serve* serve,
                                       SubmitError* error);

  const Options options_;
  Controller* const controller_;
  store::Store* const store_;
  Metrics* const metrics_;
  Clock* clock_;

  Mutex mu_;
  std::map<std::string, std::unique_ptr<Service>> services_ TAU_GUARDED_BY(mu_);
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  CondVar wake_;
  struct ProbeThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<ProbeThread> probe_threads_ TAU_GUARDED_BY(mu_);
  std::atomic<bool> stop_probes_{false};  // raised by Stop: probes in flight end at once
  // Reconcile passes run one at a time (the loop, or a test's hand).
  Mutex pass_mu_;
  std::thread thread_;
};

// The probes and the endpoint's forwarding (serve_proxy.cc): plain HTTP/1.0 to 127.0.0.1:port.
// An HTTP probe passes when the replica answers 2xx or 3xx within `timeout_ms`; a TCP probe when it
// accepts a connection. Returns "" when it passed, else why it failed; raising `stop` ends it
// early, failed.
std::string ProbeReplica(int port, const std::string& http_path, int64_t timeout_ms,
                         const std::atomic<bool>* stop = nullptr);
struct ForwardResult {
  bool connected = false;  // the replica took the connection (the request may have reached it)
  bool answered = false;   // a whole answer came back
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // without hop-by-hop ones
  std::string body;
  std::string error;
};
// Sends `method target` with `headers` (hop-by-hop ones dropped) and `body`, and reads the whole
// answer (at most 64 MiB) within `timeout_ms`.
ForwardResult ForwardRequest(int port, const std::string& method, const std::string& target,
                             const std::map<std::string, std::string>& headers,
                             const std::string& body, int64_t timeout_ms);

}  // namespace tau::server
