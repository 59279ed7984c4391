// VerdictTracker: check results over time → one verdict per GPU. The rules are listed in health.h
// and in docs/gpu-health.md ("Verdict rules", "Clear rules"); each is marked below where it is
// applied.
#include <fmt/format.h>

#include <algorithm>

#include "health/health.h"

namespace tau::health {
namespace {

// Worse first: Fail (Unhealthy) > Error (Unknown) > Warn (Degraded).
int Rank(CheckStatus s) {
  switch (s) {
    case CheckStatus::kFail:
      return 3;
    case CheckStatus::kError:
      return 2;
    case CheckStatus::kWarn:
      return 1;
    default:
      return 0;
  }
}

bool Sticky(ClearRule rule) {
  return rule == ClearRule::kOnGpuReset || rule == ClearRule::kOnReboot;
}

constexpr uint64_t kXidCtxswTimeout = 109;

}  // namespace

bool StopsRunningWork(Verdict verdict, const std::vector<Reason>& reasons) {
  if (verdict != Verdict::kUnhealthy) return false;
  return std::any_of(reasons.begin(), reasons.end(), [](const Reason& r) {
    return r.status == CheckStatus::kFail && r.action != Action::kResetWhenIdle;
  });
}

VerdictTracker::VerdictTracker(VerdictPolicy policy) : policy_(policy) {}

void VerdictTracker::Apply(GpuState& state, int64_t now_ms, const CheckResult& r) {
  switch (r.status) {
    case CheckStatus::kNotSupported:
      // Rule: "not supported" is no observation at all; it neither fails nor clears.
      return;
    case CheckStatus::kInfo: {
      if (r.xid == 0) return;
      // Rule: application XIDs never change a verdict alone, but repeats do: XID 109 twice within
      // the window is a reset (reference §2 caveat 1); any `app_xid_repeat` application XIDs within
      // the window make the GPU suspect (Degraded; reference §5 operational rule 2, softened
      // because tau cannot tell whether the repeats came from one buggy job).
      state.app_xids.push_back({r.xid, now_ms});
      int same_109 = 0;
      for (const XidEvent& e : state.app_xids) same_109 += e.xid == kXidCtxswTimeout;
      if (r.xid == kXidCtxswTimeout && same_109 >= 2) {
        CheckResult repeat = r;
        repeat.check = "xid_109_repeated";
        repeat.status = CheckStatus::kFail;
        repeat.action = Action::kResetGpu;
        repeat.clear = ClearRule::kOnGpuReset;
        repeat.message = fmt::format("XID 109 (CTXSW_TIMEOUT_ERROR) {} times within {}", same_109,
                                     FormatWindow());
        repeat.source = "tau reference gpu-health.md §2 caveat 1 (catalog: RESET_GPU)";
        Apply(state, now_ms, repeat);
      } else if (int(state.app_xids.size()) >= policy_.app_xid_repeat) {
        CheckResult repeat = r;
        repeat.check = "xid_app_repeated";
        repeat.status = CheckStatus::kWarn;
        repeat.action = Action::kWatch;
        repeat.clear = ClearRule::kAfterQuietPeriod;
        repeat.message = fmt::format("{} application XIDs within {} (latest {})",
                                     state.app_xids.size(), FormatWindow(), r.xid);
        repeat.threshold =
            fmt::format("≥ {} application XIDs within {}", policy_.app_xid_repeat, FormatWindow());
        repeat.source = "tau reference gpu-health.md §5 operational rule 2";
        Apply(state, now_ms, repeat);
      }
      return;
    }
    case CheckStatus::kPass: {
      auto it = state.conditions.find(r.check);
      if (it == state.conditions.end()) return;
      Condition& c = it->second;
      c.consecutive_fail = 0;
      if (!c.active) {
        // Rule: a failure that never got through debouncing is forgotten at the first pass.
        state.conditions.erase(it);
        return;
      }
      ++c.consecutive_pass;
      // Rule: transient conditions clear after `clear_observations` consecutive passes; an Unknown
      // (NVML error) clears at the first good reading. Sticky ones (reset, reboot) do not clear
      // here.
      int needed = c.reason.status == CheckStatus::kError ? 1 : policy_.clear_observations;
      if (c.reason.clear == ClearRule::kAfterHealthyObservations && c.consecutive_pass >= needed) {
        state.conditions.erase(it);
      }
      return;
    }
    case CheckStatus::kWarn:
    case CheckStatus::kFail:
    case CheckStatus::kError:
      break;
  }
  auto [it, inserted] = state.conditions.try_emplace(r.check);
  Condition& c = it->second;
  Reason& reason = c.reason;
  if (inserted) {
    reason.check = r.check;
    reason.first_seen_ms = now_ms;
  }
  c.consecutive_pass = 0;
  ++c.consecutive_fail;
  ++reason.count;
  reason.last_seen_ms = now_ms;
  if (c.active && Sticky(reason.clear)) {
    // Rule: a condition that needs a reset or reboot keeps its worst status, action and clear rule.
    if (Rank(r.status) > Rank(reason.status)) reason.status = r.status;
    reason.action = std::max(reason.action, r.action);
    reason.clear = std::max(reason.clear, r.clear);
  } else {
    reason.status = r.status;
    reason.action = r.action;
    reason.clear = r.clear;
  }
  if (!r.message.empty()) reason.message = r.message;
  reason.threshold = r.threshold;
  reason.source = r.source;
  c.debounce = r.debounce > 0 ? r.debounce : policy_.debounce_observations;
  c.escalate_after_ms = r.escalate_after_ms;
  // Rule: a failing result counts after `debounce` consecutive failing observations.
  if (!c.active && c.consecutive_fail >= c.debounce) {
    c.active = true;
    reason.active_since_ms = now_ms;
  }
}

std::string VerdictTracker::FormatWindow() const {
  return fmt::format("{} h", policy_.app_xid_window_ms / 3'600'000);
}

std::optional<VerdictChange> VerdictTracker::Recompute(int gpu, GpuState& state, int64_t now_ms) {
  std::erase_if(state.app_xids,
                [&](const XidEvent& e) { return now_ms - e.at_ms >= policy_.app_xid_window_ms; });
  for (auto it = state.conditions.begin(); it != state.conditions.end();) {
    Condition& c = it->second;
    Reason& reason = c.reason;
    // Rule: event-only warnings clear after a quiet period without recurrence.
    if (reason.clear == ClearRule::kAfterQuietPeriod &&
        now_ms - reason.last_seen_ms >= policy_.quiet_period_ms) {
      it = state.conditions.erase(it);
      continue;
    }
    // Rule: a warning that stays active longer than its escalation time becomes a failure.
    if (c.active && c.escalate_after_ms > 0 && reason.status == CheckStatus::kWarn &&
        now_ms - reason.active_since_ms >= c.escalate_after_ms) {
      reason.status = CheckStatus::kFail;
      reason.message += fmt::format(" (for more than {} min)", c.escalate_after_ms / 60000);
    }
    ++it;
  }
  Verdict verdict = Verdict::kHealthy;
  int worst = 0;
  for (const auto& [name, c] : state.conditions) {
    if (c.active) worst = std::max(worst, Rank(c.reason.status));
  }
  if (!state.observed) {
    verdict =
        Verdict::kUnknown;  // Rule: never observed (or reset and not yet re-checked) → Unknown.
  } else if (worst == 3) {
    verdict = Verdict::kUnhealthy;
  } else if (worst == 2) {
    verdict = Verdict::kUnknown;
  } else if (worst == 1) {
    verdict = Verdict::kDegraded;
  }
  if (verdict == state.verdict) return std::nullopt;
  VerdictChange change;
  change.gpu_index = gpu;
  change.old_verdict = state.verdict;
  change.new_verdict = verdict;
  change.at_ms = now_ms;
  state.verdict = verdict;
  state.since_ms = now_ms;
  change.reasons = Describe(gpu, state).reasons;
  return change;
}

std::optional<VerdictChange> VerdictTracker::Observe(int gpu, int64_t now_ms,
                                                     const std::vector<CheckResult>& results) {
  GpuState& state = gpus_[gpu];
  state.observed = true;
  for (const CheckResult& r : results) Apply(state, now_ms, r);
  return Recompute(gpu, state, now_ms);
}

std::optional<VerdictChange> VerdictTracker::ClearAfterReset(int gpu, int64_t now_ms) {
  GpuState& state = gpus_[gpu];
  // Rule: a GPU reset clears everything but what needs a reboot; the GPU is Unknown until the next
  // observation re-checks it (a condition that persists comes back then).
  std::erase_if(state.conditions, [](const auto& entry) {
    return entry.second.reason.clear != ClearRule::kOnReboot;
  });
  state.app_xids.clear();
  state.observed = false;
  return Recompute(gpu, state, now_ms);
}

std::optional<VerdictChange> VerdictTracker::ClearAll(int gpu, int64_t now_ms) {
  GpuState& state = gpus_[gpu];
  // Rule: an operator override clears everything, reboot-only conditions included; re-checked next.
  state.conditions.clear();
  state.app_xids.clear();
  state.observed = false;
  return Recompute(gpu, state, now_ms);
}

GpuVerdict VerdictTracker::Describe(int gpu, const GpuState& state) const {
  GpuVerdict v;
  v.gpu_index = gpu;
  v.verdict = state.verdict;
  v.since_ms = state.since_ms;
  for (const auto& [name, c] : state.conditions)
    (c.active ? v.reasons : v.pending).push_back(c.reason);
  auto worse = [](const Reason& a, const Reason& b) {
    if (Rank(a.status) != Rank(b.status)) return Rank(a.status) > Rank(b.status);
    return a.first_seen_ms < b.first_seen_ms;
  };
  std::sort(v.reasons.begin(), v.reasons.end(), worse);
  std::sort(v.pending.begin(), v.pending.end(), worse);
  if (!state.observed) {
    Reason r;
    r.check = "observed";
    r.status = CheckStatus::kError;
    r.message = "not checked yet";
    v.reasons.insert(v.reasons.begin(), r);
  }
  v.recent_xids = state.app_xids;
  return v;
}

GpuVerdict VerdictTracker::Get(int gpu) const {
  auto it = gpus_.find(gpu);
  if (it == gpus_.end()) return Describe(gpu, GpuState{});
  return Describe(gpu, it->second);
}

std::vector<GpuVerdict> VerdictTracker::All() const {
  std::vector<GpuVerdict> out;
  for (const auto& [gpu, state] : gpus_) out.push_back(Describe(gpu, state));
  return out;
}

}  // namespace tau::health
