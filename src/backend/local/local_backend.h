// The local backend (backend.h): runs' attempts run on this machine. tau's admission engine
// decides (quota, priority, preemption), placement puts an admitted run on free, placeable GPUs,
// CPUs and memory in submission order, and each attempt runs under a supervisor (`tau __shim`)
// forked by the zygote and watched through a pidfd; its result.json says how it ended.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/engine.h"
#include "health/health.h"
#include "runtime/runtime.h"

namespace tau::server {

struct LocalBackendOptions {
  std::string home;        // TAU_HOME
  std::string tau_binary;  // `tau __zygote` forks a shim per attempt, or `tau __shim DIR` is exec'd
  int64_t stop_grace_ms = 10'000;
  health::GpuInventory gpus;
  int64_t cpu_capacity_milli = 0;
  int64_t memory_capacity_bytes = 0;
};

std::unique_ptr<Backend> NewLocalBackend(LocalBackendOptions options);

// The local engine as the registry lists it (engines/engines.h), and what it can do.
Engine LocalEngine();
Capabilities LocalCapabilities();

// This machine's online CPUs (in thousandths) and memory (bytes; 0 when /proc/meminfo says none).
int64_t DetectCpuMilli();
int64_t DetectMemoryBytes();

}  // namespace tau::server
