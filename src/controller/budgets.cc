// Budgets on the controller (docs/budgets.md): each time a run held quota is metered when it is
// released (a Metered event, durable with the release, and the ledger); each pass holds back the
// queued runs a spent budget covers, out of their queue and holding no quota, and lets them go
// when the budget has room again (a new period, use leaving a rolling window, a larger budget).
// The ledger is rebuilt from the Metered events at start, so a restart meters nothing twice; so is
// admission fair sharing's decayed usage of each LocalQueue (RestoreFairUsage).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/clock.h"
#include "controller/controller.h"

namespace tau::server {

using store::Batch;
using store::RunRecord;
using store::RunState;

namespace {
constexpr int64_t kBudgetRecheckMs = 1000;

// `h` on the flavors of its admission (`flavors`, as a run's record keeps them) at their rates.
budget::Holding Priced(budget::Holding h, const nlohmann::json& flavors,
                       const policy::Costs& costs) {
  std::tie(h.gpu_flavor, h.cpu_flavor) = budget::HeldFlavors(flavors);
  budget::Price(costs, &h);
  return h;
}

// Admitted and not released yet (a release meters before the run's state moves on).
bool HoldsQuota(const RunRecord& r) {
  return r.admitted_ms.has_value() &&
         (r.state == RunState::kAdmitted || r.state == RunState::kRunning);
}
}  // namespace

Status Controller::LoadLedger() {
  ledger_ = budget::Ledger();
  budgets_dirty_ = true;
  const std::vector<policy::Budget>& budgets = loop_platform_->budgets;
  if (budgets.empty()) return Status::Ok();
  TAU_ASSIGN_OR_RETURN(std::vector<store::UsageRecord> used,
                       store_->ListUsage(budget::LookBack(budgets, Now())));
  for (const store::UsageRecord& u : used)
    ledger_.Add(Priced({u.workspace, u.owner, u.queue, u.gpus, u.cpu_milli, u.started_ms,
                        u.ended_ms.value_or(u.started_ms), u.run},
                       u.flavors, loop_platform_->costs));
  return Status::Ok();
}

// Admission fair sharing after a restart: a LocalQueue's usage is the decayed sum of what its
// runs held (the Metered events, and the runs holding quota now), each as
// admission::DecayedHolding says.
Status Controller::RestoreFairUsage() {
  const auto& afs = loop_platform_->admission.admission_fair_sharing;
  if (!afs || !quota_.engine) return Status::Ok();
  std::set<std::string> queues;
  for (const admission::ClusterQueue& q : loop_platform_->admission.queues)
    if (q.admission_fair_sharing) queues.insert(q.name);
  if (queues.empty()) return Status::Ok();
  const int64_t now = Now();
  // Holdings ended 40 half-lives ago weigh under 10^-12 of their size.
  TAU_ASSIGN_OR_RETURN(std::vector<store::UsageRecord> used,
                       store_->ListUsage(std::max<int64_t>(0, now - 40 * afs->usage_half_life_ms)));
  std::map<std::string, std::pair<std::string, std::map<std::string, double>>> consumed;
  auto add = [&](const std::string& workspace, const std::string& queue, int64_t gpus,
                 int64_t cpu_milli, int64_t memory_bytes, int64_t start, int64_t end) {
    if (!queues.count(queue) || end < start) return;
    const double f = admission::DecayedHolding(*afs, start, end, now);
    auto& [cq, per_resource] = consumed[policy::LocalQueueName(workspace, queue)];
    cq = queue;
    if (gpus) per_resource[policy::kGpuResource] += f * static_cast<double>(gpus);
    if (cpu_milli) per_resource[policy::kCpuResource] += f * static_cast<double>(cpu_milli) / 1000;
    if (memory_bytes)
      per_resource[policy::kMemoryResource] += f * static_cast<double>(memory_bytes);
  };
  for (const store::UsageRecord& u : used)
    add(u.workspace, u.queue, u.gpus, u.cpu_milli, u.memory_bytes, u.started_ms,
        u.ended_ms.value_or(u.started_ms));
  for (const auto& [name, run] : active_) {
    const RunRecord& r = run.record;
    if (HoldsQuota(r))
      add(r.workspace, r.queue, run.need.gpus, run.need.cpu_milli, run.need.memory_bytes,
          *r.admitted_ms, now);
  }
  for (const auto& [lq, value] : consumed)
    TAU_RETURN_IF_ERROR(quota_.engine->SetLocalQueueUsage(lq, value.first, value.second, now));
  return Status::Ok();
}

std::vector<budget::Holding> Controller::OpenHoldings() const {
  std::vector<budget::Holding> open;
  for (const auto& [name, run] : active_) {
    const RunRecord& r = run.record;
    if (!HoldsQuota(r)) continue;
    open.push_back(Priced({r.workspace, r.owner, r.queue, run.need.gpus, run.need.cpu_milli,
                           *r.admitted_ms, 0, r.name},
                          r.flavors, loop_platform_->costs));
  }
  return open;
}

void Controller::Meter(ActiveRun& run, Batch* batch) {
  const RunRecord& r = run.record;
  if (!HoldsQuota(r)) return;
  const int64_t now = std::max(Now(), *r.admitted_ms);
  const budget::Holding h = Priced({r.workspace, r.owner, r.queue, run.need.gpus,
                                    run.need.cpu_milli, *r.admitted_ms, now, r.name},
                                   r.flavors, loop_platform_->costs);
  ledger_.Add(h);
  budgets_dirty_ = true;
  const double hours = static_cast<double>(now - *r.admitted_ms) / 3'600'000;
  const double gpu_hours = static_cast<double>(h.gpus) * hours;
  const double cpu_hours = static_cast<double>(h.cpu_milli) / 1000 * hours;
  nlohmann::json data = {{"attempt", r.attempts},
                         {"admitted_ms", *r.admitted_ms},
                         {"gpus", h.gpus},
                         {"cpu_milli", h.cpu_milli},
                         {"memory_bytes", run.need.memory_bytes},
                         {"gpu_hours", gpu_hours},
                         {"cpu_hours", cpu_hours},
                         {"flavors", r.flavors}};
  if (auto t = gpu_time_.find(r.name); t != gpu_time_.end()) {
    // What the GPU samples saw of this holding: how long its GPUs were sampled, and idle.
    data["sampled_gpu_hours"] = static_cast<double>(t->second.sampled_gpu_ms) / 3'600'000;
    data["idle_gpu_hours"] = static_cast<double>(t->second.idle_gpu_ms) / 3'600'000;
    gpu_time_.erase(t);
  }
  batch->events.push_back(
      {0, r.name, now, "Metered",
       fmt::format("held {} GPU(s) and {} CPU for {}: {} GPU-h, {} CPU-h", h.gpus,
                   static_cast<double>(h.cpu_milli) / 1000, FormatDuration(now - *r.admitted_ms),
                   budget::Hours(gpu_hours), budget::Hours(cpu_hours)),
       std::move(data), "", ""});
}

void Controller::ApplyBudgets(Batch* batch) {
  const std::vector<policy::Budget>& budgets = loop_platform_->budgets;
  const int64_t now = Now();
  const bool sweep = budgets_dirty_ || now - budgets_checked_ms_ >= kBudgetRecheckMs;
  if (budgets.empty()) {
    if (!budgets_dirty_) return;  // nothing is held: the platform has had no budgets since
    budgets_dirty_ = false;
  } else if (!sweep && sync_changed_.empty()) {
    return;
  }
  std::vector<budget::Holding> open =
      budgets.empty() ? std::vector<budget::Holding>() : OpenHoldings();
  budget::Checker checker(budgets, ledger_, open, now);
  auto check = [&](ActiveRun& run) {
    const RunRecord& r = run.record;
    std::string hold;
    const bool waits = r.state == RunState::kQueued && !HoldsQuota(r) && !r.cancel_requested &&
                       !store::IsTerminal(r.state);
    if (waits && !budgets.empty()) hold = checker.Hold(r.workspace, r.owner, r.queue);
    const bool was = !run.budget_hold.empty();
    run.budget_hold = hold;  // its text moves with time; an event only when it starts or ends
    if (was == !hold.empty()) return;
    sync_changed_.insert(r.name);
    if (!hold.empty()) {
      batch->events.push_back({0,
                               r.name,
                               now,
                               "BudgetHold",
                               hold + "; it enters its queue once the budget has room",
                               {},
                               "",
                               ""});
      return;
    }
    run.queued_since_ms = now;
    if (waits)
      batch->events.push_back({0,
                               r.name,
                               now,
                               "BudgetAvailable",
                               "its budget has room again: it enters its queue",
                               {},
                               "",
                               ""});
  };
  auto warn = [&](ActiveRun& run) {
    const RunRecord& r = run.record;
    if (budgets.empty() || !run.budget_hold.empty() || r.state != RunState::kQueued ||
        budget_warned_.count(r.name))
      return;
    for (const policy::Budget* b : checker.Covering(r.workspace, r.owner, r.queue)) {
      const budget::State& s = checker.StateOf(*b, r.owner);
      if (!s.warn || s.spent) continue;
      budget_warned_.insert(r.name);
      batch->events.push_back(
          {0,
           r.name,
           now,
           "BudgetWarning",
           fmt::format("{} (warns past {:.0f}%)", s.Message(now), b->warn_at * 100),
           {},
           "",
           ""});
      return;
    }
  };
  if (!sweep) {
    for (const std::string& name :
         std::vector<std::string>(sync_changed_.begin(), sync_changed_.end()))
      if (auto it = active_.find(name); it != active_.end()) {
        check(it->second);
        warn(it->second);
      }
    return;
  }
  for (auto& [name, run] : active_) {
    check(run);
    warn(run);
  }
  budgets_checked_ms_ = now;
  budgets_dirty_ = false;
  if (!budgets.empty()) ledger_.Prune(budget::LookBack(budgets, now));
  nlohmann::json view = nlohmann::json::array();
  for (const budget::State& s : checker.All()) {
    const policy::Budget& b = *s.budget;
    nlohmann::json j = {
        {"name", b.name.empty() ? s.scope : b.name},
        {"scope", s.scope},
        {"workspace", b.workspace},
        {"user", s.user},
        {"queue", b.queue},
        {"period", b.period},
        {"window_ms", b.window_ms},
        {"on_exceed", b.on_exceed},
        {"used",
         {{"gpu_hours", s.used.gpu_hours}, {"cpu_hours", s.used.cpu_hours}, {"cost", s.used.cost}}},
        {"from", FormatRfc3339(s.from_ms)},
        {"spent", s.spent},
        {"warn", s.warn},
        {"message", s.Message(now)}};
    j["gpu_hours"] = b.gpu_hours ? nlohmann::json(*b.gpu_hours) : nlohmann::json();
    j["cpu_hours"] = b.cpu_hours ? nlohmann::json(*b.cpu_hours) : nlohmann::json();
    j["cost"] = b.cost ? nlohmann::json(*b.cost) : nlohmann::json();
    j["currency"] = b.currency;
    j["resets"] = s.reset_ms ? nlohmann::json(FormatRfc3339(s.reset_ms)) : nlohmann::json();
    view.push_back(std::move(j));
  }
  MutexLock lock(&mu_);
  budget_view_ = std::move(view);
  open_view_ = std::move(open);
}

Status Controller::CheckBudgets(const policy::Platform& platform, const policy::ResolvedRun& run,
                                const std::string& user) {
  if (platform.budgets.empty()) return Status::Ok();
  nlohmann::json view;
  {
    MutexLock lock(&mu_);
    view = budget_view_;
  }
  const int64_t gpus = static_cast<int64_t>(run.gpus_per_worker) * run.workers;
  auto limit = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json();
  };
  for (const policy::Budget& b : platform.budgets) {
    if (b.on_exceed != "refuse" || !budget::Covers(b, run.workspace, user, run.queue)) continue;
    const std::string who = b.user == policy::kEveryone ? user : b.user;
    // Its state as last checked (none yet for a user of a per-user budget who has used none).
    double used = 0;
    bool spent = false;
    std::string message;
    for (const nlohmann::json& s : view)
      if (s.value("workspace", "") == b.workspace && s.value("queue", "") == b.queue &&
          s.value("user", "") == (b.user.empty() ? "" : who) &&
          s.value("gpu_hours", nlohmann::json()) == limit(b.gpu_hours) &&
          s.value("cpu_hours", nlohmann::json()) == limit(b.cpu_hours) &&
          s.value("cost", nlohmann::json()) == limit(b.cost)) {
        used = s["used"].value("gpu_hours", 0.0);
        spent = s.value("spent", false);
        message = s.value("message", "");
      }
    if (spent || (b.gpu_hours && *b.gpu_hours - used <= 0 && !run.max_runtime_ms))
      return FailedPrecondition(fmt::format(
          "{}; this budget refuses runs while it is spent (on_exceed: refuse)", message));
    // What a run may use is known in GPU-hours only (its flavor, and so its price, comes with its
    // admission).
    if (!b.gpu_hours || !run.max_runtime_ms) continue;
    const double left = std::max(0.0, *b.gpu_hours - used);
    const double need =
        static_cast<double>(gpus) * static_cast<double>(*run.max_runtime_ms) / 3'600'000;
    if (need <= left) continue;
    return FailedPrecondition(fmt::format(
        "run.max_runtime: {} GPU(s) for {} is up to {} GPU-h, and the budget of {} has {} of {} "
        "GPU-h left (on_exceed: refuse); shorten run.max_runtime, ask for fewer GPUs, or wait for "
        "the budget to have room",
        gpus, FormatDuration(*run.max_runtime_ms), budget::Hours(need), budget::ScopeOf(b, who),
        budget::Hours(left), budget::Hours(*b.gpu_hours)));
  }
  return Status::Ok();
}

nlohmann::json Controller::Budgets() {
  MutexLock lock(&mu_);
  return budget_view_;
}

namespace {

// A time something was held, cut to the report's start, with what reports count it by.
struct Held {
  std::string run, workspace, user, queue, gpu_flavor, cpu_flavor;
  int64_t gpus = 0, cpu_milli = 0;
  int64_t from = 0, to = 0;
  double sampled_gpu_hours = 0, idle_gpu_hours = 0;  // of the part after the start

  std::string Key(const std::string& by) const {
    const std::string& flavor = gpus > 0 ? gpu_flavor : cpu_flavor;
    return by == "workspace" ? workspace
           : by == "user"    ? fmt::format("{}/{}", workspace, user)
           : by == "queue"   ? queue
           : by == "flavor"  ? (flavor.empty() ? "-" : flavor)
                             : run;
  }
  double GpuHours(int64_t a, int64_t b) const {
    return static_cast<double>(gpus) * static_cast<double>(b - a) / 3'600'000;
  }
  double CpuHours(int64_t a, int64_t b) const {
    return static_cast<double>(cpu_milli) / 1000 * static_cast<double>(b - a) / 3'600'000;
  }
};

Status CheckUsageBy(const std::string& by) {
  if (by != "workspace" && by != "user" && by != "queue" && by != "flavor" && by != "run")
    return InvalidArgument(
        fmt::format("by: '{}' is not workspace, user, queue, flavor or run", by));
  return Status::Ok();
}

// Every holding of `workspaces` (all when unset) since `since_ms`, ended or open (held until
// `now`), cut to it.
std::vector<Held> HeldSince(const std::vector<store::UsageRecord>& ended,
                            const std::vector<budget::Holding>& open, int64_t now, int64_t since_ms,
                            const std::optional<std::vector<std::string>>& workspaces) {
  std::vector<Held> out;
  auto add = [&](Held h) {
    if (workspaces &&
        std::find(workspaces->begin(), workspaces->end(), h.workspace) == workspaces->end())
      return;
    // Of a holding that began before the start, the share after it.
    const double part = h.to > h.from ? static_cast<double>(h.to - std::max(h.from, since_ms)) /
                                            static_cast<double>(h.to - h.from)
                                      : 0;
    h.from = std::max(h.from, since_ms);
    if (h.to <= h.from) return;
    h.sampled_gpu_hours *= part;
    h.idle_gpu_hours *= part;
    out.push_back(std::move(h));
  };
  for (const store::UsageRecord& u : ended) {
    auto [gpu_flavor, cpu_flavor] = budget::HeldFlavors(u.flavors);
    add({u.run, u.workspace, u.owner, u.queue, gpu_flavor, cpu_flavor, u.gpus, u.cpu_milli,
         u.started_ms, u.ended_ms.value_or(u.started_ms), u.sampled_gpu_hours, u.idle_gpu_hours});
  }
  for (const budget::Holding& h : open)
    add({h.run, h.workspace, h.user, h.queue, h.gpu_flavor, h.cpu_flavor, h.gpus, h.cpu_milli,
         h.start_ms, now, 0, 0});
  return out;
}

}  // namespace

Status Controller::UsageInputs(int64_t since_ms, std::vector<store::UsageRecord>* ended,
                               std::vector<budget::Holding>* open) {
  TAU_ASSIGN_OR_RETURN(*ended, store_->ListUsage(since_ms));
  MutexLock lock(&mu_);
  *open = open_view_;
  return Status::Ok();
}

Result<nlohmann::json> Controller::Usage(
    const std::string& by, int64_t since_ms,
    const std::optional<std::vector<std::string>>& workspaces) {
  TAU_RETURN_IF_ERROR(CheckUsageBy(by));
  const policy::Costs costs = CurrentPlatform().platform->costs;
  std::vector<store::UsageRecord> ended;
  std::vector<budget::Holding> open;
  TAU_RETURN_IF_ERROR(UsageInputs(since_ms, &ended, &open));
  const std::vector<Held> held = HeldSince(ended, open, Now(), since_ms, workspaces);
  struct Row {
    double gpu_hours = 0, cpu_hours = 0;
    double sampled_gpu_hours = 0, idle_gpu_hours = 0;  // ended holdings' GPU samples
    double cost = 0;
    std::set<std::string> runs;
  };
  std::map<std::string, Row> rows;
  for (const Held& h : held) {
    Row& row = rows[h.Key(by)];
    const double gpu_hours = h.GpuHours(h.from, h.to), cpu_hours = h.CpuHours(h.from, h.to);
    row.gpu_hours += gpu_hours;
    row.cpu_hours += cpu_hours;
    row.sampled_gpu_hours += h.sampled_gpu_hours;
    row.idle_gpu_hours += h.idle_gpu_hours;
    const policy::FlavorCost rates = budget::RatesOf(costs, h.gpu_flavor, h.cpu_flavor);
    row.cost += gpu_hours * rates.gpu_hour + cpu_hours * rates.cpu_hour;
    row.runs.insert(h.run);
  }
  nlohmann::json out = nlohmann::json::array();
  for (auto& [key, row] : rows) {
    out.push_back(
        {{"key", key},
         {"gpu_hours", row.gpu_hours},
         {"cpu_hours", row.cpu_hours},
         {"idle_gpu_hours", row.idle_gpu_hours},
         // Of the GPU time the samples saw, the share that was idle; null: none seen.
         {"idle_share", row.sampled_gpu_hours > 0
                            ? nlohmann::json(row.idle_gpu_hours / row.sampled_gpu_hours)
                            : nlohmann::json(nullptr)},
         // In the platform's currency, from its flavors' rates; null: no costs.
         {"cost", costs.flavors.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.cost)},
         {"runs", row.runs.size()}});
  }
  std::stable_sort(out.begin(), out.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["gpu_hours"].get<double>() > b["gpu_hours"].get<double>();
  });
  return out;
}

Result<nlohmann::json> Controller::UsageSeries(
    const std::string& by, int64_t since_ms, int64_t bucket_ms,
    const std::optional<std::vector<std::string>>& workspaces) {
  TAU_RETURN_IF_ERROR(CheckUsageBy(by));
  if (bucket_ms <= 0) return InvalidArgument("bucket: a positive length");
  const int64_t now = Now();
  // Buckets start at `since` rounded down to a bucket (UTC midnight for days) and end after now.
  const int64_t first = since_ms - since_ms % bucket_ms;
  const int64_t count = (now - first) / bucket_ms + 1;
  if (count > kMaxUsageBuckets)
    return InvalidArgument(
        fmt::format("{} buckets from {} to now: at most {}; ask for longer "
                    "buckets or a later start",
                    count, FormatRfc3339(since_ms), kMaxUsageBuckets));
  std::vector<store::UsageRecord> ended;
  std::vector<budget::Holding> open;
  TAU_RETURN_IF_ERROR(UsageInputs(since_ms, &ended, &open));
  const std::vector<Held> held = HeldSince(ended, open, now, since_ms, workspaces);
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> series;
  for (const Held& h : held) {
    auto& [gpu, cpu] = series[h.Key(by)];
    gpu.resize(static_cast<size_t>(count));
    cpu.resize(static_cast<size_t>(count));
    for (int64_t b = (h.from - first) / bucket_ms; b < count; ++b) {
      const int64_t lo = std::max(h.from, first + b * bucket_ms);
      const int64_t hi = std::min(h.to, first + (b + 1) * bucket_ms);
      if (hi <= lo) break;
      gpu[static_cast<size_t>(b)] += h.GpuHours(lo, hi);
      cpu[static_cast<size_t>(b)] += h.CpuHours(lo, hi);
    }
  }
  nlohmann::json buckets = nlohmann::json::array(), out = nlohmann::json::array();
  for (int64_t b = 0; b < count; ++b) buckets.push_back(FormatRfc3339(first + b * bucket_ms));
  for (auto& [key, values] : series)
    out.push_back({{"key", key}, {"gpu_hours", values.first}, {"cpu_hours", values.second}});
  return nlohmann::json{{"buckets", std::move(buckets)}, {"series", std::move(out)}};
}

}  // namespace tau::server
