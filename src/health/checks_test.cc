// The pure checks: thresholds at their edges, not-supported handling, the XID table.
#include <gtest/gtest.h>

#include "health/health.h"

namespace tau::health {
namespace {

const CheckResult& Find(const std::vector<CheckResult>& results, const std::string& check) {
  for (const CheckResult& r : results) {
    if (r.check == check) return r;
  }
  static CheckResult none;
  ADD_FAILURE() << "no result for " << check;
  return none;
}

GpuSample Healthy() {
  GpuSample s;
  s.at_ms = 1'000'000;
  s.memory_total_bytes = 80ull << 30;
  s.memory_used_bytes = 0;
  s.temperature_c = 40;
  s.temperature_slowdown_c = 89;
  s.temperature_shutdown_c = 92;
  s.power_mw = 100'000;
  s.power_limit_mw = 700'000;
  s.power_default_limit_mw = 700'000;
  s.pstate = 0;
  s.clocks_event_reasons = 0;
  s.ecc_enabled = s.ecc_pending = true;
  s.ecc_dbe_volatile = s.ecc_sbe_volatile = s.ecc_dbe_aggregate = s.ecc_sbe_aggregate = 0;
  s.retired_pages_sbe = s.retired_pages_dbe = 0;
  s.retired_pages_pending = false;
  s.remap = RemapSample{};
  s.pcie_gen = s.pcie_gen_max = 5;
  s.pcie_width = s.pcie_width_max = 16;
  s.pcie_replay_counter = 0;
  for (unsigned l = 0; l < 4; ++l) s.nvlinks.push_back({l, true, 0, 0, 0, 0});
  s.recovery_action = 0;
  s.inforom_valid = true;
  s.mig_enabled = s.mig_pending = false;
  return s;
}

TEST(ChecksTest, HealthySampleIsAllPassAndEveryCheckNamesThresholdAndSource) {
  GpuSample s = Healthy();
  GpuSample prev = s;
  prev.at_ms -= 10'000;
  std::vector<CheckResult> results = RunPassiveChecks(s, &prev, Thresholds{});
  EXPECT_GE(results.size(), 20u);
  for (const CheckResult& r : results) {
    EXPECT_EQ(r.status, CheckStatus::kPass) << r.check << ": " << r.message;
    EXPECT_FALSE(r.threshold.empty()) << r.check;
    EXPECT_FALSE(r.source.empty()) << r.check;
  }
}

TEST(ChecksTest, EmptySampleIsNotSupportedRatherThanFailed) {
  GpuSample s;  // an old driver that answers nothing
  for (const CheckResult& r : RunPassiveChecks(s, nullptr, Thresholds{})) {
    if (r.check == "gpu_lost" || r.check == "nvml_read") {
      EXPECT_EQ(r.status, CheckStatus::kPass) << r.check;
    } else {
      EXPECT_EQ(r.status, CheckStatus::kNotSupported) << r.check;
    }
  }
}

TEST(ChecksTest, LostGpuReportsOnlyLossAndXids) {
  GpuSample s;
  s.lost = true;
  s.xids = {{79, 1}};
  std::vector<CheckResult> results = RunPassiveChecks(s, nullptr, Thresholds{});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].check, "gpu_lost");
  EXPECT_EQ(results[0].status, CheckStatus::kFail);
  EXPECT_EQ(results[1].check, "xid_79");
}

TEST(ChecksTest, TemperatureMargins) {
  GpuSample s = Healthy();
  s.temperature_c = 86;  // slowdown 89 − 2 = 87
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, {}), "temperature").status, CheckStatus::kPass);
  s.temperature_shutdown_c = 100;
  s.temperature_c = 87;
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, {}), "temperature").status, CheckStatus::kWarn);
  s.temperature_c = 95;  // shutdown 100 − 5
  const CheckResult r = Find(RunPassiveChecks(s, nullptr, {}), "temperature");
  EXPECT_EQ(r.status, CheckStatus::kFail);
  EXPECT_NE(r.message.find("95"), std::string::npos);
}

TEST(ChecksTest, OnlyHardwareThrottleReasonsCount) {
  GpuSample s = Healthy();
  for (uint64_t benign : {0x1ull, 0x2ull, 0x4ull, 0x10ull, 0x100ull}) {
    s.clocks_event_reasons = benign;
    auto results = RunPassiveChecks(s, nullptr, {});
    EXPECT_EQ(Find(results, "thermal_slowdown").status, CheckStatus::kPass) << benign;
    EXPECT_EQ(Find(results, "power_brake").status, CheckStatus::kPass) << benign;
  }
  s.clocks_event_reasons = 0xC8;
  auto results = RunPassiveChecks(s, nullptr, {});
  EXPECT_EQ(Find(results, "thermal_slowdown").status, CheckStatus::kWarn);
  EXPECT_EQ(Find(results, "thermal_slowdown").debounce, 3);
  EXPECT_EQ(Find(results, "power_brake").status, CheckStatus::kWarn);
}

TEST(ChecksTest, PcieReplayRateFollowsGenerationAndWidth) {
  GpuSample prev = Healthy();
  GpuSample now = Healthy();
  now.at_ms = prev.at_ms + 60'000;
  now.pcie_replay_counter = 31;  // Gen5 x16: ceil(1.92 × 16) = 31 per minute is allowed
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}), "pcie_replay").status, CheckStatus::kPass);
  now.pcie_replay_counter = 32;
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}), "pcie_replay").status, CheckStatus::kWarn);
  now.pcie_gen = 4;  // Gen4 x16: 16 per minute
  now.pcie_replay_counter = 17;
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}), "pcie_replay").status, CheckStatus::kWarn);
  EXPECT_EQ(Find(RunPassiveChecks(now, nullptr, {}), "pcie_replay").status,
            CheckStatus::kNotSupported)
      << "a rate needs a previous sample";
}

TEST(ChecksTest, PcieReplaysAreCountedOverAMinuteNeverExtrapolated) {
  GpuSample prev = Healthy();
  prev.pcie_gen = 4;  // Gen4 x16: 16 per minute
  GpuSample now = prev;
  now.at_ms = prev.at_ms + 10'000;
  now.pcie_replay_counter = 10;  // 10 in 10 s: not 60 per minute, 10 in the last minute
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}), "pcie_replay").status, CheckStatus::kPass);
  now.pcie_replay_counter = 17;  // at least 17 in the last minute, whatever comes next
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}), "pcie_replay").status, CheckStatus::kWarn);
  // Over a window longer than a minute, the rise per minute.
  GpuSample start = prev;
  start.at_ms = now.at_ms - 120'000;
  now.pcie_replay_counter = 32;  // 16 per minute over 2 minutes: allowed
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}, &start), "pcie_replay").status,
            CheckStatus::kPass);
  now.pcie_replay_counter = 34;
  const CheckResult warn = Find(RunPassiveChecks(now, &prev, {}, &start), "pcie_replay");
  EXPECT_EQ(warn.status, CheckStatus::kWarn);
  EXPECT_NE(warn.message.find("17 PCIe replays/min over the last 120 s"), std::string::npos)
      << warn.message;
}

TEST(ChecksTest, NvLinkCrcFailsOnlyAtASustainedRateAndAnyRiseWarns) {
  GpuSample prev = Healthy();
  GpuSample now = Healthy();
  now.at_ms = prev.at_ms + 700;
  now.nvlinks[1].crc_flit = 5000;  // a 0.7 s burst: 83/s averaged over the minute
  const CheckResult burst = Find(RunPassiveChecks(now, &prev, {}), "nvlink_errors");
  EXPECT_EQ(burst.status, CheckStatus::kWarn) << burst.message;
  // The window begins a minute back: 6000 in it is 100/s, sustained.
  GpuSample start = Healthy();
  start.at_ms = now.at_ms - 60'000;
  now.nvlinks[1].crc_flit = 5999;
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}, &start), "nvlink_errors").status,
            CheckStatus::kWarn);
  now.nvlinks[1].crc_flit = 6000;
  prev = now;  // nothing new since the last pass: the window still holds the storm
  prev.at_ms -= 10'000;
  const CheckResult fail = Find(RunPassiveChecks(now, &prev, {}, &start), "nvlink_errors");
  EXPECT_EQ(fail.status, CheckStatus::kFail);
  EXPECT_EQ(fail.action, Action::kHardware);
  EXPECT_EQ(fail.debounce, 0) << "a rate must hold for the policy's debounce";
  EXPECT_NE(fail.message.find("100/s over the last 60 s"), std::string::npos) << fail.message;
  // No rise since the last pass and a quiet window: pass.
  EXPECT_EQ(Find(RunPassiveChecks(now, &prev, {}, &prev), "nvlink_errors").status,
            CheckStatus::kPass);
  now.nvlinks[2].active = false;
  const CheckResult down = Find(RunPassiveChecks(now, &prev, {}), "nvlink_inactive");
  EXPECT_EQ(down.status, CheckStatus::kFail);
  EXPECT_NE(down.message.find("links 2"), std::string::npos) << down.message;
}

TEST(ChecksTest, RepairsPendingUntilAResetWaitForTheGpuToBeIdle) {
  GpuSample s = Healthy();
  s.remap = RemapSample{0, 0, /*pending=*/true, false};
  s.retired_pages_pending = true;
  s.recovery_action = 4;  // DRAIN_AND_RESET
  auto results = RunPassiveChecks(s, nullptr, {});
  for (const char* check : {"row_remap_pending", "retired_pages_pending", "recovery_action"}) {
    EXPECT_EQ(Find(results, check).status, CheckStatus::kFail) << check;
    EXPECT_EQ(Find(results, check).action, Action::kResetWhenIdle) << check;
  }
  s.recovery_action = 1;  // GPU_RESET: the GPU cannot go on
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, {}), "recovery_action").action, Action::kResetGpu);
}

TEST(ChecksTest, AggregateEccAndRetiredPageLimits) {
  GpuSample s = Healthy();
  s.ecc_sbe_aggregate = 20'000'000;
  s.retired_pages_sbe = 62;
  auto results = RunPassiveChecks(s, nullptr, {});
  EXPECT_EQ(Find(results, "ecc_aggregate").status, CheckStatus::kPass);
  EXPECT_EQ(Find(results, "retired_pages").status, CheckStatus::kPass);
  s.ecc_sbe_aggregate = 20'000'001;
  s.retired_pages_dbe = 1;
  results = RunPassiveChecks(s, nullptr, {});
  EXPECT_EQ(Find(results, "ecc_aggregate").status, CheckStatus::kFail);
  EXPECT_EQ(Find(results, "retired_pages").status, CheckStatus::kFail);
}

TEST(ChecksTest, ThresholdsAreConfigurable) {
  GpuSample s = Healthy();
  s.ecc_dbe_volatile = 2;
  Thresholds lenient;
  lenient.ecc_dbe_volatile_max = 2;
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, lenient), "ecc_dbe_volatile").status,
            CheckStatus::kPass);
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, {}), "ecc_dbe_volatile").status, CheckStatus::kFail);
}

TEST(ChecksTest, PcieGenerationOnlyMattersUnderLoad) {
  GpuSample s = Healthy();
  s.pcie_gen = 1;
  s.pstate = 8;
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, {}), "pcie_gen").status, CheckStatus::kPass);
  s.pstate.reset();
  s.gpu_util_pct = 90;  // no P-state: utilisation decides
  EXPECT_EQ(Find(RunPassiveChecks(s, nullptr, {}), "pcie_gen").status, CheckStatus::kWarn);
}

TEST(ChecksTest, XidTable) {
  EXPECT_EQ(ClassifyXid(13).status, CheckStatus::kInfo);
  EXPECT_EQ(ClassifyXid(45).action, Action::kRestartApp);
  EXPECT_EQ(ClassifyXid(48).action, Action::kHardware);
  EXPECT_EQ(ClassifyXid(48).clear, ClearRule::kOnReboot);
  EXPECT_EQ(ClassifyXid(62).action, Action::kResetGpu);
  EXPECT_EQ(ClassifyXid(79).action, Action::kRebootNode);
  EXPECT_EQ(ClassifyXid(79).mnemonic, "GPU_HAS_FALLEN_OFF_THE_BUS");
  EXPECT_EQ(ClassifyXid(95).clear, ClearRule::kOnGpuReset);
  EXPECT_EQ(ClassifyXid(100).status, CheckStatus::kInfo);  // engine exception range 96-105
  EXPECT_EQ(ClassifyXid(140).action, Action::kHardware);
  EXPECT_EQ(ClassifyXid(147).action, Action::kHardware);  // NVLink5 range
  EXPECT_EQ(ClassifyXid(151).action, Action::kRebootNode);
  EXPECT_EQ(ClassifyXid(160).action, Action::kRebootNode);
  EXPECT_EQ(ClassifyXid(57).action, Action::kHardware);  // legacy: drain if seen
  EXPECT_EQ(ClassifyXid(57).clear, ClearRule::kOnGpuReset);
  EXPECT_EQ(ClassifyXid(121).status, CheckStatus::kWarn);
  EXPECT_EQ(ClassifyXid(5000).status, CheckStatus::kWarn);
  for (uint64_t xid = 0; xid < 200; ++xid) EXPECT_FALSE(ClassifyXid(xid).source.empty()) << xid;
}

// Memory repair (reference gpu-health.md §5 rows 10-13, §3.1 MEM): one case per rule and per
// boundary (just below, at, just above each limit). Each case runs the checks, feeds them to a
// VerdictTracker once, and says which verdict follows and whether the running work is stopped.
constexpr int64_t kNow = 1'800'000'000'000;  // ms, a wall clock in 2027
constexpr int64_t kDay = 86'400'000;

struct RepairCase {
  const char* name;
  void (*set)(GpuSample&);
  const char* check;
  CheckStatus status;
  Action action;            // of the check, when it fails
  Verdict verdict;          // of the GPU after one observation
  bool stops_running_work;  // StopsRunningWork for that verdict
  const char* says;         // part of the reason's message; nullptr when the check passes
};

// DBE retirements: `recent` of them within the last week, the rest a month ago.
void DbePages(GpuSample& s, unsigned count, unsigned recent) {
  s.retired_pages_dbe = count;
  std::vector<int64_t> at;
  for (unsigned i = 0; i < count; ++i) at.push_back(i < recent ? kNow - kDay : kNow - 30 * kDay);
  s.retired_pages_dbe_at_ms = at;
}

const RepairCase kRepairCases[] = {
    // Row remapping pending (§5 row 10): RESET at the next idle, never a replacement.
    {"remap not pending", [](GpuSample&) {}, "row_remap_pending", CheckStatus::kPass,
     Action::kResetWhenIdle, Verdict::kHealthy, false, nullptr},
    {"remap pending",
     [](GpuSample& s) {
       s.remap = RemapSample{3, 1, /*pending=*/true, false};
     },
     "row_remap_pending", CheckStatus::kFail, Action::kResetWhenIdle, Verdict::kUnhealthy, false,
     "row remapping pending (1 row remapped for uncorrectable errors, 3 for correctable): reset "
     "the GPU to apply it; work is kept off it until then"},
    // Row remapping failure (§5 row 11): hardware.
    {"remap failed",
     [](GpuSample& s) {
       s.remap = RemapSample{0, 0, false, /*failed=*/true};
     },
     "row_remap_failure", CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "row remapping failed (0 rows remapped for uncorrectable errors, 0 for correctable): the GPU "
     "has memory it cannot repair; work is taken off the GPU now and it stays out until it is "
     "replaced"},
    {"remap failed while one is pending: a reset does not help",
     [](GpuSample& s) {
       s.remap = RemapSample{0, 0, true, true};
     },
     "row_remap_failure", CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "row remapping failed"},
    // Uncorrectable remapped rows (§5 row 12): ≥ 512 → hardware.
    {"511 uncorrectable rows",
     [](GpuSample& s) {
       s.remap = RemapSample{0, 511, false, false};
     },
     "row_remap_uncorrectable", CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false,
     nullptr},
    {"512 uncorrectable rows",
     [](GpuSample& s) {
       s.remap = RemapSample{0, 512, false, false};
     },
     "row_remap_uncorrectable", CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "512 rows remapped for uncorrectable errors, at or above the limit of 512: work is taken off "
     "the GPU now"},
    {"513 uncorrectable rows",
     [](GpuSample& s) {
       s.remap = RemapSample{0, 513, false, false};
     },
     "row_remap_uncorrectable", CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "513 rows remapped for uncorrectable errors"},
    // Correctable remapped rows: no source sets a limit, so none counts.
    {"512 correctable rows",
     [](GpuSample& s) {
       s.remap = RemapSample{512, 0, false, false};
     },
     "row_remap_uncorrectable", CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false,
     nullptr},
    {"100000 correctable rows",
     [](GpuSample& s) {
       s.remap = RemapSample{100'000, 0, false, false};
     },
     "row_remap_uncorrectable", CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false,
     nullptr},
    // Retired pages, SBE + DBE (§5 row 13, DCGM_LIMIT_MAX_RETIRED_PAGES): ≥ 63 → hardware.
    {"62 retired pages", [](GpuSample& s) { s.retired_pages_sbe = 62; }, "retired_pages",
     CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false, nullptr},
    {"63 retired pages",
     [](GpuSample& s) {
       s.retired_pages_sbe = 62;
       s.retired_pages_dbe = 1;
     },
     "retired_pages", CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "63 retired pages (62 for repeated single-bit errors, 1 for double-bit errors), at or above "
     "the limit of 63: work is taken off the GPU now and it stays out until it is replaced"},
    {"64 retired pages", [](GpuSample& s) { s.retired_pages_sbe = 64; }, "retired_pages",
     CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true, "64 retired pages"},
    // DBE retired pages (§5 row 13, DCGM soft limit): > 15 and > 1 of them in the last 7 days.
    {"15 DBE pages, 2 this week", [](GpuSample& s) { DbePages(s, 15, 2); }, "retired_pages_dbe",
     CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false, nullptr},
    {"16 DBE pages, 2 this week", [](GpuSample& s) { DbePages(s, 16, 2); }, "retired_pages_dbe",
     CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "16 pages retired for double-bit errors (soft limit 15), 2 of them in the last 7 days: work "
     "is taken off the GPU now"},
    {"17 DBE pages, 2 this week", [](GpuSample& s) { DbePages(s, 17, 2); }, "retired_pages_dbe",
     CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true, "17 pages retired"},
    {"16 DBE pages, 1 this week", [](GpuSample& s) { DbePages(s, 16, 1); }, "retired_pages_dbe",
     CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false, nullptr},
    {"16 DBE pages, the 2nd recent one exactly 7 days old",
     [](GpuSample& s) {
       DbePages(s, 16, 1);
       s.retired_pages_dbe_at_ms->back() = kNow - 7 * kDay;
     },
     "retired_pages_dbe", CheckStatus::kPass, Action::kHardware, Verdict::kHealthy, false, nullptr},
    {"16 DBE pages, the 2nd recent one 7 days less 1 ms old",
     [](GpuSample& s) {
       DbePages(s, 16, 1);
       s.retired_pages_dbe_at_ms->back() = kNow - 7 * kDay + 1;
     },
     "retired_pages_dbe", CheckStatus::kFail, Action::kHardware, Verdict::kUnhealthy, true,
     "2 of them in the last 7 days"},
    {"16 DBE pages, no retirement times",
     [](GpuSample& s) {
       s.retired_pages_dbe = 16;
       s.retired_pages_dbe_at_ms.reset();
     },
     "retired_pages_dbe", CheckStatus::kNotSupported, Action::kHardware, Verdict::kHealthy, false,
     nullptr},
    // Pending page retirement (§5 row 13): RESET at the next idle (DCGM only warns).
    {"retirement pending", [](GpuSample& s) { s.retired_pages_pending = true; },
     "retired_pages_pending", CheckStatus::kFail, Action::kResetWhenIdle, Verdict::kUnhealthy,
     false,
     "page retirement pending: reset the GPU to apply it; work is kept off it until then "
     "(running work finishes)"},
    // A GPU answers one repair mechanism: the other one's checks are skipped, not passed.
    {"Ampere+: page retirement not supported",
     [](GpuSample& s) {
       s.retired_pages_sbe.reset();
       s.retired_pages_dbe.reset();
       s.retired_pages_pending.reset();
       s.remap = RemapSample{0, 512, false, false};
     },
     "retired_pages", CheckStatus::kNotSupported, Action::kHardware, Verdict::kUnhealthy, true,
     nullptr},
    {"pre-Ampere (or MIG on): row remapping not supported",
     [](GpuSample& s) {
       s.remap.reset();
       s.retired_pages_sbe = 63;
     },
     "row_remap_uncorrectable", CheckStatus::kNotSupported, Action::kHardware, Verdict::kUnhealthy,
     true, nullptr},
};

TEST(ChecksTest, MemoryRepairRulesFollowTheReference) {
  for (const RepairCase& c : kRepairCases) {
    SCOPED_TRACE(c.name);
    GpuSample s = Healthy();
    s.at_ms = kNow;
    s.retired_pages_dbe_at_ms.emplace();
    c.set(s);
    std::vector<CheckResult> results = RunPassiveChecks(s, nullptr, {});
    const CheckResult& r = Find(results, c.check);
    EXPECT_EQ(r.status, c.status) << r.message;
    EXPECT_EQ(r.action, c.action);
    EXPECT_EQ(r.debounce, 1);  // latched driver facts count at once
    if (c.says) {
      EXPECT_NE(r.message.find(c.says), std::string::npos) << r.message;
    } else {
      EXPECT_TRUE(r.message.empty()) << r.message;
    }
    VerdictTracker tracker;
    tracker.Observe(0, kNow, results);
    GpuVerdict v = tracker.Get(0);
    EXPECT_EQ(v.verdict, c.verdict) << VerdictName(v.verdict);
    EXPECT_EQ(StopsRunningWork(v.verdict, v.reasons), c.stops_running_work);
  }
}

// A pending repair clears after a reset; a replacement verdict survives it.
TEST(ChecksTest, ResetAppliesPendingRepairsButNeverClearsAReplacement) {
  GpuSample s = Healthy();
  s.remap = RemapSample{0, 0, /*pending=*/true, false};
  VerdictTracker tracker;
  tracker.Observe(0, kNow, RunPassiveChecks(s, nullptr, {}));
  EXPECT_EQ(tracker.Get(0).verdict, Verdict::kUnhealthy);
  tracker.ClearAfterReset(0, kNow + 1);
  s.remap->pending = false;  // the reset applied the remap
  tracker.Observe(0, kNow + 2, RunPassiveChecks(s, nullptr, {}));
  EXPECT_EQ(tracker.Get(0).verdict, Verdict::kHealthy);

  s.remap = RemapSample{0, 512, false, true};
  tracker.Observe(0, kNow + 3, RunPassiveChecks(s, nullptr, {}));
  tracker.ClearAfterReset(0, kNow + 4);
  // Even where the next pass cannot read the counters (MIG turned on), the failure stays.
  s.remap.reset();
  tracker.Observe(0, kNow + 5, RunPassiveChecks(s, nullptr, {}));
  GpuVerdict v = tracker.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kUnhealthy);
  EXPECT_TRUE(StopsRunningWork(v.verdict, v.reasons));
}

}  // namespace
}  // namespace tau::health
