// Resolve: a run's effective settings from its spec, its workspace's defaults, a compute profile
// and the platform's defaults and limits, each value recorded with its source. Every violation is
// collected, so that a researcher fixes a spec in one round trip.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "common/clock.h"
#include "common/strings.h"
#include "policy/policy.h"
#include "policy/reader.h"

namespace tau::policy {
namespace {

constexpr const char* kSpec = "spec";
constexpr const char* kPlatformDefault = "platform default";
constexpr const char* kCommandLine = "command line";  // a --set of tau run or tau rerun

std::string WorkspaceDefault(const Workspace& w) {
  return fmt::format("workspace {} default", w.name);
}
std::string ProfileSource(const ComputeProfile& p) {
  return fmt::format("compute profile {}", p.name);
}
std::string LimitSource(const Workspace& w) {
  return fmt::format("platform limit (workspace {})", w.name);
}

std::string GuardrailSource(const Workspace& w) {
  return fmt::format("workspace guardrail (workspace {})", w.name);
}

template <typename T>
std::vector<std::string> Names(const std::vector<T>& items) {
  std::vector<std::string> out;
  for (const T& t : items) out.push_back(t.name);
  return out;
}

std::string JoinPath(const std::string& base, const std::string& sub) {
  if (base.empty() || sub.empty()) return base;
  return base.back() == '/' ? base + sub : base + "/" + sub;
}

std::set<std::string> QueueFlavors(const admission::ClusterQueue& q) {
  std::set<std::string> out;
  for (const auto& g : q.resource_groups) {
    for (const auto& f : g.flavors) out.insert(f.flavor);
  }
  return out;
}

bool QueueCovers(const admission::ClusterQueue& q, const std::string& resource) {
  for (const auto& g : q.resource_groups) {
    if (std::find(g.covered_resources.begin(), g.covered_resources.end(), resource) !=
        g.covered_resources.end()) {
      return true;
    }
  }
  return false;
}

bool IsMember(const Workspace& w, const Caller& caller) {
  for (const std::string& m : w.members) {
    if (m == kEveryone || (!caller.user.empty() && m == caller.user)) return true;
    if (StartsWith(m, "group:")) {
      std::string group = m.substr(6);
      if (std::find(caller.groups.begin(), caller.groups.end(), group) != caller.groups.end()) {
        return true;
      }
    }
  }
  return false;
}

class Resolver {
 public:
  Resolver(const spec::RunSpec& spec, const Platform& platform, const Caller& caller)
      : s_(spec), p_(platform), caller_(caller) {}

  Result<ResolvedRun> Run() {
    const Workspace* w = ResolveWorkspace();
    if (w != nullptr) {
      if (!IsMember(*w, caller_)) {
        denied_ = true;
        Fail(fmt::format("policy.workspace: user '{}' is not a member of workspace '{}'",
                         caller_.user, w->name));
      }
      const ComputeProfile* profile = ResolveProfile(*w);
      const admission::ClusterQueue* queue = ResolveQueue(*w);
      ResolvePriority(*w);
      ResolveCompute(*w, profile);
      out_.node_labels = p_.node_labels;
      out_.topology = s_.policy.topology == "unconstrained" ? "" : s_.policy.topology;
      if (queue != nullptr) ResolveFlavors(*queue, profile);
      if (queue != nullptr) CheckQueueResources(*queue);
      ResolveImage(*w);
      CheckWebhooks(*w);
      ResolveRuntime(*w);
      ResolveGuardrails(*w);
      ResolveStorage(*w);
    }
    if (!errors_.empty()) {
      std::string message = Join(errors_, "\n");
      return denied_ ? PermissionDenied(message) : InvalidArgument(message);
    }
    return std::move(out_);
  }

 private:
  void Add(std::string field, std::string value, std::string source) {
    out_.provenance.push_back({std::move(field), std::move(value), std::move(source)});
  }
  void Fail(std::string message) { errors_.push_back(std::move(message)); }

  const Workspace* ResolveWorkspace() {
    const std::string& asked = s_.policy.workspace;
    const Workspace* w = nullptr;
    std::string source = kPlatformDefault;
    if (!asked.empty()) {
      w = p_.FindWorkspace(asked);
      source = kSpec;
      if (w == nullptr) {
        Fail(fmt::format("policy.workspace: unknown workspace '{}'{}", asked,
                         internal::Hint(asked, Names(p_.workspaces))));
      }
    } else if (!s_.policy.namespace_name.empty() &&
               p_.FindWorkspace(s_.policy.namespace_name) != nullptr) {
      // TauGrid's configs name the namespace; on Kubernetes a workspace's namespace is its name.
      w = p_.FindWorkspace(s_.policy.namespace_name);
      source = "spec (policy.namespace)";
    } else if (!p_.defaults.workspace.empty()) {
      w = p_.FindWorkspace(p_.defaults.workspace);
    } else if (p_.workspaces.size() == 1) {
      w = &p_.workspaces.front();
    } else {
      Fail(
          fmt::format("policy.workspace: the spec names no workspace and the platform has no "
                      "default workspace (workspaces: {})",
                      Join(Names(p_.workspaces), ", ")));
    }
    if (w != nullptr) {
      out_.workspace = w->name;
      Add("policy.workspace", w->name, source);
    }
    return w;
  }

  // policy.profile, or TauGrid's policy.preset (a preset is a compute profile of the platform).
  const ComputeProfile* ResolveProfile(const Workspace& w) {
    const ComputeProfile* profile = nullptr;
    const std::string& named = s_.policy.profile;
    const std::string& preset = s_.policy.preset;
    if (!named.empty() && !preset.empty() && named != preset) {
      Fail(
          fmt::format("policy.preset: '{}' and policy.profile '{}' name different compute "
                      "profiles; give one of them",
                      preset, named));
      return nullptr;
    }
    const std::string& asked = named.empty() ? preset : named;
    const char* field = named.empty() ? "policy.preset" : "policy.profile";
    if (!asked.empty()) {
      profile = p_.FindProfile(asked);
      if (profile == nullptr) {
        Fail(fmt::format(
            "{}: unknown compute profile '{}'{}{}", field, asked,
            internal::Hint(asked, Names(p_.compute_profiles)),
            named.empty() ? " (a preset names one of the platform's compute_profiles)" : ""));
        return nullptr;
      }
      Add("policy.profile", profile->name, named.empty() ? "spec (policy.preset)" : kSpec);
    } else if (!w.default_profile.empty()) {
      profile = p_.FindProfile(w.default_profile);
      if (profile != nullptr) Add("policy.profile", profile->name, WorkspaceDefault(w));
    } else {
      Add("policy.profile", "none", kPlatformDefault);
    }
    if (profile != nullptr) out_.compute_profile = profile->name;
    return profile;
  }

  const admission::ClusterQueue* ResolveQueue(const Workspace& w) {
    const admission::ClusterQueue* q = nullptr;
    std::string source;
    const std::string& lane = s_.policy.lane;
    if (!lane.empty()) {
      // TauGrid's lane: the workspace maps it to a queue.
      auto it = w.lanes.find(lane);
      if (it == w.lanes.end()) {
        std::vector<std::string> lanes;
        for (const auto& [name, queue] : w.lanes) lanes.push_back(name);
        Fail(fmt::format("policy.lane: workspace '{}' has no lane '{}' ({}){}", w.name, lane,
                         lanes.empty() ? "it defines no lanes: see workspaces[].lanes"
                                       : "its lanes: " + Join(lanes, ", "),
                         internal::Hint(lane, lanes)));
        return nullptr;
      }
      if (!s_.policy.queue.empty() && s_.policy.queue != it->second) {
        Fail(
            fmt::format("policy.lane: lane '{}' goes to queue '{}', but policy.queue is '{}'; "
                        "give one of them",
                        lane, it->second, s_.policy.queue));
        return nullptr;
      }
      q = p_.FindQueue(it->second);
      source = fmt::format("workspace {} lane {}", w.name, lane);
    } else if (!s_.policy.queue.empty()) {
      q = p_.FindQueue(s_.policy.queue);
      source = kSpec;
      if (q == nullptr) {
        Fail(fmt::format("policy.queue: unknown queue '{}'{}", s_.policy.queue,
                         internal::Hint(s_.policy.queue, Names(p_.admission.queues))));
      }
    } else if (!w.default_queue.empty()) {
      q = p_.FindQueue(w.default_queue);
      source = WorkspaceDefault(w);
    } else if (!p_.defaults.queue.empty()) {
      q = p_.FindQueue(p_.defaults.queue);
      source = kPlatformDefault;
    } else if (p_.admission.queues.size() == 1) {
      q = &p_.admission.queues.front();
      source = kPlatformDefault;
    } else {
      Fail(
          fmt::format("policy.queue: the spec names no queue and neither workspace '{}' nor the "
                      "platform has a default queue (queues: {})",
                      w.name, Join(Names(p_.admission.queues), ", ")));
    }
    if (q != nullptr) {
      out_.queue = q->name;
      Add("policy.queue", q->name, source);
    }
    return q;
  }

  void ResolvePriority(const Workspace& w) {
    const std::string& named = s_.policy.priority;
    const std::string& tier = s_.policy.priority_tier;
    const PriorityClass* pc = nullptr;
    std::string source = kSpec;
    std::vector<std::string> classes = Names(p_.priorities);
    if (!named.empty() && !tier.empty() && named != tier) {
      Fail(
          fmt::format("policy.priority: '{}' and policy.priority_tier '{}' name different "
                      "priority classes; give one of them",
                      named, tier));
      return;
    }
    if (!named.empty()) {
      pc = p_.FindPriority(named);
      if (pc == nullptr) {
        Fail(fmt::format("policy.priority: unknown priority class '{}'{}", named,
                         internal::Hint(named, classes)));
        return;
      }
    } else if (!tier.empty()) {
      pc = p_.FindPriority(tier);
      if (pc == nullptr) {
        Fail(
            fmt::format("policy.priority_tier: '{}' maps to no priority class of this platform "
                        "(classes: {})",
                        tier, classes.empty() ? "none" : Join(classes, ", ")));
        return;
      }
    } else if (s_.policy.disable_default_priorities) {
      // The spec opted out of default priorities: the run gets Kueue's implicit 0.
      Add("policy.priority", "0 (no class)", kSpec);
      return;
    } else if (!w.default_priority.empty()) {
      pc = p_.FindPriority(w.default_priority);
      source = WorkspaceDefault(w);
    } else if (!p_.defaults.priority.empty()) {
      pc = p_.FindPriority(p_.defaults.priority);
      source = kPlatformDefault;
    }
    if (pc == nullptr) {
      Add("policy.priority", "0 (no class)", kPlatformDefault);
      return;
    }
    out_.priority_class = pc->name;
    out_.priority = pc->value;
    Add("policy.priority", fmt::format("{} ({})", pc->name, pc->value), source);
  }

  // cpus and memory: spec, else profile, else platform default, else no request.
  std::optional<Quantity> PickQuantity(const char* field, const std::optional<Quantity>& from_spec,
                                       const ComputeProfile* profile,
                                       std::optional<Quantity> ComputeProfile::*member,
                                       const std::optional<Quantity>& platform_default) {
    if (from_spec) {
      Add(field, from_spec->ToString(), kSpec);
      return from_spec;
    }
    if (profile != nullptr && profile->*member) {
      Add(field, (profile->*member)->ToString(), ProfileSource(*profile));
      return profile->*member;
    }
    Add(field, platform_default ? platform_default->ToString() : "none (no request)",
        kPlatformDefault);
    return platform_default;
  }

  void ResolveCompute(const Workspace& w, const ComputeProfile* profile) {
    out_.workers = s_.compute.workers;
    Add("compute.workers", std::to_string(out_.workers), kSpec);
    if (w.limits.max_workers && out_.workers > *w.limits.max_workers) {
      Fail(fmt::format("compute.workers: {} workers exceeds workspace '{}' limit max_workers: {}",
                       out_.workers, w.name, *w.limits.max_workers));
    }
    // RunSpec cannot tell "gpus: 0" from no gpus at all, so a profile's GPUs apply when the spec's
    // count is 0.
    std::string gpu_source = kSpec;
    out_.gpus_per_worker = s_.compute.gpus;
    if (s_.compute.gpus == 0 && profile != nullptr && profile->gpus) {
      out_.gpus_per_worker = *profile->gpus;
      gpu_source = ProfileSource(*profile);
    }
    Add("compute.gpus", std::to_string(out_.gpus_per_worker), gpu_source);
    int64_t total_gpus = int64_t{out_.gpus_per_worker} * out_.workers;
    if (w.limits.max_gpus_per_run && total_gpus > *w.limits.max_gpus_per_run) {
      std::string detail = out_.workers > 1 ? fmt::format(" ({} per worker x {} workers)",
                                                          out_.gpus_per_worker, out_.workers)
                                            : "";
      std::string from = gpu_source == kSpec ? "" : fmt::format(" (from {})", gpu_source);
      Fail(
          fmt::format("compute.gpus: {} GPUs per run{}{} exceeds workspace '{}' limit "
                      "max_gpus_per_run: {}",
                      total_gpus, detail, from, w.name, *w.limits.max_gpus_per_run));
    }
    std::optional<Quantity> cpus = PickQuantity("compute.cpus", s_.compute.cpus, profile,
                                                &ComputeProfile::cpus, p_.defaults.cpus);
    std::optional<Quantity> memory = PickQuantity("compute.memory", s_.compute.memory, profile,
                                                  &ComputeProfile::memory, p_.defaults.memory);
    ResolvePods(cpus, memory);
    const PodResources& worker = out_.worker;
    Total(kCpuResource, worker.cpus, out_.head ? out_.head->cpus : std::nullopt, "compute.cpus");
    Total(kMemoryResource, worker.memory, out_.head ? out_.head->memory : std::nullopt,
          "compute.memory");
    if (total_gpus > 0) out_.total_requests[kGpuResource] = Quantity::FromUnits(total_gpus);
  }

  // The pods' sizes, one rule for every backend (TauGrid's): workers take compute.worker_* when
  // given, else the per-worker shape; Job pods' limits are compute.cpu_limit / memory_limit. A
  // rayjob's control-only head takes compute.head_*, else the per-worker shape when worker_* sized
  // the workers apart (the manifest's rule: cpus and memory then size the head); it has no GPUs.
  void ResolvePods(const std::optional<Quantity>& cpus, const std::optional<Quantity>& memory) {
    const spec::Compute& c = s_.compute;
    PodResources& w = out_.worker;
    w.gpus = out_.gpus_per_worker;
    w.cpus = c.worker_cpus ? c.worker_cpus : cpus;
    w.memory = c.worker_memory ? c.worker_memory : memory;
    w.cpu_limit = c.worker_cpu_limit ? c.worker_cpu_limit : c.cpu_limit;
    w.memory_limit = c.worker_memory_limit ? c.worker_memory_limit : c.memory_limit;
    if (c.worker_cpus) Add("compute.worker_cpus", c.worker_cpus->ToString(), kSpec);
    if (c.worker_memory) Add("compute.worker_memory", c.worker_memory->ToString(), kSpec);
    for (auto [field, limit] : {std::pair{"compute.cpu_limit", &w.cpu_limit},
                                std::pair{"compute.memory_limit", &w.memory_limit}}) {
      if (*limit) Add(field, (*limit)->ToString(), kSpec);
    }
    out_.cpus_per_worker = w.cpus;
    out_.memory_per_worker = w.memory;
    if (s_.kind != spec::WorkloadKind::kRayJob) return;
    // A head the spec does not size is left to the backend (the Kubernetes renderer's small
    // default; locally the driver is one process) and charged nothing here.
    const bool from_workers = (c.worker_cpus && cpus) || (c.worker_memory && memory);
    if (!c.head_cpus && !c.head_memory && !from_workers) return;
    PodResources head;
    head.cpus = c.head_cpus ? c.head_cpus : (c.worker_cpus ? cpus : std::nullopt);
    head.memory = c.head_memory ? c.head_memory : (c.worker_memory ? memory : std::nullopt);
    head.cpu_limit = c.head_cpu_limit;
    head.memory_limit = c.head_memory_limit;
    std::vector<std::string> parts;
    if (head.cpus) parts.push_back("cpu=" + head.cpus->ToString());
    if (head.memory) parts.push_back("memory=" + head.memory->ToString());
    Add("compute.head", Join(parts, ", "), kSpec);
    out_.head = head;
  }

  void Total(const char* resource, const std::optional<Quantity>& per_worker,
             const std::optional<Quantity>& head, const char* field) {
    if (!per_worker && !head) return;
    int64_t milli = 0;
    if (per_worker && __builtin_mul_overflow(per_worker->milli(), int64_t{out_.workers}, &milli)) {
      Fail(fmt::format("{}: {} x {} workers is too large", field, per_worker->ToString(),
                       out_.workers));
      return;
    }
    if (head && __builtin_add_overflow(milli, head->milli(), &milli)) {
      Fail(fmt::format("{}: the head and the workers together are too large", field));
      return;
    }
    out_.total_requests[resource] = Quantity::FromMilli(milli);
  }

  void ResolveFlavors(const admission::ClusterQueue& queue, const ComputeProfile* profile) {
    for (const auto& [k, v] : s_.policy.node_selector) out_.node_selector[k] = v;
    const std::string& class_label = p_.node_labels.gpu_class;
    std::string spec_class = s_.policy.gpu_class == "any" ? "" : s_.policy.gpu_class;
    std::string profile_class = profile != nullptr ? profile->gpu_class : "";
    const std::string profile_flavor = profile != nullptr ? profile->flavor : "";
    if (!spec_class.empty() && !profile_class.empty() && spec_class != profile_class) {
      Fail(
          fmt::format("policy.gpu_class: '{}' conflicts with compute profile '{}' gpu_class "
                      "'{}'; give one of them",
                      spec_class, profile->name, profile_class));
      return;
    }
    std::string gpu_class = spec_class.empty() ? profile_class : spec_class;
    std::string source =
        spec_class.empty() && profile != nullptr ? ProfileSource(*profile) : std::string(kSpec);
    std::vector<std::string> flavors;
    if (!profile_flavor.empty()) {
      const admission::ResourceFlavor* f = p_.FindFlavor(profile_flavor);
      bool has_class = false;
      if (f != nullptr) {
        auto label = f->node_labels.find(class_label);
        has_class = label != f->node_labels.end() && label->second == spec_class;
      }
      if (!spec_class.empty() && !has_class) {
        Fail(
            fmt::format("policy.gpu_class: '{}' conflicts with compute profile '{}' flavor "
                        "'{}'; give one of them",
                        spec_class, profile->name, profile_flavor));
        return;
      }
      flavors.push_back(profile_flavor);
      source = ProfileSource(*profile);
    } else if (!gpu_class.empty()) {
      std::vector<std::string> classes;
      for (const auto& f : p_.admission.flavors) {
        auto label = f.node_labels.find(class_label);
        if (label == f.node_labels.end()) continue;
        classes.push_back(label->second);
        if (label->second == gpu_class) flavors.push_back(f.name);
      }
      if (flavors.empty()) {
        Fail(
            fmt::format("policy.gpu_class: no flavor of this platform has GPU class '{}' "
                        "(classes: {})",
                        gpu_class, classes.empty() ? "none" : Join(classes, ", ")));
        return;
      }
    }
    if (!gpu_class.empty()) {
      auto it = out_.node_selector.find(class_label);
      if (it != out_.node_selector.end() && it->second != gpu_class) {
        Fail(fmt::format("policy.node_selector: {}={} conflicts with GPU class '{}'", class_label,
                         it->second, gpu_class));
        return;
      }
      out_.node_selector[class_label] = gpu_class;
      out_.gpu_class = gpu_class;
    }
    if (flavors.empty()) {
      Add("flavors", "any", kPlatformDefault);
      return;
    }
    std::set<std::string> offered = QueueFlavors(queue);
    std::vector<std::string> usable;
    for (const std::string& f : flavors) {
      if (offered.count(f)) usable.push_back(f);
    }
    if (usable.empty()) {
      Fail(
          fmt::format("flavors: queue '{}' offers none of the flavors this run needs ({}); its "
                      "flavors: {}",
                      queue.name, Join(flavors, ", "),
                      Join(std::vector<std::string>(offered.begin(), offered.end()), ", ")));
      return;
    }
    out_.flavors = usable;
    Add("flavors", Join(usable, ", "), source);
  }

  void CheckQueueResources(const admission::ClusterQueue& queue) {
    for (const auto& [resource, amount] : out_.total_requests) {
      if (!QueueCovers(queue, resource)) {
        Fail(fmt::format("policy.queue: queue '{}' provides no {}, which this run requests ({})",
                         queue.name, resource, amount.ToString()));
      }
    }
  }

  void ResolveImage(const Workspace& w) {
    const std::string& image = s_.runtime.image;
    if (image.empty()) return;  // the local backend runs on the host: nothing to check
    out_.image = image;
    Add("runtime.image", image, kSpec);
    if (w.allowed_images.empty()) return;
    for (const std::string& pattern : w.allowed_images) {
      if (GlobMatch(pattern, image)) return;
    }
    Fail(fmt::format("runtime.image: '{}' is not allowed in workspace '{}' (allowed_images: {})",
                     image, w.name, Join(w.allowed_images, ", ")));
  }

  // A run's own webhooks make the server post where its submitter says: only to the receivers its
  // workspace allows, none when it names none.
  void CheckWebhooks(const Workspace& w) {
    for (size_t i = 0; i < s_.policy.webhooks.size(); ++i) {
      const std::string& url = s_.policy.webhooks[i].url;
      if (w.allowed_webhooks.empty()) {
        Fail(
            fmt::format("policy.webhooks[{}].url: workspace '{}' allows no run webhooks; its "
                        "platform team can allow receivers with allowed_webhooks (URL patterns) "
                        "in platform.yaml",
                        i, w.name));
      } else if (std::none_of(
                     w.allowed_webhooks.begin(), w.allowed_webhooks.end(),
                     [&](const std::string& pattern) { return UrlMatches(pattern, url); })) {
        Fail(fmt::format(
            "policy.webhooks[{}].url: '{}' is not allowed in workspace '{}' (allowed_webhooks: {})",
            i, url, w.name, Join(w.allowed_webhooks, ", ")));
      }
    }
  }

  void ResolveRuntime(const Workspace& w) {
    const std::optional<int64_t>& asked = s_.max_runtime_ms;
    const std::optional<int64_t>& limit = w.limits.max_runtime_ms;
    // The workspace's limit caps the spec's value rather than refusing it: a run asking for more
    // time than allowed still runs, for as long as allowed, and explain says so.
    if (asked && (!limit || *asked <= *limit)) {
      out_.max_runtime_ms = asked;
      Add("run.max_runtime", internal::ShortDuration(*asked), kSpec);
    } else if (limit) {
      out_.max_runtime_ms = limit;
      Add("run.max_runtime",
          asked ? fmt::format("{} (spec asked {})", internal::ShortDuration(*limit),
                              internal::ShortDuration(*asked))
                : internal::ShortDuration(*limit),
          LimitSource(w));
    } else {
      Add("run.max_runtime", "none", kPlatformDefault);
    }
    out_.max_log_bytes = w.limits.max_log_bytes.value_or(kDefaultMaxLogBytes);
    out_.max_metric_points = w.limits.max_metric_points.value_or(kDefaultMaxMetricPoints);
    out_.max_metric_series = w.limits.max_metric_series.value_or(kDefaultMaxMetricSeries);
  }

  // The idle and stall limits the server will enforce: EffectiveIdle / EffectiveStall, the same
  // functions the controller's guardrails call, each value with where it came from and what the
  // spec asked when the workspace's stricter value won.
  void ResolveGuardrails(const Workspace& w) {
    using Ms = std::optional<int64_t>;
    auto row = [&](const std::string& field, std::optional<int64_t> effective, Ms asked,
                   Ms platform, bool percent) {
      if (!effective) return;
      auto text = [&](int64_t v) {
        return percent ? fmt::format("{}%", v) : internal::ShortDuration(v);
      };
      if (asked && *asked == *effective) {
        Add(field, text(*effective), kSpec);
        return;
      }
      const bool from_workspace = platform && *platform == *effective;
      Add(field,
          asked ? fmt::format("{} (spec asked {})", text(*effective), text(*asked))
                : text(*effective),
          from_workspace || !asked ? GuardrailSource(w) : std::string(kSpec));
    };
    const spec::Policy& sp = s_.policy;
    if (std::optional<IdleLimit> idle = EffectiveIdle(&w, sp)) {
      const std::optional<IdleLimit>& ws = w.limits.idle;
      Ms asked_pct, asked_warn, asked_stop;
      if (sp.idle) {
        if (sp.idle->gpu_util_below) asked_pct = *sp.idle->gpu_util_below;
        asked_warn = sp.idle->warn_after_ms;
        asked_stop = sp.idle->stop_after_ms;
      }
      row("policy.guardrails.idle.gpu_util_below", idle->gpu_util_below_pct, asked_pct,
          ws ? Ms(ws->gpu_util_below_pct) : Ms(), true);
      row("policy.guardrails.idle.warn_after", idle->warn_after_ms, asked_warn,
          ws ? Ms(ws->warn_after_ms) : Ms(), false);
      row("policy.guardrails.idle.stop_after", idle->stop_after_ms, asked_stop,
          ws ? ws->stop_after_ms : Ms(), false);
    }
    if (std::optional<StallLimit> stall = EffectiveStall(&w, sp)) {
      const std::optional<StallLimit>& ws = w.limits.stall;
      row("policy.guardrails.stall.after", stall->after_ms, sp.stall ? sp.stall->after_ms : Ms(),
          ws ? Ms(ws->after_ms) : Ms(), false);
      row("policy.guardrails.stall.stop_after", stall->stop_after_ms,
          sp.stall ? sp.stall->stop_after_ms : Ms(), ws ? ws->stop_after_ms : Ms(), false);
    }
  }

  void ResolveStorage(const Workspace& w) {
    struct Use {
      const char* role;
      const char* field;
      std::string asked;
      std::string fallback;
    };
    const Use uses[] = {
        {"data", "storage.data_pvc", s_.storage.data_pvc, ""},
        {"output", "storage.output", s_.storage.output, w.default_output},
        {"checkpoint", "storage.checkpoint", s_.storage.checkpoint, w.default_checkpoint}};
    for (const Use& use : uses) {
      std::string ref = use.asked.empty() ? use.fallback : use.asked;
      if (ref.empty()) continue;
      if (std::string_view(use.role) == "checkpoint" && !out_.checkpoint_artifact.empty()) continue;
      std::string source = use.asked.empty() ? WorkspaceDefault(w) : std::string(kSpec);
      if (StartsWith(ref, "/")) {
        // TauGrid's form: a path inside the run, under one of the workspace's volumes.
        std::optional<std::string> volume_ref = VolumeOfPath(w, use.field, ref);
        if (!volume_ref) continue;
        ref = *volume_ref;
      } else if (std::string_view(use.role) == "checkpoint" && !use.asked.empty() &&
                 ref.find('/') == std::string::npos && p_.FindStorage(ref) == nullptr) {
        // TauGrid's form: the name of the artifact inside the run's checkpoint directory.
        std::string hint = internal::Hint(ref, Names(p_.storage));
        if (!hint.empty()) {
          Fail(
              fmt::format("storage.checkpoint: '{}' is neither a storage volume nor clearly an "
                          "artifact name{}",
                          ref, hint));
          continue;
        }
        out_.checkpoint_artifact = ref;
        Add(use.field, fmt::format("artifact {} in the run's checkpoint directory", ref), source);
        continue;
      }
      std::string name = ref.substr(0, ref.find('/'));
      std::string sub = ref.size() > name.size() ? ref.substr(name.size() + 1) : "";
      while (!sub.empty() && sub.back() == '/') sub.pop_back();
      std::vector<std::string> parts = Split(sub, '/');
      if (name.empty() || std::find(parts.begin(), parts.end(), "..") != parts.end()) {
        Fail(
            fmt::format("{}: '{}' is not a storage volume name, optionally followed by /PATH "
                        "without '..'",
                        use.field, ref));
        continue;
      }
      const StorageVolume* v = p_.FindStorage(name);
      if (v == nullptr) {
        Fail(fmt::format("{}: unknown storage volume '{}'{}", use.field, name,
                         p_.storage.empty() ? " (the platform defines no storage)"
                                            : internal::Hint(name, Names(p_.storage))));
        continue;
      }
      if (std::find(w.storage.begin(), w.storage.end(), name) == w.storage.end()) {
        Fail(fmt::format("{}: workspace '{}' may not use storage volume '{}' (its storage: {})",
                         use.field, w.name, name,
                         w.storage.empty() ? "none" : Join(w.storage, ", ")));
        continue;
      }
      if (v->read_only && std::string_view(use.role) != "data") {
        Fail(fmt::format("{}: storage volume '{}' is read-only; {}s need a writable volume",
                         use.field, name, use.role));
        continue;
      }
      Mount m{use.role,    v->name,
              sub,         JoinPath(v->host_path, sub),
              v->pvc,      JoinPath(v->mount_path, sub),
              v->read_only};
      Add(use.field,
          fmt::format("{} at {} ({})", ref, m.mount_path, m.read_only ? "read-only" : "read-write"),
          source);
      out_.mounts.push_back(std::move(m));
    }
  }

  // "/data/projects/x" -> "data/projects/x" for the workspace volume mounted at /data (the longest
  // mount path that holds the path); nullopt after reporting when none does.
  std::optional<std::string> VolumeOfPath(const Workspace& w, const char* field,
                                          const std::string& path) {
    const StorageVolume* best = nullptr;
    std::vector<std::string> mounts;
    for (const std::string& name : w.storage) {
      const StorageVolume* v = p_.FindStorage(name);
      if (v == nullptr || v->mount_path.empty()) continue;
      mounts.push_back(fmt::format("{} ({})", v->mount_path, v->name));
      const std::string& m = v->mount_path;
      bool under = path == m || (StartsWith(path, m) && (m.back() == '/' || path[m.size()] == '/'));
      if (under && (best == nullptr || m.size() > best->mount_path.size())) best = v;
    }
    if (best == nullptr) {
      Fail(
          fmt::format("{}: '{}' is under none of workspace '{}''s storage volumes (mount paths: "
                      "{})",
                      field, path, w.name, mounts.empty() ? "none" : Join(mounts, ", ")));
      return std::nullopt;
    }
    std::string sub = path.substr(best->mount_path.size());
    while (!sub.empty() && sub.front() == '/') sub.erase(0, 1);
    while (!sub.empty() && sub.back() == '/') sub.pop_back();
    return sub.empty() ? best->name : best->name + "/" + sub;
  }

  const spec::RunSpec& s_;
  const Platform& p_;
  const Caller& caller_;
  ResolvedRun out_;
  std::vector<std::string> errors_;
  bool denied_ = false;
};

}  // namespace

const Provenance* ResolvedRun::Find(std::string_view field) const {
  for (const Provenance& p : provenance) {
    if (p.field == field) return &p;
  }
  return nullptr;
}

namespace {

// A value the spec gave because a --set said so is the command line's, not the file's; a --set of
// a field resolution records nothing of (runtime.env.LR, run.args) gets an entry of its own.
void MarkCommandLine(const spec::RunSpec& spec, ResolvedRun* run) {
  if (spec.overrides.empty()) return;
  auto covers = [](const std::string& set, const std::string& field) {
    return set == field || StartsWith(field, set + ".") || StartsWith(set, field + ".") ||
           StartsWith(set, field + "[");
  };
  std::vector<bool> shown(spec.overrides.size(), false);
  for (Provenance& p : run->provenance) {
    for (size_t i = 0; i < spec.overrides.size(); ++i) {
      if (!covers(spec::CanonicalField(spec.overrides[i].path), p.field)) continue;
      if (p.source == kSpec) p.source = kCommandLine;
      // The field's own entry says where its value came from (a profile may have won).
      if (spec::CanonicalField(spec.overrides[i].path) == p.field) shown[i] = true;
    }
  }
  for (size_t i = 0; i < spec.overrides.size(); ++i)
    if (!shown[i])
      run->provenance.push_back(
          {spec.overrides[i].path, spec.overrides[i].value, std::string(kCommandLine)});
}

}  // namespace

Result<ResolvedRun> Resolve(const spec::RunSpec& spec, const Platform& platform,
                            const Caller& caller) {
  TAU_ASSIGN_OR_RETURN(ResolvedRun run, Resolver(spec, platform, caller).Run());
  MarkCommandLine(spec, &run);
  return run;
}

Result<ResolvedRun> Resolve(const spec::RunSpec& spec, const Platform& platform,
                            const std::string& user) {
  return Resolve(spec, platform, Caller{user, {}});
}

std::string ExplainText(const ResolvedRun& run) {
  size_t field_width = 5, value_width = 5;  // "FIELD", "VALUE"
  for (const Provenance& p : run.provenance) {
    field_width = std::max(field_width, p.field.size());
    value_width = std::max(value_width, p.value.size());
  }
  std::string out =
      fmt::format("{:<{}}  {:<{}}  SOURCE\n", "FIELD", field_width, "VALUE", value_width);
  for (const Provenance& p : run.provenance) {
    out +=
        fmt::format("{:<{}}  {:<{}}  {}\n", p.field, field_width, p.value, value_width, p.source);
  }
  std::vector<std::string> requests;
  for (const auto& [resource, amount] : run.total_requests) {
    requests.push_back(fmt::format("{}={}", resource, amount.ToString()));
  }
  auto pod = [](const PodResources& p) {
    std::vector<std::string> parts;
    if (p.cpus) parts.push_back("cpu=" + p.cpus->ToString());
    if (p.memory) parts.push_back("memory=" + p.memory->ToString());
    if (p.gpus > 0) parts.push_back(fmt::format("{}={}", kGpuResource, p.gpus));
    std::vector<std::string> limits;
    if (p.cpu_limit) limits.push_back("cpu=" + p.cpu_limit->ToString());
    if (p.memory_limit) limits.push_back("memory=" + p.memory_limit->ToString());
    std::string text = parts.empty() ? "no requests" : Join(parts, ", ");
    if (!limits.empty()) text += " (limits " + Join(limits, ", ") + ")";
    return text;
  };
  out += fmt::format("\nper worker: {}\n", pod(run.worker));
  if (run.head) out += fmt::format("ray head: {}\n", pod(*run.head));
  out += fmt::format("requests ({} worker{}{}): {}\n", run.workers, run.workers == 1 ? "" : "s",
                     run.head ? " and the head" : "",
                     requests.empty() ? "none" : Join(requests, ", "));
  return out;
}

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Greedy matching with one backtrack point (the last '*'): linear in practice, no recursion.
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p, ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool UrlMatches(std::string_view pattern, std::string_view url) {
  // "scheme://host:port" and the path from the first '/' after it ("" when there is none).
  auto split = [](std::string_view u) {
    const size_t scheme = u.find("://");
    const size_t slash = scheme == std::string_view::npos ? scheme : u.find('/', scheme + 3);
    return std::pair(u.substr(0, slash),
                     slash == std::string_view::npos ? std::string_view() : u.substr(slash));
  };
  const auto [pattern_origin, pattern_path] = split(pattern);
  const auto [url_origin, url_path] = split(url);
  return GlobMatch(pattern_origin, url_origin) &&
         (pattern_path.empty() || GlobMatch(pattern_path, url_path.empty() ? "/" : url_path));
}

}  // namespace tau::policy
