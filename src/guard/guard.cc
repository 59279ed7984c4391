#include "guard/guard.h"

namespace tau::guard {

Watch::Watch(int attempt, int64_t started_ms) : attempt_(attempt), quiet_since_(started_ms) {}

void Watch::Utilisation(int64_t at_ms, double busiest_pct, const policy::IdleLimit& limit) {
  if (busiest_pct < limit.gpu_util_below_pct) {
    if (!idle_since_) idle_since_ = at_ms;
    return;
  }
  if (idle_warned_) cleared_idle_ = true;
  idle_since_.reset();
  idle_warned_ = idle_stopped_ = false;
}

void Watch::Output(int64_t at_ms, int64_t bytes) {
  // The first reading is a baseline, unless the attempt has written something since it started.
  const bool moved = last_bytes_ ? bytes != *last_bytes_ : bytes > 0;
  last_bytes_ = bytes;
  if (!moved || at_ms <= dump_settles_ms_) return;
  quiet_since_ = at_ms;
  if (stalled_) cleared_quiet_ = true;
  stalled_ = stall_stopped_ = false;
}

std::vector<Step> Watch::Check(const policy::IdleLimit* idle, const policy::StallLimit* stall,
                               int64_t now_ms) {
  std::vector<Step> steps;
  if (cleared_idle_) steps.push_back({Action::kIdleCleared, now_ms});
  if (cleared_quiet_) steps.push_back({Action::kStallCleared, quiet_since_});
  cleared_idle_ = cleared_quiet_ = false;
  if (idle && idle_since_) {
    const int64_t idle_for = now_ms - *idle_since_;
    if (!idle_warned_ && idle_for >= idle->warn_after_ms) {
      idle_warned_ = true;
      steps.push_back({Action::kIdleWarn, *idle_since_});
    }
    if (!idle_stopped_ && idle->stop_after_ms && idle_for >= *idle->stop_after_ms) {
      idle_stopped_ = true;
      steps.push_back({Action::kIdleStop, *idle_since_});
    }
  }
  if (stall) {
    const int64_t quiet_for = now_ms - quiet_since_;
    if (!stalled_ && quiet_for >= stall->after_ms) {
      stalled_ = true;
      steps.push_back({Action::kStalled, quiet_since_});
    }
    if (!stall_stopped_ && stall->stop_after_ms && quiet_for >= *stall->stop_after_ms) {
      stall_stopped_ = true;
      steps.push_back({Action::kStallStop, quiet_since_});
    }
  }
  return steps;
}

}  // namespace tau::guard
