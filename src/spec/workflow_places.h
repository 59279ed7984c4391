// Where a workflow file writes what each stage's errors are named at: the stage's `spec:` value and
// each of its `set:` values. Apart from workflow.h, which the server's run records include.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "spec/workflow.h"

namespace tau::spec {

struct StagePlaces {
  int spec_line = 0, spec_column = 0;    // where `spec:`'s value is
  std::vector<std::string> set_origins;  // where each of the stage's `set` is: "FILE:LINE:COL"
};

// ParseWorkflow, and `places`, one per stage.
Result<WorkflowFile> ParseWorkflow(const std::string& text, const std::string& file,
                                   std::vector<StagePlaces>* places);

}  // namespace tau::spec
