// The controller: owns the life of every run on the local backend. One thread makes every decision
// (admission, starting attempts, handling exits, cancels), so decisions never race; API threads
// hand it work through an inbox. Each decision is committed to the store before it is acted on.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "health/health.h"
#include "runtime/runtime.h"
#include "server/snapshot.h"
#include "spec/spec.h"
#include "store/store.h"

namespace tau::server {

struct ControllerOptions {
  std::string home;        // TAU_HOME
  std::string tau_binary;  // started as `tau __shim DIR` for each attempt
  int64_t stop_grace_ms = 10'000;
  int64_t cpu_capacity_milli = 0;     // 0: detect
  int64_t memory_capacity_bytes = 0;  // 0: detect
};

struct SubmitRequest {
  std::string spec_file;  // for messages
  std::string spec_yaml;
  std::vector<CodeFile> code;
};

// A submission that was refused: the diagnostics (spec errors) or a single message.
struct SubmitError {
  Status status;
  std::vector<spec::Diagnostic> diagnostics;
};

class Controller {
 public:
  Controller(ControllerOptions options, store::Store* store, health::GpuInventory gpus);
  ~Controller();

  // Recovers the state left by a previous server (re-adopting live attempts), then starts the loop.
  Status Start();
  void Stop();

  // Validates, snapshots and records a new run; it is queued when this returns.
  Result<store::RunRecord> Submit(SubmitRequest request, SubmitError* error);
  Status Cancel(const std::string& name);
  // A new run from a finished run's recorded spec and code snapshot. `warning` is set when the
  // recorded spec no longer gives the recorded config hash (tau changed how it reads it).
  Result<store::RunRecord> Rerun(const std::string& name, std::string* warning);
  // Another attempt of a failed or cancelled run, resuming from `from` (a checkpoint inside the
  // run's checkpoint directory; empty: the newest complete one). Refused after OOMKilled unless
  // `force`.
  Status Resume(const std::string& name, const std::string& from, bool force);
  // A GPU's health verdict changed (called from the GPU monitor's threads; only queues the news). A
  // GPU that is not placeable is given to no run, and attempts using it are stopped as GPUError.
  void OnGpuVerdict(int gpu, bool placeable, const std::string& why);

  // For queued runs: {"position": n (1 = next), "reason": "..."}; null when the run is not pending.
  nlohmann::json PendingInfo(const std::string& name);
  nlohmann::json Capacity();
  const health::GpuInventory& gpus() const { return gpus_; }
  std::string RunDir(const std::string& name) const { return options_.home + "/runs/" + name; }
  std::string AttemptDir(const std::string& name, int attempt) const;

 private:
  struct Resources {
    int gpus = 0;
    int64_t cpu_milli = 0;
    int64_t memory_bytes = 0;
  };
  struct ActiveRun {
    store::RunRecord record;
    spec::RunSpec spec;
    Resources need;
    std::optional<runtime::ProcessId> shim;
    std::string
        gpu_error;  // set when its attempt is stopped because a GPU it uses turned unhealthy
    std::string resume_from;  // a checkpoint chosen with `tau resume --from`, for the next attempt
  };
  struct ResumeRequest {
    std::string name, from;
  };
  void HandleResume(const ResumeRequest& request, store::Batch* batch);
  struct GpuNews {
    int gpu;
    bool placeable;
    std::string why;
  };
  void HandleGpuNews(const GpuNews& news, store::Batch* batch);

  void Loop();
  // Inserts `r` as "<base>-<random hex>", drawing again while the name is taken.
  Status InsertWithUniqueName(
      store::RunRecord* r, const std::string& base,
      const std::function<std::vector<store::Event>(const std::string&)>& events);
  void Recover(store::Batch* batch);
  void AdmitQueued(store::Batch* batch, std::vector<std::string>* to_start);
  void StartAttempt(const std::string& name, store::Batch* batch);
  void HandleExit(const std::string& name, store::Batch* batch);
  void HandleCancel(const std::string& name, store::Batch* batch);
  void Finish(ActiveRun& run, store::RunState state, const std::string& reason,
              const std::string& message, store::Batch* batch);
  // A failed attempt: retried when the spec's resilience policy allows it, else the run fails.
  void FailAttempt(ActiveRun& run, const std::string& failure_class, const std::string& message,
                   store::Batch* batch);
  void ReleaseResources(ActiveRun& run);
  int64_t NextWakeMillis() const;
  void Transition(ActiveRun& run, store::RunState state, const std::string& event_type,
                  const std::string& message, store::Batch* batch,
                  nlohmann::json data = nlohmann::json::object());
  void RefreshPending();
  Result<ActiveRun> Load(const store::RunRecord& record);
  void CommitOrDie(store::Batch batch);
  Resources Needs(const spec::RunSpec& spec) const;
  std::string Refusal(const Resources& need) const;
  runtime::EnvList BaseEnv() const;

  const ControllerOptions options_;
  store::Store* const store_;
  const health::GpuInventory gpus_;
  std::unique_ptr<runtime::ProcessWatcher> watcher_;
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                               // GUARDED_BY(mu_)
  std::deque<std::string> inbox_new_;                   // GUARDED_BY(mu_)
  std::deque<std::string> inbox_cancel_;                // GUARDED_BY(mu_)
  std::deque<std::string> inbox_exited_;                // GUARDED_BY(mu_)
  std::deque<GpuNews> inbox_gpu_;                       // GUARDED_BY(mu_)
  std::deque<ResumeRequest> inbox_resume_;              // GUARDED_BY(mu_)
  std::map<std::string, nlohmann::json> pending_info_;  // GUARDED_BY(mu_)
  nlohmann::json capacity_info_;                        // GUARDED_BY(mu_)

  // Owned by the loop thread.
  std::map<std::string, ActiveRun> active_;
  std::set<int> free_gpus_;
  std::map<int, std::string> unplaceable_gpus_;  // GPU index -> why (Unhealthy or Unknown verdict)
  int64_t free_cpu_milli_ = 0;
  int64_t free_memory_bytes_ = 0;
  int64_t cpu_capacity_milli_ = 0;
  int64_t memory_capacity_bytes_ = 0;
};

}  // namespace tau::server
