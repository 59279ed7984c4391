#include "budget/budget.h"

#include <gtest/gtest.h>

#include "common/clock.h"

namespace tau::budget {
namespace {

constexpr int64_t kHour = 3'600'000;

int64_t At(const char* rfc3339) {
  auto t = ParseRfc3339(rfc3339);
  EXPECT_TRUE(t.ok()) << rfc3339;
  return t.ok() ? *t : 0;
}

policy::Budget Workspace(const std::string& name, double gpu_hours, const std::string& period) {
  policy::Budget b;
  b.workspace = name;
  b.gpu_hours = gpu_hours;
  b.period = period;
  return b;
}

Holding Held(const std::string& user, int64_t gpus, int64_t start, int64_t end,
             const std::string& workspace = "vision", const std::string& queue = "gpu") {
  return Holding{workspace, user, queue, gpus, 0, start, end, "run", "", ""};
}

TEST(BudgetTest, CalendarPeriodsAreUtcDaysMondayWeeksAndMonths) {
  const int64_t now = At("2026-12-06T15:04:05Z");  // a Sunday
  policy::Budget b = Workspace("vision", 1, "month");
  EXPECT_EQ(WindowStart(b, now), At("2026-12-01T00:00:00Z"));
  EXPECT_EQ(ResetAt(b, now), At("2027-01-01T00:00:00Z"));
  b.period = "week";
  EXPECT_EQ(WindowStart(b, now), At("2026-11-30T00:00:00Z"));
  EXPECT_EQ(ResetAt(b, now), At("2026-12-07T00:00:00Z"));
  b.period = "day";
  EXPECT_EQ(WindowStart(b, now), At("2026-12-06T00:00:00Z"));
  b.period = "month";
  EXPECT_EQ(WindowStart(b, At("2024-02-29T23:59:59Z")), At("2024-02-01T00:00:00Z"));
  EXPECT_EQ(ResetAt(b, At("2024-02-29T23:59:59Z")), At("2024-03-01T00:00:00Z"));
  b.period = "";
  b.window_ms = 30 * 24 * kHour;
  EXPECT_EQ(WindowStart(b, now), At("2026-11-06T15:00:00Z")) << "from the start of its hour";
  EXPECT_EQ(ResetAt(b, now), 0);
}

TEST(BudgetTest, TheLedgerSplitsAHoldingIntoItsHoursExactly) {
  Ledger ledger;
  // 2 GPUs from 10:30 to 12:15: 1.5 h + 2 h + 0.5 h of GPU time in three hours.
  ledger.Add(Held("alice", 2, At("2026-12-06T10:30:00Z"), At("2026-12-06T12:15:00Z")));
  EXPECT_EQ(ledger.hours(), 3u);
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "", "", At("2026-12-06T00:00:00Z")).gpu_hours, 3.5);
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "", "", At("2026-12-06T11:00:00Z")).gpu_hours, 2.5);
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "bob", "", 0).gpu_hours, 0);
  EXPECT_DOUBLE_EQ(ledger.Used("", "", "gpu", 0).gpu_hours, 3.5);
  EXPECT_DOUBLE_EQ(ledger.Used("other", "", "", 0).gpu_hours, 0);
  ledger.Prune(At("2026-12-06T12:00:00Z"));
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "", "", 0).gpu_hours, 0.5);
}

TEST(BudgetTest, ASpentBudgetHoldsRunsOfItsScopeWithWhyAndWhen) {
  std::vector<policy::Budget> budgets = {Workspace("vision", 0.01, "month")};
  Ledger ledger;
  const int64_t now = At("2026-12-06T15:00:00Z");
  // 30 s ended and 10 s still held: 40 GPU-seconds, more than 36.
  ledger.Add(Held("alice", 1, now - 60'000, now - 30'000));
  Checker held(budgets, ledger, {Held("alice", 1, now - 10'000, 0)}, now);
  EXPECT_EQ(held.Hold("vision", "bob", "gpu"),
            "budget of workspace vision spent: 0.0111 of 0.0100 GPU-h this month; resets in 25d");
  EXPECT_EQ(held.Hold("other", "bob", "gpu"), "") << "another workspace's budget";
  // Without the open holding it is not spent yet, but past its warning share (0.8).
  Checker warned(budgets, ledger, {}, now);
  EXPECT_EQ(warned.Hold("vision", "bob", "gpu"), "");
  const State& s = warned.StateOf(budgets[0], "");
  EXPECT_TRUE(s.warn);
  EXPECT_FALSE(s.spent);
  EXPECT_NEAR(*s.GpuHoursLeft(), 0.01 - 30.0 / 3600, 1e-12);
}

TEST(BudgetTest, APeriodsBudgetIsWholeAgainWhenTheNextPeriodStarts) {
  std::vector<policy::Budget> budgets = {Workspace("vision", 1, "day")};
  Ledger ledger;
  ledger.Add(Held("alice", 4, At("2026-12-06T20:00:00Z"), At("2026-12-06T21:00:00Z")));
  EXPECT_NE(Checker(budgets, ledger, {}, At("2026-12-06T23:59:59Z")).Hold("vision", "a", "gpu"),
            "");
  EXPECT_EQ(Checker(budgets, ledger, {}, At("2026-12-07T00:00:00Z")).Hold("vision", "a", "gpu"),
            "");
  // A holding open across midnight counts only its part in the new day.
  Checker c(budgets, ledger, {Held("alice", 4, At("2026-12-06T23:00:00Z"), 0)},
            At("2026-12-07T00:14:00Z"));
  EXPECT_EQ(c.Hold("vision", "a", "gpu"), "");
  EXPECT_NEAR(c.StateOf(budgets[0], "").used.gpu_hours, 4 * 14.0 / 60, 1e-9);
}

TEST(BudgetTest, ARollingWindowFreesRoomAsOldUseLeavesIt) {
  policy::Budget b = Workspace("vision", 2, "");
  b.window_ms = 24 * kHour;
  std::vector<policy::Budget> budgets = {b};
  Ledger ledger;
  ledger.Add(Held("alice", 2, At("2026-12-05T10:00:00Z"), At("2026-12-05T11:00:00Z")));
  Checker during(budgets, ledger, {}, At("2026-12-06T09:30:00Z"));
  EXPECT_EQ(during.Hold("vision", "a", "gpu"),
            "budget of workspace vision spent: 2.0 of 2.0 GPU-h in the last 1d; room comes back "
            "as older use leaves the window");
  EXPECT_EQ(Checker(budgets, ledger, {}, At("2026-12-06T11:00:00Z")).Hold("vision", "a", "gpu"),
            "");
}

TEST(BudgetTest, APerUserBudgetCountsEachUserAlone) {
  policy::Budget b = Workspace("vision", 1, "week");
  b.user = "*";
  policy::Budget q;
  q.queue = "gpu";
  q.cpu_hours = 100;
  q.period = "month";
  std::vector<policy::Budget> budgets = {b, q};
  Ledger ledger;
  const int64_t now = At("2026-12-06T12:00:00Z");
  ledger.Add(Held("alice", 1, now - 2 * kHour, now - kHour));
  Checker c(budgets, ledger, {Held("bob", 1, now - 1800'000, 0)}, now);
  EXPECT_EQ(c.Hold("vision", "alice", "gpu"),
            "budget of user alice in workspace vision spent: 1.0 of 1.0 GPU-h this week; resets "
            "in 12h");
  EXPECT_EQ(c.Hold("vision", "bob", "gpu"), "");
  std::vector<State> all = c.All();
  ASSERT_EQ(all.size(), 3u);  // alice's, bob's, the queue's
  EXPECT_EQ(all[0].scope, "user alice in workspace vision");
  EXPECT_EQ(all[1].scope, "user bob in workspace vision");
  EXPECT_DOUBLE_EQ(all[1].used.gpu_hours, 0.5);
  EXPECT_EQ(all[2].scope, "queue gpu");
  EXPECT_EQ(c.Covering("vision", "carol", "cpu").size(), 1u);
}

TEST(BudgetTest, WhatWasAskedBeforeStaysRightAsHoldingsAreAdded) {
  Ledger ledger;
  const int64_t from = At("2026-12-06T10:00:00Z");
  ledger.Add(Held("alice", 1, from, from + kHour));
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "", "", from).gpu_hours, 1);  // now remembered
  EXPECT_DOUBLE_EQ(ledger.Used("", "", "gpu", from + kHour).gpu_hours, 0);
  // Half of it before `from`: only the rest counts, in every remembered answer it belongs to.
  ledger.Add(Held("bob", 2, from - kHour / 2, from + 2 * kHour));
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "", "", from).gpu_hours, 5);
  EXPECT_DOUBLE_EQ(ledger.Used("", "", "gpu", from + kHour).gpu_hours, 2);
  EXPECT_DOUBLE_EQ(ledger.Used("vision", "alice", "", from).gpu_hours, 1);
  EXPECT_EQ(ledger.Users("vision", from + kHour), std::vector<std::string>{"bob"});
  EXPECT_EQ(ledger.Users("vision", from), (std::vector<std::string>{"alice", "bob"}));
  // The same as a ledger that is asked only after everything was added.
  Ledger fresh;
  fresh.Add(Held("alice", 1, from, from + kHour));
  fresh.Add(Held("bob", 2, from - kHour / 2, from + 2 * kHour));
  EXPECT_DOUBLE_EQ(fresh.Used("vision", "", "", from).gpu_hours, 5);
  EXPECT_DOUBLE_EQ(fresh.Used("", "", "gpu", from + kHour).gpu_hours, 2);
}

TEST(BudgetTest, ABudgetInMoneyPricesEachHoldingAtItsFlavorsRates) {
  policy::Costs costs;
  costs.currency = "USD";
  costs.flavors["a100"] = {2.5, 0.04};
  costs.flavors["cpu"] = {0, 0.03};
  policy::Budget b;
  b.workspace = "vision";
  b.cost = 10;
  b.currency = "USD";
  b.period = "month";
  const std::vector<policy::Budget> budgets = {b};
  const int64_t now = At("2026-12-06T15:00:00Z");
  // 2 A100 GPUs and 4 CPUs (on the cpu flavor) for an hour: 2 x 2.5 + 4 x 0.03 = 5.12 USD.
  Holding h{"vision", "alice", "gpu", 2, 4000, now - 2 * kHour, now - kHour, "r1", "a100", "cpu"};
  Price(costs, &h);
  EXPECT_DOUBLE_EQ(h.rates.gpu_hour, 2.5);
  EXPECT_DOUBLE_EQ(h.rates.cpu_hour, 0.03);
  Ledger ledger;
  ledger.Add(h);
  EXPECT_NEAR(ledger.Used("vision", "", "", 0).cost, 5.12, 1e-9);
  Checker half(budgets, ledger, {}, now);
  EXPECT_EQ(half.Hold("vision", "bob", "gpu"), "");
  EXPECT_FALSE(half.StateOf(budgets[0], "").warn);
  // The same again, still held now: 10.24 USD, spent.
  Holding open = h;
  open.start_ms = now - kHour;
  Checker spent(budgets, ledger, {open}, now);
  EXPECT_EQ(spent.Hold("vision", "bob", "gpu"),
            "budget of workspace vision spent: 10.24 USD of 10.00 USD this month; resets in 25d");
  // A flavor without a rate costs nothing.
  Holding free = h;
  free.gpu_flavor = "t4";
  free.cpu_flavor = "";
  Price(costs, &free);
  EXPECT_EQ(free.rates.gpu_hour, 0);
  EXPECT_EQ(free.rates.cpu_hour, 0);
  EXPECT_EQ(Money(0.0042, "EUR"), "0.0042 EUR");
  EXPECT_EQ(Money(412.5, ""), "412.50");
}

TEST(HeldFlavorsTest, TheGpusAndCpusFlavorsOfTheFirstPodSetThatHasThem) {
  auto flavors = nlohmann::json::parse(
      R"({"head": {"cpu": "cpu-pool", "memory": "cpu-pool"},
          "workers": {"cpu": "a100", "nvidia.com/gpu": "a100"}})");
  EXPECT_EQ(HeldFlavors(flavors), (std::pair<std::string, std::string>{"a100", "cpu-pool"}));
  EXPECT_EQ(HeldFlavors(nlohmann::json::object()), (std::pair<std::string, std::string>{}));
  EXPECT_EQ(HeldFlavors(nullptr), (std::pair<std::string, std::string>{}));
}

}  // namespace
}  // namespace tau::budget
