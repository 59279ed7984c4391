// The decision thread's view of a run that has not ended: its record as last committed (or about
// to be), its spec with the resolved shape applied, and what admission sees of it. What a backend
// keeps of a run beside it (a supervisor, a cluster's objects) is the backend's own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "admission/admission.h"
#include "policy/policy.h"
#include "spec/spec.h"
#include "store/store.h"

namespace tau::server {

// What a run takes of a machine in all (every worker together).
struct Resources {
  int gpus = 0;
  int64_t cpu_milli = 0;
  int64_t memory_bytes = 0;
};

struct ActiveRun {
  store::RunRecord record;
  spec::RunSpec spec;
  Resources need;
  std::string gpu_error;  // set when its attempt is stopped because a GPU it uses turned unhealthy
  std::string resume_from;  // a checkpoint chosen with `tau resume --from`, for the next attempt
  policy::ResolvedRun resolved;
  admission::Workload workload;  // what the admission engine sees (pending form)
  // Set while its attempt is being stopped because the admission engine preempted it.
  std::string preempted_by, preemption_reason;
  int64_t queued_since_ms = 0;  // when it last entered the queue (after any backoff)
};

}  // namespace tau::server
