#include "spec/workflow.h"

#include <gtest/gtest.h>

namespace tau::spec {
namespace {

std::string Errors(const std::string& text) {
  auto parsed = ParseWorkflow(text, "wf.yaml");
  return parsed.ok() ? "" : parsed.status().message();
}

TEST(WorkflowTest, ParsesStagesDependenciesAndOverrides) {
  std::vector<StagePlaces> places;
  auto wf = ParseWorkflow(R"(kind: workflow
name: train-eval
stages:
  - name: prepare
    spec: prepare.yaml
  - name: train
    spec: train.yaml
    after: [prepare]
    set: {compute.gpus: 2, runtime.env.LR: "0.1"}
  - name: eval
    spec: tau/eval.yaml
    after:
      - {stage: train, condition: finished}
      - prepare
    set: [resilience.max_retries=1]
)",
                          "wf.yaml", &places);
  ASSERT_TRUE(wf.ok()) << wf.status().message();
  EXPECT_EQ(wf->name, "train-eval");
  ASSERT_EQ(wf->stages.size(), 3u);
  EXPECT_EQ(wf->stages[0].name, "prepare");
  EXPECT_TRUE(wf->stages[0].after.empty());
  EXPECT_EQ(wf->stages[1].set, (std::vector<std::string>{"compute.gpus=2", "runtime.env.LR=0.1"}));
  ASSERT_EQ(wf->stages[2].after.size(), 2u);
  EXPECT_EQ(wf->stages[2].after[0].stage, "train");
  EXPECT_EQ(wf->stages[2].after[0].condition, Condition::kFinished);
  EXPECT_EQ(wf->stages[2].after[1].condition, Condition::kSucceeded) << "the default";
  EXPECT_EQ(wf->stages[2].after[0].line, 13);
  EXPECT_EQ(wf->stages[2].set, std::vector<std::string>{"resilience.max_retries=1"});
  // Where each value and each spec is written: their errors are named there.
  EXPECT_EQ(places[1].set_origins, (std::vector<std::string>{"wf.yaml:9:25", "wf.yaml:9:44"}));
  EXPECT_EQ(places[2].set_origins, std::vector<std::string>{"wf.yaml:15:11"});
  EXPECT_EQ(places[1].spec_line, 7);
  EXPECT_EQ(places[1].spec_column, 11);
}

TEST(WorkflowTest, EveryMistakeIsSaidAtItsPlace) {
  const std::string errors = Errors(R"(kind: workflow
name: Bad_Name
colour: red
stages:
  - name: a
    spec: a.yaml
    after: [{stage: a, condition: maybe}]
  - spec: b.yaml
    retries: 3
)");
  EXPECT_NE(errors.find("wf.yaml:2:7: error: name: 'Bad_Name' is not a DNS-1123 label"),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find("wf.yaml:3:1: error: unknown field 'colour'"), std::string::npos) << errors;
  EXPECT_NE(errors.find("wf.yaml:7:35: error: stages[0].after[0].condition: succeeded or "
                        "finished, not 'maybe'"),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find("wf.yaml:8:5: error: stages[1]: needs a name"), std::string::npos)
      << errors;
  EXPECT_NE(errors.find("wf.yaml:9:5: error: stages[1]: unknown field 'retries'"),
            std::string::npos)
      << errors;
}

TEST(WorkflowTest, GraphErrorsNameTheStageAndTheCycle) {
  const std::string unknown = Errors(R"(kind: workflow
name: wf
stages:
  - {name: train, spec: t.yaml}
  - {name: eval, spec: e.yaml, after: [trian]}
)");
  EXPECT_NE(unknown.find("wf.yaml:5:40: error: stages[1].after[0]: no stage is named 'trian' "
                         "(did you mean 'train'?)"),
            std::string::npos)
      << unknown;
  const std::string cycle = Errors(R"(kind: workflow
name: wf
stages:
  - {name: a, spec: a.yaml, after: [c]}
  - {name: b, spec: b.yaml, after: [a]}
  - {name: c, spec: c.yaml, after: [b]}
  - {name: d, spec: d.yaml}
)");
  EXPECT_NE(cycle.find("wf.yaml:4:5: error: stages[0]: the stages wait for each other in a cycle "
                       "(a <- c <- b <- a)"),
            std::string::npos)
      << cycle;
  const std::string self = Errors(R"(kind: workflow
name: wf
stages:
  - {name: a, spec: a.yaml, after: [a]}
  - {name: a, spec: b.yaml}
)");
  EXPECT_NE(self.find("stage 'a' cannot wait for itself"), std::string::npos) << self;
  EXPECT_NE(self.find("wf.yaml:5:5: error: stages[1].name: stage 'a' is already stage 0"),
            std::string::npos)
      << self;
  EXPECT_NE(Errors("kind: workflow\nname: wf\nstages: []\n").find("stages: give a list"),
            std::string::npos);
  EXPECT_NE(Errors("kind: workflow\nname: 'wf\nstages: []\n").find("wf.yaml:2:7"),
            std::string::npos)
      << "an unclosed quote is said where it opens";
}

TEST(WorkflowTest, TheGraphIsCheckedWithoutAFileToo) {
  std::vector<WorkflowStage> stages(kMaxWorkflowStages + 1);
  for (size_t i = 0; i < stages.size(); ++i) stages[i].name = "s" + std::to_string(i);
  auto problems = CheckStageGraph(stages);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].message.find("at most 100 stages"), std::string::npos);
  stages.resize(2);
  stages[1].after = {{"s0", Condition::kSucceeded, 0, 0}, {"s0", Condition::kFinished, 0, 0}};
  problems = CheckStageGraph(stages);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].stage, 1u);
  EXPECT_EQ(problems[0].dependency, 1u);
  EXPECT_EQ(GraphProblemPlace(problems[0], "runs", "stage"), "runs[1].after[1]");
  stages[1].after.pop_back();
  EXPECT_TRUE(CheckStageGraph(stages).empty());
}

TEST(WorkflowTest, RecognisesWorkflowFilesAndNamesEnvironmentVariables) {
  EXPECT_TRUE(IsWorkflowText("kind: workflow\nname: x\n"));
  EXPECT_FALSE(IsWorkflowText("schema_version: 1\nname: x\nrun: {workload_kind: job}\n"));
  EXPECT_FALSE(IsWorkflowText("kind: [\n"));
  EXPECT_FALSE(IsWorkflowText("- kind\n"));
  // The word spelled with escapes, or reached through an alias, is still a workflow.
  EXPECT_TRUE(IsWorkflowText("kind: \"work\\x66low\"\nname: x\n"));
  EXPECT_TRUE(IsWorkflowText("kind: \"\\u0077orkflow\"\n"));
  EXPECT_TRUE(IsWorkflowText("a: &k workflow\nkind: *k\n"));
  EXPECT_FALSE(IsWorkflowText("kind: workflows\n"));
  EXPECT_EQ(StageEnvName("pre-train2"), "PRE_TRAIN2");
  EXPECT_EQ(ParseCondition("finished"), Condition::kFinished);
  EXPECT_FALSE(ParseCondition("Succeeded"));
  EXPECT_STREQ(ConditionName(Condition::kSucceeded), "succeeded");
}

// The run-spec reader's checks (LoadStrictYaml), not a reader of the workflow's own: yaml-cpp
// keeps one of two equal keys silently, so a second `stages:` dropped the first one's stages.
TEST(WorkflowTest, AKeyGivenTwiceIsRefusedAtItsPlaceNamingTheFirst) {
  const std::string twice = Errors(R"(kind: workflow
name: wf
stages:
  - {name: a, spec: a.yaml}
  - {name: b, spec: b.yaml}
stages:
  - {name: c, spec: c.yaml}
)");
  EXPECT_NE(twice.find("wf.yaml:6:1: error: duplicate field 'stages' (first given on line 3, "
                       "column 1)"),
            std::string::npos)
      << twice;
  const std::string in_stage = Errors(R"(kind: workflow
name: wf
stages:
  - name: a
    spec: a.yaml
    spec: b.yaml
)");
  EXPECT_NE(in_stage.find("wf.yaml:6:5: error: duplicate field 'spec' in 'stages[0]' (first given "
                          "on line 5, column 5)"),
            std::string::npos)
      << in_stage;
}

TEST(WorkflowTest, TextChecksAreTheSpecReadersOnes) {
  const std::string unclosed = Errors("kind: workflow\nname: \"wf\nstages: []\n");
  EXPECT_NE(unclosed.find("wf.yaml:2:7: error:"), std::string::npos) << unclosed;
  EXPECT_NE(unclosed.find("never closed"), std::string::npos) << unclosed;
  // Lone CRs end lines: the file reads as the same file with LFs.
  auto cr =
      ParseWorkflow("kind: workflow\rname: wf\rstages:\r  - {name: a, spec: a.yaml}\r", "wf.yaml");
  ASSERT_TRUE(cr.ok()) << cr.status().message();
  EXPECT_EQ(cr->stages.size(), 1u);
  const std::string tab = Errors("kind: workflow\nname: wf\nstages:\n\t- {name: a, spec: a}\n");
  EXPECT_NE(tab.find("wf.yaml:4:1: error: tab character in indentation"), std::string::npos) << tab;
  const std::string empty = Errors("");
  EXPECT_NE(empty.find("wf.yaml:1:1: error: the file is empty: expected a workflow file"),
            std::string::npos)
      << empty;
}

TEST(WorkflowTest, ASetPathWithAnEqualsSignIsRefusedAtItsPlace) {
  const std::string errors = Errors(R"(kind: workflow
name: wf
stages:
  - name: a
    spec: a.yaml
    set: {"compute.gpus=2": 4}
)");
  EXPECT_NE(errors.find("wf.yaml:6:11: error: stages[0].set: 'compute.gpus=2' is not a field path"),
            std::string::npos)
      << errors;
}

TEST(WorkflowTest, ASetPathThatIsNoFieldPathIsRefusedAtItsItem) {
  const std::string errors = Errors(R"(kind: workflow
name: wf
stages:
  - name: a
    spec: a.yaml
    set: [compute.gpus=1, compute..gpus=2]
)");
  EXPECT_NE(errors.find("wf.yaml:6:27: error: stages[0].set[1]: compute..gpus=2: 'compute..gpus' "
                        "is not a field path"),
            std::string::npos)
      << errors;
}

}  // namespace
}  // namespace tau::spec
