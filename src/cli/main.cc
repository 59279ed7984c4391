#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstring>
#include <vector>

#include "cli/cli.h"
#include "cli/commands.h"
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
    if (plain) {
      RunOptions o;
      if (!file.empty()) o.target = file;
      o.detach = detach;
      return CmdRun({}, o);
    }
  }

  CLI::App app{"tau: queued, monitored, recoverable GPU runs from a tau.yaml", "tau"};
  app.require_subcommand(1);
  app.set_version_flag("--version", Version());
  Context ctx;
  app.add_option(
      "--server", ctx.g.server,
      "Server address (unix:///path/tau.sock or http://host:port); default: $TAU_SERVER, "
      "else the local server under $TAU_HOME");
  // In the order `tau --help` lists them.
  RegisterBasicCommands(&app, &ctx);
  RegisterServerCommand(&app, &ctx);
  RegisterRunCommands(&app, &ctx);
  RegisterWorkflowCommands(&app, &ctx);
  RegisterServeCommands(&app, &ctx);
  RegisterEvidenceCommands(&app, &ctx);
  RegisterGpusCommand(&app, &ctx);
  RegisterQueueCommands(&app, &ctx);
  RegisterPlanCommands(&app, &ctx);
  RegisterHealthCommands(&app, &ctx);
  RegisterAdmissionCommands(&app, &ctx);
  RegisterIdentityCommands(&app, &ctx);
  RegisterCompletionCommand(&app, &ctx);

  // `tau help [COMMAND...]` is `tau [COMMAND...] --help`, as git and kubectl have it.
  std::vector<char*> args(argv, argv + argc);
  static char help_flag[] = "--help";
  if (argc >= 2 && std::strcmp(argv[1], "help") == 0) {
    args.erase(args.begin() + 1);
    CLI::App* cmd = &app;
    std::string path = "tau";
    for (size_t i = 1; i < args.size(); ++i) {
      CLI::App* parent = cmd;
      cmd = nullptr;
      for (CLI::App* sub : parent->get_subcommands({}))
        if (sub->check_name(args[i])) cmd = sub;
      if (cmd == nullptr)
        return Fail(fmt::format("{} has no command '{}' (tau --help lists them)", path, args[i]));
      path += std::string(" ") + args[i];
    }
    args.push_back(help_flag);
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    if (code == 0) return 0;  // --help, --version
    if (std::string hint = UsageHint(app, static_cast<int>(args.size()), args.data());
        !hint.empty())
      std::fprintf(stderr, "tau: %s\n", hint.c_str());
    // Not 1: a script must be able to tell a mistyped command from a run that failed.
    return kExitTauError;
  }
  return ctx.rc;
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
