// `tau sweep FILE`: many runs of one spec, one per point of a grid or a random draw over spec
// paths (the --set paths), in one experiment group, submitted in one batch. The file's parse and
// the points are here, without a server (sweep_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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
};

struct SweepFile {
  std::string file;     // as given
  std::string spec;     // the spec file, relative to the sweep file's folder, or a TARGET
  std::string group;    // experiment.group of every run; "" makes one from the spec's name
  bool random = false;  // method: grid (every combination) or random (`samples` draws)
  int64_t samples = 0;
  uint64_t seed = 0;
  int64_t max_parallel = 0;  // at most this many of its runs in play at once; 0: no limit
  std::string metric;        // the objective: a metric series; "" orders the table by name
  bool maximize = false;
  std::vector<SweepParameter> parameters;
};

// The sweep file: "FILE:LINE:COL: error: ..." for what is wrong, every error at once.
Result<SweepFile> ParseSweep(const std::string& text, const std::string& file);

// The points, each the overrides of one run, in a stable order: a grid's in the file's order of
// parameters (the last varying fastest); a random draw's from `seed`, the same every time.
std::vector<std::vector<spec::Override>> SweepPoints(const SweepFile& sweep);

}  // namespace tau::cli
