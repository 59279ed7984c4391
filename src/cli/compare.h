// `tau compare`'s logic, kept apart from the server so that it is tested as a pure function: runs'
// evidence records and metric histories in, the differences out (docs/experiments.md).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/plot.h"
#include "evidence/evidence.h"

namespace tau::cli {

// What compare reads of one run.
struct CompareInput {
  std::string run;
  nlohmann::json record;  // the evidence record (GET /api/v1/runs/NAME/evidence)
  evidence::MetricHistory metrics;
};

// One config field whose value is not the same in every run. values[i] and sources[i] are run
// i's ("" when the run has no such field; a source is the resolution's provenance, "" if none).
struct ConfigDiff {
  std::string field;
  std::vector<std::optional<std::string>> values;
  std::vector<std::string> sources;
};

// One file of the code snapshots that is not the same in every run: digests[i] is run i's sha256,
// nullopt when the file is not in its snapshot.
struct FileDiff {
  std::string path;
  std::vector<std::optional<std::string>> digests;
};

// One package that is not the same in every run: what run i asked for (`requested[i]`, its
// runtime.pip line) and what it had installed (`resolved[i]`, the version from the record's
// `pip freeze` list, or what follows "@" for a direct reference); nullopt where the run has none.
struct PackageDiff {
  std::string name;  // normalized as pip does: lowercase, runs of "-_." as one "-"
  std::vector<std::optional<std::string>> requested, resolved;
};

// A requirement or `pip freeze` line's package name, normalized ("Foo_Bar[x]>=1" -> "foo-bar",
// "-e git+URL#egg=Pkg" -> "pkg"); "" when the line names none (an option like "--index-url").
std::string PackageName(const std::string& line);

// One metric series of a run.
struct SeriesStats {
  int64_t count = 0;
  int64_t last_step = 0;
  double last = 0;
  std::optional<double> min, max;  // over finite values
  int64_t min_step = 0, max_step = 0;
};

// last, min and max of one series' points (sorted by step), with their steps.
SeriesStats StatsOf(const std::vector<evidence::MetricPoint>& points);

// One metric series (name, split) across the runs: stats[i] nullopt when run i lacks it.
struct MetricRow {
  std::string name, split;
  std::vector<std::optional<SeriesStats>> stats;
};

struct Comparison {
  std::vector<std::string> runs;
  std::vector<std::string> snapshot_digests;
  std::vector<int64_t> file_counts;
  std::vector<ConfigDiff> config;       // sorted by field
  std::vector<FileDiff> files;          // sorted by path
  std::vector<int64_t> package_counts;  // per run: packages in its resolved list
  std::vector<PackageDiff> packages;    // sorted by name
  bool any_packages = false;            // whether any run asked for or recorded a package
  std::vector<MetricRow> metrics;       // sorted by (name, split)
};

// Flattens a JSON value into dotted leaf paths ("runtime.env.LR", "run.args[1]") with each leaf's
// value as compact text (strings unquoted). An empty object or list is a leaf ("{}", "[]").
void FlattenJson(const nlohmann::json& value, const std::string& prefix,
                 std::vector<std::pair<std::string, std::string>>* out);

// The differences between the runs. The config is the record's canonical spec with the resolved
// values of its provenance over it (what the run ran with, and where each value came from); the
// spec's list of overrides is left out, as its values are in their fields already. A non-empty
// `metric` keeps only the series it names (MetricMatches).
Comparison CompareRuns(const std::vector<CompareInput>& runs, const std::string& metric = "");

// Whether `metric` names the series (name, split): its name (any split), or "NAME/SPLIT". A name
// may hold "/" itself ("train/loss"), so both readings are tried.
bool MetricMatches(const std::string& name, const std::string& split, const std::string& metric);

// The curves of `metric` (MetricMatches) in each run, for PlotCurves: one per run and series,
// labelled with the run's name, and its series ("loss/val") when the metric names several.
std::vector<PlotCurve> MetricCurves(const std::vector<CompareInput>& runs,
                                    const std::string& metric);

nlohmann::json ComparisonJson(const Comparison& c);
std::string FormatComparison(const Comparison& c);

}  // namespace tau::cli
