// The REST API (v1) over the controller and the store. Every answer is JSON; errors are
// {"error": {"code": "...", "message": "..."}} with a matching HTTP status.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/types.h"
#include "common/status.h"
#include "controller/controller.h"
#include "health/health.h"
#include "http/http.h"
#include "server/authz.h"
#include "spec/spec.h"
#include "store/store.h"

namespace tau::server {

class ServiceManager;
// Every route of the API, one Register...Api per group, through the router returned: the caller
// keeps it for as long as `http` serves (the routes' closures hold it).
std::unique_ptr<SecureRouter> RegisterApi(http::HttpServer* http, Controller* controller,
                                          store::Store* store, health::GpuMonitor* monitor,
                                          Metrics* metrics, RefusalAuditOptions refusals = {},
                                          ServiceManager* services = nullptr);
// The service routes and the services' endpoint (api_services.cc).
void RegisterServiceApi(SecureRouter* api, ServiceManager* services);
// The evidence routes (api_evidence.cc): a run's record, its bundle, its metrics.
void RegisterEvidenceApi(SecureRouter* api, Controller* controller, store::Store* store);
// The artifact routes (api_artifacts.cc): a run's checkpoints and outputs, listed and fetched.
void RegisterArtifactsApi(SecureRouter* api, Controller* controller, store::Store* store);
// The workflow routes (api_workflows.cc): a workflow cancelled, a stage run again.
void RegisterWorkflowApi(SecureRouter* api, Controller* controller, store::Store* store);
// A run as the API shows it. `just_inserted`: a run this request made, which no pass has seen yet:
// its pending entry is the placeholder Submit set, without a wait for the loop's views (a
// submission in a busy loop waited for a pass every 200 ms; a batch's thousands of runs are not
// looked up one by one).
api::Run RunOf(const store::RunRecord& r, Controller* controller, bool just_inserted = false);
// A query parameter of a route: an integer in min..max, `fallback` when it is absent;
// InvalidArgument names it and the range.
Result<int64_t> IntParam(const http::HttpRequest& req, const char* name, int64_t fallback,
                         int64_t min, int64_t max);
// Identity routes (api_identity.cc): whoami, API tokens, the dashboard's session cookie, the audit
// trail, workspace secrets.
void RegisterIdentityApi(SecureRouter* api, Controller* controller, store::Store* store);

// GET /metrics: the server's counters and histograms, runs by state and workspace, queue usage
// against quota (names modelled on Kueue's), and the GPU lines (dcgm-exporter names).
std::string RenderAllMetrics(Controller* controller, store::Store* store,
                             health::GpuMonitor* monitor, Metrics* metrics);

// The JSON request bodies, decoded apart from the routes (api_body.cc) so that tests and the fuzz
// harness reach them without a server. A body of the wrong shape is InvalidArgument; they never
// throw.

// A request body as JSON, within bounds: at most kMaxJsonElements values (ResourceExhausted, 413,
// past it) nested at most kMaxJsonDepth deep (InvalidArgument): a body of tiny elements would take
// many times its size as a DOM. Invalid JSON is a discarded value, which each caller words.
inline constexpr size_t kMaxJsonElements = 500'000;
inline constexpr int kMaxJsonDepth = 128;
Result<nlohmann::json> ParseJsonBody(std::string_view body);

// POST /api/v1/runs: {"spec": {"yaml", "file"?, "set"?: ["PATH=VALUE", ...]}, "code"?: {"files":
// [{"path", "data" (base64), "mode"?}] | "manifest": [{"path", "size", "sha256", "mode"?}],
// "dir"?}}: the code inline, or a manifest of blobs uploaded before. The spec, the paths and the
// sizes are checked later, by the controller.
Result<SubmitRequest> ParseSubmitBody(std::string_view body);

// POST /api/v1/runs/batch: {"codes"?: [code objects as above], "runs": [{"spec": {"yaml",
// "file"?}, "code"?: an index into "codes" | a code object, "array_index"?}], "array"?: {"first",
// "last", "step"?}}. Unknown members are refused; so is a batch over kMaxBatchRuns runs. The
// specs, the code and the array's indices are checked later, by the controller.
Result<BatchRequest> ParseBatchBody(std::string_view body);

// POST /api/v1/code/missing: {"files": [{"path", "size", "sha256", "mode"?}]}, a manifest.
Result<std::vector<CodeManifestEntry>> ParseManifestBody(std::string_view body);

// POST /api/v1/validate: {"yaml", "file"?}.
struct ValidateBody {
  std::string yaml;
  std::string file = "tau.yaml";
};
Result<ValidateBody> ParseValidateBody(std::string_view body);

// POST /api/v1/resolve: {"yaml", "file"?, "set"?: ["PATH=VALUE", ...]} (tau plan and tau explain
// --set), the overrides checked as the CLI checks them.
struct ResolveBody {
  ValidateBody spec;
  std::vector<spec::Override> set;
};
Result<ResolveBody> ParseResolveBody(std::string_view body);

// POST /api/v1/tokens: {"user"?, "groups"?: [...], "description"?, "expires_in"?: "90d"}; an
// empty body is {}. User and group names and the lifetime (at most ten years) are checked here.
struct TokenBody {
  std::string user;
  std::vector<std::string> groups;
  std::string description;
  std::optional<int64_t> expires_in_ms;
};
Result<TokenBody> ParseTokenBody(std::string_view body);

// A body of one required string member: POST /api/v1/session {"token"}, PUT .../secrets/KEY
// {"value"}. InvalidArgument names the expected shape.
Result<std::string> ParseSingleStringBody(std::string_view body, const char* member);

// POST /api/v1/runs/NAME/rerun: {"set"?: ["PATH=VALUE", ...]} (tau rerun --set); an empty body is
// {}.
struct RerunBody {
  std::vector<spec::Override> overrides;
};
Result<RerunBody> ParseRerunBody(std::string_view body);

// POST /api/v1/runs/NAME/resume: {"from"?, "force"?}; an empty body is {}.
struct ResumeBody {
  std::string from;
  bool force = false;
};
Result<ResumeBody> ParseResumeBody(std::string_view body);

}  // namespace tau::server
