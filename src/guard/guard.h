// Guardrails over a running attempt's GPU time (docs/budgets.md, "Idle and stalled runs"): whether
// it holds GPUs it does not use, or has stopped making progress, against its workspace's
// limits.idle and limits.stall. Pure: the caller passes the time, the GPU samples and how many
// bytes of logs and metrics the attempt has written, and acts on the steps it gets back.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "policy/policy.h"

namespace tau::guard {

enum class Action {
  kIdleWarn,      // idle for limits.idle.warn_after: say so
  kIdleStop,      // idle for limits.idle.stop_after: stop the attempt as Idle
  kIdleCleared,   // after a warning, a GPU is busy again
  kStalled,       // no output for limits.stall.after: dump the workers' stacks, then say so
  kStallStop,     // no output for limits.stall.stop_after: stop the attempt as Stalled
  kStallCleared,  // after kStalled, output again
};

struct Step {
  Action action;
  int64_t since_ms = 0;  // when the idle or quiet stretch began
};

// One attempt, watched from its start. Each step is given once per stretch: an idle stretch ends
// when a sample shows a GPU at or above the threshold, a quiet one when the output grows.
class Watch {
 public:
  Watch(int attempt, int64_t started_ms);

  int attempt() const { return attempt_; }
  // A sample of the attempt's GPUs, by the busiest one.
  void Utilisation(int64_t at_ms, double busiest_pct, const policy::IdleLimit& limit);
  // The attempt's logs and metrics came to `bytes` in all, read at `at_ms`.
  void Output(int64_t at_ms, int64_t bytes);
  // The workers were asked for their stacks at `at_ms`: what they write in the next
  // kDumpSettleMs is the dump, not progress.
  void StacksDumped(int64_t at_ms) { dump_settles_ms_ = at_ms + kDumpSettleMs; }
  static constexpr int64_t kDumpSettleMs = 3000;
  // What is due at `now_ms` under the limits (null: that guardrail is off).
  std::vector<Step> Check(const policy::IdleLimit* idle, const policy::StallLimit* stall,
                          int64_t now_ms);

  // When the current stretch began (nullopt when the GPUs are busy / the output moves).
  std::optional<int64_t> idle_since() const { return idle_since_; }
  int64_t quiet_since() const { return quiet_since_; }
  // Whether the output was ever measured: where it cannot be, the stall guardrail is off.
  bool output_measured() const { return last_bytes_.has_value(); }

 private:
  int attempt_;
  std::optional<int64_t> idle_since_;
  bool idle_warned_ = false, idle_stopped_ = false;
  int64_t quiet_since_;
  std::optional<int64_t> last_bytes_;
  bool stalled_ = false, stall_stopped_ = false;
  int64_t dump_settles_ms_ = 0;
  bool cleared_quiet_ = false;  // output moved after kStalled: kStallCleared is due
  bool cleared_idle_ = false;   // a GPU got busy after kIdleWarn: kIdleCleared is due
};

}  // namespace tau::guard
