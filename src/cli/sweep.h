// `tau sweep FILE`: many runs of one spec, one per point of a grid or a random draw over spec
// paths (the --set paths), in one experiment group, submitted in one batch. The file's parse and
// the points are here, without a server (sweep_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "spec/spec.h"

namespace tau::cli {

inline constexpr int64_t kMaxSweepRuns = 10'000;  // a batch's limit

struct SweepParameter {
  std::string path;  // a --set path
  // grid, or random choice: the values as --set takes them ("0.01", "[--epochs, 3]")
  std::vector<std::string> values;
  // random only, instead of values: uniform in [min, max], or log-uniform
  std::optional<double> min, max;
  bool log = false;
  bool integer = false;      // a range of whole numbers (min and max written as integers)
  int line = 0, column = 0;  // where the file names it
  // Where each of `values` is written, "FILE:LINE:COL"; a range's draws are at the range's.
  std::vector<std::string> origins;
  std::string range_origin;
};

struct SweepFile {
  std::string file;  // as given
  std::string spec;  // the spec file, relative to the sweep file's folder, or a TARGET
  int spec_line = 0, spec_column = 0;  // where `spec:`'s value is
  std::string group;    // experiment.group of every run; "" makes one from the spec's name
  bool random = false;  // method: grid (every combination) or random (`samples` draws)
  int64_t samples = 0;
  uint64_t seed = 0;
  int64_t max_parallel = 0;  // at most this many of its runs in play at once; 0: no limit
  std::string metric;        // the objective: a metric's name; "" orders the table by name
  std::string split;         // its split ("val"); "" takes the metric's only series
  bool maximize = false;
  std::vector<SweepParameter> parameters;
};

// The sweep file: "FILE:LINE:COL: error: ..." for what is wrong, every error at once.
Result<SweepFile> ParseSweep(const std::string& text, const std::string& file);

// The points, each the overrides of one run, in a stable order: a grid's in the file's order of
// parameters (the last varying fastest); a random draw's from `seed`, the same every time.
// `origins`, when given, gets where each override's value is written ("FILE:LINE:COL").
std::vector<std::vector<spec::Override>> SweepPoints(
    const SweepFile& sweep, std::vector<std::vector<std::string>>* origins = nullptr);

// Which of a run's metric series (name, split) the objective reads: the named split's; without a
// split, the metric's only series (the one without a split, where there are several). nullopt
// when none fits; `splits` gets the splits the run logged the metric with ("" for none).
std::optional<std::string> ObjectiveSplit(
    const std::vector<std::pair<std::string, std::string>>& keys, const SweepFile& sweep,
    std::vector<std::string>* splits);

// Why no run has a value of the objective, from the splits the runs logged its metric with: the
// metric under several splits and none named, a named split the runs lack, or a metric no run
// logged. What to write instead is said.
std::string ObjectiveProblem(const SweepFile& sweep, const std::vector<std::string>& splits_found,
                             size_t runs);

}  // namespace tau::cli
