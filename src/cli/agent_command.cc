// `tau health agent --node NAME [--poll-interval 10s] [--kubeconfig FILE] [--once]`: watches this
// machine's GPUs and publishes their health on the node (condition TauGPUHealthy, taint
// tau.dev/gpu-unhealthy:NoSchedule). The Helm chart runs it as a DaemonSet.
#include <signal.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "health/health.h"
#include "health_agent/node_health.h"
#include "kubeapi/kubeapi.h"

namespace tau::cli {
namespace {

struct AgentFlags {
  std::string node;
  std::string poll_interval = "10s";
  std::string kubeconfig;
  bool once = false;
};

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop = true; }

void LogLine(const std::string& line) {
  std::fprintf(stderr, "%s %s\n", FormatRfc3339(NowMillis()).c_str(), line.c_str());
}

int CmdHealthAgent(const AgentFlags& flags) {
  if (flags.node.empty()) return Fail("health agent: --node (or $NODE_NAME) is required");
  Result<int64_t> poll_ms = ParseDurationMillis(flags.poll_interval);
  if (!poll_ms.ok()) return Fail(poll_ms.status().message());
  if (*poll_ms <= 0) return Fail("health agent: --poll-interval must be positive");

  Result<kubeapi::ClusterConfig> config = flags.kubeconfig.empty()
                                              ? kubeapi::LoadDefaultConfig()
                                              : kubeapi::LoadKubeconfig(flags.kubeconfig);
  if (!config.ok()) return Fail(config.status().message());
  Result<std::unique_ptr<kubeapi::Client>> client = kubeapi::Client::Create(*config);
  if (!client.ok()) return Fail(client.status().message());

  health_agent::NodeHealthAgentOptions options;
  options.node = flags.node;
  options.log = LogLine;
  health_agent::NodeHealthAgent agent(client->get(), options);

  health::MonitorOptions monitor_options;
  monitor_options.poll_interval_ms = *poll_ms;
  health::GpuMonitor monitor(monitor_options);

  if (flags.once) {
    // Two passes, so that checks debounced over two observations count, as they would a poll
    // later in the long-running agent.
    Status started = monitor.Start(/*start_threads=*/false);
    if (!started.ok()) return Fail(started.message());
    monitor.PollOnce();
    Result<health_agent::NodeHealthUpdate> update = agent.Publish(monitor.Snapshot());
    monitor.Stop();
    if (!update.ok()) return Fail(update.status().message());
    // `condition` is the Node condition this agent publishes to Kubernetes, not a tau API reply.
    std::printf("node %s: %s: %s=%s\n", flags.node.c_str(), update->summary.c_str(),
                health_agent::kGpuHealthyCondition, update->condition.value("status", "").c_str());
    return update->condition.value("status", "") == "True" ? 0 : kExitInvalid;
  }

  // No SA_RESTART: the agent only sleeps between ticks, and checks the flag at each.
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  Status started = monitor.Start();
  if (!started.ok()) return Fail(started.message());
  LogLine(fmt::format("node {}: watching {} GPUs every {}", flags.node,
                      monitor.Snapshot().inventory.devices.size(), FormatDuration(*poll_ms)));
  Status ran = agent.Run(&monitor, *poll_ms, g_stop);
  monitor.Stop();
  if (!ran.ok()) return Fail(ran.message());
  LogLine(fmt::format("node {}: stopped", flags.node));
  return 0;
}

}  // namespace

void RegisterHealthAgentCommand(CLI::App* health, Context* ctx) {
  auto flags = std::make_shared<AgentFlags>();
  if (const char* node = std::getenv("NODE_NAME")) flags->node = node;
  auto* agent = health->add_subcommand(
      "agent",
      "Publish this node's GPU health on Kubernetes: condition TauGPUHealthy and the taint "
      "tau.dev/gpu-unhealthy:NoSchedule while a GPU may not be used");
  agent->add_option("--node", flags->node, "The Node object's name (default: $NODE_NAME)");
  agent->add_option("--poll-interval", flags->poll_interval,
                    "Time between GPU health polls, e.g. 10s (XID events act at once)");
  agent->add_option("--kubeconfig", flags->kubeconfig,
                    "A kubeconfig (default: $KUBECONFIG, ~/.kube/config, then in-cluster)");
  agent->add_flag("--once", flags->once,
                  "One pass, then exit: 0 when every GPU may be used, 1 otherwise");
  agent->callback([flags, ctx] { ctx->rc = CmdHealthAgent(*flags); });
}

}  // namespace tau::cli
