#include "cli/compare.h"

#include <gtest/gtest.h>

namespace tau::cli {
namespace {

using nlohmann::json;

CompareInput MakeRun(const std::string& name, const std::string& lr, const json& files,
                     const std::vector<std::pair<int64_t, double>>& loss) {
  CompareInput in;
  in.run = name;
  in.record = {
      {"config",
       {{"spec",
         {{"name", "demo"},
          {"runtime", {{"env", {{"LR", lr}, {"SEED", "1"}}}}},
          {"run", {{"args", json::array({"--epochs", "3"})}}},
          {"overrides", json::array({{{"path", "runtime.env.LR"}, {"value", lr}}})}}},
        {"provenance",
         json::array({{{"field", "runtime.env.LR"}, {"value", lr}, {"source", "command line"}},
                      {{"field", "policy.queue"},
                       {"value", "default"},
                       {"source", "platform default"}}})}}},
      {"snapshot", {{"digest", "sha256:" + name}, {"files", files}}}};
  for (const auto& [step, value] : loss) {
    evidence::MetricPoint p;
    p.name = "loss";
    p.step = step;
    p.value = value;
    in.metrics.Add(p);
  }
  return in;
}

json File(const std::string& path, const std::string& sha) {
  return {{"path", path}, {"sha256", sha}, {"size", 1}, {"mode", 420}};
}

TEST(CompareTest, ShowsOnlyWhatDiffersWithProvenance) {
  std::vector<CompareInput> runs;
  runs.push_back(MakeRun("a", "0.1", json::array({File("train.py", "aa"), File("data.txt", "dd")}),
                         {{0, 2.0}, {1, 0.5}, {2, 0.7}}));
  runs.push_back(
      MakeRun("b", "0.01",
              json::array({File("train.py", "bb"), File("data.txt", "dd"), File("extra.py", "ee")}),
              {{0, 3.0}, {1, 1.5}}));
  Comparison c = CompareRuns(runs);

  ASSERT_EQ(c.config.size(), 1u) << ComparisonJson(c).dump();
  EXPECT_EQ(c.config[0].field, "runtime.env.LR");
  EXPECT_EQ(c.config[0].values[0], "0.1");
  EXPECT_EQ(c.config[0].values[1], "0.01");
  EXPECT_EQ(c.config[0].sources[0], "command line");

  ASSERT_EQ(c.files.size(), 2u);  // data.txt is the same in both
  EXPECT_EQ(c.files[0].path, "extra.py");
  EXPECT_EQ(c.files[0].digests[0], std::nullopt);
  EXPECT_EQ(c.files[0].digests[1], "ee");
  EXPECT_EQ(c.files[1].path, "train.py");
  EXPECT_EQ(c.file_counts, (std::vector<int64_t>{2, 3}));

  ASSERT_EQ(c.metrics.size(), 1u);
  const SeriesStats& a = *c.metrics[0].stats[0];
  EXPECT_EQ(a.last, 0.7);
  EXPECT_EQ(a.last_step, 2);
  EXPECT_EQ(*a.min, 0.5);
  EXPECT_EQ(a.min_step, 1);
  EXPECT_EQ(*a.max, 2.0);
  EXPECT_EQ(a.max_step, 0);
  EXPECT_EQ(c.metrics[0].stats[1]->last, 1.5);

  std::string table = FormatComparison(c);
  EXPECT_NE(table.find("0.01 (command line)"), std::string::npos) << table;
  EXPECT_NE(table.find("(absent)"), std::string::npos) << table;
  EXPECT_NE(table.find("loss min"), std::string::npos) << table;
  EXPECT_NE(table.find("0.5 @1"), std::string::npos) << table;
  json j = ComparisonJson(c);
  EXPECT_EQ(j["same_code"], false);
  EXPECT_EQ(j["config"][0]["values"][1]["value"], "0.01");
  EXPECT_EQ(j["metrics"][0]["runs"][0]["min_step"], 1);
}

TEST(CompareTest, AFieldOnlyOneRunHasIsADifference) {
  std::vector<CompareInput> runs;
  runs.push_back(MakeRun("a", "0.1", json::array(), {}));
  runs.push_back(MakeRun("b", "0.1", json::array(), {{0, 1.0}}));
  runs[1].record["config"]["spec"]["compute"] = {{"gpus", 2}};
  Comparison c = CompareRuns(runs);
  ASSERT_EQ(c.config.size(), 1u) << ComparisonJson(c).dump();
  EXPECT_EQ(c.config[0].field, "compute.gpus");
  EXPECT_EQ(c.config[0].values[0], std::nullopt);
  EXPECT_EQ(c.config[0].values[1], "2");
  EXPECT_TRUE(c.files.empty());
  // A series only one run has is shown with nothing for the other.
  ASSERT_EQ(c.metrics.size(), 1u);
  EXPECT_FALSE(c.metrics[0].stats[0].has_value());
  EXPECT_TRUE(ComparisonJson(c)["same_code"] == false);  // the digests are the run names here
}

// A record as the server writes it: the spec file's text, the canonical spec with its --set
// overrides, and the resolution's provenance (an override of a field resolution knows nothing of
// gets an entry under its --set path).
CompareInput SetRun(const std::string& name,
                    const std::vector<std::pair<std::string, std::string>>& set) {
  json overrides = json::array();
  json canonical = {
      {"name", "demo"}, {"args", json::array({"1"})}, {"runtime", {{"env", {{"LR", "0.1"}}}}}};
  json provenance = json::array(
      {{{"field", "policy.queue"}, {"value", "default"}, {"source", "platform default"}},
       {{"field", "compute.gpus"}, {"value", "0"}, {"source", "spec"}}});
  for (const auto& [path, value] : set) {
    overrides.push_back({{"path", path}, {"value", value}});
    provenance.push_back({{"field", path}, {"value", value}, {"source", "command line"}});
    if (path == "run.args") canonical["args"] = json::array({value.substr(1, value.size() - 2)});
  }
  canonical["overrides"] = overrides;
  CompareInput in;
  in.run = name;
  in.record = {{"config",
                {{"spec_yaml",
                  "schema_version: 1\nname: demo\nrun:\n  entrypoint: main.sh\n  args: ['1']\n"
                  "compute:\n  gpus: 0\nruntime:\n  env:\n    LR: '0.1'\n"},
                 {"spec", canonical},
                 {"provenance", provenance}}}};
  return in;
}

TEST(CompareTest, EachDifferenceOnceNamedAsSetTakesIt) {
  std::vector<CompareInput> runs;
  runs.push_back(SetRun("a", {}));
  runs.push_back(SetRun("b", {{"run.args", "[5]"}, {"runtime.env.LR", "0.3"}}));
  Comparison c = CompareRuns(runs);
  // run.args once (not also args[0] of the canonical spec), as `--set run.args=[5]` takes it.
  ASSERT_EQ(c.config.size(), 2u) << ComparisonJson(c).dump();
  EXPECT_EQ(c.config[0].field, "run.args");
  EXPECT_EQ(c.config[0].values[0], "[1]");
  EXPECT_EQ(c.config[0].values[1], "[5]");
  EXPECT_EQ(c.config[0].sources[1], "command line");
  EXPECT_EQ(c.config[1].field, "runtime.env.LR");
  EXPECT_EQ(c.config[1].values[0], "0.1");
  EXPECT_EQ(c.config[1].values[1], "0.3");
  EXPECT_EQ(c.config[1].sources[0], "");
  EXPECT_EQ(c.config[1].sources[1], "command line");
}

TEST(CompareTest, WhatOnlyTheResolutionDecidedKeepsItsName) {
  std::vector<CompareInput> runs;
  runs.push_back(SetRun("a", {}));
  runs.push_back(SetRun("b", {}));
  runs[1].record["config"]["provenance"][0]["value"] = "batch";
  Comparison c = CompareRuns(runs);
  ASSERT_EQ(c.config.size(), 1u) << ComparisonJson(c).dump();
  EXPECT_EQ(c.config[0].field, "policy.queue");
  EXPECT_EQ(c.config[0].values[1], "batch");
  EXPECT_EQ(c.config[0].sources[1], "platform default");
}

TEST(CompareTest, FlattenNamesLeavesByPath) {
  std::vector<std::pair<std::string, std::string>> out;
  FlattenJson(json{{"a", {{"b", 1}, {"c", json::array({"x", "y"})}}}, {"e", json::object()}}, "",
              &out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0], (std::pair<std::string, std::string>{"a.b", "1"}));
  EXPECT_EQ(out[1], (std::pair<std::string, std::string>{"a.c[0]", "x"}));
  EXPECT_EQ(out[2], (std::pair<std::string, std::string>{"a.c[1]", "y"}));
  EXPECT_EQ(out[3], (std::pair<std::string, std::string>{"e", "{}"}));
}

TEST(CompareTest, PackageNamesAreNormalizedAsPipDoes) {
  EXPECT_EQ(PackageName("numpy==1.26.4"), "numpy");
  EXPECT_EQ(PackageName("Foo_Bar.baz[extra]>=1.0; python_version>'3'"), "foo-bar-baz");
  EXPECT_EQ(PackageName("  torch >= 2"), "torch");
  EXPECT_EQ(PackageName("mylib @ file:///src/mylib"), "mylib");
  EXPECT_EQ(PackageName("-e git+https://example.com/x.git@abc#egg=My_Lib"), "my-lib");
  EXPECT_EQ(PackageName("--index-url https://example.com/simple"), "");
}

TEST(CompareTest, PackagesThatDifferSideBySide) {
  std::vector<CompareInput> runs;
  runs.push_back(MakeRun("a", "0.1", json::array(), {}));
  runs.push_back(MakeRun("b", "0.1", json::array(), {}));
  runs[0].record["runtime"] = {
      {"pip", json::array({"numpy>=1.20", "requests"})},
      {"packages", json::array({"numpy==1.26.4", "requests==2.31.0", "urllib3==2.0.7"})}};
  runs[1].record["runtime"] = {{"pip", json::array({"NumPy>=1.20", "requests", "tqdm"})},
                               {"packages", json::array({"numpy==2.0.0", "requests==2.31.0",
                                                         "urllib3==2.0.7", "tqdm==4.66.1"})}};
  Comparison c = CompareRuns(runs);
  ASSERT_EQ(c.packages.size(), 2u) << ComparisonJson(c).dump();  // requests, urllib3 the same
  EXPECT_EQ(c.packages[0].name, "numpy");
  EXPECT_EQ(c.packages[0].resolved[0], "1.26.4");
  EXPECT_EQ(c.packages[0].resolved[1], "2.0.0");
  EXPECT_EQ(c.packages[0].requested[1], "NumPy>=1.20");
  EXPECT_EQ(c.packages[1].name, "tqdm");
  EXPECT_EQ(c.packages[1].requested[0], std::nullopt);
  EXPECT_EQ(c.packages[1].resolved[0], std::nullopt);
  EXPECT_EQ(c.package_counts, (std::vector<int64_t>{3, 4}));

  std::string table = FormatComparison(c);
  EXPECT_NE(table.find("1.26.4 (asked: numpy>=1.20)"), std::string::npos) << table;
  EXPECT_NE(table.find("4.66.1 (asked: tqdm)"), std::string::npos) << table;
  EXPECT_EQ(table.find("urllib3"), std::string::npos) << table;
  json j = ComparisonJson(c);
  EXPECT_EQ(j["packages"][0]["name"], "numpy");
  EXPECT_EQ(j["packages"][0]["runs"][1]["resolved"], "2.0.0");
  EXPECT_EQ(j["packages"][1]["runs"][0]["requested"], nullptr);
  EXPECT_EQ(j["runs"][1]["package_count"], 4);
}

TEST(CompareTest, NoPackagesAnywhereSaysSo) {
  std::vector<CompareInput> runs;
  runs.push_back(MakeRun("a", "0.1", json::array(), {}));
  runs.push_back(MakeRun("b", "0.1", json::array(), {}));
  Comparison c = CompareRuns(runs);
  EXPECT_TRUE(c.packages.empty());
  EXPECT_NE(FormatComparison(c).find("no run asks for packages"), std::string::npos);
  runs[0].record["runtime"] = {{"pip", json::array({"six"})}, {"packages", json::array()}};
  runs[1].record["runtime"] = runs[0].record["runtime"];
  EXPECT_NE(FormatComparison(CompareRuns(runs)).find("(the same in every run)\n\nMetrics"),
            std::string::npos)
      << FormatComparison(CompareRuns(runs));
}

TEST(CompareTest, MetricKeepsOnlyTheSeriesItNames) {
  std::vector<CompareInput> runs;
  runs.push_back(MakeRun("a", "0.1", json::array(), {{0, 1.0}}));
  runs.push_back(MakeRun("b", "0.1", json::array(), {{0, 2.0}}));
  for (auto& r : runs)
    for (const char* name : {"accuracy", "train/loss"}) {
      evidence::MetricPoint p;
      p.name = name;
      p.step = 0;
      p.value = 0.5;
      r.metrics.Add(p);
    }
  evidence::MetricPoint val;
  val.name = "loss";
  val.split = "val";
  val.value = 3;
  runs[0].metrics.Add(val);
  Comparison c = CompareRuns(runs, "loss");
  ASSERT_EQ(c.metrics.size(), 2u);  // loss, loss/val; not train/loss nor accuracy
  EXPECT_EQ(c.metrics[0].split, "");
  EXPECT_EQ(c.metrics[1].split, "val");
  ASSERT_EQ(CompareRuns(runs, "loss/val").metrics.size(), 1u);
  ASSERT_EQ(CompareRuns(runs, "train/loss").metrics.size(), 1u);
  EXPECT_TRUE(CompareRuns(runs, "nope").metrics.empty());
}

}  // namespace
}  // namespace tau::cli
