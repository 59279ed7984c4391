#include "health/health.h"

#include <gtest/gtest.h>

#include <cstdlib>

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

}  // namespace
}  // namespace tau::health
