#include "server/api.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <chrono>
#include <csignal>
#include <thread>

#include <fmt/format.h>

#include "api/types.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/quantity.h"
#include "common/strings.h"
#include "common/version.h"
#include "controller/redact.h"
#include "http/reply.h"
#include "runtime/runtime.h"
#include "server/authz.h"
#include "server/server.h"
#include "server/web.h"

extern char** environ;

namespace tau::server {
namespace {

using nlohmann::json;
using store::RunRecord;

// The most any route takes (authz.h: kMaxSubmissionBytes); each route has its own limit, and a
// route that names none takes http::kDefaultMaxBodyBytes.
constexpr size_t kMaxRequestBytes = kMaxSubmissionBytes;
// A spec or platform file (1 MiB of YAML) as a JSON string, escapes included.
constexpr size_t kSpecRequestBytes = 4u << 20;
// A manifest of up to 20,000 files, each path up to 1 KiB.
constexpr size_t kManifestRequestBytes = 32u << 20;
constexpr int kLogPollMs = 100;

std::optional<std::string> OptionalTime(const std::optional<int64_t>& ms) {
  if (!ms) return std::nullopt;
  return FormatRfc3339(*ms);
}

}  // namespace

api::Run RunOf(const RunRecord& r, Controller* controller, bool just_inserted) {
  api::Run run;
  run.name = r.name;
  run.spec_name = r.spec_name;
  run.spec_file = r.spec_file;
  run.state = store::RunStateName(r.state);
  run.reason = r.reason;
  run.message = r.message;
  run.exit_code = r.exit_code;
  run.signal = r.signal;
  run.attempts = r.attempts;
  run.workspace = r.workspace;
  run.user = r.owner;
  run.queue = r.queue;
  run.priority = r.priority;
  run.gpus = r.gpus;
  run.resources = r.resources;
  run.config_hash = r.config_hash;
  run.snapshot_digest = r.snapshot_digest;
  run.cancel_requested = r.cancel_requested;
  run.created = FormatRfc3339(r.created_ms);
  run.admitted = OptionalTime(r.admitted_ms);
  run.started = OptionalTime(r.started_ms);
  run.finished = OptionalTime(r.finished_ms);
  // A list page's rows carry no spec: the kind is a column of its own.
  run.kind = !r.kind.empty() ? r.kind : r.spec_json.value("kind", "");
  run.project = r.project;  // columns too, filled from the spec by the store
  run.group = r.group;
  run.backend = controller->BackendName();
  if (r.array.is_object()) {
    auto array = api::RunArray::FromJson(r.array);
    if (array.ok()) run.array = std::move(*array);
  }
  if (r.service.is_object()) {
    // A service's replica: its upstream is the model it serves, not a workflow's stage.
    run.extra["service"] = r.service;
  } else if (r.workflow.is_object()) {
    auto workflow = api::RunWorkflow::FromJson(r.workflow);
    if (workflow.ok()) run.workflow = std::move(*workflow);
  }
  if (r.state == store::RunState::kQueued) {
    run.has_pending = true;
    // null until a pass has seen the run
    json pending =
        just_inserted ? Controller::WaitingForScheduler() : controller->PendingInfo(r.name);
    if (!pending.is_null()) {
      auto typed = api::Pending::FromJson(pending);
      if (typed.ok())
        run.pending = std::move(*typed);
      else
        run.extra["pending"] = std::move(pending);  // passed on as the controller made it
    }
  }
  return run;
}

namespace {

api::Attempt AttemptOf(const store::AttemptRecord& a) {
  api::Attempt out;
  out.number = a.number;
  out.state = store::AttemptStateName(a.state);
  out.gpus = a.gpus;
  out.started = FormatRfc3339(a.started_ms);
  out.ended = OptionalTime(a.ended_ms);
  out.exit_code = a.exit_code;
  out.signal = a.signal;
  out.outcome = a.outcome;
  out.reason = a.reason;
  out.message = a.message;
  out.supervisor_pid = a.shim_pid;
  if (!(a.diagnosis.is_object() && a.diagnosis.empty())) {
    auto typed = api::Diagnosis::FromJson(a.diagnosis);
    if (typed.ok())
      out.diagnosis = std::move(*typed);
    else
      out.extra["diagnosis"] = a.diagnosis;  // passed on as it was recorded
  }
  return out;
}

api::Event EventOf(const store::Event& e) {
  api::Event out;
  out.time = FormatRfc3339(e.ts_ms);
  out.type = e.type;
  out.message = e.message;
  out.data = e.data;
  out.hash = e.hash;
  return out;
}

// An idempotency key as clients make them (random hex, UUIDs): 1 to 128 of [A-Za-z0-9._:-].
bool IsIdempotencyKey(const std::string& key) {
  if (key.empty() || key.size() > 128) return false;
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-')
      return false;
  return true;
}

bool BoolParam(const http::HttpRequest& req, const char* name) {
  if (!req.has_param(name)) return false;
  std::string v = req.get_param_value(name);
  return v == "1" || v == "true" || v == "yes";
}

// Streams one rank's log of a run, optionally following it across attempts until the run ends.
class LogStreamer {
 public:
  LogStreamer(store::Store* store, Controller* controller, std::string run, int attempt, int rank,
              bool follow, int64_t skip, const http::HttpServer* http,
              std::vector<std::string> secrets)
      : redactor_(std::move(secrets)),
        store_(store),
        controller_(controller),
        run_(std::move(run)),
        pinned_(attempt > 0),
        attempt_(attempt),
        rank_(rank),
        follow_(follow),
        http_(http),
        skip_(skip) {}
  ~LogStreamer() {
    if (fd_ >= 0) ::close(fd_);
  }

  // One step of the stream; false ends it.
  bool Step(http::ChunkSink& sink) {
    // Shutting down: cut short, holding back what the redactor holds (the client asks again).
    if (http_->shutting_down()) return false;
    if (fd_ < 0 && !OpenCurrent()) {
      if (!follow_ || RunFinished()) return Done(sink);
      return Idle(sink);
    }
    char buf[65536];
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n > 0) return Read(sink, buf, n);
    if (!follow_) return Done(sink);
    // The log reached its cap and the shim replaced it with its newest part: go on in the new
    // file from where this one ended.
    if (FollowCut()) return true;
    // At the end of the file: the attempt may still be writing.
    if (!AttemptFinished()) return Idle(sink);
    // Finished: one more read catches output written between the read above and the check.
    n = ::read(fd_, buf, sizeof buf);
    if (n > 0) return Read(sink, buf, n);
    if (FollowCut()) return true;
    if (!pinned_ && NextAttemptStarted()) {
      ::close(fd_);
      fd_ = -1;
      ++attempt_;
      std::string banner = redactor_.Feed("", /*flush=*/true);
      banner += fmt::format("[tau] --- attempt {} ---\n", attempt_);
      return Emit(sink, banner);
    }
    return RunFinished() ? Done(sink) : Idle(sink);
  }

 private:
  // Every byte of the stream goes out here. A client that lost its stream (a server restart) asks
  // again with `skip` = the bytes it has, and gets the rest.
  bool Emit(http::ChunkSink& sink, std::string_view out) {
    if (skip_ > 0) {
      size_t dropped = static_cast<size_t>(std::min<int64_t>(skip_, out.size()));
      skip_ -= static_cast<int64_t>(dropped);
      out.remove_prefix(dropped);
    }
    return out.empty() || sink.Write(out);
  }
  bool Write(http::ChunkSink& sink, std::string_view data) {
    return Emit(sink, redactor_.Feed(data, /*flush=*/false));
  }
  bool Flush(http::ChunkSink& sink) { return Emit(sink, redactor_.Feed("", /*flush=*/true)); }
  bool Read(http::ChunkSink& sink, const char* buf, ssize_t n) {
    if (pos_ == 0) ReadMarker(std::string_view(buf, static_cast<size_t>(n)));
    pos_ += n;
    return Write(sink, std::string_view(buf, static_cast<size_t>(n)));
  }
  // A capped log starts with "[tau] N bytes of earlier output dropped...": the output before the
  // file's content.
  void ReadMarker(std::string_view head) {
    file_dropped_ = 0;
    header_ = 0;
    static constexpr std::string_view kTag = " bytes of earlier output dropped";
    const size_t nl = head.find('\n');
    if (!StartsWith(head, "[tau] ") || nl == std::string_view::npos) return;
    std::string_view line = head.substr(0, nl);
    const size_t tag = line.find(kTag);
    if (tag == std::string_view::npos) return;
    int64_t dropped = 0;
    auto [end, ec] = std::from_chars(line.data() + 6, line.data() + tag, dropped);
    if (ec != std::errc() || end != line.data() + tag) return;
    file_dropped_ = dropped;
    header_ = static_cast<int64_t>(nl + 1);
  }
  // When rank-R.log now names another file than the one open, opens it at the byte that follows
  // what was read (or at its start, when that part was dropped too).
  bool FollowCut() {
    struct stat open_st, path_st;
    if (::fstat(fd_, &open_st) != 0 || ::stat(path_.c_str(), &path_st) != 0 ||
        (open_st.st_ino == path_st.st_ino && open_st.st_dev == path_st.st_dev))
      return false;
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const int64_t output_read = file_dropped_ + std::max<int64_t>(0, pos_ - header_);
    ::close(fd_);
    fd_ = fd;
    char head[4096];
    ssize_t n = ::pread(fd_, head, sizeof head, 0);
    pos_ = 0;
    ReadMarker(std::string_view(head, n > 0 ? static_cast<size_t>(n) : 0));
    int64_t at = header_ + output_read - file_dropped_;
    if (at < header_) at = 0;
    if (::lseek(fd_, at, SEEK_SET) == at) pos_ = at;
    return true;
  }
  bool Done(http::ChunkSink& sink) {
    Flush(sink);
    return false;
  }
  // Nothing new yet. What the redactor holds back stays held: it may be half of a secret that the
  // run has not finished printing.
  bool Idle(http::ChunkSink& sink) {
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
    path_ = path;
    pos_ = 0;
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

  Redactor redactor_;  // what the run prints of its secrets is served masked
  store::Store* store_;
  Controller* controller_;
  std::string run_;
  bool pinned_;
  int attempt_;
  int rank_;
  bool follow_;
  const http::HttpServer* http_;
  int fd_ = -1;
  std::string path_;          // of the open log
  int64_t pos_ = 0;           // bytes read of the open file
  int64_t file_dropped_ = 0;  // output before the open file's content (its marker says)
  int64_t header_ = 0;        // the marker line's bytes
  int64_t skip_ = 0;          // bytes of the stream the client has already
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

// Quantities in metrics are plain numbers: units for GPUs and CPUs, bytes for memory.
double QuantityValue(const std::string& text) {
  auto q = Quantity::Parse(text);
  return q.ok() ? static_cast<double>(q->milli()) / 1000.0 : 0;
}

}  // namespace

Result<int64_t> IntParam(const http::HttpRequest& req, const char* name, int64_t fallback,
                         int64_t min, int64_t max) {
  if (!req.has_param(name)) return fallback;
  std::string v = req.get_param_value(name);
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > max)
    return InvalidArgument(fmt::format(
        "query parameter '{}' must be an integer in {}..{}, got '{}'", name, min, max, v));
  return static_cast<int64_t>(n);
}

std::string RenderAllMetrics(Controller* controller, store::Store* store,
                             health::GpuMonitor* monitor, Metrics* metrics) {
  std::string out = metrics->Render();
  std::vector<std::pair<Labels, double>> runs;
  if (auto counts = store->CountRunsByStateAndWorkspace(); counts.ok())
    for (const store::RunCount& c : *counts)
      runs.push_back(
          {{{"state", c.state}, {"workspace", c.workspace}}, static_cast<double>(c.runs)});
  out += RenderGauge("tau_runs", "Runs in the store by state and workspace.", runs);
  QueuesQuery counts;
  counts.summary = true;
  json queues = controller->Queues(counts);
  std::vector<std::pair<Labels, double>> pending, admitted, usage, nominal, borrowed;
  for (const json& q : queues.value("queues", json::array())) {
    std::string name = q.value("name", "");
    pending.push_back({{{"cluster_queue", name}}, q.value("pending", 0.0)});
    admitted.push_back({{{"cluster_queue", name}}, q.value("admitted", 0.0)});
    for (const json& u : q.value("usage", json::array())) {
      Labels l = {{"cluster_queue", name},
                  {"flavor", u.value("flavor", "")},
                  {"resource", u.value("resource", "")}};
      usage.push_back({l, QuantityValue(u.value("usage", "0"))});
      nominal.push_back({l, QuantityValue(u.value("nominal", "0"))});
      borrowed.push_back({l, QuantityValue(u.value("borrowed", "0"))});
    }
  }
  out += RenderGauge("tau_cluster_queue_pending_workloads",
                     "Runs waiting in a queue (not holding quota).", pending);
  out += RenderGauge(
      "tau_cluster_queue_admitted_workloads",
      "Runs holding quota in a queue (admitted, running, or waiting for the machine).", admitted);
  out += RenderGauge("tau_cluster_queue_resource_usage",
                     "Quota in use per queue, flavor and resource (GPUs and CPUs in units, memory "
                     "in bytes).",
                     usage);
  out += RenderGauge("tau_cluster_queue_nominal_quota",
                     "Nominal quota per queue, flavor and resource.", nominal);
  out += RenderGauge("tau_cluster_queue_borrowed_resources",
                     "Quota borrowed from the cohort per queue, flavor and resource.", borrowed);
  std::vector<std::pair<Labels, double>> budget_used, budget_limit, cost_used, cost_limit;
  for (const json& b : controller->Budgets()) {
    Labels l = {{"budget", b.value("name", "")}, {"user", b.value("user", "")}};
    budget_used.push_back({l, b["used"].value("gpu_hours", 0.0)});
    if (b["gpu_hours"].is_number()) budget_limit.push_back({l, b["gpu_hours"].get<double>()});
    if (!b["cost"].is_number()) continue;
    l.push_back({"currency", b.value("currency", "")});
    cost_used.push_back({l, b["used"].value("cost", 0.0)});
    cost_limit.push_back({l, b["cost"].get<double>()});
  }
  out += RenderGauge("tau_budget_used_gpu_hours",
                     "GPU-hours a budget's scope has used in its current period or window.",
                     budget_used);
  out += RenderGauge("tau_budget_limit_gpu_hours", "A budget's GPU-hours.", budget_limit);
  out += RenderGauge("tau_budget_used_cost",
                     "What a budget in money has used in its period or window, priced at the "
                     "flavors' rates.",
                     cost_used);
  out += RenderGauge("tau_budget_limit_cost", "A budget's amount in the platform's currency.",
                     cost_limit);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  out += health::RenderMetrics(monitor->Snapshot(), host);
  return out;
}

namespace {

// The server itself: its version, a stop, health, GPUs and the Prometheus metrics.
void RegisterServerApi(SecureRouter* api, Controller* controller, store::Store* store,
                       health::GpuMonitor* monitor, Metrics* metrics) {
  api->Route("GET", "/api/v1/version", Access::kSignedIn,
             [controller](const http::HttpRequest&, http::HttpResponse& res) {
               api::Version v;
               v.version = Version();
               v.api = "v1";
               v.backend = controller->BackendName();
               http::Reply(res, 200, v.ToJson());
             });
  // Stops the server as SIGTERM does (running attempts keep running); platform admins only, so
  // a user of a shared machine cannot stop its server. Answered before the shutdown begins.
  api->Route(
      "POST", "/api/v1/server/stop", Access::kAdmin,
      [api](const http::HttpRequest& req, http::HttpResponse& res, const CallerContext& caller) {
        api->Audit(req, caller.who, 202, "server.stop", "");
        http::Reply(res, 202, {{"stopping", true}, {"pid", static_cast<int>(::getpid())}});
        ::kill(::getpid(), SIGTERM);
      });
  api->Route("GET", "/api/v1/healthz", Access::kPublic,
             [](const http::HttpRequest&, http::HttpResponse& res) {
               http::Reply(res, 200, {{"ok", true}});
             });
  api->Route("GET", "/api/v1/gpus", Access::kSignedIn,
             [monitor](const http::HttpRequest&, http::HttpResponse& res) {
               // The inventory, each device with its health verdict, and the monitor's full
               // snapshot.
               health::HealthSnapshot snap = monitor->Snapshot();
               json body = health::ToJson(snap.inventory);
               for (size_t i = 0; i < body["devices"].size() && i < snap.verdicts.size(); ++i)
                 body["devices"][i]["health"] = health::ToJson(snap.verdicts[i]);
               body["snapshot"] = health::ToJson(snap);
               http::Reply(res, 200, body);
             });
  api->Route("POST", "/api/v1/health/check", Access::kAdmin,
             [monitor](const http::HttpRequest& req, http::HttpResponse& res) {
               // Runs the passive checks now; with active=1 also the active probe, in a child
               // process.
               monitor->PollOnce();
               health::HealthSnapshot snap = monitor->Snapshot();
               json gpus = json::array();
               for (const auto& v : snap.verdicts) gpus.push_back(health::ToJson(v));
               json body = {{"gpus", gpus}, {"inventory", health::ToJson(snap.inventory)}};
               if (BoolParam(req, "active")) body["active"] = RunProbeProcess();
               http::Reply(res, 200, body);
             });
  api->Route(
      "GET", "/metrics", Access::kPlatformRead,
      [controller, store, monitor, metrics](const http::HttpRequest&, http::HttpResponse& res) {
        res.set_content(RenderAllMetrics(controller, store, monitor, metrics),
                        "text/plain; version=0.0.4; charset=utf-8");
      });
}

// Budgets, usage and capacity.
void RegisterUsageApi(SecureRouter* api, Controller* controller) {
  // Budgets and usage (docs/budgets.md): those of the workspaces the caller may see (a queue's
  // budget to everyone signed in).
  api->Route(
      "GET", "/api/v1/budgets", Access::kSignedIn,
      [controller](const http::HttpRequest&, http::HttpResponse& res, const CallerContext& caller) {
        const auto visible = caller.VisibleWorkspaces();
        json out = json::array();
        for (json& b : controller->Budgets()) {
          const std::string w = b.value("workspace", "");
          if (!w.empty() && visible &&
              std::find(visible->begin(), visible->end(), w) == visible->end())
            continue;
          out.push_back(std::move(b));
        }
        http::Reply(res, 200, json{{"budgets", out}});
      });
  api->Route(
      "GET", "/api/v1/usage", Access::kSignedIn,
      [controller](const http::HttpRequest& req, http::HttpResponse& res,
                   const CallerContext& caller) {
        const std::string by = req.has_param("by") ? req.get_param_value("by") : "workspace";
        int64_t since = 0;
        if (req.has_param("since")) {
          auto t = ParseRfc3339(req.get_param_value("since"));
          if (!t.ok())
            return http::ReplyError(
                res, InvalidArgument("since: an RFC 3339 time (2026-12-01T00:00:00Z)"));
          since = *t;
        }
        auto rows = controller->Usage(by, since, caller.VisibleWorkspaces());
        if (!rows.ok()) return http::ReplyError(res, rows.status());
        const policy::Costs costs = controller->CurrentPlatform().platform->costs;
        json out = {{"by", by},
                    {"since", FormatRfc3339(since)},
                    {"currency", costs.flavors.empty() ? json(nullptr) : json(costs.currency)},
                    {"rows", *rows}};
        // ?bucket=hour|day: the same over time (the dashboard's usage chart).
        if (req.has_param("bucket")) {
          const std::string bucket = req.get_param_value("bucket");
          if (bucket != "hour" && bucket != "day")
            return http::ReplyError(res, InvalidArgument("bucket: hour or day"));
          auto series = controller->UsageSeries(by, since, bucket == "day" ? 86'400'000 : 3'600'000,
                                                caller.VisibleWorkspaces());
          if (!series.ok()) return http::ReplyError(res, series.status());
          out["bucket"] = bucket;
          out["buckets"] = std::move((*series)["buckets"]);
          out["series"] = std::move((*series)["series"]);
        }
        http::Reply(res, 200, out);
      });
  api->Route("GET", "/api/v1/capacity", Access::kSignedIn,
             [controller](const http::HttpRequest&, http::HttpResponse& res) {
               http::Reply(res, 200, controller->Capacity());
             });
}

// Specs checked and resolved without a submission, the platform, the queues.
void RegisterPlatformApi(SecureRouter* api, Controller* controller) {
  api->Route(
      "POST", "/api/v1/validate", Access::kSignedIn,
      [](const http::HttpRequest& req, http::HttpResponse& res) {
        auto body = ParseValidateBody(req.body);
        if (!body.ok()) return http::ReplyError(res, body.status());
        auto parsed = spec::ParseSpec(body->yaml, body->file);
        json diags = json::array();
        for (const auto& d : parsed.diagnostics)
          diags.push_back({{"line", d.line},
                           {"column", d.column},
                           {"message", d.message},
                           {"text", d.ToString()}});
        http::Reply(res, 200, {{"valid", parsed.ok()}, {"diagnostics", diags}});
      },
      Body{kSpecRequestBytes});

  // What a spec becomes for the caller with the platform in force, without submitting it: `tau
  // explain` and `tau plan` against a server that is not this machine's, or as a token's user.
  api->Route(
      "POST", "/api/v1/resolve", Access::kSignedIn,
      [controller](const http::HttpRequest& req, http::HttpResponse& res,
                   const CallerContext& caller) {
        auto body = ParseResolveBody(req.body);
        if (!body.ok()) return http::ReplyError(res, body.status());
        spec::ParseOutcome parsed = spec::ParseSpec(body->spec.yaml, body->spec.file, body->set);
        if (!parsed.ok()) return http::ReplyError(res, InvalidArgument(parsed.ErrorText()));
        Controller::PlatformView view = controller->CurrentPlatform();
        auto resolved = policy::Resolve(*parsed.spec, *view.platform, caller.who.AsCaller());
        if (!resolved.ok()) return http::ReplyError(res, resolved.status());
        json reply = {{"resolved", policy::ToJson(*resolved)}, {"platform", view.source}};
        // Said back, so that a client can tell this server from one that ignores "set".
        if (!body->set.empty()) {
          reply["set"] = json::array();
          for (const spec::Override& o : body->set) reply["set"].push_back(o.Text());
        }
        http::Reply(res, 200, reply);
      },
      Body{kSpecRequestBytes});
  // The file's text only to admins: it holds what the object leaves out (users' token digests).
  api->Route(
      "GET", "/api/v1/platform", Access::kSignedIn,
      [controller](const http::HttpRequest&, http::HttpResponse& res, const CallerContext& caller) {
        Controller::PlatformView view = controller->CurrentPlatform();
        http::Reply(res, 200,
                    {{"source", view.source},
                     {"applied", FormatRfc3339(view.applied_ms)},
                     {"platform", policy::ToJson(*view.platform)},
                     {"text", caller.IsAdmin() ? view.text : std::string()}});
      });
  api->Route(
      "PUT", "/api/v1/platform", Access::kAdmin,
      [controller, api](const http::HttpRequest& req, http::HttpResponse& res,
                        const CallerContext& caller) {
        auto body = ParseValidateBody(req.body);
        if (!body.ok()) return http::ReplyError(res, body.status());
        std::vector<spec::Diagnostic> diagnostics;
        Status s = controller->ApplyPlatform(body->yaml, body->file, &diagnostics);
        if (!s.ok()) {
          json diags = json::array();
          for (const auto& d : diagnostics) diags.push_back(d.ToString());
          return http::ReplyError(res, s, {{"diagnostics", diags}});
        }
        api->Audit(req, caller.who, 200, "platform.apply", body->file);
        json reply = {{"applied", body->file}};
        for (const auto& d : diagnostics) reply["warnings"].push_back(d.ToString());
        http::Reply(res, 200, reply);
      },
      Body{kSpecRequestBytes});
  // ?summary=1: the queues without their runs (their counts stay), for `tau queues`; ?offset=O
  // and ?limit=K: of each queue's pending runs, K from position O + 1 (the counts are the
  // queue's).
  auto query = [](const http::HttpRequest& req) -> Result<QueuesQuery> {
    QueuesQuery q;
    q.summary = req.get_param_value("summary") == "1";
    TAU_ASSIGN_OR_RETURN(int64_t offset, IntParam(req, "offset", 0, 0, INT32_MAX));
    TAU_ASSIGN_OR_RETURN(int64_t limit, IntParam(req, "limit", INT32_MAX, 0, INT32_MAX));
    q.offset = static_cast<size_t>(offset);
    q.limit = static_cast<size_t>(limit);
    return q;
  };
  api->Route("GET", "/api/v1/queues", Access::kSignedIn,
             [controller, query](const http::HttpRequest& req, http::HttpResponse& res,
                                 const CallerContext& caller) {
               auto q = query(req);
               if (!q.ok()) return http::ReplyError(res, q.status());
               http::Reply(res, 200, FilterQueues(controller->Queues(*q), caller));
             });
  api->Route("GET", R"(/api/v1/queues/([^/]+))", Access::kSignedIn,
             [controller, query](const http::HttpRequest& req, http::HttpResponse& res,
                                 const CallerContext& caller) {
               auto q = query(req);
               if (!q.ok()) return http::ReplyError(res, q.status());
               q->queue = req.matches[1];
               json one = FilterQueues(controller->Queues(*q), caller);
               for (const json& found : one.value("queues", json::array()))
                 return http::Reply(res, 200, {{"queue", found}});
               http::ReplyError(res, NotFound(fmt::format("no queue '{}'",
                                                          Printable(std::string(req.matches[1])))));
             });
}

// Code upload, submissions and the runs: listed, read, rerun, resumed, cancelled.
void RegisterRunApi(SecureRouter* api, Controller* controller, store::Store* store) {
  // Code upload, before a submission that names a manifest: which blobs the caller must send,
  // then each of them as raw bytes. A digest is no capability: a manifest names only blobs its
  // caller uploaded or that a run they may read uses, and any other blob is missing to them,
  // whoever stored it (docs/security.md, "Code blobs").
  api->Route(
      "POST", "/api/v1/code/missing", Access::kSignedIn,
      [controller](const http::HttpRequest& req, http::HttpResponse& res,
                   const CallerContext& caller) {
        auto manifest = ParseManifestBody(req.body);
        if (!manifest.ok()) return http::ReplyError(res, manifest.status());
        auto check = controller->CheckCode(std::move(*manifest), caller.who.user,
                                           caller.VisibleWorkspaces());
        if (!check.ok()) return http::ReplyError(res, check.status());
        api::CodeMissing reply;
        reply.digest = check->digest;
        reply.stored = check->stored;
        reply.missing = std::move(check->missing);
        http::Reply(res, 200, reply.ToJson());
      },
      Body{kManifestRequestBytes, /*submission=*/true});
  // Only a caller who may submit somewhere uploads, within a quota of bytes no run uses yet.
  api->Route(
      "PUT", R"(/api/v1/blobs/([^/]+))", Access::kSignedIn,
      [controller, api](const http::HttpRequest& req, http::HttpResponse& res,
                        const CallerContext& caller) {
        bool may_submit = caller.IsAdmin();
        for (const policy::Workspace& w : caller.platform->workspaces)
          may_submit = may_submit || caller.RoleIn(w.name) >= auth::Role::kResearcher;
        if (!may_submit)
          return api->Deny(req, res, caller.who,
                           fmt::format("user '{}' may submit to no workspace, so may not "
                                       "upload code (a workspace's members may)",
                                       caller.who.user));
        auto added = controller->StoreCodeBlob(caller.who.user, req.matches[1], req.body);
        if (!added.ok()) return http::ReplyError(res, added.status());
        http::Reply(res, *added ? 201 : 200,
                    {{"sha256", req.matches[1]}, {"size", req.body.size()}});
      },
      Body{kMaxBlobRequestBytes, /*submission=*/true});
  api->Route(
      "POST", "/api/v1/runs", Access::kSignedIn,
      [controller](const http::HttpRequest& req, http::HttpResponse& res,
                   const CallerContext& caller) {
        auto submit = ParseSubmitBody(req.body);
        if (!submit.ok()) return http::ReplyError(res, submit.status());
        submit->caller = caller.who.AsCaller();
        submit->token_user = caller.who.via == "token";
        submit->readable_workspaces = caller.VisibleWorkspaces();
        if (auto key = req.headers.find("idempotency-key"); key != req.headers.end()) {
          if (!IsIdempotencyKey(key->second))
            return http::ReplyError(
                res, InvalidArgument("the Idempotency-Key header takes 1 to 128 letters, "
                                     "digits and . _ : - (a client's random key)"));
          submit->idempotency_key = key->second;
        }
        SubmitError error;
        auto outcome = controller->Submit(std::move(*submit), &error);
        if (!outcome.ok()) {
          json diags = json::array();
          for (const auto& d : error.diagnostics) diags.push_back(d.ToString());
          json extra = {{"diagnostics", diags}};
          if (!error.missing_blobs.empty()) extra["missing"] = error.missing_blobs;
          return http::ReplyError(res, outcome.status(), extra);
        }
        api::Submitted reply;
        // A new run waits for the scheduler: the reply does not wait for the loop's views.
        reply.run = RunOf(outcome->run, controller, !outcome->replayed);
        // A repeated submission gets the run its key made, as it is now.
        if (outcome->replayed) res.headers_out.emplace_back("Idempotent-Replayed", "true");
        http::Reply(res, outcome->replayed ? 200 : 201, reply.ToJson());
      },
      Body{kMaxSubmissionBytes, /*submission=*/true});

  // Many submissions in one request: checked whole, then inserted in one transaction (one fsync),
  // all or none; a refusal names the item at fault (`index`) with its diagnostics.
  api->Route(
      "POST", "/api/v1/runs/batch", Access::kSignedIn,
      [controller](const http::HttpRequest& req, http::HttpResponse& res,
                   const CallerContext& caller) {
        auto batch = ParseBatchBody(req.body);
        if (!batch.ok()) return http::ReplyError(res, batch.status());
        batch->caller = caller.who.AsCaller();
        batch->token_user = caller.who.via == "token";
        batch->readable_workspaces = caller.VisibleWorkspaces();
        if (auto key = req.headers.find("idempotency-key"); key != req.headers.end()) {
          if (!IsIdempotencyKey(key->second))
            return http::ReplyError(
                res, InvalidArgument("the Idempotency-Key header takes 1 to 128 letters, "
                                     "digits and . _ : - (a client's random key)"));
          batch->idempotency_key = key->second;
        }
        BatchError error;
        auto outcome = controller->SubmitBatch(std::move(*batch), &error);
        if (!outcome.ok()) {
          json diags = json::array();
          for (const auto& d : error.diagnostics) diags.push_back(d.ToString());
          json extra = {{"diagnostics", diags}};
          if (error.index) extra["index"] = *error.index;
          return http::ReplyError(res, outcome.status(), extra);
        }
        api::SubmittedBatch reply;
        reply.runs.reserve(outcome->runs.size());
        for (const RunRecord& r : outcome->runs)
          reply.runs.push_back(RunOf(r, controller, !outcome->replayed));
        if (outcome->replayed) res.headers_out.emplace_back("Idempotent-Replayed", "true");
        http::Reply(res, outcome->replayed ? 200 : 201, reply.ToJson());
      },
      Body{kMaxSubmissionBytes, /*submission=*/true});

  api->Route(
      "GET", "/api/v1/runs", Access::kSignedIn,
      [controller, store, api](const http::HttpRequest& req, http::HttpResponse& res,
                               const CallerContext& caller) {
        store::RunFilter filter;
        if (req.has_param("state")) {
          auto state = store::ParseRunState(req.get_param_value("state"));
          if (!state.ok()) return http::ReplyError(res, state.status());
          filter.state = *state;
        }
        filter.active_only = BoolParam(req, "active");
        if (req.has_param("workspace")) filter.workspace = req.get_param_value("workspace");
        filter.workspaces_in = caller.VisibleWorkspaces();
        if (!filter.workspace.empty() && caller.RoleIn(filter.workspace) < auth::Role::kViewer)
          return api->Deny(req, res, caller.who,
                           fmt::format("user '{}' may not read workspace '{}'", caller.who.user,
                                       filter.workspace));
        if (req.has_param("queue")) filter.queue = req.get_param_value("queue");
        if (req.has_param("user")) filter.owner = req.get_param_value("user");
        if (req.has_param("project")) filter.project = req.get_param_value("project");
        if (req.has_param("group")) filter.group = req.get_param_value("group");
        if (req.has_param("workflow")) filter.workflow = req.get_param_value("workflow");
        if (req.has_param("order")) {
          const std::string order = req.get_param_value("order");
          if (order != "oldest" && order != "newest")
            return http::ReplyError(
                res,
                InvalidArgument("order: 'newest' (the default) or 'oldest', not '" + order + "'"));
          filter.newest_first = order == "newest";
        }
        auto limit = IntParam(req, "limit", 100, 1, 1000);
        if (!limit.ok()) return http::ReplyError(res, limit.status());
        auto offset = IntParam(req, "offset", 0, 0, INT64_MAX);
        if (!offset.ok()) return http::ReplyError(res, offset.status());
        filter.limit = *limit;
        filter.offset = *offset;
        filter.summary = true;  // a page shows no spec nor resolution
        auto runs = store->ListRuns(filter);
        if (!runs.ok()) return http::ReplyError(res, runs.status());
        auto total = store->CountRuns(filter);
        if (!total.ok()) return http::ReplyError(res, total.status());
        api::RunList list;
        for (const RunRecord& r : *runs) list.runs.push_back(RunOf(r, controller));
        list.total = *total;
        list.limit = *limit;
        list.offset = *offset;
        http::Reply(res, 200, list.ToJson());
      });

  api->Route("GET", R"(/api/v1/runs/([a-z0-9-]+))", Access::kRunRead,
             [controller, store](const http::HttpRequest& req, http::HttpResponse& res) {
               std::string name = req.matches[1];
               auto run = store->GetRun(name);
               if (!run.ok()) return http::ReplyError(res, run.status());
               auto attempts = store->ListAttempts(name);
               auto events = store->ListEvents(name);
               if (!attempts.ok()) return http::ReplyError(res, attempts.status());
               if (!events.ok()) return http::ReplyError(res, events.status());
               api::RunDetail detail;
               detail.run = RunOf(*run, controller);
               detail.run.spec = run->spec_json;
               for (const auto& x : *attempts) detail.attempts.push_back(AttemptOf(x));
               for (const auto& x : *events) detail.events.push_back(EventOf(x));
               http::Reply(res, 200, detail.ToJson());
             });

  api->Route("POST", R"(/api/v1/runs/([a-z0-9-]+)/rerun)", Access::kRunWrite,
             [controller](const http::HttpRequest& req, http::HttpResponse& res,
                          const CallerContext& caller) {
               auto body = ParseRerunBody(req.body);
               if (!body.ok()) return http::ReplyError(res, body.status());
               std::string warning;
               const policy::Caller who = caller.who.AsCaller();
               SubmitError error;
               auto run = controller->Rerun(req.matches[1], &warning, body->overrides, &who,
                                            caller.who.via == "token", &error);
               if (!run.ok()) {
                 json diags = json::array();
                 for (const auto& d : error.diagnostics) diags.push_back(d.ToString());
                 return http::ReplyError(res, run.status(), {{"diagnostics", diags}});
               }
               api::Submitted reply;
               reply.run = RunOf(*run, controller);
               if (!warning.empty()) reply.warning = warning;
               http::Reply(res, 201, reply.ToJson());
             });
  api->Route("POST", R"(/api/v1/runs/([a-z0-9-]+)/resume)", Access::kRunWrite,
             [controller](const http::HttpRequest& req, http::HttpResponse& res) {
               auto body = ParseResumeBody(req.body);
               if (!body.ok()) return http::ReplyError(res, body.status());
               std::string pending;
               Status s = controller->Resume(req.matches[1], body->from, body->force, &pending);
               if (!s.ok()) return http::ReplyError(res, s);
               json reply = {{"resuming", std::string(req.matches[1])}};
               // Only a change not yet durable says so: the usual answer stays as it was.
               if (!pending.empty()) reply["pending"] = pending;
               http::Reply(res, 202, reply);
             });
  api->Route("POST", R"(/api/v1/runs/([a-z0-9-]+)/cancel)", Access::kRunWrite,
             [controller](const http::HttpRequest& req, http::HttpResponse& res) {
               std::string pending;
               Status s = controller->Cancel(req.matches[1], &pending);
               if (!s.ok()) return http::ReplyError(res, s);
               json reply = {{"cancelling", std::string(req.matches[1])}};
               if (!pending.empty()) reply["pending"] = pending;
               http::Reply(res, 202, reply);
             });
}

// A run's logs, streamed.
void RegisterLogApi(SecureRouter* api, http::HttpServer* http, Controller* controller,
                    store::Store* store) {
  api->Route(
      "GET", R"(/api/v1/runs/([a-z0-9-]+)/logs)", Access::kRunRead,
      [controller, store, http](const http::HttpRequest& req, http::HttpResponse& res) {
        std::string name = req.matches[1];
        auto run = store->GetRun(name);
        if (!run.ok()) return http::ReplyError(res, run.status());
        auto attempt = IntParam(req, "attempt", 0, 1, 1000000);
        if (!attempt.ok()) return http::ReplyError(res, attempt.status());
        auto rank = IntParam(req, "rank", 0, 0, 100000);
        if (!rank.ok()) return http::ReplyError(res, rank.status());
        if (*attempt > run->attempts && !BoolParam(req, "follow"))
          return http::ReplyError(res, NotFound(fmt::format("run '{}' has {} attempt(s), not {}",
                                                            name, run->attempts, *attempt)));
        int64_t workers = 1;
        if (auto w = run->resources.find("workers");
            w != run->resources.end() && w->is_number_integer())
          workers = std::max<int64_t>(1, w->get<int64_t>());
        if (*rank >= workers)
          return http::ReplyError(
              res, NotFound(fmt::format("run '{}' has {} worker(s): rank takes 0 to {}, not {}",
                                        name, workers, workers - 1, *rank)));
        auto secrets = SecretValuesOf(store, *run);
        if (!secrets.ok()) return http::ReplyError(res, secrets.status());
        auto skip = IntParam(req, "skip", 0, 0, INT64_MAX);
        if (!skip.ok()) return http::ReplyError(res, skip.status());
        auto streamer = std::make_shared<LogStreamer>(
            store, controller, name, static_cast<int>(*attempt), static_cast<int>(*rank),
            BoolParam(req, "follow"), *skip, http, std::move(*secrets));
        res.content_type = "text/plain; charset=utf-8";
        res.stream = [streamer](http::ChunkSink& sink) { return streamer->Step(sink); };
      });
}

}  // namespace

std::unique_ptr<SecureRouter> RegisterApi(http::HttpServer* http, Controller* controller,
                                          store::Store* store, health::GpuMonitor* monitor,
                                          Metrics* metrics, RefusalAuditOptions refusals,
                                          ServiceManager* services) {
  http->set_max_body_bytes(kMaxRequestBytes);
  auto router = std::make_unique<SecureRouter>(http, controller, store, metrics, refusals);
  SecureRouter* api = router.get();
  // In this order: a route's pattern is tried in the order routes were registered.
  RegisterEvidenceApi(api, controller, store);
  RegisterArtifactsApi(api, controller, store);
  RegisterIdentityApi(api, controller, store);
  RegisterServerApi(api, controller, store, monitor, metrics);
  RegisterUsageApi(api, controller);
  RegisterPlatformApi(api, controller);
  RegisterRunApi(api, controller, store);
  RegisterWorkflowApi(api, controller, store);
  if (services) RegisterServiceApi(api, services);
  RegisterLogApi(api, http, controller, store);
  RegisterEventsApi(api, controller, store);
  RegisterWeb(api);
  return router;
}

}  // namespace tau::server
