#include "controller/workflow_gate.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace tau::server {
namespace {

using store::RunState;

// The loop as the gate sees it: runs in memory, ends as the controller's Finish makes them (the
// passes told), no store (every upstream run here is still in the loop).
class Host final : public PassHost {
 public:
  std::map<std::string, ActiveRun>& active() override { return runs; }
  int64_t Now() override { return 1000; }
  void EngineChanged(const std::string& run) override { changed.insert(run); }
  store::Store* store() override { return nullptr; }
  std::string StorageDir(const store::RunRecord& r, const std::string& role) const override {
    return "storage/" + r.name + "/" + role;
  }
  void EndRun(ActiveRun& run, RunState state, const std::string& reason, const std::string& message,
              store::Batch*) override {
    run.record.state = state;
    run.record.reason = reason;
    run.record.message = message;
    gate->RunEnded(run.record);
  }

  ActiveRun& Add(const std::string& name, nlohmann::json after = nlohmann::json::array()) {
    ActiveRun& run = runs[name];
    run.record.name = name;
    run.record.queue = "default";
    run.record.state = RunState::kQueued;
    if (!after.empty()) run.record.workflow = {{"name", "wf"}, {"stage", name}, {"after", after}};
    return run;
  }
  void End(const std::string& name, RunState state) {
    runs[name].record.state = state;
    gate->RunEnded(runs[name].record);
  }

  std::map<std::string, ActiveRun> runs;
  std::set<std::string> changed;
  WorkflowGate* gate = nullptr;
};

nlohmann::json After(const std::string& run, const std::string& condition = "succeeded") {
  return nlohmann::json::array({{{"stage", run}, {"run", run}, {"condition", condition}}});
}

TEST(WorkflowGateTest, AStageWaitsForItsUpstreamAndIsReleasedWithItsResolution) {
  Host host;
  WorkflowGate gate(&host);
  host.gate = &gate;
  gate.RunAdded(host.Add("train"), false);
  ActiveRun& eval = host.Add("eval", After("train"));
  gate.RunAdded(eval, false);
  EXPECT_TRUE(WaitsForUpstream(eval));
  store::Batch batch;
  gate.Apply(&batch);  // train still queued: nothing to do
  EXPECT_TRUE(batch.events.empty());
  EXPECT_FALSE(gate.Busy());
  nlohmann::json why = gate.Pending(eval);
  EXPECT_EQ(why["code"], "WaitingForUpstream");
  EXPECT_NE(why["reason"].get<std::string>().find("stage 'train' (run train, Queued)"),
            std::string::npos)
      << why.dump();
  EXPECT_TRUE(gate.Pending(host.runs["train"]).is_null());

  host.End("train", RunState::kSucceeded);
  EXPECT_TRUE(gate.Busy()) << "the loop passes again at once";
  gate.Apply(&batch);
  ASSERT_TRUE(eval.upstreams.has_value());
  ASSERT_EQ(eval.upstreams->size(), 1u);
  EXPECT_EQ((*eval.upstreams)[0].state, "Succeeded");
  EXPECT_EQ((*eval.upstreams)[0].checkpoint_dir, "storage/train/checkpoint");
  EXPECT_EQ((*eval.upstreams)[0].output_dir, "storage/train/output");
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].type, "UpstreamReady");
  EXPECT_EQ(batch.events[0].data["upstreams"][0]["run"], "train");
  EXPECT_EQ(host.changed, std::set<std::string>{"eval"});
  EXPECT_FALSE(WaitsForUpstream(eval));
  EXPECT_TRUE(gate.Pending(eval).is_null());
}

TEST(WorkflowGateTest, AFailedUpstreamStopsTheStagesAfterItInTheSamePass) {
  Host host;
  WorkflowGate gate(&host);
  host.gate = &gate;
  gate.RunAdded(host.Add("train"), false);
  gate.RunAdded(host.Add("eval", After("train")), false);
  gate.RunAdded(host.Add("report", After("eval")), false);
  gate.RunAdded(host.Add("cleanup", After("train", "finished")), false);
  host.End("train", RunState::kFailed);
  store::Batch batch;
  gate.Apply(&batch);
  EXPECT_EQ(host.runs["eval"].record.state, RunState::kCancelled);
  EXPECT_EQ(host.runs["eval"].record.reason, kUpstreamFailed);
  EXPECT_NE(host.runs["eval"].record.message.find(
                "stage 'train' (run train) ended Failed; this stage runs only after it succeeds"),
            std::string::npos)
      << host.runs["eval"].record.message;
  EXPECT_EQ(host.runs["report"].record.state, RunState::kCancelled) << "stopped in turn";
  EXPECT_EQ(host.runs["report"].record.reason, kUpstreamFailed);
  // "finished" runs after its upstream whatever its end.
  EXPECT_EQ(host.runs["cleanup"].record.state, RunState::kQueued);
  EXPECT_TRUE(host.runs["cleanup"].upstreams.has_value());
  EXPECT_FALSE(gate.Busy());
}

TEST(WorkflowGateTest, ACancelledStageIsNotReleased) {
  Host host;
  WorkflowGate gate(&host);
  host.gate = &gate;
  gate.RunAdded(host.Add("train"), false);
  ActiveRun& eval = host.Add("eval", After("train"));
  gate.RunAdded(eval, false);
  eval.record.cancel_requested = true;
  host.End("train", RunState::kSucceeded);
  store::Batch batch;
  gate.Apply(&batch);
  EXPECT_FALSE(eval.upstreams.has_value()) << "its cancel ends it; it never enters its queue";
  EXPECT_TRUE(batch.events.empty());
}

}  // namespace
}  // namespace tau::server
