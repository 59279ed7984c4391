// The decision thread's view of a run that has not ended: its record as last committed (or about
// to be), its spec with the resolved shape applied, and what admission sees of it. What a backend
// keeps of a run beside it (a supervisor, a cluster's objects) is the backend's own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission.h"
#include "policy/policy.h"
#include "recovery/failure_class.h"
#include "spec/spec.h"
#include "store/store.h"

namespace tau::server {

// What a run takes of a machine in all (every worker together).
struct Resources {
  int gpus = 0;
  int64_t cpu_milli = 0;
  int64_t memory_bytes = 0;
};

// An upstream run of a workflow's stage, as the stage's attempts are given it
// (TAU_UPSTREAM_<STAGE>_CHECKPOINT, ..._OUTPUT_DIR): resolved once, when the stages it waits for
// have ended.
struct UpstreamRun {
  std::string stage, run, state;
  std::string checkpoint;  // its newest complete checkpoint then ("" when it had none)
  std::string checkpoint_dir, output_dir;
};

struct ActiveRun {
  store::RunRecord record;
  spec::RunSpec spec;
  Resources need;
  std::string gpu_error;  // set when its attempt is stopped because a GPU it uses turned unhealthy
  // Set when the server stopped its attempt for another reason (Backend::StopAttempt): how the
  // attempt ends, and why.
  std::optional<recovery::FailureClass> stop_class;
  std::string stop_message;
  std::string resume_from;  // a checkpoint chosen with `tau resume --from`, for the next attempt
  policy::ResolvedRun resolved;
  admission::Workload workload;  // what the admission engine sees (pending form)
  // Set while its attempt is being stopped because the admission engine preempted it.
  std::string preempted_by, preemption_reason;
  int64_t queued_since_ms = 0;  // when it last entered the queue (after any backoff)
  // A workflow stage's upstream runs, once they have all ended as it needs (unset before, and for
  // a run of its own).
  std::optional<std::vector<UpstreamRun>> upstreams;
  // Held back by its array's max_parallel: as many of the array's runs are in play as it allows.
  bool throttled = false;
  // Held back because a budget it counts against is spent: why ("" when it is not).
  std::string budget_hold;
};

// Whether a workflow stage's run still waits for the runs of the stages before it: until the
// controller has resolved them (ActiveRun::upstreams) it stays out of admission, and no backend
// starts it.
inline bool WaitsForUpstream(const ActiveRun& run) {
  if (run.upstreams || !run.record.workflow.is_object()) return false;
  auto after = run.record.workflow.find("after");
  return after != run.record.workflow.end() && after->is_array() && !after->empty();
}

// Whether the controller holds a queued run out of admission (the stages before it, its array's
// max_parallel, a spent budget): no backend starts it, and it holds no quota.
inline bool HeldBack(const ActiveRun& run) {
  return run.throttled || !run.budget_hold.empty() || WaitsForUpstream(run);
}

}  // namespace tau::server
