#include "recovery/retry.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/clock.h"

namespace tau::recovery {
namespace {

bool Contains(const std::vector<FailureClass>& classes, FailureClass c) {
  return std::find(classes.begin(), classes.end(), c) != classes.end();
}

std::string JoinNames(const std::vector<FailureClass>& classes) {
  std::string out;
  for (FailureClass c : classes) {
    if (!out.empty()) out += ", ";
    out += FailureClassName(c);
  }
  return out;
}

// backoff_initial, 2x, 4x, ... for each retry used, capped at backoff_max.
int64_t Backoff(const RetryPolicy& policy, int retries_used) {
  int64_t backoff = policy.backoff_initial_ms;
  for (int i = 0; i < retries_used && backoff < policy.backoff_max_ms; ++i)
    backoff =
        backoff > std::numeric_limits<int64_t>::max() / 2 ? policy.backoff_max_ms : backoff * 2;
  return std::min(backoff, policy.backoff_max_ms);
}

}  // namespace

const std::vector<FailureClass>& RetryPolicy::EffectiveRetryOn() const {
  return retry_on_set ? retry_on : DefaultRetryOn();
}

RetryDecision Decide(const RetryPolicy& policy, const AttemptHistory& history,
                     FailureClass failure_class, int64_t now_ms) {
  RetryDecision d;
  const int retries_used = std::max(0, history.attempts - history.preempted - 1);
  d.retry_number = retries_used + 1;
  d.backoff_ms = Backoff(policy, retries_used);
  const std::vector<FailureClass>& retry_on = policy.EffectiveRetryOn();
  if (failure_class == FailureClass::kUnknown) {
    d.stop_reason = "Unknown failures are never retried";
  } else if (!Contains(retry_on, failure_class)) {
    d.stop_reason = fmt::format("{} is not in resilience.retry_on [{}]",
                                FailureClassName(failure_class), JoinNames(retry_on));
  } else if (retries_used >= policy.max_retries) {
    d.stop_reason = fmt::format("resilience.max_retries ({}) is used up", policy.max_retries);
  } else if (policy.max_retry_duration_ms && history.first_started_ms &&
             now_ms + d.backoff_ms - *history.first_started_ms > *policy.max_retry_duration_ms) {
    // The window bounds when attempts start: a retry that would start after it is not taken.
    d.stop_reason =
        now_ms - *history.first_started_ms > *policy.max_retry_duration_ms
            ? fmt::format("resilience.max_retry_duration ({}) has passed",
                          FormatDuration(*policy.max_retry_duration_ms))
            : fmt::format(
                  "the retry would start after its {} backoff, past "
                  "resilience.max_retry_duration ({})",
                  FormatDuration(d.backoff_ms), FormatDuration(*policy.max_retry_duration_ms));
  }
  d.retry = d.stop_reason.empty();
  return d;
}

std::string StopMessage(const RetryPolicy& policy, const RetryDecision& decision,
                        std::string_view message) {
  if (policy.max_retries > 0 || policy.retry_on_set)
    return fmt::format("{} (not retried: {})", message, decision.stop_reason);
  return std::string(message);
}

std::string RetryingMessage(const RetryPolicy& policy, const AttemptHistory& history,
                            FailureClass failure_class, const RetryDecision& decision,
                            std::optional<int> exit_code) {
  return fmt::format(
      "attempt {} failed ({}{}); retrying in {} (retry {} of {})", history.attempts,
      FailureClassName(failure_class), exit_code ? fmt::format(", exit {}", *exit_code) : "",
      FormatDuration(decision.backoff_ms), decision.retry_number, policy.max_retries);
}

bool PreemptionRequeues(const RetryPolicy& policy) {
  return !policy.retry_on_set || Contains(policy.retry_on, FailureClass::kPreempted);
}

}  // namespace tau::recovery
