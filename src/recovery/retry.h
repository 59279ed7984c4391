// The retry policy: whether a failed attempt is retried, after what backoff, or why not. Pure: the
// controller applies the decision (see docs/architecture.md, "Run states, failure classes and
// recovery").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recovery/failure_class.h"

namespace tau::recovery {

// A run's `resilience`, as the retry decision needs it.
struct RetryPolicy {
  int max_retries = 0;
  std::vector<FailureClass> retry_on;  // DefaultRetryOn() unless retry_on_set
  bool retry_on_set = false;           // whether the spec said retry_on at all
  int64_t backoff_initial_ms = 30'000;
  int64_t backoff_max_ms = 300'000;
  std::optional<int64_t> max_retry_duration_ms;  // from the run's first start

  // The classes that are retried: retry_on when the spec said it, else DefaultRetryOn().
  const std::vector<FailureClass>& EffectiveRetryOn() const;
};

// What a run has done so far.
struct AttemptHistory {
  int attempts = 0;                         // attempts made, the one that just failed included
  std::optional<int64_t> first_started_ms;  // when its first attempt started running
  // Of those, the attempts preempted and requeued: the platform's decision, so they use no retry.
  int preempted = 0;
};

struct RetryDecision {
  bool retry = false;
  int64_t backoff_ms = 0;   // how long the retry waits in the queue (computed either way)
  int retry_number = 0;     // which retry this is (1 for the first)
  std::string stop_reason;  // why the policy says stop ("" when it retries)
};

// The decision for an attempt that failed with `failure_class` at `now_ms`. A retry needs the
// class in retry_on (Unknown never), max_retries not used up (by attempts that failed, not those
// preempted), and its start (now + backoff) within max_retry_duration of the run's first start. The
// backoff is backoff_initial doubled for each retry already used, capped at backoff_max.
RetryDecision Decide(const RetryPolicy& policy, const AttemptHistory& history,
                     FailureClass failure_class, int64_t now_ms);

// The run's message when the decision is stop: the attempt's message, and why it was not retried
// when the spec asked for retries at all (max_retries or retry_on).
std::string StopMessage(const RetryPolicy& policy, const RetryDecision& decision,
                        std::string_view message);

// The message of the Retrying event: "attempt 2 failed (UserError, exit 1); retrying in 1m
// (retry 2 of 3)"; the exit code when the attempt has one.
std::string RetryingMessage(const RetryPolicy& policy, const AttemptHistory& history,
                            FailureClass failure_class, const RetryDecision& decision,
                            std::optional<int> exit_code = std::nullopt);

// A preempted run goes back to its queue, as in Kueue, without using up max_retries: preemption is
// the platform's decision, not the run's failure. Only a policy whose retry_on leaves Preempted
// out asks to fail instead.
bool PreemptionRequeues(const RetryPolicy& policy);

}  // namespace tau::recovery
