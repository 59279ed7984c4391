// ResolvedRun <-> JSON: the server records a run's resolution once, at submission, and reads it
// back (after a restart, for the evidence record, for `tau explain -o json`), so a later platform
// change never silently changes what an accepted run asked for.
#include <fmt/format.h>

#include "policy/policy.h"

namespace tau::policy {
namespace {

nlohmann::json OptQuantity(const std::optional<Quantity>& q) {
  return q ? nlohmann::json(q->ToString()) : nlohmann::json(nullptr);
}

Result<std::optional<Quantity>> ReadOptQuantity(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<Quantity>();
  if (!it->is_string()) return InvalidArgument(fmt::format("resolved.{}: not a string", key));
  TAU_ASSIGN_OR_RETURN(Quantity q, Quantity::Parse(it->get<std::string>()));
  return std::optional<Quantity>(q);
}

nlohmann::json PodJson(const PodResources& p) {
  return {{"cpus", OptQuantity(p.cpus)},
          {"memory", OptQuantity(p.memory)},
          {"cpu_limit", OptQuantity(p.cpu_limit)},
          {"memory_limit", OptQuantity(p.memory_limit)},
          {"gpus", p.gpus}};
}

Result<PodResources> PodFromJson(const nlohmann::json& j) {
  PodResources p;
  TAU_ASSIGN_OR_RETURN(p.cpus, ReadOptQuantity(j, "cpus"));
  TAU_ASSIGN_OR_RETURN(p.memory, ReadOptQuantity(j, "memory"));
  TAU_ASSIGN_OR_RETURN(p.cpu_limit, ReadOptQuantity(j, "cpu_limit"));
  TAU_ASSIGN_OR_RETURN(p.memory_limit, ReadOptQuantity(j, "memory_limit"));
  p.gpus = j.value("gpus", 0);
  return p;
}

// The member `key` when present and not null. (Iterating a temporary from json::value() draws
// g++ 12's false maybe-uninitialized warnings.)
const nlohmann::json* Member(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

nlohmann::json ToJson(const ResolvedRun& r) {
  nlohmann::json totals = nlohmann::json::object();
  for (const auto& [name, q] : r.total_requests) totals[name] = q.ToString();
  nlohmann::json mounts = nlohmann::json::array();
  for (const Mount& m : r.mounts)
    mounts.push_back({{"role", m.role},
                      {"volume", m.volume},
                      {"sub_path", m.sub_path},
                      {"host_path", m.host_path},
                      {"pvc", m.pvc},
                      {"mount_path", m.mount_path},
                      {"read_only", m.read_only}});
  nlohmann::json provenance = nlohmann::json::array();
  for (const Provenance& p : r.provenance)
    provenance.push_back({{"field", p.field}, {"value", p.value}, {"source", p.source}});
  nlohmann::json out = {
      {"workspace", r.workspace},
      {"queue", r.queue},
      {"priority_class", r.priority_class},
      {"priority", r.priority},
      {"compute_profile", r.compute_profile},
      {"workers", r.workers},
      {"gpus_per_worker", r.gpus_per_worker},
      {"cpus_per_worker", OptQuantity(r.cpus_per_worker)},
      {"memory_per_worker", OptQuantity(r.memory_per_worker)},
      {"worker", PodJson(r.worker)},
      {"head", r.head ? PodJson(*r.head) : nlohmann::json(nullptr)},
      {"total_requests", std::move(totals)},
      {"flavors", r.flavors},
      {"gpu_class", r.gpu_class},
      {"node_labels",
       {{"gpu_class", r.node_labels.gpu_class}, {"gpu_series", r.node_labels.gpu_series}}},
      {"topology", r.topology},
      {"checkpoint_artifact", r.checkpoint_artifact},
      {"node_selector", r.node_selector},
      {"max_runtime_ms",
       r.max_runtime_ms ? nlohmann::json(*r.max_runtime_ms) : nlohmann::json(nullptr)},
      {"max_log_bytes", r.max_log_bytes},
      {"max_metric_points", r.max_metric_points},
      {"max_metric_series", r.max_metric_series},
      {"image", r.image},
      {"mounts", std::move(mounts)},
      {"provenance", std::move(provenance)}};
  if (!r.code_subdir.empty()) out["code_subdir"] = r.code_subdir;
  return out;
}

Result<ResolvedRun> ResolvedRunFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("resolved run: not an object");
  try {
    ResolvedRun r;
    r.workspace = j.at("workspace").get<std::string>();
    r.queue = j.at("queue").get<std::string>();
    r.priority_class = j.value("priority_class", "");
    r.priority = j.value("priority", 0);
    r.compute_profile = j.value("compute_profile", "");
    r.workers = j.value("workers", 1);
    r.gpus_per_worker = j.value("gpus_per_worker", 0);
    TAU_ASSIGN_OR_RETURN(r.cpus_per_worker, ReadOptQuantity(j, "cpus_per_worker"));
    TAU_ASSIGN_OR_RETURN(r.memory_per_worker, ReadOptQuantity(j, "memory_per_worker"));
    if (const nlohmann::json* worker = Member(j, "worker")) {
      TAU_ASSIGN_OR_RETURN(r.worker, PodFromJson(*worker));
    } else {
      // Recorded before pods were resolved: the worker pod is the per-worker shape.
      r.worker = {r.cpus_per_worker, r.memory_per_worker, std::nullopt, std::nullopt,
                  r.gpus_per_worker};
    }
    if (const nlohmann::json* head = Member(j, "head")) {
      TAU_ASSIGN_OR_RETURN(PodResources h, PodFromJson(*head));
      r.head = h;
    }
    r.gpu_class = j.value("gpu_class", "");
    if (const nlohmann::json* labels = Member(j, "node_labels")) {
      r.node_labels.gpu_class = labels->value("gpu_class", std::string(kGpuClassLabel));
      r.node_labels.gpu_series = labels->value("gpu_series", std::string(kGpuSeriesLabel));
    }
    r.topology = j.value("topology", "");
    r.checkpoint_artifact = j.value("checkpoint_artifact", "");
    r.code_subdir = j.value("code_subdir", "");
    if (const nlohmann::json* totals = Member(j, "total_requests"))
      for (const auto& [name, q] : totals->items()) {
        TAU_ASSIGN_OR_RETURN(r.total_requests[name], Quantity::Parse(q.get<std::string>()));
      }
    r.flavors = j.value("flavors", std::vector<std::string>{});
    r.node_selector = j.value("node_selector", std::map<std::string, std::string>{});
    if (auto it = j.find("max_runtime_ms"); it != j.end() && it->is_number_integer())
      r.max_runtime_ms = it->get<int64_t>();
    // Runs recorded before the limits existed get the defaults.
    r.max_log_bytes = j.value("max_log_bytes", kDefaultMaxLogBytes);
    r.max_metric_points = j.value("max_metric_points", kDefaultMaxMetricPoints);
    r.max_metric_series = j.value("max_metric_series", kDefaultMaxMetricSeries);
    r.image = j.value("image", "");
    if (const nlohmann::json* mounts = Member(j, "mounts"))
      for (const auto& m : *mounts)
        r.mounts.push_back({m.value("role", ""), m.value("volume", ""), m.value("sub_path", ""),
                            m.value("host_path", ""), m.value("pvc", ""), m.value("mount_path", ""),
                            m.value("read_only", false)});
    if (const nlohmann::json* provenance = Member(j, "provenance"))
      for (const auto& p : *provenance)
        r.provenance.push_back({p.value("field", ""), p.value("value", ""), p.value("source", "")});
    return r;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(fmt::format("resolved run: {}", e.what()));
  }
}

}  // namespace tau::policy
