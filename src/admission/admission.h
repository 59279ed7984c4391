// The admission engine: a pure, deterministic re-implementation of Kueue's admission model
// (ResourceFlavors, ClusterQueues in a hierarchical cohort tree, borrowing and lending limits,
// flavor fungibility, StrictFIFO / BestEffortFIFO queues, classic and fair-sharing preemption,
// and admission fair sharing: LocalQueues ordered by their decayed usage).
//
// What it offers:
//   * a data model (ResourceFlavor, Cohort, ClusterQueue, Workload) and a Config that groups it;
//   * Engine: holds the snapshot (queues, cohort tree, usage of admitted workloads) and runs one
//     scheduling cycle at a time, reporting admissions, preemptions and why every workload waits;
//   * usage and queue-order queries.
// There is no I/O and no clock: the caller passes the time (epoch milliseconds) to each call.
// The YAML simulator built on top of it lives in admission/simulate.h.
//
// Quantities are tau::Quantity (milli-units). Victims of a preemption keep their quota until the
// caller evicts or finishes them, as in Kueue; their preemptor waits
// (WaitingForPreemptedWorkloads).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/quantity.h"
#include "common/status.h"

namespace tau::admission {

// ---------------------------------------------------------------------------------------------
// Configuration model.

struct ResourceFlavor {
  std::string name;
  // A pod set's node selector keys that also appear here must match; other keys are ignored.
  std::map<std::string, std::string> node_labels;
};

struct ResourceQuota {
  std::string name;  // resource name, e.g. "cpu", "nvidia.com/gpu"
  Quantity nominal;
  std::optional<Quantity> borrowing_limit;  // unset: may borrow everything the cohort lends
  std::optional<Quantity> lending_limit;    // unset: all unused nominal quota is lendable
};

struct FlavorQuotas {
  std::string flavor;
  std::vector<ResourceQuota> resources;
};

struct ResourceGroup {
  std::vector<std::string> covered_resources;
  std::vector<FlavorQuotas> flavors;  // tried in this order
};

struct Cohort {
  std::string name;
  std::string parent;                          // empty: a root
  std::vector<ResourceGroup> resource_groups;  // optional own quota, shared with the subtree
  double fair_sharing_weight = 1.0;
};

enum class QueueingStrategy { kStrictFifo, kBestEffortFifo };
enum class WithinClusterQueue { kNever, kLowerPriority, kLowerOrNewerEqualPriority };
enum class ReclaimWithinCohort { kNever, kLowerPriority, kAny };
enum class BorrowWithinCohortPolicy { kNever, kLowerPriority };
// Kueue's MayStopSearch is kBorrow / kPreempt here.
enum class WhenCanBorrow { kBorrow, kTryNextFlavor };
enum class WhenCanPreempt { kTryNextFlavor, kPreempt };

struct PreemptionPolicy {
  WithinClusterQueue within_cluster_queue = WithinClusterQueue::kNever;
  ReclaimWithinCohort reclaim_within_cohort = ReclaimWithinCohort::kNever;
  BorrowWithinCohortPolicy borrow_within_cohort = BorrowWithinCohortPolicy::kNever;
  std::optional<int32_t> max_priority_threshold;  // borrowWithinCohort.maxPriorityThreshold
};

struct FlavorFungibility {
  WhenCanBorrow when_can_borrow = WhenCanBorrow::kBorrow;
  WhenCanPreempt when_can_preempt = WhenCanPreempt::kTryNextFlavor;
};

struct ClusterQueue {
  std::string name;
  // Kueue's admissionScope.admissionMode UsageBasedAdmissionFairSharing: pending workloads are
  // ordered by their LocalQueue's decayed usage first (needs Config::admission_fair_sharing).
  bool admission_fair_sharing = false;
  std::string cohort;  // empty: standalone; a name without a Cohort object is an implicit cohort
  QueueingStrategy queueing_strategy = QueueingStrategy::kBestEffortFifo;
  std::vector<ResourceGroup> resource_groups;
  PreemptionPolicy preemption;
  FlavorFungibility flavor_fungibility;
  double fair_sharing_weight = 1.0;
};

// Kueue's Configuration.admissionFairSharing. A LocalQueue's consumed usage is, per resource,
// consumed' = consumed * (1 - a) + admitted * a with a = 1 - 0.5^(elapsed / half_life), folded
// every sampling interval and at each admission; an admission also adds its requests times
// a(sampling interval) at once (the entry penalty), so one queue's burst is not all admitted
// before the next sample. Its usage is sum(weight[r] * consumed[r]) / the LocalQueue's weight.
struct AdmissionFairSharing {
  int64_t usage_half_life_ms = 0;                  // required, > 0
  int64_t usage_sampling_interval_ms = 300'000;    // Kueue's default, 5m
  std::map<std::string, double> resource_weights;  // unlisted resources weigh 1
};

// What one unit held from its admission at `start_ms` to its release at `end_ms` (`now_ms` while
// still held) leaves in its LocalQueue's consumed usage at `now_ms`: 0.5^((now - end) / h) -
// 0.5^((now - start) / h), the value the sampling approaches, plus its entry penalty a(interval)
// decayed since `start_ms`. A restart rebuilds each LocalQueue's usage from what its runs held
// with it (Engine::SetLocalQueueUsage).
double DecayedHolding(const AdmissionFairSharing& afs, int64_t start_ms, int64_t end_ms,
                      int64_t now_ms);

struct LocalQueue {
  std::string name;
  std::string cluster_queue;
  double fair_sharing_weight = 1.0;  // 0: always last
};

// Fair-sharing preemption strategies (Kueue's preemptionStrategies).
enum class FairSharingStrategy { kLessThanOrEqualToFinalShare, kLessThanInitialShare };

struct Config {
  std::vector<ResourceFlavor> flavors;
  std::vector<Cohort> cohorts;
  std::vector<ClusterQueue> queues;
  bool fair_sharing = false;
  std::vector<FairSharingStrategy> fair_sharing_strategies = {
      FairSharingStrategy::kLessThanOrEqualToFinalShare,
      FairSharingStrategy::kLessThanInitialShare};
  std::optional<AdmissionFairSharing> admission_fair_sharing;
  // LocalQueues with a weight; a workload may name one not listed here (weight 1).
  std::vector<LocalQueue> local_queues;
};

// ---------------------------------------------------------------------------------------------
// Workloads.

struct PodSet {
  std::string name = "main";
  int32_t count = 1;
  std::map<std::string, Quantity> requests;  // per pod
  std::map<std::string, std::string> node_selector;
  // The only flavors this pod set may use (a compute profile that pins a flavor); empty: any. Kueue
  // reaches the same through node affinity; tau states it directly so that flavors without
  // labels can be pinned too.
  std::vector<std::string> allowed_flavors;
};

// podset name -> resource -> flavor
using FlavorAssignment = std::map<std::string, std::map<std::string, std::string>>;

struct Workload {
  std::string name;   // also the UID: the last tie-break in every ordering
  std::string queue;  // ClusterQueue name
  // LocalQueue (admission fair sharing's unit of usage); empty: one named as the ClusterQueue.
  std::string local_queue;
  int32_t priority = 0;
  int64_t created_ms = 0;  // queue-order timestamp
  std::vector<PodSet> pod_sets;
  // Present when the workload already holds quota (restored state).
  std::optional<FlavorAssignment> admission;
  int64_t admitted_ms = 0;  // when the quota was reserved (ranks preemption candidates)
};

// ---------------------------------------------------------------------------------------------
// Results.

// Kueue's QuotaReserved=False reasons, plus tau's own for a workload that has not been looked at.
inline constexpr const char* kReasonWaitingForQuota = "WaitingForQuota";
inline constexpr const char* kReasonWaitingForPreemptedWorkloads = "WaitingForPreemptedWorkloads";
inline constexpr const char* kReasonExceedsMaxQuota = "ExceedsMaxQuota";
inline constexpr const char* kReasonNoMatchingFlavor = "NoMatchingFlavor";
inline constexpr const char* kReasonPending = "Pending";  // not yet a queue head

// Preemption reasons (Kueue's Preempted condition reasons).
inline constexpr const char* kPreemptInClusterQueue = "InClusterQueue";
inline constexpr const char* kPreemptInCohortReclamation = "InCohortReclamation";
inline constexpr const char* kPreemptInCohortReclaimWhileBorrowing =
    "InCohortReclaimWhileBorrowing";
inline constexpr const char* kPreemptInCohortFairSharing = "InCohortFairSharing";

struct AdmittedInfo {
  std::string name;
  std::string queue;
  FlavorAssignment flavors;
};

struct PreemptedInfo {
  std::string name;
  std::string queue;
  std::string reason;     // kPreemptIn...
  std::string preemptor;  // workload name
};

struct PendingInfo {
  std::string name;
  std::string queue;
  std::string reason;
  std::string message;
  bool inadmissible = false;  // parked until quota is released (BestEffortFIFO)
  int position = 0;           // 0-based place in its ClusterQueue's order of pending workloads
};

struct CycleResult {
  std::vector<AdmittedInfo> admitted;    // in processing order
  std::vector<PreemptedInfo> preempted;  // victims newly chosen in this cycle
  std::vector<PendingInfo> pending;      // every pending workload (when requested), by queue
  int heads = 0;                         // entries considered in this cycle
};

struct CycleOptions {
  int64_t now_ms = 0;
  // Building the full pending list costs O(pending); a driver that does not need it skips it.
  bool report_pending = true;
};

struct ResourceUsage {
  std::string flavor;
  std::string resource;
  Quantity nominal;
  Quantity usage;     // quota held by admitted workloads (victims included until evicted)
  Quantity borrowed;  // max(0, usage - nominal)
  // What one more workload could take now: the unused nominal quota plus what the cohort can still
  // lend (within borrowing and lending limits), never negative.
  Quantity available;
};

// A LocalQueue's admission-fair-sharing state (queues with admission_fair_sharing only).
struct LocalQueueUsage {
  std::string name;
  std::string queue;
  double weight = 1.0;
  std::map<std::string, double> consumed;  // resource -> decayed usage, in units (cpu: cores)
  std::map<std::string, double> admitted;  // resource -> what its workloads hold now, in units
  int64_t last_update_ms = 0;
  double usage = 0;  // what orders its workloads: weighted consumed / weight (inf at weight 0)
};

enum class WorkloadState { kPending, kAdmitted, kPreempted /* admitted, eviction pending */ };

// ---------------------------------------------------------------------------------------------
// The engine.

class Engine {
 public:
  // Validates the configuration (unique names, known flavors/cohorts, no cohort cycles, limits
  // only where Kueue allows them, every flavor covering its group's resources).
  static Result<Engine> Create(const Config& config);

  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  // Adds a workload: pending, or holding quota when `admission` is set (which must name flavors
  // the queue has for every requested resource).
  Status AddWorkload(const Workload& workload);
  // Deletes a workload (releasing its quota if it holds any).
  Status RemoveWorkload(const std::string& name);
  // The workload finished: its quota is released and it is forgotten.
  Status FinishWorkload(const std::string& name);
  // Evicts an admitted (or preempted) workload: quota released, back to pending, ordered by its
  // original creation time (Kueue's requeue after preemption).
  Status EvictWorkload(const std::string& name);

  // One scheduling cycle.
  CycleResult RunCycle(const CycleOptions& options);

  // Queries.
  Result<WorkloadState> State(const std::string& name) const;
  Result<FlavorAssignment> Assignment(const std::string& name) const;  // admitted/preempted only
  Result<std::vector<ResourceUsage>> Usage(const std::string& queue) const;
  // Same numbers for a Cohort node (usage is what its subtree takes from the cohort's pool).
  Result<std::vector<ResourceUsage>> CohortUsage(const std::string& cohort) const;
  // Pending workloads of a queue in queue order (active first in heap order is not separated:
  // this is the pure priority/timestamp order Kueue shows as positions).
  Result<std::vector<std::string>> QueueOrder(const std::string& queue) const;
  // Every pending workload with its last reason, grouped by queue in config order.
  std::vector<PendingInfo> Pending() const;
  // Names of admitted workloads (including preempted ones that still hold quota), sorted.
  std::vector<std::string> Admitted() const;
  // Workloads chosen as victims and not yet evicted.
  std::vector<std::string> PreemptedAwaitingEviction() const;
  // Admission fair sharing: every LocalQueue of a queue with it, by name.
  std::vector<LocalQueueUsage> LocalQueues() const;
  // Sets a LocalQueue's consumed usage as of `at_ms` (a restart's restore, a simulation's start).
  // Unknown LocalQueues are created for `queue`, which must use admission fair sharing.
  Status SetLocalQueueUsage(const std::string& local_queue, const std::string& queue,
                            const std::map<std::string, double>& consumed, int64_t at_ms);
  // How many workloads' room the engine holds: the most it has had at once, not how many it has
  // had in all (a removed workload's room is reused).
  size_t WorkloadSlots() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

const char* QueueingStrategyName(QueueingStrategy s);
// Kueue's spelling of the preemption policies ("Never", "LowerPriority", ...).
const char* WithinClusterQueueName(WithinClusterQueue w);
const char* ReclaimWithinCohortName(ReclaimWithinCohort r);

}  // namespace tau::admission
