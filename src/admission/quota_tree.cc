// Quota arithmetic over the cohort tree. Each ClusterQueue and Cohort is a node holding, per
// (flavor, resource): its subtree quota, the part of it that is not lent to the parent ("local"
// quota, from the lending limit) and its usage. A cohort's usage is only what its children take
// beyond their local quota, so the parent sees exactly the borrowed part.
#include <algorithm>
#include <map>

#include "admission/internal.h"

namespace tau::admission {

void QuotaTree::Finalize() {
  // Children always come before their parent in a post-order; compute one by recursion.
  std::vector<int> order;
  std::vector<char> done(nodes.size(), 0);
  auto visit = [&](auto&& self, int n) -> void {
    if (done[n]) return;
    done[n] = 1;
    for (int c : nodes[n].children) self(self, c);
    order.push_back(n);
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].parent < 0) visit(visit, static_cast<int>(i));
  }
  for (int n : order) {
    Node& node = nodes[n];
    node.root = n;
    node.subtree = node.nominal;
    for (int c : node.children) {
      for (int fr = 0; fr < num_frs; ++fr) {
        node.subtree[fr] += nodes[c].subtree[fr] - nodes[c].local[fr];
        node.has_fr[fr] |= nodes[c].has_fr[fr];
      }
    }
    node.local.assign(num_frs, 0);
    for (int fr = 0; fr < num_frs; ++fr) {
      if (node.lending_limit[fr] != kNoLimit) {
        node.local[fr] = std::max<int64_t>(0, node.subtree[fr] - node.lending_limit[fr]);
      }
    }
  }
  // Roots, top-down.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& node = nodes[*it];
    node.root = node.parent < 0 ? *it : nodes[node.parent].root;
  }
}

int64_t QuotaTree::LocalAvailable(int n, int fr) const {
  return std::max<int64_t>(0, nodes[n].local[fr] - nodes[n].usage[fr]);
}

int64_t QuotaTree::Available(int n, int fr) const {
  const Node& node = nodes[n];
  if (node.parent < 0) return node.subtree[fr] - node.usage[fr];
  int64_t parent_available = Available(node.parent, fr);
  if (node.borrowing_limit[fr] != kNoLimit) {
    // What this subtree may still take from the parent: its lendable quota, minus what it
    // already stores there, plus the borrowing limit.
    int64_t stored = std::max<int64_t>(0, node.usage[fr] - node.local[fr]);
    parent_available = std::min(
        parent_available, node.subtree[fr] - node.local[fr] - stored + node.borrowing_limit[fr]);
  }
  return LocalAvailable(n, fr) + parent_available;
}

int64_t QuotaTree::PotentialAvailable(int n, int fr) const {
  const Node& node = nodes[n];
  if (node.parent < 0) return node.subtree[fr];
  int64_t through_parent = node.local[fr] + PotentialAvailable(node.parent, fr);
  if (node.borrowing_limit[fr] == kNoLimit) return through_parent;
  return std::min(node.subtree[fr] + node.borrowing_limit[fr], through_parent);
}

void QuotaTree::AddUsage(int n, int fr, int64_t delta) {
  // The parent holds max(0, usage - local) of every child; propagate the change of that term.
  while (n >= 0 && delta != 0) {
    Node& node = nodes[n];
    int64_t before = std::max<int64_t>(0, node.usage[fr] - node.local[fr]);
    node.usage[fr] += delta;
    int64_t after = std::max<int64_t>(0, node.usage[fr] - node.local[fr]);
    delta = after - before;
    n = node.parent;
  }
}

void QuotaTree::AddUsage(int n, const FrAmounts& amounts, int sign) {
  for (const auto& [fr, v] : amounts) AddUsage(n, fr, sign * v);
}

int QuotaTree::BorrowLevel(int n, int fr, int64_t val) const {
  const Node& node = nodes[n];
  if (node.usage[fr] + val <= node.subtree[fr] || node.parent < 0) return 0;
  int64_t remaining = val - LocalAvailable(n, fr);
  int level = 1;
  for (int a = node.parent; a >= 0; a = nodes[a].parent, ++level) {
    const Node& anc = nodes[a];
    if (anc.parent < 0) return level;
    if (anc.usage[fr] + remaining <= anc.subtree[fr]) return level;
    remaining -= LocalAvailable(a, fr);
  }
  return level;
}

bool QuotaTree::MayReclaimInHierarchy(int n, int fr, int64_t val) const {
  for (int a = nodes[n].parent; a >= 0 && nodes[a].parent >= 0; a = nodes[a].parent) {
    if (nodes[a].subtree[fr] >= val) return true;
  }
  return false;
}

double QuotaTree::DominantShare(int n, const std::vector<int>& fr_resource) const {
  const Node& node = nodes[n];
  if (node.parent < 0) return 0;
  std::map<int, std::pair<int64_t, int64_t>> per_resource;  // resource -> (borrowed, lendable)
  for (int fr = 0; fr < num_frs; ++fr) {
    if (!node.has_fr[fr]) continue;
    auto& [borrowed, lendable] = per_resource[fr_resource[fr]];
    borrowed += std::max<int64_t>(0, node.usage[fr] - node.subtree[fr]);
    lendable += PotentialAvailable(node.parent, fr);
  }
  double share = 0;
  for (const auto& [resource, bl] : per_resource) {
    if (bl.first <= 0) continue;
    double ratio = bl.second <= 0 ? std::numeric_limits<double>::infinity()
                                  : static_cast<double>(bl.first) * 1000.0 / bl.second;
    share = std::max(share, ratio);
  }
  if (share == 0) return 0;
  if (node.weight <= 0) return std::numeric_limits<double>::infinity();
  return share / node.weight;
}

}  // namespace tau::admission
