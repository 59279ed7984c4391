// The registry of engines (docs/backends.md, "Registering an engine"): the one list of where runs
// can run. `tau server --backend NAME` makes its backend through it, and the CLI's --backend
// choices and each engine's own options come from it; no code branches on an engine's name.
#pragma once

#include <string>
#include <vector>

#include "backend/engine.h"
#include "common/status.h"

namespace tau::engines {

// Every registered engine, in the order `--help` lists them (the first is the default).
const std::vector<server::Engine>& Registered();
// Their names.
std::vector<std::string> Names();
// The engine of that name ("": the first registered, the default); NotFound says which engines
// are registered.
Result<const server::Engine*> Find(const std::string& name);

}  // namespace tau::engines
