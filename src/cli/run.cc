// `tau run`: validate locally, snapshot the code directory, submit, then follow the run to its end.
#include <dirent.h>
#include <fnmatch.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/code.h"
#include "cli/commands.h"
#include "cli/compare.h"
#include "cli/connect.h"
#include "cli/digest_cache.h"
#include "cli/file_kind.h"
#include "cli/output.h"
#include "cli/sweep.h"
#include "client/tau_api.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/json_text.h"
#include "common/limits.h"
#include "common/strings.h"
#include "spec/spec.h"
#include "spec/workflow.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

// Ctrl-C while following a run detaches; the run goes on in the server.
char g_detach_message[512];
void OnInterrupt(int) {
  (void)!::write(STDERR_FILENO, g_detach_message, std::strlen(g_detach_message));
  ::_exit(130);
}

std::string StatusLine(const api::Run& run) {
  std::string queued = QueuedLine(run);
  return queued.empty() ? run.state : queued;
}

// The manifest of a walked code directory: each file's size and sha256, read in chunks unless the
// digest cache knows the file as it is. A file
// that grew since the walk is held to what is left of the limit.
Result<nlohmann::json> HashCode(const std::string& root, const CodeWalk& code) {
  nlohmann::json manifest = nlohmann::json::array();
  size_t total = 0;
  DigestCache cache = DigestCache::Open(root);
  for (const CodeFile& f : code.files) {
    const std::string path = root + "/" + f.path;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError("cannot read " + path, errno);
    std::string digest = cache.Find(f.path, st);
    size_t size = static_cast<size_t>(st.st_size);
    if (digest.empty()) {
      Sha256 hash;
      size = 0;
      TAU_RETURN_IF_ERROR(ReadFileChunks(path, [&](std::string_view chunk) {
        hash.Update(chunk);
        size += chunk.size();
      }));
      digest = hash.HexDigest();
      if (size == static_cast<size_t>(st.st_size)) cache.Record(f.path, st, digest);
    }
    total += size;
    if (total > kMaxSnapshotBytes)
      return ResourceExhausted(fmt::format(
          "the code directory {} holds more than {} MiB; keep data sets and checkpoints out of it "
          "or list them in .tauignore (gitignore-style patterns)",
          root, kMaxSnapshotBytes >> 20));
    manifest.push_back({{"path", f.path}, {"mode", f.mode}, {"size", size}, {"sha256", digest}});
  }
  cache.Save();
  return manifest;
}

// A code directory as a submission names it: where it is, the spec's folder inside it, its files
// and their manifest (sizes and digests).
struct CodeToSend {
  CodeRoot root;
  CodeWalk walk;
  nlohmann::json manifest;
  std::vector<std::string> excludes;  // the spec's code.exclude, for the inline fallback
};

// Walks and hashes the code directory of `file`'s run: no file is read unless the digest cache
// lacks it, and the limits are checked from the files' sizes first.
Result<CodeToSend> ManifestCode(const std::string& file, const spec::ParseOutcome& parsed,
                                const std::string& code_dir) {
  CodeToSend out;
  TAU_ASSIGN_OR_RETURN(out.root, FindCodeRoot(file, *parsed.spec, code_dir));
  TAU_ASSIGN_OR_RETURN(out.walk, ListCode(out.root.root, parsed.spec->code_excludes));
  for (const std::string& w : out.walk.warnings)
    std::fprintf(stderr, "tau: warning: %s\n", w.c_str());
  TAU_ASSIGN_OR_RETURN(out.manifest, HashCode(out.root.root, out.walk));
  out.excludes = parsed.spec->code_excludes;
  return out;
}

// Uploads the blobs `digests` of `code`, each read again from its file and checked against its
// digest (a file changed since it was hashed is not sent under the old one): how many.
Result<size_t> UploadBlobs(const CodeToSend& code, const std::vector<std::string>& digests,
                           client::Connection* conn) {
  client::TauApi tau(conn);
  std::map<std::string, size_t> by_digest;
  for (size_t i = 0; i < code.manifest.size(); ++i)
    by_digest.emplace(code.manifest[i]["sha256"].get<std::string>(), i);
  for (const std::string& digest : digests) {
    auto at = by_digest.find(digest);
    if (at == by_digest.end())
      return Internal("the server asked for blob " + digest + ", which is not in the manifest");
    const std::string path = code.root.root + "/" + code.walk.files[at->second].path;
    TAU_ASSIGN_OR_RETURN(std::string data, ReadFileAtMost(path, kMaxSnapshotBytes, "a code file"));
    if (Sha256Hex(data) != digest)
      return FailedPrecondition(
          fmt::format("{} changed while tau run read it; run it again", path));
    TAU_RETURN_IF_ERROR(tau.PutBlob(digest, data));
  }
  return digests.size();
}

// Sends the server the blobs of `code` it lacks (none when it holds the snapshot): how many, or
// nullopt when the server predates code upload (it answers the manifest's route with 404).
Result<std::optional<size_t>> UploadCode(const CodeToSend& code, client::Connection* conn) {
  auto missing = client::TauApi(conn).CodeMissing(JsonText({{"files", code.manifest}}));
  if (!missing.ok() && missing.status().code() == StatusCode::kNotFound)
    return std::optional<size_t>();
  if (!missing.ok()) return missing.status();
  TAU_ASSIGN_OR_RETURN(size_t uploaded, UploadBlobs(code, missing->missing, conn));
  return std::optional<size_t>(uploaded);
}

// The `code` member of a submission: the manifest of the uploaded blobs, or (a server older than
// code upload) the files inline, as it reads them.
Result<nlohmann::json> CodeMember(const CodeToSend& code, bool inline_files) {
  nlohmann::json out = {{"dir", code.root.subdir}};
  if (!inline_files) {
    out["manifest"] = code.manifest;
    return out;
  }
  TAU_ASSIGN_OR_RETURN(auto collected,
                       CollectCode(code.root.root, kMaxSnapshotBytes, code.excludes));
  nlohmann::json files = nlohmann::json::array();
  for (const CodeFile& f : collected.files)
    files.push_back({{"path", f.path}, {"mode", f.mode}, {"data", Base64Encode(f.data)}});
  out["files"] = std::move(files);
  return out;
}

constexpr int kTries = 4;

// `call` on the connection, and again on a new one (kTries in all, waiting 1, 2, 4 s between)
// while no answer comes (a timeout, a lost connection): only for calls that are safe to repeat.
// `again` says so before each new try.
template <typename Call>
auto Retrying(const Global& g, std::unique_ptr<client::Connection>* conn, Call call,
              const std::function<void(const Status&, int)>& again) -> decltype(call(nullptr)) {
  auto got = call(conn->get());
  for (int tried = 1;
       tried < kTries && !got.ok() &&
       (got.status().code() == StatusCode::kUnavailable || got.status().code() == StatusCode::kIo);
       ++tried) {
    again(got.status(), tried);
    std::this_thread::sleep_for(std::chrono::seconds(1 << (tried - 1)));
    auto reconnected = ConnectToServer(g.server);
    if (!reconnected.ok()) {
      got = reconnected.status();
      continue;
    }
    *conn = std::move(*reconnected);
    got = call(conn->get());
  }
  return got;
}

}  // namespace

int RunExitStatus(const api::Run& run) {
  if (run.state == "Succeeded") return 0;
  if (run.exit_code && *run.exit_code > 0 && *run.exit_code < 256) return *run.exit_code;
  return kExitInvalid;
}

namespace {

// A code upload is sent again when no answer came, like a submission: blobs are named by their
// content, so a repeat changes nothing.
void UploadAgain(const Status& s, int tried) {
  std::fprintf(stderr,
               "tau: no answer to the code upload (%s); sending it again, which changes nothing "
               "the server has (try %d of %d)\n",
               s.message().c_str(), tried + 1, kTries);
}

// What a submission's `code` member says, its blobs uploaded first: the manifest, or (a server
// older than code upload) the files inline; and the spec's folder inside the code.
Result<nlohmann::json> SubmitCode(const Global& g, const std::string& file,
                                  const spec::ParseOutcome& parsed, const std::string& code_dir,
                                  std::unique_ptr<client::Connection>* conn) {
  TAU_ASSIGN_OR_RETURN(CodeToSend code, ManifestCode(file, parsed, code_dir));
  TAU_ASSIGN_OR_RETURN(*conn, ConnectToServer(g.server));
  TAU_ASSIGN_OR_RETURN(
      std::optional<size_t> uploaded,
      Retrying(
          g, conn, [&](client::Connection* c) { return UploadCode(code, c); }, UploadAgain));
  return CodeMember(code, !uploaded.has_value());
}

// A refusal of the spec (resolution, the backend's checks) is printed at the fields it names.
int SubmitFailed(const std::string& file, const spec::ParseOutcome& parsed, const Status& status) {
  if (status.code() == StatusCode::kInvalidArgument ||
      status.code() == StatusCode::kFailedPrecondition ||
      status.code() == StatusCode::kPermissionDenied) {
    std::fprintf(stderr, "%s\n", LocatedErrors(file, parsed, status.message()).c_str());
    return kExitTauError;  // as before: the run never existed
  }
  return Fail(status.message());
}

// A spec read for `tau run`: TARGET resolved to its file, the --set overrides parsed and applied.
struct ReadRun {
  std::string file, text;
  std::optional<spec::ParseOutcome> parsed;
  // The "spec" member of a submission: the file's name and text, and the --set texts.
  nlohmann::json SpecJson(const RunOptions& o) const {
    nlohmann::json out = {{"file", file}, {"yaml", text}};
    if (!o.set.empty()) out["set"] = o.set;
    return out;
  }
};

// Everything `tau run` checks before it reads any code: nullopt, with `*rc` set and the reason
// printed, when the target names no spec, a --set is malformed or the spec is not valid with them.
std::optional<ReadRun> ReadForRun(const RunOptions& o, int* rc) {
  auto overrides = ParseSetOption(o.set, rc);
  if (!overrides) return std::nullopt;
  auto file = ResolveSpecTarget(o.target, o.code_dir);
  if (!file.ok()) {
    *rc = Fail(file.status().message());
    return std::nullopt;
  }
  ReadRun out;
  out.file = *file;
  out.parsed = ReadSpecFile(out.file, &out.text, rc, *overrides);
  if (!out.parsed) return std::nullopt;
  return out;
}

// A server older than --set takes the submission without its "set": the run it made has the
// file's settings, which its config hash tells.
void WarnIfSetIgnored(const RunOptions& o, const spec::ParseOutcome& parsed, const api::Run& run) {
  if (o.set.empty() || run.config_hash.empty()) return;
  const std::string want = spec::ConfigHash(*parsed.spec);
  if (run.config_hash == want) return;
  std::fprintf(stderr,
               "tau: warning: run %s has config hash %.12s, not %.12s as --set gives here: the "
               "server may be older than --set and have run the file without it (see tau "
               "describe %s)\n",
               run.name.c_str(), run.config_hash.c_str(), want.c_str(), run.name.c_str());
}

// A batch submission, sent again while no answer comes, under one key for every try: a try the
// server got but did not answer made the runs, and the next try gets those runs back instead of
// a second `what` ("array").
Result<api::SubmittedBatch> SubmitBatchOnce(const Global& g,
                                            std::unique_ptr<client::Connection>* conn,
                                            const std::string& request, const char* what) {
  const std::string key = RandomHex(32);
  return Retrying(
      g, conn, [&](client::Connection* c) { return client::TauApi(c).SubmitBatch(request, key); },
      [&](const Status& s, int tried) {
        std::fprintf(stderr,
                     "tau: no answer to the submission (%s); sending it again with the same key, "
                     "which never makes a second %s (try %d of %d)\n",
                     s.message().c_str(), what, tried + 1, kTries);
      });
}

// What a waiting command is told of its runs: first as submitted (every index), then after each
// look at them, the runs as they are now and the indexes of those whose state changed (maybe
// none: what it prints is its to tell apart).
using WaitProgress =
    std::function<void(const std::vector<api::Run>& runs, const std::vector<size_t>& changed)>;

// Waits for every run to end, saying so of each that does not succeed, and leaves each of `runs`
// as it ended; the first unsuccessful one's exit status (0 when all succeeded), with how many did
// not succeed in `*failed`. `progress`, when given, is told of each change of state.
int WaitForRuns(client::Connection* conn, std::vector<api::Run>* runs, size_t* failed,
                const WaitProgress& progress = nullptr) {
  std::vector<size_t> waiting;
  for (size_t i = 0; i < runs->size(); ++i) waiting.push_back(i);
  *failed = 0;
  int status = 0;
  // The states the submission answered with are the first said.
  std::vector<std::string> seen;
  for (const api::Run& r : *runs) seen.push_back(r.state);
  if (progress && !runs->empty()) {
    progress(*runs, waiting);
    std::fflush(stderr);
  }
  while (!waiting.empty()) {
    std::vector<size_t> still, changed;
    for (size_t i : waiting) {
      auto now = client::TauApi(conn).GetRun((*runs)[i].name);
      if (!now.ok()) return Fail(now.status().message());
      api::Run& run = (*runs)[i] = std::move(now->run);
      if (run.state != seen[i]) changed.push_back(i);
      seen[i] = run.state;
      if (!run.IsTerminal()) {
        still.push_back(i);
        continue;
      }
      if (run.state != "Succeeded") {
        ++*failed;
        if (status == 0) status = RunExitStatus(run);
        std::fprintf(stderr, "tau: run %s %s (%s): %s\n", run.name.c_str(),
                     run.state == "Cancelled" ? "was cancelled" : "failed", run.reason.c_str(),
                     run.message.c_str());
      }
    }
    if (progress) {
      progress(*runs, changed);
      std::fflush(stderr);
    }
    waiting = std::move(still);
    if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return status;
}

// "3/8 runs done, 2 running": where a set of runs stands.
std::string RunsProgress(const std::vector<api::Run>& runs, const char* noun) {
  size_t done = 0, running = 0;
  for (const api::Run& r : runs) {
    if (r.IsTerminal()) ++done;
    if (r.state == "Running") ++running;
  }
  return fmt::format("{}/{} {} done, {} running", done, runs.size(), noun, running);
}

}  // namespace

Result<ArrayRange> ParseArrayRange(const std::string& text) {
  auto refuse = [&](const std::string& why) {
    return InvalidArgument(fmt::format(
        "--array {}: {}; give FIRST-LAST[:STEP][%MAX_PARALLEL], such as 0-99, 0-98:2 or 0-99%4 "
        "(at most {} runs)",
        text.empty() ? "''" : "'" + text + "'", why, kMaxArrayRuns));
  };
  // Digits only, at most 9 of them: no signs, spaces or overflow.
  auto number = [](std::string_view digits, int64_t* out) {
    if (digits.empty() || digits.size() > 9) return false;
    int64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    *out = v;
    return true;
  };
  std::string_view rest = text;
  ArrayRange r;
  const size_t percent = rest.find('%');
  if (percent != std::string_view::npos) {
    int64_t max = 0;
    if (!number(rest.substr(percent + 1), &max))
      return refuse("%MAX_PARALLEL is not a whole number");
    if (max < 1) return refuse("%MAX_PARALLEL must be at least 1");
    r.max_parallel = max;
    rest = rest.substr(0, percent);
  }
  const size_t colon = rest.find(':');
  if (colon != std::string_view::npos) {
    if (!number(rest.substr(colon + 1), &r.step)) return refuse("the step is not a whole number");
    if (r.step < 1) return refuse("the step must be at least 1");
    rest = rest.substr(0, colon);
  }
  const size_t dash = rest.find('-');
  if (dash == std::string_view::npos) return refuse("it is not a range");
  if (!number(rest.substr(0, dash), &r.first) || !number(rest.substr(dash + 1), &r.last))
    return refuse("its ends are not whole numbers");
  if (r.last < r.first) return refuse("it is reversed (the last index is below the first)");
  const int64_t count = (r.last - r.first) / r.step + 1;
  if (count > kMaxArrayRuns) return refuse(fmt::format("it makes {} runs", count));
  return r;
}

std::optional<std::pair<std::string, std::string>> WorkflowTarget(const RunOptions& o);

int CmdRunArray(const Global& g, const RunOptions& o, const std::string& range_text) {
  if (WorkflowTarget(o))
    return Fail("--array: " + o.target + " is a workflow file; an array is many runs of one spec");
  const bool detach = o.detach;
  // The range is checked before the spec is read or anything is sent.
  auto range = ParseArrayRange(range_text);
  if (!range.ok()) return Fail(range.status().message());
  int rc = 0;
  std::optional<ReadRun> read = ReadForRun(o, &rc);
  if (!read) return rc;
  const std::string& file = read->file;
  const spec::ParseOutcome& parsed = *read->parsed;
  std::unique_ptr<client::Connection> conn;
  auto code = SubmitCode(g, file, parsed, o.code_dir, &conn);
  if (!code.ok()) return Fail(code.status().message());
  // One code for every run: the server checks and snapshots it once.
  nlohmann::json runs = nlohmann::json::array();
  const nlohmann::json spec = read->SpecJson(o);
  for (int64_t i = range->first; i <= range->last; i += range->step)
    runs.push_back({{"spec", spec}, {"code", 0}, {"array_index", i}});
  nlohmann::json place = {{"first", range->first}, {"last", range->last}, {"step", range->step}};
  if (range->max_parallel) place["max_parallel"] = *range->max_parallel;
  const std::string request = JsonText({{"codes", nlohmann::json::array({std::move(*code)})},
                                        {"runs", std::move(runs)},
                                        {"array", std::move(place)}});
  auto submitted = SubmitBatchOnce(g, &conn, request, "array");
  if (!submitted.ok()) return SubmitFailed(file, parsed, submitted.status());
  std::vector<api::Run>& made = submitted->runs;
  if (!made.empty()) WarnIfSetIgnored(o, parsed, made[0]);
  if (detach) {
    std::string names;
    for (const api::Run& r : made) (names += r.name) += '\n';
    std::fputs(names.c_str(), stdout);
    return 0;
  }
  const std::string array = made.empty() || !made[0].array ? "" : made[0].array->name;
  std::fprintf(stderr, "tau: array %s submitted: %zu runs (%s-INDEX)\n", array.c_str(), made.size(),
               array.c_str());
  std::snprintf(g_detach_message, sizeof g_detach_message,
                "\ntau: detached; the runs of array %s go on without this terminal. See them: tau "
                "list\n",
                array.c_str());
  ::signal(SIGINT, OnInterrupt);
  size_t failed = 0;
  std::string said;
  const int status =
      WaitForRuns(conn.get(), &made, &failed,
                  [&](const std::vector<api::Run>& runs, const std::vector<size_t>&) {
                    std::string line = RunsProgress(runs, "runs");
                    if (line != said)
                      std::fprintf(stderr, "tau: array %s: %s\n", array.c_str(), line.c_str());
                    said = std::move(line);
                  });
  std::fprintf(stderr, "tau: array %s: %zu of %zu runs succeeded\n", array.c_str(),
               made.size() - failed, made.size());
  return status;
}

namespace {

// The objective's value in a run: the last point of the series ObjectiveSplit picks. `splits`
// gets the splits the run logged the metric with.
std::optional<double> ObjectiveOf(client::TauApi& api, const std::string& run,
                                  const SweepFile& sweep, std::vector<std::string>* splits) {
  splits->clear();
  auto jsonl = api.GetMetricsJsonl(run, sweep.metric, std::nullopt);
  if (!jsonl.ok()) return std::nullopt;
  evidence::MetricHistory history;
  history.AddJsonl(*jsonl);
  std::optional<std::string> split = ObjectiveSplit(history.SeriesKeys(), sweep, splits);
  if (!split) return std::nullopt;
  SeriesStats stats = StatsOf(history.Series(sweep.metric, *split));
  if (stats.count == 0) return std::nullopt;
  return stats.last;
}

// The sweep's runs, as they ended, as a table, best first by the objective (runs without it last),
// each with the values of its point. False, after saying why, when no run has a value of the
// objective: a table of '-' would hide a misnamed metric or split.
bool PrintSweep(client::TauApi& api, const SweepFile& sweep, const std::vector<api::Run>& made,
                const std::vector<std::vector<spec::Override>>& points) {
  struct Row {
    std::vector<std::string> cells;
    std::optional<double> objective;
  };
  std::vector<Row> rows;
  std::set<std::string> splits_found;
  auto read = [&](size_t i) {
    std::vector<std::string> splits;
    rows[i].objective = ObjectiveOf(api, made[i].name, sweep, &splits);
    splits_found.insert(splits.begin(), splits.end());
    // The metric is there but no split fits: waiting longer will not change that.
    return rows[i].objective.has_value() || !splits.empty();
  };
  for (size_t i = 0; i < made.size(); ++i) {
    Row row;
    row.cells = {made[i].name, made[i].state};
    for (const spec::Override& o : points[i]) row.cells.push_back(o.value);
    rows.push_back(std::move(row));
  }
  std::vector<bool> settled(rows.size(), false);
  if (!sweep.metric.empty())
    for (size_t i = 0; i < rows.size(); ++i) settled[i] = read(i);
  // A run's last points are read just after it ends: a run that has none yet gets a few seconds.
  const int64_t until = MonotonicMillis() + 5'000;
  for (bool missing = !sweep.metric.empty(); missing && MonotonicMillis() < until;) {
    missing = false;
    for (size_t i = 0; i < rows.size(); ++i)
      if (!settled[i] && rows[i].cells[1] == "Succeeded") {
        settled[i] = read(i);
        missing |= !settled[i];
      }
    if (missing) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!sweep.metric.empty())
    for (Row& row : rows)
      row.cells.push_back(row.objective ? fmt::format("{:.6g}", *row.objective) : "-");
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (!a.objective || !b.objective) return a.objective.has_value() && !b.objective;
    return sweep.maximize ? *a.objective > *b.objective : *a.objective < *b.objective;
  });
  std::vector<std::string> head = {"RUN", "STATE"};
  for (const SweepParameter& p : sweep.parameters) head.push_back(p.path);
  if (!sweep.metric.empty())
    head.push_back(fmt::format("{}{} ({})", sweep.metric,
                               sweep.split.empty() ? "" : "/" + sweep.split,
                               sweep.maximize ? "max" : "min"));
  const bool none =
      !sweep.metric.empty() && !rows.empty() &&
      std::none_of(rows.begin(), rows.end(), [](const Row& r) { return r.objective.has_value(); });
  std::vector<std::vector<std::string>> table;
  for (Row& r : rows) table.push_back(std::move(r.cells));
  PrintTable(head, table);
  if (none) {
    std::fprintf(
        stderr, "tau: error: %s\n",
        ObjectiveProblem(sweep, {splits_found.begin(), splits_found.end()}, made.size()).c_str());
    return false;
  }
  return true;
}

// A spec path named in a file beside it (a sweep's or a workflow's): a TARGET (tau/NAME.yaml of
// the repository), or a file relative to that file's folder.
Result<std::string> ResolveBeside(const std::string& beside, const std::string& target,
                                  const std::string& code_dir) {
  std::string t = target;
  const bool is_file =
      t.find('/') != std::string::npos || EndsWith(t, ".yaml") || EndsWith(t, ".yml");
  if (is_file && t[0] != '/') t = (fs::path(beside).parent_path() / t).lexically_normal().string();
  std::error_code ec;
  if (is_file && !fs::is_regular_file(t, ec))
    return NotFound(fmt::format(
        "'{}': {} ({} names a file relative to its own folder, or a TARGET: tau/NAME.yaml of the "
        "repository); name a spec file that exists",
        target, fs::exists(t, ec) ? t + " is not a file" : "no file " + t, beside));
  return ResolveSpecTarget(t, code_dir);
}

// The spec's errors about a value an override gave are named "--set PATH=VALUE"; where a sweep or
// workflow file wrote that value (origins[k], "FILE:LINE:COL", of overrides[k]), they name that
// place instead. Whether any error is at one of them.
bool AtOrigins(spec::ParseOutcome* parsed, const std::vector<spec::Override>& overrides,
               const std::vector<std::string>& origins) {
  bool moved = false;
  for (spec::Diagnostic& d : parsed->diagnostics) {
    if (d.line != 0) continue;
    for (size_t k = 0; k < overrides.size() && k < origins.size(); ++k)
      if (d.file == "--set " + overrides[k].Text()) {
        d.file = origins[k];
        moved = moved || !d.warning;
        break;
      }
  }
  return moved;
}

}  // namespace

std::optional<SweepSpec> CheckSweepPoints(const std::string& file, const SweepFile& sweep,
                                          const std::string& code_dir,
                                          std::vector<spec::Diagnostic>* diagnostics) {
  // The spec: a TARGET (tau/NAME.yaml of the repository), or a file beside the sweep file.
  auto resolved = ResolveBeside(file, sweep.spec, code_dir);
  auto text = resolved.ok() ? ReadFileAtMost(*resolved, spec::kMaxSpecBytes, "a spec")
                            : Result<std::string>(resolved.status());
  if (!text.ok()) {
    diagnostics->push_back(
        {file, sweep.spec_line, sweep.spec_column, "spec: " + text.status().message(), false});
    return std::nullopt;
  }
  SweepSpec out{*resolved, std::move(*text), {}};
  out.base = spec::ParseSpec(out.text, out.file);
  for (const spec::Diagnostic& d : out.base.diagnostics) diagnostics->push_back(d);
  if (!out.base.ok()) {
    const FileKindGuess guess = GuessFileKind(out.text);
    diagnostics->push_back({file, sweep.spec_line, sweep.spec_column,
                            guess.kind != FileKind::kRunSpec && guess.kind != FileKind::kUnknown
                                ? fmt::format("spec: {} is {}, not a run spec", out.file,
                                              WithArticle(FileKindName(guess.kind)))
                                : fmt::format("spec: {} cannot be used (above)", out.file),
                            false});
    return std::nullopt;
  }
  // Every point as `tau run --set` would check it.
  std::vector<std::vector<std::string>> origins;
  std::vector<std::vector<spec::Override>> points = SweepPoints(sweep, &origins);
  for (size_t i = 0; i < points.size(); ++i) {
    spec::ParseOutcome parsed = spec::ParseSpec(out.text, out.file, points[i]);
    AtOrigins(&parsed, points[i], origins[i]);
    if (parsed.ok()) continue;
    std::vector<std::string> texts;
    for (const spec::Override& v : points[i]) texts.push_back(v.Text());
    for (const spec::Diagnostic& d : parsed.diagnostics)
      if (!d.warning) diagnostics->push_back(d);
    diagnostics->push_back({file, 0, 0,
                            fmt::format("point {} of {} ({}) cannot be used (above)", i + 1,
                                        points.size(), Join(texts, ", ")),
                            false});
    return std::nullopt;
  }
  return out;
}

int CmdSweep(const Global& g, const SweepOptions& o) {
  auto text = ReadFileAtMost(o.file, spec::kMaxSpecBytes, "a sweep file");
  if (!text.ok()) return Fail(text.status().message());
  auto sweep = ParseSweep(*text, o.file);
  if (!sweep.ok()) {
    std::fprintf(stderr, "%s\n", sweep.status().message().c_str());
    return kExitInvalid;
  }
  // The spec, and each point with it, checked before anything is sent.
  std::vector<spec::Diagnostic> diagnostics;
  auto checked = CheckSweepPoints(o.file, *sweep, o.code_dir, &diagnostics);
  for (const spec::Diagnostic& d : diagnostics) std::fprintf(stderr, "%s\n", d.ToString().c_str());
  if (!checked) return kExitInvalid;
  const std::string* file = &checked->file;
  const std::string& spec_text = checked->text;
  const spec::ParseOutcome* base = &checked->base;
  const std::string group =
      sweep->group.empty() ? base->spec->name + "-sweep-" + RandomHex(4) : sweep->group;
  // Each point was checked with the spec above; the group (the file's value, or made here) is
  // checked once, as every point's run gets it.
  const spec::Override in_group{"experiment.group", group};
  spec::ParseOutcome grouped = spec::ParseSpec(spec_text, *file, {in_group});
  if (!grouped.ok()) {
    std::fprintf(stderr, "%s: group '%s':\n%s\n", o.file.c_str(), group.c_str(),
                 grouped.ErrorText().c_str());
    return kExitInvalid;
  }
  const std::vector<std::vector<spec::Override>> points = SweepPoints(*sweep);
  nlohmann::json runs = nlohmann::json::array();
  for (const std::vector<spec::Override>& point : points) {
    nlohmann::json set = nlohmann::json::array();
    for (const spec::Override& v : point) set.push_back(v.Text());
    set.push_back(in_group.Text());
    runs.push_back({{"spec", {{"file", *file}, {"yaml", spec_text}, {"set", std::move(set)}}},
                    {"code", 0},
                    {"array_index", runs.size()}});
  }
  std::unique_ptr<client::Connection> conn;
  auto code = SubmitCode(g, *file, *base, o.code_dir, &conn);
  if (!code.ok()) return Fail(code.status().message());
  // One array, point i its run i (TAU_ARRAY_INDEX), so that max_parallel holds the rest back.
  nlohmann::json array = {{"first", 0}, {"last", points.size() - 1}, {"step", 1}};
  if (sweep->max_parallel > 0) array["max_parallel"] = sweep->max_parallel;
  const std::string request = JsonText({{"codes", nlohmann::json::array({std::move(*code)})},
                                        {"runs", std::move(runs)},
                                        {"array", std::move(array)}});
  auto submitted = SubmitBatchOnce(g, &conn, request, "sweep");
  if (!submitted.ok()) return SubmitFailed(*file, *base, submitted.status());
  std::vector<api::Run>& made = submitted->runs;
  if (o.detach) {
    for (const api::Run& r : made) std::puts(r.name.c_str());
    return 0;
  }
  std::fprintf(stderr, "tau: sweep %s submitted: %zu runs in group %s (tau list --group %s)\n",
               o.file.c_str(), made.size(), group.c_str(), group.c_str());
  std::snprintf(g_detach_message, sizeof g_detach_message,
                "\ntau: detached; the sweep's runs go on without this terminal. See them: tau "
                "list --group %s\n",
                group.c_str());
  ::signal(SIGINT, OnInterrupt);
  size_t failed = 0;
  // A line when the count of ended or running points changes, or a better point ends: the
  // objective of each point is read once, when it has succeeded.
  std::string said;
  std::optional<double> best;
  size_t best_point = 0;
  // Tries left to read each point's objective: its last points are read just after it ends, so a
  // point that succeeded gets a few looks (as PrintSweep gives it), then none.
  std::vector<int> tries(made.size(), 20);
  client::TauApi api(conn.get());
  auto progress = [&](const std::vector<api::Run>& runs, const std::vector<size_t>&) {
    for (size_t i = 0; i < runs.size(); ++i) {
      if (sweep->metric.empty() || runs[i].state != "Succeeded" || tries[i] <= 0) continue;
      std::vector<std::string> splits;
      std::optional<double> value = ObjectiveOf(api, runs[i].name, *sweep, &splits);
      tries[i] = value || !splits.empty() ? 0 : tries[i] - 1;
      if (value && (!best || (sweep->maximize ? *value > *best : *value < *best))) {
        best = value;
        best_point = i + 1;
      }
    }
    std::string line = RunsProgress(runs, "points");
    if (best)
      line += fmt::format(", best so far {}={:.6g} (point {})", sweep->metric, *best, best_point);
    if (line != said) std::fprintf(stderr, "tau: sweep: %s\n", line.c_str());
    said = std::move(line);
  };
  const int status =
      WaitForRuns(conn.get(), &made, &failed, o.quiet ? WaitProgress() : WaitProgress(progress));
  // The last points to end: their objectives are read before the last line is said again.
  auto unread = [&] {
    for (size_t i = 0; i < made.size(); ++i)
      if (made[i].state == "Succeeded" && tries[i] > 0) return true;
    return false;
  };
  for (int round = 0; !o.quiet && !sweep->metric.empty() && round < 20 && unread(); ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    progress(made, {});
  }
  const bool ranked = PrintSweep(api, *sweep, made, points);
  std::fprintf(stderr, "tau: sweep %s: %zu of %zu runs succeeded\n", o.file.c_str(),
               made.size() - failed, made.size());
  return status != 0 ? status : ranked ? 0 : kExitInvalid;
}

std::optional<std::vector<StageSpec>> CheckWorkflowStages(
    const std::string& file, const spec::WorkflowFile& workflow,
    const std::vector<spec::StagePlaces>& places, const std::string& code_dir,
    std::vector<spec::Diagnostic>* diagnostics) {
  std::vector<StageSpec> stages;
  bool valid = true;
  for (size_t i = 0; i < workflow.stages.size() && i < places.size(); ++i) {
    const spec::WorkflowStage& st = workflow.stages[i];
    const spec::StagePlaces& at = places[i];
    auto error = [&](int line, int column, std::string message) {
      diagnostics->push_back({file, line, column, std::move(message), false});
      valid = false;
    };
    auto resolved = ResolveBeside(file, st.spec, code_dir);
    if (!resolved.ok()) {
      error(at.spec_line, at.spec_column,
            fmt::format("stage '{}': spec: {}", st.name, resolved.status().message()));
      continue;
    }
    // Checked by ParseWorkflow; each value's errors name its place in the workflow file.
    auto overrides = spec::ParseOverrides(st.set);
    if (!overrides.ok()) {
      error(st.line, st.column,
            fmt::format("stage '{}': set: {}", st.name, overrides.status().message()));
      continue;
    }
    StageSpec s;
    s.file = *resolved;
    auto text = ReadFileAtMost(s.file, spec::kMaxSpecBytes, "a spec");
    if (!text.ok()) {
      error(at.spec_line, at.spec_column,
            fmt::format("stage '{}': spec: {}", st.name, text.status().message()));
      continue;
    }
    s.text = std::move(*text);
    s.parsed = spec::ParseSpec(s.text, s.file, *overrides);
    AtOrigins(&s.parsed, *overrides, at.set_origins);
    for (const spec::Diagnostic& d : s.parsed.diagnostics) diagnostics->push_back(d);
    if (!s.parsed.ok()) {
      const FileKindGuess guess = GuessFileKind(s.text);
      error(st.line, st.column,
            guess.kind != FileKind::kRunSpec && guess.kind != FileKind::kUnknown
                ? fmt::format("stage '{}': its spec {} is {}, not a run spec", st.name, s.file,
                              WithArticle(FileKindName(guess.kind)))
                : fmt::format("stage '{}': its spec {} cannot be used{} (above)", st.name, s.file,
                              st.set.empty() ? "" : " with its set"));
      continue;
    }
    stages.push_back(std::move(s));
  }
  if (!valid) return std::nullopt;
  return stages;
}

// `tau run workflow.yaml`: each stage a run of its own, submitted together in one batch; the
// server holds each stage until the stages it waits for have ended.
int CmdRunWorkflow(const Global& g, const RunOptions& o, const std::string& file,
                   const std::string& text) {
  if (!o.set.empty())
    return Fail(
        "--set: a workflow's stages take their fields in the workflow file (each stage's "
        "`set:`), not from the command line");
  std::vector<spec::StagePlaces> places;
  auto workflow = spec::ParseWorkflow(text, file, &places);
  if (!workflow.ok()) {
    std::fprintf(stderr, "%s\n", workflow.status().message().c_str());
    return kExitInvalid;
  }
  // Every stage is read and checked, with its overrides, before anything is sent.
  std::vector<spec::Diagnostic> diagnostics;
  auto stages = CheckWorkflowStages(file, *workflow, places, o.code_dir, &diagnostics);
  for (const spec::Diagnostic& d : diagnostics) std::fprintf(stderr, "%s\n", d.ToString().c_str());
  if (!stages) return kExitInvalid;
  std::unique_ptr<client::Connection> conn;
  nlohmann::json codes = nlohmann::json::array();
  nlohmann::json runs = nlohmann::json::array();
  for (size_t i = 0; i < stages->size(); ++i) {
    const spec::WorkflowStage& st = workflow->stages[i];
    auto code = SubmitCode(g, (*stages)[i].file, (*stages)[i].parsed, o.code_dir, &conn);
    if (!code.ok()) return Fail(fmt::format("stage '{}': {}", st.name, code.status().message()));
    // Stages of one code directory share one snapshot.
    size_t index = 0;
    while (index < codes.size() && codes[index] != *code) ++index;
    if (index == codes.size()) codes.push_back(std::move(*code));
    nlohmann::json after = nlohmann::json::array();
    for (const spec::StageDependency& d : st.after)
      after.push_back({{"stage", d.stage}, {"condition", spec::ConditionName(d.condition)}});
    nlohmann::json spec = {{"file", (*stages)[i].file}, {"yaml", (*stages)[i].text}};
    if (!st.set.empty()) spec["set"] = st.set;
    runs.push_back({{"spec", std::move(spec)},
                    {"code", index},
                    {"stage", st.name},
                    {"after", std::move(after)}});
  }
  const std::string request = JsonText(
      {{"codes", std::move(codes)}, {"runs", std::move(runs)}, {"workflow", workflow->name}});
  auto submitted = SubmitBatchOnce(g, &conn, request, "workflow");
  if (!submitted.ok()) {
    // A refusal names the stage at fault (its index) when it is one stage's.
    return Fail(fmt::format("{}: {}", file, submitted.status().message()));
  }
  std::vector<api::Run>& made = submitted->runs;
  if (o.detach) {
    for (const api::Run& r : made) std::puts(r.name.c_str());
    return 0;
  }
  const std::string name = made.empty() || !made[0].workflow ? "" : made[0].workflow->name;
  std::fprintf(stderr, "tau: workflow %s submitted: %zu stages (tau workflow status %s)\n",
               name.c_str(), made.size(), name.c_str());
  std::snprintf(g_detach_message, sizeof g_detach_message,
                "\ntau: detached; workflow %s goes on without this terminal. See it: tau "
                "workflow status %s\n",
                name.c_str(), name.c_str());
  ::signal(SIGINT, OnInterrupt);
  size_t failed = 0;
  // A line as each stage's run changes state; the table and the count when all have ended.
  const int status = WaitForRuns(
      conn.get(), &made, &failed,
      [&](const std::vector<api::Run>& runs, const std::vector<size_t>& changed) {
        for (size_t i : changed) {
          const api::Run& r = runs[i];
          const bool why = r.IsTerminal() && r.state != "Succeeded" && !r.reason.empty();
          std::fprintf(stderr, "tau: stage %s (%s): %s%s\n",
                       r.workflow ? r.workflow->stage.c_str() : "", r.name.c_str(), r.state.c_str(),
                       why ? (" (" + r.reason + ")").c_str() : "");
        }
      });
  PrintStages(made);
  std::fprintf(stderr, "tau: workflow %s: %zu of %zu stages succeeded\n", name.c_str(),
               made.size() - failed, made.size());
  return status;
}

// The workflow file `tau run` was given, when it was given one: its path and text.
std::optional<std::pair<std::string, std::string>> WorkflowTarget(const RunOptions& o) {
  auto file = ResolveSpecTarget(o.target, o.code_dir);
  if (!file.ok()) return std::nullopt;  // said by the spec's own path
  auto text = ReadFileAtMost(*file, spec::kMaxSpecBytes, "a spec");
  if (!text.ok() || !spec::IsWorkflowText(*text)) return std::nullopt;
  return std::make_pair(*file, *text);
}

namespace {

// Submits a run with its code's manifest, before any upload: unchanged code is one request. When
// the server lacks blobs it names them, and they are uploaded and the run submitted again. A
// refusal that names none may be an older server's: it is asked which blobs it lacks (or, older
// still, sent the files inline), and the refusal stands when nothing was missing.
Result<api::Submitted> SubmitRun(const Global& g, std::unique_ptr<client::Connection>* conn,
                                 const nlohmann::json& spec, const CodeToSend& code) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json code_member, CodeMember(code, false));
  std::string request = JsonText({{"spec", spec}, {"code", code_member}});
  // One key for every try of this submission: a try the server got but did not answer (a timeout,
  // a lost connection) made the run, and the next try gets that run back instead of a second one.
  const std::string key = RandomHex(32);
  std::vector<std::string> missing;
  auto submit = [&] {
    return Retrying(
        g, conn,
        [&](client::Connection* c) { return client::TauApi(c).Submit(request, key, &missing); },
        [](const Status& s, int tried) {
          std::fprintf(stderr,
                       "tau: no answer to the submission (%s); sending it again with the same "
                       "key, which never makes a second run (try %d of %d)\n",
                       s.message().c_str(), tried + 1, kTries);
        });
  };
  auto submitted = submit();
  if (submitted.ok()) return submitted;
  const StatusCode refused = submitted.status().code();
  if (refused != StatusCode::kFailedPrecondition && refused != StatusCode::kInvalidArgument)
    return submitted;
  if (!missing.empty()) {
    TAU_RETURN_IF_ERROR(Retrying(
                            g, conn,
                            [&](client::Connection* c) { return UploadBlobs(code, missing, c); },
                            UploadAgain)
                            .status());
    return submit();
  }
  TAU_ASSIGN_OR_RETURN(
      std::optional<size_t> uploaded,
      Retrying(
          g, conn, [&](client::Connection* c) { return UploadCode(code, c); }, UploadAgain));
  if (uploaded && *uploaded == 0) return submitted;  // the code was there: the refusal stands
  if (!uploaded) {
    TAU_ASSIGN_OR_RETURN(code_member, CodeMember(code, true));
    request = JsonText({{"spec", spec}, {"code", code_member}});
  }
  return submit();
}

}  // namespace

std::optional<SubmissionSpec> SubmissionBody(const Global& g, const RunOptions& o,
                                             std::unique_ptr<client::Connection>* conn, int* rc) {
  std::optional<ReadRun> read = ReadForRun(o, rc);
  if (!read) return std::nullopt;
  auto code = SubmitCode(g, read->file, *read->parsed, o.code_dir, conn);
  if (!code.ok()) {
    *rc = Fail(code.status().message());
    return std::nullopt;
  }
  SubmissionSpec out;
  out.body = {{"spec", read->SpecJson(o)}, {"code", std::move(*code)}};
  out.file = read->file;
  out.parsed = std::move(*read->parsed);
  return out;
}

int SubmissionFailed(const SubmissionSpec& spec, const Status& status) {
  return SubmitFailed(spec.file, spec.parsed, status);
}

int CmdRun(const Global& g, const RunOptions& o) {
  if (auto workflow = WorkflowTarget(o))
    return CmdRunWorkflow(g, o, workflow->first, workflow->second);
  const bool detach = o.detach;
  int rc = 0;
  std::optional<ReadRun> read = ReadForRun(o, &rc);
  if (!read) return rc;
  const std::string& file = read->file;
  const spec::ParseOutcome& parsed = *read->parsed;
  if (parsed.spec->serve)
    return Fail(fmt::format("{} is a service (kind: service): deploy it with `tau serve deploy {}`",
                            file, file));
  auto code = ManifestCode(file, parsed, o.code_dir);
  // An entrypoint that leaves the code is named at its line.
  if (!code.ok()) return SubmitFailed(file, parsed, code.status());
  auto connected = ConnectToServer(g.server);
  if (!connected.ok()) return Fail(connected.status().message());
  std::unique_ptr<client::Connection> owned = std::move(*connected);
  auto* conn = &owned;
  auto submitted = SubmitRun(g, conn, read->SpecJson(o), *code);
  if (!submitted.ok()) return SubmitFailed(file, parsed, submitted.status());
  client::TauApi tau(conn->get());
  api::Run run = std::move(submitted->run);
  WarnIfSetIgnored(o, parsed, run);
  std::string name = run.name;
  if (detach) {
    std::puts(name.c_str());
    return 0;
  }
  bool tty = StderrIsTerminal();
  std::fprintf(stderr, "tau: run %s submitted\n", name.c_str());
  std::snprintf(
      g_detach_message, sizeof g_detach_message,
      "\ntau: detached; run %s goes on without this terminal. Follow it: tau logs -f %s   "
      "Stop it: tau cancel %s\n",
      name.c_str(), name.c_str(), name.c_str());
  ::signal(SIGINT, OnInterrupt);
  // While it waits for admission, show where it stands: one line kept up to date on a terminal,
  // a line per change (of its place or reason code) otherwise.
  std::string last_line, last_key;
  int64_t started = MonotonicMillis();
  while (true) {
    auto now = tau.GetRun(name);
    if (!now.ok()) return Fail(now.status().message());
    run = std::move(now->run);
    if (run.state != "Queued" && run.state != "Admitted") break;
    std::string line = StatusLine(run);
    if (tty && line != last_line) {
      std::fprintf(stderr, "\r\033[Ktau: %s", line.c_str());
      last_line = line;
    }
    std::string key = QueuedKey(run);
    if (!tty && !key.empty() && key != last_key) std::fprintf(stderr, "tau: %s\n", line.c_str());
    last_key = key;
    int64_t waited = MonotonicMillis() - started;
    std::this_thread::sleep_for(std::chrono::milliseconds(waited < 1000 ? 20 : 250));
  }
  if (tty && !last_line.empty()) std::fprintf(stderr, "\r\033[K");
  client::LogQuery follow;
  follow.follow = true;
  auto streamed = FollowLog(g.server, &*conn, name, follow, /*since_submitted=*/true);
  if (!streamed.ok()) return Fail("lost the log stream: " + streamed.status().message());
  // The stream ends when the run does; the final state may take a moment to be recorded.
  for (int i = 0; i < 600; ++i) {
    auto now = client::TauApi(conn->get()).GetRun(name);  // FollowLog may have reconnected
    if (!now.ok()) return Fail(now.status().message());
    run = std::move(now->run);
    if (run.IsTerminal()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string& state = run.state;
  const std::string& detail = run.message;
  if (state == "Succeeded") {
    std::fprintf(stderr, "tau: run %s succeeded\n", name.c_str());
  } else {
    std::fprintf(stderr, "tau: run %s %s (%s): %s\n", name.c_str(),
                 state == "Cancelled" ? "was cancelled" : "failed", run.reason.c_str(),
                 detail.c_str());
    std::fprintf(stderr, "tau: details: tau describe %s\n", name.c_str());
    // Only rank 0's output was streamed here; the rank that failed may be another.
    if (run.Workers() > 1)
      std::fprintf(stderr,
                   "tau: this terminal showed rank 0; each rank's log: tau logs %s --rank R\n",
                   name.c_str());
  }
  return RunExitStatus(run);
}

}  // namespace tau::cli
