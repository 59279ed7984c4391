// A Kubernetes API client: kubeconfig and in-cluster configuration, typed resource paths for the
// kinds tau uses, CRUD and server-side apply, watches with relist on 410 Gone, pod log streams and
// access reviews. Requests go over HTTP(S) through libcurl, which is loaded with dlopen on first
// use (see curl_lib.cc for why), so a process that never talks to a cluster never loads it.
//
// What it offers:
//   * ClusterConfig and its loaders: LoadKubeconfig / ParseKubeconfig (contexts, tokens, token
//     files, client certificates, CA data, exec credential plugins), LoadInClusterConfig and
//     LoadDefaultConfig ($KUBECONFIG, ~/.kube/config, then in-cluster);
//   * LookupResource / ResourcePath: (apiVersion, kind) -> REST path;
//   * Client: Get, List (paged), Create, Replace, Apply (server-side), MergePatch, UpdateStatus,
//     Delete, Watch, StreamLogs, CheckAccess (SubjectAccessReview). Retries 429, 5xx and
//     connection errors with capped exponential backoff and jitter, honouring Retry-After;
//   * WatchLoop: list + watch + relist, keeping a cache and delivering a consistent event stream.
//
// Errors: every call returns Status / Result; the API's Status message is carried into the text.
// HTTP codes map to: 400/422 InvalidArgument, 401 Unauthenticated, 403 PermissionDenied,
// 404 NotFound, 409 AlreadyExists (reason AlreadyExists) or FailedPrecondition (any other 409, a
// Conflict: re-read and try again; see IsConflict), 410 ResourceExhausted (the resourceVersion is
// too old), 429/5xx/connection errors after the last retry Unavailable.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mutex.h"
#include "common/status.h"

namespace tau::kubeapi {

// ---- configuration ----

// An exec credential plugin (users[].user.exec in a kubeconfig).
struct ExecConfig {
  std::string command;  // "" : no plugin
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  std::string api_version = "client.authentication.k8s.io/v1";
};

struct ClusterConfig {
  std::string server;  // "https://host:port" (or http:// for tests)
  std::string ca_file;
  std::string ca_data;  // PEM
  bool insecure_skip_tls_verify = false;
  // The name the server's certificate is checked against (and sent as SNI), when it is not the
  // host of `server` (kubeconfig tls-server-name: an API server reached by IP or through a
  // tunnel).
  std::string tls_server_name;
  std::string token;
  std::string token_file;  // re-read at most once a minute (service account tokens rotate)
  std::string client_cert_file;
  std::string client_key_file;
  std::string client_cert_data;  // PEM
  std::string client_key_data;   // PEM
  ExecConfig exec;
  std::string namespace_name = "default";  // the context's namespace
  std::string context;                     // the context used ("" for in-cluster)
};

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

// Parses a kubeconfig. `context` overrides current-context; relative file paths are taken
// relative to `base_dir` (the kubeconfig's directory).
Result<ClusterConfig> ParseKubeconfig(std::string_view yaml, const std::string& context,
                                      const std::string& base_dir);
Result<ClusterConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");
// KUBERNETES_SERVICE_HOST/PORT and the service account's token, ca.crt and namespace.
Result<ClusterConfig> LoadInClusterConfig(
    const std::string& service_account_dir = kServiceAccountDir);
// The first file of $KUBECONFIG (tau does not merge several files), else ~/.kube/config when it
// exists, else the in-cluster configuration.
Result<ClusterConfig> LoadDefaultConfig(const std::string& context = "");

// ---- resources ----

struct ResourceInfo {
  std::string api_version;  // "batch/v1", "v1"
  std::string kind;         // "Job"
  std::string resource;     // "jobs"
  bool namespaced = true;
};

// The kinds tau uses; NotFound for others.
Result<ResourceInfo> LookupResource(std::string_view api_version, std::string_view kind);
const std::vector<ResourceInfo>& KnownResources();
// "/apis/batch/v1/namespaces/NS/jobs/NAME[/SUBRESOURCE]"; `name` "" gives the collection. `ns` is
// ignored for cluster-scoped kinds.
Result<std::string> ResourcePath(std::string_view api_version, std::string_view kind,
                                 std::string_view ns, std::string_view name,
                                 std::string_view subresource = "");

// ---- the client ----

struct ClientOptions {
  int max_attempts = 5;  // tries per request, for 429, 5xx and connection errors
  int initial_backoff_ms = 200;
  int max_backoff_ms = 10000;  // also caps Retry-After
  int connect_timeout_ms = 10000;
  int request_timeout_ms = 60000;  // not for watches and log streams
  // A watch is given up (Unavailable) when it has not ended this long after its timeoutSeconds:
  // the API server ends every watch then, so one still open is held by a stalled connection or a
  // proxy, and would hide every later change. (Bookmarks do not help: they only come while the
  // watch is alive.)
  int watch_deadline_margin_ms = 30000;
  std::string field_manager = "tau";
  std::string user_agent = "tau";
};

struct ListOptions {
  std::string label_selector;
  int limit = 0;               // 0: everything in one response
  std::string continue_token;  // from a previous page
};

struct ObjectList {
  std::vector<nlohmann::json> items;
  std::string resource_version;
  std::string continue_token;  // "" on the last page
};

struct ApplyOptions {
  bool force = true;  // take ownership of fields other managers own
  bool dry_run = false;
};

enum class Propagation { kDefault, kForeground, kBackground, kOrphan };

struct DeleteOptions {
  Propagation propagation = Propagation::kBackground;
  bool ignore_not_found = true;  // 404: already gone, which is what the caller wanted
};

struct WatchOptions {
  std::string resource_version;  // "": start with ADDED events for what exists
  std::string label_selector;
  int timeout_seconds = 300;  // the server ends the watch after this
  bool allow_bookmarks = true;
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK (ERROR is turned into a Status)
  nlohmann::json object;
};

struct LogOptions {
  std::string container;
  bool follow = true;
  std::string since_time;  // RFC 3339, "" for all
};

// True for a 409 other than AlreadyExists: the object changed since it was read.
bool IsConflict(const Status& status);

// A budget for the calls the current thread makes while it lives (not watches and log streams):
// each request's timeout is cut to what is left, no retry starts after it, and a call past it
// fails as Unavailable, saying so. For callers that must not wait on a cluster for long, whatever
// ClientOptions allow (the Kubernetes backend's calls: a held webhook must not hold a namespace's
// runs for minutes). A call also ends, as Unavailable, once `stop` (when given) becomes true.
// Budgets nest: the inner one cannot extend the outer.
class CallBudget {
 public:
  explicit CallBudget(int64_t budget_ms, const std::atomic<bool>* stop = nullptr);
  ~CallBudget();
  CallBudget(const CallBudget&) = delete;
  CallBudget& operator=(const CallBudget&) = delete;
  // The monotonic deadline in force on this thread (0: none), and its stop flag (or null).
  static int64_t Deadline();
  static const std::atomic<bool>* Stop();

 private:
  int64_t saved_;
  const std::atomic<bool>* saved_stop_;
};

class Client {
 public:
  // Fails when libcurl cannot be loaded or the configuration is unusable, and for a token (or an
  // exec plugin) with a plain http:// server: credentials go over https only.
  static Result<std::unique_ptr<Client>> Create(ClusterConfig config, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClusterConfig& config() const { return config_; }
  // The connections this client has opened (each with its TLS handshake): requests reuse them
  // while they stay open.
  int64_t connections_opened() const { return connections_opened_.load(); }

  Result<nlohmann::json> Get(std::string_view api_version, std::string_view kind,
                             std::string_view ns, std::string_view name);
  // One page when options.limit > 0 (see continue_token), else everything. Items come back with
  // their apiVersion and kind, which the API server leaves out of a List's items.
  Result<ObjectList> List(std::string_view api_version, std::string_view kind, std::string_view ns,
                          const ListOptions& options = {});
  // POST; the namespace comes from the object's metadata.
  Result<nlohmann::json> Create(const nlohmann::json& object);
  // PUT; metadata.resourceVersion, when set, makes a stale write a conflict (IsConflict).
  Result<nlohmann::json> Replace(const nlohmann::json& object);
  // PUT .../status.
  Result<nlohmann::json> UpdateStatus(const nlohmann::json& object);
  // Server-side apply: PATCH application/apply-patch+yaml with fieldManager=tau.
  Result<nlohmann::json> Apply(const nlohmann::json& object, const ApplyOptions& options = {});
  // JSON merge patch (RFC 7386), on the object or a subresource ("status").
  Result<nlohmann::json> MergePatch(std::string_view api_version, std::string_view kind,
                                    std::string_view ns, std::string_view name,
                                    const nlohmann::json& patch, std::string_view subresource = "");
  Status Delete(std::string_view api_version, std::string_view kind, std::string_view ns,
                std::string_view name, const DeleteOptions& options = {});

  // Streams watch events to `on_event` until the server ends the watch (Ok), `on_event` returns
  // false (Ok), `stop` becomes true (Ok) or an error. A 410 (HTTP or an ERROR event with code 410)
  // is ResourceExhausted: relist (WatchLoop does).
  Status Watch(std::string_view api_version, std::string_view kind, std::string_view ns,
               const WatchOptions& options, const std::function<bool(const WatchEvent&)>& on_event,
               const std::atomic<bool>* stop = nullptr);
  // Streams a pod's log to `on_chunk` as it arrives, until the log ends, `on_chunk` returns false
  // or `stop` becomes true.
  Status StreamLogs(std::string_view ns, std::string_view pod, const LogOptions& options,
                    const std::function<bool(std::string_view)>& on_chunk,
                    const std::atomic<bool>* stop = nullptr);

  // GET through the API server's proxy to a Service's port: /api/v1/namespaces/NS/services/
  // SERVICE:PORT/proxy/PATH (a dashboard inside the cluster, reached with the client's own
  // credentials; RBAC: get on services/proxy). The answer's body as it came.
  Result<std::string> ServiceProxyGet(std::string_view ns, std::string_view service,
                                      std::string_view port, std::string_view path);
  // SubjectAccessReview: may `user` (in `groups`) `verb` the `resource` of API `group` ("" for
  // core) in `ns` ("" for cluster scope)?
  Result<bool> CheckAccess(const std::string& user, const std::vector<std::string>& groups,
                           const std::string& verb, const std::string& group,
                           const std::string& resource, const std::string& ns);

 private:
  struct Request;
  struct Transfer;
  struct Credentials;
  Client(ClusterConfig config, ClientOptions options);
  // A request with retries; Ok only for a 2xx answer. `on_data`, when set, receives a 200
  // answer's body as it arrives (watches, logs).
  Status Exchange(const Request& request, Transfer* transfer,
                  const std::function<bool(std::string_view)>* on_data,
                  const std::atomic<bool>* stop);
  // One try.
  Status Perform(const Request& request, Transfer* transfer,
                 const std::function<bool(std::string_view)>* on_data,
                 const std::atomic<bool>* stop);
  Result<nlohmann::json> Call(const Request& request);
  Result<Credentials> CurrentCredentials();
  void ForgetExecCredentials();

  struct Handle;  // a libcurl transfer and the connections it keeps open (client.cc)
  Handle* TakeHandle();
  void GiveBack(Handle* handle, bool performed);  // `performed`: a transfer ran on it

  ClusterConfig config_;
  ClientOptions options_;
  std::atomic<int64_t> connections_opened_{0};
  Mutex mu_;
  std::vector<Handle*> idle_ TAU_GUARDED_BY(mu_);  // at most kIdleHandles, ready for a request
  std::unique_ptr<Credentials> exec_cache_ TAU_GUARDED_BY(mu_);
  std::string file_token_ TAU_GUARDED_BY(mu_);
  int64_t file_token_read_ms_ TAU_GUARDED_BY(mu_) = 0;
};

// ---- informer-like loop ----

// List, then watch from the list's resourceVersion; on 410 Gone, or when a watch ends, relist or
// re-watch. A cache of the objects (namespace/name -> object) makes the event stream consistent
// across relists: a relist delivers ADDED for new objects, MODIFIED for changed ones (by
// resourceVersion), DELETED for vanished ones, and nothing for unchanged ones, so no change is
// lost and none is delivered twice.
class WatchLoop {
 public:
  struct Options {
    ListOptions list;  // label selector; limit pages the relists
    int watch_timeout_seconds = 300;
    int error_backoff_ms = 500;  // after an error other than 410
  };
  WatchLoop(Client* client, std::string api_version, std::string kind, std::string ns,
            Options options);

  // Runs until `stop` becomes true (Ok) or an error that is not worth retrying (a permission
  // error, an unknown kind). `on_event` is called from this thread; BOOKMARKs are not delivered.
  Status Run(const std::function<void(const WatchEvent&)>& on_event, const std::atomic<bool>& stop);

  // Thread-safe views.
  std::string resource_version() const;
  std::vector<nlohmann::json> Snapshot() const;
  int relists() const { return relists_.load(); }

 private:
  Status Relist(const std::function<void(const WatchEvent&)>& on_event);
  void Deliver(const WatchEvent& event, const std::function<void(const WatchEvent&)>& on_event);

  Client* client_;
  std::string api_version_;
  std::string kind_;
  std::string ns_;
  Options options_;
  mutable Mutex mu_;
  std::map<std::string, nlohmann::json> cache_ TAU_GUARDED_BY(mu_);
  std::string resource_version_ TAU_GUARDED_BY(mu_);
  std::atomic<int> relists_{0};
};

}  // namespace tau::kubeapi
