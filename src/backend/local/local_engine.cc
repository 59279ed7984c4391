// The local engine's registration (engines/engines.h): runs are processes on this machine.
#include "backend/local/local_backend.h"

namespace tau::server {

Capabilities LocalCapabilities() {
  Capabilities caps;
  caps.files_on_server = true;
  caps.processes_here = true;
  return caps;
}

Engine LocalEngine() {
  Engine e;
  e.name = "local";
  e.description = "processes on this machine";
  e.caps = LocalCapabilities();
  e.make = [](const EngineInputs& in) -> Result<EngineMade> {
    LocalBackendOptions local;
    local.home = in.home;
    local.tau_binary = in.tau_binary;
    local.stop_grace_ms = in.stop_grace_ms;
    local.gpus = in.gpus;
    local.cpu_capacity_milli = in.cpu_milli;
    local.memory_capacity_bytes = in.memory_bytes;
    EngineMade made;
    made.backend = NewLocalBackend(std::move(local));
    return made;
  };
  return e;
}

}  // namespace tau::server
