// Where runs' attempts are admitted and run: this machine (local_backend.h: the Kueue-model engine
// decides, placement puts attempts on GPUs, CPUs and memory, supervisors run them) or a Kubernetes
// cluster (kube_backend.h: Kueue admits, the kubelets run the pods). The controller keeps every
// decision about runs that is the same everywhere (records, transitions, retries, cancels,
// evidence) and calls its backend at the fixed steps of each pass of its loop:
//
//   1. the inbox's news: exits and an engine's news go to the backend (HandleExit, HandleNews)
//   2. Schedule: admit and place (local), or create what Kueue should admit (Kubernetes)
//   3. the controller commits; Committed: act on committed stops
//   4. Launch: start the attempts decided in 2; the controller commits; Launched
//
// Everything here runs on the decision thread, except where a method says otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/admission.h"
#include "backend/active_run.h"
#include "backend/capabilities.h"
#include "backend/inbox.h"
#include "common/metrics.h"
#include "evidence/evidence.h"
#include "policy/policy.h"
#include "recovery/failure_class.h"
#include "run/run_machine.h"
#include "spec/spec.h"
#include "store/store.h"

namespace tau::server {

// tau's admission engine and what it holds of the runs: on this machine it decides; on a cluster
// it mirrors what Kueue admitted, for `tau queues`.
struct QuotaBook {
  std::optional<admission::Engine> engine;
  // The engine's workloads: run -> holds quota (else pending in it). Changed only through
  // SetInEngine and EraseFromEngine, which keep `holders()` in step: the runs holding quota, few
  // whatever the queues' depth, so what looks at them costs no walk of the queued runs.
  const std::map<std::string, bool>& in_engine() const { return in_engine_; }
  const std::set<std::string>& holders() const { return holders_; }
  void SetInEngine(const std::string& run, bool holds) {
    in_engine_[run] = holds;
    if (holds)
      holders_.insert(run);
    else
      holders_.erase(run);
  }
  bool EraseFromEngine(const std::string& run) {  // true when the engine had it
    holders_.erase(run);
    return in_engine_.erase(run) > 0;
  }
  void ClearEngine() {
    in_engine_.clear();
    holders_.clear();
  }
  std::map<std::string, std::string> outside;             // run -> why the engine cannot take it
  std::map<std::string, admission::PendingInfo> pending;  // as of the last cycle
  // `pending` is to be read again from the engine before it is used: a cycle ran since. Read only
  // when the views are built (O(pending runs)), not after every cycle.
  bool pending_stale = false;

 private:
  std::map<std::string, bool> in_engine_;
  std::set<std::string> holders_;
};

// The controller as its backend sees it.
class RunHost {
 public:
  virtual ~RunHost() = default;
  virtual std::map<std::string, ActiveRun>& active() = 0;
  virtual QuotaBook& quota() = 0;
  virtual int64_t Now() = 0;
  virtual store::Store* store() = 0;
  virtual Metrics* metrics() = 0;                                  // may be null
  virtual std::shared_ptr<const policy::Platform> platform() = 0;  // the one the loop decides with
  virtual std::string RunDir(const std::string& run) const = 0;
  virtual std::string AttemptDir(const std::string& run, int attempt) const = 0;
  virtual std::string StorageDir(const store::RunRecord& run, const std::string& role) const = 0;
  // News for the decision thread (callable from any thread).
  virtual void Post(InboxMessage message) = 0;

  // Record keeping, the same on every backend: a backend says what happened to a run's attempt,
  // and the controller writes the records and decides what follows (run/run_machine.h).
  // The engine admitted the run (the backend has set what it assigned: gpus, flavors, the time).
  virtual void RunAdmitted(ActiveRun& run, const std::string& message, nlohmann::json data,
                           store::Batch* batch) = 0;
  // The attempt runs (its record as the backend knows it: number, dir, gpus, supervisor).
  virtual void AttemptRunning(ActiveRun& run, store::AttemptRecord attempt,
                              const std::string& message, nlohmann::json data,
                              store::Batch* batch) = 0;
  // The attempt ended as `end` says: written into its record; then the one dispatch moves the
  // run on (succeeded, cancelled, preempted back to its queue, else retried or failed).
  virtual void AttemptEnded(ActiveRun& run, store::AttemptRecord attempt,
                            const run::AttemptEnd& end, store::Batch* batch) = 0;
  // The attempt vanished (its processes, or its Job): it ends NodeLost, then as AttemptEnded.
  virtual void AttemptVanished(ActiveRun& run, store::AttemptRecord attempt,
                               const std::string& message, store::Batch* batch) = 0;
  // A cancel of a run none of whose attempts runs (any more): the run ends Cancelled.
  virtual void RunCancelled(ActiveRun& run, const std::string& message, store::Batch* batch) = 0;
  // A run preempted while no attempt of it runs goes back to its queue (a preemption).
  virtual void Requeue(ActiveRun& run, const std::string& message, store::Batch* batch) = 0;
  // A run admitted whose attempt never started goes back to its queue (no preemption: e.g. the
  // server stopped before the engine took the attempt).
  virtual void ReturnToQueue(ActiveRun& run, const std::string& message, store::Batch* batch) = 0;
  virtual void Count(const std::string& name, const Labels& labels) = 0;
  // Checks that every SECRET:KEY of `spec`'s env exists in the workspace; with `resolved_spec`,
  // also puts the values in its env (for launching only).
  virtual Status CheckSecrets(const spec::RunSpec& spec, const std::string& workspace,
                              spec::RunSpec* resolved_spec) = 0;
  // The values of the secrets the run's env refers to, which its logs are masked of as they are
  // written (empty when it refers to none).
  virtual Result<std::vector<std::string>> LogSecrets(const store::RunRecord& run) = 0;
  // The attempt's processes are gone: the evidence worker reads the rest of its metric points
  // (on its own thread), and the run's next attempt is not admitted before it has.
  virtual void AttemptMetricsEnded(const std::string& run, int attempt) = 0;
};

// An attempt whose metrics and GPU samples the evidence worker follows.
struct RunningAttempt {
  std::string run;
  int attempt = 0;
  std::vector<int> gpus;
};

// This machine's size and what is free of it.
struct MachineCapacity {
  int64_t gpus_total = 0, gpus_free = 0, gpus_unplaceable = 0;
  int64_t cpu_milli_total = 0, cpu_milli_free = 0;
  int64_t memory_bytes_total = 0, memory_bytes_free = 0;
};

// What a submission is checked against before it is recorded.
struct SubmissionCheck {
  const spec::RunSpec* spec = nullptr;
  const policy::ResolvedRun* resolved = nullptr;
  const policy::Platform* platform = nullptr;
  Resources need;
  std::string spec_file;
  std::string snapshot_dir;
  const nlohmann::json* snapshot_files = nullptr;  // [{"path": ...}]: the files of the code
  const policy::Caller* caller = nullptr;
  bool token_user = false;  // the caller signed in with a token (not known to the kernel)
  // A name as long as the longest its runs will get (their random digits are drawn at the insert,
  // after the checks): a backend that derives object names from it checks their length with it.
  std::string run_name;
  // Out: the system user the run's processes will run as ("" for the server's own user), when
  // the backend runs them on this machine; kept with the run.
  std::optional<std::string>* run_as = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The engine's name, as registered (engines/engines.h); API replies and records say it.
  virtual const char* Name() const = 0;
  // What the engine can do (capabilities.h): asked instead of its name.
  virtual Capabilities Caps() const = 0;
  // The optional interfaces an engine may offer; null where it has none.
  // A service's objects run by the engine itself (else its replicas are runs on this machine).
  virtual ServiceDriver* services() { return nullptr; }

  // Starts following attempts (news reaches the host's inbox). `applied` is the platform file's
  // platform when one was applied (not the built-in default).
  virtual Status Start(RunHost* host, const policy::Platform* applied) = 0;
  virtual void Stop() = 0;
  // Refuses, at submission, a run whose size can never fit here (before its code is stored).
  virtual Status CheckFits(const Resources& need) = 0;
  // Refuses, at submission, a run that cannot run here for another reason, with a message that
  // says why.
  virtual Status Check(const SubmissionCheck& check) = 0;
  // Makes a newly applied platform hold here too; refused: the controller keeps the old one.
  virtual Status ApplyPlatform(const policy::Platform& platform) = 0;
  // After a restart: brings a recovered run that was admitted or running up to date with what
  // exists now (re-adopting live attempts, losing vanished ones).
  virtual void Recover(ActiveRun& run, store::Batch* batch) = 0;

  // The steps of a pass (see above).
  virtual void HandleExit(const std::string& run, store::Batch* batch) = 0;
  virtual void HandleNews(const AttemptNews& news, store::Batch* batch) = 0;
  virtual void HandleGpuNews(const GpuNews& news, store::Batch* batch) = 0;
  // A cancel of a run that has not ended (cancel_requested is already set).
  virtual void Cancel(ActiveRun& run, store::Batch* batch) = 0;
  // Stops a running attempt that the server found broken (a service's replica failing its
  // liveness probe): it ends as `cls`, and the run's retry policy decides what follows.
  virtual void StopAttempt(ActiveRun& run, recovery::FailureClass cls, const std::string& why,
                           store::Batch* batch) = 0;
  virtual void Schedule(store::Batch* batch) = 0;
  virtual void Committed() = 0;
  virtual void Launch(store::Batch* batch) = 0;
  virtual void Launched() = 0;

  // What the run held of the backend is given back (it ended, or goes back to its queue).
  virtual void Release(ActiveRun& run) = 0;
  // The run has ended and left the controller's active runs: the backend drops what it keeps of it.
  virtual void Forget(const std::string& run) = 0;
  // Why a queued run waits, when the backend knows better than the queue (null: ask the queue).
  virtual nlohmann::json PendingReason(const ActiveRun& run, int64_t now) = 0;
  // What a requeued run's next attempt will resume from ("" when the backend cannot tell).
  virtual std::string RequeueNote(const ActiveRun& run) = 0;
  // How long the loop may sleep for the backend's deadlines (ms from `now`; at most `limit`).
  virtual int64_t NextWakeMillis(int64_t now, int64_t limit) const = 0;
  // Guardrails (docs/budgets.md, "Idle and stalled runs"). The bytes of logs and metrics the run's
  // running attempt has written, its progress; nullopt where the backend cannot tell.
  virtual std::optional<int64_t> OutputBytes(const ActiveRun&) { return std::nullopt; }
  // Asks the running attempt's Python workers to write their stacks into their logs; how many
  // processes were asked, or nullopt where the backend cannot.
  virtual std::optional<int> DumpStacks(const ActiveRun&) { return std::nullopt; }
  // The attempts whose metrics and GPU samples the evidence worker follows.
  virtual std::vector<RunningAttempt> RunningAttempts() const = 0;
  // What the evidence record says of where the run ran.
  virtual void DescribeRuntime(const store::RunRecord& r, bool final_save,
                               const evidence::RecordInput* prev,
                               evidence::RuntimeInfo* rt) const = 0;
  // What is free of the machine (/api/v1/capacity); the controller has set the totals, and
  // everything free, before it asks.
  virtual void FillCapacity(MachineCapacity* capacity) const = 0;
};

// Why the attempt before `attempt` of `run` ended (its failure class: TAU_FAILURE_REASON of the
// next one), or "" when there is none.
std::string PreviousAttemptReason(store::Store* store, const std::string& run, int attempt);

// A run's flavor assignment ({"POD_SET": {"RESOURCE": "FLAVOR"}}, as RunRecord.flavors keeps it)
// and its text ("cpu on default, nvidia.com/gpu on h200").
nlohmann::json AssignmentJson(const admission::FlavorAssignment& a);
admission::FlavorAssignment AssignmentFromJson(const nlohmann::json& j);
std::string FlavorsText(const admission::FlavorAssignment& a);

// What PendingInfo says of a queued run: {"position": n or null, "queue", "code", "reason"} and
// "detail" when there is one.
nlohmann::json PendingEntry(int position, const std::string& queue, const std::string& code,
                            const std::string& reason, const std::string& detail);

// The diagnosis of a failed attempt from its ranks' log tails (recovery::Diagnose).
nlohmann::json AttemptDiagnosis(const std::string& attempt_dir, size_t ranks,
                                const std::string& phase);

// What a running attempt has written so far, its progress for the stall guardrail
// (Backend::OutputBytes): the bytes of its ranks' logs (kept under attempt_dir/logs, on either
// backend) and of its run's metrics file.
int64_t WrittenBytes(const std::string& attempt_dir, const std::string& metrics_file);

}  // namespace tau::server
