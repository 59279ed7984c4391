#include "server/authz.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "common/users.h"
#include "http/reply.h"

namespace tau::server {
namespace {

using nlohmann::json;

// Who the peer of a Unix socket is (the kernel says: SO_PEERCRED), with the groups "group:NAME"
// members are matched against. The server's own user and root administer the server.
auth::Identity LookUpUnixIdentity(const std::string& peer_uid) {
  auth::Identity who;
  who.via = "unix";
  uid_t uid = static_cast<uid_t>(std::strtoul(peer_uid.c_str(), nullptr, 10));
  who.local_admin = uid == 0 || uid == ::getuid();
  auto user = LookUpUserById(uid);
  if (!user.ok()) {
    who.user = peer_uid;  // a uid without a name still identifies someone
    return who;
  }
  who.user = user->name;
  who.groups = user->group_names;
  return who;
}

// The same, remembered for a few seconds: every request asks, and reading the user and group
// databases costs more than the rest of a small request. A changed group membership shows within
// kUnixIdentityTtlMs.
constexpr int64_t kUnixIdentityTtlMs = 5000;
auth::Identity UnixIdentity(const std::string& peer_uid) {
  static Mutex mu;
  static std::map<std::string, std::pair<int64_t, auth::Identity>> cache TAU_GUARDED_BY(mu);
  int64_t now = MonotonicMillis();
  {
    MutexLock lock(&mu);
    if (auto it = cache.find(peer_uid); it != cache.end() && it->second.first > now)
      return it->second.second;
  }
  auth::Identity who = LookUpUnixIdentity(peer_uid);
  MutexLock lock(&mu);
  if (cache.size() > 4096) cache.clear();  // bounded: uids are few, but never trust that
  cache[peer_uid] = {now + kUnixIdentityTtlMs, who};
  return who;
}

// The name of the user the server runs as: that user administers it, however they sign in.
const std::string& ServerUser() {
  static const std::string name = [] {
    auto user = LookUpUserById(::getuid());
    return user.ok() ? user->name : std::to_string(::getuid());
  }();
  return name;
}

std::string Describe(const auth::Identity& who) {
  if (!who.signed_in()) return "an anonymous caller";
  if (who.via == "token") return fmt::format("user '{}' (token {})", who.user, who.token_id);
  return fmt::format("user '{}'", who.user);
}

bool IsRefusal(int status) {
  return status == 401 || status == 403 || status == 429 || status == 503;
}

const char* RefusalAction(int status) {
  switch (status) {
    case 401:
      return "unauthenticated";
    case 403:
      return "denied";
    case 429:
      return "throttled";
    default:
      return "unavailable";
  }
}

// Who a refusal is counted against: the identity, or the address (uid) of an anonymous caller, who
// may send any token.
std::string CallerKey(const http::HttpRequest& req, const auth::Identity& who) {
  if (who.signed_in()) return "user '" + who.user + "'";
  return "an anonymous caller from " +
         (req.peer.empty() ? std::string("an unknown peer") : req.peer);
}

// At most this many (caller, status, route) windows at once: callers who vary their address or
// route past it share one overflow window.
constexpr size_t kMaxRefusalWindows = 256;
// Rows a window may hold, as multiples of rows_per_key: per caller, however many routes it tries,
// and in all, however many callers there are.
constexpr int kCallerRowsPerKeyRows = 6;
constexpr int kAllRowsPerKeyRows = 60;

}  // namespace

// Decides which refusals are written one by one, and sums up the rest.
class RefusalLog {
 public:
  explicit RefusalLog(RefusalAuditOptions options) : options_(options) {}

  // Counts a refusal; true when it is to be written (and logged) one by one.
  bool Admit(const std::string& caller, const store::AuditRecord& a, const std::string& route,
             int64_t now) {
    MutexLock lock(&mu_);
    Key key{caller, a.status, a.method, route};
    if (!windows_.count(key) && windows_.size() >= kMaxRefusalWindows)
      key = Key{"many callers", a.status, a.method, "(routes past the limit of windows)"};
    Window& w = Start(&windows_[key], now);
    Window& of_caller = Start(&callers_[std::get<0>(key)], now);
    Window& all = Start(&all_, now);
    const int n = options_.rows_per_key;
    if (w.written < n && of_caller.written < n * kCallerRowsPerKeyRows &&
        all.written < n * kAllRowsPerKeyRows) {
      ++w.written;
      ++of_caller.written;
      ++all.written;
      return true;
    }
    if (w.suppressed++ == 0) w.sample = a;
    return false;
  }

  // The summary rows of windows that ended with refusals not written; windows that ended are
  // forgotten. Cheap (one atomic load) until the next window ends.
  std::vector<store::AuditRecord> Due(int64_t now) {
    if (now < next_sweep_ms_.load(std::memory_order_relaxed)) return {};
    MutexLock lock(&mu_);
    std::vector<store::AuditRecord> out;
    int64_t next = std::numeric_limits<int64_t>::max();
    for (auto it = windows_.begin(); it != windows_.end();) {
      Window& w = it->second;
      if (w.end_ms > now) {
        next = std::min(next, w.end_ms);
        ++it;
        continue;
      }
      if (w.suppressed > 0) {
        const auto& [caller, status, method, route] = it->first;
        store::AuditRecord a = w.sample;
        a.ts_ms = NowMillis();
        a.path = route;
        a.action = "refusals.suppressed";
        a.detail = fmt::format(
            "{} more {} refusal(s) ({}) of {} on {} {} within {} s were counted "
            "(tau_http_refused_total), not recorded one by one; the first of them: {}",
            w.suppressed, status, RefusalAction(status), caller, method, route,
            options_.window_ms / 1000, w.sample.detail);
        out.push_back(std::move(a));
      }
      it = windows_.erase(it);
    }
    for (auto it = callers_.begin(); it != callers_.end();) {
      if (it->second.end_ms > now) {
        next = std::min(next, it->second.end_ms);
        ++it;
      } else {
        it = callers_.erase(it);
      }
    }
    next_sweep_ms_.store(next);
    return out;
  }

 private:
  using Key = std::tuple<std::string, int, std::string, std::string>;  // caller, status, method,
                                                                       // route
  struct Window {
    int64_t end_ms = 0;
    int written = 0;
    int64_t suppressed = 0;
    store::AuditRecord sample;  // the first refusal not written
  };
  // A window that ended starts again; a new one is swept when it ends, so the maps keep only live
  // windows.
  Window& Start(Window* w, int64_t now) TAU_REQUIRES(mu_) {
    if (w->end_ms != 0 && now < w->end_ms) return *w;
    w->end_ms = now + options_.window_ms;
    w->written = 0;
    next_sweep_ms_.store(std::min(next_sweep_ms_.load(), w->end_ms));
    return *w;
  }

  const RefusalAuditOptions options_;
  Mutex mu_;
  std::map<Key, Window> windows_ TAU_GUARDED_BY(mu_);
  std::map<std::string, Window> callers_ TAU_GUARDED_BY(mu_);  // only end_ms and written
  Window all_ TAU_GUARDED_BY(mu_);
  std::atomic<int64_t> next_sweep_ms_{std::numeric_limits<int64_t>::max()};
};

SecureRouter::SecureRouter(http::HttpServer* http, Controller* controller, store::Store* store,
                           Metrics* metrics, RefusalAuditOptions refusals)
    : http_(http),
      controller_(controller),
      store_(store),
      metrics_(metrics),
      refusals_(std::make_unique<RefusalLog>(refusals)) {}

SecureRouter::~SecureRouter() = default;

const char* AccessName(Access access) {
  switch (access) {
    case Access::kPublic:
      return "public";
    case Access::kSignedIn:
      return "signed-in";
    case Access::kPlatformRead:
      return "platform viewer";
    case Access::kAdmin:
      return "admin";
    case Access::kRunRead:
      return "viewer of the run's workspace";
    case Access::kRunWrite:
      return "researcher of the run's workspace";
  }
  return "admin";
}

std::optional<std::vector<std::string>> CallerContext::VisibleWorkspaces() const {
  if (auth::IsPlatformViewer(*platform, who)) return std::nullopt;
  std::vector<std::string> out;
  for (const policy::Workspace& w : platform->workspaces)
    if (RoleIn(w.name) >= auth::Role::kViewer) out.push_back(w.name);
  return out;
}

std::string BearerToken(const http::HttpRequest& req) {
  if (auto it = req.headers.find("authorization"); it != req.headers.end()) {
    std::string_view v = it->second;
    if (v.size() > 7 && (v.substr(0, 7) == "Bearer " || v.substr(0, 7) == "bearer "))
      return std::string(Trim(v.substr(7)));
  }
  if (auto it = req.headers.find("cookie"); it != req.headers.end()) {
    for (const std::string& part : Split(it->second, ';')) {
      std::string_view kv = Trim(part);
      if (StartsWith(kv, "tau_session=")) return std::string(kv.substr(12));
    }
  }
  return "";
}

Result<auth::Identity> SecureRouter::Authenticate(const http::HttpRequest& req,
                                                  const policy::Platform& platform) const {
  std::string token = BearerToken(req);
  if (token.empty()) {
    if (!req.peer_uid.empty()) return UnixIdentity(req.peer_uid);
    return auth::Identity{};  // anonymous
  }
  std::string digest = auth::TokenDigest(token);
  auth::Identity who;
  who.via = "token";
  who.token_id = auth::TokenId(digest);
  // Tokens declared in the platform file first: they need no store.
  for (const policy::User& u : platform.users) {
    for (const std::string& d : u.token_sha256) {
      if (d == digest) {
        who.user = u.name;
        who.local_admin = u.name == ServerUser();
        who.groups = auth::GroupsOf(platform, u.name, {});
        return who;
      }
    }
  }
  auto record = store_->FindToken(digest);
  if (!record.ok()) {
    if (record.status().code() == StatusCode::kNotFound)
      return Unauthenticated(
          "unknown API token; create one with `tau admin token create` and "
          "sign in with `tau login`");
    return record.status();
  }
  if (record->revoked_ms)
    return Unauthenticated(fmt::format("API token {} was revoked", record->id));
  if (record->expires_ms && *record->expires_ms <= NowMillis())
    return Unauthenticated(
        fmt::format("API token {} expired at {}", record->id, FormatRfc3339(*record->expires_ms)));
  who.user = record->user;
  who.groups = auth::GroupsOf(platform, record->user, record->groups);
  who.local_admin = record->user == ServerUser();
  return who;
}

void SecureRouter::Audit(const http::HttpRequest& req, const auth::Identity& who, int status,
                         const std::string& action, const std::string& detail) const {
  store::AuditRecord a;
  a.ts_ms = NowMillis();
  a.user = who.user;
  a.via = who.via;
  a.method = req.method;
  a.path = req.path;
  a.status = status;
  a.action = action;
  a.detail = detail;
  const bool refusal = IsRefusal(status);
  std::string caller;
  if (refusal) {
    const std::string route = req.route.empty() ? "unmatched" : req.route;
    if (metrics_)
      metrics_->Count("tau_http_refused_total",
                      {{"route", route}, {"status", std::to_string(status)}});
    caller = CallerKey(req, who);
    if (!refusals_->Admit(caller, a, route, MonotonicMillis())) return;
  }
  if (Status s = store_->AppendAudit(a); !s.ok())
    std::fprintf(stderr, "tau server: audit record not written: %s\n", s.ToString().c_str());
  if (refusal)
    std::fprintf(stderr, "tau server: %s %s %s by %s: %s\n", action.c_str(), req.method.c_str(),
                 req.path.c_str(), who.signed_in() ? Describe(who).c_str() : caller.c_str(),
                 detail.c_str());
}

void SecureRouter::Deny(const http::HttpRequest&, http::HttpResponse& res, const auth::Identity&,
                        const std::string& why) const {
  http::ReplyError(res, PermissionDenied(why));  // audited by the route's wrapper
}

namespace {

// The message of an error answer, for the audit record.
std::string ErrorMessage(const http::HttpResponse& res) {
  auto j = json::parse(res.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    return j["error"].value("message", "");
  return "";
}

}  // namespace

void SecureRouter::Route(const std::string& method, const std::string& pattern, Access access,
                         http::HttpHandler handler, Body body) {
  Route(
      method, pattern, access,
      [handler = std::move(handler)](const http::HttpRequest& req, http::HttpResponse& res,
                                     const CallerContext&) { handler(req, res); },
      body);
}

void SecureRouter::BudgetStream(const http::HttpRequest& req, http::HttpResponse& res,
                                const auth::Identity& who) const {
  if (!res.stream || res.status >= 400) return;
  // Per identity, however many tokens or connections it uses; an anonymous caller per address.
  const std::string owner = who.signed_in() ? "user '" + who.user + "'" : "address " + req.peer;
  int held = 0;
  std::shared_ptr<void> hold = http_->HoldStream(owner, &held);
  if (!hold) {
    res = http::HttpResponse();
    http::ReplyError(
        res, ResourceExhausted(fmt::format(
                 "{} already holds {} open streams (event streams, log follows, downloads), the "
                 "most one {} may hold; close one first. The server's operator sets the limit "
                 "(tau server --max-streams-per-identity)",
                 owner, held, who.signed_in() ? "identity" : "address")));
    res.status = 429;
    res.headers_out.emplace_back("Retry-After", "30");
    return;
  }
  res.stream = [hold = std::move(hold), stream = std::move(res.stream)](http::ChunkSink& sink) {
    return stream(sink);
  };
}

namespace {

// Whether `caller` may submit anywhere: an admin, or a researcher of some workspace.
bool MaySubmit(const CallerContext& caller) {
  if (caller.IsAdmin()) return true;
  for (const policy::Workspace& w : caller.platform->workspaces)
    if (caller.RoleIn(w.name) >= auth::Role::kResearcher) return true;
  return false;
}

}  // namespace

bool SecureRouter::Admit(http::HttpRequest& req, http::HttpResponse& res, Access access,
                         Body body) const {
  auto caller = std::make_shared<CallerContext>();
  caller->platform = controller_->CurrentPlatform().platform;
  auto who = Authenticate(req, *caller->platform);
  if (access == Access::kPublic) {
    // A public route still knows a caller who shows good credentials.
    if (who.ok()) caller->who = std::move(*who);
  } else if (!who.ok()) {
    Audit(req, auth::Identity{}, 401, "unauthenticated", who.status().message());
    http::ReplyError(res, who.status());
    return false;
  } else if (!who->signed_in()) {
    Status s = Unauthenticated(
        "this endpoint needs an API token (Authorization: Bearer TOKEN); create one with `tau "
        "admin token create` and sign in with `tau login`");
    Audit(req, *who, 401, "unauthenticated", "no credentials");
    http::ReplyError(res, s);
    return false;
  } else {
    caller->who = std::move(*who);
  }
  if (caller->who.signed_in()) req.signed_in_as = "user '" + caller->who.user + "'";
  const policy::Platform& platform = *caller->platform;
  std::string denied;
  switch (access) {
    case Access::kPublic:
    case Access::kSignedIn:
      break;
    case Access::kPlatformRead:
      if (!auth::IsPlatformViewer(platform, caller->who))
        denied = "only platform admins and viewers may read this";
      break;
    case Access::kAdmin:
      if (!auth::IsAdmin(platform, caller->who)) denied = "only platform admins may do this";
      break;
    case Access::kRunRead:
    case Access::kRunWrite: {
      auto run = store_->GetRun(req.matches.at(1));
      if (!run.ok()) {
        http::ReplyError(res, run.status());
        return false;
      }
      auth::Role need = access == Access::kRunRead ? auth::Role::kViewer : auth::Role::kResearcher;
      auth::Role have = caller->RoleIn(run->workspace);
      if (have < need)
        denied = fmt::format(
            "{} is {} in workspace '{}'; this needs {}", Describe(caller->who),
            have == auth::Role::kNone ? "not a member" : std::string("a ") + auth::RoleName(have),
            run->workspace, AccessName(access));
      break;
    }
  }
  // A large body is held only for a caller who could use it.
  if (denied.empty() && body.submission && req.content_length > http::kDefaultMaxBodyBytes &&
      !MaySubmit(*caller))
    denied = fmt::format(
        "{} is a researcher of no workspace, so may not submit runs or upload code; a request "
        "body over {} bytes is refused here before it is read",
        Describe(caller->who), http::kDefaultMaxBodyBytes);
  if (!denied.empty()) {
    Deny(req, res, caller->who, denied);
    Audit(req, caller->who, res.status, RefusalAction(res.status), ErrorMessage(res));
    return false;
  }
  req.admitted = std::move(caller);
  return true;
}

void SecureRouter::Route(const std::string& method, const std::string& pattern, Access access,
                         SecureHandler handler, Body body) {
  http::RouteOptions options;
  options.max_body_bytes = body.max_bytes;
  options.admit = [this, access, body](http::HttpRequest& req, http::HttpResponse& res) {
    return Admit(req, res, access, body);
  };
  http_->Route(
      method, pattern,
      [this, access, handler = std::move(handler)](const http::HttpRequest& req,
                                                   http::HttpResponse& res) {
        // Refusals summed up over a window that has ended are written now, with any request.
        for (const store::AuditRecord& a : refusals_->Due(MonotonicMillis())) {
          if (Status s = store_->AppendAudit(a); !s.ok())
            std::fprintf(stderr, "tau server: audit record not written: %s\n",
                         s.ToString().c_str());
          std::fprintf(stderr, "tau server: %s\n", a.detail.c_str());
        }
        // Decided by Admit, from the head, before the body was read.
        auto caller = std::static_pointer_cast<const CallerContext>(req.admitted);
        if (!caller)
          return http::ReplyError(res, Internal("a request reached its route unadmitted"));
        handler(req, res, *caller);
        BudgetStream(req, res, caller->who);
        // Every refusal is audited (sampled), whoever decided it: a handler, policy resolution
        // refusing a workspace, or the stream budget.
        if (access != Access::kPublic && IsRefusal(res.status))
          Audit(req, caller->who, res.status, RefusalAction(res.status), ErrorMessage(res));
      },
      std::move(options));
}

json FilterQueues(json queues, const CallerContext& caller) {
  std::optional<std::vector<std::string>> visible = caller.VisibleWorkspaces();
  if (!visible) return queues;
  auto hide = [&](json& runs) {
    if (!runs.is_array()) return;
    for (json& r : runs) {
      std::string ws = r.is_object() ? r.value("workspace", "") : "";
      if (std::find(visible->begin(), visible->end(), ws) != visible->end()) continue;
      json kept = {{"hidden", true}};
      for (const char* key : {"position", "priority", "state"})
        if (r.contains(key)) kept[key] = r[key];
      r = std::move(kept);
    }
  };
  if (queues.contains("queues") && queues["queues"].is_array())
    for (json& q : queues["queues"]) {
      if (q.contains("pending_runs")) hide(q["pending_runs"]);
      if (q.contains("admitted_runs")) hide(q["admitted_runs"]);
    }
  if (queues.contains("unqueued_runs") && !caller.IsAdmin())
    queues["unqueued_runs"] = json::array();
  return queues;
}

}  // namespace tau::server
