// The GPU health agent's view of its node (`tau health agent`, the Helm chart's DaemonSet): turns
// the GPU verdicts of this machine into a node condition and a NoSchedule taint, and publishes them
// through the API server. Lives in kubeapi, not in health, so that health never depends on a
// Kubernetes client.
//
// What it publishes on node NAME:
//   * status.conditions[type=TauGPUHealthy]: "True" when every GPU may be used, "False" naming the
//     GPUs that may not (index, UUID, verdict, reasons), "Unknown" when NVML cannot be used;
//   * spec.taints[key=tau.dev/gpu-unhealthy, effect=NoSchedule, value="N-of-M"] while any GPU
//     may not be used, and nothing else: other taints are left exactly as they are.
// A GPU "may not be used" by the same rule the local server places runs by: !health::Placeable
// (Unhealthy, and Unknown: fail closed).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "health/health.h"
#include "kubeapi/kubeapi.h"

namespace tau::health_agent {

// The node condition type the agent owns.
inline constexpr const char* kGpuHealthyCondition = "TauGPUHealthy";
// Condition reasons (CamelCase, as Kubernetes reasons are).
inline constexpr const char* kReasonAllGpusHealthy = "AllGPUsHealthy";
inline constexpr const char* kReasonGpuUnhealthy = "GPUUnhealthy";
inline constexpr const char* kReasonNvmlUnavailable = "NVMLUnavailable";
inline constexpr const char* kReasonNoGpus = "NoGPUsFound";

// What the node should look like, computed from a health snapshot and the node as read.
struct NodeHealthUpdate {
  nlohmann::json condition;        // ours, as it should be now
  nlohmann::json conditions;       // status.conditions with ours replaced or appended
  nlohmann::json taints;           // spec.taints with ours added or removed (an array)
  bool condition_changed = false;  // status, reason or message differ from the node's
  bool taints_changed = false;
  bool tainted = false;      // our taint is in `taints`
  int64_t heartbeat_ms = 0;  // our condition's lastHeartbeatTime on the node as read; 0 if none
  std::string summary;       // for the log: "GPU 3 unhealthy (xid_79)", "all 8 GPUs healthy", ...
};

// Pure: `now_ms` stamps lastHeartbeatTime (and lastTransitionTime when the status changes). With
// NVML unusable (or no GPU found) the condition is Unknown and the taints are left as they are:
// the agent cannot tell, and removing a taint it cannot justify removing would fail open.
NodeHealthUpdate ComputeNodeHealth(const health::HealthSnapshot& snapshot,
                                   const nlohmann::json& node, int64_t now_ms);

struct NodeHealthAgentOptions {
  std::string node;                             // the Node object's name
  int64_t heartbeat_interval_ms = 60'000;       // re-publish an unchanged condition this often
  int conflict_retries = 5;                     // re-read and retry a write that lost a race (409)
  std::function<void(const std::string&)> log;  // one line per change; may be empty
};

class NodeHealthAgent {
 public:
  NodeHealthAgent(kubeapi::Client* client, NodeHealthAgentOptions options);

  // One pass: GET the node, compute, and PATCH what changed (spec.taints on the node, the
  // condition list on nodes/NAME/status), each with the node's resourceVersion as a precondition;
  // a conflict re-reads and tries again. Returns the update as published.
  Result<NodeHealthUpdate> Publish(const health::HealthSnapshot& snapshot);

  // Publishes every `poll_interval_ms`, and at once when a GPU's verdict changes (the monitor
  // runs its own threads), until `stop` becomes true. A failed pass is logged and retried at the
  // next tick: the API server being away for a while must not end the agent.
  Status Run(health::GpuMonitor* monitor, int64_t poll_interval_ms, const std::atomic<bool>& stop);

 private:
  void Log(const std::string& line) const;

  kubeapi::Client* client_;
  NodeHealthAgentOptions options_;
};

}  // namespace tau::health_agent
