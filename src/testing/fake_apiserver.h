// A stand-in Kubernetes API server for tests: in-process, real HTTP on 127.0.0.1 (tau's own
// HttpServer), following the API conventions the client relies on. It is not a real API server
// (none can run on the project's machines): no schemas, no admission, no garbage collection, no
// field ownership beyond recording the applying manager. What it does:
//   * objects per (group/version/resource, namespace, name) with metadata.resourceVersion from
//     one global counter, uid, creationTimestamp and generation (bumped when anything outside
//     metadata and status changes);
//   * GET, LIST (kind XList, metadata.resourceVersion, labelSelector with =, ==, != and
//     existence, limit + continue), POST (409 AlreadyExists), PUT (409 Conflict on a stale
//     resourceVersion), PATCH (409 Conflict on a stale metadata.resourceVersion in the patch, a
//     precondition as in the API server) as server-side apply (fieldManager required; creates, or
//     merges the applied fields; records managedFields) or as JSON merge patch, DELETE
//     (propagationPolicy recorded; the object is removed at once), the status subresource;
//   * watches (?watch=true): JSON lines, chunked, events after resourceVersion from a bounded
//     history; a version older than the history gets an ERROR event with code 410 (Expired);
//     BOOKMARK events when allowWatchBookmarks=true; timeoutSeconds;
//   * pod logs per container (/log, follow=true streams what tests append; container= as the API
//     server takes it: required with several containers, 400 for one the pod lacks or one still
//     waiting to start), SubjectAccessReviews from grants;
//   * the service proxy (GET .../services/NAME:PORT/proxy/PATH) answering what tests set;
//   * legacy discovery (/api, /apis, resource lists) for the kinds tau knows, so kubectl works;
//   * test controls: failure injection (429/500/503 with Retry-After), a required bearer token,
//     and a request log; and one over HTTP for tests in another process (tau-fake-apiserver,
//     tests/fake_apiserver): POST /fake/logs/NAMESPACE/POD[?container=C] appends the body to the
//     container's log (AppendLog), with ?end=true ends it (EndLog); POST /fake/cut-logs cuts
//     the open log streams (CutLogStreams); POST /fake/hold-writes?namespace=NS[&held=false]
//     holds or releases a namespace's writes (HoldWrites); POST /fake/proxy?namespace=NS&
//     service=NAME:PORT&path=P sets what the service proxy answers (SetProxied); POST
//     /fake/expire-watches (ExpireWatches). They are no API-server paths.
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
  };
  struct LogStream {
    std::vector<std::pair<int64_t, std::string>> chunks;  // (epoch ms, text)
    bool ended = false;
  };
  struct WatchCursor;

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
  // Stamps a new resourceVersion, stores, records the event. Caller holds mu_.
  nlohmann::json Commit(const Target& target, const std::string& type, nlohmann::json object)
      TAU_REQUIRES(mu_);

  http::HttpServer http_;
  std::thread serve_thread_;
  int port_ = 0;
  bool tls_ = false;

  mutable Mutex mu_;
  CondVar changed_;  // signalled on every commit, log append and control change
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  // collection -> "namespace/name" -> object
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_ TAU_GUARDED_BY(mu_);
  int64_t resource_version_ TAU_GUARDED_BY(mu_) = 100;
  int64_t next_uid_ TAU_GUARDED_BY(mu_) = 1;
  std::deque<Event> history_ TAU_GUARDED_BY(mu_);
  size_t history_limit_ TAU_GUARDED_BY(mu_) = 1000;
  int64_t compacted_rv_ TAU_GUARDED_BY(mu_) = 0;  // events at or below it are gone
  int expire_epoch_ TAU_GUARDED_BY(mu_) = 0;
  int end_epoch_ TAU_GUARDED_BY(mu_) = 0;
  int log_cut_epoch_ TAU_GUARDED_BY(mu_) = 0;
  bool watches_paused_ TAU_GUARDED_BY(mu_) = false;
  bool watches_stalled_ TAU_GUARDED_BY(mu_) = false;
  std::set<std::string> held_namespaces_ TAU_GUARDED_BY(mu_);
  std::map<std::string, std::string> proxied_ TAU_GUARDED_BY(mu_);  // "ns/svc:port/path" -> body
  int bookmark_interval_ms_ TAU_GUARDED_BY(mu_) = 1000;
  std::map<std::string, LogStream> logs_ TAU_GUARDED_BY(mu_);  // "ns/pod/container" -> its log
  std::string required_token_ TAU_GUARDED_BY(mu_);
  int failures_left_ TAU_GUARDED_BY(mu_) = 0;
  int failure_status_ TAU_GUARDED_BY(mu_) = 500;
  int failure_retry_after_ TAU_GUARDED_BY(mu_) = 0;
  std::set<std::string> grants_ TAU_GUARDED_BY(mu_);
  std::vector<RequestRecord> requests_ TAU_GUARDED_BY(mu_);
};

}  // namespace tau::testutil
