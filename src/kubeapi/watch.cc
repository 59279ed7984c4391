// Watches, pod log streams and the list+watch loop.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "common/mutex.h"
#include "kubeapi/internal.h"

namespace tau::kubeapi {
namespace {

std::string KeyOf(const nlohmann::json& object) {
  const nlohmann::json metadata = object.value("metadata", nlohmann::json::object());
  if (!metadata.is_object()) return "";
  return metadata.value("namespace", "") + "/" + metadata.value("name", "");
}

std::string ResourceVersionOf(const nlohmann::json& object) {
  const nlohmann::json metadata = object.value("metadata", nlohmann::json::object());
  return metadata.is_object() ? metadata.value("resourceVersion", "") : "";
}

}  // namespace

Status Client::Watch(std::string_view api_version, std::string_view kind, std::string_view ns,
                     const WatchOptions& options,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     const std::atomic<bool>* stop) {
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath(api_version, kind, ns, ""));
  path += fmt::format("?watch=true&timeoutSeconds={}", options.timeout_seconds);
  if (!options.resource_version.empty())
    path += "&resourceVersion=" + QueryEscape(options.resource_version);
  if (options.allow_bookmarks) path += "&allowWatchBookmarks=true";
  if (!options.label_selector.empty())
    path += "&labelSelector=" + QueryEscape(options.label_selector);

  // The body is one JSON event per line; chunks do not respect line ends.
  std::string pending;
  Status event_error;
  std::function<bool(std::string_view)> on_data = [&](std::string_view data) {
    pending.append(data);
    size_t start = 0;
    for (size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
      std::string_view line = std::string_view(pending).substr(start, end - start);
      if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
      nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!doc.is_object() || !doc.contains("type")) {
        event_error = Internal(fmt::format("watch {}: a line is not a watch event", path));
        return false;
      }
      WatchEvent event{doc.value("type", ""), doc.value("object", nlohmann::json::object())};
      if (event.type == "ERROR") {
        int code = event.object.is_object() ? event.object.value("code", 0) : 0;
        event_error = HttpError(code == 0 ? 500 : code, "watch " + path, event.object.dump());
        return false;
      }
      if (!on_event(event)) return false;
    }
    pending.erase(0, start);
    return true;
  };
  Transfer transfer;
  const int64_t deadline_ms =
      static_cast<int64_t>(options.timeout_seconds) * 1000 + options_.watch_deadline_margin_ms;
  TAU_RETURN_IF_ERROR(
      Exchange(Request{"GET", path, "", "", true, deadline_ms}, &transfer, &on_data, stop));
  return event_error;
}

Status Client::StreamLogs(std::string_view ns, std::string_view pod, const LogOptions& options,
                          const std::function<bool(std::string_view)>& on_chunk,
                          const std::atomic<bool>* stop) {
  TAU_ASSIGN_OR_RETURN(std::string path, ResourcePath("v1", "Pod", ns, pod, "log"));
  std::vector<std::string> query;
  if (options.follow) query.push_back("follow=true");
  if (!options.container.empty()) query.push_back("container=" + QueryEscape(options.container));
  if (!options.since_time.empty()) query.push_back("sinceTime=" + QueryEscape(options.since_time));
  for (size_t i = 0; i < query.size(); ++i) path += (i == 0 ? "?" : "&") + query[i];
  Transfer transfer;
  return Exchange(Request{"GET", path, "", "", true}, &transfer, &on_chunk, stop);
}

WatchLoop::WatchLoop(Client* client, std::string api_version, std::string kind, std::string ns,
                     Options options)
    : client_(client),
      api_version_(std::move(api_version)),
      kind_(std::move(kind)),
      ns_(std::move(ns)),
      options_(std::move(options)) {}

std::string WatchLoop::resource_version() const {
  MutexLock lock(&mu_);
  return resource_version_;
}

std::vector<nlohmann::json> WatchLoop::Snapshot() const {
  MutexLock lock(&mu_);
  std::vector<nlohmann::json> out;
  for (const auto& [key, object] : cache_) out.push_back(object);
  return out;
}

void WatchLoop::Deliver(const WatchEvent& event,
                        const std::function<void(const WatchEvent&)>& on_event) {
  {
    MutexLock lock(&mu_);
    std::string rv = ResourceVersionOf(event.object);
    if (!rv.empty()) resource_version_ = rv;
    if (event.type == "BOOKMARK") return;
    std::string key = KeyOf(event.object);
    if (event.type == "DELETED")
      cache_.erase(key);
    else
      cache_[key] = event.object;
  }
  on_event(event);
}

Status WatchLoop::Relist(const std::function<void(const WatchEvent&)>& on_event) {
  relists_.fetch_add(1);
  ObjectList all;
  ListOptions list = options_.list;
  // Page through everything; the first page's resourceVersion would do as well (a continue
  // token pins the snapshot), the last one is used.
  for (;;) {
    TAU_ASSIGN_OR_RETURN(ObjectList page, client_->List(api_version_, kind_, ns_, list));
    for (nlohmann::json& item : page.items) all.items.push_back(std::move(item));
    all.resource_version = page.resource_version;
    if (list.limit <= 0 || page.continue_token.empty()) break;
    list.continue_token = page.continue_token;
  }
  // The difference between the cache and the new list becomes events, so a consumer that
  // applies events sees the same state as the list.
  std::map<std::string, nlohmann::json> fresh;
  for (nlohmann::json& item : all.items) {
    // (Client::List has given items back their apiVersion and kind, as events carry them.)
    std::string key = KeyOf(item);  // before the move: json's operator= takes its argument by value
    fresh[key] = std::move(item);
  }
  std::vector<WatchEvent> events;
  {
    MutexLock lock(&mu_);
    for (const auto& [key, object] : cache_)
      if (!fresh.count(key)) events.push_back(WatchEvent{"DELETED", object});
    for (const auto& [key, object] : fresh) {
      auto it = cache_.find(key);
      if (it == cache_.end())
        events.push_back(WatchEvent{"ADDED", object});
      else if (ResourceVersionOf(it->second) != ResourceVersionOf(object))
        events.push_back(WatchEvent{"MODIFIED", object});
    }
    cache_ = std::move(fresh);
    resource_version_ = all.resource_version;
  }
  for (const WatchEvent& event : events) on_event(event);
  return Status::Ok();
}

Status WatchLoop::Run(const std::function<void(const WatchEvent&)>& on_event,
                      const std::atomic<bool>& stop) {
  bool need_list = true;
  auto pause = [&](int ms) {
    for (int waited = 0; waited < ms && !stop.load(); waited += 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  auto fatal = [](const Status& s) {
    return s.code() == StatusCode::kPermissionDenied || s.code() == StatusCode::kNotFound ||
           s.code() == StatusCode::kUnauthenticated || s.code() == StatusCode::kInvalidArgument;
  };
  while (!stop.load()) {
    if (need_list) {
      Status listed = Relist(on_event);
      if (!listed.ok()) {
        if (fatal(listed)) return listed;
        pause(options_.error_backoff_ms);
        continue;
      }
      need_list = false;
    }
    WatchOptions watch;
    watch.resource_version = resource_version();
    watch.label_selector = options_.list.label_selector;
    watch.timeout_seconds = options_.watch_timeout_seconds;
    watch.allow_bookmarks = true;
    Status watched = client_->Watch(
        api_version_, kind_, ns_, watch,
        [&](const WatchEvent& event) {
          Deliver(event, on_event);
          return !stop.load();
        },
        &stop);
    if (watched.ok()) continue;  // the server ended the watch: resume from the last version
    if (watched.code() == StatusCode::kResourceExhausted) {
      need_list = true;  // 410 Gone: the history no longer reaches our version
      continue;
    }
    if (fatal(watched)) return watched;
    pause(options_.error_backoff_ms);
  }
  return Status::Ok();
}

}  // namespace tau::kubeapi
