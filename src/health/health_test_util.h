// Test helpers: run a GpuMonitor against the scenario NVML (tests/fake_nvml/, docs/fake-nvml.md).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "health/health.h"

namespace tau::health::testing {

// Writes `text` as a scenario file and points the fake NVML at it (and tau at the fake).
inline std::string UseScenario(const std::string& text, const char* library = TAU_FAKE_NVML_PATH) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string path =
      ::testing::TempDir() + "/" + info->test_suite_name() + "_" + info->name() + ".scn";
  std::ofstream(path) << text;
  setenv("TAU_NVML_LIBRARY", library, 1);
  setenv("TAU_FAKE_NVML_SCENARIO", path.c_str(), 1);
  unsetenv("TAU_FAKE_NVML_GPUS");
  return path;
}

inline void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// A monitor without background threads: the test drives passes with PollOnce().
inline std::unique_ptr<GpuMonitor> StartManual(MonitorOptions options = {}) {
  auto monitor = std::make_unique<GpuMonitor>(std::move(options));
  EXPECT_TRUE(monitor->Start(/*start_threads=*/false).ok());
  return monitor;
}

// Starts a manual monitor on `scenario` and does `passes` polling passes in all (Start does the
// first).
inline HealthSnapshot Observe(const std::string& scenario, int passes = 2) {
  UseScenario(scenario);
  auto monitor = StartManual();
  for (int i = 1; i < passes; ++i) monitor->PollOnce();
  return monitor->Snapshot();
}

inline const Reason* FindReason(const GpuVerdict& v, const std::string& check) {
  for (const Reason& r : v.reasons) {
    if (r.check == check) return &r;
  }
  return nullptr;
}

inline std::string Describe(const GpuVerdict& v) { return ToJson(v).dump(); }

}  // namespace tau::health::testing
