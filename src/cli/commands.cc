#include "cli/commands.h"

#include <pwd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "admission/simulate.h"
#include "cli/cli.h"
#include "cli/code.h"
#include "cli/connect.h"
#include "cli/file_kind.h"
#include "cli/sweep.h"
#include "client/tau_api.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/layout.h"
#include "common/strings.h"
#include "common/version.h"
#include "engines/engines.h"
#include "health/health.h"
#include "policy/policy.h"
#include "runtime/runtime.h"
#include "server/server.h"
#include "spec/spec.h"
#include "spec/workflow.h"

namespace tau::cli {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tau: error: %s\n", message.c_str());
  return kExitTauError;
}

bool IsRunName(const std::string& name) { return IsDns1123Label(name, 253); }

int NoSuchRun(const std::string& name) {
  return Fail(
      fmt::format("no run named '{}' (run names are lowercase letters, digits and '-'; "
                  "`tau list --all` lists them)",
                  Printable(name)));
}

std::string BackendHelp() {
  std::vector<std::string> parts;
  for (const server::Engine& e : engines::Registered())
    parts.push_back(fmt::format("{} ({})", e.name, e.description));
  return Join(parts, ", ") + "; default " + engines::Registered().front().name;
}

std::function<std::string(const std::string&)> BackendCheck() {
  return [](const std::string& name) {
    auto engine = engines::Find(name);
    return engine.ok() ? std::string() : engine.status().message();
  };
}

namespace {
// The run's image is recorded but its engine does not run images.
bool RecordsImageOnly(const std::string& backend) {
  auto engine = engines::Find(backend);
  return engine.ok() && !(*engine)->caps.runs_images;
}
}  // namespace

int CmdVersion(const Global& g, bool with_server, Format format) {
  nlohmann::json out = {{"client", {{"version", Version()}}}};
  if (with_server) {
    auto conn = ConnectToServer(g.server);
    if (!conn.ok()) return Fail(conn.status().message());
    auto v = client::TauApi(conn->get()).Version();
    if (!v.ok()) return Fail(v.status().message());
    out["server"] = v->ToJson();
  }
  if (IsData(format)) return PrintData(out, format);
  std::printf("tau %s\n", Version());
  if (!with_server) return 0;
  const nlohmann::json& v = out["server"];
  std::printf("server %s (api %s, backend %s)\n", v.value("version", "").c_str(),
              v.value("api", "").c_str(), v.value("backend", "").c_str());
  return 0;
}

namespace {

// What checking one file found: its errors (none when it is valid), its warnings, and a summary.
struct FileCheck {
  std::vector<spec::Diagnostic> errors, warnings;
  std::string summary;
};

nlohmann::json DiagnosticsJson(const std::vector<spec::Diagnostic>& ds) {
  nlohmann::json out = nlohmann::json::array();
  for (const spec::Diagnostic& d : ds)
    out.push_back(
        {{"line", d.line}, {"column", d.column}, {"message", d.message}, {"text", d.ToString()}});
  return out;
}

// All of standard input, refused past `max_bytes`.
Result<std::string> ReadStdinAtMost(size_t max_bytes, const char* what) {
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, stdin)) > 0) {
    text.append(buffer, n);
    if (text.size() > max_bytes)
      return InvalidArgument(
          fmt::format("standard input is over {} bytes, the most {} may be", max_bytes, what));
  }
  if (std::ferror(stdin)) return IoError("cannot read standard input", errno);
  return text;
}

// Checks each file with `check`. A table says "FILE: ok (summary)" on stdout and each diagnostic on
// stderr; JSON and YAML give one entry a file: {file, valid, summary, errors, warnings}.
int ValidateFiles(
    const std::vector<std::string>& files, bool quiet, Format format, size_t max_bytes,
    const char* what,
    const std::function<FileCheck(const std::string& text, const std::string& file)>& check) {
  int rc = 0;
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& file : files) {
    // "-": standard input (`tau platform show | tau platform validate -`).
    auto text =
        file == "-" ? ReadStdinAtMost(max_bytes, what) : ReadFileAtMost(file, max_bytes, what);
    FileCheck found;
    if (text.ok()) {
      found = check(*text, file);
    } else {
      // "FILE: error: the file is over ..." rather than naming the file twice.
      const std::string& m = text.status().message();
      found.errors.push_back(
          {file, 0, 0, m.rfind(file + " ", 0) == 0 ? "the file " + m.substr(file.size() + 1) : m,
           false});
    }
    const bool valid = found.errors.empty();
    if (!valid) rc = kExitInvalid;
    if (IsData(format)) {
      results.push_back({{"file", file},
                         {"valid", valid},
                         {"summary", valid ? nlohmann::json(found.summary) : nlohmann::json()},
                         {"errors", DiagnosticsJson(found.errors)},
                         {"warnings", DiagnosticsJson(found.warnings)}});
      continue;
    }
    for (const spec::Diagnostic& w : found.warnings)
      std::fprintf(stderr, "%s\n", w.ToString().c_str());
    for (const spec::Diagnostic& e : found.errors)
      std::fprintf(stderr, "%s\n", e.ToString().c_str());
    if (valid && !quiet) std::printf("%s: ok (%s)\n", file.c_str(), found.summary.c_str());
  }
  if (IsData(format)) PrintData(results, format);
  return rc;
}

}  // namespace

void PrintSpecWarnings(const spec::ParseOutcome& parsed) {
  for (const spec::Diagnostic& w : parsed.warnings)
    std::fprintf(stderr, "%s\n", w.ToString().c_str());
}

std::optional<spec::ParseOutcome> ReadSpecFile(const std::string& file, std::string* text, int* rc,
                                               const std::vector<spec::Override>& overrides) {
  auto read = ReadFileAtMost(file, spec::kMaxSpecBytes, "a spec");
  if (!read.ok()) {
    *rc = Fail(read.status().message());
    return std::nullopt;
  }
  *text = std::move(*read);
  spec::ParseOutcome parsed = spec::ParseSpec(*text, file, overrides);
  if (!parsed.ok()) {
    // Another kind of file tau reads: the run-spec reader's errors would not say so.
    const FileKindGuess guess = GuessFileKind(*text);
    if (guess.kind == FileKind::kUnknown) {
      std::fprintf(stderr, "%s\n", UnknownFileKindMessage(file, guess.keys).c_str());
      *rc = kExitInvalid;
      return std::nullopt;
    }
    if (guess.kind != FileKind::kRunSpec) {
      const char* use = "apply it with `tau platform apply {0}`";
      if (guess.kind == FileKind::kWorkflow) use = "run it with `tau run {0}`";
      if (guess.kind == FileKind::kSweep) use = "run it with `tau sweep {0}`";
      if (guess.kind == FileKind::kScenario) use = "run it with `tau admission simulate {0}`";
      std::fprintf(
          stderr, "%s\n",
          fmt::format(fmt::runtime("{0}: error: this is {1}, not a run spec; " + std::string(use) +
                                   ", and check it with `tau validate {0}`"),
                      file, WithArticle(FileKindName(guess.kind)))
              .c_str());
      *rc = kExitInvalid;
      return std::nullopt;
    }
  }
  PrintSpecWarnings(parsed);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
    *rc = kExitInvalid;
    return std::nullopt;
  }
  return parsed;
}

std::string LocatedErrors(const std::string& file, const spec::ParseOutcome& parsed,
                          const std::string& message) {
  // A message that already names the file or a --set (the server's parse errors) is left as it
  // is.
  if (StartsWith(message, file + ":") || StartsWith(message, "--set ")) return message;
  return spec::LocateFieldErrors(message, file, parsed.positions);
}

std::optional<std::vector<spec::Override>> ParseSetOption(const std::vector<std::string>& set,
                                                          int* rc) {
  auto overrides = spec::ParseOverrides(set);
  if (overrides.ok()) return std::move(*overrides);
  *rc = Fail(overrides.status().message());
  return std::nullopt;
}

// "FILE:LINE:COL: error: MESSAGE" lines (the workflow and sweep readers' errors) as diagnostics;
// a line that starts no error (a note) stays with the error before it.
static std::vector<spec::Diagnostic> DiagnosticsOfLines(const std::string& file,
                                                        const std::string& text) {
  std::vector<spec::Diagnostic> out;
  for (const std::string& line : Split(text, '\n')) {
    spec::Diagnostic d{file, 0, 0, line, false};
    bool error = false;
    if (StartsWith(line, file + ":")) {
      std::string rest = line.substr(file.size() + 1);
      int l = 0, c = 0, n = 0;
      if (std::sscanf(rest.c_str(), "%d:%d: error: %n", &l, &c, &n) == 2 && n > 0) {
        d = {file, l, c, rest.substr(n), false};
        error = true;
      } else if (StartsWith(rest, " error: ")) {
        d.message = rest.substr(8);
        error = true;
      }
    }
    if (error || out.empty())
      out.push_back(std::move(d));
    else
      out.back().message += "\n" + line;
  }
  return out;
}

// Each file read by the reader of its kind (by its keys: a run spec, a workflow, a sweep, a
// platform file), a run spec with the --set overrides applied as `tau run --set` would submit it.
static int CmdValidate(const std::vector<std::string>& files, const std::vector<std::string>& set,
                       bool quiet, Format format) {
  int rc = 0;
  auto overrides = ParseSetOption(set, &rc);
  if (!overrides) return rc;
  return ValidateFiles(
      files, quiet, format, spec::kMaxSpecBytes, "a spec",
      [&](const std::string& text, const std::string& file) {
        const FileKindGuess guess = GuessFileKind(text);
        FileCheck found;
        if (guess.kind != FileKind::kRunSpec && !overrides->empty()) {
          found.errors.push_back({file, 0, 0,
                                  fmt::format("this is {}; --set applies to run specs only",
                                              WithArticle(FileKindName(guess.kind))),
                                  false});
          return found;
        }
        switch (guess.kind) {
          case FileKind::kWorkflow: {
            std::vector<spec::StagePlaces> places;
            auto workflow = spec::ParseWorkflow(text, file, &places);
            if (!workflow.ok()) {
              found.errors = DiagnosticsOfLines(file, workflow.status().message());
              return found;
            }
            // Its stages' specs too, each with its `set:`, as `tau run` checks them.
            std::vector<spec::Diagnostic> diagnostics;
            const bool valid =
                CheckWorkflowStages(file, *workflow, places, "", &diagnostics).has_value();
            for (spec::Diagnostic& d : diagnostics)
              (d.warning ? found.warnings : found.errors).push_back(std::move(d));
            if (valid)
              found.summary = fmt::format("workflow '{}', {} stage(s)", workflow->name,
                                          workflow->stages.size());
            return found;
          }
          case FileKind::kSweep: {
            auto sweep = ParseSweep(text, file);
            if (!sweep.ok()) {
              found.errors = DiagnosticsOfLines(file, sweep.status().message());
              return found;
            }
            // Its spec too, with each point's values, as `tau sweep` checks them.
            std::vector<spec::Diagnostic> diagnostics;
            const bool valid = CheckSweepPoints(file, *sweep, "", &diagnostics).has_value();
            for (spec::Diagnostic& d : diagnostics)
              (d.warning ? found.warnings : found.errors).push_back(std::move(d));
            if (valid) {
              found.summary =
                  fmt::format("{} sweep of {} run(s) of {}", sweep->random ? "random" : "grid",
                              SweepPoints(*sweep).size(), sweep->spec);
            }
            return found;
          }
          case FileKind::kPlatform: {
            policy::PlatformOutcome parsed = policy::ParsePlatform(text, file);
            found.errors = parsed.diagnostics;
            if (parsed.ok())
              found.summary = fmt::format("platform file, {} queue(s), {} workspace(s)",
                                          parsed.platform->admission.queues.size(),
                                          parsed.platform->workspaces.size());
            return found;
          }
          case FileKind::kScenario: {
            std::vector<admission::Diagnostic> diagnostics;
            auto result = admission::Simulate(text, file, 1, &diagnostics);
            for (const admission::Diagnostic& d : diagnostics)
              found.errors.push_back({d.file, d.line, d.column, d.message, false});
            if (!result.ok() && found.errors.empty())
              found.errors.push_back({file, 0, 0, result.status().message(), false});
            if (result.ok()) found.summary = "admission scenario, for tau admission simulate";
            return found;
          }
          case FileKind::kUnknown:
            found.errors = DiagnosticsOfLines(file, UnknownFileKindMessage(file, guess.keys));
            return found;
          case FileKind::kRunSpec:
            break;
        }
        spec::ParseOutcome parsed = spec::ParseSpec(text, file, *overrides);
        found = {parsed.diagnostics, parsed.warnings, ""};
        if (!parsed.ok()) return found;
        // The GPUs a platform's profile may give are not known here: the spec's.
        if (auto cannot = CannotStartWarning(file, parsed, parsed.spec->compute.gpus))
          found.warnings.push_back(*cannot);
        found.summary = fmt::format("{} shape, {} '{}'", spec::ShapeName(parsed.spec->shape),
                                    spec::WorkloadKindName(parsed.spec->kind), parsed.spec->name);
        return found;
      });
}

static int CmdSchema(Format format) { return PrintData(spec::JsonSchema(), format); }

// How long a run has run: to its end, or to now while it runs; "-" before it started.
static std::string RunDuration(const api::Run& r) {
  if (!r.started || r.started->empty()) return "-";
  auto start = ParseRfc3339(*r.started);
  if (!start.ok()) return "-";
  int64_t end = SystemClock()->NowMillis();
  if (r.finished && !r.finished->empty())
    if (auto f = ParseRfc3339(*r.finished); f.ok()) end = *f;
  return FormatDuration(std::max<int64_t>(0, end - *start));
}

// The runs as a table; `wide` adds who, where and for how long.
static void PrintRuns(const std::vector<api::Run>& runs, bool wide = false) {
  std::vector<std::vector<std::string>> rows;
  for (const api::Run& r : runs) {
    std::string state = r.state;
    if ((state == "Failed" || state == "Cancelled") && !r.reason.empty() && r.reason != state)
      state += " (" + r.reason + ")";
    std::vector<std::string> row = {r.name,
                                    state,
                                    Cell(r.exit_code),
                                    std::to_string(r.attempts),
                                    r.queue,
                                    std::to_string(r.Gpus()),
                                    Age(r.created)};
    if (wide) {
      row.insert(row.begin() + 5, {Cell(r.workspace), Cell(r.user), std::to_string(r.priority)});
      row.push_back(RunDuration(r));
      row.push_back(r.array ? fmt::format("{}[{}]", r.array->name, r.array->index) : "-");
      row.push_back(Cell(r.project));
      row.push_back(Cell(r.group));
    }
    rows.push_back(std::move(row));
  }
  if (wide)
    PrintTable({"NAME", "STATE", "EXIT", "ATTEMPTS", "QUEUE", "WORKSPACE", "USER", "PRIORITY",
                "GPUS", "CREATED", "DURATION", "ARRAY", "PROJECT", "GROUP"},
               rows);
  else
    PrintTable({"NAME", "STATE", "EXIT", "ATTEMPTS", "QUEUE", "GPUS", "CREATED"}, rows);
}

static int CmdList(const Global& g, const client::RunQuery& query, bool all, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto list = client::TauApi(conn->get()).ListRuns(query);
  if (!list.ok()) return Fail(list.status().message());
  const std::string& state = query.state;
  if (IsData(format)) return PrintData(list->ToJson(), format);
  if (format == Format::kName) {
    for (const api::Run& r : list->runs) std::printf("%s\n", r.name.c_str());
  } else {
    PrintRuns(list->runs, format == Format::kWide);
    int64_t total = list->total;
    int64_t shown = static_cast<int64_t>(list->runs.size());
    if (total > shown)
      std::fprintf(stderr, "(%lld of %lld shown; use --limit)\n", static_cast<long long>(shown),
                   static_cast<long long>(total));
    if (total == 0 && !all && state.empty())
      std::fprintf(stderr, "no active runs (tau list --all shows finished ones)\n");
  }
  return 0;
}

int CmdStatus(const Global& g, const std::string& name, Format format) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetRun(name);
  if (!got.ok()) return Fail(got.status().message());
  api::Run run = std::move(got->run);
  run.spec.reset();
  if (IsData(format)) return PrintData(run.ToJson(), format);
  PrintRuns({run});
  if (run.pending) {
    const api::Pending& p = *run.pending;
    std::printf(
        "\npending: %s%s\n",
        p.position ? fmt::format("position {} in queue {}; ", *p.position, run.queue).c_str() : "",
        p.reason.c_str());
  } else if (!run.message.empty()) {
    std::printf("\n%s\n", run.message.c_str());
  }
  return 0;
}

// A run's resources as people read them. The record holds the run's totals (what quota counts):
// "2 workers, each 1 GPU, 2 CPUs, 8Gi memory (in all 2 GPUs, 4 CPUs, 16Gi memory)".
static std::string ResourcesText(const nlohmann::json& r) {
  if (!r.is_object() || r.empty()) return "-";
  auto number = [&](const char* key) -> std::optional<int64_t> {
    auto it = r.find(key);
    if (it == r.end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  };
  const int64_t workers = std::max<int64_t>(1, number("workers").value_or(1));
  // Per worker when `divisor` divides every total, else nullopt.
  auto describe = [&](int64_t divisor) -> std::optional<std::vector<std::string>> {
    std::vector<std::string> out;
    auto share = [&](int64_t total) -> std::optional<int64_t> {
      if (total % divisor != 0) return std::nullopt;
      return total / divisor;
    };
    if (auto gpus = number("gpus"); gpus && *gpus > 0) {
      auto n = share(*gpus);
      if (!n) return std::nullopt;
      out.push_back(fmt::format("{} GPU{}", *n, *n == 1 ? "" : "s"));
    }
    if (auto cpu = number("cpu_milli")) {
      auto n = share(*cpu);
      if (!n) return std::nullopt;
      out.push_back(*n % 1000 == 0 ? fmt::format("{} CPU{}", *n / 1000, *n == 1000 ? "" : "s")
                                   : fmt::format("{}m CPU", *n));
    }
    if (auto memory = number("memory_bytes")) {
      auto n = share(*memory);
      if (!n) return std::nullopt;
      out.push_back(HumanQuantity(std::to_string(*n / 1024) + "Ki") + " memory");
    }
    for (const auto& [key, value] : r.items())  // other resources: as totals only
      if (divisor == 1 && key != "gpus" && key != "cpu_milli" && key != "memory_bytes" &&
          key != "workers")
        out.push_back(
            fmt::format("{} {}", value.is_string() ? value.get<std::string>() : value.dump(), key));
    return out;
  };
  const std::vector<std::string> total = *describe(1);
  const std::string total_text = total.empty() ? "nothing" : Join(total, ", ");
  if (workers == 1) return total_text;
  auto each = describe(workers);
  if (!each || each->empty()) return fmt::format("{} workers, in all {}", workers, total_text);
  return fmt::format("{} workers, each {} (in all {})", workers, Join(*each, ", "), total_text);
}

static int CmdDescribe(const Global& g, const std::string& name, Format format) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetRun(name);
  if (!got.ok()) return Fail(got.status().message());
  if (IsData(format)) return PrintData(got->ToJson(), format);
  const api::Run& run = got->run;
  std::printf("Name:        %s\n", run.name.c_str());
  std::printf("State:       %s\n", run.state.c_str());
  if (!run.reason.empty()) std::printf("Reason:      %s\n", run.reason.c_str());
  if (!run.message.empty()) std::printf("Message:     %s\n", run.message.c_str());
  if (run.exit_code) std::printf("Exit code:   %d\n", *run.exit_code);
  if (run.signal) std::printf("Signal:      %d\n", *run.signal);
  std::printf("Spec:        %s (%s)\n", run.spec_file.c_str(), run.spec_name.c_str());
  if (run.array)
    std::printf("Array:       %s, index %lld of %s\n", run.array->name.c_str(),
                static_cast<long long>(run.array->index), run.array->Range().c_str());
  if (run.workflow) {
    std::vector<std::string> after;
    for (const api::WorkflowUpstream& u : run.workflow->after)
      after.push_back(fmt::format("{} ({}, {})", u.stage, u.run, u.condition));
    std::printf("Workflow:    %s, stage %s%s\n", run.workflow->name.c_str(),
                run.workflow->stage.c_str(),
                after.empty() ? "" : (", after " + Join(after, ", ")).c_str());
  }
  std::printf("Kind:        %s\n", run.kind.c_str());
  std::printf("Queue:       %s (workspace %s)\n", run.queue.c_str(), run.workspace.c_str());
  std::printf("Resources:   %s\n", ResourcesText(run.resources).c_str());
  std::printf("Config hash: %s\n", run.config_hash.c_str());
  // The spec's experiment fields, those it gives (`tau list --project/--group` filters on them).
  if (run.spec && run.spec->contains("experiment") && (*run.spec)["experiment"].is_object()) {
    std::string parts;
    for (const char* field : {"project", "name", "group"}) {
      const nlohmann::json& v = (*run.spec)["experiment"].value(field, nlohmann::json());
      if (!v.is_string() || v.get<std::string>().empty()) continue;
      parts += (parts.empty() ? "" : ", ") + std::string(field) + " " + v.get<std::string>();
    }
    if (!parts.empty()) std::printf("Experiment:  %s\n", parts.c_str());
  }
  // What the command line set (tau run --set, tau rerun --set), over the file.
  for (const spec::Override& o : spec::RecordedOverrides(run.spec.value_or(nlohmann::json())))
    std::printf("Set:         %s (command line)\n", o.Text().c_str());
  std::printf("Code:        sha256 %s\n", run.snapshot_digest.c_str());
  if (!run.Image().empty())
    std::printf("Image:       %s%s\n", run.Image().c_str(),
                RecordsImageOnly(run.backend)
                    ? fmt::format(" (recorded; not used by the {} backend)", run.backend).c_str()
                    : "");
  if (run.pending) std::printf("Pending:     %s\n", run.pending->reason.c_str());
  std::printf("\nLifecycle:\n");
  for (const api::Event& e : got->events)
    std::printf("  %-24s  %-16s %s\n", e.time.c_str(), e.type.c_str(), e.message.c_str());
  if (!got->attempts.empty()) {
    std::printf("\nAttempts:\n");
    std::vector<std::vector<std::string>> rows;
    for (const api::Attempt& a : got->attempts)
      rows.push_back({"  " + std::to_string(a.number), a.state, Cell(a.reason), Cell(a.exit_code),
                      Cell(a.signal), Cell(nlohmann::json(a.gpus)), a.started, Cell(a.message)});
    PrintTable({"  #", "STATE", "CLASS", "EXIT", "SIGNAL", "GPUS", "STARTED", "MESSAGE"}, rows);
    for (const api::Attempt& a : got->attempts) {
      if (!a.diagnosis) continue;
      const api::Diagnosis& d = *a.diagnosis;
      std::printf("\nDiagnosis of attempt %d: %s\n", a.number, d.phase.c_str());
      if (!d.summary.empty()) std::printf("  %s\n", d.summary.c_str());
      for (const api::DiagnosisEvidence& e : d.evidence)
        std::printf("  rank %d  %-16s %s\n", e.rank, e.signature.c_str(), e.line.c_str());
    }
  }
  return 0;
}

// Writes a log stream to stdout: each line after `prefix`, and of the whole only the last `tail`
// lines (all when negative). Lines are cut at '\n'; a last line without one is kept as it is.
class LogPrinter {
 public:
  LogPrinter(std::string prefix, int tail) : prefix_(std::move(prefix)), tail_(tail) {}
  void Add(std::string_view data) {
    if (prefix_.empty() && tail_ < 0) {
      std::fwrite(data.data(), 1, data.size(), stdout);
      std::fflush(stdout);
      return;
    }
    partial_.append(data);
    size_t start = 0, end;
    while ((end = partial_.find('\n', start)) != std::string::npos) {
      Line(partial_.substr(start, end - start + 1));
      start = end + 1;
    }
    partial_.erase(0, start);
  }
  void Finish() {
    if (!partial_.empty()) Line(partial_ + "\n");
    partial_.clear();
    for (const std::string& line : kept_) std::fputs(line.c_str(), stdout);
    kept_.clear();
    std::fflush(stdout);
  }

 private:
  void Line(const std::string& line) {
    if (tail_ < 0) {
      std::fputs((prefix_ + line).c_str(), stdout);
      return;
    }
    if (tail_ == 0) return;
    kept_.push_back(prefix_ + line);
    if (static_cast<int>(kept_.size()) > tail_) kept_.pop_front();
  }
  std::string prefix_;
  int tail_;
  std::string partial_;
  std::deque<std::string> kept_;
};

static int CmdLogs(const Global& g, const std::string& name, bool follow, int attempt, int rank,
                   int tail, bool all_ranks) {
  if (!IsRunName(name)) return NoSuchRun(name);
  if (follow && (tail >= 0 || all_ranks))
    return Fail("--tail and --all-ranks print what is there and end: use them without -f");
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  // Check the run first so a typo gets a clear answer rather than an empty stream.
  auto got = client::TauApi(conn->get()).GetRun(name);
  if (!got.ok()) return Fail(got.status().message());
  const api::Run& run = got->run;
  const int attempts = run.attempts;
  if (attempt > 0 && attempt > std::max(attempts, 1))
    return Fail(fmt::format("run {} has {} attempt(s); --attempt takes 1 to {}", name, attempts,
                            std::max(attempts, 1)));
  int workers = std::max(1, run.Workers());
  if (rank >= workers)
    return Fail(
        fmt::format("run {} has {} worker(s); --rank takes 0 to {}", name, workers, workers - 1));
  // The latest of several attempts, said so: the failure a user looks for may be in an earlier one.
  if (!follow && attempt == 0 && attempts > 1)
    std::fprintf(stderr, "tau: attempt %d of %d (--attempt N for an earlier one)\n", attempts,
                 attempts);
  client::LogQuery query;
  query.attempt = attempt;
  query.follow = follow;
  if (follow) {
    query.rank = rank;
    auto status = FollowLog(g.server, &*conn, name, query);
    if (!status.ok()) return Fail(status.status().message());
    if (*status != 200)
      return Fail(fmt::format("the server refused the log request (HTTP {})", *status));
    // Followed to its end, the run's own status: `tau logs -f RUN && next-step` must not go on
    // after a failure.
    return CmdLogsExitStatus(g, name);
  }
  const int first = all_ranks ? 0 : rank, last = all_ranks ? workers - 1 : rank;
  for (int r = first; r <= last; ++r) {
    query.rank = r;
    LogPrinter printer(all_ranks ? fmt::format("[rank {}] ", r) : "", tail);
    auto status = client::TauApi(conn->get()).StreamLog(name, query, [&](std::string_view data) {
      printer.Add(data);
      return true;
    });
    printer.Finish();
    if (!status.ok()) return Fail(status.status().message());
    if (*status != 200)
      return Fail(fmt::format("the server refused the log request (HTTP {})", *status));
  }
  return 0;
}

// What `tau cancel` picks when no run is named: the caller's own runs that have not ended (an
// admin names --user U or --all-users for others'), narrowed by the selectors.
struct CancelSelector {
  bool all = false, all_users = false;
  std::string state, array, group, workflow, user;
  bool Any() const {
    return all || all_users || !state.empty() || !array.empty() || !group.empty() ||
           !workflow.empty() || !user.empty();
  }
};

// Cancels each run named, saying so; the status of the last failure (the same as `tau status` of
// that run), else 0.
static int CancelEach(client::TauApi& tau, const std::vector<std::string>& runs) {
  int rc = 0;
  for (const std::string& name : runs) {
    if (!IsRunName(name)) {
      rc = NoSuchRun(name);
      continue;
    }
    std::string pending;
    Status r = tau.Cancel(name, &pending);
    if (!r.ok()) {
      rc = Fail(r.message());
    } else {
      std::printf("cancelling %s\n", name.c_str());
      if (!pending.empty())
        std::fprintf(stderr, "tau: warning: the cancel of %s is %s\n", name.c_str(),
                     pending.c_str());
    }
  }
  return rc;
}

static int CmdCancelSelected(const Global& g, const CancelSelector& sel) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi tau(conn->get());
  auto me = tau.Whoami();
  if (!me.ok()) return Fail(me.status().message());
  if (sel.all_users && !sel.user.empty()) return Fail("give --user U or --all-users, not both");
  if ((sel.all_users || (!sel.user.empty() && sel.user != me->user)) && !me->admin)
    return Fail(
        fmt::format("only platform admins may cancel another user's runs (you are {})", me->user));
  client::RunQuery query;
  query.limit = 1000;
  query.active = true;
  query.user = sel.all_users ? "" : sel.user.empty() ? me->user : sel.user;
  query.group = sel.group;
  query.workflow = sel.workflow;
  if (!sel.state.empty()) {
    // Only a state a run can be cancelled in; an ended state matches nothing to cancel.
    std::string lower = sel.state;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower != "queued" && lower != "running")
      return Fail(
          fmt::format("--state {}: a run that can be cancelled is Queued or Running", sel.state));
    query.state = sel.state;
  }
  std::vector<std::string> picked;
  for (;;) {
    auto page = tau.ListRuns(query);
    if (!page.ok()) return Fail(page.status().message());
    for (const api::Run& r : page->runs)
      if (sel.array.empty() || (r.array && r.array->name == sel.array)) picked.push_back(r.name);
    query.offset += static_cast<int64_t>(page->runs.size());
    if (page->runs.empty() || query.offset >= page->total) break;
  }
  if (picked.empty()) {
    std::printf("no run matches: nothing cancelled\n");
    return 0;
  }
  return CancelEach(tau, picked);
}

static int CmdCancel(const Global& g, const std::vector<std::string>& runs,
                     const CancelSelector& sel) {
  if (!runs.empty() && sel.Any())
    return Fail("name runs or give selectors (--all, --state, --array, ...), not both");
  if (runs.empty() && !sel.Any())
    return Fail(
        "which runs? name them (tau cancel RUN ...) or select them: --all, --state STATE, "
        "--array NAME, --group NAME, --workflow NAME");
  if (runs.empty()) return CmdCancelSelected(g, sel);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi tau(conn->get());
  return CancelEach(tau, runs);
}

static int CmdRerun(const Global& g, const std::string& name, const std::vector<std::string>& set) {
  if (!IsRunName(name)) return NoSuchRun(name);
  // Checked here first, as tau run checks them; the paths and values are checked against the
  // run's spec by the server.
  int rc = 0;
  if (!ParseSetOption(set, &rc)) return rc;
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto r = client::TauApi(conn->get()).Rerun(name, set);
  if (!r.ok()) {
    // The spec's errors at the --set that caused them, one per line, as tau run prints them.
    if (r.status().code() == StatusCode::kInvalidArgument &&
        StartsWith(r.status().message(), "--set ")) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      return kExitInvalid;
    }
    return Fail(r.status().message());
  }
  if (r->warning) std::fprintf(stderr, "tau: warning: %s\n", r->warning->c_str());
  std::puts(r->run.name.c_str());
  return 0;
}

static int CmdResume(const Global& g, const std::string& name, const std::string& from,
                     bool force) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  std::string pending;
  Status r = client::TauApi(conn->get()).Resume(name, from, force, &pending);
  if (!r.ok()) return Fail(r.message());
  std::printf("resuming %s\n", name.c_str());
  if (!pending.empty())
    std::fprintf(stderr, "tau: warning: the resume of %s is %s\n", name.c_str(), pending.c_str());
  return 0;
}

Result<std::map<int, std::string>> GpuHolders(client::TauApi& tau) {
  client::RunQuery running;
  running.state = "Running";
  running.limit = 1000;
  std::map<int, std::string> holders;
  for (;;) {
    TAU_ASSIGN_OR_RETURN(api::RunList page, tau.ListRuns(running));
    for (const api::Run& r : page.runs)
      for (int gpu : r.gpus) {
        std::string& names = holders[gpu];
        names += (names.empty() ? "" : ",") + r.name;
      }
    running.offset += static_cast<int64_t>(page.runs.size());
    if (page.runs.empty() || running.offset >= page.total) break;
  }
  return holders;
}

Result<api::RunList> EndedRuns(client::TauApi& tau, int limit) {
  api::RunList ended;
  for (const char* state : {"Succeeded", "Failed", "Cancelled"}) {
    client::RunQuery query;
    query.state = state;
    query.limit = limit;
    TAU_ASSIGN_OR_RETURN(api::RunList page, tau.ListRuns(query));
    for (api::Run& r : page.runs) ended.runs.push_back(std::move(r));
    ended.total += page.total;
  }
  // RFC 3339 times in UTC sort as text.
  std::stable_sort(ended.runs.begin(), ended.runs.end(), [](const api::Run& a, const api::Run& b) {
    return a.finished.value_or(a.created) > b.finished.value_or(b.created);
  });
  if (ended.runs.size() > static_cast<size_t>(limit)) ended.runs.resize(limit);
  ended.limit = limit;
  return ended;
}

static int CmdGpus(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi tau(conn->get());
  auto got = tau.GetGpus();
  if (!got.ok()) return Fail(got.status().message());
  const api::GpuInventory& inv = got->inventory;
  if (IsData(format)) return PrintData(got->ToJson(), format);
  auto holders = GpuHolders(tau);
  if (!holders.ok()) return Fail(holders.status().message());
  if (inv.devices.empty())
    std::printf("no GPUs: %s\n", inv.note.c_str());
  else {
    std::vector<std::vector<std::string>> rows;
    for (const api::GpuDevice& d : inv.devices) {
      std::string health = "-", why;
      if (d.health) {
        health = d.health->verdict;
        if (!d.health->reasons.empty()) why = d.health->reasons[0].message;
      }
      auto held = holders->find(d.index);
      rows.push_back({std::to_string(d.index), d.name, d.uuid,
                      HumanQuantity(fmt::format("{}Ki", d.memory_total_bytes >> 10)), health,
                      held == holders->end() ? "-" : held->second, why});
    }
    PrintTable({"INDEX", "NAME", "UUID", "MEMORY", "HEALTH", "RUN", "WHY"}, rows);
  }
  return 0;
}

static int CmdHealthCheck(const Global& g, bool active, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).CheckHealth(active);
  if (!got.ok()) return Fail(got.status().message());
  // A driver that is there but unusable fails the check; a machine with no driver has no GPUs.
  bool healthy = got->inventory.error.empty();
  for (const api::GpuHealth& v : got->gpus) healthy = healthy && v.placeable;
  const std::optional<api::ActiveProbe>& probe = got->active;
  if (active && probe && probe->ran)
    for (const api::ProbeResult& p : probe->gpus) healthy = healthy && p.passed;
  if (IsData(format)) {
    PrintData(got->ToJson(), format);
  } else {
    if (!got->inventory.error.empty())
      std::printf("unhealthy: the NVIDIA driver cannot be used: %s\n",
                  got->inventory.error.c_str());
    else if (got->gpus.empty())
      std::printf("no GPUs: %s\n", got->inventory.note.c_str());
    std::vector<std::vector<std::string>> rows;
    for (const api::GpuHealth& v : got->gpus) {
      std::string why;
      for (const api::HealthReason& r : v.reasons) why += (why.empty() ? "" : "; ") + r.message;
      rows.push_back({std::to_string(v.gpu), v.verdict, v.since, why.empty() ? "-" : why});
    }
    if (!rows.empty()) PrintTable({"GPU", "VERDICT", "SINCE", "REASONS"}, rows);
    if (active) {
      if (!probe || !probe->ran)
        std::printf("%s\n",
                    probe && probe->note ? probe->note->c_str() : "active probe did not run");
      if (probe)
        for (const api::ProbeResult& p : probe->gpus)
          std::printf("active probe, CUDA device %d (%s): %s in %.0f ms\n", p.cuda_ordinal,
                      p.name.value_or("").c_str(),
                      p.passed ? "passed" : p.error.value_or("failed").c_str(), p.ms);
    }
  }
  return healthy ? 0 : kExitInvalid;
}

static int CmdAdmissionSimulate(const std::string& file, int cycles, Format format) {
  auto text = ReadFile(file);
  if (!text.ok()) return Fail(text.status().message());
  std::vector<admission::Diagnostic> diagnostics;
  auto result = admission::Simulate(*text, file, cycles, &diagnostics);
  if (!result.ok()) {
    if (diagnostics.empty()) return Fail(result.status().message());
    for (const auto& d : diagnostics) std::fprintf(stderr, "%s\n", d.ToString().c_str());
    return kExitInvalid;
  }
  if (auto skipped = result->find("not_simulated"); skipped != result->end())
    std::fprintf(stderr,
                 "tau: note: %s: platform policy, not admission; the simulation leaves it out\n",
                 Join(skipped->get<std::vector<std::string>>(), ", ").c_str());
  return PrintData(*result, format);
}

int CmdPlatformValidate(const std::vector<std::string>& files, bool quiet, Format format) {
  return ValidateFiles(files, quiet, format, policy::kMaxPlatformBytes, "a platform file",
                       [](const std::string& text, const std::string& file) {
                         policy::PlatformOutcome parsed = policy::ParsePlatform(text, file);
                         FileCheck found{parsed.diagnostics, {}, ""};
                         if (parsed.ok())
                           found.summary =
                               fmt::format("{} queue(s), {} workspace(s), {} priority class(es)",
                                           parsed.platform->admission.queues.size(),
                                           parsed.platform->workspaces.size(),
                                           parsed.platform->priorities.size());
                         return found;
                       });
}

std::function<bool()> RefuseFileAsOutput(CLI::App* cmd, Context* ctx) {
  // -o is an output format in every other command; a file given to it here would be taken for one
  // elsewhere. Hidden, and refused with what to write instead.
  auto given = std::make_shared<std::string>();
  CLI::Option* option = cmd->add_option("-o,--output", *given)->group("");
  std::string path = cmd->get_name();
  for (const CLI::App* p = cmd->get_parent(); p != nullptr && p->get_parent() != nullptr;
       p = p->get_parent())
    path = p->get_name() + " " + path;
  return [option, given, ctx, path] {
    if (option->count() == 0) return true;
    ctx->rc = Fail(fmt::format(
        "`tau {}` writes a file: name it with -f {} (or --file); -o is an output format in tau",
        path, *given));
    return false;
  };
}

std::function<std::optional<Format>()> AddOutput(CLI::App* cmd, Context* ctx,
                                                 std::vector<Format> formats) {
  std::vector<std::string> names;
  for (Format f : formats) names.push_back(FormatName(f));
  std::string list = names.size() == 1
                         ? names[0]
                         : Join(std::vector<std::string>(names.begin(), names.end() - 1), ", ") +
                               " or " + names.back();
  // Owned by the returned function, which CLI11 keeps in the command's callback.
  auto output = std::make_shared<std::string>(names.front());
  cmd->add_option("-o,--output", *output,
                  fmt::format("Output format: {} (default {})", list, names.front()));
  std::string path = cmd->get_name();
  for (const CLI::App* p = cmd->get_parent(); p != nullptr && p->get_parent() != nullptr;
       p = p->get_parent())
    path = p->get_name() + " " + path;
  return [output, ctx, formats, list, path]() {
    Format f;
    if (!ParseFormat(*output, &f)) {
      ctx->rc =
          Fail(fmt::format("unknown output format '{}': `tau {}` prints {}", *output, path, list));
      return std::optional<Format>();
    }
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) {
      ctx->rc = Fail(fmt::format("`tau {}` has no -o {}: it prints {}", path, *output, list));
      return std::optional<Format>();
    }
    return std::optional<Format>(f);
  };
}

void AddSetOption(CLI::App* cmd, std::vector<std::string>* set) {
  cmd->add_option("--set", *set,
                  "Set a spec field, typed by the schema (tau schema): PATH=VALUE, such as "
                  "compute.gpus=2, runtime.env.LR=0.01, run.args=[--epochs, 3] or run.args[0]=x; "
                  "repeat for more; recorded as the command line's")
      ->expected(1)
      ->allow_extra_args(false)  // one value per --set: `--set a=1 FILE` leaves FILE positional
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void RegisterBasicCommands(CLI::App* app, Context* ctx) {
  struct Args {
    bool with_server = false, quiet = false;
    std::vector<std::string> files, set;
  };
  auto a = std::make_shared<Args>();
  auto* version = app->add_subcommand("version", "Print tau's version");
  version->add_flag("--server-version", a->with_server, "Also ask the server for its version");
  auto version_format = AddOutput(version, ctx);
  version->callback([=] {
    if (auto f = version_format()) ctx->rc = CmdVersion(ctx->g, a->with_server, *f);
  });

  auto* validate =
      app->add_subcommand("validate",
                          "Check tau.yaml files, workflow, sweep and platform files (each by its "
                          "keys); exit 0 when all are valid");
  validate->add_option("files", a->files, "Spec files")->required();
  validate->add_flag("-q,--quiet", a->quiet, "Print errors only");
  AddSetOption(validate, &a->set);
  auto validate_format = AddOutput(validate, ctx);
  validate->callback([=] {
    if (auto f = validate_format()) ctx->rc = CmdValidate(a->files, a->set, a->quiet, *f);
  });

  auto* schema = app->add_subcommand(
      "schema",
      "Print the JSON Schema of tau.yaml (its properties are the paths tau run --set takes)");
  auto format = AddOutput(schema, ctx, {Format::kJson, Format::kYaml});
  schema->callback([=] {
    if (auto f = format()) ctx->rc = CmdSchema(*f);
  });
}

// Whether process `pid` has ended (gone, or a zombie its parent has not reaped yet).
static bool ProcessEnded(int pid) {
  auto stat = ReadFile(fmt::format("/proc/{}/stat", pid));
  if (!stat.ok()) return true;
  size_t paren = stat->rfind(')');
  return paren != std::string::npos && paren + 2 < stat->size() && (*stat)[paren + 2] == 'Z';
}

// `tau server stop`: asks the server to stop (an admin's action, refused to anyone else by the
// server) and waits until it has: its process ended (a local socket) or it answers no more.
static int CmdServerStop(const Global& g) {
  auto conn = ConnectToServer(g.server, /*start_local=*/false);
  if (!conn.ok()) {
    std::printf("no server answers (%s): nothing to stop\n", conn.status().message().c_str());
    return 0;
  }
  const client::Endpoint where = (*conn)->endpoint();
  auto pid = client::TauApi(conn->get()).StopServer();
  if (!pid.ok()) return Fail(pid.status().message());
  conn->reset();
  std::fprintf(stderr, "stopping the server at %s...\n", where.ToString().c_str());
  const int64_t deadline = MonotonicMillis() + 120'000;
  while (MonotonicMillis() < deadline) {
    bool ended = where.unix_socket && *pid > 0
                     ? ProcessEnded(*pid)
                     : !client::Connection::Open(where, ClientTimeoutMillis()).ok();
    if (ended) {
      std::printf("server at %s stopped\n", where.ToString().c_str());
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Fail(fmt::format("the server at {} was asked to stop but has not after 2 minutes",
                          where.ToString()));
}

void RegisterServerCommand(CLI::App* app, Context* ctx) {
  struct Args {
    server::ServerOptions sopts;
    std::string retain_logs, retain_samples;
    // The engines' own options, by name (std::map: their addresses stay put for CLI11).
    std::map<std::string, std::string> values;
    std::map<std::string, bool> flags;
    std::map<std::string, std::pair<std::string, CLI::Option*>> engine_of;
  };
  auto a = std::make_shared<Args>();
  server::ServerOptions& sopts = a->sopts;
  auto* server = app->add_subcommand("server", "Run the tau server in the foreground");
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
  server->add_option("--backend", sopts.backend, "Where runs run: " + BackendHelp())
      ->check(BackendCheck());
  // Each engine's own options, named in its help ("kubernetes: ..."); given with another
  // engine's --backend they are refused.
  for (const server::Engine& engine : engines::Registered()) {
    for (const server::EngineOption& o : engine.options) {
      const std::string help = engine.name + ": " + o.help;
      CLI::Option* opt = o.flag ? server->add_flag("--" + o.name, a->flags[o.name], help)
                                : server->add_option("--" + o.name, a->values[o.name], help);
      if (o.check) opt->check(o.check);
      a->engine_of[o.name] = {engine.name, opt};
    }
  }
  server->add_flag("--quiet", sopts.quiet, "Log nothing");
  // Limits against a client that would wedge the API for everyone (docs/security.md, Hardening).
  server
      ->add_option("--max-connections", sopts.max_connections,
                   "Open connections the Unix socket, and apart from it TCP, may hold in all")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  server
      ->add_option("--max-connections-per-address", sopts.max_connections_per_address,
                   "Open connections one TCP address (IPv6: a /64) or one local user may hold")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  server
      ->add_option("--max-streams-per-identity", sopts.max_streams_per_identity,
                   "Event streams, log follows and downloads one identity (an anonymous caller: "
                   "one address) may hold open at once")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  server
      ->add_option("--header-deadline", sopts.header_deadline_ms,
                   "Milliseconds from a connection's accept (later requests: their first byte) "
                   "to the end of the request's headers")
      ->check(CLI::Range(100, 3'600'000))
      ->capture_default_str();
  server
      ->add_option("--idle-timeout", sopts.idle_timeout_ms,
                   "Milliseconds a kept-alive connection may wait for its next request")
      ->check(CLI::Range(100, 3'600'000))
      ->capture_default_str();
  server
      ->add_option("--body-grace", sopts.body_grace_ms,
                   "Milliseconds a request body may take before --body-min-rate applies")
      ->check(CLI::Range(100, 3'600'000))
      ->capture_default_str();
  server
      ->add_option("--body-min-rate", sopts.body_min_bytes_per_second,
                   "Bytes a second a request body must keep up with after --body-grace")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  // A legitimate submission with its code inline is up to 128 MiB: lower limits refuse it.
  server
      ->add_option("--max-body-bytes-in-flight", sopts.max_body_bytes_in_flight,
                   "Bytes of request bodies over 64 KiB the server receives and handles at once; "
                   "past it a request is refused (503) before its body is read")
      ->check(CLI::Range(int64_t{1} << 20, int64_t{1} << 40))
      ->capture_default_str();
  server
      ->add_option("--max-body-bytes-in-flight-per-identity",
                   sopts.max_body_bytes_in_flight_per_identity,
                   "The same for one identity (an anonymous caller: one address); past it, 429")
      ->check(CLI::Range(int64_t{1} << 20, int64_t{1} << 40))
      ->capture_default_str();
  server
      ->add_option("--audit-refusals-per-minute", sopts.audit_refusals_per_minute,
                   "Refused requests (401, 403, 429, 503) written to the audit trail per caller, "
                   "status and route in a window (a minute unless --audit-refusal-window); the "
                   "rest are counted (tau_http_refused_total) "
                   "and summed up in one row")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  server
      ->add_option("--audit-refusal-window", sopts.audit_refusal_window_ms,
                   "Milliseconds of the window of --audit-refusals-per-minute")
      ->check(CLI::Range(1000, 3'600'000))
      ->capture_default_str();
  server
      ->add_option("--max-unreferenced-blob-bytes", sopts.max_unreferenced_blob_bytes,
                   "Bytes of code one identity may have uploaded that no run uses yet; an upload "
                   "past it is refused (413) until a run uses that code")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50))
      ->capture_default_str();
  server
      ->add_option("--max-tokens-per-user", sopts.max_tokens_per_user,
                   "Live (unrevoked, unexpired) API tokens one user may hold; one more is "
                   "refused (429)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  server->add_option("--retain-logs", a->retain_logs,
                     "Delete ended runs' logs after this long (e.g. 30d; default: keep); the "
                     "evidence record keeps their hashes");
  server->add_option("--retain-samples", a->retain_samples,
                     "Delete ended runs' GPU samples after this long (default: keep)");
  auto* stop = server->add_subcommand(
      "stop",
      "Stop the server of $TAU_HOME (or --server) gracefully and wait until it has; platform "
      "admins only (running attempts keep running, as on SIGTERM)");
  stop->callback([=] { ctx->rc = CmdServerStop(ctx->g); });
  server->callback([=] {
    if (stop->parsed()) return;
    server::ServerOptions& opts = a->sopts;
    for (auto [text, ms] : {std::pair{&a->retain_logs, &opts.retain_logs_ms},
                            std::pair{&a->retain_samples, &opts.retain_samples_ms}}) {
      if (text->empty() || *text == "forever") continue;
      auto d = ParseDurationMillis(*text);
      if (!d.ok()) {
        ctx->rc = Fail("bad retention duration '" + *text + "': " + d.status().message());
        return;
      }
      *ms = *d;
    }
    const std::string chosen = (*engines::Find(opts.backend))->name;  // --backend was checked
    for (const auto& [name, of] : a->engine_of) {
      if (of.second->count() == 0) continue;
      if (of.first != chosen) {
        ctx->rc =
            Fail(fmt::format("--{} is an option of the {} backend, not of {}: add --backend {}",
                             name, of.first, chosen, of.first));
        return;
      }
      opts.engine_options[name] = a->flags.count(name) ? "true" : a->values[name];
    }
    if (opts.home.empty()) opts.home = TauHome();
    opts.tau_binary = runtime::SelfExecutable();
    ctx->rc = server::RunServer(opts);
  });
}

void RegisterRunCommands(CLI::App* app, Context* ctx) {
  struct Args {
    std::string run_file = "tau.yaml", state, run_name, resume_from, code_dir;
    std::vector<std::string> set;  // tau run --set, tau rerun --set
    std::string array;             // tau run --array, when given (even empty: it is refused then)
    std::vector<std::string> names;
    bool detach = false, all = false, watch = false, top_once = false, follow = false,
         force = false, quiet = false;
    int limit = 100, attempt = 0, rank = 0, tail = -1;  // tail: -1, every line
    bool all_ranks = false;
    client::RunQuery query;  // tau list's filters
  };
  auto a = std::make_shared<Args>();
  const Global& g = ctx->g;

  auto* run =
      app->add_subcommand("run", "Submit a run, stream its logs, exit with its exit status");
  run->add_option("file", a->run_file,
                  "The spec (default ./tau.yaml; DIR for DIR/tau.yaml), or NAME for tau/NAME.yaml "
                  "(or .yml) at the repository root (TauGrid's layout)");
  run->add_flag("-d,--detach", a->detach, "Print the run name and return at once");
  CLI::Option* array =
      run->add_option("--array", a->array,
                      "One run per index of FIRST-LAST[:STEP] (at most 10000), each with "
                      "TAU_ARRAY_INDEX, submitted together");
  AddSetOption(run, &a->set);
  run->add_option("--code-dir", a->code_dir,
                  "The code directory to ship, run from its root (default: the spec's folder, or "
                  "the repository root for a spec in the repository's tau/ folder)");
  run->callback([=, &g] {
    RunOptions o;
    o.target = a->run_file;
    o.detach = a->detach;
    o.set = a->set;
    o.code_dir = a->code_dir;
    ctx->rc = array->count() > 0 ? CmdRunArray(g, o, a->array) : CmdRun(g, o);
  });

  auto sweep_options = std::make_shared<SweepOptions>();
  auto* sweep = app->add_subcommand(
      "sweep",
      "One run per point of a grid or random sweep over spec fields (docs/experiments.md), in one "
      "experiment group, submitted together; waits and prints them best first by the objective");
  sweep->add_option("file", sweep_options->file, "The sweep file (sweep.yaml)")->required();
  sweep->add_flag("-d,--detach", sweep_options->detach, "Print the runs' names and return");
  sweep->add_flag("-q,--quiet", sweep_options->quiet,
                  "No progress lines on stderr while it waits (the table is printed as ever)");
  sweep->add_option("--code-dir", sweep_options->code_dir,
                    "The code directory to ship, as for tau run");
  sweep->callback([=, &g] { ctx->rc = CmdSweep(g, *sweep_options); });

  auto* list = app->add_subcommand("list", "List runs (active ones unless --all)");
  list->add_option("--state", a->state, "Only runs in this state (Queued, Running, Failed, ...)");
  list->add_option("--workspace", a->query.workspace, "Only runs of this workspace");
  list->add_option("--queue", a->query.queue, "Only runs of this queue");
  list->add_option("--user", a->query.user, "Only runs this user submitted");
  list->add_option("--project", a->query.project, "Only runs of this experiment.project");
  list->add_option("--group", a->query.group, "Only runs of this experiment.group");
  list->add_flag("-a,--all", a->all, "Include finished runs");
  list->add_option("--limit", a->limit, "At most this many runs")->check(CLI::Range(1, 1000));
  auto list_format = AddOutput(
      list, ctx, {Format::kTable, Format::kWide, Format::kName, Format::kJson, Format::kYaml});
  list->callback([=, &g] {
    if (auto f = list_format()) {
      client::RunQuery query = a->query;
      query.limit = a->limit;
      query.state = a->state;
      query.active = !a->all;
      ctx->rc = CmdList(g, query, a->all, *f);
    }
  });

  auto* status =
      app->add_subcommand("status", "Show a run's state (and why it waits, when it does)");
  status->add_option("run", a->run_name, "Run name")->required();
  auto status_format = AddOutput(status, ctx);
  status->add_flag("-w,--watch", a->watch, "Print again on each change until the run ends");
  status->callback([=, &g] {
    if (auto f = status_format())
      ctx->rc = a->watch ? CmdStatusWatch(g, a->run_name, *f) : CmdStatus(g, a->run_name, *f);
  });

  auto* top = app->add_subcommand("top", "A live view of queues, runs and GPUs (q quits)");
  top->add_flag("--once", a->top_once, "Print one frame and exit");
  auto top_format = AddOutput(top, ctx);
  top->callback([=, &g] {
    if (auto f = top_format()) ctx->rc = CmdTop(g, a->top_once, *f);
  });

  auto* describe = app->add_subcommand("describe", "Show a run's lifecycle, attempts and config");
  describe->add_option("run", a->run_name, "Run name")->required();
  auto describe_format = AddOutput(describe, ctx);
  describe->callback([=, &g] {
    if (auto f = describe_format()) ctx->rc = CmdDescribe(g, a->run_name, *f);
  });

  auto* logs = app->add_subcommand("logs", "Print a run's logs");
  logs->add_option("run", a->run_name, "Run name")->required();
  logs->add_flag("-f,--follow", a->follow, "Keep streaming until the run ends");
  logs->add_option("--attempt", a->attempt, "Attempt number (default: the latest; with -f, all)")
      ->check(CLI::Range(1, 1 << 20));
  logs->add_option("--rank", a->rank, "Worker rank of a gang (default 0)")
      ->check(CLI::Range(0, 1 << 20));
  logs->add_option("--tail", a->tail, "Only the last N lines (of each rank with --all-ranks)")
      ->check(CLI::Range(0, 1 << 30));
  logs->add_flag("--all-ranks", a->all_ranks, "Every rank's log, each line after [rank N]");
  logs->callback([=, &g] {
    ctx->rc = CmdLogs(g, a->run_name, a->follow, a->attempt, a->rank, a->tail, a->all_ranks);
  });

  auto* cancel =
      app->add_subcommand("cancel", "Cancel runs (SIGTERM, then SIGKILL after a grace period)");
  auto sel = std::make_shared<CancelSelector>();
  cancel->add_option("runs", a->names, "Run names (or select runs with the flags below)");
  cancel->add_flag("--all", sel->all, "Every run of yours that has not ended");
  cancel->add_option("--state", sel->state, "Only your runs in this state (queued or running)");
  cancel->add_option("--array", sel->array, "Only your runs of this array");
  cancel->add_option("--group", sel->group, "Only your runs of this experiment.group (a sweep's)");
  cancel->add_option("--workflow", sel->workflow, "Only your runs of this workflow");
  cancel->add_option("--user", sel->user, "This user's runs instead of yours (admins)");
  cancel->add_flag("--all-users", sel->all_users, "Every user's runs (admins)");
  cancel->callback([=, &g] { ctx->rc = CmdCancel(g, a->names, *sel); });

  auto* wait = app->add_subcommand(
      "wait", "Wait until runs end; exit 0 when all succeeded, else the first failed run's status");
  wait->add_option("runs", a->names, "Run names")->required();
  wait->add_flag("-q,--quiet", a->quiet, "No progress lines on stderr (each run's end is printed)");
  wait->callback([=, &g] { ctx->rc = CmdWait(g, a->names, a->quiet); });

  auto* rerun = app->add_subcommand(
      "rerun", "Start a new run from a run's recorded spec and code snapshot; print its name");
  rerun->add_option("run", a->run_name, "Run name")->required();
  AddSetOption(rerun, &a->set);
  rerun->callback([=, &g] { ctx->rc = CmdRerun(g, a->run_name, a->set); });

  auto* resume = app->add_subcommand(
      "resume", "Give a failed or cancelled run another attempt, resuming from a checkpoint");
  resume->add_option("run", a->run_name, "Run name")->required();
  resume->add_option("--from", a->resume_from,
                     "Checkpoint to resume from (in the run's checkpoint directory; default: the "
                     "newest complete one)");
  resume->add_flag("--force", a->force, "Resume even after OOMKilled");
  resume->callback([=, &g] { ctx->rc = CmdResume(g, a->run_name, a->resume_from, a->force); });
}

void RegisterGpusCommand(CLI::App* app, Context* ctx) {
  auto* gpus = app->add_subcommand("gpus", "List this machine's GPUs");
  auto format = AddOutput(gpus, ctx);
  gpus->callback([=] {
    if (auto f = format()) ctx->rc = CmdGpus(ctx->g, *f);
  });
}

void RegisterHealthCommands(CLI::App* app, Context* ctx) {
  auto active = std::make_shared<bool>(false);
  auto* health = app->add_subcommand("health", "GPU health");
  health->require_subcommand(1);
  auto* check = health->add_subcommand(
      "check", "Run the GPU health checks now; exit 1 when a GPU may not be used");
  check->add_flag("--active", *active,
                  "Also run a short workload on each GPU (needs the CUDA driver)");
  auto format = AddOutput(check, ctx);
  check->callback([=] {
    if (auto f = format()) ctx->rc = CmdHealthCheck(ctx->g, *active, *f);
  });
  RegisterHealthAgentCommand(health, ctx);
}

void RegisterAdmissionCommands(CLI::App* app, Context* ctx) {
  struct Args {
    std::string file;
    int cycles = 1;
  };
  auto a = std::make_shared<Args>();
  auto* admission = app->add_subcommand("admission", "Kueue-model admission tools");
  admission->require_subcommand(1);
  auto* simulate = admission->add_subcommand(
      "simulate", "Run scheduling cycles over queues and workloads described in YAML; print JSON");
  simulate->add_option("file", a->file, "Simulation input (flavors, cohorts, queues, workloads)")
      ->required();
  simulate->add_option("--cycles", a->cycles, "Scheduling cycles to run")
      ->check(CLI::Range(1, 1000000));
  auto format = AddOutput(simulate, ctx, {Format::kJson, Format::kYaml});
  simulate->callback([=] {
    if (auto f = format()) ctx->rc = CmdAdmissionSimulate(a->file, a->cycles, *f);
  });
}

}  // namespace tau::cli
