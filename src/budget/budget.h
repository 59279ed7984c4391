// Budgets (platform.yaml `budgets`, docs/budgets.md): the GPU-hours and CPU-hours a workspace, a
// user in it or a queue held over a calendar period or a rolling window, and whether a budget is
// spent. Pure: the caller passes the time and what was held; the controller meters each run's
// hold on quota (admission to release: a Metered event) into a Ledger and asks a Checker.
//
// What it offers:
//   * Holding: what one run held, from when to when;
//   * Ledger: ended holdings by the hour, so a period's usage costs its hours, not its runs;
//   * WindowStart / ResetAt: a budget's current period (UTC day, week from Monday, month) or
//     rolling window (counted from the start of the hour it begins in);
//   * Checker: every budget's state at one time (a per-user budget: per user), the message that
//     holds a run back, and whether a run's longest use fits what is left.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/policy.h"

namespace tau::budget {

struct Usage {
  double gpu_hours = 0, cpu_hours = 0;
  double cost = 0;  // in the platform's currency (Holding's rates)
};

// What one run held while it held quota.
struct Holding {
  std::string workspace, user, queue;
  int64_t gpus = 0, cpu_milli = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;  // for an open holding (still held): ignored, held until the time asked
  std::string run;     // whose (reports only)
  // The flavors its GPUs and its CPUs were admitted on ("" when unknown).
  std::string gpu_flavor = {}, cpu_flavor = {};
  // What a GPU-hour and a CPU-hour of it cost, in the platform's currency (Price).
  policy::FlavorCost rates = {};
};

// What a GPU-hour on `gpu_flavor` and a CPU-hour on `cpu_flavor` cost (that flavor's gpu_hour,
// this one's cpu_hour; 0 for a flavor without a rate). Budgets and `tau usage` price what was held
// at the rates in force.
policy::FlavorCost RatesOf(const policy::Costs& costs, const std::string& gpu_flavor,
                           const std::string& cpu_flavor);
// Sets `h`'s rates from its flavors (RatesOf).
void Price(const policy::Costs& costs, Holding* h);

// The flavors of a run's admission (its record's `flavors`: pod set -> resource -> flavor) that
// its GPUs and its CPUs were on: the first pod set's that has them.
std::pair<std::string, std::string> HeldFlavors(const nlohmann::json& flavors);

// The start of the budget's current period or window at `now`: the period's first millisecond
// (UTC), or `now - window` rounded down to the hour.
int64_t WindowStart(const policy::Budget& b, int64_t now_ms);
// When a period's budget is whole again (its next period's start); 0 for a rolling window.
int64_t ResetAt(const policy::Budget& b, int64_t now_ms);
// How far back any of `budgets` looks at `now` (the earliest WindowStart); `now` when none.
int64_t LookBack(const std::vector<policy::Budget>& budgets, int64_t now_ms);

class Ledger {
 public:
  // An ended holding, split into the hours it spans (exactly: each hour gets its share).
  void Add(const Holding& h);
  // Forgets the hours before `ms` (no budget looks back that far).
  void Prune(int64_t before_ms);
  // What the ended holdings of `workspace` (and `user`; "" any) or of `queue` used from `from_ms`
  // (an hour's start) on.
  Usage Used(const std::string& workspace, const std::string& user, const std::string& queue,
             int64_t from_ms) const;
  // The users who have used some of `workspace` since `from_ms`.
  std::vector<std::string> Users(const std::string& workspace, int64_t from_ms) const;
  size_t hours() const { return hours_.size(); }

 private:
  using Key = std::tuple<std::string, std::string, std::string>;  // workspace, user, queue
  std::map<int64_t, std::map<Key, Usage>> hours_;                 // by the hour's start
  // Used()'s answers, by (scope, from), kept up to date by Add: a budget's usage costs a lookup
  // per pass, not a walk over its period's hours (computed again once its period or window
  // moves on).
  mutable std::map<std::pair<Key, int64_t>, Usage> used_;
  // The last hour each user of each workspace held something in.
  std::map<std::string, std::map<std::string, int64_t>> last_use_;
};

// Whether `b` counts a run of `workspace`, `user` and `queue`.
bool Covers(const policy::Budget& b, const std::string& workspace, const std::string& user,
            const std::string& queue);
// "workspace vision", "user alice in workspace vision" (`user` of a per-user budget), "queue gpu".
std::string ScopeOf(const policy::Budget& b, const std::string& user);

// A budget's state at one time: of the budget, and for a per-user one ("*") of one user.
struct State {
  const policy::Budget* budget = nullptr;
  std::string user;   // the user it is of ("" : the budget's whole scope)
  std::string scope;  // "workspace vision", "user alice in workspace vision", "queue gpu"
  Usage used;
  int64_t from_ms = 0, reset_ms = 0;
  bool spent = false;  // a limit is reached
  bool warn = false;   // past warn_at of a limit
  // "budget of workspace vision spent: 412.0 of 400 GPU-h this month; resets in 9d" (or, for a
  // window, "in the last 30d; frees up as older use leaves the window").
  std::string Message(int64_t now_ms) const;
  // What is left of the GPU-hours (nullopt without a GPU limit), never below zero.
  std::optional<double> GpuHoursLeft() const;
};

class Checker {
 public:
  // `open`: what is held now (counted up to `now`).
  Checker(const std::vector<policy::Budget>& budgets, const Ledger& ledger,
          std::vector<Holding> open, int64_t now_ms);
  // The state of the budget for `user` (a per-user budget; ignored otherwise).
  const State& StateOf(const policy::Budget& b, const std::string& user);
  // The budgets that count a run of `workspace`, `user` and `queue`.
  std::vector<const policy::Budget*> Covering(const std::string& workspace, const std::string& user,
                                              const std::string& queue);
  // Why a run of that scope may not start now (a spent budget's message), "" when it may.
  std::string Hold(const std::string& workspace, const std::string& user, const std::string& queue);
  // Every budget's state (per user for a per-user budget: those who used some or hold some).
  std::vector<State> All();
  int64_t now() const { return now_; }

 private:
  const std::vector<policy::Budget>& budgets_;
  const Ledger& ledger_;
  const std::vector<Holding> open_;
  const int64_t now_;
  std::map<std::pair<const policy::Budget*, std::string>, State> states_;
};

// "412.0" (one decimal; more for small amounts: "0.0042").
std::string Hours(double h);
// "412.50 USD" (two decimals; more under 1: "0.0042 USD"); the number alone without a currency.
std::string Money(double amount, const std::string& currency);

}  // namespace tau::budget
