#include "run/run_machine.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace tau::run {
namespace {

using recovery::FailureClass;
using store::RunState;

constexpr RunState kAll[] = {RunState::kQueued,    RunState::kAdmitted, RunState::kRunning,
                             RunState::kSucceeded, RunState::kFailed,   RunState::kCancelled};

// The whole table, written out: every pair not listed is refused.
TEST(RunMachineTest, EveryMoveOfTheTable) {
  const std::set<std::pair<RunState, RunState>> allowed = {
      // waiting: admitted, ended (cancelled, a stage whose upstream failed, a launch refused for
      // good), or queued again (a launch that failed and is retried)
      {RunState::kQueued, RunState::kQueued},
      {RunState::kQueued, RunState::kAdmitted},
      {RunState::kQueued, RunState::kSucceeded},  // a cluster's Job ended before it was seen run
      {RunState::kQueued, RunState::kFailed},
      {RunState::kQueued, RunState::kCancelled},
      // admitted: its attempt runs, or it goes back (preempted before it started), or ends
      {RunState::kAdmitted, RunState::kQueued},
      {RunState::kAdmitted, RunState::kRunning},
      {RunState::kAdmitted, RunState::kSucceeded},
      {RunState::kAdmitted, RunState::kFailed},
      {RunState::kAdmitted, RunState::kCancelled},
      // running: retried or requeued, or ended
      {RunState::kRunning, RunState::kQueued},
      {RunState::kRunning, RunState::kSucceeded},
      {RunState::kRunning, RunState::kFailed},
      {RunState::kRunning, RunState::kCancelled},
      // a resume
      {RunState::kFailed, RunState::kQueued},
      {RunState::kCancelled, RunState::kQueued},
  };
  for (RunState from : kAll)
    for (RunState to : kAll)
      EXPECT_EQ(TransitionAllowed(from, to), allowed.count({from, to}) > 0)
          << store::RunStateName(from) << " -> " << store::RunStateName(to);
}

TEST(RunMachineTest, ARefusedMoveChangesNothing) {
  store::RunRecord r;
  r.name = "r";
  r.state = RunState::kSucceeded;
  r.updated_ms = 5;
  r.exit_code = 0;
  store::Batch batch;
  Status s = Transition(r, RunState::kRunning, "Running", "again", {}, 10, &batch);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("from Succeeded to Running"), std::string::npos) << s.message();
  EXPECT_EQ(r.state, RunState::kSucceeded);
  EXPECT_EQ(r.updated_ms, 5);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(batch.events.empty());
}

TEST(RunMachineTest, AMoveBackIntoPlayClearsHowItEnded) {
  store::RunRecord r;
  r.name = "r";
  r.state = RunState::kFailed;
  r.exit_code = 3;
  r.signal = 9;
  r.finished_ms = 7;
  r.reason = "UserError";
  store::Batch batch;
  ASSERT_TRUE(
      Transition(r, RunState::kQueued, "Resumed", "resumed", {{"from", ""}}, 10, &batch).ok());
  EXPECT_EQ(r.state, RunState::kQueued);
  EXPECT_EQ(r.updated_ms, 10);
  EXPECT_FALSE(r.exit_code || r.signal || r.finished_ms);
  EXPECT_EQ(r.reason, "UserError");  // queued: the caller says why it waits
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].type, "Resumed");
  EXPECT_EQ(batch.events[0].ts_ms, 10);

  ASSERT_TRUE(Transition(r, RunState::kAdmitted, "Admitted", "in", {}, 11, &batch).ok());
  EXPECT_TRUE(r.reason.empty());  // admitted: nothing to wait for
}

// Every class under the default policy, and under one whose retry_on leaves Preempted out.
TEST(RunMachineTest, TheOneDispatchOfAnAttemptsEnd) {
  recovery::RetryPolicy plain;
  recovery::RetryPolicy no_requeue;
  no_requeue.retry_on_set = true;
  no_requeue.retry_on = {FailureClass::kUserError};
  ASSERT_TRUE(recovery::PreemptionRequeues(plain));
  ASSERT_FALSE(recovery::PreemptionRequeues(no_requeue));
  for (FailureClass c : recovery::AllFailureClasses()) {
    AfterEnd want = AfterEnd::kRetryOrFail;
    if (c == FailureClass::kSucceeded) want = AfterEnd::kSucceed;
    if (c == FailureClass::kCancelled) want = AfterEnd::kCancel;
    if (c == FailureClass::kPreempted) want = AfterEnd::kRequeue;
    EXPECT_EQ(DispatchEnd(c, plain), want) << recovery::FailureClassName(c);
    if (c == FailureClass::kPreempted) want = AfterEnd::kRetryOrFail;
    EXPECT_EQ(DispatchEnd(c, no_requeue), want) << recovery::FailureClassName(c);
  }
}

// Preempted attempts that were requeued used no retry: only earlier ones count, and the one that
// just failed is the run's newest whatever its class.
TEST(RunMachineTest, PreemptionsDoNotCountAsRetries) {
  store::RunRecord r;
  r.attempts = 4;
  r.started_ms = 100;
  std::vector<store::AttemptRecord> attempts(4);
  const char* reasons[] = {"Preempted", "UserError", "Preempted", "Preempted"};
  for (int i = 0; i < 4; ++i) {
    attempts[i].number = i + 1;
    attempts[i].reason = reasons[i];
  }
  recovery::AttemptHistory h = HistoryOf(r, attempts);
  EXPECT_EQ(h.attempts, 4);
  EXPECT_EQ(h.first_started_ms, 100);
  EXPECT_EQ(h.preempted, 2);  // attempts 1 and 3; not 4, the one that just failed

  // So a run with max_retries 1 whose attempts were preempted twice may still retry once.
  recovery::RetryPolicy policy;
  policy.max_retries = 1;
  recovery::AttemptHistory two_preempted_then_failed{3, 100, 2};
  EXPECT_TRUE(
      recovery::Decide(policy, two_preempted_then_failed, FailureClass::kNodeLost, 200).retry);
  recovery::AttemptHistory counted_as_failures{3, 100, 0};
  EXPECT_FALSE(recovery::Decide(policy, counted_as_failures, FailureClass::kNodeLost, 200).retry);
}

TEST(RunMachineTest, AnEndIsWrittenIntoTheAttempt) {
  store::AttemptRecord a;
  a.state = store::AttemptState::kRunning;
  a.exit_code = 5;  // stale: the end says
  AttemptEnd end;
  end.failure_class = FailureClass::kOOMKilled;
  end.outcome = "Failed";
  end.signal = 9;
  end.message = "killed for memory";
  end.diagnosis = {{"summary", "oom"}};
  RecordEnd(end, 42, &a);
  EXPECT_EQ(a.state, store::AttemptState::kFinished);
  EXPECT_EQ(a.ended_ms, 42);
  EXPECT_EQ(a.reason, "OOMKilled");
  EXPECT_EQ(a.outcome, "Failed");
  EXPECT_FALSE(a.exit_code);
  EXPECT_EQ(a.signal, 9);
  EXPECT_EQ(a.message, "killed for memory");
  EXPECT_EQ(a.diagnosis["summary"], "oom");

  end.ended_ms = 30;  // the engine's own time wins
  end.diagnosis = nullptr;
  RecordEnd(end, 42, &a);
  EXPECT_EQ(a.ended_ms, 30);
  EXPECT_EQ(a.diagnosis["summary"], "oom");  // none given: kept
}

}  // namespace
}  // namespace tau::run
