// Workflows on the controller: a stage's run waits, out of its queue, until the runs of the stages
// it names in `after` have ended; then it is released (its upstream runs' checkpoints and outputs
// resolved once and recorded) or, when one did not end as its condition needs, stopped as
// UpstreamFailed, which stops the stages after it in turn. Everything here is derived from the
// runs' records, so a restarted server carries on where the last one stopped.
#include <fmt/format.h>

#include "common/strings.h"
#include "controller/controller.h"
#include "recovery/recovery.h"

namespace tau::server {

using store::Batch;
using store::RunRecord;
using store::RunState;

namespace {

constexpr const char* kUpstreamFailed = "UpstreamFailed";
constexpr const char* kUpstreamReady = "UpstreamReady";

const nlohmann::json& AfterOf(const RunRecord& r) {
  static const nlohmann::json kNone = nlohmann::json::array();
  if (!r.workflow.is_object()) return kNone;
  auto it = r.workflow.find("after");
  return it != r.workflow.end() && it->is_array() ? *it : kNone;
}

nlohmann::json UpstreamJson(const UpstreamRun& u) {
  return {{"stage", u.stage},
          {"run", u.run},
          {"state", u.state},
          {"checkpoint", u.checkpoint},
          {"checkpoint_dir", u.checkpoint_dir},
          {"output_dir", u.output_dir}};
}

UpstreamRun UpstreamFromJson(const nlohmann::json& j) {
  UpstreamRun u;
  u.stage = j.value("stage", "");
  u.run = j.value("run", "");
  u.state = j.value("state", "");
  u.checkpoint = j.value("checkpoint", "");
  u.checkpoint_dir = j.value("checkpoint_dir", "");
  u.output_dir = j.value("output_dir", "");
  return u;
}

}  // namespace

void Controller::TrackUpstreams(ActiveRun& run) {
  const nlohmann::json& after = AfterOf(run.record);
  if (after.empty() || run.upstreams) return;
  for (const nlohmann::json& a : after) dependents_.emplace(a.value("run", ""), run.record.name);
  deps_check_.insert(run.record.name);
}

void Controller::RestoreUpstreams(ActiveRun& run) {
  if (AfterOf(run.record).empty()) return;
  auto events = store_->ListEvents(run.record.name);
  if (!events.ok()) return;  // resolved again from the upstream runs' records
  for (auto it = events->rbegin(); it != events->rend(); ++it) {
    if (it->type != kUpstreamReady) continue;
    std::vector<UpstreamRun> ups;
    for (const nlohmann::json& u : it->data.value("upstreams", nlohmann::json::array()))
      ups.push_back(UpstreamFromJson(u));
    run.upstreams = std::move(ups);
    return;
  }
}

void Controller::SettleDependencies(Batch* batch) {
  // A run stopped here stops those after it (Finish adds them), in this same pass.
  while (!deps_check_.empty()) {
    const std::string name = *deps_check_.begin();
    deps_check_.erase(deps_check_.begin());
    auto it = active_.find(name);
    if (it == active_.end()) continue;
    ActiveRun& run = it->second;
    RunRecord& r = run.record;
    if (store::IsTerminal(r.state) || !WaitsForUpstream(run) || r.cancel_requested) continue;
    std::vector<UpstreamRun> ups;
    std::string broken;
    bool waiting = false;
    for (const nlohmann::json& a : AfterOf(r)) {
      UpstreamRun u;
      u.stage = a.value("stage", "");
      u.run = a.value("run", "");
      const std::string condition = a.value("condition", "succeeded");
      std::optional<RunRecord> up;
      if (auto live = active_.find(u.run); live != active_.end()) {
        if (!store::IsTerminal(live->second.record.state)) {
          waiting = true;
          break;
        }
        up = live->second.record;
      } else if (auto stored = store_->GetRun(u.run); stored.ok()) {
        up = std::move(*stored);
      } else {
        broken =
            fmt::format("stage '{}' has no run {} ({})", u.stage, u.run, stored.status().message());
        break;
      }
      u.state = store::RunStateName(up->state);
      if (condition == "succeeded" && up->state != RunState::kSucceeded) {
        broken = fmt::format(
            "stage '{}' (run {}) ended {}{}{}; this stage runs only after it "
            "succeeds",
            u.stage, u.run, u.state, up->reason.empty() ? "" : " (" + up->reason,
            up->reason.empty() ? "" : ")");
        break;
      }
      u.checkpoint_dir = StorageDir(*up, "checkpoint");
      u.output_dir = StorageDir(*up, "output");
      u.checkpoint = recovery::NewestCompleteCheckpoint(u.checkpoint_dir);
      ups.push_back(std::move(u));
    }
    if (waiting) continue;  // checked again when the one it waits for ends
    if (!broken.empty()) {
      if (r.state == RunState::kQueued) {
        Finish(run, RunState::kCancelled, kUpstreamFailed,
               broken + "; `tau workflow retry-stage` runs it again", batch);
      }
      continue;
    }
    nlohmann::json data = {{"upstreams", nlohmann::json::array()}};
    std::vector<std::string> said;
    for (const UpstreamRun& u : ups) {
      data["upstreams"].push_back(UpstreamJson(u));
      said.push_back(
          fmt::format("{} ({}, {})", u.stage, u.run,
                      u.checkpoint.empty() ? "no checkpoint" : "checkpoint " + u.checkpoint));
    }
    run.upstreams = std::move(ups);
    run.queued_since_ms = Now();
    batch->events.push_back({0, name, Now(), kUpstreamReady,
                             "the stages it waits for have ended: " + Join(said, "; "),
                             std::move(data), "", ""});
    sync_changed_.insert(name);
  }
}

nlohmann::json Controller::UpstreamPending(const ActiveRun& run) {
  std::vector<std::string> waiting;
  for (const nlohmann::json& a : AfterOf(run.record)) {
    const std::string up = a.value("run", "");
    auto it = active_.find(up);
    if (it == active_.end()) continue;
    waiting.push_back(fmt::format("stage '{}' (run {}, {})", a.value("stage", ""), up,
                                  store::RunStateName(it->second.record.state)));
  }
  return UpstreamPendingEntry(run.record.queue, waiting);
}

nlohmann::json Controller::UpstreamPendingEntry(const std::string& queue,
                                                const std::vector<std::string>& waiting) {
  return PendingEntry(
      0, queue, "WaitingForUpstream",
      "waits for " + (waiting.empty() ? std::string("the stages before it") : Join(waiting, ", ")) +
          " to end; it enters its queue then",
      "");
}

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
    for (const nlohmann::json& a : AfterOf(r))
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
    for (const nlohmann::json& a : AfterOf(from)) {
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
