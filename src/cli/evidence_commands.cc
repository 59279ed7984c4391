// `tau evidence ...` and `tau metrics ...` (docs/evidence.md).
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/compare.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/strings.h"
#include "evidence/evidence.h"

namespace tau::cli {

static int CmdEvidence(const Global& g, const std::string& run, Format format) {
  if (!IsRunName(run)) return NoSuchRun(run);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto record = client::TauApi(conn->get()).GetEvidence(run);
  if (!record.ok()) return Fail(record.status().message());
  if (IsData(format)) return PrintData(*record, format);
  std::fputs(evidence::FormatRecordSummary(*record).c_str(), stdout);
  return 0;
}

// Writes what `fetch` hands on into `file`, beside it first and renamed when complete: a failed
// download leaves no partial file under the name asked for. The byte count, or the error to show.
// Without `replace`, a file already at `file` stays and the download fails naming it (the link
// fails if one appears meanwhile).
static Result<int64_t> DownloadTo(
    const std::string& file, bool replace,
    const std::function<Status(const std::function<bool(std::string_view)>&)>& fetch) {
  if (!replace && PathExists(file))
    return AlreadyExists(file + " exists: give --force to replace it, or another -f FILE");
  std::string tmp = file + ".part-" + RandomHex(6);
  FILE* out = std::fopen(tmp.c_str(), "wb");
  if (!out) return IoError("cannot write " + tmp, errno);
  bool write_failed = false;
  int64_t bytes = 0;
  Status got = fetch([&](std::string_view data) {
    if (std::fwrite(data.data(), 1, data.size(), out) != data.size()) write_failed = true;
    bytes += static_cast<int64_t>(data.size());
    return !write_failed;
  });
  bool closed = std::fclose(out) == 0;
  if (got.ok() && (write_failed || !closed)) got = Status(StatusCode::kIo, "cannot write " + tmp);
  if (got.ok() && replace && std::rename(tmp.c_str(), file.c_str()) != 0)
    got = IoError(fmt::format("cannot rename {} to {}", tmp, file), errno);
  if (got.ok() && !replace) {
    if (::link(tmp.c_str(), file.c_str()) != 0)
      got = errno == EEXIST ? AlreadyExists(file + " exists: give --force to replace it")
                            : IoError(fmt::format("cannot link {} to {}", tmp, file), errno);
    std::remove(tmp.c_str());
  }
  if (!got.ok()) {
    std::remove(tmp.c_str());
    return got;
  }
  return bytes;
}

static int CmdEvidenceExport(const Global& g, const std::string& run, const std::string& file,
                             bool replace) {
  if (!IsRunName(run)) return NoSuchRun(run);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi api(conn->get());
  Result<int64_t> bytes = DownloadTo(
      file, replace, [&](const auto& on_data) { return api.ExportEvidence(run, on_data); });
  if (!bytes.ok()) return Fail(bytes.status().message());
  evidence::VerifyReport report;
  Status ok = evidence::VerifyBundle(file, {}, &report);
  if (!ok.ok()) return Fail("the exported bundle does not verify: " + ok.message());
  std::printf("wrote %s (%lld bytes, %lld files, chain head %s)\n", file.c_str(),
              static_cast<long long>(*bytes), static_cast<long long>(report.files),
              report.chain_head.substr(0, 16).c_str());
  return 0;
}

static int CmdEvidenceVerify(const Global& g, const std::string& file, bool run_check) {
  evidence::VerifyReport report;
  Status s = evidence::VerifyBundle(file, {}, &report);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: NOT intact: %s\n", file.c_str(), s.message().c_str());
    return kExitInvalid;
  }
  if (run_check) {
    // A bundle rewritten consistently passes every check inside it; only the chain head the server
    // holds for the run tells it apart.
    auto conn = ConnectToServer(g.server);
    if (!conn.ok()) return Fail(conn.status().message());
    auto got = client::TauApi(conn->get()).GetRun(report.run);
    if (!got.ok()) return Fail("cannot check against the server: " + got.status().message());
    std::string head = got->events.empty() ? "" : got->events.back().hash;
    if (head != report.chain_head) {
      evidence::VerifyOptions options;
      options.expected_chain_head = head;
      Status again = evidence::VerifyBundle(file, options, nullptr);
      std::fprintf(
          stderr, "%s: NOT intact: %s\n", file.c_str(),
          again.ok() ? "its chain head differs from the server's" : again.message().c_str());
      return kExitInvalid;
    }
  }
  std::printf("%s: intact (run %s, %lld files, %lld events, chain head %s%s)\n", file.c_str(),
              report.run.c_str(), static_cast<long long>(report.files),
              static_cast<long long>(report.events), report.chain_head.substr(0, 16).c_str(),
              run_check ? ", matches the server" : "");
  return 0;
}

static int CmdMetrics(const Global& g, const std::string& run, const std::string& name,
                      const std::string& split, bool has_split, const std::string& output) {
  if (!IsRunName(run)) return NoSuchRun(run);
  std::string mode = output;
  if (mode.empty()) mode = StdoutIsTerminal() ? "table" : "jsonl";
  if (mode != "table" && mode != "json" && mode != "yaml" && mode != "jsonl") {
    Format other;
    const char* formats = "table, json, yaml or jsonl";
    if (ParseFormat(mode, &other))
      return Fail(fmt::format("`tau metrics` has no -o {}: it prints {}", mode, formats));
    return Fail(fmt::format("unknown output format '{}': `tau metrics` prints {}", mode, formats));
  }
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto jsonl =
      client::TauApi(conn->get())
          .GetMetricsJsonl(run, name, has_split ? std::optional<std::string>(split) : std::nullopt);
  if (!jsonl.ok()) return Fail(jsonl.status().message());
  // A name with no points is a mistake (a typo, a metric never written) in every format, not an
  // empty answer: a script must not read it as "no data yet" and go on.
  if (!name.empty() && jsonl->find_first_not_of(" \t\r\n") == std::string::npos) {
    std::fprintf(stderr,
                 "tau: run %s has no points of metric '%s'%s; `tau metrics %s` lists the metrics "
                 "it has\n",
                 run.c_str(), name.c_str(), has_split ? (" in split '" + split + "'").c_str() : "",
                 run.c_str());
    return kExitInvalid;
  }
  if (mode == "jsonl") {
    std::fputs(jsonl->c_str(), stdout);
    return 0;
  }
  evidence::MetricHistory history;
  history.AddJsonl(*jsonl);
  if (mode == "json" || mode == "yaml") {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [n, s] : history.SeriesKeys()) {
      nlohmann::json points = nlohmann::json::array();
      for (const auto& p : history.Series(n, s)) {
        nlohmann::json v = std::isfinite(p.value) ? nlohmann::json(p.value)
                                                  : nlohmann::json(evidence::FormatValue(p.value));
        points.push_back({{"step", p.step}, {"value", v}, {"attempt", p.attempt}});
      }
      out.push_back({{"name", n}, {"split", s}, {"points", points}});
    }
    return PrintData(out, mode == "yaml" ? Format::kYaml : Format::kJson);
  }
  if (history.size() == 0) {
    std::printf("run %s has no metric points\n", run.c_str());
    return 0;
  }
  if (name.empty()) {
    std::fputs(evidence::FormatSummaryTable(history.Summaries(), &history).c_str(), stdout);
    return 0;
  }
  for (const auto& [n, s] : history.SeriesKeys()) {
    std::vector<evidence::MetricPoint> points = history.Series(n, s);
    std::vector<double> values;
    for (const auto& p : points) values.push_back(p.value);
    std::printf("%s%s  %s  (%zu points, steps %lld..%lld)\n", n.c_str(),
                s.empty() ? "" : ("/" + s).c_str(), evidence::Sparkline(values).c_str(),
                points.size(), static_cast<long long>(points.front().step),
                static_cast<long long>(points.back().step));
    std::fputs(evidence::FormatMetricTable(points).c_str(), stdout);
  }
  return 0;
}

static int CmdArtifacts(const Global& g, const std::string& run, bool digests, int64_t offset,
                        int64_t limit, Format format) {
  if (!IsRunName(run)) return NoSuchRun(run);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto list = client::TauApi(conn->get()).ListArtifacts(run, digests, offset, limit);
  if (!list.ok()) return Fail(list.status().message());
  if (IsData(format)) return PrintData(list->ToJson(), format);
  if (list->total == 0) {
    std::printf("run %s has no checkpoints or outputs\n", run.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const api::ArtifactEntry& a : list->artifacts)
    rows.push_back({a.path, std::to_string(a.size), a.sha256.value_or("-"), Age(a.modified)});
  PrintTable({"PATH", "SIZE", "SHA256", "MODIFIED"}, rows);
  // What the table leaves out is said, on stderr so that the table stays a table.
  const int64_t shown_to = list->offset + static_cast<int64_t>(list->artifacts.size());
  if (list->offset > 0 || shown_to < list->total)
    std::fprintf(stderr, "files %lld to %lld of %lld; --offset %lld for the next page\n",
                 static_cast<long long>(list->offset + 1), static_cast<long long>(shown_to),
                 static_cast<long long>(list->total), static_cast<long long>(shown_to));
  if (list->truncated)
    std::fprintf(stderr,
                 "the listing stopped at %lld files of a directory: more are there, not listed\n",
                 static_cast<long long>(list->max_listed));
  if (list->undigested > 0)
    std::fprintf(stderr, "%lld file(s) without a digest (-): %s\n",
                 static_cast<long long>(list->undigested),
                 digests ? "more than the server hashes in one request; run it again to go on"
                         : "--digest computes them");
  return 0;
}

// `tau get RUN DIR`: every file the run's listing has under DIR ("output", "checkpoint/step-10"),
// into the local directory `into` at the same relative paths. Every file that would be
// overwritten is found before anything is written; each file appears whole or not at all.
static int GetDirectory(client::TauApi& api, const std::string& run, const std::string& dir,
                        const std::vector<api::ArtifactEntry>& files, const std::string& into,
                        bool replace) {
  std::vector<std::pair<std::string, std::string>> plan;  // (remote path, local file)
  for (const api::ArtifactEntry& a : files) {
    std::string rel = a.path.substr(dir.size() + 1);
    // A name from the server never leaves `into`.
    for (const std::string& part : Split(rel, '/'))
      if (part.empty() || part == "." || part == "..")
        return Fail(fmt::format("run {} lists '{}', a path tau get will not write", run, a.path));
    plan.emplace_back(a.path, into + "/" + rel);
  }
  if (!replace)
    for (const auto& [remote, local] : plan)
      if (PathExists(local))
        return Fail(fmt::format("{} exists: give --force to replace it, or another -f DIR", local));
  int64_t total = 0;
  for (const auto& [remote, local] : plan) {
    if (Status s = MakeDirs(local.substr(0, local.rfind('/')), 0755); !s.ok())
      return Fail(s.message());
    const std::string& from = remote;
    Result<int64_t> bytes = DownloadTo(
        local, replace, [&](const auto& on_data) { return api.GetArtifact(run, from, on_data); });
    if (!bytes.ok()) return Fail(bytes.status().message());
    std::printf("wrote %s (%lld bytes)\n", local.c_str(), static_cast<long long>(*bytes));
    total += *bytes;
  }
  std::printf("%zu file(s) of %s, %lld bytes, in %s\n", plan.size(), dir.c_str(),
              static_cast<long long>(total), into.c_str());
  return 0;
}

static int CmdGet(const Global& g, const std::string& run, std::string path, std::string file,
                  bool replace) {
  if (!IsRunName(run)) return NoSuchRun(run);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  {
    // A directory (output, checkpoint/step-10, ...) is fetched whole: what the listing has under
    // it. A file is what the listing has at that path (or what the server says of it).
    auto conn = ConnectToServer(g.server);
    if (!conn.ok()) return Fail(conn.status().message());
    client::TauApi api(conn->get());
    std::vector<api::ArtifactEntry> under;
    bool is_file = false, truncated = false;
    for (int64_t offset = 0;;) {
      auto page = api.ListArtifacts(run, /*digests=*/false, offset, 10000);
      if (!page.ok()) return Fail(page.status().message());
      for (const api::ArtifactEntry& a : page->artifacts) {
        if (a.path == path) is_file = true;
        if (StartsWith(a.path, path + "/")) under.push_back(a);
      }
      truncated = truncated || page->truncated;
      offset += static_cast<int64_t>(page->artifacts.size());
      if (page->artifacts.empty() || offset >= page->total) break;
    }
    if (!is_file && !under.empty()) {
      if (file == "-") return Fail(fmt::format("{} is a directory: -f - takes one file", path));
      if (truncated)
        std::fprintf(stderr,
                     "tau: warning: the run's listing stopped at its limit: files not listed "
                     "are not fetched\n");
      std::string into = file.empty() ? path.substr(path.rfind('/') + 1) : file;
      return GetDirectory(api, run, path, under, into, replace);
    }
  }
  if (file.empty()) {
    file = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
    if (file.empty() || file == "." || file == "..")
      return Fail(
          fmt::format("'{}' names no file: give a path as `tau artifacts {}` lists it, or "
                      "-f FILE",
                      path, run));
  }
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi api(conn->get());
  if (file == "-") {
    bool write_failed = false;
    Status got = api.GetArtifact(run, path, [&](std::string_view data) {
      write_failed = std::fwrite(data.data(), 1, data.size(), stdout) != data.size();
      return !write_failed;
    });
    if (!got.ok()) return Fail(got.message());
    if (write_failed || std::fflush(stdout) != 0) return Fail("cannot write to stdout");
    return 0;
  }
  Result<int64_t> bytes = DownloadTo(
      file, replace, [&](const auto& on_data) { return api.GetArtifact(run, path, on_data); });
  if (!bytes.ok()) return Fail(bytes.status().message());
  std::printf("wrote %s (%lld bytes)\n", file.c_str(), static_cast<long long>(*bytes));
  return 0;
}

// The width a chart may take: $COLUMNS, else the terminal's, else 80.
static int ChartWidth() {
  if (const char* env = std::getenv("COLUMNS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return static_cast<int>(std::min(v, 1000L));
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  return 80;
}

struct CompareArgs {
  std::vector<std::string> runs;
  std::string metric;
  bool plot = false;
};

// Two or more runs side by side, from their evidence records and metric histories.
static int CmdCompare(const Global& g, const CompareArgs& args, Format format) {
  const std::vector<std::string>& runs = args.runs;
  if (runs.size() < 2) return Fail("tau compare: name two runs or more");
  if (args.plot && args.metric.empty())
    return Fail("tau compare: --plot draws one metric: name it with --metric NAME");
  if (args.plot && IsData(format))
    return Fail(
        fmt::format("tau compare: --plot draws on a terminal and has no -o {} form; "
                    "leave out --plot for the data",
                    FormatName(format)));
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!IsRunName(runs[i])) return NoSuchRun(runs[i]);
    for (size_t j = 0; j < i; ++j)
      if (runs[j] == runs[i]) return Fail("tau compare: run " + runs[i] + " is named twice");
  }
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi api(conn->get());
  std::vector<CompareInput> inputs(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    inputs[i].run = runs[i];
    auto record = api.GetEvidence(runs[i]);
    if (!record.ok()) return Fail(record.status().message());
    inputs[i].record = std::move(*record);
    auto jsonl = api.GetMetricsJsonl(runs[i], "", std::nullopt);
    if (!jsonl.ok()) return Fail(jsonl.status().message());
    inputs[i].metrics.AddJsonl(*jsonl);
  }
  Comparison c = CompareRuns(inputs, args.metric);
  if (!args.metric.empty() && c.metrics.empty()) {
    std::set<std::string> names;
    for (const CompareInput& in : inputs)
      for (const auto& [name, split] : in.metrics.SeriesKeys())
        names.insert(split.empty() ? name : name + "/" + split);
    return Fail(fmt::format("tau compare: no run has metric '{}' (their series: {})", args.metric,
                            names.empty() ? "none" : Join({names.begin(), names.end()}, ", ")));
  }
  if (IsData(format)) return PrintData(ComparisonJson(c), format);
  std::fputs(FormatComparison(c).c_str(), stdout);
  if (args.plot) {
    std::printf("\n%s by step:\n", args.metric.c_str());
    for (const std::string& line : PlotCurves(MetricCurves(inputs, args.metric), ChartWidth(), 15))
      std::printf("%s\n", line.c_str());
  }
  return 0;
}

void RegisterEvidenceCommands(CLI::App* app, Context* ctx) {
  struct Args {
    std::string run_name, bundle_file, metric_name, metric_split, metric_output;
    bool run_check = false;
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  const Global& g = ctx->g;
  auto* evidence = app->add_subcommand(
      "evidence", "A run's evidence record; export it as a bundle, or verify a bundle");
  evidence->add_option("run", a->run_name, "Run name");
  auto format = AddOutput(evidence, ctx);
  auto* eexport = evidence->add_subcommand("export", "Write a run's evidence bundle (.tar.gz)");
  eexport->add_option("run", a->run_name, "Run name")->required();
  eexport->add_option("-f,--file", a->bundle_file, "The bundle file to write")->required();
  eexport->add_flag("--force", a->force, "Replace the file if it exists");
  auto export_format = RefuseFileAsOutput(eexport, ctx);
  eexport->callback([=, &g] {
    if (export_format()) ctx->rc = CmdEvidenceExport(g, a->run_name, a->bundle_file, a->force);
  });
  auto* everify = evidence->add_subcommand(
      "verify", "Check a bundle; exit 0 when intact, 1 naming the first altered or missing item");
  everify->add_option("file", a->bundle_file, "The bundle (.tar.gz)")->required();
  everify->add_flag("--run-check", a->run_check,
                    "Also compare its chain head with the one the server holds for the run");
  everify->callback([=, &g] { ctx->rc = CmdEvidenceVerify(g, a->bundle_file, a->run_check); });
  evidence->callback([=, &g] {
    if (!evidence->get_subcommands().empty()) return;
    if (a->run_name.empty()) {
      ctx->rc = Fail("tau evidence: name a run, or use `export` or `verify`");
      return;
    }
    if (auto f = format()) ctx->rc = CmdEvidence(g, a->run_name, *f);
  });

  struct ArtifactArgs {
    std::string run, path, file;
    bool no_digest = false;
    bool force = false;
    int64_t offset = 0, limit = 1000;
  };
  auto art = std::make_shared<ArtifactArgs>();
  auto* artifacts = app->add_subcommand(
      "artifacts", "A run's checkpoints and outputs: path, size, sha256 (`tau get` fetches one)");
  artifacts->add_option("run", art->run, "Run name")->required();
  artifacts->add_flag("--no-digest", art->no_digest,
                      "Only the digests known already (the run's record, earlier listings): "
                      "read no file");
  artifacts->add_option("--offset", art->offset, "Skip this many files (pages of --limit)")
      ->check(CLI::NonNegativeNumber);
  artifacts->add_option("--limit", art->limit, "At most this many files (1 to 10000)")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  auto art_format = AddOutput(artifacts, ctx);
  artifacts->callback([=, &g] {
    if (auto f = art_format())
      ctx->rc = CmdArtifacts(g, art->run, !art->no_digest, art->offset, art->limit, *f);
  });
  auto* get = app->add_subcommand(
      "get", "Download a checkpoint or output file of a run, or a directory of them");
  get->add_option("run", art->run, "Run name")->required();
  get->add_option("path", art->path,
                  "The file as `tau artifacts` lists it (output/... or checkpoint/...), or a "
                  "directory: every file under it")
      ->required();
  get->add_option("-f,--file", art->file,
                  "Where to write it (default: its name in this directory; - for stdout); for a "
                  "directory, the local directory");
  get->add_flag("--force", art->force, "Replace files that exist");
  auto get_format = RefuseFileAsOutput(get, ctx);
  get->callback([=, &g] {
    if (get_format()) ctx->rc = CmdGet(g, art->run, art->path, art->file, art->force);
  });

  auto* metrics = app->add_subcommand("metrics", "A run's metric history (sparkline and table)");
  metrics->add_option("run", a->run_name, "Run name")->required();
  metrics->add_option("name", a->metric_name, "Metric name (default: a summary of every metric)");
  auto* split_opt = metrics->add_option("--split", a->metric_split, "Only this split");
  metrics->add_option("-o,--output", a->metric_output,
                      "Output format: table, json, yaml or jsonl (default table on a terminal, "
                      "else jsonl)");
  metrics->callback([=, &g] {
    ctx->rc = CmdMetrics(g, a->run_name, a->metric_name, a->metric_split, split_opt->count() > 0,
                         a->metric_output);
  });
  auto cmp = std::make_shared<CompareArgs>();
  auto* compare = app->add_subcommand(
      "compare",
      "Runs side by side: config, code and package differences, metric summaries and curves");
  compare->add_option("runs", cmp->runs, "Two runs or more")->required();
  compare->add_option("--metric", cmp->metric,
                      "Only this metric's series: NAME (every split) or NAME/SPLIT");
  compare->add_flag("--plot", cmp->plot, "Draw the --metric's curves on the terminal");
  auto compare_format = AddOutput(compare, ctx);
  compare->callback([=, &g] {
    if (auto f = compare_format()) ctx->rc = CmdCompare(g, *cmp, *f);
  });
}

}  // namespace tau::cli
