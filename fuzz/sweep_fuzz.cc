// ParseSweep and SweepPoints (the CLI's sweep files) on arbitrary bytes.
//
// Beyond "no crash, hang, leak or UB": a refused file's message names the file; an accepted one
// makes between 1 and kMaxSweepRuns points, each with a place in the file for every value, and
// the same points when drawn again (a random sweep's draw is fixed by its seed).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/sweep.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto sweep = tau::cli::ParseSweep(text, "sweep.yaml");
  if (!sweep.ok()) {
    TAU_FUZZ_CHECK(sweep.status().message().rfind("sweep.yaml", 0) == 0);
    return 0;
  }
  std::vector<std::vector<std::string>> origins;
  auto points = tau::cli::SweepPoints(*sweep, &origins);
  TAU_FUZZ_CHECK(!points.empty() && points.size() <= static_cast<size_t>(tau::cli::kMaxSweepRuns));
  TAU_FUZZ_CHECK(origins.size() == points.size());
  for (size_t i = 0; i < points.size(); ++i) TAU_FUZZ_CHECK(origins[i].size() == points[i].size());
  auto again = tau::cli::SweepPoints(*sweep);
  TAU_FUZZ_CHECK(again.size() == points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    TAU_FUZZ_CHECK(again[i].size() == points[i].size());
    for (size_t k = 0; k < points[i].size(); ++k)
      TAU_FUZZ_CHECK(again[i][k].Text() == points[i][k].Text());
  }
  return 0;
}
