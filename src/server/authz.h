// Authentication and authorization at the API's edge. Every route is registered through a
// SecureRouter with the access it needs, so no route can be added without a decision; the
// decisions themselves are auth's (src/auth/auth.h), made against the platform in force.
//
// Callers prove who they are with the Unix socket's peer credentials (SO_PEERCRED) or an API token
// (`Authorization: Bearer TOKEN`, or the dashboard's `tau_session` cookie); a token wins over the
// socket's identity. A TCP caller without a token is anonymous and may reach only public routes.
// An unknown, expired or revoked token is 401; a known caller without the role is 403; both are
// audited. A streamed response counts against its caller's stream budget (429 past it).
//
// Refusals (401, 403, 429, 503) are each counted (tau_http_refused_total), but only sampled into
// the audit trail and the log: a client that sends refused requests in a loop must not fill the
// store. Other audited decisions are written one by one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "auth/auth.h"
#include "common/metrics.h"
#include "controller/controller.h"
#include "http/http.h"
#include "store/store.h"

namespace tau::server {

enum class Access {
  kPublic,        // anyone, also anonymous: health probes, the dashboard's static files
  kSignedIn,      // any known caller; the handler may narrow what it shows
  kPlatformRead,  // admins and platform viewers: metrics, the audit trail's readers
  kAdmin,         // platform admins: policy, health checks, tokens of others
  kRunRead,       // viewer or more of the workspace of the run named by the route's first group
  kRunWrite,      // researcher or more of that workspace
};
const char* AccessName(Access access);

// What a handler knows about its caller.
struct CallerContext {
  auth::Identity who;
  std::shared_ptr<const policy::Platform> platform;

  bool IsAdmin() const { return auth::IsAdmin(*platform, who); }
  auth::Role RoleIn(const std::string& workspace) const {
    return auth::WorkspaceRole(*platform, who, workspace);
  }
  // The workspaces whose runs the caller may read; nullopt when they may read every one.
  std::optional<std::vector<std::string>> VisibleWorkspaces() const;
};

using SecureHandler =
    std::function<void(const http::HttpRequest&, http::HttpResponse&, const CallerContext& caller)>;

// The body a route takes. The caller is authenticated and authorized from the request's head,
// before a byte of its body is read: an anonymous caller sends a body only to a public route, and
// only a caller who may submit somewhere (a researcher of a workspace, or an admin) sends more
// than http::kDefaultMaxBodyBytes to a submission route.
struct Body {
  size_t max_bytes = http::kDefaultMaxBodyBytes;
  bool submission = false;  // code uploads and submissions
};
// The large bodies: code blobs, and submissions that may carry their code inline (base64: 64 MiB
// of code is 86 MiB of it) or many runs.
constexpr size_t kMaxBlobRequestBytes = 64u << 20;
constexpr size_t kMaxSubmissionBytes = 128u << 20;

// How refusals reach the audit trail: per (caller, status, method, route) and window, the first
// `rows_per_key` are written (and no more than 6 times that per caller, 60 times in all); the rest
// are summed into one row ("refusals.suppressed") once the window is over, written with the next
// request. The caller is the identity, or the address (uid) of an anonymous one.
struct RefusalAuditOptions {
  int rows_per_key = 10;
  int64_t window_ms = 60'000;
};

class RefusalLog;

class SecureRouter {
 public:
  SecureRouter(http::HttpServer* http, Controller* controller, store::Store* store,
               Metrics* metrics = nullptr, RefusalAuditOptions refusals = {});
  ~SecureRouter();

  void Route(const std::string& method, const std::string& pattern, Access access,
             SecureHandler handler, Body body = {});
  // For handlers that do not need to know the caller.
  void Route(const std::string& method, const std::string& pattern, Access access,
             http::HttpHandler handler, Body body = {});

  // Who the caller is, under the platform in force (its users' groups and tokens); Unauthenticated
  // for a bad token.
  Result<auth::Identity> Authenticate(const http::HttpRequest& req,
                                      const policy::Platform& platform) const;
  // Records a decision in the audit trail (and the server's log for refusals, which are sampled).
  void Audit(const http::HttpRequest& req, const auth::Identity& who, int status,
             const std::string& action, const std::string& detail) const;
  // Answers 403 with `why` and audits it.
  void Deny(const http::HttpRequest& req, http::HttpResponse& res, const auth::Identity& who,
            const std::string& why) const;

  http::HttpServer* http() const { return http_; }

 private:
  // Authenticates and authorizes a request from its head: the caller is kept in req.admitted for
  // the handler; false with the refusal in `res` (audited).
  bool Admit(http::HttpRequest& req, http::HttpResponse& res, Access access, Body body) const;
  // A streamed answer holds a place of its caller's stream budget for its life, or becomes a 429.
  void BudgetStream(const http::HttpRequest& req, http::HttpResponse& res,
                    const auth::Identity& who) const;

  http::HttpServer* http_;
  Controller* controller_;
  store::Store* store_;
  Metrics* metrics_;
  std::unique_ptr<RefusalLog> refusals_;
};

// The bearer token of a request (header or cookie); "" when none.
std::string BearerToken(const http::HttpRequest& req);

// Removes what the caller may not see from a queue view: runs of other workspaces keep their
// place in line but lose their names.
nlohmann::json FilterQueues(nlohmann::json queues, const CallerContext& caller);

}  // namespace tau::server
