// Workflows on the controller's submission side: cancelling a workflow's runs, and retrying a
// stage with the stages after it that never ran. The gate that holds stages back is a pass
// (workflow_gate.h).
#include <fmt/format.h>

#include "common/strings.h"
#include "controller/controller.h"
#include "controller/workflow_gate.h"

namespace tau::server {

using store::Batch;
using store::RunRecord;
using store::RunState;

Result<std::vector<std::string>> Controller::CancelWorkflow(const std::string& workflow,
                                                            std::string* pending) {
  store::RunFilter filter;
  filter.workflow = workflow;
  filter.active_only = true;
  filter.summary = true;
  TAU_ASSIGN_OR_RETURN(std::vector<RunRecord> runs, store_->ListRuns(filter));
  std::vector<std::string> names;
  int64_t last = 0;
  for (const RunRecord& r : runs) {
    last = PostWrite(CancelRequest{r.name});
    names.push_back(r.name);
  }
  if (last > 0) WaitCommitted(last, pending);
  return names;
}

Result<std::vector<RunRecord>> Controller::RetryStage(const std::string& workflow,
                                                      const std::string& stage) {
  store::RunFilter filter;
  filter.workflow = workflow;
  filter.newest_first = false;
  TAU_ASSIGN_OR_RETURN(std::vector<RunRecord> runs, store_->ListRuns(filter));
  if (runs.empty()) return NotFound(fmt::format("no workflow is named '{}'", workflow));
  // Each stage's newest run, and the stages in the order they were first submitted.
  std::map<std::string, RunRecord> newest;
  std::vector<std::string> order;
  std::map<std::string, int> count;  // runs of each stage
  for (RunRecord& r : runs) {
    const std::string s = r.workflow.value("stage", "");
    if (!newest.count(s)) order.push_back(s);
    ++count[s];
    newest[s] = std::move(r);
  }
  auto found = newest.find(stage);
  if (found == newest.end())
    return NotFound(fmt::format("workflow '{}' has no stage '{}' (stages: {})", workflow, stage,
                                Join(order, ", ")));
  const RunRecord& failed = found->second;
  if (!store::IsTerminal(failed.state))
    return FailedPrecondition(fmt::format("stage '{}' (run {}) is still {}", stage, failed.name,
                                          store::RunStateName(failed.state)));
  if (failed.state == RunState::kSucceeded)
    return FailedPrecondition(fmt::format(
        "stage '{}' (run {}) succeeded; `tau rerun {}` runs it again outside the workflow", stage,
        failed.name, failed.name));
  // The stage, and every stage after it whose newest run never ran because of a stage retried
  // here, in submission order (the stages before a stage come before it).
  std::set<std::string> retried = {stage};
  for (const std::string& s : order) {
    const RunRecord& r = newest[s];
    if (retried.count(s) || r.reason != kUpstreamFailed) continue;
    for (const nlohmann::json& a : UpstreamsOf(r))
      if (retried.count(a.value("stage", ""))) {
        retried.insert(s);
        break;
      }
  }
  // Runs of a stage after the first are "<workflow>-<stage>-r<N>", N counting the stage's runs.
  std::vector<RunRecord> made;
  std::vector<std::vector<store::Event>> events;
  std::map<std::string, std::string> new_name;
  for (const std::string& s : order) {
    if (!retried.count(s)) continue;
    const RunRecord& from = newest[s];
    std::string warning;
    TAU_ASSIGN_OR_RETURN(RunRecord r, RecordFrom(from, &warning));
    r.name = fmt::format("{}-{}-r{}", workflow, s, count[s] + 1);
    new_name[s] = r.name;
    nlohmann::json after = nlohmann::json::array();
    for (const nlohmann::json& a : UpstreamsOf(from)) {
      const std::string up = a.value("stage", "");
      const auto renamed = new_name.find(up);
      after.push_back({{"stage", up},
                       {"run", renamed != new_name.end() ? renamed->second : newest[up].name},
                       {"condition", a.value("condition", "succeeded")}});
    }
    r.workflow = {{"name", workflow}, {"stage", s}, {"after", std::move(after)}};
    nlohmann::json data = {{"retry_of", from.name},
                           {"config_hash", r.config_hash},
                           {"snapshot_digest", r.snapshot_digest},
                           {"workflow", r.workflow}};
    if (!warning.empty()) data["warning"] = warning;
    events.push_back(std::vector<store::Event>{
        {0, r.name, r.created_ms, "Submitted",
         fmt::format("stage '{}' of workflow {} again (retry of {})", s, workflow, from.name),
         std::move(data), "", ""},
        {0, r.name, r.created_ms, "Queued", "queued in " + r.queue, nlohmann::json::object(), "",
         ""}});
    made.push_back(std::move(r));
  }
  TAU_RETURN_IF_ERROR(store_->InsertRuns(&made, std::move(events)));
  for (const RunRecord& r : made) {
    Count("tau_runs_submitted_total", {{"workspace", r.workspace}, {"queue", r.queue}});
    PostWrite(NewRun{r.name, std::nullopt});
  }
  return made;
}

}  // namespace tau::server
