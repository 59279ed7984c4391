// The failure classes of an attempt: one enum and the one table of their names. A name is what
// the store, the API, events, metrics and `resilience.retry_on` spell; nothing else spells one.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tau::recovery {

// How an attempt ended (see docs/architecture.md, "Run states, failure classes and recovery").
enum class FailureClass {
  kSucceeded,       // every process exited 0
  kUserError,       // a non-zero exit or a signal
  kOOMKilled,       // killed for running out of memory
  kSetupError,      // venv/pip, a missing launcher, an exec failure; a Job the cluster refused
  kTimeout,         // run.max_runtime passed (the runtime's OutcomeKind::kTimedOut)
  kCancelled,       // stopped by a cancel
  kNodeLost,        // its processes (or its node) vanished
  kEvicted,         // stopped without a cancel
  kGPUError,        // a GPU it used turned Unhealthy
  kPreempted,       // stopped to make room for a run the admission engine chose over it
  kSecretNotFound,  // a secret the spec names does not exist (the attempt never started)
  kLivenessFailed,  // a service's replica stopped answering its liveness probe, so it was stopped
  kIdle,            // its GPUs stayed idle past the workspace's limits.idle.stop_after
  kStalled,         // neither its logs nor its metrics moved for limits.stall.stop_after
  kUnknown,         // tau cannot tell; never retried
};

// "Succeeded", "UserError", ...: the class's name.
const std::string& FailureClassName(FailureClass c);

// The class of a name, exactly as FailureClassName spells it (case matters); nullopt otherwise.
std::optional<FailureClass> ParseFailureClass(std::string_view name);

// Every class, in the enum's order.
const std::vector<FailureClass>& AllFailureClasses();

// The classes `resilience.retry_on` accepts, in the order its error messages and the JSON Schema
// list them.
const std::vector<FailureClass>& RetryableFailureClasses();

// The classes retried when a spec does not say `retry_on`: the ones that are not the job's own
// fault.
const std::vector<FailureClass>& DefaultRetryOn();

// The names of `classes`, in their order.
std::vector<std::string> FailureClassNames(const std::vector<FailureClass>& classes);

}  // namespace tau::recovery
