// What an engine learns of its attempts, in words every engine shares: the news a backend's own
// threads (a cluster's watches, a scheduler's polls) post to the decision thread's inbox. No
// engine's types cross here: a Kubernetes Job's conditions, a Slurm job's state, are translated
// into these inside their backends (backend/kube/, backend/slurm/).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "recovery/failure_class.h"

namespace tau::server {

// An attempt as its engine sees it now (sent when that changes).
struct AttemptFact {
  enum class Phase {
    kPending,    // waiting in the engine's own queue: position, and the engine's reason and message
    kAdmitted,   // the engine admitted it (flavors, admitted_by); nothing of it runs yet. A reason
                 // and message: what holds it up (an image that does not pull yet)
    kRunning,    // its processes run
    kSucceeded,  // it completed
    kFailed,     // it failed: failure_class says why
    kStopped,    // the engine took it back (an eviction, a preemption: failure_class): its
                 // processes are being stopped
  };
  Phase phase = Phase::kPending;
  recovery::FailureClass failure_class = recovery::FailureClass::kUnknown;
  std::string reason;
  std::string message;
  std::optional<int> exit_code;  // the failed (or first) worker's, when the engine knows it
  std::optional<int> position;   // kPending: its place in the engine's queue (1 = next)
  // kAdmitted and later: the engine's assignment, {"POD_SET": {"RESOURCE": "FLAVOR"}}, and the
  // queue of the engine that admitted it (Kueue's ClusterQueue).
  nlohmann::json flavors = nlohmann::json::object();
  std::string admitted_by;

  bool Ended() const {
    return phase == Phase::kSucceeded || phase == Phase::kFailed || phase == Phase::kStopped;
  }
};

// An engine's news of one attempt: what it observed, or how a call the backend made for it off the
// decision thread (creating it, deleting it) ended.
struct AttemptNews {
  enum class Call { kNone, kLaunched, kDeleted };
  std::string run;
  int attempt = 0;
  Call call = Call::kNone;  // kNone: an observation (fact)
  AttemptFact fact;
  Status result;  // the call's
};

}  // namespace tau::server
