// Simulator tests: golden files (tests/data/admission/NAME.yaml -> NAME.json) and strict parsing.
// Set TAU_UPDATE_GOLDENS=1 to rewrite the expected JSON after a deliberate change.
#include "admission/simulate.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tau::admission {
namespace {

std::filesystem::path DataDir() {
  const char* src = std::getenv("TAU_SOURCE_DIR");
  std::filesystem::path root = src ? src : TAU_TEST_SOURCE_DIR;
  return root / "tests" / "data" / "admission";
}

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SimulateGoldenTest, AllFiles) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(DataDir())) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    SCOPED_TRACE(entry.path().filename().string());
    std::string yaml = ReadAll(entry.path());
    int cycles = 1;
    if (yaml.rfind("# cycles: ", 0) == 0) cycles = std::atoi(yaml.c_str() + 10);
    Result<nlohmann::json> got = Simulate(yaml, entry.path().filename().string(), cycles);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    std::filesystem::path golden = entry.path();
    golden.replace_extension(".json");
    if (std::getenv("TAU_UPDATE_GOLDENS")) {
      std::ofstream(golden) << got->dump(2) << "\n";
      continue;
    }
    ASSERT_TRUE(std::filesystem::exists(golden)) << golden;
    nlohmann::json want = nlohmann::json::parse(ReadAll(golden));
    EXPECT_EQ(*got, want) << "got:\n" << got->dump(2);
  }
  EXPECT_GE(files, 10);
}

TEST(SimulateTest, OutputShape) {
  Result<nlohmann::json> got = Simulate(
      "flavors: [{name: h100}]\n"
      "queues:\n"
      "  - name: q\n"
      "    resource_groups: [{covered_resources: [nvidia.com/gpu], flavors: [{name: h100, "
      "resources: [{name: nvidia.com/gpu, nominal: 0}]}]}]\n"
      "workloads:\n"
      "  - {name: w, queue: q, requests: {nvidia.com/gpu: 2}}\n",
      "x.yaml", 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const nlohmann::json& p = (*got)["pending"][0];
  EXPECT_EQ(p["name"], "w");
  EXPECT_EQ(p["reason"], "ExceedsMaxQuota");
  EXPECT_NE(p["message"].get<std::string>().find(
                "insufficient quota for nvidia.com/gpu in flavor h100, request 2 > maximum "
                "capacity 0"),
            std::string::npos);
  EXPECT_EQ(p["inadmissible"], true);
  EXPECT_EQ(p["position"], 0);
  EXPECT_TRUE((*got)["admitted"].empty());
  EXPECT_TRUE((*got)["preempted"].empty());
}

TEST(SimulateTest, ACopyOfAPlatformFileSimulatesAndSaysWhatItLeftOut) {
  // docs/platform.md: a platform file with workloads added is a simulation.
  Result<nlohmann::json> got = Simulate(
      "schema_version: 1\n"
      "flavors: [{name: default}]\n"
      "queues:\n"
      "  - name: main\n"
      "    resource_groups: [{covered_resources: [cpu], flavors: [{name: default, resources: "
      "[{name: cpu, nominal: 4}]}]}]\n"
      "priorities: [{name: high, value: 100}]\n"
      "workspaces: [{name: w, members: ['*'], default_queue: main}]\n"
      "workloads:\n"
      "  - {name: a, queue: main, requests: {cpu: 3}}\n",
      "platform-copy.yaml", 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)["admitted"][0]["name"], "a");
  EXPECT_EQ((*got)["not_simulated"],
            nlohmann::json::array({"schema_version", "priorities", "workspaces"}));
  // A file that is only a simulation says nothing of the kind.
  got = Simulate("flavors: [{name: f}]\nqueues: []\n", "sim.yaml", 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->contains("not_simulated"));
}

struct BadInput {
  std::string name;
  std::string yaml;
  std::vector<std::string> errors;  // each must appear in the diagnostics
};

TEST(SimulateTest, MalformedInputIsReportedWithPositions) {
  const std::string queue =
      "queues:\n"
      "  - name: q\n"
      "    resource_groups:\n"
      "      - covered_resources: [cpu]\n"
      "        flavors: [{name: default, resources: [{name: cpu, nominal: 4}]}]\n";
  std::vector<BadInput> cases = {
      {"yaml syntax", "flavors: [{name: a\n", {"x.yaml:2:1: error: "}},
      {"unknown top-level key",
       "flavors: []\nqueus: []\n",
       {"x.yaml:2:1: error: unknown key 'queus' in the simulation (did you mean 'queues'?)"}},
      {"unknown key and bad quantity",
       "flavors: [{name: default}]\nqueues:\n  - name: q\n    resource_groups:\n"
       "      - covered_resources: [cpu]\n        flavors: [{name: default, resources: "
       "[{name: cpu, nominl: 4, borrowing_limit: lots}]}]\n",
       {"x.yaml:6:59: error: unknown key 'nominl' in resource (did you mean 'nominal'?)",
        "x.yaml:6:87: error: borrowing_limit: invalid quantity 'lots'"}},
      {"unknown flavor, cohort and queue",
       "flavors: [{name: default}]\nqueues:\n  - name: q\n    cohort: nope\n"
       "    resource_groups:\n      - covered_resources: [cpu]\n"
       "        flavors: [{name: defualt, resources: [{name: cpu, nominal: 4}]}]\n"
       "workloads:\n  - {name: w, queue: qq, requests: {cpu: 1}}\n",
       {"x.yaml:7:26: error: unknown flavor 'defualt' (did you mean 'default'?)",
        "x.yaml:4:13: error: unknown cohort 'nope'",
        "x.yaml:9:22: error: unknown queue 'qq' (did you mean 'q'?)"}},
      {"cohort cycle",
       "flavors: [{name: default}]\ncohorts:\n  - {name: a, parent: b}\n  - {name: b, parent: a}\n",
       {"x.yaml:3:12: error: cohort 'a' is part of a cycle",
        "x.yaml:4:12: error: cohort 'b' is part of a cycle"}},
      {"bad types",
       "flavors: [{name: default}]\n" + queue +
           "workloads:\n  - {name: w, queue: q, priority: high, created: yesterday, requests: "
           "[1]}\n",
       {"x.yaml:8:35: error: priority must be an integer",
        "x.yaml:8:50: error: created: ", "x.yaml:8:71: error: requests must be a mapping"}},
      {"wrong enum",
       "flavors: [{name: default}]\nqueues:\n  - {name: q, queueing_strategy: Fifo}\n",
       {"x.yaml:3:34: error: queueing_strategy must be one of StrictFIFO, BestEffortFIFO"}},
      {"not a mapping", "- a\n- b\n", {"x.yaml:1:1: error: the simulation must be a mapping"}},
      // Found by fuzz/simulate_fuzz.cc: the name reached the JSON result, whose dump() threw.
      {"not UTF-8",
       "flavors: [{name: default}]\nqueues:\n  - name: q\xff\n",
       {"x.yaml:3:12: error: invalid UTF-8 byte 0xff: the file must be UTF-8 text"}},
      {"admission fair sharing mistakes",
       "flavors: [{name: default}]\nqueues:\n  - {name: q, admission_mode: UsageBased}\n"
       "  - {name: r, admission_mode: UsageBasedAdmissionFairSharing}\n"
       "local_queues:\n  - {name: lq, queue: q, usage: {cpu: 1}}\n  - {name: lq2, queue: qq}\n"
       "workloads:\n  - {name: w, local_queue: lq, queue: r, requests: {cpu: 1}}\n",
       {"x.yaml:3:31: error: admission_mode must be one of UsageBasedAdmissionFairSharing, "
        "NoAdmissionFairSharing, not 'UsageBased'",
        "x.yaml:4:31: error: admission_mode UsageBasedAdmissionFairSharing needs the top-level "
        "admission_fair_sharing section",
        "x.yaml:6:33: error: queue 'q' does not use admission fair sharing",
        "x.yaml:7:24: error: unknown queue 'qq'",
        "x.yaml:9:39: error: local queue 'lq' belongs to queue 'q'"}},
      {"admission fair sharing settings",
       "admission_fair_sharing: {usage_sampling_interval: 10ms, resource_weights: {cpu: -1}}\n",
       {"x.yaml:1:25: error: admission_fair_sharing needs usage_half_life",
        "x.yaml:1:51: error: usage_sampling_interval must be at least 1s",
        "x.yaml:1:81: error: resource weight must be a non-negative number"}},
      {"admitted with unknown flavor",
       "flavors: [{name: default}]\n" + queue +
           "workloads:\n  - {name: w, queue: q, requests: {cpu: 1}, admitted: {flavors: {cpu: "
           "gpu}}}\n",
       {"x.yaml:8:71: error: unknown flavor 'gpu'"}},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Diagnostic> diags;
    Result<nlohmann::json> got = Simulate(c.yaml, "x.yaml", 1, &diags);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    const std::string& msg = got.status().message();
    size_t at = 0;
    for (const std::string& e : c.errors) {
      size_t found = msg.find(e);
      EXPECT_NE(found, std::string::npos) << "missing '" << e << "' in:\n" << msg;
      (void)at;
    }
    EXPECT_FALSE(diags.empty());
  }
}

TEST(SimulateTest, SemanticErrorsFromTheEngineAreReported) {
  // A flavor listed twice in one queue passes the loader but not the engine.
  Result<nlohmann::json> got = Simulate(
      "flavors: [{name: default}]\nqueues:\n  - name: q\n    resource_groups:\n"
      "      - covered_resources: [cpu]\n        flavors: [{name: default, resources: [{name: "
      "cpu, nominal: 1}]}, {name: default, resources: [{name: cpu, nominal: 1}]}]\n",
      "x.yaml", 1);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("x.yaml:1:1: error: queue 'q': flavor 'default' is "
                                        "listed more than once"),
            std::string::npos)
      << got.status().message();
}

TEST(SimulateTest, NeverThrowsOnGarbage) {
  const char* inputs[] = {"",
                          "{",
                          "]",
                          "flavors: 3",
                          "queues: {a: b}",
                          "workloads: [1, 2]",
                          "flavors: [{name: [x]}]",
                          "\t\tfoo: bar",
                          "*alias",
                          "queues: [{name: q, resource_groups: 7}]"};
  for (const char* in : inputs) {
    Result<nlohmann::json> got = Simulate(in, "g.yaml", 1);
    EXPECT_FALSE(got.ok()) << in;
  }
}

}  // namespace
}  // namespace tau::admission
