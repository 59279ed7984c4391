#include "cli/sweep.h"

#include <set>

#include <gtest/gtest.h>

namespace tau::cli {
namespace {

std::vector<std::string> Texts(const std::vector<spec::Override>& point) {
  std::vector<std::string> out;
  for (const spec::Override& o : point) out.push_back(o.Text());
  return out;
}

TEST(Sweep, AGridRunsEveryCombinationTheLastParameterFastest) {
  auto sweep = ParseSweep(
      "spec: tau.yaml\n"
      "group: lr\n"
      "objective: {metric: loss, goal: minimize}\n"
      "parameters:\n"
      "  runtime.env.LR: [0.01, 0.1, 1]\n"
      "  run.args: [[--steps, 10], [--steps, 20]]\n",
      "sweep.yaml");
  ASSERT_TRUE(sweep.ok()) << sweep.status().message();
  EXPECT_EQ(sweep->spec, "tau.yaml");
  EXPECT_EQ(sweep->group, "lr");
  EXPECT_EQ(sweep->metric, "loss");
  EXPECT_FALSE(sweep->maximize);
  auto points = SweepPoints(*sweep);
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(Texts(points[0]),
            (std::vector<std::string>{"runtime.env.LR=0.01", "run.args=[--steps, 10]"}));
  EXPECT_EQ(Texts(points[1]),
            (std::vector<std::string>{"runtime.env.LR=0.01", "run.args=[--steps, 20]"}));
  EXPECT_EQ(Texts(points[5]),
            (std::vector<std::string>{"runtime.env.LR=1", "run.args=[--steps, 20]"}));
}

TEST(Sweep, ARandomDrawIsTheSameForTheSameSeedAndStaysInItsRanges) {
  const std::string text =
      "spec: tau.yaml\nmethod: random\nsamples: 50\nseed: 7\n"
      "parameters:\n"
      "  runtime.env.LR: {min: 0.0001, max: 0.1, scale: log}\n"
      "  compute.workers: {min: 1, max: 4}\n"
      "  runtime.env.OPT: [adam, sgd]\n";
  auto a = ParseSweep(text, "s.yaml");
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto points = SweepPoints(*a);
  ASSERT_EQ(points.size(), 50u);
  EXPECT_EQ(Texts(points[0]), Texts(SweepPoints(*ParseSweep(text, "s.yaml"))[0]));
  std::set<std::string> optimisers, workers;
  for (const auto& p : points) {
    const double lr = std::stod(p[0].value);
    EXPECT_GE(lr, 0.0001);
    EXPECT_LE(lr, 0.1);
    workers.insert(p[1].value);
    optimisers.insert(p[2].value);
  }
  EXPECT_EQ(workers, (std::set<std::string>{"1", "2", "3", "4"}));  // whole numbers, every one
  EXPECT_EQ(optimisers, (std::set<std::string>{"adam", "sgd"}));
  auto other = ParseSweep(
      text.substr(0, text.find("seed")) + "seed: 8\n" + text.substr(text.find("parameters")),
      "s.yaml");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(Texts(SweepPoints(*other)[0]), Texts(points[0]));
}

TEST(Sweep, EveryMistakeIsSaidAtItsPlace) {
  auto bad = ParseSweep(
      "method: grid\n"
      "objective: {metric: loss, goal: lowest}\n"
      "max_parallel: 0\n"
      "colour: blue\n"
      "parameters:\n"
      "  runtime.env.LR: []\n"
      "  compute.gpus: {min: 0, max: 2}\n",
      "sweep.yaml");
  ASSERT_FALSE(bad.ok());
  const std::string& m = bad.status().message();
  EXPECT_NE(m.find("sweep.yaml:2:33: error: objective.goal: minimize or maximize, not 'lowest'"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("sweep.yaml:3:15: error: max_parallel: expected a whole number from 1 to 10000"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("sweep.yaml:4:1: error: unknown field 'colour'"), std::string::npos) << m;
  EXPECT_NE(m.find("sweep.yaml:6:19: error: parameters.runtime.env.LR: no values"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("sweep.yaml:7:17: error: parameters.compute.gpus: a range needs method: random"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("error: spec: missing"), std::string::npos) << m;

  auto huge = ParseSweep(
      "spec: t.yaml\nparameters:\n  a: [1,2,3,4,5,6,7,8,9,10]\n  b: [1,2,3,4,5,6,7,8,9,10]\n"
      "  c: [1,2,3,4,5,6,7,8,9,10]\n  d: [1,2,3,4,5,6,7,8,9,10]\n  e: [1, 2]\n",
      "s.yaml");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("more than 10000 runs"), std::string::npos);
  auto random_without_samples =
      ParseSweep("spec: t.yaml\nmethod: random\nparameters:\n  a: [1]\n", "s.yaml");
  ASSERT_FALSE(random_without_samples.ok());
  EXPECT_NE(random_without_samples.status().message().find("samples: method random needs"),
            std::string::npos);
  auto not_yaml = ParseSweep("spec: [\n", "s.yaml");
  ASSERT_FALSE(not_yaml.ok());
  EXPECT_EQ(not_yaml.status().message().rfind("s.yaml:", 0), 0u);
}

TEST(Sweep, AKeyGivenTwiceIsRefusedAtItsPlaceNamingTheFirst) {
  auto sweep = ParseSweep(
      "spec: a.yaml\n"
      "parameters:\n"
      "  runtime.env.LR: [1]\n"
      "objective: {metric: loss, goal: maximize, goal: minimize}\n"
      "spec: b.yaml\n",
      "sweep.yaml");
  ASSERT_FALSE(sweep.ok());
  const std::string m = sweep.status().message();
  EXPECT_NE(m.find("sweep.yaml:4:43: error: duplicate field 'goal' in 'objective' (first given on "
                   "line 4, column 27)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("sweep.yaml:5:1: error: duplicate field 'spec' (first given on line 1, column "
                   "1)"),
            std::string::npos)
      << m;
  auto unclosed = ParseSweep("spec: 'a.yaml\nparameters: {a: [1]}\n", "s.yaml");
  ASSERT_FALSE(unclosed.ok());
  EXPECT_NE(unclosed.status().message().find("s.yaml:1:7: error:"), std::string::npos)
      << unclosed.status().message();
}

// A list item is written back as a flow list --set reads: quoted where its text needs it.
TEST(Sweep, AQuotedValueInAListStaysOneValue) {
  auto sweep = ParseSweep(
      "spec: tau.yaml\n"
      "parameters:\n"
      "  run.args: [[--lrs, \"0.1,0.2\"], [--msg, \"a: b\"], [--q, 'say \"hi\"']]\n",
      "sweep.yaml");
  ASSERT_TRUE(sweep.ok()) << sweep.status().message();
  auto points = SweepPoints(*sweep);
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0][0].value, "[--lrs, \"0.1,0.2\"]");
  EXPECT_EQ(points[1][0].value, "[--msg, \"a: b\"]");
  EXPECT_EQ(points[2][0].value, "[--q, \"say \\\"hi\\\"\"]");
  // As `tau run --set` reads it: the spec's run.args get two items each.
  const std::string spec =
      "schema_version: 1\nname: s\nrun:\n  entrypoint: train.py\n  workload_kind: job\n";
  for (const auto& point : points) {
    spec::ParseOutcome parsed = spec::ParseSpec(spec, "tau.yaml", point);
    ASSERT_TRUE(parsed.ok()) << parsed.ErrorText();
    EXPECT_EQ(parsed.spec->args.size(), 2u) << point[0].value;
  }
  spec::ParseOutcome parsed = spec::ParseSpec(spec, "tau.yaml", points[0]);
  EXPECT_EQ(parsed.spec->args[1], "0.1,0.2");
}

TEST(Sweep, TheObjectiveNamesItsSplitEitherWay) {
  auto named = ParseSweep(
      "spec: t.yaml\nobjective: {metric: loss, split: val, goal: minimize}\nparameters: {a: [1]}\n",
      "s.yaml");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(named->metric, "loss");
  EXPECT_EQ(named->split, "val");
  auto slashed =
      ParseSweep("spec: t.yaml\nobjective: {metric: loss/val}\nparameters: {a: [1]}\n", "s.yaml");
  ASSERT_TRUE(slashed.ok()) << slashed.status().message();
  EXPECT_EQ(slashed->metric, "loss");
  EXPECT_EQ(slashed->split, "val");
  auto both = ParseSweep(
      "spec: t.yaml\nobjective: {metric: loss/val, split: val}\nparameters: {a: [1]}\n", "s.yaml");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("name the split once"), std::string::npos);
}

TEST(Sweep, AnObjectiveOverSeveralSplitsNeedsOneNamed) {
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"acc", "val"}, {"loss", "train"}, {"loss", "val"}};
  SweepFile sweep;
  sweep.file = "sweep.yaml";
  sweep.metric = "loss";
  std::vector<std::string> splits;
  EXPECT_EQ(ObjectiveSplit(keys, sweep, &splits), std::nullopt);
  EXPECT_EQ(splits, (std::vector<std::string>{"train", "val"}));
  EXPECT_EQ(ObjectiveProblem(sweep, splits, 3),
            "sweep.yaml: objective: the metric 'loss' is logged with several splits (train, val); "
            "name one, such as objective: {metric: loss, split: val, goal: minimize}");
  sweep.split = "val";
  EXPECT_EQ(ObjectiveSplit(keys, sweep, &splits), std::optional<std::string>("val"));
  sweep.split = "test";
  EXPECT_EQ(ObjectiveSplit(keys, sweep, &splits), std::nullopt);
  EXPECT_NE(ObjectiveProblem(sweep, splits, 3)
                .find("no run logged the metric 'loss' with split "
                      "'test' (its splits: train, val)"),
            std::string::npos);
  sweep.split = "";
  sweep.metric = "acc";
  EXPECT_EQ(ObjectiveSplit(keys, sweep, &splits), std::optional<std::string>("val"))
      << "the only split";
  sweep.metric = "lsos";
  EXPECT_EQ(ObjectiveSplit(keys, sweep, &splits), std::nullopt);
  EXPECT_NE(ObjectiveProblem(sweep, splits, 3).find("no run of the 3 logged the metric 'lsos'"),
            std::string::npos);
}

TEST(Sweep, EveryPointSaysWhereTheFileWritesEachValue) {
  auto grid = ParseSweep(
      "spec: tau.yaml\n"
      "parameters:\n"
      "  compute.gpus: [1,\n"
      "    2]\n"
      "  runtime.env.LR: [0.1]\n",
      "s.yaml");
  ASSERT_TRUE(grid.ok()) << grid.status().message();
  EXPECT_EQ(grid->spec_line, 1);
  EXPECT_EQ(grid->spec_column, 7);
  std::vector<std::vector<std::string>> origins;
  auto points = SweepPoints(*grid, &origins);
  ASSERT_EQ(origins.size(), 2u);
  EXPECT_EQ(origins[0], (std::vector<std::string>{"s.yaml:3:18", "s.yaml:5:20"}));
  EXPECT_EQ(origins[1], (std::vector<std::string>{"s.yaml:4:5", "s.yaml:5:20"}));
  // A random draw from a range is at the range.
  auto random = ParseSweep(
      "spec: tau.yaml\nmethod: random\nsamples: 2\nparameters:\n  compute.gpus: {min: 1, max: "
      "4}\n",
      "r.yaml");
  ASSERT_TRUE(random.ok()) << random.status().message();
  SweepPoints(*random, &origins);
  ASSERT_EQ(origins.size(), 2u);
  EXPECT_EQ(origins[1], std::vector<std::string>{"r.yaml:5:17"});
}

}  // namespace
}  // namespace tau::cli
