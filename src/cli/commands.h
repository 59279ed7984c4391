// The commands behind `tau ...`, the cli module's internal header. Each group of commands has one
// Register...Commands that adds its commands, flags and help to the command tree; main.cc calls
// them in the order `tau --help` lists the commands.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/types.h"
#include "cli/output.h"
#include "cli/sweep.h"
#include "client/client.h"
#include "client/tau_api.h"
#include "spec/spec.h"
#include "spec/workflow.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tau::cli {

struct Global {
  std::string server;  // --server
};

// What the commands' callbacks share: the global flags, and the exit code of the command that ran.
// It outlives the parse (CLI11 runs the callbacks during it).
struct Context {
  Global g;
  int rc = 0;
};

// For a command that writes a file (-f/--file): a hidden -o that fails the command, saying to use
// -f. The returned function answers true when -o was not given.
std::function<bool()> RefuseFileAsOutput(CLI::App* cmd, Context* ctx);

// Adds -o/--output to `cmd`, taking `formats` (the first is the default). The function returned
// reads it when the command runs: nullopt, with ctx->rc set, for a format the command does not
// print, which is refused with the ones it does.
inline const std::vector<Format> kTableJsonYaml = {Format::kTable, Format::kJson, Format::kYaml};
std::function<std::optional<Format>()> AddOutput(CLI::App* cmd, Context* ctx,
                                                 std::vector<Format> formats = kTableJsonYaml);

// A spec's warnings on stderr, one per line ("FILE:LINE:COL: warning: ...").
void PrintSpecWarnings(const spec::ParseOutcome& parsed);
// A spec file read (into `text`) and parsed, its warnings printed. nullopt when it cannot be read
// or is not valid: what is wrong is printed and `*rc` is the exit status.
// `overrides` (--set) are applied as ParseSpec applies them.
std::optional<spec::ParseOutcome> ReadSpecFile(const std::string& file, std::string* text, int* rc,
                                               const std::vector<spec::Override>& overrides = {});
// --set PATH=VALUE, once per field (tau run, rerun, validate, plan and explain).
void AddSetOption(CLI::App* cmd, std::vector<std::string>* set);
// The --set texts as overrides; nullopt when one is malformed: the error is printed and `*rc` is
// the exit status.
std::optional<std::vector<spec::Override>> ParseSetOption(const std::vector<std::string>& set,
                                                          int* rc);
// A resolution or submission error (one "FIELD: text" per line) with each line at its field's
// position in the spec, in the form of parse errors ("FILE:LINE:COL: error: FIELD: text").
std::string LocatedErrors(const std::string& file, const spec::ParseOutcome& parsed,
                          const std::string& message);

// commands.cc
void RegisterBasicCommands(CLI::App* app, Context* ctx);      // version, validate, schema
void RegisterServerCommand(CLI::App* app, Context* ctx);      // server
void RegisterRunCommands(CLI::App* app, Context* ctx);        // run, list, status, top, ...
void RegisterGpusCommand(CLI::App* app, Context* ctx);        // gpus
void RegisterHealthCommands(CLI::App* app, Context* ctx);     // health check|agent
void RegisterAdmissionCommands(CLI::App* app, Context* ctx);  // admission simulate
// evidence_commands.cc: evidence [export|verify], metrics
void RegisterEvidenceCommands(CLI::App* app, Context* ctx);
// queue_commands.cc: platform validate|apply|show, queues, queue show
void RegisterQueueCommands(CLI::App* app, Context* ctx);
// kube_commands.cc: explain, plan, platform render, cluster render (nothing is submitted)
void RegisterPlanCommands(CLI::App* app, Context* ctx);
// identity_commands.cc: login, logout, whoami, admin token|audit, secret
void RegisterIdentityCommands(CLI::App* app, Context* ctx);
// completion bash|zsh|fish: registered last, it walks every command registered before it.
void RegisterCompletionCommand(CLI::App* app, Context* ctx);

// Which run holds each GPU (by device index; several names joined with ","), from the running
// runs the caller may see; `tau gpus` and `tau top` show it.
Result<std::map<int, std::string>> GpuHolders(client::TauApi& tau);
// The caller's newest ended runs (Succeeded, Failed or Cancelled), at most `limit`, newest end
// first; `total` counts every ended run.
Result<api::RunList> EndedRuns(client::TauApi& tau, int limit);
// agent_command.cc: `agent` under `health`
void RegisterHealthAgentCommand(CLI::App* health, Context* ctx);

// The commands that other files of the module call.
int CmdVersion(const Global& g, bool with_server, Format format = Format::kTable);
// What `tau run` was given (run.cc).
struct RunOptions {
  std::string target = "tau.yaml";  // a spec file, or NAME: tau/NAME.yaml of the repository
  bool detach = false;
  std::vector<std::string> set;  // --set PATH=VALUE, as typed
  std::string code_dir;          // --code-dir: the code directory, run from its root
};
int CmdRun(const Global& g, const RunOptions& o);
// A submission's body for the spec `o` names (its --set applied, its code uploaded first, as
// `tau run` sends it): nullopt, with the reason printed and `*rc` set, when it cannot be made.
struct SubmissionSpec {
  nlohmann::json body;  // {"spec": {...}, "code": {...}}
  std::string file;
  spec::ParseOutcome parsed;
};
std::optional<SubmissionSpec> SubmissionBody(const Global& g, const RunOptions& o,
                                             std::unique_ptr<client::Connection>* conn, int* rc);
// A refusal of the submission, its errors at the spec's fields where they name one.
int SubmissionFailed(const SubmissionSpec& spec, const Status& status);
void RegisterServeCommands(CLI::App* app, Context* ctx);  // serve deploy|list|status|...
// `tau run --array FIRST-LAST[:STEP]`: one run per index, submitted as one batch, each with
// TAU_ARRAY_INDEX; with `detach` the names are printed, else it waits for all of them to end.
struct ArrayRange {
  int64_t first = 0, last = 0, step = 1;
  std::optional<int64_t> max_parallel;  // "%N": at most N of its runs in play at once (Slurm's)
};
inline constexpr int64_t kMaxArrayRuns = 10'000;
// InvalidArgument naming --array for an empty, malformed, reversed or too large range.
Result<ArrayRange> ParseArrayRange(const std::string& text);
int CmdRunArray(const Global& g, const RunOptions& o, const std::string& range);
// `tau sweep FILE` (sweep.h): one run per point, in one experiment group, submitted as one batch;
// with `detach` the names are printed, else it waits for all of them and prints them best first.
struct SweepOptions {
  std::string file;
  bool detach = false;
  bool quiet = false;  // no progress lines while it waits
  std::string code_dir;
};
int CmdSweep(const Global& g, const SweepOptions& o);
// What `tau sweep` checks before it sends anything, and `tau validate` of a sweep file: its spec
// found and valid, and valid with each point's values. Errors and warnings go to `diagnostics`, a
// point's named where the sweep file writes its values; the spec when all are valid.
struct SweepSpec {
  std::string file, text;
  spec::ParseOutcome base;  // the spec without a point's values
};
std::optional<SweepSpec> CheckSweepPoints(const std::string& file, const SweepFile& sweep,
                                          const std::string& code_dir,
                                          std::vector<spec::Diagnostic>* diagnostics);
// A workflow stage's spec, read and checked with the stage's `set:` (run.cc).
struct StageSpec {
  std::string file, text;
  spec::ParseOutcome parsed;
};
// What `tau run` of a workflow file checks before it sends anything, and `tau validate` of one:
// each stage's spec found and valid with its `set:`. Errors (and warnings) go to `diagnostics`,
// named where the workflow file writes what caused them; the stages' specs when all are valid.
std::optional<std::vector<StageSpec>> CheckWorkflowStages(
    const std::string& file, const spec::WorkflowFile& workflow,
    const std::vector<spec::StagePlaces>& places, const std::string& code_dir,
    std::vector<spec::Diagnostic>* diagnostics);
// workflow_commands.cc: workflow status|cancel|retry-stage. `tau run` of a workflow file (run.cc)
// submits its stages as one batch; PrintStages shows them as they are.
void RegisterWorkflowCommands(CLI::App* app, Context* ctx);
void PrintStages(const std::vector<api::Run>& runs);
int CmdStatus(const Global& g, const std::string& run, Format format);
int CmdPlatformValidate(const std::vector<std::string>& files, bool quiet, Format format);
// watch_commands.cc: the live views over the server's event stream (GET /api/v1/events).
// Prints the run's status, then again on each change, until it reaches a terminal state.
int CmdStatusWatch(const Global& g, const std::string& run, Format format);
// Waits for every run to end, printing each as it does; the first unsuccessful run's status.
int CmdWait(const Global& g, const std::vector<std::string>& runs, bool quiet);
// The exit status a shell gets for an ended run (run.cc): 0 when it succeeded, its exit code when
// it has one, else 1.
int RunExitStatus(const api::Run& run);
// RunExitStatus of `run`, fetched now (after `tau logs -f` has seen it end).
int CmdLogsExitStatus(const Global& g, const std::string& run);
// A live terminal view of queues, runs and GPUs, cut to the terminal's size; q or Ctrl-C quits.
// `once`: one frame, no ANSI; JSON or YAML: what one frame shows, as the API's objects.
int CmdTop(const Global& g, bool once, Format format = Format::kTable);

// Prints "tau: error: <message>" to stderr and returns kExitTauError.
int Fail(const std::string& message);
// Run names are lowercase letters, digits and '-' (a spec name and a suffix): anything else names
// no run, and is said so before it is put in a request path.
bool IsRunName(const std::string& name);
int NoSuchRun(const std::string& name);

// `--backend` of `tau server` and `tau plan`: the help that lists the registered engines
// (engines/engines.h), and the check that refuses another name with that list.
std::string BackendHelp();
std::function<std::string(const std::string&)> BackendCheck();

}  // namespace tau::cli
