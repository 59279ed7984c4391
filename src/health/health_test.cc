#include "health/health.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "health/health_test_util.h"

namespace tau::health {
namespace {

TEST(HealthTest, NoDriverMeansNoGpusAndAClearNote) {
  setenv("TAU_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  GpuInventory inv = DiscoverGpus();
  EXPECT_TRUE(inv.devices.empty());
  EXPECT_FALSE(inv.driver_loaded);
  EXPECT_NE(inv.note.find("no NVIDIA driver found"), std::string::npos) << inv.note;
}

TEST(HealthTest, ReadsInventoryThroughNvml) {
  setenv("TAU_NVML_LIBRARY", TAU_FAKE_NVML_PATH, 1);
  unsetenv("TAU_FAKE_NVML_SCENARIO");
  setenv("TAU_FAKE_NVML_GPUS", "3", 1);
  GpuInventory inv = DiscoverGpus();
  ASSERT_TRUE(inv.driver_loaded) << inv.note;
  ASSERT_EQ(inv.devices.size(), 3u);
  EXPECT_EQ(inv.devices[2].index, 2);
  EXPECT_EQ(inv.devices[2].uuid, "GPU-fake-0002");
  EXPECT_EQ(inv.devices[0].name, "Fake H200");
  EXPECT_EQ(inv.devices[0].memory_total_bytes, 141ull << 30);
  EXPECT_EQ(ToJson(inv)["devices"].size(), 3u);
  unsetenv("TAU_FAKE_NVML_GPUS");
}

TEST(HealthTest, InventoryHasBusIdVersionsAndMigMode) {
  testing::UseScenario("gpus 2\ndriver 560.35.03\ncuda 12060\ngpu 1 mig_mode 1\n");
  GpuInventory inv = DiscoverGpus();
  ASSERT_EQ(inv.devices.size(), 2u) << inv.note;
  EXPECT_EQ(inv.driver_version, "560.35.03");
  EXPECT_EQ(inv.cuda_driver_version, "12.6");
  EXPECT_FALSE(inv.nvml_version.empty());
  EXPECT_EQ(inv.devices[0].pci_bus_id.size(), 16u) << inv.devices[0].pci_bus_id;
  EXPECT_NE(inv.devices[0].pci_bus_id, inv.devices[1].pci_bus_id);
  EXPECT_EQ(inv.devices[1].minor_number, 1);
  ASSERT_TRUE(inv.devices[0].mig_enabled.has_value());
  EXPECT_FALSE(*inv.devices[0].mig_enabled);
  EXPECT_TRUE(*inv.devices[1].mig_enabled);
  nlohmann::json j = ToJson(inv);
  EXPECT_EQ(j["cuda_driver_version"], "12.6");
  EXPECT_EQ(j["devices"][1]["mig_enabled"], true);
}

TEST(HealthTest, DriverThatFailsToInitialiseSaysWhy) {
  testing::UseScenario("init_error 18\n");
  GpuInventory inv = DiscoverGpus();
  EXPECT_FALSE(inv.driver_loaded);
  EXPECT_TRUE(inv.devices.empty());
  EXPECT_NE(inv.note.find("version"), std::string::npos) << inv.note;
  EXPECT_NE(inv.note.find("reboot"), std::string::npos) << inv.note;
}

TEST(HealthTest, OlderDriverStillGivesAnInventory) {
  testing::UseScenario("gpus 2\ncuda 11080\n", TAU_FAKE_NVML_OLD_PATH);
  GpuInventory inv = DiscoverGpus();
  ASSERT_EQ(inv.devices.size(), 2u) << inv.note;
  EXPECT_EQ(inv.cuda_driver_version, "11.8");  // through the unversioned name
  EXPECT_EQ(inv.devices[0].pci_bus_id, "");    // no nvmlDeviceGetPciInfo_v3
  EXPECT_FALSE(inv.devices[0].mig_enabled.has_value());
}

}  // namespace
}  // namespace tau::health
