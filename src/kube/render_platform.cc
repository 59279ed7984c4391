// The platform's cluster objects: Kueue's Topology, ResourceFlavors, Cohorts,
// ClusterQueues, WorkloadPriorityClasses and LocalQueues (kueue.x-k8s.io/v1beta2, the storage
// version), and per workspace a Namespace with RBAC for its members.
#include <fmt/format.h>

#include "common/quantity.h"
#include "common/strings.h"
#include "kube/internal.h"

namespace tau::kube {
namespace {

using nlohmann::json;

constexpr const char* kKueueApi = "kueue.x-k8s.io/v1beta2";
constexpr const char* kRbacApi = "rbac.authorization.k8s.io/v1";
constexpr const char* kMemberRole = "tau-member";

json Meta(const std::string& name, const std::string& ns = "") {
  json m = {{"name", name}, {"labels", {{kLabelManagedBy, "tau"}}}};
  if (!ns.empty()) m["namespace"] = ns;
  return m;
}

// Kueue takes fair-sharing weights as quantities.
std::string Weight(double w) { return fmt::format("{}", w); }

json ResourceGroups(const std::vector<admission::ResourceGroup>& groups) {
  json out = json::array();
  for (const auto& g : groups) {
    json flavors = json::array();
    for (const auto& f : g.flavors) {
      json resources = json::array();
      for (const auto& r : f.resources) {
        json q = {{"name", r.name}, {"nominalQuota", r.nominal.ToString()}};
        if (r.borrowing_limit) q["borrowingLimit"] = r.borrowing_limit->ToString();
        if (r.lending_limit) q["lendingLimit"] = r.lending_limit->ToString();
        resources.push_back(q);
      }
      flavors.push_back({{"name", f.flavor}, {"resources", resources}});
    }
    out.push_back({{"coveredResources", g.covered_resources}, {"flavors", flavors}});
  }
  return out;
}

json ClusterQueue(const admission::ClusterQueue& q) {
  json preemption = {
      {"withinClusterQueue", admission::WithinClusterQueueName(q.preemption.within_cluster_queue)},
      {"reclaimWithinCohort",
       admission::ReclaimWithinCohortName(q.preemption.reclaim_within_cohort)}};
  if (q.preemption.borrow_within_cohort == admission::BorrowWithinCohortPolicy::kLowerPriority) {
    json borrow = {{"policy", "LowerPriority"}};
    if (q.preemption.max_priority_threshold) {
      borrow["maxPriorityThreshold"] = *q.preemption.max_priority_threshold;
    }
    preemption["borrowWithinCohort"] = borrow;
  }
  json spec = {
      {"queueingStrategy", q.queueing_strategy == admission::QueueingStrategy::kStrictFifo
                               ? "StrictFIFO"
                               : "BestEffortFIFO"},
      // Only workspace namespaces (labelled by tau) may queue here; `{}` would open the queue
      // to every namespace of the cluster.
      {"namespaceSelector",
       {{"matchExpressions", {{{"key", kLabelWorkspace}, {"operator", "Exists"}}}}}},
      {"resourceGroups", ResourceGroups(q.resource_groups)},
      {"preemption", preemption},
      // Kueue's MayStopSearch is tau's Borrow / Preempt.
      {"flavorFungibility",
       {{"whenCanBorrow", q.flavor_fungibility.when_can_borrow == admission::WhenCanBorrow::kBorrow
                              ? "MayStopSearch"
                              : "TryNextFlavor"},
        {"whenCanPreempt",
         q.flavor_fungibility.when_can_preempt == admission::WhenCanPreempt::kPreempt
             ? "MayStopSearch"
             : "TryNextFlavor"}}}};
  if (!q.cohort.empty()) spec["cohortName"] = q.cohort;
  if (q.fair_sharing_weight != 1.0)
    spec["fairSharing"] = {{"weight", Weight(q.fair_sharing_weight)}};
  if (q.admission_fair_sharing)
    spec["admissionScope"] = {{"admissionMode", "UsageBasedAdmissionFairSharing"}};
  return {{"apiVersion", kKueueApi},
          {"kind", "ClusterQueue"},
          {"metadata", Meta(q.name)},
          {"spec", spec}};
}

json Subject(const std::string& member) {
  // "*" is everyone who can authenticate; "group:NAME" a group; anything else a user.
  std::string kind = "User", name = member;
  if (member == policy::kEveryone) {
    kind = "Group";
    name = "system:authenticated";
  } else if (StartsWith(member, "group:")) {
    kind = "Group";
    name = member.substr(6);
  }
  return {{"kind", kind}, {"apiGroup", "rbac.authorization.k8s.io"}, {"name", name}};
}

// What a member does in the workspace namespace: submit and cancel runs (Jobs, RayJobs and a
// gang's Service), and follow them (pods, logs, events, Kueue's Workloads and LocalQueues).
json MemberRules() {
  json submit = {"get", "list", "watch", "create", "delete"};
  json read = {"get", "list", "watch"};
  return json::array({
      {{"apiGroups", {"batch"}}, {"resources", {"jobs"}}, {"verbs", submit}},
      {{"apiGroups", {"ray.io"}}, {"resources", {"rayjobs"}}, {"verbs", submit}},
      {{"apiGroups", {""}}, {"resources", {"services"}}, {"verbs", submit}},
      {{"apiGroups", {""}}, {"resources", {"pods", "pods/log", "events"}}, {"verbs", read}},
      {{"apiGroups", {"ray.io"}}, {"resources", {"rayclusters"}}, {"verbs", read}},
      {{"apiGroups", {"kueue.x-k8s.io"}},
       {"resources", {"workloads", "localqueues"}},
       {"verbs", read}},
  });
}

}  // namespace

std::string WorkspaceNamespace(const policy::Workspace& workspace) { return workspace.name; }

Result<std::vector<nlohmann::json>> RenderPlatform(const policy::Platform& platform) {
  std::vector<json> out;
  for (const policy::Workspace& w : platform.workspaces) {
    const std::string ns = WorkspaceNamespace(w);
    json ns_meta = Meta(ns);
    ns_meta["labels"][kLabelWorkspace] = w.name;
    if (!w.description.empty()) ns_meta["annotations"] = {{"tau.dev/description", w.description}};
    out.push_back({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", ns_meta}});
    out.push_back({{"apiVersion", kRbacApi},
                   {"kind", "Role"},
                   {"metadata", Meta(kMemberRole, ns)},
                   {"rules", MemberRules()}});
    json subjects = json::array();
    for (const std::string& m : w.members) subjects.push_back(Subject(m));
    out.push_back(
        {{"apiVersion", kRbacApi},
         {"kind", "RoleBinding"},
         {"metadata", Meta(kMemberRole, ns)},
         {"roleRef",
          {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", kMemberRole}}},
         {"subjects", subjects}});
  }
  if (!platform.topology.empty()) {
    // The cluster's levels for Kueue's topology-aware scheduling (policy.topology), named by
    // every flavor with node labels (Kueue places pods by topology only on such flavors).
    json levels = json::array();
    for (const policy::TopologyLevel& t : platform.topology)
      levels.push_back({{"nodeLabel", t.node_label}});
    out.push_back({{"apiVersion", kKueueApi},
                   {"kind", "Topology"},
                   {"metadata", Meta(kTopologyName)},
                   {"spec", {{"levels", levels}}}});
  }
  for (const admission::ResourceFlavor& f : platform.admission.flavors) {
    json spec = json::object();
    if (!f.node_labels.empty()) spec["nodeLabels"] = f.node_labels;
    if (!f.node_labels.empty() && !platform.topology.empty()) spec["topologyName"] = kTopologyName;
    out.push_back({{"apiVersion", kKueueApi},
                   {"kind", "ResourceFlavor"},
                   {"metadata", Meta(f.name)},
                   {"spec", spec}});
  }
  for (const admission::Cohort& c : platform.admission.cohorts) {
    json spec = json::object();
    if (!c.parent.empty()) spec["parentName"] = c.parent;
    if (!c.resource_groups.empty()) spec["resourceGroups"] = ResourceGroups(c.resource_groups);
    if (c.fair_sharing_weight != 1.0)
      spec["fairSharing"] = {{"weight", Weight(c.fair_sharing_weight)}};
    out.push_back({{"apiVersion", kKueueApi},
                   {"kind", "Cohort"},
                   {"metadata", Meta(c.name)},
                   {"spec", spec}});
  }
  for (const admission::ClusterQueue& q : platform.admission.queues) out.push_back(ClusterQueue(q));
  for (const policy::PriorityClass& p : platform.priorities) {
    json wpc = {{"apiVersion", kKueueApi},
                {"kind", "WorkloadPriorityClass"},
                {"metadata", Meta(p.name)},
                {"value", p.value}};
    if (!p.description.empty()) wpc["description"] = p.description;
    out.push_back(wpc);
  }
  // Resolution lets a run of any workspace name any queue, so each workspace namespace gets a
  // LocalQueue (named as its ClusterQueue) for every ClusterQueue.
  for (const policy::Workspace& w : platform.workspaces) {
    for (const admission::ClusterQueue& q : platform.admission.queues) {
      json spec = {{"clusterQueue", q.name}};
      // The workspace's weight under admission fair sharing (Kueue's default is 1).
      if (q.admission_fair_sharing && w.fair_sharing_weight != 1.0)
        spec["fairSharing"] = {{"weight", Weight(w.fair_sharing_weight)}};
      out.push_back({{"apiVersion", kKueueApi},
                     {"kind", "LocalQueue"},
                     {"metadata", Meta(q.name, WorkspaceNamespace(w))},
                     {"spec", std::move(spec)}});
    }
  }
  return out;
}

ClusterSize NodesAllocatable(const std::vector<json>& nodes) {
  ClusterSize size;
  for (const json& node : nodes) {
    if (!node.is_object()) continue;
    const json spec = node.value("spec", json::object());
    if (spec.is_object() && spec.value("unschedulable", false)) continue;  // cordoned
    const json status = node.value("status", json::object());
    const json allocatable =
        status.is_object() ? status.value("allocatable", json::object()) : json::object();
    if (!allocatable.is_object()) continue;
    auto quantity = [&](const char* resource) {
      auto it = allocatable.find(resource);
      if (it == allocatable.end() || !it->is_string()) return Quantity();
      auto q = Quantity::Parse(it->get<std::string>());
      return q.ok() ? *q : Quantity();
    };
    size.cpu_milli += quantity(policy::kCpuResource).milli();
    size.memory_bytes += quantity(policy::kMemoryResource).milli() / 1000;
    size.gpus += static_cast<int>(quantity(policy::kGpuResource).milli() / 1000);
    ++size.nodes;
  }
  return size;
}

}  // namespace tau::kube

namespace tau::kube {
namespace {
// Milliseconds as a Go duration (metav1.Duration): 168h, 5m, 90s, 1500ms.
std::string GoDuration(int64_t ms) {
  if (ms % 3'600'000 == 0) return fmt::format("{}h", ms / 3'600'000);
  if (ms % 60'000 == 0) return fmt::format("{}m", ms / 60'000);
  if (ms % 1000 == 0) return fmt::format("{}s", ms / 1000);
  return fmt::format("{}ms", ms);
}
}  // namespace

nlohmann::json KueueConfiguration(const policy::Platform& platform) {
  json out = json::object();
  if (platform.admission.fair_sharing) out["fairSharing"] = {{"enable", true}};
  if (const auto& afs = platform.admission.admission_fair_sharing) {
    json a = {{"usageHalfLifeTime", GoDuration(afs->usage_half_life_ms)},
              {"usageSamplingInterval", GoDuration(afs->usage_sampling_interval_ms)}};
    if (!afs->resource_weights.empty()) a["resourceWeights"] = afs->resource_weights;
    out["admissionFairSharing"] = std::move(a);
    out["featureGates"] = {{"AdmissionFairSharing", true}};
  }
  return out;
}

}  // namespace tau::kube
