// GET /api/v1/events: a server-sent events stream (text/event-stream) of run and queue changes.
//
// Why polling the store: every state change is committed to the store before it is acted on, so
// the store is the one place where every change shows; a poll every 250 ms costs two indexed
// queries and keeps the controller free of subscriber bookkeeping. Each connection has its own
// thread (http.h), so a slow reader delays only itself.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/types.h"
#include "common/clock.h"
#include "common/json_text.h"
#include "http/reply.h"
#include "server/authz.h"
#include "server/web.h"

namespace tau::server {
namespace {

using nlohmann::json;

constexpr int kPollMs = 250;
constexpr int kHeartbeatMs = 15000;
constexpr int64_t kRecentRuns = 200;  // terminal runs this recent are watched too
constexpr int64_t kActiveRuns = 5000;
// Of each queue's pending runs, the dashboard's queue page shows the head (the counts are whole).
QueuesQuery HeadOfEachQueue() {
  QueuesQuery q;
  q.limit = 100;
  return q;
}

std::string SseEvent(std::string_view type, const json& data) {
  // json::dump escapes newlines, so the data is always one `data:` line.
  return fmt::format("event: {}\ndata: {}\n\n", type, JsonText(data));
}

json RunEventJson(const store::RunRecord& r) {
  api::RunEvent e;
  e.name = r.name;
  e.state = store::RunStateName(r.state);
  e.reason = r.reason;
  e.message = r.message;
  e.queue = r.queue;
  e.workspace = r.workspace;
  e.attempts = r.attempts;
  e.updated = FormatRfc3339(r.updated_ms);
  return e.ToJson();
}

// What makes a run "changed": not only updated_ms, because not every writer bumps it.
std::string Fingerprint(const store::RunRecord& r) {
  return fmt::format("{}|{}|{}|{}|{}", static_cast<int>(r.state), r.reason, r.attempts,
                     r.updated_ms, r.cancel_requested);
}

class EventStreamer {
 public:
  EventStreamer(Controller* controller, store::Store* store, const http::HttpServer* http,
                std::string only_run, CallerContext caller)
      : controller_(controller),
        store_(store),
        http_(http),
        only_run_(std::move(only_run)),
        caller_(std::move(caller)),
        visible_(caller_.VisibleWorkspaces()) {}

  bool Step(http::ChunkSink& sink) {
    if (http_->shutting_down()) return false;
    if (first_) {
      first_ = false;
      last_write_ = Now();
      // The first poll is the baseline: a client fetches the current lists itself, then applies
      // changes. `hello` tells it the stream is live; `queues` is sent at once so a queue view
      // needs no separate fetch.
      std::string out = "retry: 2000\n\n";
      out += SseEvent("hello", {{"time", FormatRfc3339(NowMillis())}});
      Poll(&out, /*baseline=*/true);
      return sink.Write(out);
    }
    for (int waited = 0; waited < kPollMs; waited += 50) {
      if (http_->shutting_down() || sink.ClientGone()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string out;
    Poll(&out, /*baseline=*/false);
    if (out.empty() && Now() - last_write_ >= std::chrono::milliseconds(kHeartbeatMs))
      out = ": heartbeat\n\n";  // keeps proxies from closing an idle stream, and finds dead peers
    if (out.empty()) return true;
    last_write_ = Now();
    return sink.Write(out);
  }

 private:
  static std::chrono::steady_clock::time_point Now() { return std::chrono::steady_clock::now(); }

  void Poll(std::string* out, bool baseline) {
    std::map<std::string, std::string> seen;
    auto note = [&](const store::RunRecord& r) {
      std::string fp = Fingerprint(r);
      auto it = known_.find(r.name);
      if (!baseline && (it == known_.end() || it->second != fp))
        *out += SseEvent("run", RunEventJson(r));
      seen[r.name] = std::move(fp);
    };
    if (!only_run_.empty()) {
      if (auto r = store_->GetRun(only_run_); r.ok()) note(*r);
    } else {
      store::RunFilter active;
      active.summary = true;  // a run event shows no spec
      active.active_only = true;
      active.limit = kActiveRuns;
      active.workspaces_in = visible_;
      store::RunFilter recent;
      recent.summary = true;
      recent.limit = kRecentRuns;
      recent.workspaces_in = visible_;
      for (const store::RunFilter& f : {active, recent})
        if (auto runs = store_->ListRuns(f); runs.ok())
          for (const auto& r : *runs)
            if (!seen.count(r.name)) note(r);
      // A run that was watched and fell out of both lists finished (or was pushed out by newer
      // runs): report its final state once.
      for (const auto& [name, fp] : known_)
        if (!seen.count(name))
          if (auto r = store_->GetRun(name); r.ok() && Fingerprint(*r) != fp)
            *out += SseEvent("run", RunEventJson(*r));
      json queues = FilterQueues(controller_->Queues(HeadOfEachQueue()), caller_);
      std::string text = JsonText(queues);
      if (text != last_queues_) {
        last_queues_ = std::move(text);
        *out += SseEvent("queues", queues);
      }
    }
    known_ = std::move(seen);
  }

  Controller* controller_;
  store::Store* store_;
  const http::HttpServer* http_;
  std::string only_run_;
  CallerContext caller_;
  std::optional<std::vector<std::string>> visible_;  // nullopt: every workspace
  bool first_ = true;
  std::map<std::string, std::string> known_;  // run name -> fingerprint at the last poll
  std::string last_queues_;
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace

void RegisterEventsApi(SecureRouter* api, Controller* controller, store::Store* store) {
  api->Route("GET", "/api/v1/events", Access::kSignedIn,
             [controller, store, api](const http::HttpRequest& req, http::HttpResponse& res,
                                      const CallerContext& caller) {
               std::string run = req.has_param("run") ? req.get_param_value("run") : "";
               if (!run.empty()) {
                 auto r = store->GetRun(run);
                 if (!r.ok()) return http::ReplyError(res, r.status());
                 if (caller.RoleIn(r->workspace) < auth::Role::kViewer)
                   return api->Deny(req, res, caller.who,
                                    fmt::format("user '{}' may not read runs of workspace '{}'",
                                                caller.who.user, r->workspace));
               }
               auto streamer =
                   std::make_shared<EventStreamer>(controller, store, api->http(), run, caller);
               res.content_type = "text/event-stream; charset=utf-8";
               res.stream = [streamer](http::ChunkSink& sink) { return streamer->Step(sink); };
             });
}

}  // namespace tau::server
