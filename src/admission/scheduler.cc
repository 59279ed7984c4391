// Pending queues and the scheduling cycle.
//
// Queues: a ClusterQueue's pending workloads are split by scheduling-equivalence class, each class
// an ordered set (priority, then queue-order timestamp, then name). `heads` holds the first member
// of every class that is not blocked, so the queue head is heads.begin(). BestEffortFIFO parks a
// failed head: a NoFit result blocks its whole class (Kueue moves every equivalent workload to the
// inadmissible set), any other failure parks just that workload. A release of quota anywhere in
// the cohort tree bumps the tree's epoch; queues compare epochs at the next cycle and requeue
// everything they parked. StrictFIFO never parks, so its head blocks the queue.
//
// Cycle (Kueue's schedule()): one head per queue, flavor assignment and preemption targets
// against the same snapshot, ordering (classic: non-borrowing first, priority, FIFO; fair
// sharing: a DRS tournament per cohort tree), then each entry in order is admitted, issues its
// preemptions, or stays pending with a reason. A head's nomination is kept in its Wl with the
// version of its cohort tree (bumped by every charge, release and preemption) and reused while that
// is unchanged; why it failed is kept as data (Why) and put into words only by Pending(). A queue
// with admission fair sharing takes its head from the LocalQueue with the lowest usage
// (fair_usage.cc).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "admission/internal.h"

namespace tau::admission {

void Engine::Impl::QueuePush(int id) {
  Wl& w = wls[id];
  Cq& cq = cqs[w.cq];
  auto [it, inserted] = cq.classes.try_emplace(w.eq_hash, WlLess{&wls});
  if (inserted && cq.spec.admission_fair_sharing)
    cq.classes_of_shape[w.shape_hash].push_back(w.eq_hash);
  EqClass& c = it->second;
  int old_first = c.members.empty() ? -1 : *c.members.begin();
  c.members.insert(id);
  ++cq.pending_count;
  w.parked = false;
  if (!c.blocked && *c.members.begin() == id) {
    if (old_first >= 0) cq.heads.erase(old_first);
    cq.heads.insert(id);
  }
}

void Engine::Impl::QueueErase(int id) {
  Wl& w = wls[id];
  Cq& cq = cqs[w.cq];
  --cq.pending_count;
  if (w.parked) {
    w.parked = false;  // its entry in cq.parked goes stale
    return;
  }
  auto it = cq.classes.find(w.eq_hash);
  EqClass& c = it->second;
  // Erase by position: the workload leaving is most often the class's first and the queue's
  // head, and a lookup by key costs two descents comparing Wl keys far apart in memory.
  bool first = *c.members.begin() == id;
  c.members.erase(first ? c.members.begin() : c.members.find(id));
  if (!c.blocked && first) {
    auto head = cq.heads.begin();
    cq.heads.erase(*head == id ? head : cq.heads.find(id));
    if (!c.members.empty()) cq.heads.insert(*c.members.begin());
  }
}

void Engine::Impl::QueuePark(int id) {
  Cq& cq = cqs[wls[id].cq];
  QueueErase(id);
  ++cq.pending_count;
  Wl& w = wls[id];
  w.parked = true;
  cq.parked.emplace_back(id, ++w.park_seq);
}

void Engine::Impl::QueueBlockClass(int id) {
  Wl& w = wls[id];
  Cq& cq = cqs[w.cq];
  auto block = [&](uint64_t hash) {
    EqClass& c = cq.classes.find(hash)->second;
    if (c.blocked) return;
    c.blocked = true;
    c.reason = w.reason;
    c.message = w.message;
    c.why = w.why;
    if (!c.members.empty()) {
      int first = *c.members.begin();
      auto head = cq.heads.begin();
      cq.heads.erase(*head == first ? head : cq.heads.find(first));
    }
    cq.blocked.push_back(hash);
  };
  block(w.eq_hash);
  // The same shape in the other LocalQueues fits no better.
  if (cq.spec.admission_fair_sharing)
    for (uint64_t hash : cq.classes_of_shape[w.shape_hash]) block(hash);
}

void Engine::Impl::QueueUnparkAll(Cq& cq) {
  for (uint64_t h : cq.blocked) {
    auto it = cq.classes.find(h);
    if (it == cq.classes.end() || !it->second.blocked) continue;
    it->second.blocked = false;
    if (!it->second.members.empty()) cq.heads.insert(*it->second.members.begin());
  }
  cq.blocked.clear();
  std::vector<std::pair<int, uint64_t>> parked;
  parked.swap(cq.parked);
  for (const auto& [id, seq] : parked) {
    const Wl& w = wls[id];
    if (!w.alive || !w.parked || w.park_seq != seq) continue;
    --cq.pending_count;
    QueuePush(id);
  }
}

bool Engine::Impl::Inadmissible(const Wl& w) const {
  if (w.parked) return true;
  const Cq& cq = cqs[w.cq];
  auto it = cq.classes.find(w.eq_hash);
  return it != cq.classes.end() && it->second.blocked;
}

bool Engine::Impl::Fits(int cq, const FrAmounts& request, bool allow_borrowing) const {
  int node = cqs[cq].node;
  for (const auto& [fr, v] : request) {
    if (tree.Available(node, fr) < v) return false;
    if (!allow_borrowing && tree.nodes[node].usage[fr] + v > tree.nodes[node].nominal[fr]) {
      return false;
    }
  }
  return true;
}

namespace {

struct Entry {
  int wl = -1;
  int cq = -1;
  // The head's nomination, kept in its Wl (so a later cycle may reuse it).
  const WlAssignment* assignment = nullptr;
  const std::vector<Target>* targets = nullptr;
  bool done = false;
};

}  // namespace

CycleResult Engine::RunCycle(const CycleOptions& options) {
  Impl& m = *impl_;
  CycleResult result;
  // 1. Requeue what was parked before quota got released in the tree; sample the LocalQueues'
  // usage that is due.
  m.SampleUsage(options.now_ms);
  for (Cq& cq : m.cqs) {
    uint64_t e = m.epoch[m.tree.nodes[cq.node].root];
    if (cq.seen_epoch != e) {
      m.QueueUnparkAll(cq);
      cq.seen_epoch = e;
    }
  }
  // 2. Nominate: one head per queue, all against the same snapshot.
  std::vector<Entry> entries;
  for (size_t i = 0; i < m.cqs.size(); ++i) {
    int head = m.QueueHead(m.cqs[i]);
    if (head < 0) continue;
    Entry e;
    e.wl = head;
    e.cq = static_cast<int>(i);
    Wl& w = m.wls[head];
    const uint64_t version = m.version[m.tree.nodes[m.cqs[i].node].root];
    if (w.nominated_version != version) {
      w.nomination = m.Assign(head);
      w.nomination_targets.clear();
      const WlAssignment& a = w.nomination;
      if (a.mode == WlMode::kPreempt) {
        if (a.oracle_valid && a.usage.size() == 1) {
          // One FR: the oracle already ran the same search.
          w.nomination_targets = a.oracle_targets;
        } else {
          w.nomination_targets = m.GetTargets(head, a.usage, a.preempt_frs);
        }
      }
      w.nominated_version = version;
    }
    e.assignment = &w.nomination;
    e.targets = &w.nomination_targets;
    entries.push_back(e);
  }
  result.heads = static_cast<int>(entries.size());

  std::unordered_set<int> preempted_now;
  std::vector<std::pair<int, FrAmounts>> reserved;  // (node, usage) to undo at the end
  auto requeue = [&](Entry& e, const std::string& reason, const std::string& message,
                     const Whys* why, bool park, bool block_class) {
    Wl& w = m.wls[e.wl];
    const bool parks = park && m.cqs[e.cq].spec.queueing_strategy != QueueingStrategy::kStrictFifo;
    w.considered = true;
    w.reason = reason;
    w.message = message;
    if (!why) {
      w.why.clear();
    } else if (parks && why == &w.nomination.why) {
      w.why = std::move(w.nomination.why);
    } else {
      w.why = *why;
    }
    if (!parks) return;
    // A parked workload comes back when quota is released in its tree, which changes the tree's
    // version: its nomination can never be reused, so it is not kept.
    w.nominated_version = 0;
    w.nomination = {};
    w.nomination_targets.clear();
    if (block_class) {
      m.QueueBlockClass(e.wl);
    } else {
      m.QueuePark(e.wl);
    }
  };
  auto process = [&](Entry& e) {
    Wl& w = m.wls[e.wl];
    Cq& cq = m.cqs[e.cq];
    const WlAssignment& a = *e.assignment;
    const std::vector<Target>& targets = *e.targets;
    if (a.mode == WlMode::kNoFit) {
      requeue(e, a.reason, "", &a.why, true, true);
      return;
    }
    if (a.mode == WlMode::kPreempt && targets.empty()) {
      // Hold back capacity the workload could reclaim later unless its queue can always
      // reclaim, so lower-ranked entries of the cohort can't take it in this cycle.
      if (cq.spec.preemption.reclaim_within_cohort != ReclaimWithinCohort::kAny) {
        FrAmounts hold;
        const Node& n = m.tree.nodes[cq.node];
        for (const auto& [fr, v] : a.usage) {
          int64_t room = n.nominal[fr] - n.usage[fr];
          if (n.usage[fr] + v > n.nominal[fr] && n.borrowing_limit[fr] != kNoLimit) {
            room = n.nominal[fr] + n.borrowing_limit[fr] - n.usage[fr];
          }
          int64_t amount = std::min(v, std::max<int64_t>(0, room));
          if (amount > 0) hold.emplace_back(fr, amount);
        }
        m.tree.AddUsage(cq.node, hold, +1);
        reserved.emplace_back(cq.node, std::move(hold));
      }
      requeue(e, kReasonWaitingForQuota, "", &a.why, true, false);
      return;
    }
    for (const Target& t : targets) {
      if (preempted_now.count(t.wl)) {
        requeue(e, kReasonWaitingForQuota,
                "Workload has overlapping preemption targets with another workload", nullptr, false,
                false);
        return;
      }
    }
    // Re-check against the snapshot as modified by the entries processed before, assuming every
    // victim chosen so far (and this entry's own) is gone.
    std::vector<int> gone(preempted_now.begin(), preempted_now.end());
    for (const Target& t : targets) gone.push_back(t.wl);
    for (int v : gone) m.tree.AddUsage(m.cqs[m.wls[v].cq].node, m.wls[v].usage, -1);
    bool fits = m.Fits(e.cq, a.usage, true);
    for (int v : gone) m.tree.AddUsage(m.cqs[m.wls[v].cq].node, m.wls[v].usage, +1);
    if (!fits) {
      requeue(e, kReasonWaitingForQuota,
              "Workload no longer fits after processing another workload", nullptr, false, false);
      return;
    }
    if (a.mode == WlMode::kPreempt) {
      m.tree.AddUsage(cq.node, a.usage, +1);
      reserved.emplace_back(cq.node, a.usage);
      for (const Target& t : targets) {
        preempted_now.insert(t.wl);
        Wl& v = m.wls[t.wl];
        if (v.state == WorkloadState::kPreempted) continue;  // already being evicted
        v.state = WorkloadState::kPreempted;
        ++m.version[m.tree.nodes[m.cqs[v.cq].node].root];
        result.preempted.push_back({v.spec.name, m.cqs[v.cq].spec.name, t.reason, w.spec.name});
      }
      requeue(e, kReasonWaitingForPreemptedWorkloads,
              fmt::format("Waiting for {} preempted workload(s) to release quota", targets.size()),
              nullptr, false, false);
      return;
    }
    // Fit: admit.
    m.QueueErase(e.wl);
    w.state = WorkloadState::kAdmitted;
    w.spec.admitted_ms = options.now_ms;
    w.assignment.clear();
    std::map<int, int64_t> usage;
    for (size_t i = 0; i < a.podset_flavors.size(); ++i) {
      const PodSet& ps = w.spec.pod_sets[i];
      auto& out = w.assignment[ps.name];
      for (const auto& [r, f] : a.podset_flavors[i]) out[m.resource_names[r]] = m.flavor_names[f];
    }
    w.usage = a.usage;
    w.reason.clear();
    w.message.clear();
    w.why.clear();
    m.Charge(e.wl, +1);
    if (cq.spec.admission_fair_sharing) m.AddEntryPenalty(e.wl);
    result.admitted.push_back({w.spec.name, cq.spec.name, w.assignment});
    // A nomination is for a pending workload: drop it (`a` refers to it).
    w.nominated_version = 0;
    w.nomination = {};
    w.nomination_targets.clear();
  };

  // 3. Order and process.
  if (!m.config.fair_sharing) {
    std::vector<Entry*> order;
    for (Entry& e : entries) order.push_back(&e);
    // WlLess orders any two workloads, so no two entries tie: sort is stable_sort here.
    std::sort(order.begin(), order.end(), [&](const Entry* a, const Entry* b) {
      bool ba = a->assignment->borrow_level > 0, bb = b->assignment->borrow_level > 0;
      if (ba != bb) return !ba;
      return WlLess{&m.wls}(a->wl, b->wl);
    });
    for (Entry* e : order) process(*e);
  } else {
    // DRS tournament per cohort tree: at every cohort, the child whose subtree (with the
    // candidate's usage added) is not borrowing wins, then the lower share, then priority and
    // FIFO. The winner is processed and the tournament is replayed with the new usage.
    std::unordered_map<int, std::vector<Entry*>> by_root;
    std::vector<int> roots;
    std::unordered_map<int, Entry*> by_cq_node;
    for (Entry& e : entries) {
      int node = m.cqs[e.cq].node;
      int root = m.tree.nodes[node].root;
      if (!by_root.count(root)) roots.push_back(root);
      by_root[root].push_back(&e);
      by_cq_node[node] = &e;
    }
    struct Score {
      bool borrowing;
      double share;
    };
    auto score_at = [&](Entry* e, int subtree) {
      const FrAmounts& u = e->assignment->usage;
      int cq_node = m.cqs[e->cq].node;
      m.tree.AddUsage(cq_node, u, +1);
      Score s{false, m.Drs(subtree)};
      for (const auto& [fr, v] : u) s.borrowing |= m.tree.Borrowing(subtree, fr);
      m.tree.AddUsage(cq_node, u, -1);
      return s;
    };
    // Best remaining entry in the subtree of `node`.
    auto best = [&](auto&& self, int node) -> Entry* {
      const Node& n = m.tree.nodes[node];
      if (n.cq >= 0) {
        auto it = by_cq_node.find(node);
        return it == by_cq_node.end() || it->second->done ? nullptr : it->second;
      }
      Entry* winner = nullptr;
      Score ws{};
      for (int c : n.children) {
        Entry* cand = self(self, c);
        if (!cand) continue;
        Score cs = score_at(cand, c);
        bool better;
        if (!winner) {
          better = true;
        } else if (cs.borrowing != ws.borrowing) {
          better = !cs.borrowing;
        } else if (cs.share != ws.share) {
          better = cs.share < ws.share;
        } else {
          better = WlLess{&m.wls}(cand->wl, winner->wl);
        }
        if (better) {
          winner = cand;
          ws = cs;
        }
      }
      return winner;
    };
    for (int root : roots) {
      for (size_t k = 0; k < by_root[root].size(); ++k) {
        Entry* e = best(best, root);
        if (!e) break;
        e->done = true;
        process(*e);
      }
    }
  }
  for (auto& [node, usage] : reserved) m.tree.AddUsage(node, usage, -1);

  if (options.report_pending) result.pending = Pending();
  return result;
}

std::vector<PendingInfo> Engine::Pending() const {
  const Impl& m = *impl_;
  std::vector<PendingInfo> out;
  for (const Cq& cq : m.cqs) {
    std::vector<int> ids;
    for (const auto& [id, seq] : cq.parked) {
      const Wl& w = m.wls[id];
      if (w.alive && w.parked && w.park_seq == seq) ids.push_back(id);
    }
    for (const auto& [h, c] : cq.classes) ids.insert(ids.end(), c.members.begin(), c.members.end());
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return m.Before(cq, a, b); });
    int position = 0;
    for (int id : ids) {
      const Wl& w = m.wls[id];
      PendingInfo p;
      p.name = w.spec.name;
      p.queue = cq.spec.name;
      p.inadmissible = m.Inadmissible(w);
      p.position = position++;
      if (w.considered) {
        p.reason = w.reason;
        p.message = w.why.empty() ? w.message : m.Explain(w.why);
      } else if (p.inadmissible) {
        const EqClass& c = cq.classes.at(w.eq_hash);
        p.reason = c.reason;
        p.message = c.why.empty() ? c.message : m.Explain(c.why);
      } else {
        p.reason = kReasonPending;
        p.message = fmt::format("waiting in ClusterQueue {} behind {} workload(s)", cq.spec.name,
                                p.position);
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

Result<std::vector<std::string>> Engine::QueueOrder(const std::string& queue) const {
  auto it = impl_->cq_by_name.find(queue);
  if (it == impl_->cq_by_name.end()) {
    return NotFound(fmt::format("cluster queue '{}' not found", queue));
  }
  std::vector<std::string> out;
  for (const PendingInfo& p : Pending()) {
    if (p.queue == queue) out.push_back(p.name);
  }
  return out;
}

}  // namespace tau::admission
