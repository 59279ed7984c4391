// Workflows: stages that are runs of their own, each waiting for the stages it names in `after`.
// The workflow file (`kind: workflow`, read by `tau run FILE`) and the checks of a stage graph
// that the CLI makes on the file and the server makes again on a submitted batch. Pure.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tau::spec {

inline constexpr size_t kMaxWorkflowStages = 100;
inline constexpr size_t kMaxStageNameLength = 40;

// What an upstream stage's run must have done for a downstream stage to start.
enum class Condition {
  kSucceeded,  // ended Succeeded; else the downstream run is stopped (UpstreamFailed)
  kFinished,   // ended in any way (an evaluation that runs even after a failed training)
};
const char* ConditionName(Condition c);  // "succeeded", "finished"
std::optional<Condition> ParseCondition(std::string_view name);

struct StageDependency {
  std::string stage;
  Condition condition = Condition::kSucceeded;
  int line = 0, column = 0;  // where the file names it (0: not from a file)
};

struct WorkflowStage {
  std::string name;
  // The stage's spec: a file relative to the workflow file's folder, or a TARGET (tau/NAME.yaml
  // of the repository), as `tau run` takes it.
  std::string spec;
  std::vector<std::string> set;  // --set texts applied to the stage's spec
  std::vector<StageDependency> after;
  int line = 0, column = 0;  // where the stage starts in the file
};

struct WorkflowFile {
  std::string file;  // as given
  std::string name;  // the workflow's name: its runs are "<name>-<hex>-<stage>"
  std::vector<WorkflowStage> stages;
};

// Whether `text` is a workflow file (a YAML mapping whose `kind` is `workflow`) rather than a run
// spec. Reads no more than the top level; a text that does not parse is no workflow.
bool IsWorkflowText(const std::string& text);

// The workflow file, every error at once as "FILE:LINE:COL: error: ...".
Result<WorkflowFile> ParseWorkflow(const std::string& text, const std::string& file);

// One problem of a stage graph: where it is (the graph as a whole, a stage's name, one of its
// dependencies, or the stage) and what is wrong, without the place: the caller names it as its
// input does ("stages[1].after[0]" in a file, "runs[1].after[0]" in a batch).
struct GraphProblem {
  enum class Part { kGraph, kStage, kName, kDependency };
  Part part = Part::kStage;
  size_t stage = 0;
  size_t dependency = 0;  // the index in the stage's `after`, for kDependency
  std::string message;
};
// The checks every workflow gets, from a file or a batch: stage names (DNS labels of at most
// kMaxStageNameLength characters, unique), dependencies on stages that exist and are not the stage
// itself, each named once, no cycle (named by its path), at most kMaxWorkflowStages stages.
std::vector<GraphProblem> CheckStageGraph(const std::vector<WorkflowStage>& stages);
// Where a problem is, in a list of stages called `items` whose name member is `name_field`:
// "stages", "stages[2]", "stages[2].name", "stages[2].after[0]".
std::string GraphProblemPlace(const GraphProblem& p, std::string_view items,
                              std::string_view name_field);

// The environment variable part of a stage's name: "pre-train" -> "PRE_TRAIN".
std::string StageEnvName(std::string_view stage);

// Where a workflow file writes what each stage's errors are named at: the stage's `spec:` value and
// each of its `set:` values.
struct StagePlaces {
  int spec_line = 0, spec_column = 0;    // where `spec:`'s value is
  std::vector<std::string> set_origins;  // where each of the stage's `set` is: "FILE:LINE:COL"
};

// ParseWorkflow, and `places`, one per stage.
Result<WorkflowFile> ParseWorkflow(const std::string& text, const std::string& file,
                                   std::vector<StagePlaces>* places);

}  // namespace tau::spec
