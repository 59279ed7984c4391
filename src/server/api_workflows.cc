// The workflow routes of the API (docs/api.md, "Workflows"). A workflow's runs are listed with
// GET /api/v1/runs?workflow=NAME; these act on the workflow as a whole:
//   POST /api/v1/workflows/NAME/cancel               cancels its runs that have not ended
//   POST /api/v1/workflows/NAME/stages/STAGE/retry   runs STAGE again (Controller::RetryStage)
// A workflow's runs are all of one workspace: acting on it needs the researcher role there.
#include <fmt/format.h>

#include "api/types.h"
#include "http/reply.h"
#include "server/api.h"

namespace tau::server {
namespace {

// The workflow's workspace, when the caller may write it; else the reply is made (404 when the
// caller sees none of its runs, 403 when they may see but not act) and nullopt returned.
std::optional<std::string> WritableWorkflow(SecureRouter* api, store::Store* store,
                                            const http::HttpRequest& req, http::HttpResponse& res,
                                            const CallerContext& caller,
                                            const std::string& workflow) {
  store::RunFilter filter;
  filter.workflow = workflow;
  filter.workspaces_in = caller.VisibleWorkspaces();
  filter.limit = 1;
  filter.summary = true;
  auto runs = store->ListRuns(filter);
  if (!runs.ok()) {
    http::ReplyError(res, runs.status());
    return std::nullopt;
  }
  if (runs->empty()) {
    http::ReplyError(res, NotFound(fmt::format("no workflow is named '{}'", workflow)));
    return std::nullopt;
  }
  const std::string& workspace = runs->front().workspace;
  if (caller.RoleIn(workspace) < auth::Role::kResearcher) {
    api->Deny(req, res, caller.who,
              fmt::format("user '{}' may not act on workflow '{}' of workspace '{}' (this needs "
                          "the researcher role there)",
                          caller.who.user, workflow, workspace));
    return std::nullopt;
  }
  return workspace;
}

}  // namespace

void RegisterWorkflowApi(SecureRouter* api, Controller* controller, store::Store* store) {
  api->Route("POST", R"(/api/v1/workflows/([a-z0-9-]+)/cancel)", Access::kSignedIn,
             [api, controller, store](const http::HttpRequest& req, http::HttpResponse& res,
                                      const CallerContext& caller) {
               const std::string workflow = req.matches[1];
               if (!WritableWorkflow(api, store, req, res, caller, workflow)) return;
               std::string pending;
               auto cancelling = controller->CancelWorkflow(workflow, &pending);
               if (!cancelling.ok()) return http::ReplyError(res, cancelling.status());
               nlohmann::json reply = {{"cancelling", *cancelling}};
               if (!pending.empty()) reply["pending"] = pending;
               http::Reply(res, 202, reply);
             });
  api->Route("POST", R"(/api/v1/workflows/([a-z0-9-]+)/stages/([a-z0-9-]+)/retry)",
             Access::kSignedIn,
             [api, controller, store](const http::HttpRequest& req, http::HttpResponse& res,
                                      const CallerContext& caller) {
               const std::string workflow = req.matches[1];
               if (!WritableWorkflow(api, store, req, res, caller, workflow)) return;
               auto made = controller->RetryStage(workflow, req.matches[2]);
               if (!made.ok()) return http::ReplyError(res, made.status());
               api::SubmittedBatch reply;
               for (const store::RunRecord& r : *made) reply.runs.push_back(RunOf(r, controller));
               http::Reply(res, 201, reply.ToJson());
             });
}

}  // namespace tau::server
