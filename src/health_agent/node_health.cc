// The GPU health agent: verdicts -> node condition and taint, and the publishing loop.
#include "health_agent/node_health.h"

#include <chrono>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/clock.h"
#include "kube/kube.h"

namespace tau::health_agent {
namespace {

using nlohmann::json;

// Kubernetes timestamps (metav1.Time) have whole seconds.
std::string KubeTime(int64_t ms) {
  std::string text = FormatRfc3339(ms / 1000 * 1000);
  size_t dot = text.find('.');
  return dot == std::string::npos ? text : text.substr(0, dot) + "Z";
}

json ArrayAt(const json& object, const char* outer, const char* inner) {
  if (!object.is_object() || !object.contains(outer) || !object[outer].is_object())
    return json::array();
  const json& o = object[outer];
  if (!o.contains(inner) || !o[inner].is_array()) return json::array();
  return o[inner];
}

std::string GpuName(const health::HealthSnapshot& snapshot, int index) {
  for (const health::GpuDevice& d : snapshot.inventory.devices)
    if (d.index == index && !d.uuid.empty()) return fmt::format("GPU {} ({})", index, d.uuid);
  return fmt::format("GPU {}", index);
}

std::string ReasonsText(const health::GpuVerdict& v, bool messages) {
  std::string out;
  for (const health::Reason& r : v.reasons)
    out += (out.empty() ? "" : "; ") + (messages && !r.message.empty() ? r.message : r.check);
  if (out.empty()) out = v.verdict == health::Verdict::kUnknown ? "not checked yet" : "-";
  return out;
}

bool IsOurTaint(const json& taint) {
  return taint.is_object() && taint.value("key", "") == kube::kGpuUnhealthyTaint;
}

}  // namespace

NodeHealthUpdate ComputeNodeHealth(const health::HealthSnapshot& snapshot, const json& node,
                                   int64_t now_ms) {
  NodeHealthUpdate update;
  const json old_conditions = ArrayAt(node, "status", "conditions");
  const json old_taints = ArrayAt(node, "spec", "taints");
  json old_condition;
  for (const json& c : old_conditions)
    if (c.is_object() && c.value("type", "") == kGpuHealthyCondition) old_condition = c;
  bool old_tainted = false;
  for (const json& t : old_taints) old_tainted = old_tainted || IsOurTaint(t);

  // Which GPUs may not be used: the server's placement rule.
  std::vector<const health::GpuVerdict*> bad;
  for (const health::GpuVerdict& v : snapshot.verdicts)
    if (!health::Placeable(v.verdict)) bad.push_back(&v);
  const size_t total = snapshot.inventory.devices.size();

  std::string status, reason, message;
  bool known = true;  // false: leave the taint as it is
  if (!snapshot.inventory.driver_loaded) {
    known = false;
    status = "Unknown";
    reason = kReasonNvmlUnavailable;
    message = fmt::format("NVML cannot be used: {}", snapshot.inventory.note.empty()
                                                         ? "no NVIDIA driver found"
                                                         : snapshot.inventory.note);
    update.summary = "GPU health unknown (NVML unavailable)";
  } else if (total == 0) {
    known = false;
    status = "Unknown";
    reason = kReasonNoGpus;
    message = snapshot.inventory.note.empty() ? "NVML found no GPU on this node"
                                              : snapshot.inventory.note;
    update.summary = "GPU health unknown (no GPU found)";
  } else if (bad.empty()) {
    status = "True";
    reason = kReasonAllGpusHealthy;
    message = fmt::format("all {} GPUs may be used", total);
    update.summary = fmt::format("all {} GPUs healthy", total);
  } else {
    status = "False";
    reason = kReasonGpuUnhealthy;
    message = fmt::format("{} of {} GPUs may not be used:", bad.size(), total);
    for (const health::GpuVerdict* v : bad) {
      message += fmt::format(" {}: {}: {}.", GpuName(snapshot, v->gpu_index),
                             health::VerdictName(v->verdict), ReasonsText(*v, true));
      update.summary +=
          fmt::format("{}GPU {} {} ({})", update.summary.empty() ? "" : ", ", v->gpu_index,
                      health::VerdictName(v->verdict), ReasonsText(*v, false));
    }
  }

  const std::string now = KubeTime(now_ms);
  bool same_status = old_condition.is_object() && old_condition.value("status", "") == status;
  update.condition = {
      {"type", kGpuHealthyCondition},
      {"status", status},
      {"reason", reason},
      {"message", message},
      {"lastHeartbeatTime", now},
      {"lastTransitionTime", same_status ? old_condition.value("lastTransitionTime", now) : now},
  };
  update.condition_changed = !old_condition.is_object() || !same_status ||
                             old_condition.value("reason", "") != reason ||
                             old_condition.value("message", "") != message;
  if (old_condition.is_object()) {
    Result<int64_t> beat = ParseRfc3339(old_condition.value("lastHeartbeatTime", ""));
    update.heartbeat_ms = beat.ok() ? *beat : 0;
  }

  update.conditions = json::array();
  bool placed = false;
  for (const json& c : old_conditions) {
    if (c.is_object() && c.value("type", "") == kGpuHealthyCondition) {
      if (!placed) update.conditions.push_back(update.condition);
      placed = true;
    } else {
      update.conditions.push_back(c);
    }
  }
  if (!placed) update.conditions.push_back(update.condition);

  if (!known) {
    update.taints = old_taints;
    update.tainted = old_tainted;
    return update;
  }
  // Every other taint is kept as it is, in its place; ours is rewritten or dropped.
  update.tainted = !bad.empty();
  const json ours = {{"key", kube::kGpuUnhealthyTaint},
                     {"value", fmt::format("{}-of-{}", bad.size(), total)},
                     {"effect", "NoSchedule"}};
  update.taints = json::array();
  bool added = false;
  for (const json& t : old_taints) {
    if (!IsOurTaint(t)) {
      update.taints.push_back(t);
    } else if (update.tainted && !added) {
      update.taints.push_back(ours);
      added = true;
    }
  }
  if (update.tainted && !added) update.taints.push_back(ours);
  update.taints_changed = update.taints != old_taints;
  return update;
}

NodeHealthAgent::NodeHealthAgent(kubeapi::Client* client, NodeHealthAgentOptions options)
    : client_(client), options_(std::move(options)) {}

void NodeHealthAgent::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

Result<NodeHealthUpdate> NodeHealthAgent::Publish(const health::HealthSnapshot& snapshot) {
  Status last = Status::Ok();
  for (int attempt = 0; attempt <= options_.conflict_retries; ++attempt) {
    TAU_ASSIGN_OR_RETURN(json node, client_->Get("v1", "Node", "", options_.node));
    const int64_t now = NowMillis();
    NodeHealthUpdate update = ComputeNodeHealth(snapshot, node, now);
    std::string version = node["metadata"].value("resourceVersion", "");

    if (update.taints_changed) {
      // A merge patch replaces a list whole, so the whole list goes, guarded by the version it
      // was computed from: a taint someone else added meanwhile makes this a conflict, not a loss.
      json patch = {{"metadata", {{"resourceVersion", version}}},
                    {"spec", {{"taints", update.taints}}}};
      Result<json> patched = client_->MergePatch("v1", "Node", "", options_.node, patch);
      if (!patched.ok() && kubeapi::IsConflict(patched.status())) {
        last = patched.status();
        continue;
      }
      if (!patched.ok()) return patched.status();
      version = (*patched)["metadata"].value("resourceVersion", "");
    }
    const bool beat_due = now - update.heartbeat_ms >= options_.heartbeat_interval_ms;
    if (update.condition_changed || beat_due) {
      json patch = {{"metadata", {{"resourceVersion", version}}},
                    {"status", {{"conditions", update.conditions}}}};
      Result<json> patched = client_->MergePatch("v1", "Node", "", options_.node, patch, "status");
      if (!patched.ok() && kubeapi::IsConflict(patched.status())) {
        last = patched.status();
        continue;  // the taint (if any) is in place now; the next try sees it unchanged
      }
      if (!patched.ok()) return patched.status();
    }
    if (update.condition_changed || update.taints_changed) {
      std::string what =
          update.taints_changed
              ? fmt::format(": {} {}:NoSchedule", update.tainted ? "tainted" : "untainted",
                            kube::kGpuUnhealthyTaint)
              : "";
      Log(fmt::format("node {}: {}{}", options_.node, update.summary, what));
    }
    return update;
  }
  return FailedPrecondition(fmt::format("node {}: still conflicting after {} tries: {}",
                                        options_.node, options_.conflict_retries + 1,
                                        last.message()));
}

Status NodeHealthAgent::Run(health::GpuMonitor* monitor, int64_t poll_interval_ms,
                            const std::atomic<bool>& stop) {
  // The monitor's threads poll and catch XID events; the agent looks at its verdicts often and
  // publishes when one changed (an XID 79 should taint within a second, not a poll later) or when
  // the interval has passed.
  constexpr int64_t kTickMs = 200;
  std::vector<health::Verdict> published;
  int64_t next_ms = 0;
  while (!stop.load()) {
    health::HealthSnapshot snapshot = monitor->Snapshot();
    std::vector<health::Verdict> verdicts;
    for (const health::GpuVerdict& v : snapshot.verdicts) verdicts.push_back(v.verdict);
    const int64_t now = MonotonicMillis();
    if (now >= next_ms || verdicts != published) {
      Result<NodeHealthUpdate> update = Publish(snapshot);
      if (update.ok()) {
        published = verdicts;
        next_ms = now + poll_interval_ms;
      } else {
        Log(fmt::format("node {}: publishing GPU health failed: {}", options_.node,
                        update.status().ToString()));
        next_ms = now + std::min<int64_t>(poll_interval_ms, 5'000);
        published = verdicts;  // retried at next_ms, not at every tick
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kTickMs));
  }
  return Status::Ok();
}

}  // namespace tau::health_agent
