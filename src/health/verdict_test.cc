// VerdictTracker's rules with fake timestamps: debouncing, clear rules, escalation, precedence.
#include <gtest/gtest.h>

#include "health/health.h"

namespace tau::health {
namespace {

CheckResult Result(const std::string& check, CheckStatus status,
                   ClearRule clear = ClearRule::kAfterHealthyObservations, int debounce = 0) {
  CheckResult r;
  r.check = check;
  r.status = status;
  r.clear = clear;
  r.debounce = debounce;
  r.action = status == CheckStatus::kFail ? Action::kHardware : Action::kWatch;
  r.message = check + " " + CheckStatusName(status);
  r.threshold = "t";
  r.source = "s";
  return r;
}

CheckResult Xid(uint64_t xid) { return CheckXids(0, {XidEvent{xid, 0}}).at(0); }

constexpr int64_t kT0 = 1'700'000'000'000;
constexpr int64_t kStep = 10'000;  // a 10 s polling interval

TEST(VerdictTest, UnobservedGpuIsUnknown) {
  VerdictTracker t;
  GpuVerdict v = t.Get(3);
  EXPECT_EQ(v.verdict, Verdict::kUnknown);
  ASSERT_EQ(v.reasons.size(), 1u);
  EXPECT_EQ(v.reasons[0].check, "observed");
  EXPECT_FALSE(Placeable(v.verdict));
}

TEST(VerdictTest, OnlyAnUnhealthyGpuStopsRunningWorkAndNotForARepairPendingUntilIdle) {
  VerdictTracker t;
  // A read that failed: Unknown keeps new work off, and leaves what runs alone.
  t.Observe(0, kT0, {Result("nvml_read", CheckStatus::kError, {}, 1)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kUnknown);
  EXPECT_FALSE(StopsRunningWork(t.Get(0).verdict, t.Get(0).reasons));
  // A row remap pending: Unhealthy (not placeable), yet the running job finishes.
  CheckResult remap = Result("row_remap_pending", CheckStatus::kFail, ClearRule::kOnGpuReset, 1);
  remap.action = Action::kResetWhenIdle;
  t.Observe(1, kT0, {remap});
  EXPECT_EQ(t.Get(1).verdict, Verdict::kUnhealthy);
  EXPECT_FALSE(Placeable(t.Get(1).verdict));
  EXPECT_FALSE(StopsRunningWork(t.Get(1).verdict, t.Get(1).reasons));
  // The GPU falling off the bus as well: now it must stop.
  t.Observe(1, kT0 + kStep,
            {remap, Result("gpu_lost", CheckStatus::kFail, ClearRule::kOnReboot, 1)});
  EXPECT_TRUE(StopsRunningWork(t.Get(1).verdict, t.Get(1).reasons));
  EXPECT_FALSE(StopsRunningWork(Verdict::kDegraded, t.Get(1).reasons));
}

TEST(VerdictTest, FirstObservationReportsAChange) {
  VerdictTracker t;
  auto change = t.Observe(0, kT0, {Result("temperature", CheckStatus::kPass)});
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->old_verdict, Verdict::kUnknown);
  EXPECT_EQ(change->new_verdict, Verdict::kHealthy);
  EXPECT_FALSE(t.Observe(0, kT0 + kStep, {}).has_value());
  EXPECT_EQ(t.Get(0).since_ms, kT0);
}

TEST(VerdictTest, PolledFailureNeedsConsecutiveObservations) {
  VerdictTracker t;  // debounce 2
  t.Observe(0, kT0, {Result("pcie_width", CheckStatus::kFail)});
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kHealthy);
  ASSERT_EQ(v.pending.size(), 1u);
  auto change = t.Observe(0, kT0 + kStep, {Result("pcie_width", CheckStatus::kFail)});
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->new_verdict, Verdict::kUnhealthy);
  ASSERT_EQ(change->reasons.size(), 1u);
  EXPECT_EQ(change->reasons[0].first_seen_ms, kT0)
      << "first seen is the first failure, not debounced";
  EXPECT_EQ(change->reasons[0].active_since_ms, kT0 + kStep);
  EXPECT_EQ(change->reasons[0].count, 2);
}

TEST(VerdictTest, SingleFailureFollowedByAPassIsForgotten) {
  VerdictTracker t;
  t.Observe(0, kT0, {Result("pcie_width", CheckStatus::kFail)});
  t.Observe(0, kT0 + kStep, {Result("pcie_width", CheckStatus::kPass)});
  t.Observe(0, kT0 + 2 * kStep, {Result("pcie_width", CheckStatus::kFail)});
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kHealthy);
  ASSERT_EQ(v.pending.size(), 1u);
  EXPECT_EQ(v.pending[0].first_seen_ms, kT0 + 2 * kStep);
}

TEST(VerdictTest, EventsCountAtOnce) {
  VerdictTracker t;
  t.Observe(0, kT0, {});
  auto change = t.Observe(0, kT0 + 5, {Xid(79)});
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->new_verdict, Verdict::kUnhealthy);
}

TEST(VerdictTest, TransientConditionClearsAfterHealthyObservations) {
  VerdictTracker t;  // clear after 3
  t.Observe(0, kT0, {Result("temperature", CheckStatus::kWarn)});
  t.Observe(0, kT0 + kStep, {Result("temperature", CheckStatus::kWarn)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  for (int i = 2; i < 4; ++i) {
    t.Observe(0, kT0 + i * kStep, {Result("temperature", CheckStatus::kPass)});
    EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded) << "pass " << i - 1;
  }
  // A relapse restarts the count.
  t.Observe(0, kT0 + 4 * kStep, {Result("temperature", CheckStatus::kWarn)});
  for (int i = 5; i < 7; ++i)
    t.Observe(0, kT0 + i * kStep, {Result("temperature", CheckStatus::kPass)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  auto change = t.Observe(0, kT0 + 7 * kStep, {Result("temperature", CheckStatus::kPass)});
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->new_verdict, Verdict::kHealthy);
}

TEST(VerdictTest, ResetRequiredConditionIgnoresPassesUntilAReset) {
  VerdictTracker t;
  t.Observe(0, kT0, {Result("row_remap_pending", CheckStatus::kFail, ClearRule::kOnGpuReset, 1)});
  for (int i = 1; i < 10; ++i) {
    t.Observe(0, kT0 + i * kStep,
              {Result("row_remap_pending", CheckStatus::kPass, ClearRule::kOnGpuReset, 1)});
  }
  EXPECT_EQ(t.Get(0).verdict, Verdict::kUnhealthy);
  auto change = t.ClearAfterReset(0, kT0 + 10 * kStep);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->new_verdict, Verdict::kUnknown) << "re-checked before it is placed again";
  t.Observe(0, kT0 + 11 * kStep, {Result("row_remap_pending", CheckStatus::kPass)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
}

TEST(VerdictTest, RebootConditionSurvivesAResetButNotAnOperator) {
  VerdictTracker t;
  t.Observe(0, kT0, {Xid(79), Xid(95)});
  t.ClearAfterReset(0, kT0 + kStep);
  t.Observe(0, kT0 + 2 * kStep, {});
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kUnhealthy);
  ASSERT_EQ(v.reasons.size(), 1u);
  EXPECT_EQ(v.reasons[0].check, "xid_79") << "XID 95 (reset) cleared, XID 79 (reboot) stays";
  t.ClearAll(0, kT0 + 3 * kStep);
  t.Observe(0, kT0 + 4 * kStep, {});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
}

TEST(VerdictTest, EventWarningClearsAfterAQuietPeriod) {
  VerdictPolicy policy;
  policy.quiet_period_ms = 60'000;
  VerdictTracker t(policy);
  t.Observe(0, kT0, {Xid(63)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  t.Observe(0, kT0 + 30'000, {Xid(63)});  // recurrence restarts the hold
  t.Observe(0, kT0 + 80'000, {});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  t.Observe(0, kT0 + 90'000, {});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
}

TEST(VerdictTest, LongThrottlingEscalatesToUnhealthy) {
  Thresholds th;
  GpuSample s;
  s.clocks_event_reasons = 0x40;
  VerdictTracker t;
  int64_t now = kT0;
  for (int i = 0; i < 3; ++i, now += kStep) t.Observe(0, now, RunPassiveChecks(s, nullptr, th));
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  // 10 minutes after it became active.
  for (; now < kT0 + 2 * kStep + th.throttle_unhealthy_after_ms; now += kStep) {
    t.Observe(0, now, RunPassiveChecks(s, nullptr, th));
    EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  }
  t.Observe(0, now, RunPassiveChecks(s, nullptr, th));
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kUnhealthy);
  EXPECT_NE(v.reasons[0].message.find("more than 10 min"), std::string::npos)
      << v.reasons[0].message;
  // Throttling that stops clears like any transient condition.
  s.clocks_event_reasons = 0;
  for (int i = 1; i <= 3; ++i) t.Observe(0, now + i * kStep, RunPassiveChecks(s, nullptr, th));
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
}

TEST(VerdictTest, ErrorMeansUnknownAndClearsAtTheFirstGoodReading) {
  VerdictTracker t;
  t.Observe(0, kT0,
            {Result("nvml_read", CheckStatus::kError, ClearRule::kAfterHealthyObservations, 1)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kUnknown);
  t.Observe(0, kT0 + kStep, {Result("nvml_read", CheckStatus::kPass)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
}

TEST(VerdictTest, PrecedenceUnhealthyOverUnknownOverDegraded) {
  VerdictTracker t;
  t.Observe(0, kT0, {Result("a", CheckStatus::kWarn, ClearRule::kAfterHealthyObservations, 1)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  t.Observe(0, kT0 + 1,
            {Result("b", CheckStatus::kError, ClearRule::kAfterHealthyObservations, 1)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kUnknown);
  t.Observe(0, kT0 + 2, {Result("c", CheckStatus::kFail, ClearRule::kAfterHealthyObservations, 1)});
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kUnhealthy);
  ASSERT_EQ(v.reasons.size(), 3u);
  EXPECT_EQ(v.reasons[0].check, "c") << "worst first";
  EXPECT_EQ(v.reasons[2].check, "a");
}

TEST(VerdictTest, StickyConditionKeepsItsWorstStatus) {
  VerdictTracker t;
  t.Observe(0, kT0, {Result("recovery_action", CheckStatus::kFail, ClearRule::kOnGpuReset, 1)});
  t.Observe(
      0, kT0 + kStep,
      {Result("recovery_action", CheckStatus::kWarn, ClearRule::kAfterHealthyObservations, 1)});
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kUnhealthy);
  EXPECT_EQ(v.reasons[0].clear, ClearRule::kOnGpuReset);
}

TEST(VerdictTest, NotSupportedIsNoObservation) {
  VerdictTracker t;
  t.Observe(0, kT0, {Result("remap", CheckStatus::kFail, ClearRule::kAfterHealthyObservations, 1)});
  for (int i = 1; i < 5; ++i)
    t.Observe(0, kT0 + i * kStep, {Result("remap", CheckStatus::kNotSupported)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kUnhealthy);
}

TEST(VerdictTest, ApplicationXidsRecordButOnlyRepeatsCount) {
  VerdictTracker t;
  t.Observe(0, kT0, {Xid(13)});
  t.Observe(0, kT0 + 1, {Xid(31)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
  EXPECT_EQ(t.Get(0).recent_xids.size(), 2u);
  t.Observe(0, kT0 + 2, {Xid(43)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kDegraded);
  // Outside the 24 h window they age out, and the warning clears after its quiet period.
  t.Observe(0, kT0 + 25LL * 3600 * 1000, {});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
  EXPECT_TRUE(t.Get(0).recent_xids.empty());
}

TEST(VerdictTest, RepeatedXid109IsAReset) {
  VerdictTracker t;
  t.Observe(0, kT0, {Xid(109)});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
  t.Observe(0, kT0 + 3600'000, {Xid(109)});
  GpuVerdict v = t.Get(0);
  EXPECT_EQ(v.verdict, Verdict::kUnhealthy);
  EXPECT_EQ(v.reasons[0].check, "xid_109_repeated");
  EXPECT_EQ(v.reasons[0].action, Action::kResetGpu);
  t.ClearAfterReset(0, kT0 + 3700'000);
  t.Observe(0, kT0 + 3800'000, {});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kHealthy);
}

TEST(VerdictTest, GpusAreIndependent) {
  VerdictTracker t;
  t.Observe(0, kT0, {Xid(79)});
  t.Observe(1, kT0, {});
  EXPECT_EQ(t.Get(0).verdict, Verdict::kUnhealthy);
  EXPECT_EQ(t.Get(1).verdict, Verdict::kHealthy);
  EXPECT_EQ(t.All().size(), 2u);
}

}  // namespace
}  // namespace tau::health
