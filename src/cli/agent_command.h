// `tau health agent`: the GPU health agent of the Helm chart's DaemonSet
// (src/health_agent/node_health.h).
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace tau::cli {

// Adds `agent` under the `health` subcommand; its exit code goes to `*rc`.
void RegisterHealthAgentCommand(CLI::App* health, int* rc);

}  // namespace tau::cli
