// Internal state of the admission engine, shared by its implementation files. Not installed.
//
// Layout: every (flavor, resource) pair the configuration mentions is interned as an FR index;
// every ClusterQueue and Cohort is a Node of one quota tree with dense per-FR vectors; pending
// workloads live in per-queue ordered sets split by scheduling-equivalence class so that a head,
// a bulk "inadmissible" move and a requeue are all O(log n).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "admission/admission.h"

namespace tau::admission {

inline constexpr int64_t kNoLimit = -1;
inline constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;

// A quantity per FR, as (fr, milli-units); short, so a vector beats a map.
using FrAmounts = std::vector<std::pair<int, int64_t>>;

struct Node {
  std::string name;
  int parent = -1;
  int root = -1;
  int cq = -1;  // index into Impl::cqs when this node is a ClusterQueue
  std::vector<int> children;
  double weight = 1.0;
  // Per FR (dense). `subtree` and `local` are derived from the configuration, `usage` from the
  // admitted workloads (for a cohort: what its children take beyond their local quota).
  std::vector<int64_t> nominal, borrowing_limit, lending_limit, subtree, local, usage;
  std::vector<char> has_fr;  // the node or its subtree lists the FR
};

// Quota arithmetic over the cohort tree (quota_tree.cc), following Kueue's resource nodes.
struct QuotaTree {
  std::vector<Node> nodes;
  int num_frs = 0;

  // Fills subtree and local quota bottom-up; call once after the structure is built.
  void Finalize();
  int64_t Available(int node, int fr) const;           // may be negative after overadmission
  int64_t PotentialAvailable(int node, int fr) const;  // reachable quota at zero usage
  int64_t LocalAvailable(int node, int fr) const;
  // Adds (or, negative, removes) usage at a node and propagates what exceeds local quota.
  void AddUsage(int node, int fr, int64_t delta);
  void AddUsage(int node, const FrAmounts& amounts, int sign);
  // 0 when `val` more fits in the node's own quota; otherwise the height of the lowest ancestor
  // subtree where it fits (the root when none does).
  int BorrowLevel(int node, int fr, int64_t val) const;
  // A proper subtree (not the whole tree) above the node has at least `val` of quota.
  bool MayReclaimInHierarchy(int node, int fr, int64_t val) const;
  bool Borrowing(int node, int fr) const { return nodes[node].usage[fr] > nodes[node].subtree[fr]; }
  // Dominant resource share with the current usage (0 for a root or a non-borrower).
  double DominantShare(int node, const std::vector<int>& fr_resource) const;
};

// Why a flavor assignment failed, as data, put into words (Engine::Impl::Explain) only when
// someone asks (Engine::Pending): a cycle nominates a head in every queue, and most of their
// messages are never read.
struct Why {
  enum Kind : uint8_t {
    kPodSet,        // starts the words of a pod set: "couldn't assign flavors to pod set P: "
    kUnavailable,   // resource not in the queue
    kNotAllowed,    // flavor not one the run may use
    kNoAffinity,    // flavor's labels against the node selector
    kOverCapacity,  // request (a) over the maximum capacity (b)
    kShortOf,       // unused quota short by (a)
  };
  Why(Kind kind, int resource, int flavor, int64_t a = 0, int64_t b = 0)
      : kind(kind), resource(resource), flavor(flavor), a(a), b(b) {}
  explicit Why(std::string podset) : kind(kPodSet), podset(std::move(podset)) {}
  Kind kind;
  int resource = -1, flavor = -1;
  int64_t a = 0, b = 0;
  std::string podset;  // kPodSet
};
using Whys = std::vector<Why>;

struct Wl;

// A queue's pending workloads of one scheduling-equivalence class (same requests, selectors and
// priority), ordered by queue order.
struct WlLess {
  const std::vector<Wl>* wls = nullptr;
  bool operator()(int a, int b) const;
};
using WlSet = std::set<int, WlLess>;

struct EqClass {
  explicit EqClass(WlLess less) : members(less) {}
  WlSet members;
  bool blocked = false;  // NoFit head: the whole class is inadmissible until quota is released
  std::string reason, message;  // `message` when `why` is empty
  Whys why;
};

struct Cq {
  ClusterQueue spec;
  int node = -1;
  struct Group {
    std::vector<int> resources;  // resource ids
    std::vector<int> flavors;    // flavor ids, in order
  };
  std::vector<Group> groups;
  std::unordered_map<int, int> group_of_resource;
  // Pending workloads.
  std::unordered_map<uint64_t, EqClass> classes;
  WlSet heads;  // first member of every unblocked class
  // Individually inadmissible workloads as (id, park sequence); an entry is stale once the
  // workload left the parked state (a vector with lazy deletion beats a tree here).
  std::vector<std::pair<int, uint64_t>> parked;
  std::vector<uint64_t> blocked;  // classes to unblock on the next release
  // Admission fair sharing: the classes of each shape, one per LocalQueue, so that a NoFit head
  // parks its shape in every LocalQueue (Kueue's equivalence hash has no LocalQueue in it).
  std::unordered_map<uint64_t, std::vector<uint64_t>> classes_of_shape;
  uint64_t seen_epoch = 0;
  int pending_count = 0;
  // Admitted workloads (victims included until evicted), for preemption candidates.
  std::vector<int> admitted;
};

// A preemption victim and the reason it is preempted for (a kPreemptIn... constant).
struct Target {
  int wl;
  const char* reason;
};

// Flavor assignment modes, worst to best (Kueue's internal order).
enum class FrMode { kNoFit = 0, kNoCandidates = 1, kPreempt = 2, kReclaim = 3, kFit = 4 };
enum class WlMode { kNoFit, kPreempt, kFit };

struct WlAssignment {
  WlMode mode = WlMode::kFit;
  int borrow_level = 0;
  std::vector<std::vector<std::pair<int, int>>> podset_flavors;  // per pod set: (resource, flavor)
  FrAmounts usage;                                               // total over pod sets
  std::vector<int> preempt_frs;                                  // FRs that need preemption
  std::string reason;  // for NoFit / Preempt without targets, with `why`
  Whys why;
  // Targets found by the per-FR preemption oracle; reusable when the workload uses one FR.
  std::vector<Target> oracle_targets;
  bool oracle_valid = false;
};

// A LocalQueue under admission fair sharing: its decayed usage and what it holds now, per
// resource id, in units (milli-units / 1000, as Kueue's AsApproximateFloat64).
struct Lq {
  std::string name;
  int cq = -1;
  double weight = 1.0;
  std::map<int, double> consumed;
  std::map<int, int64_t> admitted;  // milli-units
  int64_t last_update_ms = -1;      // -1: not sampled yet (the first sample starts its clock)
  double usage = 0;                 // weighted consumed / weight, kept with `consumed`
};

struct Wl {
  Workload spec;
  bool alive = true;
  int cq = -1;
  int lq = -1;  // Impl::lqs index when its queue uses admission fair sharing
  WorkloadState state = WorkloadState::kPending;
  uint64_t eq_hash = 0;
  uint64_t shape_hash = 0;  // eq_hash without its LocalQueue (admission fair sharing)
  bool parked = false;
  uint64_t park_seq = 0;
  bool considered = false;
  std::string reason, message;  // `message` when `why` is empty
  Whys why;
  // Holding quota.
  FlavorAssignment assignment;
  FrAmounts usage;
  int admitted_index = -1;  // position in Cq::admitted
  // Its last nomination (flavor assignment and preemption targets) and the tree version it was
  // made at: while nothing it reads has changed, a head that stays pending (waiting for its
  // victims to go, say) is nominated again from here instead of searching again.
  uint64_t nominated_version = 0;
  WlAssignment nomination;
  std::vector<Target> nomination_targets;
  // Requests per pod set, resource id -> total (count x per pod), zero requests dropped.
  std::vector<std::vector<std::pair<int, int64_t>>> podset_requests;
};

inline bool WlLess::operator()(int a, int b) const {
  const Workload& x = (*wls)[a].spec;
  const Workload& y = (*wls)[b].spec;
  if (x.priority != y.priority) return x.priority > y.priority;
  if (x.created_ms != y.created_ms) return x.created_ms < y.created_ms;
  if (x.name != y.name) return x.name < y.name;
  return a < b;
}

struct Engine::Impl {
  Config config;
  QuotaTree tree;
  std::vector<Cq> cqs;
  std::unordered_map<std::string, int> cq_by_name, cohort_node_by_name, flavor_by_name,
      resource_by_name;
  std::vector<std::string> flavor_names, resource_names;
  std::vector<std::vector<int>> fr_of;  // [flavor][resource] -> fr or -1
  std::vector<int> fr_flavor, fr_resource;
  std::vector<uint64_t> epoch;  // per root node: bumps when quota is released in the tree
  // Per root node: bumps on every change a nomination reads (usage charged or released, a
  // workload marked preempted), so an unchanged version means an unchanged nomination.
  std::vector<uint64_t> version;
  std::vector<Wl> wls;
  // Slots of removed workloads, reused by the next ones: the engine's memory follows the
  // workloads it has, not every workload it ever had.
  std::vector<int> free_wls;
  std::unordered_map<std::string, int> wl_by_name;
  // Per root node: ClusterQueues of the tree (for candidate search).
  std::vector<std::vector<int>> tree_cqs;
  // Admission fair sharing (fair_usage.cc).
  std::vector<Lq> lqs;
  std::unordered_map<std::string, int> lq_by_name;
  std::unordered_map<std::string, double> lq_weights;  // from Config::local_queues
  int LocalQueueOf(int cq, const std::string& name);   // creates it; -1 when bound to another cq
  void FoldUsage(Lq& lq, int64_t now_ms);              // decay toward what it holds now
  void SampleUsage(int64_t now_ms);                    // every LocalQueue due for a sample
  void AddEntryPenalty(int id);                        // after admitting workload `id`
  double LqUsage(const Lq& lq) const;                  // computes it
  void Reweigh(Lq& lq) { lq.usage = LqUsage(lq); }
  // The queue's next head: heads.begin(), or under admission fair sharing the head of the
  // LocalQueue with the lowest usage (then queue order).
  int AfsHead(const Cq& cq) const;
  // Queue order of two pending workloads of one queue (usage first under admission fair sharing).
  bool Before(const Cq& cq, int a, int b) const;

  // Queue operations (scheduler.cc).
  void QueuePush(int id);
  void QueueErase(int id);
  int QueueHead(const Cq& cq) const {
    if (cq.heads.empty()) return -1;
    return cq.spec.admission_fair_sharing ? AfsHead(cq) : *cq.heads.begin();
  }
  void QueuePark(int id);
  void QueueBlockClass(int id);
  void QueueUnparkAll(Cq& cq);
  bool Inadmissible(const Wl& w) const;

  int InternResource(const std::string& name);  // its id, added to fr_of's rows when new

  // Quota of admitted workloads.
  void Charge(int id, int sign);
  void Release(int id);  // removes usage and wakes the tree's inadmissible workloads

  // Flavor assignment (flavor_assigner.cc), and the words for why it failed.
  WlAssignment Assign(int id);
  std::string Explain(const Whys& why) const;
  // Preemption (preemption.cc). `request` is what the preemptor needs in total; `need` the FRs
  // that lack room. Returns victims (empty: no preemption possible).
  std::vector<Target> GetTargets(int id, const FrAmounts& request, const std::vector<int>& need);
  std::vector<Target> ClassicTargets(int id, const FrAmounts& request,
                                     const std::vector<int>& need);
  std::vector<Target> FairTargets(int id, const FrAmounts& request, const std::vector<int>& need);
  // The request fits in the preemptor's queue now (optionally without borrowing).
  bool Fits(int cq, const FrAmounts& request, bool allow_borrowing) const;
  double Drs(int node) const { return tree.DominantShare(node, fr_resource); }
};

uint64_t EquivalenceHash(const Wl& w);

}  // namespace tau::admission
