// The service routes of the API (docs/api.md, "Services") and the services' endpoint:
//   POST   /api/v1/services              deploy (a submission's body with "service": {...})
//   GET    /api/v1/services              the services the caller may see
//   GET    /api/v1/services/NAME         one, with its replicas and history
//   PUT    /api/v1/services/NAME         update: a new revision, rolled one replica at a time
//   POST   /api/v1/services/NAME/scale   {"replicas": N}
//   POST   /api/v1/services/NAME/rollback {"to"?: REVISION}: the previous (or that) revision
//   DELETE /api/v1/services/NAME         drain and stop its replicas, then forget it
//   GET    /api/v1/services/NAME/logs    ?replica=POD&offset=N: a replica pod's kept log
//                                        (Kubernetes; a local replica is a run: its run's logs)
//   ANY    /serve/NAME/PATH              a request for a ready replica of NAME
// Reading a service (and calling it) needs the viewer role in its workspace; changing it, the
// researcher role; deploying, membership as for a run (resolution checks it).
#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <set>

#include "common/strings.h"
#include "http/reply.h"
#include "runtime/runtime.h"
#include "server/api.h"
#include "server/services.h"

namespace tau::server {
namespace {

// Who may connect to a local replica's port besides tau: its run's user alone, when the server
// guards the ports it hands out (runtime::PortGuard), else anyone on this machine, and why.
nlohmann::json ReplicaIsolation() {
  const std::string guard = runtime::PortGuard::LastOutcome();
  if (guard == "on") return {{"ports", "owner-only"}};
  return {{"ports", "open"},
          {"why", guard.empty() ? std::string("no replica port has been guarded yet") : guard}};
}

using nlohmann::json;

constexpr int64_t kForwardTimeoutMs = 60'000;
// A request to a service's model (a prompt, an image) is forwarded whole.
constexpr size_t kMaxServeRequestBytes = 16u << 20;

// A method whose request may be sent twice without harm (RFC 9110, 9.2.2).
bool Idempotent(const std::string& method) {
  return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE" ||
         method == "OPTIONS";
}

std::string PercentEncode(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The path and query a replica is sent: the part after /serve/NAME, its query rebuilt.
std::string TargetOf(const http::HttpRequest& req, const std::string& rest) {
  std::string target;
  for (const std::string& part : Split(rest.empty() ? "/" : rest, '/')) {
    if (!target.empty() || !part.empty()) target += "/" + PercentEncode(part);
  }
  if (target.empty() || (!rest.empty() && rest.back() == '/')) target += "/";
  std::string query;
  for (const auto& [k, v] : req.params)
    query += (query.empty() ? "?" : "&") + PercentEncode(k) + "=" + PercentEncode(v);
  return target + query;
}

Result<DeployRequest> ParseDeployBody(const std::string& body) {
  TAU_ASSIGN_OR_RETURN(json j, ParseJsonBody(body));
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  DeployRequest out;
  if (j.contains("service")) {
    const json& s = j["service"];
    if (!s.is_object()) return InvalidArgument("service must be an object: {\"name\"?, \"from\"?}");
    for (const auto& [key, value] : s.items()) {
      if (key != "name" && key != "from")
        return InvalidArgument(fmt::format("service: unknown member '{}' (name, from)", key));
      if (!value.is_string())
        return InvalidArgument(fmt::format("service.{} must be a string", key));
    }
    out.name = s.value("name", "");
    out.from_run = s.value("from", "");
  }
  TAU_ASSIGN_OR_RETURN(out.submit, ParseSubmitBody(body));
  return out;
}

void ReplySubmitError(http::HttpResponse& res, const Status& status, const SubmitError& error) {
  json diags = json::array();
  for (const auto& d : error.diagnostics) diags.push_back(d.ToString());
  http::ReplyError(res, status, {{"diagnostics", diags}});
}

}  // namespace

void RegisterServiceApi(SecureRouter* api, ServiceManager* services) {
  // The service, when the caller has `role` in its workspace; else the reply is made (404 when
  // they may not see it, 403 when they may see but not act) and nullopt returned.
  auto allowed = [api, services](const http::HttpRequest& req, http::HttpResponse& res,
                                 const CallerContext& caller, const std::string& name,
                                 auth::Role role) -> std::optional<api::Service> {
    auto s = services->Get(name);
    if (!s.ok() || caller.RoleIn(s->workspace) < auth::Role::kViewer) {
      http::ReplyError(res, NotFound(fmt::format("no service is named '{}'", name)));
      return std::nullopt;
    }
    if (caller.RoleIn(s->workspace) < role) {
      api->Deny(req, res, caller.who,
                fmt::format("user '{}' may not change service '{}' of workspace '{}' (this needs "
                            "the researcher role there)",
                            caller.who.user, name, s->workspace));
      return std::nullopt;
    }
    return std::move(*s);
  };

  api->Route(
      "POST", "/api/v1/services", Access::kSignedIn,
      [services](const http::HttpRequest& req, http::HttpResponse& res,
                 const CallerContext& caller) {
        auto body = ParseDeployBody(req.body);
        if (!body.ok()) return http::ReplyError(res, body.status());
        body->submit.caller = caller.who.AsCaller();
        body->submit.token_user = caller.who.via == "token";
        body->submit.readable_workspaces = caller.VisibleWorkspaces();
        SubmitError error;
        auto made = services->Deploy(std::move(*body), &error);
        if (!made.ok()) return ReplySubmitError(res, made.status(), error);
        http::Reply(res, 201, made->ToJson());
      },
      Body{kMaxSubmissionBytes, /*submission=*/true});
  api->Route(
      "GET", "/api/v1/services", Access::kSignedIn,
      [services](const http::HttpRequest&, http::HttpResponse& res, const CallerContext& caller) {
        api::ServiceList list;
        list.services = services->List(caller.VisibleWorkspaces());
        http::Reply(res, 200, list.ToJson());
      });
  api->Route("GET", R"(/api/v1/services/([a-z0-9-]+))", Access::kSignedIn,
             [allowed](const http::HttpRequest& req, http::HttpResponse& res,
                       const CallerContext& caller) {
               auto s = allowed(req, res, caller, req.matches[1], auth::Role::kViewer);
               if (!s) return;
               if (!s->extra.contains("cluster")) s->extra["isolation"] = ReplicaIsolation();
               http::Reply(res, 200, s->ToJson());
             });
  api->Route(
      "PUT", R"(/api/v1/services/([a-z0-9-]+))", Access::kSignedIn,
      [allowed, services](const http::HttpRequest& req, http::HttpResponse& res,
                          const CallerContext& caller) {
        if (!allowed(req, res, caller, req.matches[1], auth::Role::kResearcher)) return;
        auto body = ParseDeployBody(req.body);
        if (!body.ok()) return http::ReplyError(res, body.status());
        if (!body->name.empty() && body->name != req.matches[1])
          return http::ReplyError(
              res, InvalidArgument(fmt::format("service.name '{}' is not the service '{}'",
                                               body->name, req.matches[1])));
        body->name = req.matches[1];
        body->submit.caller = caller.who.AsCaller();
        body->submit.token_user = caller.who.via == "token";
        SubmitError error;
        auto made = services->Update(std::move(*body), &error);
        if (!made.ok()) return ReplySubmitError(res, made.status(), error);
        http::Reply(res, 200, made->ToJson());
      },
      Body{kMaxSubmissionBytes, /*submission=*/true});
  api->Route("POST", R"(/api/v1/services/([a-z0-9-]+)/scale)", Access::kSignedIn,
             [allowed, services](const http::HttpRequest& req, http::HttpResponse& res,
                                 const CallerContext& caller) {
               if (!allowed(req, res, caller, req.matches[1], auth::Role::kResearcher)) return;
               json body = json::parse(req.body, nullptr, false);
               if (!body.is_object() || !body.contains("replicas") ||
                   !body["replicas"].is_number_integer())
                 return http::ReplyError(
                     res, InvalidArgument("the body must be {\"replicas\": N}, N from 0 to 64"));
               auto made = services->Scale(req.matches[1], body["replicas"].get<int64_t>());
               if (!made.ok()) return http::ReplyError(res, made.status());
               http::Reply(res, 200, made->ToJson());
             });
  api->Route(
      "POST", R"(/api/v1/services/([a-z0-9-]+)/rollback)", Access::kSignedIn,
      [allowed, services](const http::HttpRequest& req, http::HttpResponse& res,
                          const CallerContext& caller) {
        if (!allowed(req, res, caller, req.matches[1], auth::Role::kResearcher)) return;
        json body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
        const char* usage = "the body must be {} (the previous revision) or {\"to\": REVISION}";
        if (!body.is_object()) return http::ReplyError(res, InvalidArgument(usage));
        for (const auto& item : body.items())
          if (item.key() != "to")
            return http::ReplyError(
                res, InvalidArgument(fmt::format("unknown member '{}': {}", item.key(), usage)));
        int64_t to = 0;
        if (body.contains("to")) {
          if (!body["to"].is_number_integer() || body["to"].get<int64_t>() < 1)
            return http::ReplyError(
                res, InvalidArgument("to: a revision is a number from 1 (tau serve status "
                                     "NAME -o json lists the revisions kept)"));
          to = body["to"].get<int64_t>();
        }
        auto made = services->Rollback(req.matches[1], to);
        if (!made.ok()) return http::ReplyError(res, made.status());
        http::Reply(res, 200, made->ToJson());
      });
  api->Route("DELETE", R"(/api/v1/services/([a-z0-9-]+))", Access::kSignedIn,
             [allowed, services](const http::HttpRequest& req, http::HttpResponse& res,
                                 const CallerContext& caller) {
               if (!allowed(req, res, caller, req.matches[1], auth::Role::kResearcher)) return;
               auto made = services->Delete(req.matches[1]);
               if (!made.ok()) return http::ReplyError(res, made.status());
               http::Reply(res, 202, made->ToJson());
             });

  api->Route("GET", R"(/api/v1/services/([a-z0-9-]+)/logs)", Access::kSignedIn,
             [allowed, services](const http::HttpRequest& req, http::HttpResponse& res,
                                 const CallerContext& caller) {
               if (!allowed(req, res, caller, req.matches[1], auth::Role::kViewer)) return;
               auto replica = req.params.find("replica");
               if (replica == req.params.end() || replica->second.empty())
                 return http::ReplyError(res, InvalidArgument("give ?replica=POD"));
               auto offset = IntParam(req, "offset", 0, 0, INT64_MAX);
               if (!offset.ok()) return http::ReplyError(res, offset.status());
               constexpr int64_t kMaxChunk = 4 << 20;
               auto part =
                   services->ReplicaLog(req.matches[1], replica->second, *offset, kMaxChunk);
               if (!part.ok()) return http::ReplyError(res, part.status());
               res.status = 200;
               res.content_type = "text/plain; charset=utf-8";
               res.headers_out.emplace_back("X-Log-Size", std::to_string(part->size));
               res.body = std::move(part->data);
             });

  // The endpoint: each request goes to a ready replica (round robin); one that cannot be reached
  // is taken out of rotation and the request sent once to another: any request whose connection
  // was refused (it never reached the first), an idempotent one also when the answer was lost.
  auto forward = [services](const http::HttpRequest& req, http::HttpResponse& res,
                            const CallerContext& caller) {
    const auto started = std::chrono::steady_clock::now();
    const std::string name = req.matches[1];
    const std::string target = TargetOf(req, req.matches.size() > 2 ? req.matches[2] : "");
    std::set<std::string> tried;
    ForwardResult result;
    bool retried = false;
    for (int round = 0; round < 2; ++round) {
      auto pick = services->Acquire(name, tried);
      if (!pick || caller.RoleIn(pick->workspace) < auth::Role::kViewer) {
        if (pick && pick->lease) services->Done(*pick->lease, true);
        return http::ReplyError(res, NotFound(fmt::format("no service is named '{}'", name)));
      }
      if (!pick->cluster_endpoint.empty())
        return http::ReplyError(
            res, FailedPrecondition(fmt::format(
                     "service '{}' runs on the Kubernetes cluster, and tau's endpoint does not "
                     "reach into it: call it in the cluster at {}",
                     name, pick->cluster_endpoint)));
      if (!pick->lease) break;
      const ServiceManager::Lease& lease = *pick->lease;
      tried.insert(lease.replica);
      result =
          ForwardRequest(lease.port, req.method, target, req.headers, req.body, kForwardTimeoutMs);
      services->Done(lease, result.answered);
      if (result.answered) break;
      const bool may_retry = !result.connected || Idempotent(req.method);
      if (!may_retry) break;
      retried = round == 0;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!result.answered) {
      services->CountRequest(name, 0, retried, seconds);
      if (tried.empty())
        return http::ReplyError(
            res, Unavailable(fmt::format("service '{}' has no ready replica; `tau serve status {}` "
                                         "says why",
                                         name, name)));
      return http::Reply(res, 502,
                         {{"error",
                           {{"code", "BadGateway"},
                            {"message", fmt::format("service '{}': no replica answered ({})", name,
                                                    result.error)}}}});
    }
    services->CountRequest(name, result.status, retried, seconds);
    res.status = result.status;
    res.content_type.clear();
    for (auto& [k, v] : result.headers) {
      if (k == "content-type")
        res.content_type = v;
      else
        res.headers_out.emplace_back(k, v);
    }
    res.body = std::move(result.body);
  };
  for (const char* method : {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}) {
    api->Route(method, R"(/serve/([a-z0-9-]+))", Access::kSignedIn, forward,
               Body{kMaxServeRequestBytes});
    api->Route(method, R"(/serve/([a-z0-9-]+)(/.*))", Access::kSignedIn, forward,
               Body{kMaxServeRequestBytes});
  }
}

}  // namespace tau::server
