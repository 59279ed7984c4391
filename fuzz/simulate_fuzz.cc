// admission::Simulate on arbitrary bytes: the simulator's YAML loader, then the Kueue-model engine
// (quota tree, flavor assignment, preemption, fair sharing) for one to three cycles.
//
// The input's length picks the number of cycles (a byte of the text would spoil the seed files), so
// eviction and requeueing between cycles are reached too. Beyond "no crash, hang, leak or UB" it
// checks the shape of the answer: an accepted input gives the three lists and serializes; a refused
// one says why.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "admission/simulate.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int cycles = 1 + static_cast<int>(size % 3);
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<tau::admission::Diagnostic> diagnostics;
  auto result = tau::admission::Simulate(text, "sim.yaml", cycles, &diagnostics);
  if (!result.ok()) {
    TAU_FUZZ_CHECK(!result.status().message().empty());
    return 0;
  }
  const nlohmann::json& j = *result;
  TAU_FUZZ_CHECK(j.contains("admitted") && j["admitted"].is_array());
  TAU_FUZZ_CHECK(j.contains("preempted") && j["preempted"].is_array());
  TAU_FUZZ_CHECK(j.contains("pending") && j["pending"].is_array());
  TAU_FUZZ_CHECK(!j.dump().empty());
  return 0;
}
