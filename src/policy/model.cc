// The Platform model's lookups, the built-in default platform, and its conversions (admission
// configuration, JSON for `tau platform show`).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/clock.h"
#include "common/strings.h"
#include "policy/policy.h"
#include "policy/reader.h"

namespace tau::policy {
namespace {

template <typename T>
const T* FindByName(const std::vector<T>& items, std::string_view name) {
  auto it = std::find_if(items.begin(), items.end(), [&](const T& t) { return t.name == name; });
  return it == items.end() ? nullptr : &*it;
}

nlohmann::json OptQty(const std::optional<Quantity>& q) {
  return q ? nlohmann::json(q->ToString()) : nlohmann::json(nullptr);
}

nlohmann::json GroupsJson(const std::vector<admission::ResourceGroup>& groups) {
  nlohmann::json out = nlohmann::json::array();
  for (const admission::ResourceGroup& g : groups) {
    nlohmann::json flavors = nlohmann::json::array();
    for (const admission::FlavorQuotas& fq : g.flavors) {
      nlohmann::json resources = nlohmann::json::array();
      for (const admission::ResourceQuota& rq : fq.resources) {
        nlohmann::json r = {{"name", rq.name}, {"nominal", rq.nominal.ToString()}};
        if (rq.borrowing_limit) r["borrowing_limit"] = rq.borrowing_limit->ToString();
        if (rq.lending_limit) r["lending_limit"] = rq.lending_limit->ToString();
        resources.push_back(std::move(r));
      }
      flavors.push_back({{"name", fq.flavor}, {"resources", std::move(resources)}});
    }
    out.push_back({{"covered_resources", g.covered_resources}, {"flavors", std::move(flavors)}});
  }
  return out;
}

nlohmann::json QueueJson(const admission::ClusterQueue& q) {
  nlohmann::json borrow = {
      {"policy", q.preemption.borrow_within_cohort == admission::BorrowWithinCohortPolicy::kNever
                     ? "Never"
                     : "LowerPriority"}};
  if (q.preemption.max_priority_threshold) {
    borrow["max_priority_threshold"] = *q.preemption.max_priority_threshold;
  }
  return {
      {"name", q.name},
      {"cohort", q.cohort},
      {"queueing_strategy", q.queueing_strategy == admission::QueueingStrategy::kStrictFifo
                                ? "StrictFIFO"
                                : "BestEffortFIFO"},
      {"resource_groups", GroupsJson(q.resource_groups)},
      {"preemption",
       {{"within_cluster_queue",
         admission::WithinClusterQueueName(q.preemption.within_cluster_queue)},
        {"reclaim_within_cohort",
         admission::ReclaimWithinCohortName(q.preemption.reclaim_within_cohort)},
        {"borrow_within_cohort", std::move(borrow)}}},
      {"flavor_fungibility",
       {{"when_can_borrow",
         q.flavor_fungibility.when_can_borrow == admission::WhenCanBorrow::kBorrow
             ? "Borrow"
             : "TryNextFlavor"},
        {"when_can_preempt",
         q.flavor_fungibility.when_can_preempt == admission::WhenCanPreempt::kPreempt
             ? "Preempt"
             : "TryNextFlavor"}}},
      {"fair_sharing", {{"weight", q.fair_sharing_weight}}},
      {"admission_mode",
       q.admission_fair_sharing ? "UsageBasedAdmissionFairSharing" : "NoAdmissionFairSharing"},
  };
}

}  // namespace

const std::vector<std::string>& TopologyLevelNames() {
  static const auto* names =
      new std::vector<std::string>{"site", "network-domain", "accelerator-domain", "host"};
  return *names;
}

namespace {
nlohmann::json CostsJson(const Costs& costs) {
  if (costs.flavors.empty()) return nullptr;
  nlohmann::json flavors = nlohmann::json::object();
  for (const auto& [name, c] : costs.flavors)
    flavors[name] = {{"gpu_hour", c.gpu_hour}, {"cpu_hour", c.cpu_hour}};
  return {{"currency", costs.currency}, {"flavors", std::move(flavors)}};
}
}  // namespace

const Workspace* Platform::FindWorkspace(std::string_view name) const {
  return FindByName(workspaces, name);
}
const User* Platform::FindUser(std::string_view name) const { return FindByName(users, name); }
const PriorityClass* Platform::FindPriority(std::string_view name) const {
  return FindByName(priorities, name);
}
const ComputeProfile* Platform::FindProfile(std::string_view name) const {
  return FindByName(compute_profiles, name);
}
const StorageVolume* Platform::FindStorage(std::string_view name) const {
  return FindByName(storage, name);
}
const admission::ClusterQueue* Platform::FindQueue(std::string_view name) const {
  return FindByName(admission.queues, name);
}
const admission::ResourceFlavor* Platform::FindFlavor(std::string_view name) const {
  return FindByName(admission.flavors, name);
}

std::string PlatformOutcome::ErrorText() const {
  std::vector<std::string> lines;
  for (const Diagnostic& d : diagnostics) lines.push_back(d.ToString());
  return Join(lines, "\n");
}

std::string DefaultPlatformText(int gpus, int64_t cpu_milli, int64_t memory_bytes) {
  return fmt::format(
      "# The default platform: this machine as one queue that everyone may use.\n"
      "schema_version: 1\n"
      "flavors:\n"
      "  - name: default\n"
      "queues:\n"
      "  - name: default\n"
      "    resource_groups:\n"
      "      - covered_resources: [cpu, memory, nvidia.com/gpu]\n"
      "        flavors:\n"
      "          - name: default\n"
      "            resources:\n"
      "              - {{name: cpu, nominal: {}}}\n"
      "              - {{name: memory, nominal: {}}}\n"
      "              - {{name: nvidia.com/gpu, nominal: {}}}\n"
      "    # One machine, one queue: a higher-priority run may take GPUs from a lower one.\n"
      "    preemption:\n"
      "      within_cluster_queue: LowerPriority\n"
      "priorities:\n"
      "  - {{name: default, value: 0, description: the priority of runs that name none}}\n"
      "workspaces:\n"
      "  - name: default\n"
      "    description: everyone, on this machine\n"
      "    members: [\"*\"]\n"
      "    default_queue: default\n"
      "    default_priority: default\n"
      "defaults:\n"
      "  workspace: default\n"
      "  queue: default\n"
      "  priority: default\n",
      Quantity::FromMilli(std::max<int64_t>(0, cpu_milli)).ToString(),
      Quantity::FromUnits(std::max<int64_t>(0, memory_bytes)).ToString(), std::max(0, gpus));
}

Platform DefaultPlatform(int gpus, int64_t cpu_milli, int64_t memory_bytes) {
  // Parsed from its own text, so that what `tau platform show` prints is what is in force.
  PlatformOutcome parsed =
      ParsePlatform(DefaultPlatformText(gpus, cpu_milli, memory_bytes), "default platform");
  if (!parsed.ok()) {
    std::fprintf(stderr, "tau: the built-in default platform is invalid:\n%s\n",
                 parsed.ErrorText().c_str());
    std::abort();  // a bug in the text above, caught by policy_test
  }
  return std::move(*parsed.platform);
}

namespace {
// The tighter of two optional durations (either may be unset: no limit).
std::optional<int64_t> Tighter(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}
}  // namespace

std::optional<IdleLimit> EffectiveIdle(const Workspace* workspace, const spec::Policy& spec) {
  std::optional<IdleLimit> out;
  if (workspace && workspace->limits.idle) out = workspace->limits.idle;
  if (const std::optional<spec::IdleGuard>& g = spec.idle) {
    if (!out) {
      // The spec's alone: a warning needs its time (the stop's, when only that is given).
      std::optional<int64_t> warn = g->warn_after_ms ? g->warn_after_ms : g->stop_after_ms;
      if (!warn) return std::nullopt;
      out = IdleLimit{g->gpu_util_below.value_or(IdleLimit().gpu_util_below_pct), *warn,
                      g->stop_after_ms};
    } else {
      if (g->gpu_util_below)
        out->gpu_util_below_pct = std::max(out->gpu_util_below_pct, *g->gpu_util_below);
      out->warn_after_ms = *Tighter(out->warn_after_ms, g->warn_after_ms);
      out->stop_after_ms = Tighter(out->stop_after_ms, g->stop_after_ms);
    }
  }
  if (out && out->stop_after_ms)
    out->warn_after_ms = std::min(out->warn_after_ms, *out->stop_after_ms);
  return out;
}

std::optional<StallLimit> EffectiveStall(const Workspace* workspace, const spec::Policy& spec) {
  std::optional<StallLimit> out;
  if (workspace && workspace->limits.stall) out = workspace->limits.stall;
  if (const std::optional<spec::StallGuard>& g = spec.stall) {
    if (!out) {
      std::optional<int64_t> after = g->after_ms ? g->after_ms : g->stop_after_ms;
      if (!after) return std::nullopt;
      out = StallLimit{*after, g->stop_after_ms};
    } else {
      out->after_ms = *Tighter(out->after_ms, g->after_ms);
      out->stop_after_ms = Tighter(out->stop_after_ms, g->stop_after_ms);
    }
  }
  if (out && out->stop_after_ms) out->after_ms = std::min(out->after_ms, *out->stop_after_ms);
  return out;
}

std::string LocalQueueName(const std::string& workspace, const std::string& queue) {
  return workspace + "/" + queue;
}

admission::Config ToAdmissionConfig(const Platform& platform) {
  admission::Config config = platform.admission;
  // Each workspace has a LocalQueue of every queue (as on Kubernetes); their weights are its.
  for (const Workspace& w : platform.workspaces) {
    if (w.fair_sharing_weight == 1.0) continue;
    for (const admission::ClusterQueue& q : platform.admission.queues)
      if (q.admission_fair_sharing)
        config.local_queues.push_back(
            {LocalQueueName(w.name, q.name), q.name, w.fair_sharing_weight});
  }
  return config;
}

nlohmann::json ToJson(const Platform& p) {
  nlohmann::json flavors = nlohmann::json::array();
  for (const auto& f : p.admission.flavors) {
    flavors.push_back({{"name", f.name}, {"node_labels", f.node_labels}});
  }
  nlohmann::json cohorts = nlohmann::json::array();
  for (const auto& c : p.admission.cohorts) {
    cohorts.push_back({{"name", c.name},
                       {"parent", c.parent},
                       {"resource_groups", GroupsJson(c.resource_groups)},
                       {"fair_sharing", {{"weight", c.fair_sharing_weight}}}});
  }
  nlohmann::json queues = nlohmann::json::array();
  for (const auto& q : p.admission.queues) queues.push_back(QueueJson(q));
  nlohmann::json priorities = nlohmann::json::array();
  for (const auto& pc : p.priorities) {
    priorities.push_back({{"name", pc.name}, {"value", pc.value}, {"description", pc.description}});
  }
  nlohmann::json workspaces = nlohmann::json::array();
  for (const auto& w : p.workspaces) {
    nlohmann::json limits = {
        {"max_gpus_per_run",
         w.limits.max_gpus_per_run ? nlohmann::json(*w.limits.max_gpus_per_run) : nullptr},
        {"max_workers", w.limits.max_workers ? nlohmann::json(*w.limits.max_workers) : nullptr},
        {"max_runtime", w.limits.max_runtime_ms
                            ? nlohmann::json(internal::ShortDuration(*w.limits.max_runtime_ms))
                            : nullptr},
        {"max_log_bytes", w.limits.max_log_bytes.value_or(kDefaultMaxLogBytes)},
        {"max_metric_points", w.limits.max_metric_points.value_or(kDefaultMaxMetricPoints)},
        {"max_metric_series", w.limits.max_metric_series.value_or(kDefaultMaxMetricSeries)},
        {"idle", nullptr},
        {"stall", nullptr}};
    auto duration = [](const std::optional<int64_t>& ms) {
      return ms ? nlohmann::json(internal::ShortDuration(*ms)) : nlohmann::json(nullptr);
    };
    if (const auto& idle = w.limits.idle)
      limits["idle"] = {{"gpu_util_below", idle->gpu_util_below_pct},
                        {"warn_after", internal::ShortDuration(idle->warn_after_ms)},
                        {"stop_after", duration(idle->stop_after_ms)}};
    if (const auto& stall = w.limits.stall)
      limits["stall"] = {{"after", internal::ShortDuration(stall->after_ms)},
                         {"stop_after", duration(stall->stop_after_ms)}};
    nlohmann::json webhooks = nlohmann::json::array();
    for (const Webhook& h : w.webhooks)
      webhooks.push_back({{"url", h.url}, {"secret", h.secret}, {"events", h.events}});
    workspaces.push_back({{"name", w.name},
                          {"description", w.description},
                          {"members", w.members},
                          {"viewers", w.viewers},
                          {"default_queue", w.default_queue},
                          {"default_priority", w.default_priority},
                          {"default_profile", w.default_profile},
                          {"default_output", w.default_output},
                          {"default_checkpoint", w.default_checkpoint},
                          {"allowed_images", w.allowed_images},
                          {"limits", std::move(limits)},
                          {"storage", w.storage},
                          {"run_users", w.run_users},
                          {"lanes", w.lanes},
                          {"webhooks", webhooks},
                          {"allowed_webhooks", w.allowed_webhooks},
                          {"fair_sharing", {{"weight", w.fair_sharing_weight}}}});
  }
  nlohmann::json profiles = nlohmann::json::array();
  for (const auto& cp : p.compute_profiles) {
    profiles.push_back({{"name", cp.name},
                        {"description", cp.description},
                        {"gpus", cp.gpus ? nlohmann::json(*cp.gpus) : nullptr},
                        {"cpus", OptQty(cp.cpus)},
                        {"memory", OptQty(cp.memory)},
                        {"flavor", cp.flavor},
                        {"gpu_class", cp.gpu_class}});
  }
  nlohmann::json storage = nlohmann::json::array();
  for (const auto& v : p.storage) {
    storage.push_back({{"name", v.name},
                       {"host_path", v.host_path},
                       {"pvc", v.pvc},
                       {"mount_path", v.mount_path},
                       {"read_only", v.read_only}});
  }
  // Token digests stay out: the platform is readable by every signed-in user.
  nlohmann::json users = nlohmann::json::array();
  for (const auto& u : p.users)
    users.push_back({{"name", u.name}, {"groups", u.groups}, {"tokens", u.token_sha256.size()}});
  nlohmann::json out = {
      {"flavors", std::move(flavors)},
      {"costs", CostsJson(p.costs)},
      {"cohorts", std::move(cohorts)},
      {"queues", std::move(queues)},
      {"fair_sharing", p.admission.fair_sharing},
      {"admission_fair_sharing", nullptr},
      {"priorities", std::move(priorities)},
      {"workspaces", std::move(workspaces)},
      {"compute_profiles", std::move(profiles)},
      {"storage", std::move(storage)},
      {"access", {{"admins", p.access.admins}, {"viewers", p.access.viewers}}},
      {"users", std::move(users)},
      {"node_labels",
       {{"gpu_class", p.node_labels.gpu_class}, {"gpu_series", p.node_labels.gpu_series}}},
      {"defaults",
       {{"workspace", p.defaults.workspace},
        {"queue", p.defaults.queue},
        {"priority", p.defaults.priority},
        {"cpus", OptQty(p.defaults.cpus)},
        {"memory", OptQty(p.defaults.memory)}}}};
  if (const auto& afs = p.admission.admission_fair_sharing)
    out["admission_fair_sharing"] = {
        {"usage_half_life", internal::ShortDuration(afs->usage_half_life_ms)},
        {"usage_sampling_interval", internal::ShortDuration(afs->usage_sampling_interval_ms)},
        {"resource_weights", afs->resource_weights}};
  // Shown when set, so that platforms without one read as before.
  for (const TopologyLevel& t : p.topology)
    out["topology"].push_back({{"level", t.level}, {"node_label", t.node_label}});
  for (const Budget& b : p.budgets) {
    nlohmann::json j = {{"name", b.name},       {"workspace", b.workspace},
                        {"user", b.user},       {"queue", b.queue},
                        {"period", b.period},   {"window_ms", b.window_ms},
                        {"warn_at", b.warn_at}, {"on_exceed", b.on_exceed}};
    if (b.gpu_hours) j["gpu_hours"] = *b.gpu_hours;
    if (b.cpu_hours) j["cpu_hours"] = *b.cpu_hours;
    if (b.cost) j["cost"] = *b.cost;
    out["budgets"].push_back(std::move(j));
  }
  return out;
}

}  // namespace tau::policy
