#include "recovery/retry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "recovery/failure_class.h"

namespace tau::recovery {
namespace {

using C = FailureClass;

// ---- The name table ----

TEST(FailureClassTest, NameTableIsPinned) {
  // Every class and its exact name: the store, the API, metrics and specs spell these.
  const std::vector<std::pair<C, std::string>> expected = {
      {C::kSucceeded, "Succeeded"},
      {C::kUserError, "UserError"},
      {C::kOOMKilled, "OOMKilled"},
      {C::kSetupError, "SetupError"},
      {C::kTimeout, "Timeout"},
      {C::kCancelled, "Cancelled"},
      {C::kNodeLost, "NodeLost"},
      {C::kEvicted, "Evicted"},
      {C::kGPUError, "GPUError"},
      {C::kPreempted, "Preempted"},
      {C::kSecretNotFound, "SecretNotFound"},
      {C::kLivenessFailed, "LivenessFailed"},
      {C::kIdle, "Idle"},
      {C::kStalled, "Stalled"},
      {C::kUnknown, "Unknown"},
  };
  ASSERT_EQ(AllFailureClasses().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [cls, name] = expected[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(AllFailureClasses()[i], cls);
    EXPECT_EQ(FailureClassName(cls), name);
    ASSERT_TRUE(ParseFailureClass(name).has_value());
    EXPECT_EQ(*ParseFailureClass(name), cls);
  }
}

TEST(FailureClassTest, ParseIsExact) {
  for (const char* name : {"", "oomkilled", "Oomkilled", "Timedout", "TimedOut", " Timeout",
                           "Timeout ", "Failed", "Lost"}) {
    EXPECT_FALSE(ParseFailureClass(name).has_value()) << "'" << name << "'";
  }
}

TEST(FailureClassTest, RetryOnListsKeepTheirOrder) {
  // The order shows in spec error messages, the JSON Schema and canonical JSON (config hash).
  EXPECT_EQ(FailureClassNames(RetryableFailureClasses()),
            (std::vector<std::string>{"UserError", "OOMKilled", "Preempted", "Evicted", "GPUError",
                                      "NodeLost", "Timeout", "SetupError", "LivenessFailed", "Idle",
                                      "Stalled"}));
  EXPECT_EQ(FailureClassNames(DefaultRetryOn()),
            (std::vector<std::string>{"Preempted", "Evicted", "GPUError", "NodeLost"}));
  for (C c : DefaultRetryOn()) {
    EXPECT_NE(std::find(RetryableFailureClasses().begin(), RetryableFailureClasses().end(), c),
              RetryableFailureClasses().end())
        << FailureClassName(c);
  }
}

// ---- Decide ----

RetryPolicy Policy(int max_retries, std::vector<C> retry_on = {}, bool set = false) {
  RetryPolicy p;
  p.max_retries = max_retries;
  p.retry_on = std::move(retry_on);
  p.retry_on_set = set;
  p.backoff_initial_ms = 1'000;
  p.backoff_max_ms = 10'000;
  return p;
}

struct Case {
  std::string name;
  RetryPolicy policy;
  AttemptHistory history;
  C failure_class;
  int64_t now_ms = 100'000;
  bool retry;
  int64_t backoff_ms;
  int retry_number;
  std::string stop_reason;  // "" when it retries
};

std::vector<Case> Cases() {
  const std::string kDefault = "[Preempted, Evicted, GPUError, NodeLost]";
  std::vector<Case> cases;
  // Each class against the default retry_on.
  for (C c : AllFailureClasses()) {
    bool in_default =
        std::find(DefaultRetryOn().begin(), DefaultRetryOn().end(), c) != DefaultRetryOn().end();
    std::string name(FailureClassName(c));
    std::string stop = c == C::kUnknown ? "Unknown failures are never retried"
                       : in_default     ? ""
                                        : name + " is not in resilience.retry_on " + kDefault;
    cases.push_back(
        {"default retry_on, " + name, Policy(3), {1, 0}, c, 100'000, stop.empty(), 1'000, 1, stop});
  }
  // Each class against a retry_on that lists every retryable class.
  for (C c : AllFailureClasses()) {
    bool retryable = std::find(RetryableFailureClasses().begin(), RetryableFailureClasses().end(),
                               c) != RetryableFailureClasses().end();
    std::string name(FailureClassName(c));
    std::string stop = c == C::kUnknown ? "Unknown failures are never retried"
                       : retryable      ? ""
                                        : name +
                                         " is not in resilience.retry_on [UserError, OOMKilled, "
                                         "Preempted, Evicted, GPUError, NodeLost, Timeout, "
                                         "SetupError, LivenessFailed, Idle, Stalled]";
    cases.push_back({"every retryable class, " + name,
                     Policy(3, RetryableFailureClasses(), true),
                     {1, 0},
                     c,
                     100'000,
                     stop.empty(),
                     1'000,
                     1,
                     stop});
  }
  cases.push_back({"retry_on set but empty",
                   Policy(3, {}, true),
                   {1, 0},
                   C::kNodeLost,
                   100'000,
                   false,
                   1'000,
                   1,
                   "NodeLost is not in resilience.retry_on []"});
  cases.push_back({"retry_on set replaces the default",
                   Policy(3, {C::kUserError}, true),
                   {1, 0},
                   C::kPreempted,
                   100'000,
                   false,
                   1'000,
                   1,
                   "Preempted is not in resilience.retry_on [UserError]"});
  cases.push_back({"Unknown even when listed (specs cannot, but the rule holds)",
                   Policy(3, {C::kUnknown}, true),
                   {1, 0},
                   C::kUnknown,
                   100'000,
                   false,
                   1'000,
                   1,
                   "Unknown failures are never retried"});
  // max_retries.
  cases.push_back({"max_retries 0",
                   Policy(0),
                   {1, 0},
                   C::kNodeLost,
                   100'000,
                   false,
                   1'000,
                   1,
                   "resilience.max_retries (0) is used up"});
  cases.push_back(
      {"last retry left", Policy(2), {2, 0}, C::kNodeLost, 100'000, true, 2'000, 2, ""});
  cases.push_back({"max_retries used up",
                   Policy(2),
                   {3, 0},
                   C::kNodeLost,
                   100'000,
                   false,
                   4'000,
                   3,
                   "resilience.max_retries (2) is used up"});
  cases.push_back({"no attempts counts as the first",
                   Policy(1),
                   {0, 0},
                   C::kNodeLost,
                   100'000,
                   true,
                   1'000,
                   1,
                   ""});
  // Backoff: doubling, then capped at backoff_max.
  for (auto [attempts, backoff] : std::vector<std::pair<int, int64_t>>{
           {1, 1'000}, {2, 2'000}, {3, 4'000}, {4, 8'000}, {5, 10'000}, {6, 10'000}, {60, 10'000}})
    cases.push_back({"backoff after attempt " + std::to_string(attempts),
                     Policy(100),
                     {attempts, 0},
                     C::kEvicted,
                     100'000,
                     true,
                     backoff,
                     attempts,
                     ""});
  {
    RetryPolicy p = Policy(100);
    p.backoff_initial_ms = 0;
    cases.push_back({"no backoff", p, {5, 0}, C::kEvicted, 100'000, true, 0, 5, ""});
    p.backoff_initial_ms = 20'000;
    cases.push_back(
        {"initial above max is capped", p, {1, 0}, C::kEvicted, 100'000, true, 10'000, 1, ""});
    p.backoff_initial_ms = int64_t{1} << 62;
    p.backoff_max_ms = std::numeric_limits<int64_t>::max();
    cases.push_back({"doubling does not overflow",
                     p,
                     {4, 0},
                     C::kEvicted,
                     0,
                     true,
                     std::numeric_limits<int64_t>::max(),
                     4,
                     ""});
  }
  // max_retry_duration, counted from the run's first start.
  {
    RetryPolicy p = Policy(10);
    p.max_retry_duration_ms = 60'000;
    cases.push_back(
        {"within max_retry_duration", p, {3, 50'000}, C::kGPUError, 100'000, true, 4'000, 3, ""});
    cases.push_back({"starts exactly at the end of the window",
                     p,
                     {3, 44'000},
                     C::kGPUError,
                     100'000,
                     true,
                     4'000,
                     3,
                     ""});
    cases.push_back({"the backoff pushes the retry past max_retry_duration",
                     p,
                     {3, 43'000},
                     C::kGPUError,
                     100'000,
                     false,
                     4'000,
                     3,
                     "the retry would start after its 4.0s backoff, past "
                     "resilience.max_retry_duration (1m)"});
    cases.push_back({"max_retry_duration has passed",
                     p,
                     {3, 30'000},
                     C::kGPUError,
                     100'000,
                     false,
                     4'000,
                     3,
                     "resilience.max_retry_duration (1m) has passed"});
    cases.push_back({"never started: no window yet",
                     p,
                     {3, std::nullopt},
                     C::kGPUError,
                     100'000,
                     true,
                     4'000,
                     3,
                     ""});
    cases.push_back({"max_retries is checked before the window",
                     Policy(1),
                     {2, 0},
                     C::kGPUError,
                     100'000,
                     false,
                     2'000,
                     2,
                     "resilience.max_retries (1) is used up"});
    cases.push_back({"retry_on is checked before the window",
                     p,
                     {3, 0},
                     C::kUserError,
                     100'000,
                     false,
                     4'000,
                     3,
                     "UserError is not in resilience.retry_on " + kDefault});
  }
  return cases;
}

TEST(RetryDecideTest, Table) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    RetryDecision d = Decide(c.policy, c.history, c.failure_class, c.now_ms);
    EXPECT_EQ(d.retry, c.retry);
    EXPECT_EQ(d.backoff_ms, c.backoff_ms);
    EXPECT_EQ(d.retry_number, c.retry_number);
    EXPECT_EQ(d.stop_reason, c.stop_reason);
  }
}

TEST(RetryDecideTest, Messages) {
  RetryPolicy plain;  // no resilience at all: the attempt's message alone
  RetryDecision stop = Decide(plain, {1, 0}, C::kUserError, 0);
  ASSERT_FALSE(stop.retry);
  EXPECT_EQ(StopMessage(plain, stop, "worker 0 exited with code 1"), "worker 0 exited with code 1");
  RetryPolicy asked = Policy(2);
  stop = Decide(asked, {1, 0}, C::kUserError, 0);
  EXPECT_EQ(StopMessage(asked, stop, "worker 0 exited with code 1"),
            "worker 0 exited with code 1 (not retried: UserError is not in resilience.retry_on "
            "[Preempted, Evicted, GPUError, NodeLost])");
  RetryPolicy listed = Policy(0, {C::kUserError}, true);
  stop = Decide(listed, {1, 0}, C::kUserError, 0);
  EXPECT_EQ(StopMessage(listed, stop, "boom"),
            "boom (not retried: resilience.max_retries (0) is used up)");

  RetryPolicy p = Policy(3);
  p.backoff_initial_ms = 30'000;
  p.backoff_max_ms = 300'000;
  RetryDecision retry = Decide(p, {2, 0}, C::kNodeLost, 0);
  ASSERT_TRUE(retry.retry);
  EXPECT_EQ(RetryingMessage(p, {2, 0}, C::kNodeLost, retry),
            "attempt 2 failed (NodeLost); retrying in 1m (retry 2 of 3)");
  EXPECT_EQ(RetryingMessage(p, {2, 0}, C::kUserError, retry, 3),
            "attempt 2 failed (UserError, exit 3); retrying in 1m (retry 2 of 3)");
}

TEST(RetryDecideTest, PreemptedAttemptsUseNoRetry) {
  RetryPolicy p = Policy(1);  // backoff 1 s, doubled per retry used
  // Attempts 1 and 2 were preempted and requeued; attempt 3 is the first to fail: its retry is
  // the first, with the first backoff.
  RetryDecision d = Decide(p, {3, 0, 2}, C::kNodeLost, 0);
  EXPECT_TRUE(d.retry);
  EXPECT_EQ(d.retry_number, 1);
  EXPECT_EQ(d.backoff_ms, 1'000);
  EXPECT_EQ(RetryingMessage(p, {3, 0, 2}, C::kNodeLost, d),
            "attempt 3 failed (NodeLost); retrying in 1.0s (retry 1 of 1)");
  // The same history without the preemptions has used its one retry.
  d = Decide(p, {3, 0, 0}, C::kNodeLost, 0);
  EXPECT_FALSE(d.retry);
  EXPECT_EQ(d.stop_reason, "resilience.max_retries (1) is used up");
  // And one more failure after the retry uses it up.
  EXPECT_FALSE(Decide(p, {4, 0, 2}, C::kNodeLost, 0).retry);
}

TEST(RetryPreemptionTest, RequeuesUnlessRetryOnLeavesPreemptedOut) {
  struct PreemptCase {
    std::string name;
    RetryPolicy policy;
    bool requeues;
  };
  const std::vector<PreemptCase> cases = {
      {"no retry_on: the default", Policy(0), true},
      {"no retry_on, retries asked", Policy(5), true},
      {"retry_on lists Preempted", Policy(0, {C::kUserError, C::kPreempted}, true), true},
      {"retry_on leaves Preempted out", Policy(5, {C::kUserError, C::kNodeLost}, true), false},
      {"retry_on empty", Policy(5, {}, true), false},
  };
  for (const PreemptCase& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(PreemptionRequeues(c.policy), c.requeues);
  }
}

}  // namespace
}  // namespace tau::recovery
