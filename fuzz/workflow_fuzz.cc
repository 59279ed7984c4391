// spec::ParseWorkflow on arbitrary bytes: the strict reader of workflow files and the stage graph.
//
// Beyond "no crash, hang, leak or UB": a refused file's message names the file and a position; an
// accepted one has a place for every stage, and a stage graph the server's own check accepts (the
// server checks the graph again, and must never refuse what the CLI sent as valid).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "spec/workflow.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<tau::spec::StagePlaces> places;
  auto workflow = tau::spec::ParseWorkflow(text, "wf.yaml", &places);
  if (!workflow.ok()) {
    TAU_FUZZ_CHECK(workflow.status().message().rfind("wf.yaml", 0) == 0);
    return 0;
  }
  TAU_FUZZ_CHECK(places.size() == workflow->stages.size());
  TAU_FUZZ_CHECK(tau::spec::CheckStageGraph(workflow->stages).empty());
  for (size_t i = 0; i < workflow->stages.size(); ++i) {
    TAU_FUZZ_CHECK(!workflow->stages[i].name.empty() && !workflow->stages[i].spec.empty());
    TAU_FUZZ_CHECK(places[i].set_origins.size() == workflow->stages[i].set.size());
  }
  return 0;
}
