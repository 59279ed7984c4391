#include "budget/budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/clock.h"

namespace tau::budget {
namespace {

constexpr int64_t kHourMs = 3'600'000;
constexpr int64_t kDayMs = 24 * kHourMs;

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Days since 1970-01-01 of a civil date, and back (Howard Hinnant's algorithms).
int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = FloorDiv(y, 400);
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}
void CivilFromDays(int64_t z, int64_t* y, int64_t* m) {
  z += 719468;
  const int64_t era = FloorDiv(z, 146097);
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  *m = mp + (mp < 10 ? 3 : -9);
  *y = yoe + era * 400 + (*m <= 2);
}

// [start, next start) of the calendar period holding `now`.
std::pair<int64_t, int64_t> Period(const std::string& period, int64_t now) {
  const int64_t days = FloorDiv(now, kDayMs);
  if (period == "day") return {days * kDayMs, (days + 1) * kDayMs};
  if (period == "week") {
    const int64_t monday = days - (days + 3) % 7;  // 1970-01-01 was a Thursday
    return {monday * kDayMs, (monday + 7) * kDayMs};
  }
  int64_t y = 0, m = 0;
  CivilFromDays(days, &y, &m);
  const int64_t first = DaysFromCivil(y, m, 1);
  const int64_t next = m == 12 ? DaysFromCivil(y + 1, 1, 1) : DaysFromCivil(y, m + 1, 1);
  return {first * kDayMs, next * kDayMs};
}

bool Matches(const std::string& want, const std::string& have) {
  return want.empty() || want == have;
}

// Of holding `h`, what falls in [from, to).
Usage Share(const Holding& h, int64_t from, int64_t to) {
  const int64_t start = std::max(h.start_ms, from), end = std::min(h.end_ms, to);
  if (end <= start) return {};
  const double hours = static_cast<double>(end - start) / kHourMs;
  Usage u{static_cast<double>(h.gpus) * hours, static_cast<double>(h.cpu_milli) / 1000 * hours};
  u.cost = u.gpu_hours * h.rates.gpu_hour + u.cpu_hours * h.rates.cpu_hour;
  return u;
}

void AddTo(Usage* to, const Usage& share) {
  to->gpu_hours += share.gpu_hours;
  to->cpu_hours += share.cpu_hours;
  to->cost += share.cost;
}

}  // namespace

policy::FlavorCost RatesOf(const policy::Costs& costs, const std::string& gpu_flavor,
                           const std::string& cpu_flavor) {
  auto gpu = costs.flavors.find(gpu_flavor), cpu = costs.flavors.find(cpu_flavor);
  return {gpu == costs.flavors.end() ? 0 : gpu->second.gpu_hour,
          cpu == costs.flavors.end() ? 0 : cpu->second.cpu_hour};
}

void Price(const policy::Costs& costs, Holding* h) {
  h->rates = RatesOf(costs, h->gpu_flavor, h->cpu_flavor);
}

std::string ScopeOf(const policy::Budget& b, const std::string& user) {
  if (!b.queue.empty()) return "queue " + b.queue;
  if (!user.empty()) return fmt::format("user {} in workspace {}", user, b.workspace);
  return "workspace " + b.workspace;
}

bool Covers(const policy::Budget& b, const std::string& workspace, const std::string& user,
            const std::string& queue) {
  if (!b.queue.empty() ? b.queue != queue : b.workspace != workspace) return false;
  return b.user.empty() || b.user == policy::kEveryone || b.user == user;
}

int64_t WindowStart(const policy::Budget& b, int64_t now_ms) {
  if (b.window_ms > 0) return FloorDiv(now_ms - b.window_ms, kHourMs) * kHourMs;
  return Period(b.period, now_ms).first;
}

int64_t ResetAt(const policy::Budget& b, int64_t now_ms) {
  if (b.window_ms > 0) return 0;
  return Period(b.period, now_ms).second;
}

int64_t LookBack(const std::vector<policy::Budget>& budgets, int64_t now_ms) {
  int64_t from = now_ms;
  for (const policy::Budget& b : budgets) from = std::min(from, WindowStart(b, now_ms));
  return from;
}

void Ledger::Add(const Holding& h) {
  if (h.end_ms <= h.start_ms) return;
  const Key key{h.workspace, h.user, h.queue};
  int64_t& last = last_use_[h.workspace][h.user];
  last = std::max(last, FloorDiv(h.end_ms - 1, kHourMs) * kHourMs);
  for (auto& [scope, used] : used_) {
    const auto& [w, who, q] = scope.first;
    if (!Matches(w, h.workspace) || !Matches(who, h.user) || !Matches(q, h.queue)) continue;
    // What Used() counts of it: its hours from `from` on.
    AddTo(&used, Share(h, scope.second, h.end_ms));
  }
  for (int64_t hour = FloorDiv(h.start_ms, kHourMs) * kHourMs; hour < h.end_ms; hour += kHourMs) {
    AddTo(&hours_[hour][key], Share(h, hour, hour + kHourMs));
  }
}

void Ledger::Prune(int64_t before_ms) {
  hours_.erase(hours_.begin(), hours_.lower_bound(before_ms));
  for (auto it = used_.begin(); it != used_.end();)
    it = it->first.second < before_ms ? used_.erase(it) : std::next(it);
  for (auto& [workspace, users] : last_use_)
    for (auto it = users.begin(); it != users.end();)
      it = it->second < before_ms ? users.erase(it) : std::next(it);
}

Usage Ledger::Used(const std::string& workspace, const std::string& user, const std::string& queue,
                   int64_t from_ms) const {
  const std::pair<Key, int64_t> cached{{workspace, user, queue}, from_ms};
  if (auto it = used_.find(cached); it != used_.end()) return it->second;
  Usage& out = used_[cached];
  for (auto it = hours_.lower_bound(from_ms); it != hours_.end(); ++it)
    for (const auto& [key, u] : it->second) {
      const auto& [w, who, q] = key;
      if (!Matches(workspace, w) || !Matches(user, who) || !Matches(queue, q)) continue;
      AddTo(&out, u);
    }
  return out;
}

std::vector<std::string> Ledger::Users(const std::string& workspace, int64_t from_ms) const {
  std::vector<std::string> users;
  if (auto w = last_use_.find(workspace); w != last_use_.end())
    for (const auto& [user, last] : w->second)
      if (last >= from_ms) users.push_back(user);
  return users;
}

std::string Hours(double h) {
  if (h != 0 && std::fabs(h) < 0.1) return fmt::format("{:.4f}", h);
  return fmt::format("{:.1f}", h);
}

std::string Money(double amount, const std::string& currency) {
  const std::string number = amount != 0 && std::fabs(amount) < 1 ? fmt::format("{:.4f}", amount)
                                                                  : fmt::format("{:.2f}", amount);
  return currency.empty() ? number : number + " " + currency;
}

std::string State::Message(int64_t now_ms) const {
  std::vector<std::string> parts;
  const policy::Budget& b = *budget;
  // The limits reached when it is spent, else how far each is.
  for (bool only_reached : {true, false}) {
    if (b.gpu_hours && (!only_reached || used.gpu_hours >= *b.gpu_hours))
      parts.push_back(fmt::format("{} of {} GPU-h", Hours(used.gpu_hours), Hours(*b.gpu_hours)));
    if (b.cpu_hours && (!only_reached || used.cpu_hours >= *b.cpu_hours))
      parts.push_back(fmt::format("{} of {} CPU-h", Hours(used.cpu_hours), Hours(*b.cpu_hours)));
    if (b.cost && (!only_reached || used.cost >= *b.cost))
      parts.push_back(
          fmt::format("{} of {}", Money(used.cost, b.currency), Money(*b.cost, b.currency)));
    if (!parts.empty()) break;
  }
  std::string text = fmt::format("budget of {} {}: ", scope, spent ? "spent" : "used");
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  if (b.window_ms > 0)
    return text + fmt::format(" in the last {}; room comes back as older use leaves the window",
                              b.window_ms % kDayMs == 0 ? fmt::format("{}d", b.window_ms / kDayMs)
                                                        : FormatDuration(b.window_ms));
  text += b.period == "day" ? " today" : fmt::format(" this {}", b.period);
  if (reset_ms > now_ms) {
    // Whole days when it is days away.
    const int64_t left = reset_ms - now_ms;
    text += left >= kDayMs ? fmt::format("; resets in {}d", (left + kDayMs / 2) / kDayMs)
                           : fmt::format("; resets in {}", FormatDuration(left / 60'000 * 60'000));
  }
  return text;
}

std::optional<double> State::GpuHoursLeft() const {
  if (!budget->gpu_hours) return std::nullopt;
  return std::max(0.0, *budget->gpu_hours - used.gpu_hours);
}

Checker::Checker(const std::vector<policy::Budget>& budgets, const Ledger& ledger,
                 std::vector<Holding> open, int64_t now_ms)
    : budgets_(budgets), ledger_(ledger), open_(std::move(open)), now_(now_ms) {}

const State& Checker::StateOf(const policy::Budget& b, const std::string& who) {
  const std::string user = b.user == policy::kEveryone ? who : b.user;
  auto [it, added] = states_.try_emplace({&b, user});
  State& s = it->second;
  if (!added) return s;
  s.budget = &b;
  s.user = user;
  s.scope = ScopeOf(b, user);
  s.from_ms = WindowStart(b, now_);
  s.reset_ms = ResetAt(b, now_);
  s.used = ledger_.Used(b.workspace, user, b.queue, s.from_ms);
  for (const Holding& h : open_) {
    if (!Matches(b.workspace, h.workspace) || !Matches(user, h.user) || !Matches(b.queue, h.queue))
      continue;
    Holding held = h;
    held.end_ms = now_;
    AddTo(&s.used, Share(held, s.from_ms, now_));
  }
  auto past = [&](const std::optional<double>& limit, double used, double share) {
    return limit && used >= *limit * share;
  };
  s.spent = past(b.gpu_hours, s.used.gpu_hours, 1) || past(b.cpu_hours, s.used.cpu_hours, 1) ||
            past(b.cost, s.used.cost, 1);
  s.warn = past(b.gpu_hours, s.used.gpu_hours, b.warn_at) ||
           past(b.cpu_hours, s.used.cpu_hours, b.warn_at) || past(b.cost, s.used.cost, b.warn_at);
  return s;
}

std::vector<const policy::Budget*> Checker::Covering(const std::string& workspace,
                                                     const std::string& user,
                                                     const std::string& queue) {
  std::vector<const policy::Budget*> out;
  for (const policy::Budget& b : budgets_)
    if (Covers(b, workspace, user, queue)) out.push_back(&b);
  return out;
}

std::string Checker::Hold(const std::string& workspace, const std::string& user,
                          const std::string& queue) {
  for (const policy::Budget* b : Covering(workspace, user, queue)) {
    const State& s = StateOf(*b, user);
    if (s.spent) return s.Message(now_);
  }
  return "";
}

std::vector<State> Checker::All() {
  std::vector<State> out;
  for (const policy::Budget& b : budgets_) {
    if (b.user != policy::kEveryone) {
      out.push_back(StateOf(b, ""));
      continue;
    }
    std::set<std::string> users;
    for (const std::string& u : ledger_.Users(b.workspace, WindowStart(b, now_))) users.insert(u);
    for (const Holding& h : open_)
      if (h.workspace == b.workspace) users.insert(h.user);
    for (const std::string& u : users) out.push_back(StateOf(b, u));
  }
  return out;
}

std::pair<std::string, std::string> HeldFlavors(const nlohmann::json& flavors) {
  std::string gpu, cpu;
  if (!flavors.is_object()) return {gpu, cpu};
  for (const auto& [podset, resources] : flavors.items()) {
    if (!resources.is_object()) continue;
    if (auto it = resources.find("nvidia.com/gpu");
        gpu.empty() && it != resources.end() && it->is_string())
      gpu = it->get<std::string>();
    if (auto it = resources.find("cpu"); cpu.empty() && it != resources.end() && it->is_string())
      cpu = it->get<std::string>();
  }
  return {gpu, cpu};
}

}  // namespace tau::budget
