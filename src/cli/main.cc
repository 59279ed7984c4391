#include <CLI/CLI.hpp>

#include <cstring>

#include "cli/agent_command.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/kube_commands.h"
#include "cli/watch_commands.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/strings.h"
#include "common/version.h"
#include "health/health.h"
#include "runtime/runtime.h"
#include "server/server.h"

namespace tau::cli {

// After a parse error: the command or option the user probably meant, from the deepest command the
// arguments name. Empty when nothing is close.
static std::string UsageHint(CLI::App& app, int argc, char** argv) {
  CLI::App* cmd = &app;
  std::string path = "tau";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    std::vector<std::string> names;
    if (arg.size() > 1 && arg[0] == '-') {
      const std::string flag = arg.substr(0, arg.find('='));
      bool known = false;
      for (const CLI::Option* opt : cmd->get_options()) {
        for (const std::string& n : opt->get_lnames()) {
          names.push_back("--" + n);
          known = known || flag == "--" + n;
        }
        for (const std::string& n : opt->get_snames()) known = known || flag == "-" + n;
      }
      if (known) continue;
      std::string close = ClosestMatch(flag, names);
      return "unknown option '" + flag + "'" +
             (close.empty() ? "" : " (did you mean '" + close + "'?)") + "; see '" + path +
             " --help'";
    }
    CLI::App* next = nullptr;
    for (CLI::App* sub : cmd->get_subcommands([](CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
      if (sub->check_name(arg)) next = sub;
    }
    if (next != nullptr) {
      cmd = next;
      path += " " + next->get_name();
      continue;
    }
    // A positional argument, unless this command wants a subcommand here.
    if (cmd->get_require_subcommand_min() == 0) continue;
    std::string close = ClosestMatch(arg, names);
    return "unknown command '" + arg + "'" +
           (close.empty() ? "" : " (did you mean '" + close + "'?)");
  }
  return "";
}

int Main(int argc, char** argv) {
  // The attempt supervisor is this same binary; it must start without parsing any flags.
  if (argc == 3 && std::strcmp(argv[1], "__shim") == 0) return runtime::ShimMain(argv[2]);
  if (argc == 2 && std::strcmp(argv[1], "__zygote") == 0) return runtime::ZygoteMain(argv[1]);
  if (argc == 2 && std::strcmp(argv[1], "__gpu-probe") == 0) {
    std::puts(JsonText(health::RunActiveProbe()).c_str());
    return 0;
  }
  // `tau version` is the cold-start benchmark: answer before building the whole command tree.
  if (argc == 2 && std::strcmp(argv[1], "version") == 0) return CmdVersion({}, false);
  // `tau run [-d|--detach] [FILE]`, the command on the submit path, also skips building the tree
  // (about 2 ms of the submit-to-start latency); anything else it is given goes to the full parser.
  if (argc >= 2 && argc <= 4 && std::strcmp(argv[1], "run") == 0) {
    std::string file;
    bool detach = false, plain = true;
    for (int i = 2; i < argc && plain; ++i) {
      if (std::strcmp(argv[i], "-d") == 0 || std::strcmp(argv[i], "--detach") == 0) {
        plain = !detach;
        detach = true;
      } else if (argv[i][0] != '-' && file.empty()) {
        file = argv[i];
      } else {
        plain = false;
      }
    }
    if (plain) return CmdRun({}, file.empty() ? "tau.yaml" : file, detach);
  }

  CLI::App app{"tau: queued, monitored, recoverable GPU runs from a tau.yaml", "tau"};
  app.require_subcommand(1);
  app.set_version_flag("--version", Version());
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
  server->add_option("--listen", sopts.listen,
                     "Also listen on TCP host:port (needs --tls-cert and --tls-key)");
  server->add_option("--tls-cert", sopts.tls_cert_file,
                     "PEM certificate chain of the TCP listener (docs/security.md)");
  server->add_option("--tls-key", sopts.tls_key_file, "PEM private key of the TCP listener");
  server->add_flag(
      "--insecure-listen", sopts.insecure_listen,
      "Allow a plaintext TCP listener on a loopback address (tests, local Prometheus)");
  server->add_option("--platform", sopts.platform_source,
                     "Apply this platform.yaml at start (validated; a bad file stops the server)");
  server->add_flag("--shared-socket", sopts.shared_socket,
                   "Let every local user connect to the Unix socket (mode 0666): a multi-user "
                   "machine; callers are known by the kernel, runs run as their submitter");
  server->add_option("--stop-grace", sopts.stop_grace_ms,
                     "Milliseconds between SIGTERM and SIGKILL when stopping a run");
  server->add_option("--gpu-poll", sopts.gpu_poll_ms,
                     "Milliseconds between GPU health polls (XID events are watched in between)");
  server
      ->add_option("--backend", sopts.backend,
                   "Where runs run: local (processes on this machine) or kubernetes (Jobs and "
                   "RayJobs admitted by Kueue; docs/kubernetes.md)")
      ->check(CLI::IsMember({"local", "kubernetes"}));
  server->add_option("--kubeconfig", sopts.kubeconfig,
                     "kubernetes: the kubeconfig (default $KUBECONFIG, ~/.kube/config, else the "
                     "pod's service account)");
  server->add_option("--context", sopts.kube_context, "kubernetes: the kubeconfig context");
  server->add_option("--default-image", sopts.default_image,
                     "kubernetes: the image of runs whose spec names none (runtime.image)");
  server->add_flag("--kube-check-access", sopts.kube_check_access,
                   "kubernetes: refuse submitters whom the cluster's RBAC does not allow to "
                   "create the run's Job or RayJob in its namespace (SubjectAccessReview)");
  server->add_flag("--quiet", sopts.quiet, "Log nothing");
  std::string retain_logs, retain_samples;
  server->add_option("--retain-logs", retain_logs,
                     "Delete ended runs' logs after this long (e.g. 30d; default: keep); the "
                     "evidence record keeps their hashes");
  server->add_option("--retain-samples", retain_samples,
                     "Delete ended runs' GPU samples after this long (default: keep)");
  server->callback([&] {
    for (auto [text, ms] : {std::pair{&retain_logs, &sopts.retain_logs_ms},
                            std::pair{&retain_samples, &sopts.retain_samples_ms}}) {
      if (text->empty() || *text == "forever") continue;
      auto d = ParseDurationMillis(*text);
      if (!d.ok()) {
        rc = Fail("bad retention duration '" + *text + "': " + d.status().message());
        return;
      }
      *ms = *d;
    }
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
  bool watch = false;
  status->add_flag("-w,--watch", watch, "Print again on each change until the run ends");
  status->callback([&] {
    if (auto f = format())
      rc = watch ? CmdStatusWatch(g, run_name, *f) : CmdStatus(g, run_name, *f);
  });

  auto* top = app.add_subcommand("top", "A live view of queues, runs and GPUs (q quits)");
  bool top_once = false;
  top->add_flag("--once", top_once, "Print one frame and exit");
  top->callback([&] { rc = CmdTop(g, top_once); });

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
  logs->add_option("--attempt", attempt, "Attempt number (default: the latest; with -f, all)")
      ->check(CLI::Range(1, 1 << 20));
  logs->add_option("--rank", rank, "Worker rank of a gang (default 0)")
      ->check(CLI::Range(0, 1 << 20));
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

  // Evidence (evidence_commands.cc).
  auto* evidence = app.add_subcommand(
      "evidence", "A run's evidence record; export it as a bundle, or verify a bundle");
  evidence->add_option("run", run_name, "Run name");
  add_output(evidence);
  auto* eexport = evidence->add_subcommand("export", "Write a run's evidence bundle (.tar.gz)");
  std::string bundle_file;
  eexport->add_option("run", run_name, "Run name")->required();
  eexport->add_option("-o,--output", bundle_file, "The bundle file to write")->required();
  eexport->callback([&] { rc = CmdEvidenceExport(g, run_name, bundle_file); });
  auto* everify = evidence->add_subcommand(
      "verify", "Check a bundle; exit 0 when intact, 1 naming the first altered or missing item");
  bool run_check = false;
  everify->add_option("file", bundle_file, "The bundle (.tar.gz)")->required();
  everify->add_flag("--run-check", run_check,
                    "Also compare its chain head with the one the server holds for the run");
  everify->callback([&] { rc = CmdEvidenceVerify(g, bundle_file, run_check); });
  evidence->callback([&] {
    if (!evidence->get_subcommands().empty()) return;
    if (run_name.empty()) {
      rc = Fail("tau evidence: name a run, or use `export` or `verify`");
      return;
    }
    if (auto f = format()) rc = CmdEvidence(g, run_name, *f);
  });

  auto* metrics = app.add_subcommand("metrics", "A run's metric history (sparkline and table)");
  std::string metric_name, metric_split, metric_output;
  metrics->add_option("run", run_name, "Run name")->required();
  metrics->add_option("name", metric_name, "Metric name (default: a summary of every metric)");
  auto* split_opt = metrics->add_option("--split", metric_split, "Only this split");
  metrics->add_option("-o,--output", metric_output,
                      "table, json or jsonl (default: table on a terminal, else jsonl)");
  metrics->callback([&] {
    rc = CmdMetrics(g, run_name, metric_name, metric_split, split_opt->count() > 0, metric_output);
  });

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
  auto* papply = platform->add_subcommand(
      "apply", "Make a platform file the server's policy (validated first; no restart)");
  std::string apply_file;
  papply->add_option("file", apply_file, "platform.yaml")->required();
  papply->callback([&] { rc = CmdPlatformApply(g, apply_file); });
  auto* pshow = platform->add_subcommand("show", "Print the platform the server uses");
  add_output(pshow);
  pshow->callback([&] {
    if (auto f = format()) rc = CmdPlatformShow(g, *f);
  });

  auto* queues = app.add_subcommand("queues", "Queues: usage against quota, admitted and pending");
  add_output(queues);
  queues->callback([&] {
    if (auto f = format()) rc = CmdQueues(g, *f);
  });
  auto* queue = app.add_subcommand("queue", "One queue");
  queue->require_subcommand(1);
  auto* qshow = queue->add_subcommand("show", "A queue's usage, admitted runs and pending line");
  std::string queue_name;
  qshow->add_option("name", queue_name, "Queue name")->required();
  add_output(qshow);
  qshow->callback([&] {
    if (auto f = format()) rc = CmdQueueShow(g, queue_name, *f);
  });

  auto* explain =
      app.add_subcommand("explain", "Print each resolved setting of a run and where it came from");
  std::string explain_file = "tau.yaml", explain_platform, explain_user;
  explain->add_option("file", explain_file, "The spec (default ./tau.yaml)");
  explain->add_option(
      "--platform", explain_platform,
      "platform.yaml to resolve against (default: the one applied to this machine's server, "
      "else the machine's default platform)");
  explain->add_option("--user", explain_user, "Resolve as this user (default: the current user)");
  add_output(explain);
  explain->callback([&] {
    if (auto f = format()) rc = CmdExplain(explain_file, explain_platform, explain_user, *f);
  });

  // `tau plan` and `tau platform render` (kube_commands.h): local commands, nothing is submitted.
  auto* plan = app.add_subcommand(
      "plan", "Print what a run would become: its launch plan, or its Kubernetes objects");
  PlanOptions plan_options;
  plan->add_option("file", plan_options.file, "The spec (default ./tau.yaml)");
  plan->add_option("--backend", plan_options.backend, "local (default) or kubernetes")
      ->check(CLI::IsMember({"local", "kubernetes"}));
  plan->add_option("--platform", plan_options.platform,
                   "platform.yaml to resolve against (default: this machine's default platform)");
  plan->add_option("--user", plan_options.user, "Resolve as this user (default: the current user)");
  plan->add_option("--namespace", plan_options.namespace_name,
                   "kubernetes: namespace (default: the run's workspace namespace)");
  plan->add_option("--image", plan_options.image,
                   "kubernetes: image for a spec without runtime.image");
  plan->callback([&] { rc = CmdPlan(plan_options); });
  auto* prender = platform->add_subcommand(
      "render", "Print a platform's Kubernetes objects (Kueue queues, namespaces, RBAC) as YAML");
  std::string render_file;
  prender->add_option("file", render_file, "platform.yaml")->required();
  prender->callback([&] { rc = CmdPlatformRender(render_file); });
  // `tau cluster render` (kube_commands.h): the Helm chart's objects without Helm.
  auto* cluster = app.add_subcommand("cluster", "tau's own install on a Kubernetes cluster");
  cluster->require_subcommand(1);
  auto* crender = cluster->add_subcommand(
      "render",
      "Print what the Helm chart deploy/helm/taugrid installs (server, RBAC, GPU health agent) as "
      "YAML");
  ClusterRenderOptions cluster_options;
  crender->add_option("--values", cluster_options.values_file,
                      "The chart's values file (default: the chart's defaults)");
  crender->add_option("--platform", cluster_options.platform_file,
                      "platform.yaml: put in the server's ConfigMap, its objects printed too");
  crender->add_option("--namespace", cluster_options.namespace_name,
                      "Namespace of the server and agent (default tau-system)");
  crender->add_option("--image", cluster_options.image, "tau's image, REPOSITORY[:TAG]");
  crender->callback([&] { rc = CmdClusterRender(cluster_options); });

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
  RegisterHealthAgentCommand(health, &rc);

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

  RegisterIdentityCommands(&app, &g, &rc);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    if (code == 0) return 0;  // --help, --version
    if (std::string hint = UsageHint(app, argc, argv); !hint.empty())
      std::fprintf(stderr, "tau: %s\n", hint.c_str());
    // Not 1: a script must be able to tell a mistyped command from a run that failed.
    return kExitTauError;
  }
  return rc;
}

}  // namespace tau::cli

int main(int argc, char** argv) {
  // Library exceptions are turned into Status where they are thrown; one that slipped through is a
  // bug, reported as one rather than as an abort and a core dump.
  try {
    return tau::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tau: internal error: %s (please report it)\n", e.what());
    return 125;
  }
}
