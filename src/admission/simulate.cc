// YAML loader and driver of the admission simulator. Strict: unknown keys, wrong types, bad
// quantities and dangling references are all reported with their position; yaml-cpp exceptions
// are caught here and never escape.
#include "admission/simulate.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "common/clock.h"
#include "common/quantity.h"
#include "common/strings.h"

namespace tau::admission {

std::string Diagnostic::ToString() const {
  return fmt::format("{}:{}:{}: error: {}", file, line, column, message);
}

namespace {

class Loader {
 public:
  explicit Loader(std::string_view file) : file_(file) {}

  std::vector<Diagnostic>& diagnostics() { return diags_; }

  void Error(const YAML::Mark& mark, std::string message) {
    diags_.push_back({file_, mark.line + 1, mark.column + 1, std::move(message)});
  }
  void Error(const YAML::Node& node, std::string message) {
    Error(node.Mark(), std::move(message));
  }

  // Checks that `node` is a map whose keys are all in `allowed`.
  bool Map(const YAML::Node& node, std::string_view what, const std::vector<std::string>& allowed) {
    if (!node.IsMap()) {
      Error(node, fmt::format("{} must be a mapping", what));
      return false;
    }
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string hint = ClosestMatch(key, allowed);
      Error(it->first, fmt::format("unknown key '{}' in {}{}", key, what,
                                   hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
    return true;
  }

  // A list; null counts as empty.
  bool Seq(const YAML::Node& node, std::string_view what) {
    if (node.IsNull()) return false;
    if (!node.IsSequence()) {
      Error(node, fmt::format("{} must be a list", what));
      return false;
    }
    return true;
  }

  std::optional<std::string> Str(const YAML::Node& node, std::string_view what) {
    if (!node.IsScalar()) {
      Error(node, fmt::format("{} must be a string", what));
      return std::nullopt;
    }
    return node.Scalar();
  }

  std::optional<int64_t> Int(const YAML::Node& node, std::string_view what, int64_t lo,
                             int64_t hi) {
    if (node.IsScalar()) {
      const std::string& s = node.Scalar();
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec == std::errc() && ptr == s.data() + s.size()) {
        if (v >= lo && v <= hi) return v;
        Error(node, fmt::format("{} must be between {} and {}", what, lo, hi));
        return std::nullopt;
      }
    }
    Error(node, fmt::format("{} must be an integer", what));
    return std::nullopt;
  }

  // Reads a list entry's `name`: a missing one is reported and the entry skipped (nullopt), a
  // repeated one is reported; `defined` remembers where each name was first given.
  std::optional<std::string> Name(const YAML::Node& entry, std::string_view kind,
                                  std::map<std::string, YAML::Node>* defined) {
    if (!entry["name"]) {
      Error(entry, fmt::format("{} needs a name", kind));
      return std::nullopt;
    }
    std::string name;
    if (auto s = Str(entry["name"], fmt::format("{} name", kind))) name = *s;
    if (defined->count(name)) {
      Error(entry["name"], fmt::format("{} '{}' is defined twice", kind, name));
    }
    (*defined)[name] = entry["name"];
    return name;
  }

  // `fair_sharing: {weight: W}` of a cohort or a queue.
  void FairSharingWeight(const YAML::Node& entry, double* weight) {
    const YAML::Node fs = entry["fair_sharing"];
    if (fs && Map(fs, "fair_sharing", {"weight"}) && fs["weight"]) {
      if (auto w = Double(fs["weight"], "weight")) *weight = *w;
    }
  }

  std::optional<double> Double(const YAML::Node& node, std::string_view what) {
    if (node.IsScalar()) {
      try {
        size_t used = 0;
        double v = std::stod(node.Scalar(), &used);
        if (used == node.Scalar().size() && v >= 0) return v;
      } catch (const std::exception&) {
      }
    }
    Error(node, fmt::format("{} must be a non-negative number", what));
    return std::nullopt;
  }

  std::optional<bool> Bool(const YAML::Node& node, std::string_view what) {
    if (node.IsScalar()) {
      if (node.Scalar() == "true") return true;
      if (node.Scalar() == "false") return false;
    }
    Error(node, fmt::format("{} must be true or false", what));
    return std::nullopt;
  }

  std::optional<Quantity> Qty(const YAML::Node& node, std::string_view what) {
    if (!node.IsScalar()) {
      Error(node, fmt::format("{} must be a quantity", what));
      return std::nullopt;
    }
    Result<Quantity> q = Quantity::Parse(node.Scalar());
    if (!q.ok()) {
      Error(node, fmt::format("{}: {}", what, q.status().message()));
      return std::nullopt;
    }
    return *q;
  }

  // What Kueue's ClusterQueue validation refuses, refused here too rather than applied: a
  // negative quota, a lending limit above the nominal quota, and a fraction of a resource that
  // exists only in whole units (GPUs and other extended resources).
  void CheckQuota(const YAML::Node& r, const ResourceQuota& rq) {
    const bool whole_units = rq.name.find('/') != std::string::npos;  // nvidia.com/gpu, ...
    auto check = [&](const char* key, const std::optional<Quantity>& q) {
      if (!q) return;
      if (q->milli() < 0) {
        Error(r[key], fmt::format("{} of '{}' is negative ({})", key, rq.name, q->ToString()));
      } else if (whole_units && q->milli() % 1000 != 0) {
        Error(r[key], fmt::format("{} of '{}' is {}: an extended resource comes in whole units",
                                  key, rq.name, q->ToString()));
      }
    };
    check("nominal", r["nominal"] ? std::optional<Quantity>(rq.nominal) : std::nullopt);
    check("borrowing_limit", rq.borrowing_limit);
    check("lending_limit", rq.lending_limit);
    if (rq.lending_limit && *rq.lending_limit > rq.nominal)
      Error(r["lending_limit"],
            fmt::format("lending_limit of '{}' ({}) is above its nominal quota ({}): a queue can "
                        "lend at most what it has (Kueue refuses it too)",
                        rq.name, rq.lending_limit->ToString(), rq.nominal.ToString()));
  }

  // A duration such as 168h or 5m, in milliseconds, at least 1 s.
  std::optional<int64_t> Duration(const YAML::Node& node, std::string_view what) {
    if (node.IsScalar()) {
      Result<int64_t> ms = ParseDurationMillis(node.Scalar());
      if (ms.ok() && *ms >= 1000) return *ms;
      if (ms.ok()) {
        Error(node, fmt::format("{} must be at least 1s", what));
        return std::nullopt;
      }
    }
    Error(node, fmt::format("{} must be a duration such as 168h or 5m", what));
    return std::nullopt;
  }

  std::optional<int64_t> Time(const YAML::Node& node, std::string_view what) {
    if (!node.IsScalar()) {
      Error(node, fmt::format("{} must be an RFC 3339 time", what));
      return std::nullopt;
    }
    Result<int64_t> t = ParseRfc3339(node.Scalar());
    if (!t.ok()) {
      Error(node, fmt::format("{}: {}", what, t.status().message()));
      return std::nullopt;
    }
    return *t;
  }

  template <typename E>
  std::optional<E> Enum(const YAML::Node& node, std::string_view what,
                        const std::vector<std::pair<std::string, E>>& values) {
    std::vector<std::string> names;
    for (const auto& [n, v] : values) names.push_back(n);
    if (node.IsScalar()) {
      for (const auto& [n, v] : values) {
        if (n == node.Scalar()) return v;
      }
    }
    Error(node, node.IsScalar() ? fmt::format("{} must be one of {}, not '{}'", what,
                                              Join(names, ", "), node.Scalar())
                                : fmt::format("{} must be one of {}", what, Join(names, ", ")));
    return std::nullopt;
  }

  std::map<std::string, std::string> StringMap(const YAML::Node& node, std::string_view what) {
    std::map<std::string, std::string> out;
    if (node.IsNull()) return out;
    if (!node.IsMap()) {
      Error(node, fmt::format("{} must be a mapping of strings", what));
      return out;
    }
    for (auto it = node.begin(); it != node.end(); ++it) {
      auto k = Str(it->first, what);
      auto v = Str(it->second, what);
      if (k && v) out[*k] = *v;
    }
    return out;
  }

  // Resource groups of a queue or cohort; flavor references are checked by the caller.
  std::vector<ResourceGroup> Groups(const YAML::Node& node, std::vector<YAML::Node>* flavor_refs) {
    std::vector<ResourceGroup> out;
    if (!Seq(node, "resource_groups")) return out;
    for (const YAML::Node& g : node) {
      if (!Map(g, "resource group", {"covered_resources", "flavors"})) continue;
      ResourceGroup group;
      std::set<std::string> covered;
      if (g["covered_resources"] && Seq(g["covered_resources"], "covered_resources")) {
        for (const YAML::Node& r : g["covered_resources"]) {
          if (auto s = Str(r, "covered resource")) {
            group.covered_resources.push_back(*s);
            covered.insert(*s);
          }
        }
      } else if (!g["covered_resources"]) {
        Error(g, "resource group needs covered_resources");
      }
      if (g["flavors"] && Seq(g["flavors"], "flavors")) {
        for (const YAML::Node& f : g["flavors"]) {
          if (!Map(f, "flavor quotas", {"name", "resources"})) continue;
          FlavorQuotas fq;
          if (!f["name"]) {
            Error(f, "flavor quotas need a name");
            continue;
          }
          if (auto s = Str(f["name"], "flavor name")) fq.flavor = *s;
          flavor_refs->push_back(f["name"]);
          std::set<std::string> listed;
          if (f["resources"] && Seq(f["resources"], "resources")) {
            for (const YAML::Node& r : f["resources"]) {
              if (!Map(r, "resource", {"name", "nominal", "borrowing_limit", "lending_limit"})) {
                continue;
              }
              ResourceQuota rq;
              if (!r["name"]) {
                Error(r, "resource needs a name");
                continue;
              }
              if (auto s = Str(r["name"], "resource name")) rq.name = *s;
              if (!covered.count(rq.name)) {
                Error(r["name"], fmt::format("resource '{}' is not in covered_resources of its "
                                             "resource group",
                                             rq.name));
              }
              listed.insert(rq.name);
              if (r["nominal"]) {
                if (auto q = Qty(r["nominal"], "nominal")) rq.nominal = *q;
              }
              if (r["borrowing_limit"])
                rq.borrowing_limit = Qty(r["borrowing_limit"], "borrowing_limit");
              if (r["lending_limit"]) rq.lending_limit = Qty(r["lending_limit"], "lending_limit");
              CheckQuota(r, rq);
              fq.resources.push_back(std::move(rq));
            }
          }
          for (const std::string& c : covered) {
            if (!listed.count(c)) {
              Error(f, fmt::format("flavor '{}' must list covered resource '{}'", fq.flavor, c));
            }
          }
          group.flavors.push_back(std::move(fq));
        }
      }
      out.push_back(std::move(group));
    }
    return out;
  }

  // "unknown flavor 'h10' (did you mean 'h100'?)" at the reference.
  void Unknown(const YAML::Node& at, std::string_view kind, const std::string& name,
               const std::map<std::string, YAML::Node>& known) {
    std::vector<std::string> names;
    for (const auto& [k, v] : known) names.push_back(k);
    std::string hint = ClosestMatch(name, names);
    Error(at, fmt::format("unknown {} '{}'{}", kind, name,
                          hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }

 private:
  std::string file_;
  std::vector<Diagnostic> diags_;
};

// Names of the configuration objects, by where they are defined, for checking references.
struct Defined {
  std::map<std::string, YAML::Node> flavors, cohorts, queues;
};

// The configuration sections (flavors, cohorts, queues, fair_sharing) of `root`, a mapping; other
// top-level keys are not looked at. Shared by the simulator and ParseAdmissionConfig.
Config ParseConfigSections(const YAML::Node& root, Loader& L, Defined* defined) {
  Config config;
  std::vector<YAML::Node> flavor_refs;
  std::map<std::string, YAML::Node>& flavor_nodes = defined->flavors;
  std::map<std::string, YAML::Node>& cohort_nodes = defined->cohorts;
  std::map<std::string, YAML::Node>& queue_nodes = defined->queues;
  std::vector<YAML::Node> afs_queues;  // queues that ask for admission fair sharing
  // flavors
  if (root["flavors"] && L.Seq(root["flavors"], "flavors")) {
    for (const YAML::Node& f : root["flavors"]) {
      if (!L.Map(f, "flavor", {"name", "node_labels"})) continue;
      ResourceFlavor flavor;
      auto name = L.Name(f, "flavor", &flavor_nodes);
      if (!name) continue;
      flavor.name = *name;
      if (f["node_labels"]) flavor.node_labels = L.StringMap(f["node_labels"], "node_labels");
      config.flavors.push_back(std::move(flavor));
    }
  }
  // cohorts
  std::vector<std::pair<YAML::Node, std::string>> cohort_refs;  // (node, name) to resolve
  if (root["cohorts"] && L.Seq(root["cohorts"], "cohorts")) {
    for (const YAML::Node& c : root["cohorts"]) {
      if (!L.Map(c, "cohort", {"name", "parent", "resource_groups", "fair_sharing"})) continue;
      Cohort cohort;
      auto name = L.Name(c, "cohort", &cohort_nodes);
      if (!name) continue;
      cohort.name = *name;
      if (c["parent"]) {
        if (auto s = L.Str(c["parent"], "parent")) cohort.parent = *s;
        cohort_refs.emplace_back(c["parent"], cohort.parent);
      }
      if (c["resource_groups"]) {
        cohort.resource_groups = L.Groups(c["resource_groups"], &flavor_refs);
        if (cohort.parent.empty()) {
          for (const auto& g : cohort.resource_groups) {
            for (const auto& f : g.flavors) {
              for (const auto& r : f.resources) {
                if (r.borrowing_limit || r.lending_limit) {
                  L.Error(c["name"], fmt::format("cohort '{}': borrowing_limit and lending_limit "
                                                 "need a parent cohort",
                                                 cohort.name));
                }
              }
            }
          }
        }
      }
      L.FairSharingWeight(c, &cohort.fair_sharing_weight);
      config.cohorts.push_back(std::move(cohort));
    }
  }
  // queues
  if (root["queues"] && L.Seq(root["queues"], "queues")) {
    for (const YAML::Node& q : root["queues"]) {
      if (!L.Map(q, "queue",
                 {"name", "cohort", "queueing_strategy", "resource_groups", "preemption",
                  "flavor_fungibility", "fair_sharing", "admission_mode"})) {
        continue;
      }
      ClusterQueue cq;
      auto name = L.Name(q, "queue", &queue_nodes);
      if (!name) continue;
      cq.name = *name;
      if (q["cohort"]) {
        if (auto s = L.Str(q["cohort"], "cohort")) cq.cohort = *s;
        cohort_refs.emplace_back(q["cohort"], cq.cohort);
      }
      if (q["queueing_strategy"]) {
        if (auto s =
                L.Enum<QueueingStrategy>(q["queueing_strategy"], "queueing_strategy",
                                         {{"StrictFIFO", QueueingStrategy::kStrictFifo},
                                          {"BestEffortFIFO", QueueingStrategy::kBestEffortFifo}})) {
          cq.queueing_strategy = *s;
        }
      }
      if (q["resource_groups"]) {
        cq.resource_groups = L.Groups(q["resource_groups"], &flavor_refs);
        if (cq.cohort.empty()) {
          for (const auto& g : cq.resource_groups) {
            for (const auto& f : g.flavors) {
              for (const auto& r : f.resources) {
                if (r.borrowing_limit || r.lending_limit) {
                  L.Error(q["name"], fmt::format("queue '{}': borrowing_limit and lending_limit "
                                                 "need a cohort",
                                                 cq.name));
                }
              }
            }
          }
        }
      }
      if (const YAML::Node& p = q["preemption"]) {
        if (L.Map(p, "preemption",
                  {"within_cluster_queue", "reclaim_within_cohort", "borrow_within_cohort"})) {
          if (p["within_cluster_queue"]) {
            if (auto v = L.Enum<WithinClusterQueue>(
                    p["within_cluster_queue"], "within_cluster_queue",
                    {{"Never", WithinClusterQueue::kNever},
                     {"LowerPriority", WithinClusterQueue::kLowerPriority},
                     {"LowerOrNewerEqualPriority",
                      WithinClusterQueue::kLowerOrNewerEqualPriority}})) {
              cq.preemption.within_cluster_queue = *v;
            }
          }
          if (p["reclaim_within_cohort"]) {
            if (auto v = L.Enum<ReclaimWithinCohort>(
                    p["reclaim_within_cohort"], "reclaim_within_cohort",
                    {{"Never", ReclaimWithinCohort::kNever},
                     {"LowerPriority", ReclaimWithinCohort::kLowerPriority},
                     {"Any", ReclaimWithinCohort::kAny}})) {
              cq.preemption.reclaim_within_cohort = *v;
            }
          }
          if (const YAML::Node& b = p["borrow_within_cohort"]) {
            if (L.Map(b, "borrow_within_cohort", {"policy", "max_priority_threshold"})) {
              if (b["policy"]) {
                if (auto v = L.Enum<BorrowWithinCohortPolicy>(
                        b["policy"], "policy",
                        {{"Never", BorrowWithinCohortPolicy::kNever},
                         {"LowerPriority", BorrowWithinCohortPolicy::kLowerPriority}})) {
                  cq.preemption.borrow_within_cohort = *v;
                }
              }
              if (b["max_priority_threshold"]) {
                if (auto v = L.Int(b["max_priority_threshold"], "max_priority_threshold", INT32_MIN,
                                   INT32_MAX)) {
                  cq.preemption.max_priority_threshold = static_cast<int32_t>(*v);
                }
              }
            }
          }
          if (cq.preemption.reclaim_within_cohort == ReclaimWithinCohort::kNever &&
              cq.preemption.borrow_within_cohort != BorrowWithinCohortPolicy::kNever) {
            L.Error(p, "borrow_within_cohort needs reclaim_within_cohort other than Never");
          }
        }
      }
      if (const YAML::Node& f = q["flavor_fungibility"]) {
        if (L.Map(f, "flavor_fungibility", {"when_can_borrow", "when_can_preempt"})) {
          if (f["when_can_borrow"]) {
            if (auto v =
                    L.Enum<WhenCanBorrow>(f["when_can_borrow"], "when_can_borrow",
                                          {{"Borrow", WhenCanBorrow::kBorrow},
                                           {"TryNextFlavor", WhenCanBorrow::kTryNextFlavor}})) {
              cq.flavor_fungibility.when_can_borrow = *v;
            }
          }
          if (f["when_can_preempt"]) {
            if (auto v = L.Enum<WhenCanPreempt>(f["when_can_preempt"], "when_can_preempt",
                                                {{"TryNextFlavor", WhenCanPreempt::kTryNextFlavor},
                                                 {"Preempt", WhenCanPreempt::kPreempt}})) {
              cq.flavor_fungibility.when_can_preempt = *v;
            }
          }
        }
      }
      L.FairSharingWeight(q, &cq.fair_sharing_weight);
      if (q["admission_mode"]) {
        if (auto v = L.Enum<bool>(
                q["admission_mode"], "admission_mode",
                {{"UsageBasedAdmissionFairSharing", true}, {"NoAdmissionFairSharing", false}})) {
          cq.admission_fair_sharing = *v;
          if (*v) afs_queues.push_back(q["admission_mode"]);
        }
      }
      config.queues.push_back(std::move(cq));
    }
  }
  // admission fair sharing (Kueue's Configuration.admissionFairSharing)
  if (const YAML::Node& afs = root["admission_fair_sharing"]) {
    if (L.Map(afs, "admission_fair_sharing",
              {"usage_half_life", "usage_sampling_interval", "resource_weights"})) {
      AdmissionFairSharing a;
      if (!afs["usage_half_life"]) {
        L.Error(afs, "admission_fair_sharing needs usage_half_life (168h, say)");
      } else if (auto d = L.Duration(afs["usage_half_life"], "usage_half_life")) {
        a.usage_half_life_ms = *d;
      }
      if (afs["usage_sampling_interval"]) {
        if (auto d = L.Duration(afs["usage_sampling_interval"], "usage_sampling_interval"))
          a.usage_sampling_interval_ms = *d;
      }
      if (const YAML::Node& rw = afs["resource_weights"]) {
        if (!rw.IsMap()) {
          L.Error(rw, "resource_weights must be a mapping of resource to weight");
        } else {
          for (auto it = rw.begin(); it != rw.end(); ++it) {
            auto r = L.Str(it->first, "resource name");
            auto w = L.Double(it->second, "resource weight");
            if (r && w) a.resource_weights[*r] = *w;
          }
        }
      }
      config.admission_fair_sharing = std::move(a);
    }
  } else {
    for (const YAML::Node& at : afs_queues) {
      L.Error(at,
              "admission_mode UsageBasedAdmissionFairSharing needs the top-level "
              "admission_fair_sharing section (usage_half_life, usage_sampling_interval, "
              "resource_weights)");
    }
  }
  // fair sharing switch
  if (const YAML::Node& fs = root["fair_sharing"]) {
    if (fs.IsScalar()) {
      if (auto b = L.Bool(fs, "fair_sharing")) config.fair_sharing = *b;
    } else if (L.Map(fs, "fair_sharing", {"enabled", "preemption_strategies"})) {
      config.fair_sharing = true;
      if (fs["enabled"]) {
        if (auto b = L.Bool(fs["enabled"], "enabled")) config.fair_sharing = *b;
      }
      if (fs["preemption_strategies"] &&
          L.Seq(fs["preemption_strategies"], "preemption_strategies")) {
        config.fair_sharing_strategies.clear();
        for (const YAML::Node& s : fs["preemption_strategies"]) {
          if (auto v = L.Enum<FairSharingStrategy>(
                  s, "preemption strategy",
                  {{"LessThanOrEqualToFinalShare",
                    FairSharingStrategy::kLessThanOrEqualToFinalShare},
                   {"LessThanInitialShare", FairSharingStrategy::kLessThanInitialShare}})) {
            config.fair_sharing_strategies.push_back(*v);
          }
        }
      }
    }
  }
  // References.
  for (const YAML::Node& f : flavor_refs) {
    if (f.IsScalar() && !flavor_nodes.count(f.Scalar())) {
      L.Unknown(f, "flavor", f.Scalar(), flavor_nodes);
    }
  }
  for (const auto& [node, name] : cohort_refs) {
    if (!name.empty() && !cohort_nodes.count(name)) L.Unknown(node, "cohort", name, cohort_nodes);
  }
  // Cohort cycles.
  std::map<std::string, std::string> parent_of;
  for (const Cohort& c : config.cohorts) parent_of[c.name] = c.parent;
  for (const Cohort& c : config.cohorts) {
    std::string at = c.parent;
    for (size_t steps = 0; !at.empty() && steps <= parent_of.size(); ++steps) {
      if (at == c.name) {
        L.Error(cohort_nodes[c.name],
                fmt::format("cohort '{}' is part of a cycle in the cohort tree", c.name));
        break;
      }
      auto it = parent_of.find(at);
      at = it == parent_of.end() ? "" : it->second;
    }
  }
  return config;
}

Result<SimulationInput> Parse(const YAML::Node& root, Loader& L) {
  SimulationInput in;
  if (root.IsNull()) {
    L.Error(root, "empty simulation file");
    return InvalidArgument("empty");
  }
  // A platform file's other sections may stay in a copy of it (docs/platform.md): they are platform
  // policy, not admission, and the result says that they were not simulated.
  std::vector<std::string> keys = {"workloads", "local_queues"};
  keys.insert(keys.end(), std::begin(kAdmissionSections), std::end(kAdmissionSections));
  keys.insert(keys.end(), std::begin(kPlatformPolicySections), std::end(kPlatformPolicySections));
  if (!L.Map(root, "the simulation", keys)) return InvalidArgument("not a mapping");
  for (const char* section : kPlatformPolicySections)
    if (root[section]) in.platform_sections.push_back(section);
  Defined defined;
  in.config = ParseConfigSections(root, L, &defined);
  const std::map<std::string, YAML::Node>& flavor_nodes = defined.flavors;
  const std::map<std::string, YAML::Node>& queue_nodes = defined.queues;
  auto unknown = [&](const YAML::Node& at, std::string_view kind, const std::string& name,
                     const std::map<std::string, YAML::Node>& known) {
    L.Unknown(at, kind, name, known);
  };
  // local queues: weights and usage at the start
  std::map<std::string, YAML::Node> lq_nodes;
  std::map<std::string, std::string> lq_queue;
  if (root["local_queues"] && L.Seq(root["local_queues"], "local_queues")) {
    for (const YAML::Node& q : root["local_queues"]) {
      if (!L.Map(q, "local queue", {"name", "queue", "fair_sharing", "usage"})) continue;
      auto name = L.Name(q, "local queue", &lq_nodes);
      if (!name) continue;
      LocalQueue lq;
      lq.name = *name;
      if (!q["queue"]) {
        L.Error(q, fmt::format("local queue '{}' needs a queue", lq.name));
      } else if (auto s = L.Str(q["queue"], "queue")) {
        lq.cluster_queue = *s;
        if (!queue_nodes.count(*s)) {
          L.Unknown(q["queue"], "queue", *s, queue_nodes);
        } else if (q["usage"]) {
          bool afs = false;
          for (const ClusterQueue& cq : in.config.queues)
            if (cq.name == *s) afs = cq.admission_fair_sharing;
          if (!afs) {
            L.Error(q["usage"], fmt::format("queue '{}' does not use admission fair sharing "
                                            "(admission_mode: UsageBasedAdmissionFairSharing)",
                                            *s));
          }
        }
      }
      L.FairSharingWeight(q, &lq.fair_sharing_weight);
      lq_queue[lq.name] = lq.cluster_queue;
      if (const YAML::Node& u = q["usage"]) {
        SimulationInput::Usage usage{lq.name, lq.cluster_queue, {}};
        if (!u.IsMap()) {
          L.Error(u, "usage must be a mapping of resource to quantity");
        } else {
          for (auto it = u.begin(); it != u.end(); ++it) {
            auto r = L.Str(it->first, "resource name");
            auto v = L.Qty(it->second, "usage");
            if (r && v) usage.consumed[*r] = static_cast<double>(v->milli()) / 1000;
          }
        }
        in.usage.push_back(std::move(usage));
      }
      in.config.local_queues.push_back(std::move(lq));
    }
  }
  // workloads
  if (root["workloads"] && L.Seq(root["workloads"], "workloads")) {
    std::map<std::string, YAML::Node> seen;
    int64_t index = 0;
    for (const YAML::Node& w : root["workloads"]) {
      ++index;
      if (!L.Map(w, "workload",
                 {"name", "queue", "local_queue", "priority", "created", "requests", "pod_sets",
                  "node_selector", "admitted"})) {
        continue;
      }
      Workload wl;
      wl.created_ms = index;
      auto name = L.Name(w, "workload", &seen);
      if (!name) continue;
      wl.name = *name;
      if (w["local_queue"]) {
        if (auto s = L.Str(w["local_queue"], "local_queue")) {
          wl.local_queue = *s;
          // A listed LocalQueue names its queue, as a Kueue workload names only its LocalQueue.
          if (auto it = lq_queue.find(*s); it != lq_queue.end() && !w["queue"]) {
            wl.queue = it->second;
          } else if (it != lq_queue.end() && w["queue"].IsScalar() &&
                     w["queue"].Scalar() != it->second) {
            L.Error(w["queue"],
                    fmt::format("local queue '{}' belongs to queue '{}'", *s, it->second));
          }
        }
      }
      if (!w["queue"]) {
        if (wl.queue.empty()) L.Error(w, fmt::format("workload '{}' needs a queue", wl.name));
      } else if (auto s = L.Str(w["queue"], "queue")) {
        wl.queue = *s;
        if (!queue_nodes.count(wl.queue)) unknown(w["queue"], "queue", wl.queue, queue_nodes);
      }
      if (w["priority"]) {
        if (auto p = L.Int(w["priority"], "priority", INT32_MIN, INT32_MAX)) {
          wl.priority = static_cast<int32_t>(*p);
        }
      }
      if (w["created"]) {
        if (auto t = L.Time(w["created"], "created")) wl.created_ms = *t;
      }
      auto requests = [&](const YAML::Node& n) {
        std::map<std::string, Quantity> out;
        if (!n.IsMap()) {
          L.Error(n, "requests must be a mapping of resource to quantity");
          return out;
        }
        for (auto it = n.begin(); it != n.end(); ++it) {
          auto k = L.Str(it->first, "resource name");
          auto q = L.Qty(it->second, "request");
          if (k && q) out[*k] = *q;
        }
        return out;
      };
      if (w["requests"] && w["pod_sets"]) {
        L.Error(w["pod_sets"], "give either requests or pod_sets, not both");
      }
      if (w["pod_sets"]) {
        if (w["node_selector"]) {
          L.Error(w["node_selector"], "with pod_sets, give node_selector per pod set");
        }
        if (L.Seq(w["pod_sets"], "pod_sets")) {
          for (const YAML::Node& p : w["pod_sets"]) {
            if (!L.Map(p, "pod set", {"name", "count", "requests", "node_selector"})) continue;
            PodSet ps;
            if (p["name"]) {
              if (auto s = L.Str(p["name"], "pod set name")) ps.name = *s;
            }
            if (p["count"]) {
              if (auto c = L.Int(p["count"], "count", 0, 1'000'000))
                ps.count = static_cast<int32_t>(*c);
            }
            if (p["requests"]) ps.requests = requests(p["requests"]);
            if (p["node_selector"])
              ps.node_selector = L.StringMap(p["node_selector"], "node_selector");
            wl.pod_sets.push_back(std::move(ps));
          }
        }
      } else {
        PodSet ps;
        if (w["requests"]) ps.requests = requests(w["requests"]);
        if (w["node_selector"]) ps.node_selector = L.StringMap(w["node_selector"], "node_selector");
        wl.pod_sets.push_back(std::move(ps));
      }
      if (wl.pod_sets.empty()) L.Error(w, fmt::format("workload '{}' has no pod sets", wl.name));
      if (const YAML::Node& a = w["admitted"]) {
        if (L.Map(a, "admitted", {"flavors", "at"})) {
          FlavorAssignment fa;
          if (a["flavors"] && a["flavors"].IsMap()) {
            for (auto it = a["flavors"].begin(); it != a["flavors"].end(); ++it) {
              auto key = L.Str(it->first, "admitted flavors key");
              if (!key) continue;
              auto check_flavor = [&](const YAML::Node& f) -> std::optional<std::string> {
                auto s = L.Str(f, "flavor");
                if (s && !flavor_nodes.count(*s)) {
                  unknown(f, "flavor", *s, flavor_nodes);
                  return std::nullopt;
                }
                return s;
              };
              if (it->second.IsMap()) {  // {podset: {res: flavor}}
                for (auto jt = it->second.begin(); jt != it->second.end(); ++jt) {
                  auto r = L.Str(jt->first, "resource name");
                  auto f = check_flavor(jt->second);
                  if (r && f) fa[*key][*r] = *f;
                }
              } else if (auto f = check_flavor(it->second)) {  // {res: flavor}: every pod set
                for (const PodSet& ps : wl.pod_sets) fa[ps.name][*key] = *f;
              }
            }
          } else {
            L.Error(a, "admitted needs flavors: {resource: flavor}");
          }
          if (a["at"]) {
            if (auto t = L.Time(a["at"], "at")) wl.admitted_ms = *t;
          }
          wl.admission = std::move(fa);
        }
      }
      in.workloads.push_back(std::move(wl));
    }
  }
  if (!L.diagnostics().empty()) return InvalidArgument("invalid simulation");
  return in;
}

// yaml-cpp passes bytes through unchecked, and names that are not UTF-8 cannot be printed as JSON
// (the simulation's result: nlohmann throws). Found by fuzz/simulate_fuzz.cc.
bool CheckUtf8(std::string_view yaml, Loader& loader) {
  size_t bad = FindInvalidUtf8(yaml);
  if (bad == std::string_view::npos) return true;
  auto [line, column] = LineColumnAt(yaml, bad);
  YAML::Mark mark;
  mark.line = line - 1;
  mark.column = column - 1;
  loader.Error(mark, fmt::format("invalid UTF-8 byte 0x{:02x}: the file must be UTF-8 text",
                                 static_cast<unsigned char>(yaml[bad])));
  return false;
}

Status DiagnosticsStatus(const std::vector<Diagnostic>& diags) {
  std::vector<std::string> lines;
  for (const Diagnostic& d : diags) lines.push_back(d.ToString());
  return InvalidArgument(Join(lines, "\n"));
}

}  // namespace

Result<SimulationInput> ParseSimulation(std::string_view yaml, std::string_view filename,
                                        std::vector<Diagnostic>* diagnostics) {
  Loader loader(filename);
  if (!CheckUtf8(yaml, loader)) {
    if (diagnostics) *diagnostics = loader.diagnostics();
    return DiagnosticsStatus(loader.diagnostics());
  }
  std::optional<Result<SimulationInput>> parsed;
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    parsed = Parse(root, loader);
  } catch (const YAML::Exception& e) {
    loader.Error(e.mark, e.msg);
  } catch (const std::exception& e) {
    loader.Error(YAML::Mark(), e.what());
  }
  if (diagnostics) *diagnostics = loader.diagnostics();
  if (!loader.diagnostics().empty()) return DiagnosticsStatus(loader.diagnostics());
  if (!parsed || !parsed->ok()) return InvalidArgument("invalid simulation");
  return std::move(*parsed).value();
}

Result<Config> ParseAdmissionConfig(std::string_view yaml, std::string_view filename,
                                    std::vector<Diagnostic>* diagnostics) {
  Loader loader(filename);
  if (!CheckUtf8(yaml, loader)) {
    if (diagnostics) *diagnostics = loader.diagnostics();
    return DiagnosticsStatus(loader.diagnostics());
  }
  Config config;
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    if (root.IsMap()) {
      Defined defined;
      config = ParseConfigSections(root, loader, &defined);
    }
  } catch (const YAML::Exception& e) {
    loader.Error(e.mark, e.msg);
  } catch (const std::exception& e) {
    loader.Error(YAML::Mark(), e.what());
  }
  if (diagnostics) *diagnostics = loader.diagnostics();
  if (!loader.diagnostics().empty()) return DiagnosticsStatus(loader.diagnostics());
  return config;
}

namespace {
// Usage values print with 4 decimals: goldens stay readable and do not hang on the last bit.
double RoundTo(double v) { return std::isfinite(v) ? std::round(v * 1e4) / 1e4 : -1; }
nlohmann::json RoundAll(const std::map<std::string, double>& values) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : values) out[k] = RoundTo(v);
  return out;
}
}  // namespace

Result<nlohmann::json> Simulate(std::string_view yaml, std::string_view filename, int cycles,
                                std::vector<Diagnostic>* diagnostics) {
  TAU_ASSIGN_OR_RETURN(SimulationInput in, ParseSimulation(yaml, filename, diagnostics));
  auto fail = [&](const Status& s) {
    // Semantic errors the loader could not pin to a node are reported at the top of the file.
    std::vector<Diagnostic> d = {{std::string(filename), 1, 1, s.message()}};
    if (diagnostics) *diagnostics = d;
    return DiagnosticsStatus(d);
  };
  Result<Engine> engine = Engine::Create(in.config);
  if (!engine.ok()) return fail(engine.status());
  int64_t now = 0;
  for (const Workload& w : in.workloads) {
    Status s = engine->AddWorkload(w);
    if (!s.ok()) return fail(s);
    now = std::max({now, w.created_ms, w.admitted_ms});
  }
  for (const SimulationInput::Usage& u : in.usage) {
    Status s = engine->SetLocalQueueUsage(u.local_queue, u.queue, u.consumed, now);
    if (!s.ok()) return fail(s);
  }
  if (cycles < 1) cycles = 1;
  nlohmann::json admitted = nlohmann::json::array();
  nlohmann::json preempted = nlohmann::json::array();
  try {
    for (int c = 0; c < cycles; ++c) {
      if (c > 0) {
        for (const std::string& v : engine->PreemptedAwaitingEviction()) {
          Status s = engine->EvictWorkload(v);
          if (!s.ok()) return fail(s);
        }
      }
      CycleOptions options;
      options.now_ms = now + 1000 * (c + 1);
      options.report_pending = false;
      CycleResult r = engine->RunCycle(options);
      for (const AdmittedInfo& a : r.admitted) {
        admitted.push_back({{"name", a.name}, {"queue", a.queue}, {"flavors", a.flavors}});
      }
      for (const PreemptedInfo& p : r.preempted) {
        preempted.push_back({{"name", p.name}, {"reason", p.reason}, {"preemptor", p.preemptor}});
      }
    }
    nlohmann::json pending = nlohmann::json::array();
    for (const PendingInfo& p : engine->Pending()) {
      pending.push_back({{"name", p.name},
                         {"reason", p.reason},
                         {"message", p.message},
                         {"inadmissible", p.inadmissible},
                         {"position", p.position}});
    }
    nlohmann::json out = {{"admitted", admitted}, {"preempted", preempted}, {"pending", pending}};
    nlohmann::json lqs = nlohmann::json::array();
    for (const LocalQueueUsage& u : engine->LocalQueues()) {
      lqs.push_back({{"name", u.name},
                     {"queue", u.queue},
                     {"usage", RoundTo(u.usage)},
                     {"consumed", RoundAll(u.consumed)},
                     {"admitted", RoundAll(u.admitted)}});
    }
    if (!lqs.empty()) out["local_queues"] = std::move(lqs);
    if (!in.platform_sections.empty())
      out["not_simulated"] = in.platform_sections;  // platform policy, not admission
    return out;
  } catch (const nlohmann::json::exception& e) {
    return Internal(std::string("building the simulation result: ") + e.what());
  }
}

}  // namespace tau::admission
