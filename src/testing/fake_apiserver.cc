#include "testing/fake_apiserver.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "kubeapi/kubeapi.h"

namespace tau::testutil {

using nlohmann::json;

// What a request's path names.
struct FakeApiServer::Target {
  std::string group_version;  // "v1", "batch/v1"
  std::string resource;       // "jobs"
  std::string collection;     // "batch/v1/jobs"
  std::string kind;           // "Job"
  std::string ns;
  std::string name;
  std::string subresource;  // "status", "log"
};

struct FakeApiServer::WatchCursor {
  std::string collection;
  std::string ns;
  std::map<std::string, std::string> equal;  // label selector requirements
  std::map<std::string, std::string> not_equal;
  std::vector<std::string> exists;
  int64_t sent_rv = 0;
  int64_t deadline_ms = 0;
  bool bookmarks = false;
  int64_t next_bookmark_ms = 0;
  int expire_epoch = 0;
  int end_epoch = 0;
  std::string pending;  // lines decided under the lock, written outside it
  bool expired = false;
};

namespace {

json StatusBody(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

void Reply(http::HttpResponse& res, int code, const json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void Fail(http::HttpResponse& res, int code, const std::string& reason,
          const std::string& message) {
  Reply(res, code, StatusBody(code, reason, message));
}

std::string Key(const std::string& ns, const std::string& name) { return ns + "/" + name; }

// Parses /api/v1/... and /apis/G/V/...; false for anything else.
bool ParseTarget(const std::string& path, std::string* group_version,
                 std::vector<std::string>* rest) {
  std::vector<std::string> parts = Split(path, '/');
  if (parts.size() < 3 || !parts[0].empty()) return false;
  size_t start;
  if (parts[1] == "api") {
    *group_version = parts[2];
    start = 3;
  } else if (parts[1] == "apis" && parts.size() >= 4) {
    *group_version = parts[2] + "/" + parts[3];
    start = 4;
  } else {
    return false;
  }
  rest->assign(parts.begin() + static_cast<long>(start), parts.end());
  return !rest->empty();
}

void ParseSelector(const std::string& selector, std::map<std::string, std::string>* equal,
                   std::map<std::string, std::string>* not_equal,
                   std::vector<std::string>* exists) {
  for (std::string term : Split(selector, ',')) {
    term.erase(0, term.find_first_not_of(' '));
    while (!term.empty() && term.back() == ' ') term.pop_back();
    if (term.empty()) continue;
    if (size_t p = term.find("!="); p != std::string::npos) {
      (*not_equal)[term.substr(0, p)] = term.substr(p + 2);
    } else if (size_t p2 = term.find("=="); p2 != std::string::npos) {
      (*equal)[term.substr(0, p2)] = term.substr(p2 + 2);
    } else if (size_t p3 = term.find('='); p3 != std::string::npos) {
      (*equal)[term.substr(0, p3)] = term.substr(p3 + 1);
    } else {
      exists->push_back(term);
    }
  }
}

bool Matches(const json& object, const std::map<std::string, std::string>& equal,
             const std::map<std::string, std::string>& not_equal,
             const std::vector<std::string>& exists) {
  json labels = object.contains("metadata") ? object["metadata"].value("labels", json::object())
                                            : json::object();
  if (!labels.is_object()) labels = json::object();
  for (const auto& [k, v] : equal)
    if (!labels.contains(k) || labels[k] != v) return false;
  for (const auto& [k, v] : not_equal)
    if (labels.contains(k) && labels[k] == v) return false;
  for (const std::string& k : exists)
    if (!labels.contains(k)) return false;
  return true;
}

// The fields a patch sets, as managedFields' fieldsV1 writes them ("f:KEY" maps; a list is owned
// whole, where the API server would name its items): real clients decode it (kubectl's
// server-side apply reads every entry's fieldsV1, and crashed on entries without one).
json FieldsV1(const json& value) {
  json out = json::object();
  if (!value.is_object()) return out;
  for (const auto& [key, child] : value.items()) {
    if (key == "apiVersion" || key == "kind") continue;
    out["f:" + key] = FieldsV1(child);
  }
  return out;
}

// A boolean query parameter as the API server reads it (Go's strconv.ParseBool): the Python
// client sends watch=True.
bool QueryBool(const std::string& value) {
  for (const char* yes : {"1", "t", "T", "true", "TRUE", "True"})
    if (value == yes) return true;
  return false;
}

json WithoutMetadataAndStatus(json object) {
  object.erase("metadata");
  object.erase("status");
  return object;
}

int64_t ParseVersion(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  return end != nullptr && *end == '\0' ? v : -1;
}

}  // namespace

FakeApiServer::FakeApiServer() {
  http_.set_max_body_bytes(16 << 20);
  for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE"})
    http_.Route(method, "/.*", [this](const http::HttpRequest& req, http::HttpResponse& res) {
      Handle(req, res);
    });
}

FakeApiServer::~FakeApiServer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.SignalAll();
  http_.Shutdown(3000);
  if (serve_thread_.joinable()) serve_thread_.join();
}

Status FakeApiServer::Start(const http::TlsServerConfig* tls) {
  TAU_RETURN_IF_ERROR(http_.ListenTcp("127.0.0.1", 0, tls));
  tls_ = tls != nullptr;
  port_ = http_.tcp_port();
  serve_thread_ = std::thread([this] { http_.Serve(); });
  return Status::Ok();
}

std::string FakeApiServer::url() const {
  return fmt::format("{}://127.0.0.1:{}", tls_ ? "https" : "http", port_);
}

void FakeApiServer::RequireToken(const std::string& token) {
  MutexLock lock(&mu_);
  required_token_ = token;
}

void FakeApiServer::InjectFailures(int count, int http_status, int retry_after_seconds) {
  MutexLock lock(&mu_);
  failures_left_ = count;
  failure_status_ = http_status;
  failure_retry_after_ = retry_after_seconds;
}

namespace {
// The names of a pod's containers and init containers.
std::vector<std::string> ContainerNames(const json& pod, const char* field) {
  std::vector<std::string> names;
  if (!pod.is_object() || !pod.contains("spec") || !pod["spec"].is_object()) return names;
  const json list = pod["spec"].value(field, json::array());
  if (list.is_array())
    for (const json& c : list)
      if (c.is_object()) names.push_back(c.value("name", ""));
  return names;
}
}  // namespace

std::string FakeApiServer::LogKey(const std::string& ns, const std::string& pod,
                                  const std::string& container) {
  std::string c = container;
  if (c.empty()) {
    // The pod's one container (the API server's default), when the pod says which.
    std::vector<std::string> names = ContainerNames(
        objects_["v1/pods"].count(Key(ns, pod)) ? objects_["v1/pods"][Key(ns, pod)] : json(),
        "containers");
    if (!names.empty()) c = names.front();
  }
  return Key(ns, pod) + "/" + c;
}

void FakeApiServer::AppendLog(const std::string& ns, const std::string& pod,
                              const std::string& text, const std::string& container) {
  {
    MutexLock lock(&mu_);
    logs_[LogKey(ns, pod, container)].chunks.emplace_back(NowMillis(), text);
  }
  changed_.SignalAll();
}

void FakeApiServer::EndLog(const std::string& ns, const std::string& pod,
                           const std::string& container) {
  {
    MutexLock lock(&mu_);
    logs_[LogKey(ns, pod, container)].ended = true;
  }
  changed_.SignalAll();
}

void FakeApiServer::CutLogStreams() {
  MutexLock lock(&mu_);
  ++log_cut_epoch_;
  changed_.SignalAll();
}

void FakeApiServer::ExpireWatches() {
  {
    MutexLock lock(&mu_);
    history_.clear();
    compacted_rv_ = resource_version_;
    ++expire_epoch_;
  }
  changed_.SignalAll();
}

void FakeApiServer::EndWatches() {
  {
    MutexLock lock(&mu_);
    ++end_epoch_;
  }
  changed_.SignalAll();
}

void FakeApiServer::PauseWatches(bool paused) {
  {
    MutexLock lock(&mu_);
    watches_paused_ = paused;
  }
  changed_.SignalAll();
}

void FakeApiServer::StallWatches(bool stalled) {
  {
    MutexLock lock(&mu_);
    watches_stalled_ = stalled;
  }
  changed_.SignalAll();
}

void FakeApiServer::HoldWrites(const std::string& ns, bool held) {
  {
    MutexLock lock(&mu_);
    if (held) {
      held_namespaces_.insert(ns);
    } else {
      held_namespaces_.erase(ns);
    }
  }
  changed_.SignalAll();
}

void FakeApiServer::set_bookmark_interval_ms(int ms) {
  MutexLock lock(&mu_);
  bookmark_interval_ms_ = ms;
}

void FakeApiServer::set_history_limit(size_t events) {
  MutexLock lock(&mu_);
  history_limit_ = events;
}

void FakeApiServer::Grant(const std::string& user, const std::string& verb,
                          const std::string& group, const std::string& resource,
                          const std::string& ns) {
  MutexLock lock(&mu_);
  grants_.insert(fmt::format("{}|{}|{}|{}|{}", user, verb, group, resource, ns));
}

std::vector<FakeApiServer::RequestRecord> FakeApiServer::Requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

void FakeApiServer::ClearRequests() {
  MutexLock lock(&mu_);
  requests_.clear();
}

int64_t FakeApiServer::resource_version() const {
  MutexLock lock(&mu_);
  return resource_version_;
}

json FakeApiServer::Object(const std::string& collection, const std::string& ns,
                           const std::string& name) const {
  MutexLock lock(&mu_);
  auto c = objects_.find(collection);
  if (c == objects_.end()) return nullptr;
  auto o = c->second.find(Key(ns, name));
  return o == c->second.end() ? json(nullptr) : o->second;
}

size_t FakeApiServer::ObjectCount(const std::string& collection) const {
  MutexLock lock(&mu_);
  auto c = objects_.find(collection);
  return c == objects_.end() ? 0 : c->second.size();
}

json FakeApiServer::Commit(const Target& target, const std::string& type, json object) {
  ++resource_version_;
  if (type != "DELETED") {
    object["metadata"]["resourceVersion"] = std::to_string(resource_version_);
    objects_[target.collection][Key(target.ns, object["metadata"].value("name", ""))] = object;
  } else {
    // A deleted object's last state carries the deletion's resourceVersion, as in the API.
    object["metadata"]["resourceVersion"] = std::to_string(resource_version_);
    objects_[target.collection].erase(Key(target.ns, object["metadata"].value("name", "")));
  }
  history_.push_back(Event{resource_version_, target.collection, target.ns, type, object});
  while (history_.size() > history_limit_) {
    compacted_rv_ = history_.front().resource_version;
    history_.pop_front();
  }
  changed_.SignalAll();
  return object;
}

void FakeApiServer::Handle(const http::HttpRequest& req, http::HttpResponse& res) {
  // Test control, not an API-server path: POST /fake/logs/NAMESPACE/POD appends the body to the
  // pod's log (AppendLog), and ?end=true then ends it (EndLog); POST /fake/cut-logs cuts the open
  // log streams (CutLogStreams). So a test in another process (tests/fake_apiserver) can play the
  // kubelet's logs. Neither recorded nor subject to the token or to injected failures.
  if (StartsWith(req.path, "/fake/")) {
    if (req.method == "POST" && req.path == "/fake/cut-logs") {
      CutLogStreams();
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/proxy") {
      SetProxied(req.get_param_value("namespace"), req.get_param_value("service"),
                 req.get_param_value("path"), req.body);
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/expire-watches") {
      ExpireWatches();
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/hold-writes") {
      HoldWrites(req.get_param_value("namespace"), req.get_param_value("held") != "false");
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    std::vector<std::string> parts = Split(req.path.substr(1), '/');
    if (req.method != "POST" || parts.size() != 4 || parts[1] != "logs" || parts[2].empty() ||
        parts[3].empty()) {
      Fail(res, 404, "NotFound", "unknown test control");
      return;
    }
    const std::string container = req.get_param_value("container");
    if (!req.body.empty()) AppendLog(parts[2], parts[3], req.body, container);
    if (req.get_param_value("end") == "true") EndLog(parts[2], parts[3], container);
    Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
    return;
  }
  Target target;
  {
    MutexLock lock(&mu_);
    auto header = [&](const char* name) {
      auto it = req.headers.find(name);
      return it == req.headers.end() ? std::string() : it->second;
    };
    requests_.push_back(RequestRecord{req.method, req.path, req.params, header("content-type"),
                                      header("authorization")});
    if (!required_token_.empty() && header("authorization") != "Bearer " + required_token_) {
      Fail(res, 401, "Unauthorized", "Unauthorized");
      return;
    }
    if (failures_left_ > 0) {
      --failures_left_;
      json body =
          StatusBody(failure_status_, failure_status_ == 429 ? "TooManyRequests" : "InternalError",
                     fmt::format("injected failure {}", failure_status_));
      if (failure_retry_after_ > 0) body["details"] = {{"retryAfterSeconds", failure_retry_after_}};
      Reply(res, failure_status_, body);
      if (failure_retry_after_ > 0)
        res.headers_out.emplace_back("Retry-After", std::to_string(failure_retry_after_));
      return;
    }
  }
  if (HandleDiscovery(req, res)) return;
  std::vector<std::string> rest;
  if (!ParseTarget(req.path, &target.group_version, &rest)) {
    Fail(res, 404, "NotFound", fmt::format("the server could not find the requested resource"));
    return;
  }
  if (target.group_version == "v1" && rest.size() >= 5 && rest[0] == "namespaces" &&
      rest[2] == "services" && rest[4] == "proxy") {
    HandleServiceProxy(req, rest, res);
    return;
  }
  // [namespaces NS] RESOURCE [NAME [SUBRESOURCE]]; /api/v1/namespaces[/NAME] is the Namespace
  // kind itself.
  size_t i = 0;
  if (rest[0] == "namespaces" && rest.size() >= 3) {
    target.ns = rest[1];
    i = 2;
  }
  target.resource = rest[i];
  if (i + 1 < rest.size()) target.name = rest[i + 1];
  if (i + 2 < rest.size()) target.subresource = rest[i + 2];
  if (i + 3 < rest.size()) {
    Fail(res, 404, "NotFound", "the server could not find the requested resource");
    return;
  }
  target.collection = target.group_version + "/" + target.resource;
  bool known = false;
  for (const kubeapi::ResourceInfo& info : kubeapi::KnownResources()) {
    if (info.api_version != target.group_version || info.resource != target.resource) continue;
    target.kind = info.kind;
    known = true;
    if (!info.namespaced) target.ns.clear();
  }
  if (!known) {
    Fail(res, 404, "NotFound",
         fmt::format("the server could not find the requested resource ({})", target.collection));
    return;
  }
  if (req.method != "GET") {
    // A held namespace's writes wait (as behind a webhook that does not answer) until released.
    MutexLock lock(&mu_);
    while (!stopping_ && held_namespaces_.count(target.ns))
      changed_.WaitFor(&mu_, std::chrono::milliseconds(50));
  }
  try {
    if (target.collection == "authorization.k8s.io/v1/subjectaccessreviews" && req.method == "POST")
      HandleAccessReview(req, res);
    else if (req.method == "GET" && target.subresource == "log" && target.resource == "pods")
      HandleLog(target, req, res);
    else if (req.method == "GET" && target.name.empty() && QueryBool(req.get_param_value("watch")))
      HandleWatch(target, req, res);
    else if (req.method == "GET" && target.name.empty())
      HandleList(target, req, res);
    else if (req.method == "GET")
      HandleGet(target, req, res);
    else if (req.method == "POST" && target.name.empty())
      HandleCreate(target, req, res);
    else if (req.method == "PUT" && !target.name.empty())
      HandleReplace(target, req, res);
    else if (req.method == "PATCH" && !target.name.empty())
      HandlePatch(target, req, res);
    else if (req.method == "DELETE" && !target.name.empty())
      HandleDelete(target, req, res);
    else
      Fail(res, 405, "MethodNotAllowed", fmt::format("{} is not supported here", req.method));
  } catch (const json::exception& e) {
    Fail(res, 400, "BadRequest", fmt::format("cannot handle the body: {}", e.what()));
  }
}

void FakeApiServer::HandleGet(const Target& target, const http::HttpRequest& req,
                              http::HttpResponse& res) {
  json object = Object(target.collection, target.ns, target.name);
  if (object.is_null()) {
    Fail(res, 404, "NotFound", fmt::format("{} \"{}\" not found", target.resource, target.name));
    return;
  }
  Reply(res, 200, object);
}

void FakeApiServer::HandleList(const Target& target, const http::HttpRequest& req,
                               http::HttpResponse& res) {
  std::map<std::string, std::string> equal, not_equal;
  std::vector<std::string> exists;
  ParseSelector(req.get_param_value("labelSelector"), &equal, &not_equal, &exists);
  int64_t limit = ParseVersion(req.get_param_value("limit"));
  std::string after;
  if (std::string token = req.get_param_value("continue"); !token.empty()) {
    Result<std::string> decoded = Base64Decode(token);
    if (!decoded.ok()) {
      Fail(res, 400, "BadRequest", "invalid continue token");
      return;
    }
    after = *decoded;
  }
  json items = json::array();
  std::string continue_token;
  std::string last_key;
  MutexLock lock(&mu_);
  const auto& objects = objects_[target.collection];
  for (auto it = after.empty() ? objects.begin() : objects.upper_bound(after); it != objects.end();
       ++it) {
    const std::string& ns = it->second["metadata"].value("namespace", "");
    if (!target.ns.empty() && ns != target.ns) continue;
    if (!Matches(it->second, equal, not_equal, exists)) continue;
    if (limit > 0 && static_cast<int64_t>(items.size()) == limit) {
      continue_token = Base64Encode(last_key);
      break;
    }
    json item = it->second;
    // Items of a List carry no apiVersion and kind in the API's JSON (the List has them).
    item.erase("apiVersion");
    item.erase("kind");
    items.push_back(std::move(item));
    last_key = it->first;
  }
  json metadata = {{"resourceVersion", std::to_string(resource_version_)}};
  if (!continue_token.empty()) metadata["continue"] = continue_token;
  Reply(res, 200,
        {{"kind", target.kind + "List"},
         {"apiVersion", target.group_version},
         {"metadata", metadata},
         {"items", items}});
}

void FakeApiServer::HandleWatch(const Target& target, const http::HttpRequest& req,
                                http::HttpResponse& res) {
  auto cursor = std::make_shared<WatchCursor>();
  cursor->collection = target.collection;
  cursor->ns = target.ns;
  ParseSelector(req.get_param_value("labelSelector"), &cursor->equal, &cursor->not_equal,
                &cursor->exists);
  int64_t timeout_s = ParseVersion(req.get_param_value("timeoutSeconds"));
  cursor->deadline_ms = MonotonicMillis() + (timeout_s > 0 ? timeout_s : 1800) * 1000;
  cursor->bookmarks = QueryBool(req.get_param_value("allowWatchBookmarks"));
  int64_t from = ParseVersion(req.get_param_value("resourceVersion"));
  {
    MutexLock lock(&mu_);
    cursor->expire_epoch = expire_epoch_;
    cursor->end_epoch = end_epoch_;
    cursor->next_bookmark_ms = MonotonicMillis() + bookmark_interval_ms_;
    if (from < 0) {
      Fail(res, 400, "BadRequest", "invalid resourceVersion");
      return;
    }
    if (from == 0) {
      // "Start at the most recent": synthetic ADDED events for what exists.
      for (const auto& [key, object] : objects_[target.collection]) {
        if (!target.ns.empty() && object["metadata"].value("namespace", "") != target.ns) continue;
        if (!Matches(object, cursor->equal, cursor->not_equal, cursor->exists)) continue;
        cursor->pending += json{{"type", "ADDED"}, {"object", object}}.dump() + "\n";
      }
      cursor->sent_rv = resource_version_;
    } else if (from < compacted_rv_) {
      cursor->expired = true;
    } else {
      cursor->sent_rv = from;
    }
  }
  res.status = 200;
  res.content_type = "application/json";
  res.stream = [this, cursor](http::ChunkSink& sink) { return StreamWatch(cursor.get(), sink); };
}

bool FakeApiServer::StreamWatch(WatchCursor* cursor, http::ChunkSink& sink) {
  bool end = false;
  std::string out;
  {
    MutexLock lock(&mu_);
    if (cursor->pending.empty() && !cursor->expired)
      changed_.WaitFor(&mu_, std::chrono::milliseconds(20));
    if (stopping_) return false;
    out = std::move(cursor->pending);
    cursor->pending.clear();
    int64_t now = MonotonicMillis();
    if (cursor->expired || cursor->expire_epoch != expire_epoch_) {
      json error = StatusBody(410, "Expired", "too old resource version");
      out += json{{"type", "ERROR"}, {"object", error}}.dump() + "\n";
      end = true;
    } else if (watches_stalled_) {
      // Held open without a word, past its timeout (a stalled connection or proxy).
    } else if (cursor->end_epoch != end_epoch_ || now >= cursor->deadline_ms) {
      end = true;
    } else if (!watches_paused_) {
      for (const Event& event : history_) {
        if (event.resource_version <= cursor->sent_rv || event.collection != cursor->collection)
          continue;
        if (!cursor->ns.empty() && event.ns != cursor->ns) continue;
        if (!Matches(event.object, cursor->equal, cursor->not_equal, cursor->exists)) continue;
        out += json{{"type", event.type}, {"object", event.object}}.dump() + "\n";
      }
      cursor->sent_rv = resource_version_;
      if (cursor->bookmarks && now >= cursor->next_bookmark_ms) {
        // Every event up to sent_rv has been written, so the bookmark may claim it.
        std::string group_version =
            Split(cursor->collection, '/').size() == 3
                ? cursor->collection.substr(0, cursor->collection.rfind('/'))
                : cursor->collection.substr(0, cursor->collection.find('/'));
        json bookmark = {{"kind", "Bookmark"},
                         {"apiVersion", group_version},
                         {"metadata", {{"resourceVersion", std::to_string(cursor->sent_rv)}}}};
        out += json{{"type", "BOOKMARK"}, {"object", bookmark}}.dump() + "\n";
        cursor->next_bookmark_ms = now + bookmark_interval_ms_;
      }
    }
  }
  if (!out.empty() && !sink.Write(out)) return false;
  return !end;
}

void FakeApiServer::HandleLog(const Target& target, const http::HttpRequest& req,
                              http::HttpResponse& res) {
  const json pod = Object(target.collection, target.ns, target.name);
  if (pod.is_null()) {
    Fail(res, 404, "NotFound", fmt::format("pods \"{}\" not found", target.name));
    return;
  }
  // As the API server: the container must be named when the pod has several, must be one of the
  // pod's (or its init containers), and must have started.
  std::string container = req.get_param_value("container");
  std::vector<std::string> containers = ContainerNames(pod, "containers");
  std::vector<std::string> inits = ContainerNames(pod, "initContainers");
  if (container.empty() && containers.size() > 1) {
    Fail(res, 400, "BadRequest",
         fmt::format("a container name must be specified for pod {}, choose one of: [{}]",
                     target.name, Join(containers, " ")));
    return;
  }
  if (container.empty() && !containers.empty()) container = containers.front();
  if (!container.empty() && !(containers.empty() && inits.empty()) &&
      std::find(containers.begin(), containers.end(), container) == containers.end() &&
      std::find(inits.begin(), inits.end(), container) == inits.end()) {
    Fail(res, 400, "BadRequest",
         fmt::format("container {} is not valid for pod {}", container, target.name));
    return;
  }
  const json status = pod.value("status", json::object());
  for (const char* field : {"containerStatuses", "initContainerStatuses"}) {
    const json statuses = status.is_object() ? status.value(field, json::array()) : json::array();
    if (!statuses.is_array()) continue;
    for (const json& cs : statuses) {
      if (!cs.is_object() || cs.value("name", "") != container) continue;
      const json state = cs.value("state", json::object());
      if (state.is_object() && state.contains("waiting")) {
        const json waiting = state["waiting"];
        Fail(res, 400, "BadRequest",
             fmt::format("container \"{}\" in pod \"{}\" is waiting to start: {}", container,
                         target.name,
                         waiting.is_object() ? waiting.value("reason", "") : std::string()));
        return;
      }
    }
  }
  int64_t since_ms = 0;
  if (std::string since = req.get_param_value("sinceTime"); !since.empty()) {
    Result<int64_t> ms = ParseRfc3339(since);
    if (!ms.ok()) {
      Fail(res, 400, "BadRequest", ms.status().message());
      return;
    }
    since_ms = *ms;
  }
  std::string key = Key(target.ns, target.name) + "/" + container;
  if (req.get_param_value("follow") != "true") {
    MutexLock lock(&mu_);
    std::string text;
    for (const auto& [ms, chunk] : logs_[key].chunks)
      if (ms >= since_ms) text += chunk;
    res.set_content(text, "text/plain");
    return;
  }
  auto next = std::make_shared<size_t>(0);
  int cut_epoch = 0;
  {
    MutexLock lock(&mu_);
    cut_epoch = log_cut_epoch_;
  }
  res.content_type = "text/plain";
  res.stream = [this, key, next, since_ms, cut_epoch](http::ChunkSink& sink) {
    std::string out;
    bool end = false;
    {
      MutexLock lock(&mu_);
      const LogStream& log = logs_[key];
      if (*next == log.chunks.size() && !log.ended)
        changed_.WaitFor(&mu_, std::chrono::milliseconds(20));
      if (stopping_ || log_cut_epoch_ != cut_epoch) return false;
      for (; *next < log.chunks.size(); ++*next)
        if (log.chunks[*next].first >= since_ms) out += log.chunks[*next].second;
      end = log.ended;
    }
    if (!out.empty() && !sink.Write(out)) return false;
    return !end;
  };
}

void FakeApiServer::HandleCreate(const Target& target, const http::HttpRequest& req,
                                 http::HttpResponse& res) {
  json object = json::parse(req.body);
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].is_object()) {
    Fail(res, 400, "BadRequest", "the object has no metadata");
    return;
  }
  json& metadata = object["metadata"];
  std::string name = metadata.value("name", "");
  MutexLock lock(&mu_);
  if (name.empty() && metadata.contains("generateName"))
    name = metadata.value("generateName", "") + std::to_string(next_uid_);
  if (name.empty()) {
    Fail(res, 422, "Invalid", "metadata.name: Required value");
    return;
  }
  if (objects_[target.collection].count(Key(target.ns, name))) {
    Fail(res, 409, "AlreadyExists", fmt::format("{} \"{}\" already exists", target.resource, name));
    return;
  }
  metadata["name"] = name;
  if (!target.ns.empty()) metadata["namespace"] = target.ns;
  metadata["uid"] = fmt::format("00000000-0000-4000-8000-{:012d}", next_uid_++);
  metadata["creationTimestamp"] = FormatRfc3339(NowMillis() / 1000 * 1000);
  metadata["generation"] = 1;
  object["apiVersion"] = target.group_version;
  object["kind"] = target.kind;
  Reply(res, 201, Commit(target, "ADDED", std::move(object)));
}

void FakeApiServer::HandleReplace(const Target& target, const http::HttpRequest& req,
                                  http::HttpResponse& res) {
  json object = json::parse(req.body);
  if (!object.is_object()) {
    Fail(res, 400, "BadRequest", "the body is not an object");
    return;
  }
  MutexLock lock(&mu_);
  auto& objects = objects_[target.collection];
  auto it = objects.find(Key(target.ns, target.name));
  if (it == objects.end()) {
    Fail(res, 404, "NotFound", fmt::format("{} \"{}\" not found", target.resource, target.name));
    return;
  }
  const json& current = it->second;
  std::string sent_rv =
      object.contains("metadata") ? object["metadata"].value("resourceVersion", "") : "";
  if (!sent_rv.empty() && sent_rv != current["metadata"].value("resourceVersion", "")) {
    Fail(res, 409, "Conflict",
         fmt::format("Operation cannot be fulfilled on {} \"{}\": the object has been modified; "
                     "please apply your changes to the latest version and try again",
                     target.resource, target.name));
    return;
  }
  json updated;
  if (target.subresource == "status") {
    updated = current;  // the status subresource changes only the status
    if (object.contains("status")) updated["status"] = object["status"];
  } else {
    updated = object;
    // The main resource leaves status alone, as for kinds with a status subresource.
    if (current.contains("status"))
      updated["status"] = current["status"];
    else
      updated.erase("status");
    json metadata = current["metadata"];
    if (object.contains("metadata") && object["metadata"].is_object())
      for (const char* field : {"labels", "annotations", "finalizers", "ownerReferences"})
        if (object["metadata"].contains(field)) metadata[field] = object["metadata"][field];
    updated["metadata"] = metadata;
    if (WithoutMetadataAndStatus(updated) != WithoutMetadataAndStatus(current))
      updated["metadata"]["generation"] = current["metadata"].value("generation", 1) + 1;
  }
  updated["apiVersion"] = target.group_version;
  updated["kind"] = target.kind;
  Reply(res, 200, Commit(target, "MODIFIED", std::move(updated)));
}

void FakeApiServer::HandlePatch(const Target& target, const http::HttpRequest& req,
                                http::HttpResponse& res) {
  auto it_type = req.headers.find("content-type");
  std::string type = it_type == req.headers.end() ? "" : it_type->second;
  bool apply = StartsWith(type, "application/apply-patch+yaml");
  if (!apply && !StartsWith(type, "application/merge-patch+json") &&
      !StartsWith(type, "application/strategic-merge-patch+json")) {
    Fail(res, 415, "UnsupportedMediaType",
         fmt::format("the body of the request was in an unknown format: {}", type));
    return;
  }
  std::string manager = req.get_param_value("fieldManager");
  if (apply && manager.empty()) {
    Fail(res, 400, "BadRequest",
         "PATCH, fieldManager: Required value: is required for apply patch");
    return;
  }
  // The fake takes the apply body as JSON (what tau sends); YAML is not parsed.
  json patch = json::parse(req.body);
  if (!patch.is_object()) {
    Fail(res, 400, "BadRequest", "the patch is not an object");
    return;
  }
  MutexLock lock(&mu_);
  auto& objects = objects_[target.collection];
  auto it = objects.find(Key(target.ns, target.name));
  json owned = patch;
  if (owned.contains("metadata") && owned["metadata"].is_object())
    for (const char* field : {"name", "namespace", "resourceVersion", "uid", "creationTimestamp",
                              "generation", "managedFields"})
      owned["metadata"].erase(field);
  json managed = {{"manager", manager.empty() ? "unknown" : manager},
                  {"operation", apply ? "Apply" : "Update"},
                  {"apiVersion", target.group_version},
                  {"time", FormatRfc3339(NowMillis() / 1000 * 1000)},
                  {"fieldsType", "FieldsV1"},
                  {"fieldsV1", FieldsV1(owned)}};
  if (it == objects.end()) {
    if (!apply) {
      Fail(res, 404, "NotFound", fmt::format("{} \"{}\" not found", target.resource, target.name));
      return;
    }
    json object = patch;
    json& metadata = object["metadata"];
    metadata["name"] = target.name;
    if (!target.ns.empty()) metadata["namespace"] = target.ns;
    metadata["uid"] = fmt::format("00000000-0000-4000-8000-{:012d}", next_uid_++);
    metadata["creationTimestamp"] = FormatRfc3339(NowMillis() / 1000 * 1000);
    metadata["generation"] = 1;
    metadata["managedFields"] = json::array({managed});
    object["apiVersion"] = target.group_version;
    object["kind"] = target.kind;
    Reply(res, 201, Commit(target, "ADDED", std::move(object)));
    return;
  }
  const json current = it->second;
  // A resourceVersion in the patch is a precondition, as in the API server: a stale one is a 409
  // Conflict (clients send it when a patch replaces a list whole, such as a node's taints).
  std::string sent_rv = patch.contains("metadata") && patch["metadata"].is_object()
                            ? patch["metadata"].value("resourceVersion", "")
                            : "";
  if (!sent_rv.empty() && sent_rv != current["metadata"].value("resourceVersion", "")) {
    Fail(res, 409, "Conflict",
         fmt::format("Operation cannot be fulfilled on {} \"{}\": the object has been modified; "
                     "please apply your changes to the latest version and try again",
                     target.resource, target.name));
    return;
  }
  json updated = current;
  if (target.subresource == "status") {
    json status = updated.value("status", json::object());
    status.merge_patch(patch.value("status", json::object()));
    updated["status"] = status;
  } else {
    // Both apply and merge patch merge the sent fields here; real apply also removes fields
    // this manager applied before and no longer sends.
    patch.erase("status");
    if (patch.contains("metadata") && patch["metadata"].is_object())
      for (const char* field : {"resourceVersion", "uid", "creationTimestamp", "generation"})
        patch["metadata"].erase(field);
    updated.merge_patch(patch);
    if (WithoutMetadataAndStatus(updated) != WithoutMetadataAndStatus(current))
      updated["metadata"]["generation"] = current["metadata"].value("generation", 1) + 1;
  }
  json fields = updated["metadata"].value("managedFields", json::array());
  json kept = json::array();
  for (const json& entry : fields)
    if (entry.value("manager", "") != managed["manager"] ||
        entry.value("operation", "") != managed["operation"])
      kept.push_back(entry);
  kept.push_back(managed);
  updated["metadata"]["managedFields"] = kept;
  updated["apiVersion"] = target.group_version;
  updated["kind"] = target.kind;
  Reply(res, 200, Commit(target, "MODIFIED", std::move(updated)));
}

void FakeApiServer::HandleDelete(const Target& target, const http::HttpRequest& req,
                                 http::HttpResponse& res) {
  std::string policy = req.get_param_value("propagationPolicy");
  if (policy.empty() && !req.body.empty()) {
    json options = json::parse(req.body);
    if (options.is_object()) policy = options.value("propagationPolicy", "");
  }
  if (!policy.empty() && policy != "Foreground" && policy != "Background" && policy != "Orphan") {
    Fail(res, 400, "BadRequest", fmt::format("invalid propagationPolicy {}", policy));
    return;
  }
  MutexLock lock(&mu_);
  auto& objects = objects_[target.collection];
  auto it = objects.find(Key(target.ns, target.name));
  if (it == objects.end()) {
    Fail(res, 404, "NotFound", fmt::format("{} \"{}\" not found", target.resource, target.name));
    return;
  }
  // No garbage collector runs here: the object goes at once whatever the policy (a real server
  // keeps a Foreground-deleted owner, with deletionTimestamp, until its dependents are gone).
  json object = it->second;
  object["metadata"]["deletionTimestamp"] = FormatRfc3339(NowMillis() / 1000 * 1000);
  Reply(res, 200, Commit(target, "DELETED", std::move(object)));
}

void FakeApiServer::SetProxied(const std::string& ns, const std::string& service_port,
                               const std::string& path, const std::string& body) {
  MutexLock lock(&mu_);
  proxied_[fmt::format("{}/{}{}", ns, service_port, path)] = body;
}

void FakeApiServer::HandleServiceProxy(const http::HttpRequest& req,
                                       const std::vector<std::string>& rest,
                                       http::HttpResponse& res) {
  // rest: namespaces NS services NAME[:PORT] proxy PATH...
  const std::string& ns = rest[1];
  // [SCHEME:]NAME[:PORT]
  std::vector<std::string> parts = Split(rest[3], ':');
  const std::string service = parts.size() == 3 ? parts[1] : parts[0];
  if (req.method != "GET") {
    Fail(res, 405, "MethodNotAllowed", "the stand-in proxies GET only");
    return;
  }
  if (Object("v1/services", ns, service).is_null()) {
    Fail(res, 404, "NotFound", fmt::format("services \"{}\" not found", service));
    return;
  }
  std::string path;
  for (size_t i = 5; i < rest.size(); ++i) path += "/" + rest[i];
  MutexLock lock(&mu_);
  auto it = proxied_.find(fmt::format("{}/{}{}", ns, rest[3], path));
  if (it == proxied_.end()) {
    // What the API server says when nothing behind the Service answers.
    Fail(res, 503, "ServiceUnavailable",
         fmt::format("no endpoints available for service \"{}\"", service));
    return;
  }
  res.set_content(it->second, "application/json");
}

void FakeApiServer::HandleAccessReview(const http::HttpRequest& req, http::HttpResponse& res) {
  json review = json::parse(req.body);
  const json spec = review.value("spec", json::object());
  const json attributes = spec.value("resourceAttributes", json::object());
  std::string key =
      fmt::format("{}|{}|{}|{}|{}", spec.value("user", ""), attributes.value("verb", ""),
                  attributes.value("group", ""), attributes.value("resource", ""),
                  attributes.value("namespace", ""));
  bool allowed;
  {
    MutexLock lock(&mu_);
    allowed = grants_.count(key) > 0;
  }
  review["status"] = {{"allowed", allowed}};
  if (!allowed) review["status"]["reason"] = "no grant matches";
  review["metadata"] = json::object();
  Reply(res, 201, review);
}

bool FakeApiServer::HandleDiscovery(const http::HttpRequest& req, http::HttpResponse& res) {
  if (req.method != "GET") return false;
  if (req.path == "/api") {
    json address = {{"clientCIDR", "0.0.0.0/0"},
                    {"serverAddress", fmt::format("127.0.0.1:{}", port_)}};
    Reply(res, 200,
          {{"kind", "APIVersions"},
           {"versions", json::array({"v1"})},
           {"serverAddressByClientCIDRs", json::array({address})}});
    return true;
  }
  if (req.path == "/apis") {
    // Group -> versions in table order; the first is the preferred one.
    std::vector<std::string> order;
    std::map<std::string, std::vector<std::string>> versions;
    for (const kubeapi::ResourceInfo& info : kubeapi::KnownResources()) {
      size_t slash = info.api_version.find('/');
      if (slash == std::string::npos) continue;  // the core group is under /api
      std::string group = info.api_version.substr(0, slash);
      std::vector<std::string>& list = versions[group];
      if (list.empty()) order.push_back(group);
      if (std::find(list.begin(), list.end(), info.api_version) == list.end())
        list.push_back(info.api_version);
    }
    json groups = json::array();
    for (const std::string& group : order) {
      json entries = json::array();
      for (const std::string& gv : versions[group])
        entries.push_back({{"groupVersion", gv}, {"version", gv.substr(gv.find('/') + 1)}});
      groups.push_back({{"name", group}, {"versions", entries}, {"preferredVersion", entries[0]}});
    }
    Reply(res, 200, {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}});
    return true;
  }
  std::string group_version;
  if (req.path == "/api/v1") {
    group_version = "v1";
  } else if (StartsWith(req.path, "/apis/")) {
    std::string rest = req.path.substr(6);
    if (std::count(rest.begin(), rest.end(), '/') != 1) return false;
    group_version = rest;
  } else {
    return false;
  }
  json resources = json::array();
  for (const kubeapi::ResourceInfo& info : kubeapi::KnownResources()) {
    if (info.api_version != group_version) continue;
    std::string singular = info.kind;
    for (char& c : singular) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    resources.push_back(
        {{"name", info.resource},
         {"singularName", singular},
         {"namespaced", info.namespaced},
         {"kind", info.kind},
         {"verbs", json::array({"create", "delete", "get", "list", "patch", "update", "watch"})}});
  }
  if (resources.empty()) return false;
  Reply(res, 200,
        {{"kind", "APIResourceList"},
         {"apiVersion", "v1"},
         {"groupVersion", group_version},
         {"resources", resources}});
  return true;
}

}  // namespace tau::testutil
