#include "controller/workflow_gate.h"

#include <optional>
#include <utility>

#include <fmt/format.h>

#include "backend/backend.h"
#include "common/strings.h"
#include "recovery/recovery.h"

namespace tau::server {

using store::Batch;
using store::RunRecord;
using store::RunState;

namespace {

constexpr const char* kUpstreamReady = "UpstreamReady";

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

const nlohmann::json& UpstreamsOf(const RunRecord& r) {
  static const nlohmann::json kNone = nlohmann::json::array();
  if (!r.workflow.is_object()) return kNone;
  auto it = r.workflow.find("after");
  return it != r.workflow.end() && it->is_array() ? *it : kNone;
}

nlohmann::json UpstreamPendingEntry(const std::string& queue,
                                    const std::vector<std::string>& waiting) {
  return PendingEntry(
      0, queue, "WaitingForUpstream",
      "waits for " + (waiting.empty() ? std::string("the stages before it") : Join(waiting, ", ")) +
          " to end; it enters its queue then",
      "");
}

void WorkflowGate::RunAdded(ActiveRun& run, bool recovered) {
  const nlohmann::json& after = UpstreamsOf(run.record);
  if (after.empty()) return;
  if (recovered && !run.upstreams) {
    // Released before the restart: the resolution it was given, not a new one.
    auto events = host_->store()->ListEvents(run.record.name);
    if (events.ok())  // else resolved again from the upstream runs' records
      for (auto it = events->rbegin(); it != events->rend(); ++it) {
        if (it->type != kUpstreamReady) continue;
        std::vector<UpstreamRun> ups;
        for (const nlohmann::json& u : it->data.value("upstreams", nlohmann::json::array()))
          ups.push_back(UpstreamFromJson(u));
        run.upstreams = std::move(ups);
        break;
      }
  }
  if (run.upstreams) return;
  for (const nlohmann::json& a : after) dependents_.emplace(a.value("run", ""), run.record.name);
  check_.insert(run.record.name);
}

void WorkflowGate::RunEnded(const RunRecord& r) {
  auto [first, last] = dependents_.equal_range(r.name);
  for (auto it = first; it != last; ++it) check_.insert(it->second);
  dependents_.erase(first, last);
}

void WorkflowGate::Apply(Batch* batch) {
  // A run stopped here stops those after it (its end adds them), in this same pass.
  while (!check_.empty()) {
    const std::string name = *check_.begin();
    check_.erase(check_.begin());
    Settle(name, batch);
  }
}

void WorkflowGate::Settle(const std::string& name, Batch* batch) {
  auto it = host_->active().find(name);
  if (it == host_->active().end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (store::IsTerminal(r.state) || !WaitsForUpstream(run) || r.cancel_requested) return;
  std::vector<UpstreamRun> ups;
  std::string broken;
  for (const nlohmann::json& a : UpstreamsOf(r)) {
    UpstreamRun u;
    u.stage = a.value("stage", "");
    u.run = a.value("run", "");
    const std::string condition = a.value("condition", "succeeded");
    std::optional<RunRecord> up;
    if (auto live = host_->active().find(u.run); live != host_->active().end()) {
      // Checked again when the one it waits for ends.
      if (!store::IsTerminal(live->second.record.state)) return;
      up = live->second.record;
    } else if (auto stored = host_->store()->GetRun(u.run); stored.ok()) {
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
    u.checkpoint_dir = host_->StorageDir(*up, "checkpoint");
    u.output_dir = host_->StorageDir(*up, "output");
    u.checkpoint = recovery::NewestCompleteCheckpoint(u.checkpoint_dir);
    ups.push_back(std::move(u));
  }
  if (!broken.empty()) {
    if (r.state == RunState::kQueued)
      host_->EndRun(run, RunState::kCancelled, kUpstreamFailed,
                    broken + "; `tau workflow retry-stage` runs it again", batch);
    return;
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
  const int64_t now = host_->Now();
  run.queued_since_ms = now;
  batch->events.push_back({0, name, now, kUpstreamReady,
                           "the stages it waits for have ended: " + Join(said, "; "),
                           std::move(data), "", ""});
  host_->EngineChanged(name);
}

nlohmann::json WorkflowGate::Pending(const ActiveRun& run) {
  if (!WaitsForUpstream(run)) return nullptr;
  std::vector<std::string> waiting;
  for (const nlohmann::json& a : UpstreamsOf(run.record)) {
    const std::string up = a.value("run", "");
    auto it = host_->active().find(up);
    if (it == host_->active().end()) continue;
    waiting.push_back(fmt::format("stage '{}' (run {}, {})", a.value("stage", ""), up,
                                  store::RunStateName(it->second.record.state)));
  }
  return UpstreamPendingEntry(run.record.queue, waiting);
}

}  // namespace tau::server
