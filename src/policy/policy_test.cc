// Platform parsing: the corpus under tests/data/policy (valid files parse; each invalid file's
// first line says which error, with its position, it must produce), the example platform, the
// default platform and the conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "admission/admission.h"
#include "admission/simulate.h"
#include "policy/policy.h"
#include "policy/policy_test_util.h"

namespace tau::policy {
namespace {

using testing::Errors;
using testing::MustParse;
using testing::ReadAll;
using testing::SourceDir;

std::vector<std::filesystem::path> Corpus(const std::string& kind) {
  std::vector<std::filesystem::path> files;
  for (const auto& e :
       std::filesystem::directory_iterator(SourceDir() / "tests/data/policy" / kind)) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(PlatformCorpusTest, ValidFilesParse) {
  std::vector<std::filesystem::path> files = Corpus("valid");
  EXPECT_GE(files.size(), 3u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    PlatformOutcome out = ParsePlatform(ReadAll(path), path.filename().string());
    EXPECT_TRUE(out.ok()) << out.ErrorText();
    if (out.ok()) {
      EXPECT_TRUE(admission::Engine::Create(ToAdmissionConfig(*out.platform)).ok());
    }
  }
}

TEST(PlatformCorpusTest, InvalidFilesFailWithTheExpectedError) {
  std::vector<std::filesystem::path> files = Corpus("invalid");
  EXPECT_GE(files.size(), 30u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    std::string text = ReadAll(path);
    const std::string marker = "# expect: ";
    ASSERT_EQ(text.rfind(marker, 0), 0u) << "the first line must be '# expect: ...'";
    std::string expect = text.substr(marker.size(), text.find('\n') - marker.size());
    PlatformOutcome out = ParsePlatform(text, path.filename().string());
    ASSERT_FALSE(out.ok());
    EXPECT_NE(out.ErrorText().find(expect), std::string::npos) << "want: " << expect << "\ngot:\n"
                                                               << out.ErrorText();
    for (const Diagnostic& d : out.diagnostics) EXPECT_GT(d.line, 0) << d.ToString();
  }
}

TEST(PlatformTest, ExamplePlatform) {
  Platform p = MustParse(ReadAll(SourceDir() / "examples/platform/platform.yaml"));
  ASSERT_EQ(p.admission.queues.size(), 2u);
  EXPECT_EQ(p.admission.queues[0].cohort, "lab");
  EXPECT_EQ(p.admission.queues[1].queueing_strategy, admission::QueueingStrategy::kStrictFifo);
  ASSERT_EQ(p.admission.cohorts.size(), 1u);
  ASSERT_EQ(p.priorities.size(), 3u);
  EXPECT_EQ(p.FindPriority("priority")->value, 1000);
  ASSERT_EQ(p.workspaces.size(), 2u);
  const Workspace* research = p.FindWorkspace("research");
  ASSERT_NE(research, nullptr);
  EXPECT_EQ(research->members, (std::vector<std::string>{"alice", "bob", "group:ml-research"}));
  EXPECT_EQ(research->limits.max_gpus_per_run, 8);
  EXPECT_EQ(research->limits.max_runtime_ms, 72 * 3600 * 1000LL);
  EXPECT_EQ(research->default_profile, "one-gpu");
  EXPECT_EQ(p.FindProfile("full-node")->flavor, "h100");
  EXPECT_EQ(p.FindProfile("one-gpu")->memory, Quantity::FromUnits(96LL << 30));
  EXPECT_TRUE(p.FindStorage("datasets")->read_only);
  EXPECT_EQ(p.defaults.cpus, Quantity::FromUnits(2));
  // The two queues' GPU quotas add up to the machine's 8.
  int64_t gpus = 0;
  for (const auto& q : p.admission.queues) {
    for (const auto& r : q.resource_groups[0].flavors[0].resources) {
      if (r.name == kGpuResource) gpus += r.nominal.CeilUnits();
    }
  }
  EXPECT_EQ(gpus, 8);
  EXPECT_TRUE(admission::Engine::Create(ToAdmissionConfig(p)).ok());
}

TEST(PlatformTest, ExampleSharesGpusThroughTheCohort) {
  Platform p = MustParse(ReadAll(SourceDir() / "examples/platform/platform.yaml"));
  Result<admission::Engine> engine = admission::Engine::Create(ToAdmissionConfig(p));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  admission::Workload w;
  w.name = "big";
  w.queue = "research";
  w.pod_sets.push_back({"main", 1, {{kGpuResource, Quantity::FromUnits(8)}}, {}, {}});
  ASSERT_TRUE(engine->AddWorkload(w).ok());
  admission::CycleResult r = engine->RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u) << "research borrows product's idle GPUs";
}

TEST(PlatformTest, ToJsonShowsEverySection) {
  Platform p = MustParse(ReadAll(SourceDir() / "examples/platform/platform.yaml"));
  nlohmann::json j = ToJson(p);
  for (const char* key : {"flavors", "cohorts", "queues", "fair_sharing", "priorities",
                          "workspaces", "compute_profiles", "storage", "defaults"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["queues"][0]["queueing_strategy"], "BestEffortFIFO");
  EXPECT_EQ(j["queues"][0]["resource_groups"][0]["flavors"][0]["resources"][2]["borrowing_limit"],
            "2");
  EXPECT_EQ(j["queues"][0]["preemption"]["borrow_within_cohort"]["max_priority_threshold"], 100);
  EXPECT_EQ(j["workspaces"][0]["limits"]["max_runtime"], "72h");
  EXPECT_EQ(j["workspaces"][1]["limits"]["max_workers"], 1);
  EXPECT_EQ(j["compute_profiles"][0]["memory"], "16Gi");
  EXPECT_EQ(j["storage"][0]["read_only"], true);
  EXPECT_EQ(j["defaults"]["memory"], "8Gi");
}

TEST(PlatformTest, AllErrorsAtOnceInFileOrder) {
  PlatformOutcome out = ParsePlatform(
      "queues: []\n"
      "workspaces:\n"
      "  - name: a\n"
      "    members: [x]\n"
      "    default_queue: nope\n"
      "  - name: a\n"
      "    memberz: [y]\n"
      "prioritys: []\n",
      "p.yaml");
  ASSERT_FALSE(out.ok());
  std::string text = out.ErrorText();
  EXPECT_NE(text.find("p.yaml:5:20: error: workspaces[0].default_queue: unknown queue 'nope'"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("p.yaml:6:11: error: workspace 'a' is defined twice"), std::string::npos)
      << text;
  EXPECT_NE(text.find("p.yaml:7:5: error: unknown field 'memberz' in 'workspaces[1]' (did you "
                      "mean 'members'?)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("p.yaml:8:1: error: unknown field 'prioritys' (did you mean "
                      "'priorities'?)"),
            std::string::npos)
      << text;
  for (size_t i = 1; i < out.diagnostics.size(); ++i) {
    EXPECT_LE(out.diagnostics[i - 1].line, out.diagnostics[i].line);
  }
}

TEST(PlatformTest, EmptyAndNonMappingFiles) {
  EXPECT_NE(Errors("").find("p.yaml:1:1: error: the platform file is empty"), std::string::npos);
  EXPECT_NE(Errors("- a\n").find("expected a mapping, got a list"), std::string::npos);
  EXPECT_NE(Errors("a: [\n").find("p.yaml:"), std::string::npos);
}

TEST(PlatformTest, TooLarge) {
  std::string text(kMaxPlatformBytes + 1, '#');
  EXPECT_NE(Errors(text).find("larger than"), std::string::npos);
}

TEST(PlatformTest, QuotedNumbersAreStrings) {
  std::string text = Errors(
      "queues: []\n"
      "priorities: [{name: p, value: \"5\"}]\n"
      "workspaces: [{name: w, members: [\"*\"]}]\n");
  EXPECT_NE(text.find("priorities[0].value: expected an integer, got a string ('5')"),
            std::string::npos)
      << text;
}

TEST(PlatformTest, SimulatorFilesAndPlatformFilesShareTheAdmissionSections) {
  // The simulator's own error text and position come through unchanged.
  std::string text = Errors(
      "flavors: [{name: f}]\n"
      "queues:\n"
      "  - name: q\n"
      "    resource_groups:\n"
      "      - covered_resources: [cpu]\n"
      "        flavors: [{name: f, resources: [{name: cpu, nominl: 1}]}]\n"
      "workspaces: [{name: w, members: [\"*\"]}]\n");
  EXPECT_NE(text.find("p.yaml:6:53: error: unknown key 'nominl' in resource (did you mean "
                      "'nominal'?)"),
            std::string::npos)
      << text;
}

TEST(PlatformTest, AdmissionConfigParserIgnoresOtherSections) {
  std::vector<admission::Diagnostic> diags;
  Result<admission::Config> c = admission::ParseAdmissionConfig(
      "flavors: [{name: f}]\nworkspaces: whatever\nqueues: [{name: q, cohort: nope}]\n", "p.yaml",
      &diags);
  ASSERT_FALSE(c.ok());
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_EQ(diags[0].ToString(), "p.yaml:3:28: error: unknown cohort 'nope'");
  c = admission::ParseAdmissionConfig("flavors: [{name: f}]\nanything: 1\n", "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->flavors.size(), 1u);
  EXPECT_TRUE(admission::ParseAdmissionConfig("- a list\n", "p.yaml").ok());
}

TEST(DefaultPlatformTest, OneQueueSizedToTheMachine) {
  Platform p = DefaultPlatform(4, 32000, 256LL << 30);
  ASSERT_EQ(p.admission.flavors.size(), 1u);
  EXPECT_EQ(p.admission.flavors[0].name, "default");
  ASSERT_EQ(p.admission.queues.size(), 1u);
  const admission::ClusterQueue& q = p.admission.queues[0];
  EXPECT_EQ(q.name, "default");
  ASSERT_EQ(q.resource_groups.size(), 1u);
  EXPECT_EQ(q.resource_groups[0].covered_resources,
            (std::vector<std::string>{"cpu", "memory", "nvidia.com/gpu"}));
  const auto& res = q.resource_groups[0].flavors[0].resources;
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[0].nominal, Quantity::FromMilli(32000));
  EXPECT_EQ(res[1].nominal, Quantity::FromUnits(256LL << 30));
  EXPECT_EQ(res[2].nominal, Quantity::FromUnits(4));
  ASSERT_EQ(p.priorities.size(), 1u);
  EXPECT_EQ(p.priorities[0].name, "default");
  EXPECT_EQ(p.priorities[0].value, 0);
  ASSERT_EQ(p.workspaces.size(), 1u);
  EXPECT_EQ(p.workspaces[0].name, "default");
  EXPECT_EQ(p.workspaces[0].default_queue, "default");
  EXPECT_EQ(p.workspaces[0].default_priority, "default");
  EXPECT_EQ(p.workspaces[0].members, (std::vector<std::string>{"*"}));
  EXPECT_TRUE(admission::Engine::Create(ToAdmissionConfig(p)).ok());
}

TEST(DefaultPlatformTest, MachineWithoutGpus) {
  Platform p = DefaultPlatform(0, 2000, 1LL << 30);
  EXPECT_EQ(p.admission.queues[0].resource_groups[0].flavors[0].resources[2].nominal,
            Quantity::FromUnits(0));
  EXPECT_TRUE(admission::Engine::Create(ToAdmissionConfig(p)).ok());
  // What `tau platform show` prints for it round-trips through the parser.
  nlohmann::json j = ToJson(p);
  EXPECT_EQ(j["workspaces"][0]["members"][0], "*");
}

TEST(DefaultPlatformTest, EveryUserResolvesToTheDefaults) {
  Platform p = DefaultPlatform(8, 64000, 512LL << 30);
  spec::RunSpec s;
  s.compute.gpus = 2;
  Result<ResolvedRun> r = Resolve(s, p, "anyone");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->workspace, "default");
  EXPECT_EQ(r->queue, "default");
  EXPECT_EQ(r->priority_class, "default");
  EXPECT_EQ(r->priority, 0);
  EXPECT_EQ(r->total_requests.at(kGpuResource), Quantity::FromUnits(2));
}

TEST(GlobTest, Patterns) {
  EXPECT_TRUE(GlobMatch("*", "anything/at:all"));
  EXPECT_TRUE(GlobMatch("nvcr.io/nvidia/pytorch:*", "nvcr.io/nvidia/pytorch:24.05-py3"));
  EXPECT_FALSE(GlobMatch("nvcr.io/nvidia/pytorch:*", "nvcr.io/nvidia/tensorflow:24.05"));
  EXPECT_TRUE(GlobMatch("ghcr.io/example/*", "ghcr.io/example/team/img:1"));
  EXPECT_TRUE(GlobMatch("img:?.?", "img:1.2"));
  EXPECT_FALSE(GlobMatch("img:?.?", "img:1.23"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXXbYYbc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "aXXbYYbd"));
  EXPECT_TRUE(GlobMatch("exact", "exact"));
  EXPECT_FALSE(GlobMatch("exact", "exact2"));
  EXPECT_TRUE(GlobMatch("", ""));
  EXPECT_FALSE(GlobMatch("", "x"));
}

TEST(PlatformTest, RunUserPoolsAndServerProtectingLimits) {
  Platform p = MustParse(
      "queues:\n"
      "  - name: q\n"
      "    resource_groups:\n"
      "      - covered_resources: [cpu]\n"
      "        flavors: [{name: f, resources: [{name: cpu, nominal: 8}]}]\n"
      "flavors: [{name: f}]\n"
      "workspaces:\n"
      "  - name: a\n"
      "    members: [\"*\"]\n"
      "    run_users: [tau-a1, tau-a2]\n"
      "    limits: {max_log_bytes: 64Mi, max_metric_points: 1000, max_metric_series: 5}\n"
      "  - name: b\n"
      "    members: [\"*\"]\n");
  const Workspace* a = p.FindWorkspace("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->run_users, (std::vector<std::string>{"tau-a1", "tau-a2"}));
  EXPECT_EQ(a->limits.max_log_bytes, 64 << 20);
  EXPECT_EQ(a->limits.max_metric_points, 1000);
  EXPECT_EQ(a->limits.max_metric_series, 5);
  EXPECT_TRUE(p.FindWorkspace("b")->run_users.empty());
  nlohmann::json j = ToJson(p);
  EXPECT_EQ(j["workspaces"][0]["run_users"][1], "tau-a2");
  EXPECT_EQ(j["workspaces"][1]["limits"]["max_log_bytes"], kDefaultMaxLogBytes);
}

}  // namespace
}  // namespace tau::policy

namespace tau::policy {
namespace {

TEST(PlatformTest, BudgetsParseWithTheirScopesLimitsAndPeriods) {
  Platform p = testing::MustParse(
      testing::ReadAll(testing::SourceDir() / "tests/data/policy/valid/budgets.yaml"));
  ASSERT_EQ(p.budgets.size(), 4u);
  const Budget& w = p.budgets[0];
  EXPECT_EQ(w.workspace, "vision");
  EXPECT_EQ(*w.gpu_hours, 400);
  EXPECT_FALSE(w.cpu_hours);
  EXPECT_EQ(w.period, "month");
  EXPECT_EQ(w.warn_at, 0.8);
  EXPECT_EQ(w.on_exceed, "wait");
  EXPECT_EQ(w.line, 12);
  const Budget& each = p.budgets[1];
  EXPECT_EQ(each.user, "*");
  EXPECT_EQ(*each.gpu_hours, 50.5);
  EXPECT_EQ(each.window_ms, int64_t{7} * 24 * 3600 * 1000);
  EXPECT_EQ(each.warn_at, 0.9);
  EXPECT_EQ(p.budgets[2].user, "alice");
  EXPECT_EQ(*p.budgets[2].cpu_hours, 1000);
  const Budget& q = p.budgets[3];
  EXPECT_EQ(q.queue, "q");
  EXPECT_EQ(q.name, "q-daily");
  EXPECT_EQ(*q.gpu_hours, 0);
  EXPECT_EQ(q.on_exceed, "refuse");
  EXPECT_EQ(ToJson(p)["budgets"][3]["cpu_hours"], 12);
}

TEST(PlatformTest, CostsParsePerFlavor) {
  Platform p = testing::MustParse(
      testing::ReadAll(testing::SourceDir() / "tests/data/policy/valid/costs.yaml"));
  EXPECT_EQ(p.costs.currency, "USD");
  ASSERT_EQ(p.costs.flavors.size(), 2u);
  EXPECT_EQ(p.costs.flavors.at("a100").gpu_hour, 2.5);
  EXPECT_EQ(p.costs.flavors.at("a100").cpu_hour, 0.04);
  EXPECT_EQ(p.costs.flavors.at("cpu").gpu_hour, 0);
  EXPECT_EQ(p.costs.flavors.at("cpu").cpu_hour, 0.03);
  EXPECT_EQ(ToJson(p)["costs"]["flavors"]["cpu"]["cpu_hour"], 0.03);
  ASSERT_EQ(p.budgets.size(), 1u);
  EXPECT_EQ(p.budgets[0].cost, 1500.5);
  EXPECT_EQ(p.budgets[0].currency, "USD");
  EXPECT_FALSE(p.budgets[0].gpu_hours);
  EXPECT_EQ(ToJson(p)["budgets"][0]["cost"], 1500.5);
  EXPECT_TRUE(ToJson(testing::MustParse(
      testing::ReadAll(testing::SourceDir() / "tests/data/policy/valid/minimal.yaml")))["costs"]
                  .is_null());
}

TEST(PlatformTest, IdleAndStallLimitsParseWithTheirDefaults) {
  Platform p = testing::MustParse(
      testing::ReadAll(testing::SourceDir() / "tests/data/policy/valid/guardrails.yaml"));
  ASSERT_EQ(p.workspaces.size(), 2u);
  const WorkspaceLimits& w = p.workspaces[0].limits;
  ASSERT_TRUE(w.idle && w.stall);
  EXPECT_EQ(w.idle->gpu_util_below_pct, 10);
  EXPECT_EQ(w.idle->warn_after_ms, 30 * 60'000);
  EXPECT_EQ(w.idle->stop_after_ms, 2 * 3'600'000);
  EXPECT_EQ(w.stall->after_ms, 3'600'000);
  EXPECT_FALSE(w.stall->stop_after_ms);
  const WorkspaceLimits& quiet = p.workspaces[1].limits;
  ASSERT_TRUE(quiet.idle);
  EXPECT_EQ(quiet.idle->gpu_util_below_pct, 5);
  EXPECT_FALSE(quiet.idle->stop_after_ms);
  EXPECT_FALSE(quiet.stall);
  nlohmann::json limits = ToJson(p)["workspaces"][0]["limits"];
  EXPECT_EQ(limits["idle"],
            nlohmann::json::parse(R"({"gpu_util_below":10,"warn_after":"30m","stop_after":"2h"})"));
  EXPECT_EQ(limits["stall"], nlohmann::json::parse(R"({"after":"1h","stop_after":null})"));
  EXPECT_TRUE(ToJson(p)["workspaces"][1]["limits"]["stall"].is_null());
  const std::vector<Webhook>& hooks = p.workspaces[1].webhooks;
  ASSERT_EQ(hooks.size(), 2u);
  EXPECT_EQ(hooks[0].url, "https://hooks.example.com/tau");
  EXPECT_EQ(hooks[0].secret, "HOOK_KEY");
  EXPECT_EQ(hooks[0].events, spec::WebhookEventKinds());  // every kind when not given
  EXPECT_EQ(hooks[1].events, (std::vector<std::string>{"guardrail", "budget"}));
  EXPECT_EQ(ToJson(p)["workspaces"][1]["webhooks"][1]["url"], "http://[::1]:9000/events");
  EXPECT_EQ(p.workspaces[1].allowed_webhooks,
            std::vector<std::string>{"https://hooks.example.com/*"});
  EXPECT_EQ(ToJson(p)["workspaces"][1]["allowed_webhooks"][0], "https://hooks.example.com/*");
  EXPECT_TRUE(p.workspaces[0].allowed_webhooks.empty());
}

}  // namespace
}  // namespace tau::policy

namespace tau::policy {
namespace {

TEST(GuardrailLimitsTest, ASpecTightensItsWorkspacesLimitsAndNeverLoosensThem) {
  Workspace w;
  w.limits.idle = IdleLimit{5, 30 * 60'000, 2 * 3'600'000};
  w.limits.stall = StallLimit{3'600'000, std::nullopt};
  spec::Policy none;
  EXPECT_EQ(EffectiveIdle(&w, none)->warn_after_ms, 30 * 60'000);
  EXPECT_FALSE(EffectiveIdle(nullptr, none).has_value());

  spec::Policy tight;
  tight.idle = spec::IdleGuard{20, 10 * 60'000, std::nullopt};
  tight.stall = spec::StallGuard{std::nullopt, 90 * 60'000};
  std::optional<IdleLimit> idle = EffectiveIdle(&w, tight);
  EXPECT_EQ(idle->gpu_util_below_pct, 20);        // the higher threshold
  EXPECT_EQ(idle->warn_after_ms, 10 * 60'000);    // the sooner warning
  EXPECT_EQ(idle->stop_after_ms, 2 * 3'600'000);  // the workspace's stop stays
  std::optional<StallLimit> stall = EffectiveStall(&w, tight);
  EXPECT_EQ(stall->after_ms, 3'600'000);
  EXPECT_EQ(stall->stop_after_ms, 90 * 60'000);  // a stop where the workspace had none

  spec::Policy loose;
  loose.idle = spec::IdleGuard{1, 5 * 3'600'000, 9 * 3'600'000};
  idle = EffectiveIdle(&w, loose);
  EXPECT_EQ(idle->gpu_util_below_pct, 5);
  EXPECT_EQ(idle->warn_after_ms, 30 * 60'000);
  EXPECT_EQ(idle->stop_after_ms, 2 * 3'600'000);

  // A stop sooner than the workspace's warning moves the warning up to it.
  spec::Policy quick;
  quick.idle = spec::IdleGuard{std::nullopt, std::nullopt, 60'000};
  idle = EffectiveIdle(&w, quick);
  EXPECT_EQ(idle->warn_after_ms, 60'000);
  EXPECT_EQ(idle->stop_after_ms, 60'000);

  // Where the workspace has none, the spec's own are the limits; a stop alone warns at the stop.
  Workspace bare;
  idle = EffectiveIdle(&bare, quick);
  ASSERT_TRUE(idle.has_value());
  EXPECT_EQ(idle->gpu_util_below_pct, IdleLimit().gpu_util_below_pct);
  EXPECT_EQ(idle->warn_after_ms, 60'000);
  spec::Policy empty_guard;
  empty_guard.stall = spec::StallGuard{};
  EXPECT_FALSE(EffectiveStall(&bare, empty_guard).has_value());
}

}  // namespace
}  // namespace tau::policy
