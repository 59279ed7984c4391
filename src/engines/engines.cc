#include "engines/engines.h"

#include <fmt/format.h>

#include "backend/kube/kube_backend.h"
#include "backend/local/local_backend.h"
#include "common/strings.h"

namespace tau::engines {

const std::vector<server::Engine>& Registered() {
  // One line per engine: its module's registration.
  static const auto* engines = new std::vector<server::Engine>{
      server::LocalEngine(),
      server::KubeEngine(),
  };
  return *engines;
}

std::vector<std::string> Names() {
  std::vector<std::string> names;
  for (const server::Engine& e : Registered()) names.push_back(e.name);
  return names;
}

Result<const server::Engine*> Find(const std::string& name) {
  for (const server::Engine& e : Registered())
    if (e.name == name || name.empty()) return &e;
  std::vector<std::string> known;
  for (const server::Engine& e : Registered())
    known.push_back(fmt::format("{} ({})", e.name, e.description));
  return NotFound(
      fmt::format("unknown backend '{}': the registered engines are {}", name, Join(known, ", ")));
}

}  // namespace tau::engines
