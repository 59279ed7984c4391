// `tau compare`'s logic, kept apart from the server so that it is tested as a pure function: runs'
// evidence records and metric histories in, the differences out (docs/experiments.md).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  std::vector<ConfigDiff> config;  // sorted by field
  std::vector<FileDiff> files;     // sorted by path
  std::vector<MetricRow> metrics;  // sorted by (name, split)
};

// Flattens a JSON value into dotted leaf paths ("runtime.env.LR", "run.args[1]") with each leaf's
// value as compact text (strings unquoted). An empty object or list is a leaf ("{}", "[]").
void FlattenJson(const nlohmann::json& value, const std::string& prefix,
                 std::vector<std::pair<std::string, std::string>>* out);

// The differences between the runs. The config is the record's canonical spec with the resolved
// values of its provenance over it (what the run ran with, and where each value came from); the
// spec's list of overrides is left out, as its values are in their fields already.
Comparison CompareRuns(const std::vector<CompareInput>& runs);

nlohmann::json ComparisonJson(const Comparison& c);
std::string FormatComparison(const Comparison& c);

}  // namespace tau::cli
