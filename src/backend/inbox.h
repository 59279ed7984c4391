// The decision thread's inbox: every other thread (the API's, the process watcher's, the GPU
// monitor's, an engine's watches) gives the controller work as one message in one queue, and the
// loop takes all of it at the start of a pass, grouped by kind in arrival order.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "backend/active_run.h"
#include "backend/attempt_fact.h"
#include "common/mutex.h"
#include "evidence/evidence.h"
#include "policy/policy.h"

namespace tau::server {

// A run for the loop to take on: prepared by Submit, or (unset) read from the store by the loop.
struct NewRun {
  std::string name;
  std::optional<ActiveRun> run;
};
struct CancelRequest {
  std::string name;
};
// The supervisor of a run's attempt ended (the process watcher's news).
struct AttemptExited {
  std::string name;
};
struct GpuNews {
  int gpu = -1;
  bool placeable = false;     // may be given to new work
  bool stop_running = false;  // the work running on it must stop (an Unhealthy GPU)
  std::string why;
};
// A service's replica failed its liveness probe: its attempt is stopped as LivenessFailed (and
// restarted by its retry policy).
struct RestartRequest {
  std::string run, why;
};
struct ResumeRequest {
  std::string name, from;  // from: a checkpoint, or empty for the newest complete one
};
struct GpuSamples {
  std::vector<evidence::GpuSample> samples;
};
// `tau platform apply` made this platform the one to decide with.
struct PlatformChanged {
  std::shared_ptr<const policy::Platform> platform;
  int64_t generation = 0;
};

// Something a run should say in its events that a thread other than the loop noticed (a log cut
// at its cap, metric points refused past a limit, output dropped on a full disk). Recorded as an
// event of the run while it is active; dropped once it has ended.
struct RunNotice {
  std::string run;
  std::string type;     // the event's type, e.g. "LogTruncated"
  std::string message;  // for people
  nlohmann::json data = nlohmann::json::object();
};

// The evidence worker has read an ended attempt's last metric points: the run's next attempt,
// held back until then (it appends to the same file), may start. Nothing to do but pass again.
struct MetricsDrained {
  std::string run;
};

// An API call wants the loop's views (pending runs, queues, capacity) built: nothing to do but
// pass again, and build them at its end.
struct ViewsWanted {};

using InboxMessage = std::variant<NewRun, CancelRequest, AttemptExited, GpuNews, ResumeRequest,
                                  AttemptNews, GpuSamples, PlatformChanged, RunNotice,
                                  MetricsDrained, ViewsWanted, RestartRequest>;

// One pass's messages, by kind.
struct InboxTake {
  std::vector<NewRun> new_runs;
  std::vector<CancelRequest> cancels;
  std::vector<AttemptExited> exits;
  std::vector<GpuNews> gpu_news;
  std::vector<ResumeRequest> resumes;
  std::vector<RestartRequest> restarts;
  std::vector<AttemptNews> attempt_news;  // an engine's, in arrival order
  std::vector<GpuSamples> samples;
  std::vector<RunNotice> notices;
  std::vector<MetricsDrained> drained;
  std::optional<PlatformChanged> platform;  // the newest, if any
  // How many of the messages were an API call's writes (new runs, cancels, resumes, platforms),
  // counted before platforms collapse into the newest: the views say which they include.
  int64_t writes = 0;
};

class Inbox {
 public:
  // At most this many GPU sample batches wait: a stalled loop keeps the newest.
  static constexpr size_t kMaxSampleBatches = 100;

  void Push(InboxMessage message);
  // Waits until a message arrives, Close is called or `timeout_ms` passes, then takes every
  // message. False once closed.
  bool Take(int64_t timeout_ms, InboxTake* take);
  // Takes what is there without waiting (tests that drive the loop by hand).
  InboxTake TakeNow();
  // Wakes every waiter for good.
  void Close();
  // Waits up to `timeout_ms` for Close; true when closed.
  bool WaitClosed(int64_t timeout_ms);
  // The names of the new runs still waiting to be taken.
  std::vector<std::string> NewRunNames();

 private:
  InboxTake TakeLocked() TAU_REQUIRES(mu_);

  Mutex mu_;
  CondVar cv_;
  bool closed_ TAU_GUARDED_BY(mu_) = false;
  std::deque<InboxMessage> queue_ TAU_GUARDED_BY(mu_);
  size_t sample_batches_ TAU_GUARDED_BY(mu_) = 0;
};

}  // namespace tau::server
