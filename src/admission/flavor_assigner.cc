// Flavor assignment (Kueue's flavorassigner): per pod set and resource group, try the queue's
// flavors in order, classify each as fit / reclaim / preempt / no candidates / no fit, and stop
// or keep looking according to the queue's flavor fungibility.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "admission/internal.h"

namespace tau::admission {
namespace {

struct FlavorTry {
  int flavor = -1;
  FrMode mode = FrMode::kFit;
  int borrow = 0;
  Whys whys;
  std::string reason;  // for kNoFit
  std::vector<int> preempt_frs;
  std::vector<Target> targets;
};

// BorrowingOverPreemption: a better mode first, then less borrowing.
bool Preferred(const FlavorTry& a, const FlavorTry& b) {
  if (a.mode != b.mode) return a.mode > b.mode;
  return a.borrow < b.borrow;
}

std::string Qty(int64_t milli) { return Quantity::FromMilli(milli).ToString(); }

}  // namespace

WlAssignment Engine::Impl::Assign(int id) {
  const Wl& w = wls[id];
  const Cq& cq = cqs[w.cq];
  const int node = cq.node;
  const PreemptionPolicy& policy = cq.spec.preemption;
  const bool can_preempt_while_borrowing =
      policy.borrow_within_cohort != BorrowWithinCohortPolicy::kNever ||
      (config.fair_sharing && policy.reclaim_within_cohort != ReclaimWithinCohort::kNever);
  WlAssignment a;
  FrAmounts acc;  // FR -> requests of the pod sets assigned so far (few entries)
  auto acc_get = [&](int fr) -> int64_t {
    for (const auto& [f, v] : acc) {
      if (f == fr) return v;
    }
    return 0;
  };
  auto acc_of = [&](int fr) -> int64_t& {
    for (auto& [f, v] : acc) {
      if (f == fr) return v;
    }
    acc.emplace_back(fr, 0);
    return acc.back().second;
  };
  bool no_targets = false;

  auto no_fit = [&](const std::string& podset, const std::string& reason, const Whys& whys) {
    a.mode = WlMode::kNoFit;
    a.reason = reason;
    a.why.clear();
    a.why.emplace_back(podset);
    a.why.insert(a.why.end(), whys.begin(), whys.end());
    return a;
  };

  for (size_t i = 0; i < w.podset_requests.size(); ++i) {
    const PodSet& ps = w.spec.pod_sets[i];
    // Requests by resource group, groups in the queue's order.
    std::vector<std::pair<int, std::vector<std::pair<int, int64_t>>>> by_group;
    for (const auto& [r, v] : w.podset_requests[i]) {
      auto g = cq.group_of_resource.find(r);
      if (g == cq.group_of_resource.end()) {
        return no_fit(ps.name, kReasonNoMatchingFlavor, {Why(Why::kUnavailable, r, -1)});
      }
      auto slot = std::find_if(by_group.begin(), by_group.end(),
                               [&](const auto& e) { return e.first == g->second; });
      if (slot == by_group.end()) {
        by_group.emplace_back(g->second, std::vector<std::pair<int, int64_t>>{});
        slot = by_group.end() - 1;
      }
      slot->second.emplace_back(r, v);
    }
    std::sort(by_group.begin(), by_group.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<std::pair<int, int>> chosen_flavors;
    for (const auto& [g, requests] : by_group) {
      Whys reasons;
      bool any_waiting = false, any_exceeds = false;
      FlavorTry best;
      bool have_best = false;
      for (int f : cq.groups[g].flavors) {
        bool matches = true;
        for (const auto& [k, v] : ps.node_selector) {
          auto label = config.flavors[f].node_labels.find(k);
          if (label != config.flavors[f].node_labels.end() && label->second != v) matches = false;
        }
        if (!ps.allowed_flavors.empty() &&
            std::find(ps.allowed_flavors.begin(), ps.allowed_flavors.end(), flavor_names[f]) ==
                ps.allowed_flavors.end()) {
          reasons.emplace_back(Why::kNotAllowed, -1, f);
          continue;
        }
        if (!matches) {
          reasons.emplace_back(Why::kNoAffinity, -1, f);
          continue;
        }
        FlavorTry t;
        t.flavor = f;
        for (const auto& [r, v] : requests) {
          int fr = fr_of[f][r];
          int64_t val = acc_get(fr) + v;
          int64_t cap = tree.PotentialAvailable(node, fr);
          if (val > cap) {
            t.mode = FrMode::kNoFit;
            t.reason = kReasonExceedsMaxQuota;
            any_exceeds = true;
            t.whys.emplace_back(Why::kOverCapacity, r, f, val, cap);
            continue;
          }
          int64_t avail = std::max<int64_t>(0, tree.Available(node, fr));
          if (val <= avail) {
            t.borrow = std::max(t.borrow, tree.BorrowLevel(node, fr, val));
            continue;
          }
          t.whys.emplace_back(Why::kShortOf, r, f, val - avail);
          const Node& n = tree.nodes[node];
          if (n.nominal[fr] >= val || tree.MayReclaimInHierarchy(node, fr, val) ||
              can_preempt_while_borrowing) {
            // Preemption oracle: would removing some workloads make room for this FR alone?
            std::vector<Target> targets = GetTargets(id, {{fr, val}}, {fr});
            FrMode mode = FrMode::kNoCandidates;
            if (!targets.empty()) {
              mode = FrMode::kReclaim;
              for (const Target& tg : targets) {
                if (wls[tg.wl].cq == w.cq) mode = FrMode::kPreempt;
              }
              for (const Target& tg : targets)
                tree.AddUsage(cqs[wls[tg.wl].cq].node, wls[tg.wl].usage, -1);
              t.borrow = std::max(t.borrow, tree.BorrowLevel(node, fr, val));
              for (const Target& tg : targets)
                tree.AddUsage(cqs[wls[tg.wl].cq].node, wls[tg.wl].usage, +1);
            } else {
              t.borrow = std::max(t.borrow, tree.BorrowLevel(node, fr, val));
            }
            t.mode = std::min(t.mode, mode);
            t.preempt_frs.push_back(fr);
            t.targets = std::move(targets);
          } else {
            t.mode = FrMode::kNoFit;
            t.reason = kReasonWaitingForQuota;
            any_waiting = true;
          }
        }
        if (t.mode == FrMode::kNoFit) {
          reasons.insert(reasons.end(), t.whys.begin(), t.whys.end());
          continue;
        }
        bool stop = false;
        if (t.mode == FrMode::kFit) {
          stop =
              t.borrow == 0 || cq.spec.flavor_fungibility.when_can_borrow == WhenCanBorrow::kBorrow;
        } else if (t.mode == FrMode::kPreempt || t.mode == FrMode::kReclaim) {
          stop = cq.spec.flavor_fungibility.when_can_preempt == WhenCanPreempt::kPreempt;
        }
        if (t.mode != FrMode::kFit) reasons.insert(reasons.end(), t.whys.begin(), t.whys.end());
        if (!have_best || Preferred(t, best) || stop) {
          best = std::move(t);
          have_best = true;
        }
        if (stop) break;
      }
      if (!have_best) {
        const char* reason = any_waiting   ? kReasonWaitingForQuota
                             : any_exceeds ? kReasonExceedsMaxQuota
                                           : kReasonNoMatchingFlavor;
        return no_fit(ps.name, reason, reasons);
      }
      for (const auto& [r, v] : requests) {
        acc_of(fr_of[best.flavor][r]) += v;
        chosen_flavors.emplace_back(r, best.flavor);
      }
      a.borrow_level = std::max(a.borrow_level, best.borrow);
      if (best.mode != FrMode::kFit) {
        a.mode = WlMode::kPreempt;
        if (best.mode == FrMode::kNoCandidates) no_targets = true;
        a.preempt_frs.insert(a.preempt_frs.end(), best.preempt_frs.begin(), best.preempt_frs.end());
        a.oracle_targets = best.targets;
        a.why.emplace_back(ps.name);
        a.why.insert(a.why.end(), reasons.begin(), reasons.end());
      }
    }
    std::sort(chosen_flavors.begin(), chosen_flavors.end());
    a.podset_flavors.push_back(std::move(chosen_flavors));
  }
  std::sort(acc.begin(), acc.end());
  a.usage = std::move(acc);
  if (a.mode == WlMode::kPreempt) {
    a.reason = kReasonWaitingForQuota;
    // The oracle ran per FR; its result stands for the workload only when there is one FR and
    // it found nothing or something.
    a.oracle_valid = a.usage.size() == 1 && a.preempt_frs.size() == 1;
    if (no_targets && a.oracle_valid) a.oracle_targets.clear();
  }
  return a;
}

std::string Engine::Impl::Explain(const Whys& why) const {
  std::string out;
  bool first_in_podset = true;
  for (const Why& w : why) {
    if (w.kind == Why::kPodSet) {
      if (!out.empty()) out += "; ";
      out += fmt::format("couldn't assign flavors to pod set {}: ", w.podset);
      first_in_podset = true;
      continue;
    }
    if (!first_in_podset) out += ", ";
    first_in_podset = false;
    switch (w.kind) {
      case Why::kUnavailable:
        out += fmt::format("resource {} unavailable in ClusterQueue", resource_names[w.resource]);
        break;
      case Why::kNotAllowed:
        out += fmt::format("flavor {} is not one this run may use", flavor_names[w.flavor]);
        break;
      case Why::kNoAffinity:
        out += fmt::format("flavor {} doesn't match node affinity", flavor_names[w.flavor]);
        break;
      case Why::kOverCapacity:
        out +=
            fmt::format("insufficient quota for {} in flavor {}, request {} > maximum capacity {}",
                        resource_names[w.resource], flavor_names[w.flavor], Qty(w.a), Qty(w.b));
        break;
      case Why::kShortOf:
        out += fmt::format("insufficient unused quota for {} in flavor {}, {} more needed",
                           resource_names[w.resource], flavor_names[w.flavor], Qty(w.a));
        break;
      case Why::kPodSet:
        break;
    }
  }
  return out;
}

}  // namespace tau::admission
