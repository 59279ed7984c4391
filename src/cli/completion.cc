// `tau completion bash|zsh|fish`: a completion script made from the command tree itself (every
// command, subcommand and flag as CLI11 knows them), so it cannot drift from what tau takes. Run
// names are completed by asking the server (`tau list -o name`) where a command takes one.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/strings.h"

namespace tau::cli {
namespace {

struct Node {
  std::string path;  // "tau", "tau server", ...
  std::vector<std::string> subcommands, flags;
  bool takes_run = false;  // a positional named run or runs
};

void Walk(const CLI::App* app, const std::string& path, std::vector<Node>* out) {
  Node node;
  node.path = path;
  for (const CLI::App* sub : app->get_subcommands({})) {
    if (sub->get_name().empty() || sub->get_group().empty()) continue;  // hidden
    node.subcommands.push_back(sub->get_name());
  }
  for (const CLI::Option* opt : app->get_options({})) {
    if (opt->get_group().empty()) continue;  // hidden
    if (!opt->nonpositional()) {
      if (opt->get_name() == "run" || opt->get_name() == "runs") node.takes_run = true;
      continue;
    }
    for (const std::string& l : opt->get_lnames()) node.flags.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) node.flags.push_back("-" + s);
  }
  out->push_back(node);
  for (const CLI::App* sub : app->get_subcommands({}))
    if (!sub->get_name().empty() && !sub->get_group().empty())
      Walk(sub, path + " " + sub->get_name(), out);
}

std::string Bash(const std::vector<Node>& nodes) {
  std::string subs, flags, runs;
  for (const Node& n : nodes) {
    if (!n.subcommands.empty())
      subs += fmt::format("    \"{}\") echo \"{}\" ;;\n", n.path, Join(n.subcommands, " "));
    if (!n.flags.empty())
      flags += fmt::format("    \"{}\") echo \"{}\" ;;\n", n.path, Join(n.flags, " "));
    if (n.takes_run) runs += (runs.empty() ? "" : "|") + fmt::format("\"{}\"", n.path);
  }
  if (runs.empty()) runs = "\"\"";
  // clang-format off
  std::string script = R"SH(# tau's bash completion (from `tau completion bash`)
_tau_subcommands() {
  case "$1" in
@SUBS@  esac
}
_tau_flags() {
  case "$1" in
@FLAGS@  esac
}
_tau() {
  local cur="${COMP_WORDS[COMP_CWORD]}" path="tau" i w words
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    [[ $w == -* ]] && continue
    case " $(_tau_subcommands "$path") " in
      *" $w "*) path="$path $w" ;;
    esac
  done
  if [[ $cur == -* ]]; then
    words="$(_tau_flags "$path")"
  else
    words="$(_tau_subcommands "$path")"
    [[ $path == tau ]] && words="$words help"
    case "$path" in
      @RUNS@) words="$words $("${COMP_WORDS[0]}" list -o name 2>/dev/null)" ;;
    esac
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _tau tau
)SH";
  // clang-format on
  for (auto [key, value] : {std::pair<std::string, const std::string*>{"@SUBS@", &subs},
                            {"@FLAGS@", &flags},
                            {"@RUNS@", &runs}})
    script.replace(script.find(key), key.size(), *value);
  return script;
}

std::string Fish(const std::vector<Node>& nodes) {
  std::string out = "# tau's fish completion (from `tau completion fish`)\ncomplete -c tau -f\n";
  for (const Node& n : nodes) {
    // The words after "tau" that lead here; fish checks the last one was seen.
    std::string condition = "__fish_use_subcommand";
    size_t space = n.path.rfind(' ');
    if (space != std::string::npos)
      condition = "__fish_seen_subcommand_from " + n.path.substr(space + 1);
    for (const std::string& s : n.subcommands)
      out += fmt::format("complete -c tau -n '{}' -a {}\n", condition, s);
    for (const std::string& f : n.flags)
      out += fmt::format("complete -c tau -n '{}' {} {}\n", condition,
                         StartsWith(f, "--") ? "-l" : "-s", f.substr(StartsWith(f, "--") ? 2 : 1));
    if (n.takes_run)
      out +=
          fmt::format("complete -c tau -n '{}' -a '(tau list -o name 2>/dev/null)'\n", condition);
  }
  return out;
}

}  // namespace

void RegisterCompletionCommand(CLI::App* app, Context* ctx) {
  auto shell = std::make_shared<std::string>();
  auto* completion = app->add_subcommand(
      "completion", "Print a shell completion script: bash, zsh or fish (docs/cli.md)");
  completion->add_option("shell", *shell, "bash, zsh or fish")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish"}));
  completion->callback([=] {
    std::vector<Node> nodes;
    Walk(app, "tau", &nodes);
    if (*shell == "fish") {
      std::fputs(Fish(nodes).c_str(), stdout);
    } else if (*shell == "zsh") {
      // zsh runs the bash script through its bash-completion layer.
      std::fputs(
          "# tau's zsh completion (from `tau completion zsh`)\n"
          "autoload -U +X bashcompinit && bashcompinit\n",
          stdout);
      std::fputs(Bash(nodes).c_str(), stdout);
    } else {
      std::fputs(Bash(nodes).c_str(), stdout);
    }
    ctx->rc = 0;
  });
}

}  // namespace tau::cli
