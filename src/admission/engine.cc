// Engine construction (configuration validation, the quota tree), workload bookkeeping and
// queries. The scheduling cycle itself is in scheduler.cc.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "admission/internal.h"
#include "common/strings.h"

namespace tau::admission {
namespace {

int64_t MulSaturating(int64_t a, int64_t b) {
  __int128 r = static_cast<__int128>(a) * b;
  return r > kUnbounded ? kUnbounded : static_cast<int64_t>(r);
}

// Validates one list of resource groups (of a queue or a cohort) and reports problems with a
// "where" prefix.
Status CheckGroups(const std::vector<ResourceGroup>& groups, const std::string& where,
                   const std::unordered_map<std::string, int>& flavors, bool has_parent) {
  std::set<std::string> seen_resources, seen_flavors;
  for (const ResourceGroup& g : groups) {
    if (g.covered_resources.empty()) {
      return InvalidArgument(
          fmt::format("{}: a resource group must cover at least one resource", where));
    }
    std::set<std::string> covered;
    for (const std::string& r : g.covered_resources) {
      if (!seen_resources.insert(r).second) {
        return InvalidArgument(
            fmt::format("{}: resource '{}' is covered by more than one resource group", where, r));
      }
      covered.insert(r);
    }
    for (const FlavorQuotas& fq : g.flavors) {
      if (!flavors.count(fq.flavor)) {
        std::vector<std::string> names;
        for (const auto& [n, i] : flavors) names.push_back(n);
        std::string hint = ClosestMatch(fq.flavor, names);
        return NotFound(fmt::format("{}: unknown resource flavor '{}'{}", where, fq.flavor,
                                    hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      }
      if (!seen_flavors.insert(fq.flavor).second) {
        return InvalidArgument(
            fmt::format("{}: flavor '{}' is listed more than once", where, fq.flavor));
      }
      std::set<std::string> listed;
      for (const ResourceQuota& rq : fq.resources) {
        if (!covered.count(rq.name)) {
          return InvalidArgument(
              fmt::format("{}: flavor '{}' lists resource '{}' that its group does not cover",
                          where, fq.flavor, rq.name));
        }
        if (!listed.insert(rq.name).second) {
          return InvalidArgument(
              fmt::format("{}: flavor '{}' lists resource '{}' twice", where, fq.flavor, rq.name));
        }
        if (!has_parent && (rq.borrowing_limit || rq.lending_limit)) {
          return InvalidArgument(fmt::format(
              "{}: borrowing_limit and lending_limit need a cohort (parent) to borrow from",
              where));
        }
      }
      if (listed.size() != covered.size()) {
        return InvalidArgument(fmt::format(
            "{}: flavor '{}' must list every covered resource of its group", where, fq.flavor));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

uint64_t EquivalenceHash(const Wl& w) {
  std::string key = std::to_string(w.spec.priority);
  for (size_t i = 0; i < w.podset_requests.size(); ++i) {
    key += '|';
    for (const auto& [r, v] : w.podset_requests[i]) key += fmt::format("{}={},", r, v);
    for (const auto& [k, v] : w.spec.pod_sets[i].node_selector) key += k + ":" + v + ",";
    for (const auto& f : w.spec.pod_sets[i].allowed_flavors) key += "@" + f + ",";
  }
  return std::hash<std::string>()(key);
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

const char* QueueingStrategyName(QueueingStrategy s) {
  return s == QueueingStrategy::kStrictFifo ? "StrictFIFO" : "BestEffortFIFO";
}

const char* WithinClusterQueueName(WithinClusterQueue w) {
  switch (w) {
    case WithinClusterQueue::kNever:
      return "Never";
    case WithinClusterQueue::kLowerPriority:
      return "LowerPriority";
    case WithinClusterQueue::kLowerOrNewerEqualPriority:
      return "LowerOrNewerEqualPriority";
  }
  return "Never";
}

const char* ReclaimWithinCohortName(ReclaimWithinCohort r) {
  switch (r) {
    case ReclaimWithinCohort::kNever:
      return "Never";
    case ReclaimWithinCohort::kLowerPriority:
      return "LowerPriority";
    case ReclaimWithinCohort::kAny:
      return "Any";
  }
  return "Never";
}

Result<Engine> Engine::Create(const Config& config) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.config = config;
  for (const ResourceFlavor& f : config.flavors) {
    if (f.name.empty()) return InvalidArgument("a resource flavor needs a name");
    if (m.flavor_by_name.count(f.name)) {
      return AlreadyExists(fmt::format("resource flavor '{}' is defined twice", f.name));
    }
    m.flavor_by_name[f.name] = static_cast<int>(m.flavor_names.size());
    m.flavor_names.push_back(f.name);
  }
  // Cohorts: explicit ones first, then implicit ones named by queues or parents.
  std::unordered_map<std::string, const Cohort*> cohort_spec;
  for (const Cohort& c : config.cohorts) {
    if (c.name.empty()) return InvalidArgument("a cohort needs a name");
    if (cohort_spec.count(c.name)) {
      return AlreadyExists(fmt::format("cohort '{}' is defined twice", c.name));
    }
    if (c.fair_sharing_weight < 0) {
      return InvalidArgument(fmt::format("cohort '{}': fair_sharing weight must be >= 0", c.name));
    }
    TAU_RETURN_IF_ERROR(CheckGroups(c.resource_groups, "cohort '" + c.name + "'", m.flavor_by_name,
                                    !c.parent.empty()));
    cohort_spec[c.name] = &c;
  }
  std::unordered_set<std::string> queue_names;
  for (const ClusterQueue& q : config.queues) {
    if (q.name.empty()) return InvalidArgument("a cluster queue needs a name");
    if (!queue_names.insert(q.name).second) {
      return AlreadyExists(fmt::format("cluster queue '{}' is defined twice", q.name));
    }
    if (q.fair_sharing_weight < 0) {
      return InvalidArgument(fmt::format("queue '{}': fair_sharing weight must be >= 0", q.name));
    }
    if (q.preemption.reclaim_within_cohort == ReclaimWithinCohort::kNever &&
        q.preemption.borrow_within_cohort != BorrowWithinCohortPolicy::kNever) {
      return InvalidArgument(fmt::format(
          "queue '{}': borrow_within_cohort needs reclaim_within_cohort other than Never", q.name));
    }
    TAU_RETURN_IF_ERROR(CheckGroups(q.resource_groups, "queue '" + q.name + "'", m.flavor_by_name,
                                    !q.cohort.empty()));
    if (q.admission_fair_sharing && !config.admission_fair_sharing) {
      return InvalidArgument(
          fmt::format("queue '{}': admission mode UsageBasedAdmissionFairSharing needs the "
                      "admission_fair_sharing settings (usage half-life, sampling interval)",
                      q.name));
    }
  }
  if (const auto& afs = config.admission_fair_sharing) {
    if (afs->usage_half_life_ms <= 0)
      return InvalidArgument("admission_fair_sharing: usage_half_life must be more than 0");
    if (afs->usage_sampling_interval_ms <= 0) {
      return InvalidArgument("admission_fair_sharing: usage_sampling_interval must be more than 0");
    }
    for (const auto& [r, w] : afs->resource_weights) {
      if (!(w >= 0) || !std::isfinite(w)) {
        return InvalidArgument(fmt::format(
            "admission_fair_sharing: the weight of resource '{}' must be a number >= 0", r));
      }
    }
  }
  for (const LocalQueue& lq : config.local_queues) {
    if (lq.name.empty()) return InvalidArgument("a local queue needs a name");
    if (!queue_names.count(lq.cluster_queue)) {
      return NotFound(
          fmt::format("local queue '{}': unknown cluster queue '{}'", lq.name, lq.cluster_queue));
    }
    if (!(lq.fair_sharing_weight >= 0) || !std::isfinite(lq.fair_sharing_weight)) {
      return InvalidArgument(
          fmt::format("local queue '{}': fair_sharing weight must be >= 0", lq.name));
    }
    if (!m.lq_weights.emplace(lq.name, lq.fair_sharing_weight).second)
      return AlreadyExists(fmt::format("local queue '{}' is defined twice", lq.name));
  }
  // Intern resources and FRs.
  auto all_groups = [&](auto&& fn) {
    for (const Cohort& c : config.cohorts) fn(c.resource_groups);
    for (const ClusterQueue& q : config.queues) fn(q.resource_groups);
  };
  all_groups([&](const std::vector<ResourceGroup>& groups) {
    for (const ResourceGroup& g : groups) {
      for (const std::string& r : g.covered_resources) m.InternResource(r);
    }
  });
  m.fr_of.assign(m.flavor_names.size(), std::vector<int>(m.resource_names.size(), -1));
  all_groups([&](const std::vector<ResourceGroup>& groups) {
    for (const ResourceGroup& g : groups) {
      for (const FlavorQuotas& fq : g.flavors) {
        int f = m.flavor_by_name[fq.flavor];
        for (const std::string& r : g.covered_resources) {
          int& fr = m.fr_of[f][m.resource_by_name[r]];
          if (fr < 0) {
            fr = static_cast<int>(m.fr_flavor.size());
            m.fr_flavor.push_back(f);
            m.fr_resource.push_back(m.resource_by_name[r]);
          }
        }
      }
    }
  });
  m.tree.num_frs = static_cast<int>(m.fr_flavor.size());
  auto new_node = [&](const std::string& name) {
    Node n;
    n.name = name;
    int k = m.tree.num_frs;
    n.nominal.assign(k, 0);
    n.borrowing_limit.assign(k, kNoLimit);
    n.lending_limit.assign(k, kNoLimit);
    n.subtree.assign(k, 0);
    n.local.assign(k, 0);
    n.usage.assign(k, 0);
    n.has_fr.assign(k, 0);
    m.tree.nodes.push_back(std::move(n));
    return static_cast<int>(m.tree.nodes.size()) - 1;
  };
  auto fill_quotas = [&](int node, const std::vector<ResourceGroup>& groups) {
    Node& n = m.tree.nodes[node];
    for (const ResourceGroup& g : groups) {
      for (const FlavorQuotas& fq : g.flavors) {
        int f = m.flavor_by_name[fq.flavor];
        for (const ResourceQuota& rq : fq.resources) {
          int fr = m.fr_of[f][m.resource_by_name[rq.name]];
          n.nominal[fr] = rq.nominal.milli();
          if (rq.borrowing_limit) n.borrowing_limit[fr] = rq.borrowing_limit->milli();
          if (rq.lending_limit) n.lending_limit[fr] = rq.lending_limit->milli();
          n.has_fr[fr] = 1;
        }
      }
    }
  };
  std::function<int(const std::string&)> cohort_node = [&](const std::string& name) -> int {
    auto it = m.cohort_node_by_name.find(name);
    if (it != m.cohort_node_by_name.end()) return it->second;
    int node = new_node(name);
    m.cohort_node_by_name[name] = node;
    auto spec = cohort_spec.find(name);
    if (spec != cohort_spec.end()) {
      m.tree.nodes[node].weight = spec->second->fair_sharing_weight;
      fill_quotas(node, spec->second->resource_groups);
    }
    return node;
  };
  for (const Cohort& c : config.cohorts) cohort_node(c.name);
  for (const Cohort& c : config.cohorts) {
    if (c.parent.empty()) continue;
    int child = m.cohort_node_by_name[c.name];
    int parent = cohort_node(c.parent);
    m.tree.nodes[child].parent = parent;
    m.tree.nodes[parent].children.push_back(child);
  }
  // Cycles: follow parents from every cohort; a walk longer than the node count loops.
  for (const Cohort& c : config.cohorts) {
    int n = m.cohort_node_by_name[c.name];
    size_t steps = 0;
    while (n >= 0 && steps <= m.tree.nodes.size()) {
      n = m.tree.nodes[n].parent;
      ++steps;
    }
    if (n >= 0) {
      return InvalidArgument(
          fmt::format("cohort '{}' is part of a cycle in the cohort tree", c.name));
    }
  }
  for (const ClusterQueue& q : config.queues) {
    int node = new_node(q.name);
    Cq cq;
    WlLess less{&m.wls};
    cq.heads = WlSet(less);
    cq.spec = q;
    cq.node = node;
    fill_quotas(node, q.resource_groups);
    m.tree.nodes[node].weight = q.fair_sharing_weight;
    m.tree.nodes[node].cq = static_cast<int>(m.cqs.size());
    for (const ResourceGroup& g : q.resource_groups) {
      Cq::Group group;
      for (const std::string& r : g.covered_resources) {
        int rid = m.resource_by_name[r];
        group.resources.push_back(rid);
        cq.group_of_resource[rid] = static_cast<int>(cq.groups.size());
      }
      for (const FlavorQuotas& fq : g.flavors) group.flavors.push_back(m.flavor_by_name[fq.flavor]);
      cq.groups.push_back(std::move(group));
    }
    if (!q.cohort.empty()) {
      int parent = cohort_node(q.cohort);
      m.tree.nodes[node].parent = parent;
      m.tree.nodes[parent].children.push_back(node);
    }
    m.cq_by_name[q.name] = static_cast<int>(m.cqs.size());
    m.cqs.push_back(std::move(cq));
  }
  // Listed LocalQueues exist from the start, so they are shown before their first workload.
  for (const LocalQueue& lq : config.local_queues) {
    int cq = m.cq_by_name[lq.cluster_queue];
    if (m.cqs[cq].spec.admission_fair_sharing) m.LocalQueueOf(cq, lq.name);
  }
  m.tree.Finalize();
  m.epoch.assign(m.tree.nodes.size(), 1);
  m.version.assign(m.tree.nodes.size(), 1);
  m.tree_cqs.assign(m.tree.nodes.size(), {});
  for (size_t i = 0; i < m.cqs.size(); ++i) {
    m.tree_cqs[m.tree.nodes[m.cqs[i].node].root].push_back(static_cast<int>(i));
  }
  return Engine(std::move(impl));
}

int Engine::Impl::InternResource(const std::string& name) {
  auto [it, inserted] = resource_by_name.emplace(name, static_cast<int>(resource_names.size()));
  if (inserted) {
    resource_names.push_back(name);
    for (auto& row : fr_of) row.push_back(-1);
  }
  return it->second;
}

void Engine::Impl::Charge(int id, int sign) {
  Wl& w = wls[id];
  Cq& cq = cqs[w.cq];
  tree.AddUsage(cq.node, w.usage, sign);
  if (w.lq >= 0) {
    Lq& lq = lqs[w.lq];
    for (const auto& [fr, v] : w.usage) lq.admitted[fr_resource[fr]] += sign * v;
  }
  ++version[tree.nodes[cq.node].root];
  if (sign > 0) {
    w.admitted_index = static_cast<int>(cq.admitted.size());
    cq.admitted.push_back(id);
  } else {
    int idx = w.admitted_index;
    int last = cq.admitted.back();
    cq.admitted[idx] = last;
    wls[last].admitted_index = idx;
    cq.admitted.pop_back();
    w.admitted_index = -1;
  }
}

void Engine::Impl::Release(int id) {
  Charge(id, -1);
  ++epoch[tree.nodes[cqs[wls[id].cq].node].root];
}

Status Engine::AddWorkload(const Workload& workload) {
  Impl& m = *impl_;
  if (workload.name.empty()) return InvalidArgument("a workload needs a name");
  if (m.wl_by_name.count(workload.name)) {
    return AlreadyExists(fmt::format("workload '{}' already exists", workload.name));
  }
  auto q = m.cq_by_name.find(workload.queue);
  if (q == m.cq_by_name.end()) {
    std::vector<std::string> names;
    for (const Cq& cq : m.cqs) names.push_back(cq.spec.name);
    std::string hint = ClosestMatch(workload.queue, names);
    return NotFound(fmt::format("workload '{}': unknown cluster queue '{}'{}", workload.name,
                                workload.queue,
                                hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }
  if (workload.pod_sets.empty()) {
    return InvalidArgument(fmt::format("workload '{}' has no pod sets", workload.name));
  }
  Wl w;
  w.spec = workload;
  w.cq = q->second;
  std::set<std::string> podset_names;
  for (const PodSet& ps : workload.pod_sets) {
    if (!podset_names.insert(ps.name).second) {
      return InvalidArgument(
          fmt::format("workload '{}': pod set '{}' appears twice", workload.name, ps.name));
    }
    if (ps.count < 0) {
      return InvalidArgument(
          fmt::format("workload '{}': pod set '{}' has a negative count", workload.name, ps.name));
    }
    std::vector<std::pair<int, int64_t>> reqs;
    for (const auto& [r, qty] : ps.requests) {
      int64_t total = MulSaturating(qty.milli(), ps.count);
      if (total == 0) continue;  // zero requests never need a flavor (Kueue ignores them)
      reqs.emplace_back(m.InternResource(r), total);
    }
    w.podset_requests.push_back(std::move(reqs));
  }
  const Cq& cq = m.cqs[w.cq];
  if (workload.admission) {
    // Restored state: the workload already holds quota in the named flavors.
    std::map<int, int64_t> usage;
    for (size_t i = 0; i < workload.pod_sets.size(); ++i) {
      const PodSet& ps = workload.pod_sets[i];
      auto ps_flavors = workload.admission->find(ps.name);
      for (const auto& [r, total] : w.podset_requests[i]) {
        const std::string& rname = m.resource_names[r];
        if (ps_flavors == workload.admission->end() || !ps_flavors->second.count(rname)) {
          return InvalidArgument(fmt::format(
              "workload '{}': admission names no flavor for resource '{}' of pod set '{}'",
              workload.name, rname, ps.name));
        }
        const std::string& fname = ps_flavors->second.at(rname);
        auto f = m.flavor_by_name.find(fname);
        auto g = cq.group_of_resource.find(r);
        bool listed = f != m.flavor_by_name.end() && g != cq.group_of_resource.end() &&
                      std::count(cq.groups[g->second].flavors.begin(),
                                 cq.groups[g->second].flavors.end(), f->second) > 0;
        if (!listed) {
          return InvalidArgument(
              fmt::format("workload '{}': queue '{}' has no flavor '{}' for resource '{}'",
                          workload.name, cq.spec.name, fname, rname));
        }
        usage[m.fr_of[f->second][r]] += total;
        w.assignment[ps.name][rname] = fname;
      }
    }
    w.usage.assign(usage.begin(), usage.end());
    w.state = WorkloadState::kAdmitted;
  }
  w.eq_hash = w.shape_hash = EquivalenceHash(w);
  if (cq.spec.admission_fair_sharing) {
    const std::string& lq_name = workload.local_queue.empty() ? cq.spec.name : workload.local_queue;
    w.lq = m.LocalQueueOf(w.cq, lq_name);
    if (w.lq < 0) {
      return InvalidArgument(fmt::format(
          "workload '{}': local queue '{}' belongs to cluster queue '{}', not '{}'", workload.name,
          lq_name, m.cqs[m.lqs[m.lq_by_name[lq_name]].cq].spec.name, cq.spec.name));
    }
    // One class per LocalQueue and shape: a class head is then its LocalQueue's first.
    w.eq_hash ^= std::hash<std::string>()(lq_name) * 0x9e3779b97f4a7c15ULL;
  }
  int id;
  if (m.free_wls.empty()) {
    id = static_cast<int>(m.wls.size());
    m.wls.push_back(std::move(w));
  } else {
    id = m.free_wls.back();
    m.free_wls.pop_back();
    // A queue's parked list may still name the slot with a sequence number of the workload that
    // had it: numbering goes on from there, so such an entry never matches the new one.
    w.park_seq = m.wls[id].park_seq;
    m.wls[id] = std::move(w);
  }
  m.wl_by_name[workload.name] = id;
  if (m.wls[id].state == WorkloadState::kAdmitted) {
    m.Charge(id, +1);
  } else {
    m.QueuePush(id);
  }
  return Status::Ok();
}

namespace {
Result<int> Find(const Engine::Impl& m, const std::string& name) {
  auto it = m.wl_by_name.find(name);
  if (it == m.wl_by_name.end()) return NotFound(fmt::format("workload '{}' not found", name));
  return it->second;
}
}  // namespace

Status Engine::RemoveWorkload(const std::string& name) {
  Impl& m = *impl_;
  TAU_ASSIGN_OR_RETURN(int id, Find(m, name));
  Wl& w = m.wls[id];
  if (w.state == WorkloadState::kPending) {
    m.QueueErase(id);
  } else {
    m.Release(id);
  }
  w.alive = false;
  m.wl_by_name.erase(name);
  // Only the parked-list bookkeeping outlives it (see AddWorkload).
  Wl freed;
  freed.alive = false;
  freed.park_seq = w.park_seq;
  w = std::move(freed);
  m.free_wls.push_back(id);
  return Status::Ok();
}

Status Engine::FinishWorkload(const std::string& name) {
  Impl& m = *impl_;
  TAU_ASSIGN_OR_RETURN(int id, Find(m, name));
  if (m.wls[id].state == WorkloadState::kPending) {
    return FailedPrecondition(fmt::format("workload '{}' is pending; it cannot finish", name));
  }
  return RemoveWorkload(name);
}

Status Engine::EvictWorkload(const std::string& name) {
  Impl& m = *impl_;
  TAU_ASSIGN_OR_RETURN(int id, Find(m, name));
  Wl& w = m.wls[id];
  if (w.state == WorkloadState::kPending) {
    return FailedPrecondition(fmt::format("workload '{}' holds no quota", name));
  }
  m.Release(id);
  w.state = WorkloadState::kPending;
  w.assignment.clear();
  w.usage.clear();
  w.considered = true;
  w.reason = kReasonPending;
  w.message = "evicted and requeued";
  w.why.clear();
  m.QueuePush(id);
  return Status::Ok();
}

Result<WorkloadState> Engine::State(const std::string& name) const {
  TAU_ASSIGN_OR_RETURN(int id, Find(*impl_, name));
  return impl_->wls[id].state;
}

Result<FlavorAssignment> Engine::Assignment(const std::string& name) const {
  TAU_ASSIGN_OR_RETURN(int id, Find(*impl_, name));
  const Wl& w = impl_->wls[id];
  if (w.state == WorkloadState::kPending) {
    return FailedPrecondition(fmt::format("workload '{}' holds no quota", name));
  }
  return w.assignment;
}

namespace {
std::vector<ResourceUsage> NodeUsage(const Engine::Impl& m, int node) {
  std::vector<ResourceUsage> out;
  const Node& n = m.tree.nodes[node];
  for (int fr = 0; fr < m.tree.num_frs; ++fr) {
    if (!n.has_fr[fr]) continue;
    ResourceUsage u;
    u.flavor = m.flavor_names[m.fr_flavor[fr]];
    u.resource = m.resource_names[m.fr_resource[fr]];
    u.nominal = Quantity::FromMilli(n.subtree[fr]);
    u.usage = Quantity::FromMilli(n.usage[fr]);
    u.borrowed = Quantity::FromMilli(std::max<int64_t>(0, n.usage[fr] - n.subtree[fr]));
    u.available = Quantity::FromMilli(std::max<int64_t>(0, m.tree.Available(node, fr)));
    out.push_back(std::move(u));
  }
  return out;
}
}  // namespace

Result<std::vector<ResourceUsage>> Engine::Usage(const std::string& queue) const {
  auto it = impl_->cq_by_name.find(queue);
  if (it == impl_->cq_by_name.end()) {
    return NotFound(fmt::format("cluster queue '{}' not found", queue));
  }
  return NodeUsage(*impl_, impl_->cqs[it->second].node);
}

Result<std::vector<ResourceUsage>> Engine::CohortUsage(const std::string& cohort) const {
  auto it = impl_->cohort_node_by_name.find(cohort);
  if (it == impl_->cohort_node_by_name.end()) {
    return NotFound(fmt::format("cohort '{}' not found", cohort));
  }
  return NodeUsage(*impl_, it->second);
}

size_t Engine::WorkloadSlots() const { return impl_->wls.size(); }

std::vector<std::string> Engine::Admitted() const {
  std::vector<std::string> out;
  for (const Wl& w : impl_->wls) {
    if (w.alive && w.state != WorkloadState::kPending) out.push_back(w.spec.name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Engine::PreemptedAwaitingEviction() const {
  std::vector<std::string> out;
  for (const Wl& w : impl_->wls) {
    if (w.alive && w.state == WorkloadState::kPreempted) out.push_back(w.spec.name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tau::admission
