// The run machine: the one place that decides how a run's state may move and what an attempt's
// end means for its run, and that writes those changes into its records. Every engine reports the
// same facts (an attempt ended as a failure class, with an exit code, a signal, a message); the
// controller applies them here, so no engine decides a run's next state itself.
//
// Pure: no I/O and no clock (the caller passes the time), and no engine's types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "recovery/failure_class.h"
#include "recovery/retry.h"
#include "store/store.h"

namespace tau::run {

// Whether a run may move from `from` to `to`. A run waits (Queued), holds quota (Admitted), runs
// (Running) and ends (Succeeded, Failed, Cancelled). It runs only once admitted; it goes back to
// its queue from any state short of an end (a retry, a preemption, a launch that failed); an end
// is final but for a resume (Failed or Cancelled back to Queued); nothing follows Succeeded.
bool TransitionAllowed(store::RunState from, store::RunState to);

// Moves `r` to `to` at `now` and appends the event that says so to `batch` (the record itself is
// the caller's to add once it has set the rest). Refused, changing nothing, when the table does
// not allow the move.
Status Transition(store::RunRecord& r, store::RunState to, const std::string& event_type,
                  const std::string& message, nlohmann::json data, int64_t now,
                  store::Batch* batch);

// How an attempt ended, as its engine observed it: facts, no decision.
struct AttemptEnd {
  recovery::FailureClass failure_class = recovery::FailureClass::kUnknown;
  std::string outcome;  // how its processes ended: runtime::OutcomeKindName, or "Lost"
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string message;  // what happened, the attempt's message
  // The run's message when this end ends the run (success, cancel) or requeues it; the
  // attempt's message when empty.
  std::string run_message;
  nlohmann::json diagnosis;         // null: none
  std::optional<int64_t> ended_ms;  // when the engine says it ended; else now
};

// Writes `end` into the attempt's record: finished, how and when.
void RecordEnd(const AttemptEnd& end, int64_t now, store::AttemptRecord* attempt);

// What an ended attempt means for its run: the one dispatch every engine's ends go through.
enum class AfterEnd {
  kSucceed,      // the run succeeded
  kCancel,       // the run is cancelled
  kRequeue,      // preempted: back to its queue, using no retry
  kRetryOrFail,  // a failure: recovery::Decide says whether it is retried
};
AfterEnd DispatchEnd(recovery::FailureClass failure_class, const recovery::RetryPolicy& policy);

// The history recovery::Decide is given when attempt `r.attempts` of `r` has just failed: the
// attempts made, when the first started, and how many earlier ones were preempted and requeued
// (the platform's decision: they use no retry). `attempts` are the run's recorded ones.
recovery::AttemptHistory HistoryOf(const store::RunRecord& r,
                                   const std::vector<store::AttemptRecord>& attempts);

}  // namespace tau::run
