// The GPU health agent: the pure node condition/taint computation, and one agent pass end to end
// against the fake API server with the scenario NVML (tests/fake_nvml, docs/fake-nvml.md).
#include "health_agent/node_health.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "kube/kube.h"
#include "testing/fake_apiserver.h"

namespace tau::health_agent {
namespace {

using testutil::FakeApiServer;

using nlohmann::json;

const int64_t kT0 = 1'800'000'000'000;  // a fixed "now"

health::HealthSnapshot Snapshot(const std::vector<health::Verdict>& verdicts) {
  health::HealthSnapshot s;
  s.inventory.driver_loaded = true;
  for (size_t i = 0; i < verdicts.size(); ++i) {
    health::GpuDevice d;
    d.index = static_cast<int>(i);
    d.uuid = "GPU-test-" + std::to_string(i);
    s.inventory.devices.push_back(d);
    health::GpuVerdict v;
    v.gpu_index = static_cast<int>(i);
    v.verdict = verdicts[i];
    if (verdicts[i] == health::Verdict::kUnhealthy) {
      health::Reason r;
      r.check = "xid_79";
      r.status = health::CheckStatus::kFail;
      r.message = "XID 79: GPU has fallen off the bus";
      v.reasons.push_back(r);
    }
    s.verdicts.push_back(v);
  }
  return s;
}

json NvidiaTaint() {
  return {{"key", "nvidia.com/gpu"}, {"value", "present"}, {"effect", "NoSchedule"}};
}

json Node(json taints = json::array(), json conditions = json::array()) {
  json ready = {{"type", "Ready"}, {"status", "True"}, {"reason", "KubeletReady"}};
  json all = json::array({ready});
  for (const json& c : conditions) all.push_back(c);
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", "gpu-node-1"}}},
          {"spec", {{"taints", taints}}},
          {"status", {{"conditions", all}}}};
}

const json* Find(const json& list, const std::string& field, const std::string& value) {
  for (const json& item : list)
    if (item.value(field, "") == value) return &item;
  return nullptr;
}

// ---- the pure function ----

TEST(ComputeNodeHealthTest, HealthyGivesTrueAndNoTaint) {
  using health::Verdict;
  NodeHealthUpdate u =
      ComputeNodeHealth(Snapshot({Verdict::kHealthy, Verdict::kDegraded}), Node(), kT0);
  EXPECT_EQ(u.condition["type"], kGpuHealthyCondition);
  EXPECT_EQ(u.condition["status"], "True");
  EXPECT_EQ(u.condition["reason"], "AllGPUsHealthy");
  EXPECT_EQ(u.condition["lastHeartbeatTime"], FormatRfc3339(kT0).substr(0, 19) + "Z");
  EXPECT_TRUE(u.condition_changed);  // the node had no condition of ours
  EXPECT_FALSE(u.tainted);
  EXPECT_FALSE(u.taints_changed);
  EXPECT_EQ(u.taints, json::array());
  // The other conditions stay, ours is appended.
  ASSERT_EQ(u.conditions.size(), 2u);
  EXPECT_EQ(u.conditions[0]["type"], "Ready");
}

TEST(ComputeNodeHealthTest, UnhealthyGpuGivesFalseAndTaintKeepingOtherTaints) {
  using health::Verdict;
  json node = Node(json::array({NvidiaTaint()}));
  NodeHealthUpdate u = ComputeNodeHealth(
      Snapshot({Verdict::kHealthy, Verdict::kHealthy, Verdict::kHealthy, Verdict::kUnhealthy}),
      node, kT0);
  EXPECT_EQ(u.condition["status"], "False");
  EXPECT_EQ(u.condition["reason"], "GPUUnhealthy");
  std::string message = u.condition["message"];
  EXPECT_NE(message.find("GPU 3 (GPU-test-3)"), std::string::npos) << message;
  EXPECT_NE(message.find("XID 79"), std::string::npos) << message;
  EXPECT_NE(u.summary.find("GPU 3 Unhealthy (xid_79)"), std::string::npos) << u.summary;
  EXPECT_TRUE(u.tainted);
  EXPECT_TRUE(u.taints_changed);
  ASSERT_EQ(u.taints.size(), 2u);
  EXPECT_EQ(u.taints[0], NvidiaTaint());  // untouched, in its place
  EXPECT_EQ(
      u.taints[1],
      json({{"key", kube::kGpuUnhealthyTaint}, {"value", "1-of-4"}, {"effect", "NoSchedule"}}));
}

TEST(ComputeNodeHealthTest, UnknownVerdictFailsClosedLikePlacement) {
  using health::Verdict;
  NodeHealthUpdate u =
      ComputeNodeHealth(Snapshot({Verdict::kUnknown, Verdict::kHealthy}), Node(), kT0);
  EXPECT_EQ(u.condition["status"], "False");
  EXPECT_TRUE(u.tainted);
}

TEST(ComputeNodeHealthTest, RecoveryRemovesTaintAndStampsTransition) {
  using health::Verdict;
  NodeHealthUpdate sick = ComputeNodeHealth(Snapshot({Verdict::kUnhealthy, Verdict::kHealthy}),
                                            Node(json::array({NvidiaTaint()})), kT0);
  json node = Node(sick.taints, json::array({sick.condition}));
  NodeHealthUpdate well =
      ComputeNodeHealth(Snapshot({Verdict::kHealthy, Verdict::kHealthy}), node, kT0 + 60'000);
  EXPECT_EQ(well.condition["status"], "True");
  EXPECT_TRUE(well.condition_changed);
  EXPECT_NE(well.condition["lastTransitionTime"], sick.condition["lastTransitionTime"]);
  EXPECT_EQ(well.condition["lastTransitionTime"], well.condition["lastHeartbeatTime"]);
  EXPECT_FALSE(well.tainted);
  EXPECT_TRUE(well.taints_changed);
  EXPECT_EQ(well.taints, json::array({NvidiaTaint()}));
  // Ours is replaced in place, not duplicated.
  EXPECT_EQ(well.conditions.size(), 2u);
}

TEST(ComputeNodeHealthTest, UnchangedStateKeepsTransitionTime) {
  using health::Verdict;
  health::HealthSnapshot snap = Snapshot({Verdict::kUnhealthy});
  NodeHealthUpdate first = ComputeNodeHealth(snap, Node(), kT0);
  json node = Node(first.taints, json::array({first.condition}));
  NodeHealthUpdate again = ComputeNodeHealth(snap, node, kT0 + 30'000);
  EXPECT_FALSE(again.condition_changed);
  EXPECT_FALSE(again.taints_changed);
  EXPECT_EQ(again.heartbeat_ms, kT0 / 1000 * 1000);
  EXPECT_EQ(again.condition["lastTransitionTime"], first.condition["lastTransitionTime"]);
  EXPECT_NE(again.condition["lastHeartbeatTime"], first.condition["lastHeartbeatTime"]);
}

TEST(ComputeNodeHealthTest, NvmlMissingIsUnknownAndLeavesTaintsAlone) {
  using health::Verdict;
  NodeHealthUpdate sick = ComputeNodeHealth(Snapshot({Verdict::kUnhealthy}), Node(), kT0);
  json node = Node(sick.taints, json::array({sick.condition}));
  health::HealthSnapshot none;
  none.inventory.note = "no NVIDIA driver found (libnvidia-ml.so.1: cannot open shared object)";
  NodeHealthUpdate u = ComputeNodeHealth(none, node, kT0 + 1000);
  EXPECT_EQ(u.condition["status"], "Unknown");
  EXPECT_EQ(u.condition["reason"], "NVMLUnavailable");
  EXPECT_NE(u.condition["message"].get<std::string>().find("no NVIDIA driver found"),
            std::string::npos);
  EXPECT_FALSE(u.taints_changed);
  EXPECT_TRUE(u.tainted);
  EXPECT_EQ(u.taints, sick.taints);
}

// ---- one agent pass against the fake API server and the scenario NVML ----

class NodeHealthAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.Start().ok());
    kubeapi::ClusterConfig config;
    config.server = fake_.url();
    auto client = kubeapi::Client::Create(config);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
    ASSERT_TRUE(client_->Create(Node(json::array({NvidiaTaint()}))).ok());
  }
  void UseScenario(const std::string& text) {
    std::string path = ::testing::TempDir() + "/node_health_test.scn";
    std::ofstream(path) << text;
    setenv("TAU_NVML_LIBRARY", TAU_FAKE_NVML_PATH, 1);
    setenv("TAU_FAKE_NVML_SCENARIO", path.c_str(), 1);
  }
  json Stored() const { return fake_.Object("v1/nodes", "", "gpu-node-1"); }

  FakeApiServer fake_;
  std::unique_ptr<kubeapi::Client> client_;
};

TEST_F(NodeHealthAgentTest, TaintsOnUnhealthyGpuAndUntaintsAfterReset) {
  // GPU 1 has a volatile double-bit ECC error (Unhealthy at once, clears after a GPU reset); the
  // error counter is back to 0 from 200 ms on, as after a reset.
  UseScenario("gpus 2\ngpu 1 ecc_dbe_volatile 1\nat 200ms gpu 1 ecc_dbe_volatile 0\n");
  health::GpuMonitor monitor(health::MonitorOptions{});
  ASSERT_TRUE(monitor.Start(/*start_threads=*/false).ok());

  std::vector<std::string> lines;
  NodeHealthAgentOptions options;
  options.node = "gpu-node-1";
  options.log = [&](const std::string& line) { lines.push_back(line); };
  NodeHealthAgent agent(client_.get(), options);

  ASSERT_TRUE(agent.Publish(monitor.Snapshot()).ok());
  json node = Stored();
  const json& taints = node["spec"]["taints"];
  ASSERT_EQ(taints.size(), 2u) << node.dump();
  EXPECT_EQ(taints[0], NvidiaTaint());
  EXPECT_EQ(taints[1]["key"], kube::kGpuUnhealthyTaint);
  EXPECT_EQ(taints[1]["effect"], "NoSchedule");
  EXPECT_EQ(taints[1]["value"], "1-of-2");
  const json* cond = Find(node["status"]["conditions"], "type", kGpuHealthyCondition);
  ASSERT_NE(cond, nullptr) << node.dump();
  EXPECT_EQ((*cond)["status"], "False");
  EXPECT_NE((*cond)["message"].get<std::string>().find("GPU 1 (GPU-fake-0001)"), std::string::npos)
      << cond->dump();
  EXPECT_NE(Find(node["status"]["conditions"], "type", "Ready"), nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("node gpu-node-1: GPU 1 Unhealthy (ecc_dbe_volatile): tainted "
                          "tau.dev/gpu-unhealthy:NoSchedule"),
            std::string::npos)
      << lines[0];

  // Nothing changed and the heartbeat is fresh: no write at all.
  fake_.ClearRequests();
  ASSERT_TRUE(agent.Publish(monitor.Snapshot()).ok());
  for (const auto& r : fake_.Requests()) EXPECT_EQ(r.method, "GET") << r.path;
  EXPECT_EQ(lines.size(), 1u);

  // The GPU was reset: healthy again, our taint goes, the GPU operator's stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  monitor.ClearAfterReset(1);
  monitor.PollOnce();
  ASSERT_TRUE(health::Placeable(monitor.Snapshot().verdicts[1].verdict));
  ASSERT_TRUE(agent.Publish(monitor.Snapshot()).ok());
  node = Stored();
  EXPECT_EQ(node["spec"]["taints"], json::array({NvidiaTaint()})) << node.dump();
  cond = Find(node["status"]["conditions"], "type", kGpuHealthyCondition);
  ASSERT_NE(cond, nullptr);
  EXPECT_EQ((*cond)["status"], "True");
  EXPECT_EQ((*cond)["reason"], "AllGPUsHealthy");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("untainted tau.dev/gpu-unhealthy"), std::string::npos) << lines[1];
  monitor.Stop();
  unsetenv("TAU_FAKE_NVML_SCENARIO");
}

TEST_F(NodeHealthAgentTest, RunTaintsWithinAPollOfAnXidEvent) {
  // A poll interval far longer than the test: only the verdict change can make the agent publish
  // the taint in time.
  UseScenario("gpus 2\nat 300ms gpu 0 xid 79\n");
  health::MonitorOptions monitor_options;
  monitor_options.poll_interval_ms = 60'000;
  health::GpuMonitor monitor(monitor_options);
  ASSERT_TRUE(monitor.Start().ok());
  NodeHealthAgentOptions options;
  options.node = "gpu-node-1";
  NodeHealthAgent agent(client_.get(), options);
  std::atomic<bool> stop{false};
  std::thread runner([&] { EXPECT_TRUE(agent.Run(&monitor, 60'000, stop).ok()); });
  auto tainted = [&] {
    json taints = Stored()["spec"]["taints"];
    return Find(taints, "key", kube::kGpuUnhealthyTaint) != nullptr;
  };
  bool seen = false;
  for (int i = 0; i < 300 && !seen; ++i) {
    seen = tainted();
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  runner.join();
  monitor.Stop();
  unsetenv("TAU_FAKE_NVML_SCENARIO");
  json node = Stored();
  ASSERT_TRUE(seen) << node.dump();
  const json* cond = Find(node["status"]["conditions"], "type", kGpuHealthyCondition);
  ASSERT_NE(cond, nullptr);
  EXPECT_EQ((*cond)["status"], "False");
  EXPECT_NE((*cond)["message"].get<std::string>().find("GPU 0"), std::string::npos);
}

TEST_F(NodeHealthAgentTest, StalePatchIsAConflict) {
  // The agent relies on the API server refusing a patch made from an old read.
  json node = Stored();
  std::string old_version = node["metadata"]["resourceVersion"];
  ASSERT_TRUE(
      client_
          ->MergePatch("v1", "Node", "", "gpu-node-1", {{"metadata", {{"labels", {{"a", "b"}}}}}})
          .ok());
  json stale = {{"metadata", {{"resourceVersion", old_version}}},
                {"spec", {{"taints", json::array()}}}};
  Result<json> got = client_->MergePatch("v1", "Node", "", "gpu-node-1", stale);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(kubeapi::IsConflict(got.status())) << got.status().ToString();
  got = client_->MergePatch("v1", "Node", "", "gpu-node-1", stale, "status");
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(kubeapi::IsConflict(got.status())) << got.status().ToString();
  EXPECT_EQ(Stored()["spec"]["taints"], json::array({NvidiaTaint()}));
}

}  // namespace
}  // namespace tau::health_agent
