// `tau workflow status|cancel|retry-stage`: a workflow submitted with `tau run workflow.yaml`
// (docs/workflows.md), seen and acted on as a whole through the API.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <map>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/strings.h"

namespace tau::cli {

void PrintStages(const std::vector<api::Run>& runs) {
  std::vector<std::vector<std::string>> rows;
  for (const api::Run& r : runs) {
    std::string why = r.reason.empty() ? r.message : r.reason + ": " + r.message;
    if (r.pending) why = r.pending->reason;
    std::vector<std::string> after;
    if (r.workflow)
      for (const api::WorkflowUpstream& u : r.workflow->after)
        after.push_back(u.condition == "succeeded" ? u.stage : u.stage + " (" + u.condition + ")");
    rows.push_back({r.workflow ? r.workflow->stage : "", r.name, r.state,
                    after.empty() ? "-" : Join(after, ", "), why.empty() ? "-" : why});
  }
  PrintTable({"STAGE", "RUN", "STATE", "AFTER", "REASON"}, rows);
}

namespace {

// Workflow names are those of runs: lowercase letters, digits and '-'.
int NoSuchWorkflow(const std::string& name) {
  return Fail("no workflow is named '" + name + "' (its name is as `tau run` printed it)");
}

int CmdWorkflowStatus(const Global& g, const std::string& name, bool all, Format format) {
  if (!IsRunName(name)) return NoSuchWorkflow(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::RunQuery query;
  query.workflow = name;
  query.limit = 1000;
  query.oldest_first = true;
  auto list = client::TauApi(conn->get()).ListRuns(query);
  if (!list.ok()) return Fail(list.status().message());
  if (list->runs.empty()) return NoSuchWorkflow(name);
  // A stage run again (retry-stage) has several runs: the newest is the stage's now.
  std::vector<api::Run> shown;
  std::map<std::string, size_t> at;
  for (api::Run& r : list->runs) {
    const std::string stage = r.workflow ? r.workflow->stage : "";
    auto it = at.find(stage);
    if (all || it == at.end()) {
      at[stage] = shown.size();
      shown.push_back(std::move(r));
    } else {
      shown[it->second] = std::move(r);
    }
  }
  if (IsData(format)) {
    nlohmann::json runs = nlohmann::json::array();
    for (const api::Run& r : shown) runs.push_back(r.ToJson());
    return PrintData({{"workflow", name}, {"runs", std::move(runs)}}, format);
  }
  PrintStages(shown);
  return 0;
}

int CmdWorkflowCancel(const Global& g, const std::string& name) {
  if (!IsRunName(name)) return NoSuchWorkflow(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  std::string pending;
  auto cancelling = client::TauApi(conn->get()).CancelWorkflow(name, &pending);
  if (!cancelling.ok()) return Fail(cancelling.status().message());
  if (cancelling->empty()) std::printf("workflow %s has no run that has not ended\n", name.c_str());
  for (const std::string& run : *cancelling) std::printf("cancelling %s\n", run.c_str());
  if (!pending.empty())
    std::fprintf(stderr, "tau: warning: the cancel of workflow %s is %s\n", name.c_str(),
                 pending.c_str());
  return 0;
}

int CmdRetryStage(const Global& g, const std::string& name, const std::string& stage) {
  if (!IsRunName(name)) return NoSuchWorkflow(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto made = client::TauApi(conn->get()).RetryStage(name, stage);
  if (!made.ok()) return Fail(made.status().message());
  for (const api::Run& r : made->runs)
    std::printf("%s\t%s\n", r.workflow ? r.workflow->stage.c_str() : "", r.name.c_str());
  return 0;
}

}  // namespace

void RegisterWorkflowCommands(CLI::App* app, Context* ctx) {
  struct Args {
    std::string name, stage;
    bool all = false;
  };
  auto a = std::make_shared<Args>();
  const Global& g = ctx->g;
  auto* workflow = app->add_subcommand(
      "workflow", "A workflow's stages (tau run workflow.yaml submits one; docs/workflows.md)");
  workflow->require_subcommand(1);

  auto* status = workflow->add_subcommand(
      "status", "Each stage's run: its state, the stages it waits for, why it ended or waits");
  status->add_option("workflow", a->name, "The workflow's name, as tau run printed it")->required();
  status->add_flag("-a,--all", a->all, "Every run of each stage (a retried stage has several)");
  auto format = AddOutput(status, ctx);
  status->callback([=, &g] {
    if (auto f = format()) ctx->rc = CmdWorkflowStatus(g, a->name, a->all, *f);
  });

  auto* cancel = workflow->add_subcommand("cancel", "Cancel every run of the workflow not ended");
  cancel->add_option("workflow", a->name, "The workflow's name")->required();
  cancel->callback([=, &g] { ctx->rc = CmdWorkflowCancel(g, a->name); });

  auto* retry = workflow->add_subcommand(
      "retry-stage",
      "Run a failed or cancelled stage again, and the stages after it that never ran because of "
      "it; print the new runs");
  retry->add_option("workflow", a->name, "The workflow's name")->required();
  retry->add_option("stage", a->stage, "The stage to run again")->required();
  retry->callback([=, &g] { ctx->rc = CmdRetryStage(g, a->name, a->stage); });
}

}  // namespace tau::cli
