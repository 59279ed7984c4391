// The identity routes of the API (docs/security.md):
//   GET    /api/v1/whoami                          who the server thinks the caller is, and roles
//   POST   /api/v1/tokens                          a new API token (shown once)
//   GET    /api/v1/tokens                          tokens (admins: all; others: their own)
//   DELETE /api/v1/tokens/ID                       revokes one
//   POST   /api/v1/session, DELETE /api/v1/session the dashboard's sign-in cookie
//   GET    /api/v1/audit                           the audit trail (admins)
//   GET    /api/v1/workspaces/WS/secrets           secret keys of a workspace (never values)
//   PUT    /api/v1/workspaces/WS/secrets/KEY       sets one; DELETE removes it
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/strings.h"
#include "http/reply.h"
#include "server/api.h"
#include "spec/spec.h"

namespace tau::server {
namespace {

using nlohmann::json;

constexpr size_t kMaxSecretBytes = 64 * 1024;  // as a spec's literal env value

json TokenJson(const store::TokenRecord& t) {
  return {{"id", t.id},
          {"user", t.user},
          {"groups", t.groups},
          {"description", t.description},
          {"created_by", t.created_by},
          {"created", FormatRfc3339(t.created_ms)},
          {"expires", t.expires_ms ? json(FormatRfc3339(*t.expires_ms)) : json(nullptr)},
          {"revoked", t.revoked_ms ? json(FormatRfc3339(*t.revoked_ms)) : json(nullptr)}};
}

}  // namespace

void RegisterIdentityApi(SecureRouter* api, Controller* controller, store::Store* store) {
  api->Route("GET", "/api/v1/whoami", Access::kSignedIn,
             [](const http::HttpRequest&, http::HttpResponse& res, const CallerContext& caller) {
               json workspaces = json::array();
               for (const policy::Workspace& w : caller.platform->workspaces) {
                 auth::Role role = caller.RoleIn(w.name);
                 if (role != auth::Role::kNone)
                   workspaces.push_back({{"name", w.name}, {"role", auth::RoleName(role)}});
               }
               http::Reply(
                   res, 200,
                   {{"user", caller.who.user},
                    {"groups", caller.who.groups},
                    {"via", caller.who.via},
                    {"token_id", caller.who.token_id},
                    {"admin", caller.IsAdmin()},
                    {"platform_viewer", auth::IsPlatformViewer(*caller.platform, caller.who)},
                    {"workspaces", workspaces}});
             });

  api->Route(
      "POST", "/api/v1/tokens", Access::kSignedIn,
      [api, store, controller](const http::HttpRequest& req, http::HttpResponse& res,
                               const CallerContext& caller) {
        auto request = ParseTokenBody(req.body);
        if (!request.ok()) return http::ReplyError(res, request.status());
        if (request->user.empty()) request->user = caller.who.user;
        if (!caller.IsAdmin()) {
          // Anyone may have a token for themselves, with no more groups than they have now.
          if (request->user != caller.who.user)
            return api->Deny(req, res, caller.who,
                             fmt::format("only platform admins may create tokens for another "
                                         "user ('{}')",
                                         request->user));
          for (const std::string& g : request->groups)
            if (std::find(caller.who.groups.begin(), caller.who.groups.end(), g) ==
                caller.who.groups.end())
              return api->Deny(req, res, caller.who,
                               fmt::format("user '{}' is not in group '{}' and may not put it "
                                           "in a token",
                                           caller.who.user, g));
        }
        auto token = auth::NewToken();
        if (!token.ok()) return http::ReplyError(res, token.status());
        store::TokenRecord t;
        t.digest = auth::TokenDigest(*token);
        t.id = auth::TokenId(t.digest);
        t.user = request->user;
        t.groups = request->groups;
        t.description = request->description;
        t.created_by = caller.who.user;
        t.created_ms = NowMillis();
        if (request->expires_in_ms) t.expires_ms = t.created_ms + *request->expires_in_ms;
        // Live tokens are counted against the user they are for, whoever mints them.
        if (Status s = store->InsertToken(t, controller->MaxTokensPerUser(), t.created_ms);
            !s.ok()) {
          http::ReplyError(res, s);
          if (s.code() == StatusCode::kResourceExhausted) res.status = 429;  // too many, not large
          return;
        }
        api->Audit(req, caller.who, 201, "token.create",
                   fmt::format("token {} for user '{}'", t.id, t.user));
        json body = TokenJson(t);
        body["token"] = *token;  // the only time it is ever shown
        http::Reply(res, 201, body);
      });

  api->Route(
      "GET", "/api/v1/tokens", Access::kSignedIn,
      [store](const http::HttpRequest& req, http::HttpResponse& res, const CallerContext& caller) {
        std::string user = caller.IsAdmin()
                               ? (req.has_param("user") ? req.get_param_value("user") : "")
                               : caller.who.user;
        auto tokens = store->ListTokens(user);
        if (!tokens.ok()) return http::ReplyError(res, tokens.status());
        json list = json::array();
        for (const auto& t : *tokens) list.push_back(TokenJson(t));
        http::Reply(res, 200, {{"tokens", list}});
      });

  api->Route("DELETE", R"(/api/v1/tokens/([0-9a-f]{12}))", Access::kSignedIn,
             [api, store](const http::HttpRequest& req, http::HttpResponse& res,
                          const CallerContext& caller) {
               std::string id = req.matches[1];
               auto mine = store->ListTokens(caller.IsAdmin() ? "" : caller.who.user);
               if (!mine.ok()) return http::ReplyError(res, mine.status());
               bool found = std::any_of(mine->begin(), mine->end(),
                                        [&](const store::TokenRecord& t) { return t.id == id; });
               if (!found)
                 return http::ReplyError(res,
                                         NotFound(fmt::format("no token with id '{}' that you may "
                                                              "revoke",
                                                              id)));
               if (Status s = store->RevokeToken(id, NowMillis()); !s.ok())
                 return http::ReplyError(res, s);
               api->Audit(req, caller.who, 200, "token.revoke", "token " + id);
               http::Reply(res, 200, {{"revoked", id}});
             });

  // The dashboard signs in by handing its token to the server once; the browser then sends it as
  // an HttpOnly cookie (scripts cannot read it back; EventSource cannot send headers).
  api->Route(
      "POST", "/api/v1/session", Access::kPublic,
      [api](const http::HttpRequest& req, http::HttpResponse& res, const CallerContext& caller) {
        auto token = ParseSingleStringBody(req.body, "token");
        if (!token.ok() || token->empty())
          return http::ReplyError(res, InvalidArgument("request needs {\"token\": \"tau_...\"}"));
        http::HttpRequest probe = req;
        probe.headers["authorization"] = "Bearer " + *token;
        probe.headers.erase("cookie");
        auto who = api->Authenticate(probe, *caller.platform);
        if (!who.ok()) {
          api->Audit(req, auth::Identity{}, 401, "unauthenticated", who.status().message());
          return http::ReplyError(res, who.status());
        }
        res.headers_out.emplace_back(
            "Set-Cookie",
            fmt::format("tau_session={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=2592000",
                        *token));
        http::Reply(res, 200, {{"user", who->user}});
      });
  api->Route("DELETE", "/api/v1/session", Access::kPublic,
             [](const http::HttpRequest&, http::HttpResponse& res, const CallerContext&) {
               res.headers_out.emplace_back(
                   "Set-Cookie", "tau_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
               http::Reply(res, 200, {{"signed_out", true}});
             });

  api->Route("GET", "/api/v1/audit", Access::kAdmin,
             [store](const http::HttpRequest& req, http::HttpResponse& res, const CallerContext&) {
               int64_t limit = 100;
               if (req.has_param("limit"))
                 limit = std::clamp<int64_t>(
                     std::strtoll(req.get_param_value("limit").c_str(), nullptr, 10), 1, 10000);
               auto records = store->ListAudit(limit);
               if (!records.ok()) return http::ReplyError(res, records.status());
               json list = json::array();
               for (const auto& a : *records)
                 list.push_back({{"time", FormatRfc3339(a.ts_ms)},
                                 {"user", a.user},
                                 {"via", a.via},
                                 {"method", a.method},
                                 {"path", a.path},
                                 {"status", a.status},
                                 {"action", a.action},
                                 {"detail", a.detail}});
               http::Reply(res, 200, {{"audit", list}});
             });

  // Secrets: researchers of a workspace set them; nobody reads a value back through the API.
  auto check_workspace = [api](const http::HttpRequest& req, http::HttpResponse& res,
                               const CallerContext& caller, auth::Role need) {
    std::string ws = req.matches[1];
    if (caller.platform->FindWorkspace(ws) == nullptr) {
      http::ReplyError(res, NotFound(fmt::format("no workspace '{}'", Printable(ws))));
      return false;
    }
    if (caller.RoleIn(ws) < need) {
      api->Deny(req, res, caller.who,
                fmt::format("user '{}' is not a {} of workspace '{}'", caller.who.user,
                            auth::RoleName(need), ws));
      return false;
    }
    return true;
  };
  api->Route(
      "GET", R"(/api/v1/workspaces/([^/]+)/secrets)", Access::kSignedIn,
      [store, check_workspace](const http::HttpRequest& req, http::HttpResponse& res,
                               const CallerContext& caller) {
        if (!check_workspace(req, res, caller, auth::Role::kViewer)) return;
        auto secrets = store->ListSecrets(req.matches[1]);
        if (!secrets.ok()) return http::ReplyError(res, secrets.status());
        json list = json::array();
        for (const auto& s : *secrets)
          list.push_back({{"key", s.key},
                          {"size", s.size},
                          {"updated", FormatRfc3339(s.updated_ms)},
                          {"updated_by", s.updated_by}});
        http::Reply(res, 200, {{"workspace", std::string(req.matches[1])}, {"secrets", list}});
      });
  api->Route(
      "PUT", R"(/api/v1/workspaces/([^/]+)/secrets/([^/]+))", Access::kSignedIn,
      [api, store, check_workspace](const http::HttpRequest& req, http::HttpResponse& res,
                                    const CallerContext& caller) {
        if (!check_workspace(req, res, caller, auth::Role::kResearcher)) return;
        std::string key = req.matches[2];
        if (!spec::IsSecretKey(key))
          return http::ReplyError(
              res,
              InvalidArgument(fmt::format("'{}' is not a secret key (letters, digits, '.', '_' and "
                                          "'-')",
                                          Printable(key))));
        auto value = ParseSingleStringBody(req.body, "value");
        if (!value.ok()) return http::ReplyError(res, value.status());
        if (value->size() > kMaxSecretBytes)
          return http::ReplyError(
              res, ResourceExhausted(
                       fmt::format("a secret holds at most {} KiB", kMaxSecretBytes / 1024)));
        store::SecretInfo info{req.matches[1], key, static_cast<int64_t>(value->size()),
                               NowMillis(), caller.who.user};
        if (Status s = store->PutSecret(info, *value); !s.ok()) return http::ReplyError(res, s);
        api->Audit(req, caller.who, 200, "secret.set", info.workspace + "/" + key);
        http::Reply(res, 200, {{"workspace", info.workspace}, {"key", key}, {"size", info.size}});
      },
      // The value's 64 KiB as a JSON string, each byte escaped at worst.
      Body{6 * kMaxSecretBytes + 1024});
  api->Route("DELETE", R"(/api/v1/workspaces/([^/]+)/secrets/([^/]+))", Access::kSignedIn,
             [api, store, check_workspace](const http::HttpRequest& req, http::HttpResponse& res,
                                           const CallerContext& caller) {
               if (!check_workspace(req, res, caller, auth::Role::kResearcher)) return;
               if (Status s = store->DeleteSecret(req.matches[1], req.matches[2]); !s.ok())
                 return http::ReplyError(res, s);
               api->Audit(req, caller.who, 200, "secret.delete",
                          std::string(req.matches[1]) + "/" + std::string(req.matches[2]));
               http::Reply(res, 200, {{"deleted", std::string(req.matches[2])}});
             });
  (void)controller;
}

}  // namespace tau::server
