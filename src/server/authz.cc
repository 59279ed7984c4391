#include "server/authz.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>

#include <cstdio>

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

}  // namespace

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
  if (Status s = store_->AppendAudit(a); !s.ok())
    std::fprintf(stderr, "tau server: audit record not written: %s\n", s.ToString().c_str());
  if (action == "denied" || action == "unauthenticated")
    std::fprintf(stderr, "tau server: %s %s %s by %s: %s\n", action.c_str(), req.method.c_str(),
                 req.path.c_str(), Describe(who).c_str(), detail.c_str());
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
                         http::HttpHandler handler) {
  Route(method, pattern, access,
        [handler = std::move(handler)](const http::HttpRequest& req, http::HttpResponse& res,
                                       const CallerContext&) { handler(req, res); });
}

void SecureRouter::Route(const std::string& method, const std::string& pattern, Access access,
                         SecureHandler handler) {
  http_->Route(method, pattern,
               [this, access, handler = std::move(handler)](const http::HttpRequest& req,
                                                            http::HttpResponse& res) {
                 CallerContext caller;
                 caller.platform = controller_->CurrentPlatform().platform;
                 if (access == Access::kPublic) {
                   // A public route still knows a caller who shows good credentials.
                   auto who = Authenticate(req, *caller.platform);
                   if (who.ok()) caller.who = std::move(*who);
                   return handler(req, res, caller);
                 }
                 auto who = Authenticate(req, *caller.platform);
                 if (!who.ok()) {
                   Audit(req, auth::Identity{}, 401, "unauthenticated", who.status().message());
                   return http::ReplyError(res, who.status());
                 }
                 caller.who = std::move(*who);
                 if (!caller.who.signed_in()) {
                   Status s = Unauthenticated(
                       "this endpoint needs an API token (Authorization: Bearer TOKEN); create "
                       "one with `tau admin token create` and sign in with `tau login`");
                   Audit(req, caller.who, 401, "unauthenticated", "no credentials");
                   return http::ReplyError(res, s);
                 }
                 const policy::Platform& platform = *caller.platform;
                 std::string denied;
                 switch (access) {
                   case Access::kPublic:
                   case Access::kSignedIn:
                     break;
                   case Access::kPlatformRead:
                     if (!auth::IsPlatformViewer(platform, caller.who))
                       denied = "only platform admins and viewers may read this";
                     break;
                   case Access::kAdmin:
                     if (!auth::IsAdmin(platform, caller.who))
                       denied = "only platform admins may do this";
                     break;
                   case Access::kRunRead:
                   case Access::kRunWrite: {
                     auto run = store_->GetRun(req.matches.at(1));
                     if (!run.ok()) return http::ReplyError(res, run.status());
                     auth::Role need =
                         access == Access::kRunRead ? auth::Role::kViewer : auth::Role::kResearcher;
                     auth::Role have = caller.RoleIn(run->workspace);
                     if (have < need)
                       denied = fmt::format(
                           "{} is {} in workspace '{}'; this needs {}", Describe(caller.who),
                           have == auth::Role::kNone ? "not a member"
                                                     : std::string("a ") + auth::RoleName(have),
                           run->workspace, AccessName(access));
                     break;
                   }
                 }
                 if (!denied.empty())
                   Deny(req, res, caller.who, denied);
                 else
                   handler(req, res, caller);
                 // Every refusal is audited, whoever decided it: this gate, a handler, or policy
                 // resolution refusing a workspace.
                 if (res.status == 401 || res.status == 403)
                   Audit(req, caller.who, res.status,
                         res.status == 401 ? "unauthenticated" : "denied", ErrorMessage(res));
               });
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
