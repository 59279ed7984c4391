// Every check and verdict rule through the scenario NVML: the monitor reads the fake driver exactly
// as it reads a real one.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "common/clock.h"
#include "health/health.h"
#include "health/health_test_util.h"

namespace tau::health {
namespace {

using testing::Describe;
using testing::FindReason;
using testing::Observe;
using testing::Sleep;
using testing::StartManual;
using testing::UseScenario;

// Waits (manual monitor) until `n` XID events have been handled or `ms` pass.
void HandleEvents(GpuMonitor& monitor, int n, int ms = 3000) {
  int64_t deadline = MonotonicMillis() + ms;
  int handled = 0;
  while (handled < n && MonotonicMillis() < deadline) handled += monitor.WaitForEventOnce(100);
  ASSERT_EQ(handled, n) << "XID events handled";
}

TEST(MonitorTest, HealthyByDefault) {
  unsetenv("TAU_FAKE_NVML_SCENARIO");
  setenv("TAU_NVML_LIBRARY", TAU_FAKE_NVML_PATH, 1);
  setenv("TAU_FAKE_NVML_GPUS", "2", 1);
  auto monitor = StartManual();
  monitor->PollOnce();
  HealthSnapshot snap = monitor->Snapshot();
  ASSERT_EQ(snap.verdicts.size(), 2u);
  for (const GpuVerdict& v : snap.verdicts) {
    EXPECT_EQ(v.verdict, Verdict::kHealthy) << Describe(v);
    EXPECT_TRUE(v.reasons.empty());
  }
  const GpuSample& s = snap.samples[0];
  EXPECT_EQ(s.temperature_c, 40u);
  EXPECT_EQ(s.nvlinks.size(), 18u);
  EXPECT_EQ(s.pcie_width, 16u);
  EXPECT_EQ(s.recovery_action, 0u);
  EXPECT_TRUE(s.remap.has_value());
  EXPECT_TRUE(s.xid_events_supported);
  EXPECT_EQ(snap.passes, 2);
  unsetenv("TAU_FAKE_NVML_GPUS");
}

TEST(MonitorTest, FirstPassTurnsUnknownIntoHealthyAndTellsTheCallback) {
  UseScenario("gpus 2\n");
  std::vector<std::pair<int, Verdict>> changes;
  MonitorOptions options;
  options.on_verdict_change = [&](int gpu, Verdict old_verdict, Verdict new_verdict,
                                  const std::vector<Reason>&) {
    EXPECT_EQ(old_verdict, Verdict::kUnknown);
    changes.emplace_back(gpu, new_verdict);
  };
  auto monitor = StartManual(options);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[1], std::make_pair(1, Verdict::kHealthy));
}

TEST(MonitorTest, Xid79MidRunFlipsTheGpuUnhealthyWithinOnePollingInterval) {
  UseScenario("gpus 4\nat 400ms gpu 1 xid 79\n");
  std::mutex mu;
  std::vector<VerdictChange> changes;
  MonitorOptions options;
  options.poll_interval_ms = 5000;  // the event thread, not the poll, must catch it
  options.on_verdict_change = [&](int gpu, Verdict old_verdict, Verdict new_verdict,
                                  const std::vector<Reason>& reasons) {
    std::lock_guard<std::mutex> lock(mu);
    changes.push_back({gpu, old_verdict, new_verdict, reasons, MonotonicMillis()});
  };
  GpuMonitor monitor(options);
  int64_t started = MonotonicMillis();
  ASSERT_TRUE(monitor.Start().ok());
  int64_t flipped = 0;
  while (MonotonicMillis() - started < 3000 && !flipped) {
    Sleep(10);
    std::lock_guard<std::mutex> lock(mu);
    for (const VerdictChange& c : changes) {
      if (c.gpu_index == 1 && c.new_verdict == Verdict::kUnhealthy) flipped = c.at_ms;
    }
  }
  ASSERT_NE(flipped, 0) << "GPU 1 never turned Unhealthy";
  EXPECT_LT(flipped - started, 5000) << "slower than one polling interval";
  HealthSnapshot snap = monitor.Snapshot();
  EXPECT_EQ(snap.passes, 1) << "the poll should not have been needed";
  EXPECT_TRUE(snap.xid_events);
  const Reason* r = FindReason(snap.verdicts[1], "xid_79");
  ASSERT_NE(r, nullptr) << Describe(snap.verdicts[1]);
  EXPECT_EQ(r->action, Action::kRebootNode);
  EXPECT_EQ(r->clear, ClearRule::kOnReboot);
  EXPECT_NE(r->message.find("GPU_HAS_FALLEN_OFF_THE_BUS"), std::string::npos);
  EXPECT_GT(r->first_seen_ms, 0);
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kHealthy);
  EXPECT_EQ(snap.samples[1].last_xid, 79u);
  monitor.Stop();
}

// The XID table through the event path: one GPU per XID.
TEST(MonitorTest, XidsAreClassifiedByTheTable) {
  struct Case {
    uint64_t xid;
    Verdict verdict;
    Action action;
  };
  const std::vector<Case> cases = {
      {13, Verdict::kHealthy, Action::kRestartApp},  {31, Verdict::kHealthy, Action::kRestartApp},
      {43, Verdict::kHealthy, Action::kRestartApp},  {94, Verdict::kHealthy, Action::kRestartApp},
      {109, Verdict::kHealthy, Action::kRestartApp}, {48, Verdict::kUnhealthy, Action::kHardware},
      {63, Verdict::kDegraded, Action::kWatch},      {64, Verdict::kUnhealthy, Action::kHardware},
      {74, Verdict::kUnhealthy, Action::kHardware},  {79, Verdict::kUnhealthy, Action::kRebootNode},
      {92, Verdict::kDegraded, Action::kWatch},      {95, Verdict::kUnhealthy, Action::kResetGpu},
      {119, Verdict::kUnhealthy, Action::kResetGpu}, {120, Verdict::kUnhealthy, Action::kResetGpu},
      {54, Verdict::kUnhealthy, Action::kHardware},  {2, Verdict::kUnhealthy, Action::kHardware},
      {999, Verdict::kDegraded, Action::kWatch},     {4000, Verdict::kDegraded, Action::kWatch},
  };
  std::string scenario = "gpus " + std::to_string(cases.size()) + "\n";
  for (size_t i = 0; i < cases.size(); ++i) {
    scenario += "at 300ms gpu " + std::to_string(i) + " xid " + std::to_string(cases[i].xid) + "\n";
  }
  UseScenario(scenario);
  auto monitor = StartManual();
  HandleEvents(*monitor, int(cases.size()));
  HealthSnapshot snap = monitor->Snapshot();
  for (size_t i = 0; i < cases.size(); ++i) {
    const GpuVerdict& v = snap.verdicts[i];
    EXPECT_EQ(v.verdict, cases[i].verdict) << "XID " << cases[i].xid << ": " << Describe(v);
    if (cases[i].verdict == Verdict::kHealthy) {
      ASSERT_EQ(v.recent_xids.size(), 1u);
      EXPECT_EQ(v.recent_xids[0].xid, cases[i].xid);
      continue;
    }
    const Reason* r = FindReason(v, "xid_" + std::to_string(cases[i].xid));
    ASSERT_NE(r, nullptr) << Describe(v);
    EXPECT_EQ(r->action, cases[i].action) << "XID " << cases[i].xid;
    EXPECT_FALSE(r->source.empty());
  }
  // The poll after the events records them on the sample.
  monitor->PollOnce();
  snap = monitor->Snapshot();
  ASSERT_EQ(snap.samples[0].xids.size(), 1u);
  EXPECT_EQ(snap.samples[0].xids[0].xid, 13u);
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kHealthy);
}

TEST(MonitorTest, RepeatedApplicationXidsOnOneGpuMakeItSuspectNotUnhealthy) {
  UseScenario("gpus 1\nat 200ms gpu 0 xid 13\nat 250ms gpu 0 xid 31\nat 300ms gpu 0 xid 43\n");
  auto monitor = StartManual();
  HandleEvents(*monitor, 3);
  GpuVerdict v = monitor->Snapshot().verdicts[0];
  EXPECT_EQ(v.verdict, Verdict::kDegraded) << Describe(v);
  EXPECT_NE(FindReason(v, "xid_app_repeated"), nullptr);
  EXPECT_TRUE(Placeable(v.verdict));
}

TEST(MonitorTest, GpuFallenOffTheBusIsUnhealthyAtOnceAndResetDoesNotClearIt) {
  UseScenario("gpus 2\nat 300ms gpu 0 lost\n");
  auto monitor = StartManual();
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kHealthy);
  Sleep(350);
  monitor->PollOnce();
  HealthSnapshot snap = monitor->Snapshot();
  EXPECT_TRUE(snap.samples[0].lost);
  EXPECT_FALSE(snap.samples[0].temperature_c.has_value());
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kUnhealthy) << Describe(snap.verdicts[0]);
  const Reason* r = FindReason(snap.verdicts[0], "gpu_lost");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->clear, ClearRule::kOnReboot);
  EXPECT_EQ(snap.verdicts[1].verdict, Verdict::kHealthy);
  monitor->ClearAfterReset(0);
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kUnhealthy);
}

struct Expect {
  int gpu;
  Verdict verdict;
  const char* check;  // nullptr: no reason expected
  Action action = Action::kNone;
};

void ExpectVerdicts(const HealthSnapshot& snap, const std::vector<Expect>& expected) {
  for (const Expect& e : expected) {
    const GpuVerdict& v = snap.verdicts.at(e.gpu);
    EXPECT_EQ(v.verdict, e.verdict) << "GPU " << e.gpu << ": " << Describe(v);
    if (!e.check) continue;
    const Reason* r = FindReason(v, e.check);
    ASSERT_NE(r, nullptr) << "GPU " << e.gpu << " lacks " << e.check << ": " << Describe(v);
    EXPECT_EQ(r->action, e.action) << e.check;
    EXPECT_FALSE(r->threshold.empty());
    EXPECT_FALSE(r->source.empty());
  }
}

TEST(MonitorTest, MemoryErrors) {
  HealthSnapshot snap = Observe(
      "gpus 7\n"
      "gpu 0 ecc_dbe_volatile 1\n"
      "gpu 1 ecc_sbe_volatile 5000\n"  // corrected errors alone are fine
      "gpu 2 retired_pending 1\n"
      "gpu 3 retired_sbe 40\ngpu 3 retired_dbe 23\n"
      "gpu 4 remap_pending 1\n"
      "gpu 5 remap_failed 1\n"
      "gpu 6 remap_uncorrectable 512\n",
      1);  // latched driver facts count at the first observation
  ExpectVerdicts(snap, {{0, Verdict::kUnhealthy, "ecc_dbe_volatile", Action::kResetGpu},
                        {1, Verdict::kHealthy, nullptr},
                        {2, Verdict::kUnhealthy, "retired_pages_pending", Action::kResetWhenIdle},
                        {3, Verdict::kUnhealthy, "retired_pages", Action::kHardware},
                        {4, Verdict::kUnhealthy, "row_remap_pending", Action::kResetWhenIdle},
                        {5, Verdict::kUnhealthy, "row_remap_failure", Action::kHardware},
                        {6, Verdict::kUnhealthy, "row_remap_uncorrectable", Action::kHardware}});
  EXPECT_EQ(FindReason(snap.verdicts[5], "row_remap_failure")->clear, ClearRule::kOnReboot);
}

// Over DCGM's soft limit of 15 DBE pages, only pages retired while tau watched are dated: the 16
// found at start are older, and two more within the week take the GPU out.
TEST(MonitorTest, DbeRetiredPagesOverTheSoftLimitFailOnlyWhileMoreKeepComing) {
  UseScenario(
      "gpus 1\ngpu 0 retired_dbe 16\nat 300ms gpu 0 retired_dbe 17\nat 600ms gpu 0 retired_dbe "
      "18\n");
  auto monitor = StartManual();
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kHealthy);
  Sleep(350);
  monitor->PollOnce();
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kHealthy) << "one page this week";
  Sleep(300);
  monitor->PollOnce();
  HealthSnapshot snap = monitor->Snapshot();
  ExpectVerdicts(snap, {{0, Verdict::kUnhealthy, "retired_pages_dbe", Action::kHardware}});
  ASSERT_TRUE(snap.samples[0].retired_pages_dbe_at_ms.has_value());
  EXPECT_EQ(snap.samples[0].retired_pages_dbe_at_ms->size(), 2u);
}

TEST(MonitorTest, RowRemapPendingClearsOnlyAfterAReset) {
  UseScenario("gpus 1\ngpu 0 remap_pending 1\nat 200ms gpu 0 remap_pending 0\n");
  auto monitor = StartManual();
  Sleep(250);
  for (int i = 0; i < 4; ++i) monitor->PollOnce();
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kUnhealthy);
  monitor->ClearAfterReset(0);  // re-checks at once
  GpuVerdict v = monitor->Snapshot().verdicts[0];
  EXPECT_EQ(v.verdict, Verdict::kHealthy) << Describe(v);
}

TEST(MonitorTest, TemperatureWarnsAndFailsAfterDebounceAndClearsAfterHealthyPasses) {
  const char* scenario =
      "gpus 3\n"
      "gpu * temperature_slowdown 90\ngpu * temperature_shutdown 100\n"
      "gpu 0 temperature 88\n"  // ≥ slowdown − 2
      "gpu 1 temperature 96\n"  // ≥ shutdown − 5
      "gpu 2 temperature 87\n"
      "at 300ms gpu 0 temperature 50\n";
  UseScenario(scenario);
  auto monitor = StartManual();
  GpuVerdict first = monitor->Snapshot().verdicts[0];
  EXPECT_EQ(first.verdict, Verdict::kHealthy) << "one observation is not enough";
  ASSERT_EQ(first.pending.size(), 1u);
  EXPECT_EQ(first.pending[0].check, "temperature");
  monitor->PollOnce();
  ExpectVerdicts(monitor->Snapshot(), {{0, Verdict::kDegraded, "temperature", Action::kWatch},
                                       {1, Verdict::kUnhealthy, "temperature", Action::kHardware},
                                       {2, Verdict::kHealthy, nullptr}});
  Sleep(350);
  monitor->PollOnce();
  monitor->PollOnce();
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kDegraded) << "cleared too early";
  monitor->PollOnce();
  EXPECT_EQ(monitor->Snapshot().verdicts[0].verdict, Verdict::kHealthy);
}

TEST(MonitorTest, ThermalSlowdownAndPowerBrakeNeedThreeSamples) {
  const char* scenario =
      "gpus 4\n"
      "gpu 0 clocks_reasons 0x40\n"  // HW thermal slowdown
      "gpu 1 clocks_reasons 0x80\n"  // HW power brake
      "gpu 2 clocks_reasons 0x5\n"   // idle + SW power cap: benign
      "gpu 3 clocks_reasons 0x8\n";  // HW slowdown
  HealthSnapshot two = Observe(scenario, 2);
  EXPECT_EQ(two.verdicts[0].verdict, Verdict::kHealthy);
  HealthSnapshot three = Observe(scenario, 3);
  ExpectVerdicts(three, {{0, Verdict::kDegraded, "thermal_slowdown", Action::kWatch},
                         {1, Verdict::kDegraded, "power_brake", Action::kWatch},
                         {2, Verdict::kHealthy, nullptr},
                         {3, Verdict::kDegraded, "thermal_slowdown", Action::kWatch}});
}

TEST(MonitorTest, PowerCablingAndLoweredLimit) {
  HealthSnapshot snap = Observe(
      "gpus 2\ngpu 0 insufficient_power 1\ngpu 1 power_limit 500\ngpu 1 power_default_limit 700\n");
  ExpectVerdicts(snap, {{0, Verdict::kUnhealthy, "power", Action::kHardware},
                        {1, Verdict::kDegraded, "power", Action::kWatch}});
}

TEST(MonitorTest, PcieLinkBelowItsMaximum) {
  UseScenario(
      "gpus 4\n"
      "gpu 0 pcie_width 8 16\n"
      "gpu 1 pcie_gen 3 5\ngpu 1 pstate 0\n"  // under load: degraded
      "gpu 2 pcie_gen 3 5\ngpu 2 pstate 8\n"  // idle: links down-train, fine
      "gpu 3 pcie_replay 0\nat 200ms gpu 3 pcie_replay 5000\n");
  auto monitor = StartManual();
  Sleep(250);
  monitor->PollOnce();
  ExpectVerdicts(monitor->Snapshot(), {{0, Verdict::kUnhealthy, "pcie_width", Action::kHardware},
                                       {1, Verdict::kDegraded, "pcie_gen", Action::kWatch},
                                       {2, Verdict::kHealthy, nullptr},
                                       {3, Verdict::kDegraded, "pcie_replay", Action::kWatch}});
}

TEST(MonitorTest, NvLinkInactiveAndErrorCountersRising) {
  UseScenario(
      "gpus 3\n"
      "gpu 0 nvlink 3 down\n"
      "at 200ms gpu 1 nvlink_errors 2 4 1 0 0\n"  // replay and recovery rise
      "gpu 2 nvlinks 0\n");                       // no NVLink at all: not supported, not failed
  auto monitor = StartManual();
  Sleep(250);
  monitor->PollOnce();
  HealthSnapshot snap = monitor->Snapshot();
  ExpectVerdicts(snap, {{0, Verdict::kUnhealthy, "nvlink_inactive", Action::kHardware},
                        {1, Verdict::kDegraded, "nvlink_errors", Action::kWatch},
                        {2, Verdict::kHealthy, nullptr}});
  EXPECT_TRUE(snap.samples[2].nvlinks.empty());
  // Counters that stop rising clear after the policy's healthy passes.
  for (int i = 0; i < 3; ++i) monitor->PollOnce();
  EXPECT_EQ(monitor->Snapshot().verdicts[1].verdict, Verdict::kHealthy);
}

TEST(MonitorTest, DriverRecoveryAction) {
  HealthSnapshot snap = Observe(
      "gpus 4\ngpu 0 recovery_action 1\ngpu 1 recovery_action 2\ngpu 2 recovery_action 3\n"
      "gpu 3 recovery_action 4\n",
      1);
  ExpectVerdicts(snap, {{0, Verdict::kUnhealthy, "recovery_action", Action::kResetGpu},
                        {1, Verdict::kUnhealthy, "recovery_action", Action::kRebootNode},
                        {2, Verdict::kDegraded, "recovery_action", Action::kWatch},
                        {3, Verdict::kUnhealthy, "recovery_action", Action::kResetWhenIdle}});
}

TEST(MonitorTest, MigEnabledWithoutInstancesIsUnusable) {
  HealthSnapshot snap = Observe(
      "gpus 3\ngpu 0 mig_mode 1\ngpu 1 mig_mode 1\ngpu 1 mig_instances 2\ngpu 2 mig_mode 0 1\n", 1);
  ExpectVerdicts(snap, {{0, Verdict::kUnhealthy, "mig_no_instances", Action::kFixConfig},
                        {1, Verdict::kHealthy, nullptr},
                        {2, Verdict::kHealthy, nullptr}});
  EXPECT_EQ(snap.samples[1].mig_instances, 2u);
  // Row remapping is not supported while MIG is on: skipped, not failed.
  EXPECT_FALSE(snap.samples[0].remap.has_value());
  // A pending MIG change is a warning once debounced.
  HealthSnapshot later = Observe("gpus 1\ngpu 0 mig_mode 0 1\n", 2);
  ExpectVerdicts(later, {{0, Verdict::kDegraded, "mig_mode_pending", Action::kResetWhenIdle}});
}

TEST(MonitorTest, CorruptedInforomIsAWarning) {
  HealthSnapshot snap = Observe("gpus 1\ngpu 0 inforom_corrupt 1\n");
  ExpectVerdicts(snap, {{0, Verdict::kDegraded, "inforom", Action::kHardware}});
}

// Validating the InfoROM costs ~70 ms per GPU on a real H200: later passes reuse the answer until
// the interval has passed, then ask again.
TEST(MonitorTest, InforomIsRevalidatedOnlyEachInterval) {
  const char* scenario = "gpus 1\nat 100ms gpu 0 inforom_corrupt 1\n";
  UseScenario(scenario);
  MonitorOptions hourly;
  auto monitor = StartManual(hourly);
  Sleep(150);
  monitor->PollOnce();
  monitor->PollOnce();
  HealthSnapshot snap = monitor->Snapshot();
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kHealthy) << Describe(snap.verdicts[0]);
  EXPECT_EQ(snap.samples[0].inforom_valid, std::optional<bool>(true)) << "carried forward";

  UseScenario(scenario);
  MonitorOptions often;
  often.inforom_check_interval_ms = 50;
  monitor = StartManual(often);
  Sleep(150);
  monitor->PollOnce();
  monitor->PollOnce();
  ExpectVerdicts(monitor->Snapshot(), {{0, Verdict::kDegraded, "inforom", Action::kHardware}});
}

TEST(MonitorTest, UnreadableGpuIsUnknownAndNotPlaceable) {
  HealthSnapshot snap = Observe("gpus 2\ngpu 1 fail nvmlDeviceGetMemoryInfo 999\n", 1);
  EXPECT_EQ(snap.verdicts[1].verdict, Verdict::kUnknown) << Describe(snap.verdicts[1]);
  EXPECT_FALSE(Placeable(snap.verdicts[1].verdict));
  EXPECT_NE(FindReason(snap.verdicts[1], "nvml_read"), nullptr);
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kHealthy);
}

TEST(MonitorTest, NoDriverAtAllRunsWithNoGpus) {
  setenv("TAU_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  GpuMonitor monitor(MonitorOptions{});
  ASSERT_TRUE(monitor.Start().ok());
  HealthSnapshot snap = monitor.Snapshot();
  EXPECT_TRUE(snap.inventory.devices.empty());
  EXPECT_FALSE(snap.inventory.driver_loaded);
  EXPECT_NE(snap.inventory.note.find("no NVIDIA driver found"), std::string::npos);
  EXPECT_FALSE(snap.xid_events);
  EXPECT_EQ(RenderMetrics(snap), "");
  monitor.Stop();
}

TEST(MonitorTest, OlderDriverWithMissingSymbolsSkipsChecksInsteadOfFailing) {
  UseScenario("gpus 2\ngpu 0 clocks_reasons 0x40\nat 300ms gpu 1 xid 79\n", TAU_FAKE_NVML_OLD_PATH);
  auto monitor = StartManual();
  monitor->PollOnce();
  monitor->PollOnce();
  HealthSnapshot snap = monitor->Snapshot();
  const GpuSample& s = snap.samples[1];
  EXPECT_FALSE(s.remap.has_value());
  EXPECT_FALSE(s.recovery_action.has_value());
  EXPECT_FALSE(s.mig_enabled.has_value());
  EXPECT_TRUE(s.temperature_c.has_value()) << "falls back to nvmlDeviceGetTemperature";
  EXPECT_TRUE(s.clocks_event_reasons.has_value()) << "falls back to ...ThrottleReasons";
  auto has = [&](const std::string& call) {
    return std::find(s.not_supported.begin(), s.not_supported.end(), call) != s.not_supported.end();
  };
  EXPECT_TRUE(has("nvmlDeviceGetRemappedRows"));
  EXPECT_TRUE(has("nvmlDeviceGetFieldValues"));
  EXPECT_TRUE(has("nvmlDeviceGetMigMode"));
  EXPECT_EQ(snap.verdicts[1].verdict, Verdict::kHealthy) << Describe(snap.verdicts[1]);
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kDegraded) << "the old throttle name still works";
  // XID events through the unversioned nvmlEventSetWait.
  HandleEvents(*monitor, 1);
  EXPECT_EQ(monitor->Snapshot().verdicts[1].verdict, Verdict::kUnhealthy);
  std::vector<CheckResult> results = RunPassiveChecks(s, nullptr, Thresholds{});
  for (const CheckResult& r : results) {
    if (r.check == "row_remap_pending" || r.check == "recovery_action") {
      EXPECT_EQ(r.status, CheckStatus::kNotSupported) << r.check;
    }
  }
}

TEST(MonitorTest, GpusWithoutXidEventsAreStillPolled) {
  UseScenario("gpus 2\ngpu * events 0\n");
  auto monitor = StartManual();
  HealthSnapshot snap = monitor->Snapshot();
  EXPECT_FALSE(snap.samples[0].xid_events_supported);
  EXPECT_EQ(snap.verdicts[0].verdict, Verdict::kHealthy);
}

TEST(MonitorTest, StopsPromptlyWithThreads) {
  UseScenario("gpus 8\n");
  MonitorOptions options;
  options.poll_interval_ms = 20;
  options.event_wait_ms = 100;
  GpuMonitor monitor(options);
  ASSERT_TRUE(monitor.Start().ok());
  Sleep(200);
  // Snapshots from another thread while both threads run.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(monitor.Snapshot().verdicts.size(), 8u);
  int64_t before = MonotonicMillis();
  monitor.Stop();
  EXPECT_LT(MonotonicMillis() - before, 1000);
  EXPECT_GT(monitor.Snapshot().passes, 3);
}

}  // namespace
}  // namespace tau::health
