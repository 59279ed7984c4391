#include <CLI/CLI.hpp>

#include <cstring>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/files.h"
#include "health/health.h"
#include "runtime/runtime.h"
#include "server/server.h"

namespace tau::cli {

int Main(int argc, char** argv) {
  // The attempt supervisor is this same binary; it must start without parsing any flags.
  if (argc == 3 && std::strcmp(argv[1], "__shim") == 0) return runtime::ShimMain(argv[2]);
  if (argc == 2 && std::strcmp(argv[1], "__gpu-probe") == 0) {
    std::puts(health::RunActiveProbe().dump().c_str());
    return 0;
  }
  // `tau version` is the cold-start benchmark: answer before building the whole command tree.
  if (argc == 2 && std::strcmp(argv[1], "version") == 0) return CmdVersion({}, false);

  CLI::App app{"tau: queued, monitored, recoverable GPU runs from a tau.yaml", "tau"};
  app.require_subcommand(1);
  app.set_version_flag("--version", server::Version());
  Global g;
  app.add_option(
      "--server", g.server,
      "Server address (unix:///path/tau.sock or http://host:port); default: $TAU_SERVER, "
      "else the local server under $TAU_HOME");
  std::string output = "table";
  auto add_output = [&](CLI::App* cmd) {
    cmd->add_option("-o,--output", output, "Output format: table, json or yaml");
  };
  int rc = 0;
  auto format = [&]() {
    Format f;
    if (!ParseFormat(output, &f)) {
      rc = Fail("unknown output format '" + output + "' (table, json or yaml)");
      return std::optional<Format>();
    }
    return std::optional<Format>(f);
  };

  auto* version = app.add_subcommand("version", "Print tau's version");
  bool with_server = false;
  version->add_flag("--server-version", with_server, "Also ask the server for its version");
  version->callback([&] { rc = CmdVersion(g, with_server); });

  auto* validate =
      app.add_subcommand("validate", "Check tau.yaml files; exit 0 when all are valid");
  std::vector<std::string> files;
  bool quiet = false;
  validate->add_option("files", files, "Spec files")->required();
  validate->add_flag("-q,--quiet", quiet, "Print errors only");
  validate->callback([&] { rc = CmdValidate(files, quiet); });

  auto* schema = app.add_subcommand("schema", "Print the JSON Schema of tau.yaml");
  add_output(schema);
  schema->callback([&] {
    if (auto f = format()) rc = CmdSchema(*f == Format::kYaml ? Format::kYaml : Format::kJson);
  });

  auto* server = app.add_subcommand("server", "Run the tau server in the foreground");
  server::ServerOptions sopts;
  server->add_option("--home", sopts.home, "State directory (default $TAU_HOME, else ~/.tau)");
  server->add_option("--socket", sopts.socket_path, "Unix socket path (default HOME/tau.sock)");
  server->add_option("--listen", sopts.listen, "Also listen on TCP host:port");
  server->add_option("--stop-grace", sopts.stop_grace_ms,
                     "Milliseconds between SIGTERM and SIGKILL when stopping a run");
  server->add_option("--gpu-poll", sopts.gpu_poll_ms,
                     "Milliseconds between GPU health polls (XID events are watched in between)");
  server->add_flag("--quiet", sopts.quiet, "Log nothing");
  server->callback([&] {
    if (sopts.home.empty()) sopts.home = TauHome();
    sopts.tau_binary = runtime::SelfExecutable();
    rc = server::RunServer(sopts);
  });

  auto* run = app.add_subcommand("run", "Submit a run, stream its logs, exit with its exit status");
  std::string run_file = "tau.yaml";
  bool detach = false;
  run->add_option("file", run_file, "The spec (default ./tau.yaml)");
  run->add_flag("-d,--detach", detach, "Print the run name and return at once");
  run->callback([&] { rc = CmdRun(g, run_file, detach); });

  auto* list = app.add_subcommand("list", "List runs (active ones unless --all)");
  std::string state;
  bool all = false;
  int limit = 100;
  list->add_option("--state", state, "Only runs in this state (Queued, Running, Failed, ...)");
  list->add_flag("-a,--all", all, "Include finished runs");
  list->add_option("--limit", limit, "At most this many runs")->check(CLI::Range(1, 1000));
  add_output(list);
  list->callback([&] {
    if (auto f = format()) rc = CmdList(g, state, all, limit, *f);
  });

  std::string run_name;
  auto* status =
      app.add_subcommand("status", "Show a run's state (and why it waits, when it does)");
  status->add_option("run", run_name, "Run name")->required();
  add_output(status);
  status->callback([&] {
    if (auto f = format()) rc = CmdStatus(g, run_name, *f);
  });

  auto* describe = app.add_subcommand("describe", "Show a run's lifecycle, attempts and config");
  describe->add_option("run", run_name, "Run name")->required();
  add_output(describe);
  describe->callback([&] {
    if (auto f = format()) rc = CmdDescribe(g, run_name, *f);
  });

  auto* logs = app.add_subcommand("logs", "Print a run's logs");
  bool follow = false;
  int attempt = 0, rank = 0;
  logs->add_option("run", run_name, "Run name")->required();
  logs->add_flag("-f,--follow", follow, "Keep streaming until the run ends");
  logs->add_option("--attempt", attempt, "Attempt number (default: the latest; with -f, all)");
  logs->add_option("--rank", rank, "Worker rank of a gang (default 0)");
  logs->callback([&] { rc = CmdLogs(g, run_name, follow, attempt, rank); });

  auto* cancel =
      app.add_subcommand("cancel", "Cancel runs (SIGTERM, then SIGKILL after a grace period)");
  std::vector<std::string> names;
  cancel->add_option("runs", names, "Run names")->required();
  cancel->callback([&] { rc = CmdCancel(g, names); });

  auto* rerun = app.add_subcommand(
      "rerun", "Start a new run from a run's recorded spec and code snapshot; print its name");
  rerun->add_option("run", run_name, "Run name")->required();
  rerun->callback([&] { rc = CmdRerun(g, run_name); });

  auto* resume = app.add_subcommand(
      "resume", "Give a failed or cancelled run another attempt, resuming from a checkpoint");
  std::string resume_from;
  bool force = false;
  resume->add_option("run", run_name, "Run name")->required();
  resume->add_option("--from", resume_from,
                     "Checkpoint to resume from (in the run's checkpoint directory; default: the "
                     "newest complete one)");
  resume->add_flag("--force", force, "Resume even after OOMKilled");
  resume->callback([&] { rc = CmdResume(g, run_name, resume_from, force); });

  auto* gpus = app.add_subcommand("gpus", "List this machine's GPUs");
  add_output(gpus);
  gpus->callback([&] {
    if (auto f = format()) rc = CmdGpus(g, *f);
  });

  auto* platform = app.add_subcommand("platform", "Platform policy (platform.yaml)");
  platform->require_subcommand(1);
  auto* pvalidate = platform->add_subcommand("validate", "Check platform files; exit 0 when valid");
  std::vector<std::string> platform_files;
  pvalidate->add_option("files", platform_files, "platform.yaml files")->required();
  pvalidate->add_flag("-q,--quiet", quiet, "Print errors only");
  pvalidate->callback([&] { rc = CmdPlatformValidate(platform_files, quiet); });

  auto* explain =
      app.add_subcommand("explain", "Print each resolved setting of a run and where it came from");
  std::string explain_file = "tau.yaml", explain_platform, explain_user;
  explain->add_option("file", explain_file, "The spec (default ./tau.yaml)");
  explain->add_option(
      "--platform", explain_platform,
      "platform.yaml to resolve against (default: this machine's default platform)");
  explain->add_option("--user", explain_user, "Resolve as this user (default: the current user)");
  add_output(explain);
  explain->callback([&] {
    if (auto f = format()) rc = CmdExplain(explain_file, explain_platform, explain_user, *f);
  });

  auto* health = app.add_subcommand("health", "GPU health");
  health->require_subcommand(1);
  auto* check = health->add_subcommand(
      "check", "Run the GPU health checks now; exit 1 when a GPU may not be used");
  bool active = false;
  check->add_flag("--active", active,
                  "Also run a short workload on each GPU (needs the CUDA driver)");
  add_output(check);
  check->callback([&] {
    if (auto f = format()) rc = CmdHealthCheck(g, active, *f);
  });

  auto* admission = app.add_subcommand("admission", "Kueue-model admission tools");
  admission->require_subcommand(1);
  auto* simulate = admission->add_subcommand(
      "simulate", "Run scheduling cycles over queues and workloads described in YAML; print JSON");
  std::string sim_file;
  int cycles = 1;
  simulate->add_option("file", sim_file, "Simulation input (flavors, cohorts, queues, workloads)")
      ->required();
  simulate->add_option("--cycles", cycles, "Scheduling cycles to run")
      ->check(CLI::Range(1, 1000000));
  add_output(simulate);
  simulate->callback([&] {
    if (auto f = format()) rc = CmdAdmissionSimulate(sim_file, cycles, *f);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitInvalid;
  }
  return rc;
}

}  // namespace tau::cli

int main(int argc, char** argv) { return tau::cli::Main(argc, argv); }
