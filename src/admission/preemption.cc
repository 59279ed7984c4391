// Preemption target selection: Kueue's classic algorithm (within the queue, reclaim within the
// cohort, borrow within the cohort with a priority threshold) and its fair-sharing variant.
// Both remove candidates from the live quota tree one at a time until the preemptor fits, then
// fill back (re-add every victim that is not needed), and always restore the tree before
// returning: the victims are only chosen here, they keep their quota until evicted.
#include <algorithm>
#include <map>

#include "admission/internal.h"

namespace tau::admission {
namespace {

bool UsesAny(const Wl& w, const std::vector<int>& frs) {
  for (const auto& [fr, v] : w.usage) {
    if (v > 0 && std::find(frs.begin(), frs.end(), fr) != frs.end()) return true;
  }
  return false;
}

bool WithinPolicy(WithinClusterQueue p, const Workload& pre, const Workload& cand) {
  switch (p) {
    case WithinClusterQueue::kNever:
      return false;
    case WithinClusterQueue::kLowerPriority:
      return pre.priority > cand.priority;
    case WithinClusterQueue::kLowerOrNewerEqualPriority:
      return pre.priority > cand.priority ||
             (pre.priority == cand.priority && pre.created_ms < cand.created_ms);
  }
  return false;
}

bool ReclaimPolicy(ReclaimWithinCohort p, const Workload& pre, const Workload& cand) {
  switch (p) {
    case ReclaimWithinCohort::kNever:
      return false;
    case ReclaimWithinCohort::kLowerPriority:
      return pre.priority > cand.priority;
    case ReclaimWithinCohort::kAny:
      return true;
  }
  return false;
}

struct Candidate {
  int wl;
  int group;  // 0: hierarchical reclaim, 1: other queue by priority, 2: same queue
  const char* reason;
  bool reclaim_without_borrowing = false;
};

}  // namespace

std::vector<Target> Engine::Impl::GetTargets(int id, const FrAmounts& request,
                                             const std::vector<int>& need) {
  if (config.fair_sharing && tree.nodes[cqs[wls[id].cq].node].parent >= 0) {
    return FairTargets(id, request, need);
  }
  return ClassicTargets(id, request, need);
}

std::vector<Target> Engine::Impl::ClassicTargets(int id, const FrAmounts& request,
                                                 const std::vector<int>& need) {
  const Wl& p = wls[id];
  const int pcq = p.cq;
  const int pnode = cqs[pcq].node;
  const PreemptionPolicy& policy = cqs[pcq].spec.preemption;
  const bool borrow_forbidden = policy.borrow_within_cohort == BorrowWithinCohortPolicy::kNever;
  auto request_of = [&](int fr) {
    for (const auto& [f, v] : request) {
      if (f == fr) return v;
    }
    return int64_t{0};
  };
  // Lowest common ancestor depth walk: nodes from `from` up to (excluding) the first ancestor
  // that also contains `other`.
  auto path_below_lca = [&](int from, int other) {
    std::vector<int> other_anc;
    for (int n = other; n >= 0; n = tree.nodes[n].parent) other_anc.push_back(n);
    std::vector<int> path;
    for (int n = from; n >= 0; n = tree.nodes[n].parent) {
      if (std::find(other_anc.begin(), other_anc.end(), n) != other_anc.end()) break;
      path.push_back(n);
    }
    return path;
  };
  auto subtree_borrowing = [&](int cnode) {
    for (int n : path_below_lca(cnode, pnode)) {
      for (int fr : need) {
        if (tree.Borrowing(n, fr)) return true;
      }
    }
    return false;
  };

  std::vector<Candidate> cands;
  if (policy.within_cluster_queue != WithinClusterQueue::kNever) {
    for (int v : cqs[pcq].admitted) {
      if (v == id || !UsesAny(wls[v], need)) continue;
      if (WithinPolicy(policy.within_cluster_queue, p.spec, wls[v].spec)) {
        cands.push_back({v, 2, kPreemptInClusterQueue});
      }
    }
  }
  if (policy.reclaim_within_cohort != ReclaimWithinCohort::kNever &&
      tree.nodes[pnode].parent >= 0) {
    for (int c : tree_cqs[tree.nodes[pnode].root]) {
      if (c == pcq) continue;
      int cnode = cqs[c].node;
      bool borrowing = false;
      for (int fr : need) borrowing |= tree.Borrowing(cnode, fr);
      if (!borrowing) continue;  // a queue within nominal lends nothing to reclaim
      // Hierarchical advantage: the request fits in the quota of the preemptor's queue or of an
      // ancestor below the common ancestor, i.e. the preemptor reclaims what is its own.
      bool advantage = false;
      for (int n : path_below_lca(pnode, cnode)) {
        bool fits = true;
        for (int fr : need) {
          fits &= tree.nodes[n].usage[fr] + request_of(fr) <= tree.nodes[n].subtree[fr];
        }
        if (fits) advantage = true;
      }
      for (int v : cqs[c].admitted) {
        const Wl& cw = wls[v];
        if (!UsesAny(cw, need) || !ReclaimPolicy(policy.reclaim_within_cohort, p.spec, cw.spec)) {
          continue;
        }
        if (advantage) {
          cands.push_back({v, 0, kPreemptInCohortReclamation});
        } else if (!borrow_forbidden && cw.spec.priority < p.spec.priority &&
                   (!policy.max_priority_threshold ||
                    cw.spec.priority <= *policy.max_priority_threshold)) {
          cands.push_back({v, 1, kPreemptInCohortReclaimWhileBorrowing});
        } else {
          cands.push_back({v, 1, kPreemptInCohortReclamation, true});
        }
      }
    }
  }
  if (cands.empty()) return {};
  std::sort(cands.begin(), cands.end(), [&](const Candidate& a, const Candidate& b) {
    const Wl& x = wls[a.wl];
    const Wl& y = wls[b.wl];
    bool ex = x.state == WorkloadState::kPreempted, ey = y.state == WorkloadState::kPreempted;
    if (ex != ey) return ex;
    if (a.group != b.group) return a.group < b.group;
    if (x.spec.priority != y.spec.priority) return x.spec.priority < y.spec.priority;
    if (x.spec.admitted_ms != y.spec.admitted_ms) return x.spec.admitted_ms > y.spec.admitted_ms;
    return x.spec.name < y.spec.name;
  });
  bool has_other = false, has_hierarchical = false;
  for (const Candidate& c : cands) {
    has_other |= c.group != 2;
    has_hierarchical |= c.group == 0;
  }
  bool strictly_under = true;
  for (int fr : need) {
    strictly_under &= tree.nodes[pnode].usage[fr] < tree.nodes[pnode].nominal[fr];
  }
  std::vector<bool> attempts;
  if (!has_other || (borrow_forbidden && !strictly_under)) {
    attempts = {true};
  } else if (borrow_forbidden && !has_hierarchical) {
    attempts = {false, true};
  } else {
    attempts = {true, false};
  }
  auto remove = [&](int v, int sign) { tree.AddUsage(cqs[wls[v].cq].node, wls[v].usage, -sign); };
  for (bool allow_borrowing : attempts) {
    std::vector<const Candidate*> chosen;
    bool fits = false;
    for (const Candidate& c : cands) {
      if (allow_borrowing && c.reclaim_without_borrowing) continue;
      if (c.group != 2 && !subtree_borrowing(cqs[wls[c.wl].cq].node)) continue;
      remove(c.wl, +1);
      chosen.push_back(&c);
      if (Fits(pcq, request, allow_borrowing)) {
        fits = true;
        break;
      }
    }
    if (!fits) {
      for (const Candidate* c : chosen) remove(c->wl, -1);
      continue;
    }
    // Fill back: the last victim made the fit; re-add earlier ones that turn out unneeded.
    std::vector<Target> targets;
    std::vector<bool> keep(chosen.size(), true);
    for (int i = static_cast<int>(chosen.size()) - 2; i >= 0; --i) {
      remove(chosen[i]->wl, -1);
      if (Fits(pcq, request, allow_borrowing)) {
        keep[i] = false;
      } else {
        remove(chosen[i]->wl, +1);
      }
    }
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (!keep[i]) continue;
      remove(chosen[i]->wl, -1);
      targets.push_back({chosen[i]->wl, chosen[i]->reason});
    }
    return targets;
  }
  return {};
}

std::vector<Target> Engine::Impl::FairTargets(int id, const FrAmounts& request,
                                              const std::vector<int>& need) {
  const Wl& p = wls[id];
  const int pcq = p.cq;
  const int pnode = cqs[pcq].node;
  const PreemptionPolicy& policy = cqs[pcq].spec.preemption;
  auto cand_less = [&](int a, int b) {
    const Wl& x = wls[a];
    const Wl& y = wls[b];
    bool ex = x.state == WorkloadState::kPreempted, ey = y.state == WorkloadState::kPreempted;
    if (ex != ey) return ex;
    if (x.spec.priority != y.spec.priority) return x.spec.priority < y.spec.priority;
    if (x.spec.admitted_ms != y.spec.admitted_ms) return x.spec.admitted_ms > y.spec.admitted_ms;
    return x.spec.name < y.spec.name;
  };
  // Candidates per queue, in CandidatesOrdering.
  std::map<int, std::vector<int>> per_cq;
  for (int c : tree_cqs[tree.nodes[pnode].root]) {
    for (int v : cqs[c].admitted) {
      if (v == id || !UsesAny(wls[v], need)) continue;
      bool ok = c == pcq ? WithinPolicy(policy.within_cluster_queue, p.spec, wls[v].spec)
                         : ReclaimPolicy(policy.reclaim_within_cohort, p.spec, wls[v].spec);
      if (ok) per_cq[c].push_back(v);
    }
  }
  for (auto& [c, list] : per_cq) std::sort(list.begin(), list.end(), cand_less);
  if (per_cq.empty()) return {};

  auto move = [&](int v, int sign) { tree.AddUsage(cqs[wls[v].cq].node, wls[v].usage, sign); };
  auto fits = [&] {
    tree.AddUsage(pnode, request, -1);
    bool ok = Fits(pcq, request, true);
    tree.AddUsage(pnode, request, +1);
    return ok;
  };
  auto borrowing_on_need = [&](int node) {
    for (int fr : need) {
      if (tree.Borrowing(node, fr)) return true;
    }
    return false;
  };
  tree.AddUsage(pnode, request, +1);  // the preemptor as if admitted
  std::vector<Target> result;
  for (FairSharingStrategy strategy : config.fair_sharing_strategies) {
    std::map<int, size_t> next;
    std::set<int> dropped;
    std::vector<Target> chosen;
    auto eligible = [&](int c) {
      auto it = per_cq.find(c);
      if (it == per_cq.end() || dropped.count(c) || next[c] >= it->second.size()) return false;
      return c == pcq || borrowing_on_need(cqs[c].node);
    };
    // Descend from the root to the queue with the highest share among eligible ones.
    auto pick = [&](auto&& self, int node) -> int {
      const Node& n = tree.nodes[node];
      if (n.cq >= 0) return eligible(n.cq) ? n.cq : -1;
      int best = -1;
      double best_share = 0;
      for (int child : n.children) {
        int c = self(self, child);
        if (c < 0) continue;
        double share = Drs(child);
        bool better =
            best < 0 || share > best_share ||
            (share == best_share && cand_less(per_cq[c][next[c]], per_cq[best][next[best]]));
        if (better) {
          best = c;
          best_share = share;
        }
      }
      return best;
    };
    bool done = false;
    while (!done) {
      int c = pick(pick, tree.nodes[pnode].root);
      if (c < 0) break;
      int v = per_cq[c][next[c]];
      const char* reason;
      if (c == pcq) {
        reason = kPreemptInClusterQueue;
        move(v, -1);
      } else {
        bool within_nominal = true;
        for (int fr : need) {
          within_nominal &= tree.nodes[pnode].usage[fr] <= tree.nodes[pnode].nominal[fr];
        }
        if (within_nominal) {
          reason = kPreemptInCohortReclamation;
          move(v, -1);
        } else {
          double preemptor_share = Drs(pnode);
          double target_before = Drs(cqs[c].node);
          move(v, -1);
          double target_after = Drs(cqs[c].node);
          bool ok = strategy == FairSharingStrategy::kLessThanOrEqualToFinalShare
                        ? preemptor_share <= target_after
                        : preemptor_share < target_before;
          if (!ok) {
            move(v, +1);
            dropped.insert(c);
            continue;
          }
          reason = kPreemptInCohortFairSharing;
        }
      }
      ++next[c];
      chosen.push_back({v, reason});
      if (fits()) done = true;
    }
    if (done) {
      std::vector<bool> keep(chosen.size(), true);
      for (int i = static_cast<int>(chosen.size()) - 2; i >= 0; --i) {
        move(chosen[i].wl, +1);
        if (fits()) {
          keep[i] = false;
        } else {
          move(chosen[i].wl, -1);
        }
      }
      for (size_t i = 0; i < chosen.size(); ++i) {
        if (!keep[i]) continue;
        move(chosen[i].wl, +1);
        result.push_back(chosen[i]);
      }
      break;
    }
    for (const Target& t : chosen) move(t.wl, +1);
  }
  tree.AddUsage(pnode, request, -1);
  return result;
}

}  // namespace tau::admission
