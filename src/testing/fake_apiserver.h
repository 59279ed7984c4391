// A stand-in Kubernetes API server for tests: in-process, real HTTP on 127.0.0.1 (tau's own
// HttpServer), following the API conventions the client relies on. It is not a real API server
// (none can run on the project's machines): no admission beyond namespace existence, no pod
// grace periods, no finalizers other than the garbage collector's. What it does:
//   * objects per (group/version/resource, namespace, name) with metadata.resourceVersion from
//     one global counter, uid, creationTimestamp and generation (bumped when anything outside
//     metadata and status changes);
//   * the namespaces a new cluster has (default, kube-system, kube-public, kube-node-lease);
//     creating an object in a namespace that does not exist answers 404 (namespaces "X" not
//     found), and deleting a namespace deletes what is in it;
//   * GET, LIST (kind XList, metadata.resourceVersion, labelSelector with =, ==, != and
//     existence, fieldSelector with =, ==, != on the fields the API server supports per kind,
//     400 for others, limit + continue), POST (409 AlreadyExists), PUT (409 Conflict on a stale
//     resourceVersion), PATCH (409 Conflict on a stale metadata.resourceVersion in the patch, a
//     precondition as in the API server) as server-side apply (fieldManager required; creates or
//     merges; field ownership per manager in managedFields, leaf fields with lists owned whole:
//     409 Conflict when another manager owns a field the apply changes, unless force=true; a field
//     the manager stopped applying and nobody else owns is removed) or as JSON merge patch, the
//     status subresource; every write records its manager (Update) and the fields it changed;
//   * DELETE with propagationPolicy (query or DeleteOptions body; the default per resource,
//   batch/v1
//     Jobs orphaning their pods) and owner references, as the garbage collector would, at once:
//     Background (the owner goes, then its dependents), Foreground (the owner gets
//     deletionTimestamp and the foregroundDeletion finalizer, its dependents go, then it does),
//     Orphan (the dependents lose the owner reference); each change its own watch event;
//   * batch/v1 Jobs' ttlSecondsAfterFinished, as the TTL controller (a thread here): a finished
//     Job (condition Complete or Failed, "True") is deleted, Foreground, that long after the
//     condition's lastTransitionTime (else after the write that finished it, where the real
//     controller, finding no time, never deletes it);
//   * dryRun=All on POST, PUT, PATCH and DELETE: the answer as if done, nothing stored;
//   * watches (?watch=true): JSON lines, chunked, events after resourceVersion from a bounded
//     history, with label and field selectors (an object that leaves the selection is a DELETED
//     event, one that enters it ADDED); a version older than the history gets an ERROR event with
//     code 410 (Expired); BOOKMARK events when allowWatchBookmarks=true; timeoutSeconds;
//   * pod logs per container (/log, follow=true streams what tests append; container= as the API
//     server takes it: required with several containers, 400 for one the pod lacks or one still
//     waiting to start), SubjectAccessReviews from grants;
//   * the service proxy (GET .../services/NAME:PORT/proxy/PATH) answering what tests set;
//   * legacy discovery (/api, /apis, resource lists) for the kinds tau knows and Events, so
//     kubectl works; JSON bodies, and a Namespace in protobuf (as `kubectl create namespace`
//     sends it; other protobuf bodies answer 415);
//   * test controls: failure injection (429/500/503 with Retry-After), a required bearer token,
//     and a request log; and one over HTTP for tests in another process (tau-fake-apiserver,
//     tests/fake_apiserver): POST /fake/logs/NAMESPACE/POD[?container=C] appends the body to the
//     container's log (AppendLog), with ?end=true ends it (EndLog); POST /fake/cut-logs cuts
//     the open log streams (CutLogStreams); POST /fake/hold-writes?namespace=NS[&held=false]
//     holds or releases a namespace's writes (HoldWrites); POST /fake/proxy?namespace=NS&
//     service=NAME:PORT&path=P sets what the service proxy answers (SetProxied); POST
//     /fake/expire-watches (ExpireWatches). They are no API-server paths.
//   * custom resources validated against their CRDs' schemas when given them (SetSchemas,
//     LoadCrds; tau-fake-apiserver loads the repository's copies): 422 Invalid naming the fields
//     (unknown fields included, which a real server prunes unless fieldValidation=Strict);
//   * HTTPS when started with a certificate (Start(tls)).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mutex.h"
#include "common/status.h"
#include "http/http.h"

namespace tau::kube {
class SchemaSet;
}  // namespace tau::kube

namespace tau::testutil {

class FakeApiServer {
 public:
  struct RequestRecord {
    std::string method;
    std::string path;
    std::map<std::string, std::string> params;  // the query, decoded
    std::string content_type;
    std::string authorization;
  };

  FakeApiServer();
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // Listens on 127.0.0.1 on a free port and serves on a thread; with `tls`, HTTPS only (real
  // clients refuse to send a bearer token over plain HTTP).
  Status Start(const http::TlsServerConfig* tls = nullptr);
  std::string url() const;  // "http[s]://127.0.0.1:PORT"

  // Test controls.
  void RequireToken(const std::string& token);  // "" : no authentication
  // The next `count` requests answer `http_status` with Retry-After (seconds) when > 0.
  void InjectFailures(int count, int http_status, int retry_after_seconds);
  // A container's log (`container` "": the pod's first container, as the API server's default).
  void AppendLog(const std::string& ns, const std::string& pod, const std::string& text,
                 const std::string& container = "");
  void EndLog(const std::string& ns, const std::string& pod,
              const std::string& container = "");  // the container exited
  // Open log streams end now although their containers still run (as a kubelet or API server
  // restart, or a proxy's timeout, cuts them); the logs go on.
  void CutLogStreams();
  // Drops the watch history (as etcd compaction does): open watches get a 410 ERROR event and
  // watches from an older resourceVersion are refused the same way.
  void ExpireWatches();
  // Open watches end normally (as when their timeout passes).
  void EndWatches();
  // Paused watches deliver nothing (events stay in the history) until resumed.
  void PauseWatches(bool paused);
  // The same for the watches of one collection ("v1/pods") only: its news comes after the others'.
  void PauseWatchesOf(const std::string& collection, bool paused);
  // LISTs of one collection (not its watches) answer `http_status` (0: as usual again).
  void FailLists(const std::string& collection, int http_status);
  // Stalled watches write nothing, not even their end at timeoutSeconds, until un-stalled.
  void StallWatches(bool stalled);
  // Writes (POST, PUT, PATCH, DELETE) in namespace `ns` wait until released, as behind an
  // admission webhook that does not answer.
  void HoldWrites(const std::string& ns, bool held);
  // What GET /api/v1/namespaces/NS/services/SERVICE_PORT/proxy/PATH answers (200, `body`), as
  // the program behind the Service would (a Ray head's dashboard). The Service must exist (404);
  // a path never set answers 503, as the API server does when nothing behind a Service answers.
  void SetProxied(const std::string& ns, const std::string& service_port, const std::string& path,
                  const std::string& body);
  // Custom resources (kueue.x-k8s.io, ray.io, ...) whose kind `schemas` knows are validated on
  // every write, as the API server validates them against their CRD's schema: 422 Invalid with
  // details.causes naming the fields. Null: no validation.
  void SetSchemas(std::shared_ptr<const kube::SchemaSet> schemas);
  // SetSchemas with every CustomResourceDefinition in the directory's *.yaml files.
  Status LoadCrds(const std::string& dir);
  void set_bookmark_interval_ms(int ms);
  void set_history_limit(size_t events);
  // SubjectAccessReviews allow exactly what was granted.
  void Grant(const std::string& user, const std::string& verb, const std::string& group,
             const std::string& resource, const std::string& ns);

  std::vector<RequestRecord> Requests() const;
  void ClearRequests();
  int64_t resource_version() const;
  // The stored object, or null. `collection` is "group/version/resource" ("v1/pods",
  // "batch/v1/jobs").
  nlohmann::json Object(const std::string& collection, const std::string& ns,
                        const std::string& name) const;
  size_t ObjectCount(const std::string& collection) const;

 private:
  struct Target;
  struct Event {
    int64_t resource_version;
    std::string collection;
    std::string ns;
    std::string type;
    nlohmann::json object;
    nlohmann::json previous;  // a MODIFIED object's state before: selectors see it leave or enter
  };
  struct LogStream {
    std::vector<std::pair<int64_t, std::string>> chunks;  // (epoch ms, text)
    bool ended = false;
  };
  struct WatchCursor;
  struct Selector;

  void Handle(const http::HttpRequest& req, http::HttpResponse& res);
  void HandleGet(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleList(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleWatch(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleLog(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleCreate(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleReplace(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandlePatch(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleDelete(const Target& target, const http::HttpRequest& req, http::HttpResponse& res);
  void HandleAccessReview(const http::HttpRequest& req, http::HttpResponse& res);
  void HandleServiceProxy(const http::HttpRequest& req, const std::vector<std::string>& rest,
                          http::HttpResponse& res);
  // /api, /apis, /api/v1 and /apis/G/V, enough for kubectl; false for other paths.
  bool HandleDiscovery(const http::HttpRequest& req, http::HttpResponse& res);
  bool StreamWatch(WatchCursor* cursor, http::ChunkSink& sink);
  // "ns/pod/container" of a container's log; "" names the pod's first container.
  std::string LogKey(const std::string& ns, const std::string& pod, const std::string& container)
      TAU_REQUIRES(mu_);
  // Stamps a new resourceVersion, stores, records the event; the object's collection and
  // namespace name where. With `dry_run`, the object as it would be, nothing stored.
  nlohmann::json Commit(const std::string& collection, const std::string& type,
                        nlohmann::json object, bool dry_run = false) TAU_REQUIRES(mu_);
  bool NamespaceExists(const std::string& ns) const TAU_REQUIRES(mu_);
  // False, with the 422 written, when a custom resource fails its CRD's schema.
  bool SchemaValid(const Target& target, const nlohmann::json& object,
                   http::HttpResponse& res) const TAU_REQUIRES(mu_);
  // Deletes an object as the API server and the garbage collector would (see the header comment);
  // its state as the DELETE answers it. `policy` "": the object's finalizers', else the
  // resource's default.
  nlohmann::json DeleteLocked(const std::string& collection, const std::string& key,
                              std::string policy, std::set<std::string>* deleting)
      TAU_REQUIRES(mu_);
  // The objects (collection, key) with an owner reference to `uid`.
  std::vector<std::pair<std::string, std::string>> Dependents(const std::string& uid) const
      TAU_REQUIRES(mu_);
  bool UidExists(const std::string& uid) const TAU_REQUIRES(mu_);
  // Whether a dependent has an owner other than `uid` that exists and is not being deleted.
  bool HasOtherOwner(const nlohmann::json& dependent, const std::string& uid,
                     const std::set<std::string>& deleting) const TAU_REQUIRES(mu_);
  void DropOwnerReference(const std::string& collection, const std::string& key,
                          const std::string& uid) TAU_REQUIRES(mu_);
  // The garbage collector deleting a dependent whose owners are gone.
  void CollectDependent(const std::string& collection, const std::string& key, bool foreground,
                        std::set<std::string>* deleting) TAU_REQUIRES(mu_);
  // The TTL-after-finished controller: deletes finished Jobs whose time is up, until stopping.
  void SweepFinishedJobs();

  http::HttpServer http_;
  std::thread serve_thread_;
  std::thread sweeper_;
  int port_ = 0;
  bool tls_ = false;

  mutable Mutex mu_;
  CondVar changed_;  // signalled on every commit, log append and control change
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  // collection -> "namespace/name" -> object
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_ TAU_GUARDED_BY(mu_);
  // Whether the pod's container has exited (or the pod is gone): its followed log then ends.
  bool ContainerExited(const std::string& pod_key, const std::string& container) TAU_REQUIRES(mu_);
  int64_t resource_version_ TAU_GUARDED_BY(mu_) = 100;
  int64_t next_uid_ TAU_GUARDED_BY(mu_) = 1;
  std::deque<Event> history_ TAU_GUARDED_BY(mu_);
  size_t history_limit_ TAU_GUARDED_BY(mu_) = 1000;
  int64_t compacted_rv_ TAU_GUARDED_BY(mu_) = 0;  // events at or below it are gone
  int expire_epoch_ TAU_GUARDED_BY(mu_) = 0;
  int end_epoch_ TAU_GUARDED_BY(mu_) = 0;
  int log_cut_epoch_ TAU_GUARDED_BY(mu_) = 0;
  bool watches_paused_ TAU_GUARDED_BY(mu_) = false;
  std::set<std::string> paused_collections_ TAU_GUARDED_BY(mu_);
  std::map<std::string, int> failing_lists_ TAU_GUARDED_BY(mu_);  // collection -> HTTP status
  bool watches_stalled_ TAU_GUARDED_BY(mu_) = false;
  std::set<std::string> held_namespaces_ TAU_GUARDED_BY(mu_);
  std::map<std::string, std::string> proxied_ TAU_GUARDED_BY(mu_);  // "ns/svc:port/path" -> body
  int bookmark_interval_ms_ TAU_GUARDED_BY(mu_) = 1000;
  std::map<std::string, LogStream> logs_ TAU_GUARDED_BY(mu_);  // "ns/pod/container" -> its log
  // Job uid -> when a write first showed it finished (a condition without lastTransitionTime).
  std::map<std::string, int64_t> finished_seen_ms_ TAU_GUARDED_BY(mu_);
  std::shared_ptr<const kube::SchemaSet> schemas_ TAU_GUARDED_BY(mu_);
  std::string required_token_ TAU_GUARDED_BY(mu_);
  int failures_left_ TAU_GUARDED_BY(mu_) = 0;
  int failure_status_ TAU_GUARDED_BY(mu_) = 500;
  int failure_retry_after_ TAU_GUARDED_BY(mu_) = 0;
  std::set<std::string> grants_ TAU_GUARDED_BY(mu_);
  std::vector<RequestRecord> requests_ TAU_GUARDED_BY(mu_);
};

}  // namespace tau::testutil
