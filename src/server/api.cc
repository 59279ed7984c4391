#include "server/api.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/hash.h"
#include "runtime/runtime.h"
#include "server/server.h"

extern char** environ;

namespace tau::server {
namespace {

using nlohmann::json;
using store::RunRecord;

constexpr size_t kMaxRequestBytes = 128u << 20;  // code snapshots travel inside submissions
constexpr int kLogPollMs = 100;

int HttpStatus(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
      return 409;
    case StatusCode::kFailedPrecondition:
      return 412;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

void Reply(HttpResponse& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

void ReplyError(HttpResponse& res, const Status& status, json extra = json::object()) {
  json err = {{"code", StatusCodeName(status.code())}, {"message", status.message()}};
  for (auto& [k, v] : extra.items()) err[k] = v;
  Reply(res, HttpStatus(status.code()), {{"error", err}});
}

json OptionalTime(const std::optional<int64_t>& ms) {
  return ms ? json(FormatRfc3339(*ms)) : json(nullptr);
}

json RunJson(const RunRecord& r, Controller* controller) {
  json j = {{"name", r.name},
            {"spec_name", r.spec_name},
            {"spec_file", r.spec_file},
            {"state", store::RunStateName(r.state)},
            {"reason", r.reason},
            {"message", r.message},
            {"exit_code", r.exit_code ? json(*r.exit_code) : json(nullptr)},
            {"signal", r.signal ? json(*r.signal) : json(nullptr)},
            {"attempts", r.attempts},
            {"workspace", r.workspace},
            {"queue", r.queue},
            {"priority", r.priority},
            {"gpus", r.gpus},
            {"resources", r.resources},
            {"config_hash", r.config_hash},
            {"snapshot_digest", r.snapshot_digest},
            {"cancel_requested", r.cancel_requested},
            {"created", FormatRfc3339(r.created_ms)},
            {"admitted", OptionalTime(r.admitted_ms)},
            {"started", OptionalTime(r.started_ms)},
            {"finished", OptionalTime(r.finished_ms)},
            {"kind", r.spec_json.value("kind", "")}};
  if (r.state == store::RunState::kQueued) j["pending"] = controller->PendingInfo(r.name);
  return j;
}

json AttemptJson(const store::AttemptRecord& a) {
  return {{"number", a.number},
          {"state", store::AttemptStateName(a.state)},
          {"gpus", a.gpus},
          {"started", FormatRfc3339(a.started_ms)},
          {"ended", OptionalTime(a.ended_ms)},
          {"exit_code", a.exit_code ? json(*a.exit_code) : json(nullptr)},
          {"signal", a.signal ? json(*a.signal) : json(nullptr)},
          {"outcome", a.outcome},
          {"reason", a.reason},
          {"message", a.message},
          {"supervisor_pid", a.shim_pid},
          {"diagnosis", a.diagnosis}};
}

json EventJson(const store::Event& e) {
  return {{"time", FormatRfc3339(e.ts_ms)},
          {"type", e.type},
          {"message", e.message},
          {"data", e.data},
          {"hash", e.hash}};
}

Result<int64_t> IntParam(const HttpRequest& req, const char* name, int64_t fallback, int64_t min,
                         int64_t max) {
  if (!req.has_param(name)) return fallback;
  std::string v = req.get_param_value(name);
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > max)
    return InvalidArgument(fmt::format(
        "query parameter '{}' must be an integer in {}..{}, got '{}'", name, min, max, v));
  return static_cast<int64_t>(n);
}

bool BoolParam(const HttpRequest& req, const char* name) {
  if (!req.has_param(name)) return false;
  std::string v = req.get_param_value(name);
  return v == "1" || v == "true" || v == "yes";
}

Result<SubmitRequest> ParseSubmit(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  if (!j.contains("spec") || !j["spec"].is_object() || !j["spec"].contains("yaml") ||
      !j["spec"]["yaml"].is_string())
    return InvalidArgument("request needs spec.yaml (the tau.yaml text) as a string");
  SubmitRequest req;
  req.spec_yaml = j["spec"]["yaml"].get<std::string>();
  req.spec_file = j["spec"].value("file", std::string("tau.yaml"));
  if (j.contains("code")) {
    const json& code = j["code"];
    if (!code.is_object() || !code.contains("files") || !code["files"].is_array())
      return InvalidArgument("code must be an object with a 'files' array");
    for (const json& f : code["files"]) {
      if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("data") ||
          !f["data"].is_string())
        return InvalidArgument("each code file needs 'path' and 'data' (base64) strings");
      CodeFile cf;
      cf.path = f["path"].get<std::string>();
      cf.mode = f.contains("mode") && f["mode"].is_number_integer() ? f["mode"].get<int>() : 0644;
      TAU_ASSIGN_OR_RETURN(cf.data, Base64Decode(f["data"].get<std::string>()));
      req.code.push_back(std::move(cf));
    }
  }
  return req;
}

// Streams one rank's log of a run, optionally following it across attempts until the run ends.
class LogStreamer {
 public:
  LogStreamer(store::Store* store, Controller* controller, std::string run, int attempt, int rank,
              bool follow, const HttpServer* http)
      : store_(store),
        controller_(controller),
        run_(std::move(run)),
        pinned_(attempt > 0),
        attempt_(attempt),
        rank_(rank),
        follow_(follow),
        http_(http) {}
  ~LogStreamer() {
    if (fd_ >= 0) ::close(fd_);
  }

  // One step of the stream; false ends it.
  bool Step(ChunkSink& sink) {
    if (http_->shutting_down()) return Done(sink);
    if (fd_ < 0 && !OpenCurrent()) {
      if (!follow_ || RunFinished()) return Done(sink);
      return Idle(sink);
    }
    char buf[65536];
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n > 0) return sink.Write(std::string_view(buf, static_cast<size_t>(n)));
    if (!follow_) return Done(sink);
    // At the end of the file: the attempt may still be writing.
    if (!AttemptFinished()) return Idle(sink);
    // Finished: one more read catches output written between the read above and the check.
    n = ::read(fd_, buf, sizeof buf);
    if (n > 0) return sink.Write(std::string_view(buf, static_cast<size_t>(n)));
    if (!pinned_ && NextAttemptStarted()) {
      ::close(fd_);
      fd_ = -1;
      ++attempt_;
      std::string banner = fmt::format("[tau] --- attempt {} ---\n", attempt_);
      return sink.Write(banner);
    }
    return RunFinished() ? Done(sink) : Idle(sink);
  }

 private:
  bool Done(ChunkSink&) { return false; }
  bool Idle(ChunkSink& sink) {
    if (sink.ClientGone()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(kLogPollMs));
    return true;
  }
  bool OpenCurrent() {
    if (attempt_ <= 0) {
      auto attempts = store_->ListAttempts(run_);
      if (!attempts.ok() || attempts->empty()) return false;
      attempt_ = follow_ ? attempts->front().number : attempts->back().number;
    }
    std::string path =
        fmt::format("{}/logs/rank-{}.log", controller_->AttemptDir(run_, attempt_), rank_);
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    return fd_ >= 0;
  }
  bool AttemptFinished() {
    auto attempts = store_->ListAttempts(run_);
    if (!attempts.ok()) return true;
    for (const auto& a : *attempts)
      if (a.number == attempt_) return a.state == store::AttemptState::kFinished;
    return false;
  }
  bool NextAttemptStarted() {
    auto attempts = store_->ListAttempts(run_);
    return attempts.ok() && !attempts->empty() && attempts->back().number > attempt_;
  }
  bool RunFinished() {
    auto r = store_->GetRun(run_);
    return !r.ok() || store::IsTerminal(r->state);
  }

  store::Store* store_;
  Controller* controller_;
  std::string run_;
  bool pinned_;
  int attempt_;
  int rank_;
  bool follow_;
  const HttpServer* http_;
  int fd_ = -1;
};

// Runs `tau __gpu-probe` and returns what it printed: CUDA initialises in that child, never in the
// server.
json RunProbeProcess() {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return {{"ran", false}, {"note", "cannot create a pipe"}};
  std::string exe = runtime::SelfExecutable();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>("__gpu-probe"), nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return {{"ran", false}, {"note", "cannot start the probe process"}};
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    return {{"ran", false},
            {"note", fmt::format("the probe process failed (status {}); is a GPU hung?", status)}};
  return j;
}

}  // namespace

void RegisterApi(HttpServer* http, Controller* controller, store::Store* store,
                 health::GpuMonitor* monitor) {
  http->set_max_body_bytes(kMaxRequestBytes);

  http->Route("GET", "/api/v1/version", [](const HttpRequest&, HttpResponse& res) {
    Reply(res, 200, {{"version", Version()}, {"api", "v1"}, {"backend", "local"}});
  });
  http->Route("GET", "/api/v1/healthz", [](const HttpRequest&, HttpResponse& res) {
    Reply(res, 200, {{"ok", true}});
  });
  http->Route("GET", "/api/v1/gpus", [monitor](const HttpRequest&, HttpResponse& res) {
    // The inventory, each device with its health verdict, and the monitor's full snapshot.
    health::HealthSnapshot snap = monitor->Snapshot();
    json body = health::ToJson(snap.inventory);
    for (size_t i = 0; i < body["devices"].size() && i < snap.verdicts.size(); ++i)
      body["devices"][i]["health"] = health::ToJson(snap.verdicts[i]);
    body["snapshot"] = health::ToJson(snap);
    Reply(res, 200, body);
  });
  http->Route("POST", "/api/v1/health/check", [monitor](const HttpRequest& req, HttpResponse& res) {
    // Runs the passive checks now; with active=1 also the active probe, in a child process.
    monitor->PollOnce();
    health::HealthSnapshot snap = monitor->Snapshot();
    json gpus = json::array();
    for (const auto& v : snap.verdicts) gpus.push_back(health::ToJson(v));
    json body = {{"gpus", gpus}, {"inventory", health::ToJson(snap.inventory)}};
    if (BoolParam(req, "active")) body["active"] = RunProbeProcess();
    Reply(res, 200, body);
  });
  http->Route("GET", "/metrics", [monitor](const HttpRequest&, HttpResponse& res) {
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    res.set_content(health::RenderMetrics(monitor->Snapshot(), host),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http->Route("GET", "/api/v1/capacity", [controller](const HttpRequest&, HttpResponse& res) {
    Reply(res, 200, controller->Capacity());
  });
  http->Route("POST", "/api/v1/validate", [](const HttpRequest& req, HttpResponse& res) {
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("yaml") || !j["yaml"].is_string())
      return ReplyError(res, InvalidArgument("request needs 'yaml' (the spec text) as a string"));
    auto parsed =
        spec::ParseSpec(j["yaml"].get<std::string>(), j.value("file", std::string("tau.yaml")));
    json diags = json::array();
    for (const auto& d : parsed.diagnostics)
      diags.push_back(
          {{"line", d.line}, {"column", d.column}, {"message", d.message}, {"text", d.ToString()}});
    Reply(res, 200, {{"valid", parsed.ok()}, {"diagnostics", diags}});
  });

  http->Route("POST", "/api/v1/runs", [controller](const HttpRequest& req, HttpResponse& res) {
    auto submit = ParseSubmit(req.body);
    if (!submit.ok()) return ReplyError(res, submit.status());
    SubmitError error;
    auto run = controller->Submit(std::move(*submit), &error);
    if (!run.ok()) {
      json diags = json::array();
      for (const auto& d : error.diagnostics) diags.push_back(d.ToString());
      return ReplyError(res, run.status(), {{"diagnostics", diags}});
    }
    Reply(res, 201, {{"run", RunJson(*run, controller)}});
  });

  http->Route("GET", "/api/v1/runs",
              [controller, store](const HttpRequest& req, HttpResponse& res) {
                store::RunFilter filter;
                if (req.has_param("state")) {
                  auto state = store::ParseRunState(req.get_param_value("state"));
                  if (!state.ok()) return ReplyError(res, state.status());
                  filter.state = *state;
                }
                filter.active_only = BoolParam(req, "active");
                if (req.has_param("workspace")) filter.workspace = req.get_param_value("workspace");
                auto limit = IntParam(req, "limit", 100, 1, 1000);
                if (!limit.ok()) return ReplyError(res, limit.status());
                auto offset = IntParam(req, "offset", 0, 0, INT64_MAX);
                if (!offset.ok()) return ReplyError(res, offset.status());
                filter.limit = *limit;
                filter.offset = *offset;
                auto runs = store->ListRuns(filter);
                if (!runs.ok()) return ReplyError(res, runs.status());
                auto total = store->CountRuns(filter);
                if (!total.ok()) return ReplyError(res, total.status());
                json list = json::array();
                for (const RunRecord& r : *runs) list.push_back(RunJson(r, controller));
                Reply(res, 200,
                      {{"runs", list}, {"total", *total}, {"limit", *limit}, {"offset", *offset}});
              });

  http->Route("GET", R"(/api/v1/runs/([a-z0-9-]+))",
              [controller, store](const HttpRequest& req, HttpResponse& res) {
                std::string name = req.matches[1];
                auto run = store->GetRun(name);
                if (!run.ok()) return ReplyError(res, run.status());
                auto attempts = store->ListAttempts(name);
                auto events = store->ListEvents(name);
                if (!attempts.ok()) return ReplyError(res, attempts.status());
                if (!events.ok()) return ReplyError(res, events.status());
                json body = {{"run", RunJson(*run, controller)}};
                body["run"]["spec"] = run->spec_json;
                json a = json::array(), e = json::array();
                for (const auto& x : *attempts) a.push_back(AttemptJson(x));
                for (const auto& x : *events) e.push_back(EventJson(x));
                body["attempts"] = a;
                body["events"] = e;
                Reply(res, 200, body);
              });

  http->Route("POST", R"(/api/v1/runs/([a-z0-9-]+)/rerun)",
              [controller](const HttpRequest& req, HttpResponse& res) {
                std::string warning;
                auto run = controller->Rerun(req.matches[1], &warning);
                if (!run.ok()) return ReplyError(res, run.status());
                json body = {{"run", RunJson(*run, controller)}};
                if (!warning.empty()) body["warning"] = warning;
                Reply(res, 201, body);
              });
  http->Route("POST", R"(/api/v1/runs/([a-z0-9-]+)/resume)",
              [controller](const HttpRequest& req, HttpResponse& res) {
                json j = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
                if (j.is_discarded() || !j.is_object())
                  return ReplyError(res, InvalidArgument("request body is not a JSON object"));
                std::string from =
                    j.contains("from") && j["from"].is_string() ? j["from"].get<std::string>() : "";
                bool force =
                    j.contains("force") && j["force"].is_boolean() && j["force"].get<bool>();
                Status s = controller->Resume(req.matches[1], from, force);
                if (!s.ok()) return ReplyError(res, s);
                Reply(res, 202, {{"resuming", std::string(req.matches[1])}});
              });
  http->Route("POST", R"(/api/v1/runs/([a-z0-9-]+)/cancel)",
              [controller](const HttpRequest& req, HttpResponse& res) {
                Status s = controller->Cancel(req.matches[1]);
                if (!s.ok()) return ReplyError(res, s);
                Reply(res, 202, {{"cancelling", std::string(req.matches[1])}});
              });

  http->Route("GET", R"(/api/v1/runs/([a-z0-9-]+)/logs)",
              [controller, store, http](const HttpRequest& req, HttpResponse& res) {
                std::string name = req.matches[1];
                auto run = store->GetRun(name);
                if (!run.ok()) return ReplyError(res, run.status());
                auto attempt = IntParam(req, "attempt", 0, 1, 1000000);
                if (!attempt.ok()) return ReplyError(res, attempt.status());
                auto rank = IntParam(req, "rank", 0, 0, 100000);
                if (!rank.ok()) return ReplyError(res, rank.status());
                if (*attempt > run->attempts && !BoolParam(req, "follow"))
                  return ReplyError(res, NotFound(fmt::format("run '{}' has {} attempt(s), not {}",
                                                              name, run->attempts, *attempt)));
                auto streamer = std::make_shared<LogStreamer>(
                    store, controller, name, static_cast<int>(*attempt), static_cast<int>(*rank),
                    BoolParam(req, "follow"), http);
                res.content_type = "text/plain; charset=utf-8";
                res.stream = [streamer](ChunkSink& sink) { return streamer->Step(sink); };
              });
}

}  // namespace tau::server
