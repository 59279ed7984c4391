// Budget checks' cost (issue #25: under 0.1 ms per admission decision). Prints one JSON object.
//
// A shared box's month: 20 workspaces, each with a monthly budget and a per-user ("*") weekly one,
// and 5 queue budgets; 200 users; a ledger of 30 days of ended holdings (one an hour per user:
// 144,000 holdings, kept by the hour); 2,000 runs holding quota now and 10,000 queued. What the
// controller does each pass (budgets.cc) is timed: a Checker over the open holdings, then Hold()
// for every queued run (a sweep, at most once a second) — per_decision_us is that sweep's cost
// per queued run, the Checker's setup included. ledger_add_us is a release's cost (one holding
// into the ledger).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "budget/budget.h"
#include "common/clock.h"

namespace {

using tau::budget::Checker;
using tau::budget::Holding;
using tau::budget::Ledger;

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main() {
  constexpr int kWorkspaces = 20, kUsers = 200, kQueues = 5, kOpen = 2000, kQueued = 10000;
  constexpr int64_t kHour = 3'600'000;
  const int64_t now = *tau::ParseRfc3339("2026-12-28T12:00:00Z");
  std::vector<tau::policy::Budget> budgets;
  for (int w = 0; w < kWorkspaces; ++w) {
    tau::policy::Budget month;
    month.workspace = fmt::format("ws{}", w);
    month.gpu_hours = 1e6;
    month.period = "month";
    budgets.push_back(month);
    tau::policy::Budget each = month;
    each.user = "*";
    each.gpu_hours = 1e5;
    each.period = "week";
    budgets.push_back(each);
  }
  for (int q = 0; q < kQueues; ++q) {
    tau::policy::Budget queue;
    queue.queue = fmt::format("q{}", q);
    queue.gpu_hours = 1e7;
    queue.cpu_hours = 1e9;
    queue.window_ms = 30 * 24 * kHour;
    budgets.push_back(queue);
  }
  auto scope = [](int i) {
    return std::make_tuple(fmt::format("ws{}", i % kWorkspaces), fmt::format("user{}", i % kUsers),
                           fmt::format("q{}", i % kQueues));
  };
  Ledger ledger;
  auto t = std::chrono::steady_clock::now();
  int64_t added = 0;
  for (int64_t h = now - 30 * 24 * kHour; h < now; h += kHour)
    for (int u = 0; u < kUsers; ++u, ++added) {
      auto [w, user, q] = scope(u);
      ledger.Add(Holding{w, user, q, 1 + u % 8, 4000, h + u * 1000, h + kHour / 2 + u * 1000, "run",
                         "", ""});
    }
  const double ledger_add_us = Since(t) / static_cast<double>(added) * 1e6;
  std::vector<Holding> open;
  for (int i = 0; i < kOpen; ++i) {
    auto [w, user, q] = scope(i);
    open.push_back(Holding{w, user, q, 1, 1000, now - (i % 600) * 60'000, 0, "run", "", ""});
  }
  // Median of 9 sweeps.
  std::vector<double> sweeps;
  size_t held = 0;
  for (int rep = 0; rep < 9; ++rep) {
    t = std::chrono::steady_clock::now();
    Checker checker(budgets, ledger, open, now);
    held = 0;
    for (int i = 0; i < kQueued; ++i) {
      auto [w, user, q] = scope(i * 7);
      held += checker.Hold(w, user, q).empty() ? 0 : 1;
    }
    sweeps.push_back(Since(t));
  }
  std::sort(sweeps.begin(), sweeps.end());
  const double sweep = sweeps[sweeps.size() / 2];
  nlohmann::json out = {{"budgets", budgets.size()},
                        {"ledger_hours", ledger.hours()},
                        {"ledger_holdings", added},
                        {"open_holdings", kOpen},
                        {"queued_runs", kQueued},
                        {"held", held},
                        {"sweep_ms_median", sweep * 1e3},
                        {"sweep_ms_min", sweeps.front() * 1e3},
                        {"sweep_ms_max", sweeps.back() * 1e3},
                        {"per_decision_us", sweep / kQueued * 1e6},
                        {"target_per_decision_us", 100},
                        {"ledger_add_us", ledger_add_us}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
