// An engine as the registry lists it (engines/engines.h; docs/backends.md, "Registering an
// engine"): its name, what it is, what it can do, its own `tau server` options and the factory
// that makes its backend from what the server hands it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/capabilities.h"
#include "common/status.h"
#include "health/health.h"

namespace tau::server {

// One of an engine's own options: `tau server --NAME VALUE` (or `--NAME` for a flag).
struct EngineOption {
  std::string name;  // without its dashes: "kubeconfig"
  std::string help;
  bool flag = false;  // takes no value; "true" when given
  // "" when the value is good, else why not; none: every value is.
  std::function<std::string(const std::string&)> check;
};

// What the server hands an engine's factory.
struct EngineInputs {
  std::string home;        // TAU_HOME
  std::string tau_binary;  // this program (the attempts' supervisor)
  int64_t stop_grace_ms = 10'000;
  health::GpuInventory gpus;  // this machine's
  int64_t cpu_milli = 0, memory_bytes = 0;
  bool platform_file = false;  // a platform file is applied (else the built-in default is used)
  std::map<std::string, std::string> options;  // the engine's own options given, by name
  std::function<void(const std::string&)> log;
};

// The size the built-in default platform gets instead of this machine's.
struct PlatformSize {
  int gpus = 0;
  int64_t cpu_milli = 0;
  int64_t memory_bytes = 0;
};

// What a factory made. `owned` holds what the backend uses (a cluster and its API client) and
// outlives it (members go in reverse order).
struct EngineMade {
  std::shared_ptr<void> owned;
  std::unique_ptr<Backend> backend;
  std::optional<PlatformSize> default_platform_size;  // a cluster's schedulable nodes
};

struct Engine {
  std::string name;         // `tau server --backend NAME`; the backend's Name()
  std::string description;  // one line
  Capabilities caps;        // the backend's Caps()
  std::vector<EngineOption> options;
  std::function<Result<EngineMade>(const EngineInputs&)> make;
};

}  // namespace tau::server
