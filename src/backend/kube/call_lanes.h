// The calls that change a cluster (create an attempt's objects, delete them), made off the
// decision thread: one lane per namespace, each a thread that makes its calls in the order they
// were given (so a delete follows the create it undoes). A call the API server holds (an admission
// webhook that does not answer, a namespace's quota check) then holds up its own namespace only.
// Reads that must not wait on the watches (a failed attempt's pods) go in a lane of their own per
// namespace, so that a held write does not hold them up.
//
// Each call runs under a time budget (kubeapi::CallBudget), and a lane whose calls failed as
// Unavailable `breaker_failures` times in a row opens its breaker for `breaker_open_ms`: calls
// given to it meanwhile fail at once, saying so, instead of each waiting out its budget against
// an API server that does not answer; the first call after that tries again (half-open).
// Internal to the Kubernetes backend (kube_cluster.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"

namespace tau::server {

class CallLanes {
 public:
  struct Options {
    int64_t budget_ms = 30'000;  // per call, all its tries together
    int breaker_failures = 3;
    int64_t breaker_open_ms = 30'000;
    std::function<int64_t()> now;  // monotonic milliseconds; MonotonicMillis when unset
  };
  using Call = std::function<Status()>;
  using Done = std::function<void(const Status&)>;

  explicit CallLanes(Options options);
  ~CallLanes();
  CallLanes(const CallLanes&) = delete;
  CallLanes& operator=(const CallLanes&) = delete;

  // Queues `call` on `lane` (its thread starts with the first call); `done` gets its result on
  // that thread. After Stop, and for calls still queued at Stop, `done` gets Unavailable.
  void Submit(const std::string& lane, Call call, Done done);
  // Raised for the calls in progress, which end early as Unavailable (see kubeapi::CallBudget);
  // Stop waits for them.
  const std::atomic<bool>* stopping() const { return &stopping_; }
  void Stop();
  // Calls queued or in progress on `lane` (tests).
  size_t Pending(const std::string& lane);

 private:
  struct Lane {
    std::deque<std::pair<Call, Done>> queue;
    bool busy = false;  // a call in progress
    int failures = 0;   // Unavailable results in a row
    int64_t open_until = 0;
    std::thread thread;
  };
  void Serve(Lane* lane);
  int64_t Now() const;

  const Options options_;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  CondVar cv_;
  bool stopped_ TAU_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Lane>> lanes_ TAU_GUARDED_BY(mu_);
};

}  // namespace tau::server
