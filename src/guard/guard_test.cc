#include "guard/guard.h"

#include <gtest/gtest.h>

namespace tau::guard {
namespace {

constexpr int64_t kMin = 60'000;

std::vector<Action> Actions(const std::vector<Step>& steps) {
  std::vector<Action> out;
  for (const Step& s : steps) out.push_back(s.action);
  return out;
}

policy::IdleLimit Idle(int64_t warn, std::optional<int64_t> stop, int below = 5) {
  policy::IdleLimit l;
  l.gpu_util_below_pct = below;
  l.warn_after_ms = warn;
  l.stop_after_ms = stop;
  return l;
}

TEST(GuardTest, IdleGpusAreWarnedThenStoppedOnce) {
  const policy::IdleLimit idle = Idle(30 * kMin, 60 * kMin);
  Watch w(1, 0);
  for (int64_t t = 0; t <= 29 * kMin; t += kMin) {
    w.Utilisation(t, 2, idle);
    EXPECT_TRUE(w.Check(&idle, nullptr, t).empty()) << t;
  }
  w.Utilisation(30 * kMin, 4.9, idle);
  std::vector<Step> warn = w.Check(&idle, nullptr, 30 * kMin);
  ASSERT_EQ(Actions(warn), std::vector<Action>{Action::kIdleWarn});
  EXPECT_EQ(warn[0].since_ms, 0);
  EXPECT_TRUE(w.Check(&idle, nullptr, 45 * kMin).empty());  // said once
  EXPECT_EQ(Actions(w.Check(&idle, nullptr, 60 * kMin)), std::vector<Action>{Action::kIdleStop});
  EXPECT_TRUE(w.Check(&idle, nullptr, 61 * kMin).empty());
}

TEST(GuardTest, ABusyGpuEndsTheIdleStretchAndTheNextStretchStartsOver) {
  const policy::IdleLimit idle = Idle(10 * kMin, std::nullopt, 20);
  Watch w(1, 0);
  w.Utilisation(0, 0, idle);
  EXPECT_EQ(Actions(w.Check(&idle, nullptr, 10 * kMin)), std::vector<Action>{Action::kIdleWarn});
  w.Utilisation(11 * kMin, 20, idle);  // at the threshold is busy
  EXPECT_FALSE(w.idle_since());
  EXPECT_EQ(Actions(w.Check(&idle, nullptr, 11 * kMin)), std::vector<Action>{Action::kIdleCleared});
  w.Utilisation(12 * kMin, 3, idle);
  EXPECT_TRUE(w.Check(&idle, nullptr, 21 * kMin).empty());  // 9 minutes idle
  std::vector<Step> again = w.Check(&idle, nullptr, 22 * kMin);
  ASSERT_EQ(Actions(again), std::vector<Action>{Action::kIdleWarn});
  EXPECT_EQ(again[0].since_ms, 12 * kMin);
  // Without a stop_after it is never stopped.
  EXPECT_TRUE(w.Check(&idle, nullptr, 1000 * kMin).empty());
}

TEST(GuardTest, NoSamplesNoIdleness) {
  // A run whose GPUs are not sampled (none held, or the monitor cannot read them) is never idle.
  const policy::IdleLimit idle = Idle(kMin, kMin);
  Watch w(1, 0);
  EXPECT_TRUE(w.Check(&idle, nullptr, 100 * kMin).empty());
}

TEST(GuardTest, QuietOutputStallsThenStopsAndGrowthClearsIt) {
  policy::StallLimit stall;
  stall.after_ms = 10 * kMin;
  stall.stop_after_ms = 20 * kMin;
  Watch w(2, 5 * kMin);
  w.Output(5 * kMin, 0);  // a baseline: nothing written yet
  w.Output(6 * kMin, 0);
  EXPECT_TRUE(w.Check(nullptr, &stall, 14 * kMin).empty());
  std::vector<Step> stalled = w.Check(nullptr, &stall, 15 * kMin);
  ASSERT_EQ(Actions(stalled), std::vector<Action>{Action::kStalled});
  EXPECT_EQ(stalled[0].since_ms, 5 * kMin);  // quiet since the attempt started
  w.Output(16 * kMin, 120);
  EXPECT_EQ(Actions(w.Check(nullptr, &stall, 16 * kMin)),
            std::vector<Action>{Action::kStallCleared});
  w.Output(17 * kMin, 120);
  EXPECT_EQ(Actions(w.Check(nullptr, &stall, 36 * kMin)),
            (std::vector<Action>{Action::kStalled, Action::kStallStop}));
  EXPECT_TRUE(w.Check(nullptr, &stall, 40 * kMin).empty());
}

TEST(GuardTest, TheStackDumpItselfIsNoProgress) {
  policy::StallLimit stall;
  stall.after_ms = 10 * kMin;
  stall.stop_after_ms = 20 * kMin;
  Watch w(1, 0);
  w.Output(0, 100);
  ASSERT_EQ(Actions(w.Check(nullptr, &stall, 10 * kMin)), std::vector<Action>{Action::kStalled});
  w.StacksDumped(10 * kMin);
  w.Output(10 * kMin + 1000, 2100);  // the dump, as the log pump writes it
  w.Output(10 * kMin + Watch::kDumpSettleMs, 4100);
  EXPECT_EQ(w.quiet_since(), 0);
  EXPECT_EQ(Actions(w.Check(nullptr, &stall, 20 * kMin)), std::vector<Action>{Action::kStallStop});
  // Output after the dump has settled is progress again.
  w.Output(21 * kMin, 4200);
  EXPECT_EQ(Actions(w.Check(nullptr, &stall, 21 * kMin)),
            std::vector<Action>{Action::kStallCleared});
}

TEST(GuardTest, OutputWrittenBeforeTheFirstReadingIsProgress) {
  policy::StallLimit stall;
  stall.after_ms = 10 * kMin;
  Watch w(1, 0);
  w.Output(9 * kMin, 4096);
  EXPECT_EQ(w.quiet_since(), 9 * kMin);
  EXPECT_TRUE(w.Check(nullptr, &stall, 18 * kMin).empty());
  EXPECT_EQ(Actions(w.Check(nullptr, &stall, 19 * kMin)), std::vector<Action>{Action::kStalled});
}

TEST(GuardTest, GuardrailsThatAreOffSayNothing) {
  Watch w(1, 0);
  w.Utilisation(0, 0, Idle(kMin, kMin));
  EXPECT_TRUE(w.Check(nullptr, nullptr, 1000 * kMin).empty());
}

}  // namespace
}  // namespace tau::guard
