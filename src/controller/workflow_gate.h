// Workflows, as a pass: a stage's run waits, out of its queue, until the runs of the stages it
// names in `after` have ended; then it is released (its upstream runs' checkpoints and outputs
// resolved once and recorded as an UpstreamReady event) or, when one did not end as its
// condition needs, stopped as UpstreamFailed, which stops the stages after it in turn. Everything
// here is derived from the runs' records, so a restarted server carries on where the last one
// stopped.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "controller/pass.h"

namespace tau::server {

// Why a stage stopped without running: its run's reason.
inline constexpr const char* kUpstreamFailed = "UpstreamFailed";

// The stages a workflow run waits for ({"stage", "run", "condition"} each; empty when none).
const nlohmann::json& UpstreamsOf(const store::RunRecord& r);

// Why a run held by its upstream runs waits, naming those that have not ended (`waiting`; none:
// "the stages before it"): a submission answers with it before the loop has seen the run.
nlohmann::json UpstreamPendingEntry(const std::string& queue,
                                    const std::vector<std::string>& waiting);

class WorkflowGate final : public RunPass {
 public:
  explicit WorkflowGate(PassHost* host) : host_(host) {}
  const char* Name() const override { return "workflow-gate"; }
  // Tracked by the runs it waits for; a recovered run's resolution is read back from its
  // UpstreamReady event.
  void RunAdded(ActiveRun& run, bool recovered) override;
  // The stages waiting for it are looked at again.
  void RunEnded(const store::RunRecord& r) override;
  // Releases or stops the stages whose upstream runs may all have ended.
  void Apply(store::Batch* batch) override;
  bool Busy() const override { return !check_.empty(); }
  nlohmann::json Pending(const ActiveRun& run) override;

 private:
  void Settle(const std::string& name, store::Batch* batch);

  PassHost* const host_;
  // The runs waiting for each upstream run, and the runs whose upstream runs may all have ended.
  std::multimap<std::string, std::string> dependents_;
  std::set<std::string> check_;
};

}  // namespace tau::server
