// JSON and dcgm-exporter style metrics.
#include <gtest/gtest.h>

#include "health/health.h"
#include "health/health_test_util.h"

namespace tau::health {
namespace {

TEST(OutputTest, SnapshotJsonHasInventorySamplesAndVerdicts) {
  testing::UseScenario("gpus 2\ngpu 1 ecc_dbe_volatile 3\ngpu 0 temperature 55\n");
  auto monitor = testing::StartManual();
  nlohmann::json j = ToJson(monitor->Snapshot());
  ASSERT_EQ(j["gpus"].size(), 2u);
  EXPECT_EQ(j["inventory"]["devices"].size(), 2u);
  EXPECT_EQ(j["gpus"][0]["device"]["uuid"], "GPU-fake-0000");
  EXPECT_EQ(j["gpus"][0]["sample"]["temperature_c"], 55);
  EXPECT_EQ(j["gpus"][0]["health"]["verdict"], "Healthy");
  EXPECT_EQ(j["gpus"][0]["health"]["placeable"], true);
  const nlohmann::json& h = j["gpus"][1]["health"];
  EXPECT_EQ(h["verdict"], "Unhealthy");
  EXPECT_EQ(h["placeable"], false);
  ASSERT_EQ(h["reasons"].size(), 1u);
  EXPECT_EQ(h["reasons"][0]["check"], "ecc_dbe_volatile");
  EXPECT_EQ(h["reasons"][0]["action"], "reset_gpu");
  EXPECT_EQ(h["reasons"][0]["clear"], "on_gpu_reset");
  EXPECT_NE(h["reasons"][0]["source"].get<std::string>().find("DCGM"), std::string::npos);
  EXPECT_EQ(h["reasons"][0]["first_seen"].get<std::string>().back(), 'Z');
  EXPECT_EQ(j["passes"], 1);
}

TEST(OutputTest, CheckResultJson) {
  GpuSample s;
  s.index = 4;
  s.lost = true;
  nlohmann::json j = ToJson(RunPassiveChecks(s, nullptr, Thresholds{})[0]);
  EXPECT_EQ(j["gpu"], 4);
  EXPECT_EQ(j["check"], "gpu_lost");
  EXPECT_EQ(j["status"], "fail");
  EXPECT_EQ(j["clear"], "on_reboot");
}

TEST(OutputTest, MetricsLookLikeDcgmExporter) {
  testing::UseScenario(
      "gpus 2\ngpu * memory_used 1073741824\ngpu 0 utilization 37 12\ngpu 0 power 312\n"
      "gpu 0 temperature 61\nat 200ms gpu 1 xid 48\n");
  auto monitor = testing::StartManual();
  int handled = 0;
  for (int i = 0; i < 30 && !handled; ++i) handled = monitor->WaitForEventOnce(100);
  ASSERT_EQ(handled, 1);
  std::string text = RenderMetrics(monitor->Snapshot(), "node-a");
  const std::string labels0 =
      R"({gpu="0",uuid="GPU-fake-0000",pci_bus_id="00000000:18:00.0",device="nvidia0",)"
      R"(model_name="Fake H200",hostname="node-a"})";
  EXPECT_NE(text.find("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"), std::string::npos) << text;
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_UTIL" + labels0 + " 37\n"), std::string::npos) << text;
  EXPECT_NE(text.find("DCGM_FI_DEV_MEM_COPY_UTIL" + labels0 + " 12\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_USED" + labels0 + " 1024\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_FREE" + labels0 + " 143360\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_TEMP" + labels0 + " 61\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_POWER_USAGE" + labels0 + " 312\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + labels0 + " 0\n"), std::string::npos);
  EXPECT_NE(text.find(R"(DCGM_FI_DEV_XID_ERRORS{gpu="1",uuid="GPU-fake-0001")"), std::string::npos);
  EXPECT_NE(text.find(R"(hostname="node-a"} 48)"), std::string::npos) << "last XID on GPU 1";
  EXPECT_NE(text.find(R"(tau_gpu_health{gpu="1")"), std::string::npos);
  EXPECT_NE(text.find(R"(model_name="Fake H200",hostname="node-a"} 2)"), std::string::npos)
      << "GPU 1 is Unhealthy (2)";
  // Every sample line is NAME{labels} VALUE.
  size_t lines = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# ", 0) == 0) continue;
    ++lines;
    EXPECT_NE(line.find("{gpu=\""), std::string::npos) << line;
    EXPECT_NE(line.find("} "), std::string::npos) << line;
  }
  EXPECT_GT(lines, 40u);
}

TEST(OutputTest, MetricLabelValuesAreEscaped) {
  testing::UseScenario("gpus 1\ngpu 0 name A\"B\n");
  auto monitor = testing::StartManual();
  std::string text = RenderMetrics(monitor->Snapshot());
  EXPECT_NE(text.find(R"(model_name="A\"B")"), std::string::npos) << text;
}

}  // namespace
}  // namespace tau::health
