#include "run/run_machine.h"

#include <fmt/format.h>

namespace tau::run {

using recovery::FailureClass;
using store::RunState;

bool TransitionAllowed(RunState from, RunState to) {
  switch (from) {
    case RunState::kQueued:
      return to != RunState::kRunning;  // admitted first
    case RunState::kAdmitted:
      return to != RunState::kAdmitted;
    case RunState::kRunning:
      return to != RunState::kAdmitted && to != RunState::kRunning;
    case RunState::kFailed:
    case RunState::kCancelled:
      return to == RunState::kQueued;  // a resume
    case RunState::kSucceeded:
      return false;
  }
  return false;
}

Status Transition(store::RunRecord& r, RunState to, const std::string& event_type,
                  const std::string& message, nlohmann::json data, int64_t now,
                  store::Batch* batch) {
  if (!TransitionAllowed(r.state, to))
    return FailedPrecondition(fmt::format("run {} cannot move from {} to {} ({})", r.name,
                                          store::RunStateName(r.state), store::RunStateName(to),
                                          event_type));
  r.state = to;
  r.updated_ms = now;
  // What describes an ending, or the last wait, is stale once the run is back in play: a run
  // queued again has no exit code, and one admitted or running has no reason to wait (callers
  // that queue a run set the reason it waits for after this).
  if (!store::IsTerminal(to)) {
    r.finished_ms.reset();
    r.exit_code.reset();
    r.signal.reset();
    if (to != RunState::kQueued) {
      r.reason.clear();
      r.message.clear();
    }
  }
  batch->events.push_back({0, r.name, now, event_type, message, std::move(data), "", ""});
  return Status::Ok();
}

void RecordEnd(const AttemptEnd& end, int64_t now, store::AttemptRecord* a) {
  a->state = store::AttemptState::kFinished;
  a->ended_ms = end.ended_ms.value_or(now);
  a->outcome = end.outcome;
  a->reason = recovery::FailureClassName(end.failure_class);
  a->message = end.message;
  a->exit_code = end.exit_code;
  a->signal = end.signal;
  if (!end.diagnosis.is_null()) a->diagnosis = end.diagnosis;
}

AfterEnd DispatchEnd(FailureClass failure_class, const recovery::RetryPolicy& policy) {
  switch (failure_class) {
    case FailureClass::kSucceeded:
      return AfterEnd::kSucceed;
    case FailureClass::kCancelled:
      return AfterEnd::kCancel;
    case FailureClass::kPreempted:
      return recovery::PreemptionRequeues(policy) ? AfterEnd::kRequeue : AfterEnd::kRetryOrFail;
    default:
      return AfterEnd::kRetryOrFail;
  }
}

recovery::AttemptHistory HistoryOf(const store::RunRecord& r,
                                   const std::vector<store::AttemptRecord>& attempts) {
  recovery::AttemptHistory history{r.attempts, r.started_ms, 0};
  const std::string preempted = recovery::FailureClassName(FailureClass::kPreempted);
  for (const store::AttemptRecord& a : attempts)
    if (a.number < r.attempts && a.reason == preempted) ++history.preempted;
  return history;
}

}  // namespace tau::run
