// Resolution against the example platform (examples/platform/platform.yaml): every precedence
// rule, every limit, membership, storage, flavors and the provenance of each value.
#include <gtest/gtest.h>

#include <set>

#include "common/strings.h"

#include "policy/policy.h"
#include "policy/policy_test_util.h"

namespace tau::policy {
namespace {

using testing::ExamplePlatform;
using testing::MustParse;

class ResolveTest : public ::testing::Test {
 protected:
  Result<ResolvedRun> Run(const std::string& user = "alice") {
    return Resolve(spec_, platform_, user);
  }
  ResolvedRun MustResolve(const std::string& user = "alice") {
    Result<ResolvedRun> r = Run(user);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : ResolvedRun{};
  }
  std::string Error(const std::string& user = "alice") {
    Result<ResolvedRun> r = Run(user);
    EXPECT_FALSE(r.ok()) << "expected an error";
    return r.ok() ? "" : r.status().message();
  }
  // "value | source" of a field, or "(missing)".
  static std::string Of(const ResolvedRun& r, std::string_view field) {
    const Provenance* p = r.Find(field);
    return p == nullptr ? "(missing)" : p->value + " | " + p->source;
  }

  Platform platform_ = ExamplePlatform();
  spec::RunSpec spec_;
};

TEST_F(ResolveTest, EverythingFromDefaults) {
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.workspace"), "research | platform default");
  EXPECT_EQ(Of(r, "policy.profile"), "one-gpu | workspace research default");
  EXPECT_EQ(Of(r, "policy.queue"), "research | workspace research default");
  EXPECT_EQ(Of(r, "policy.priority"), "default (100) | workspace research default");
  EXPECT_EQ(Of(r, "compute.workers"), "1 | spec");
  EXPECT_EQ(Of(r, "compute.gpus"), "1 | compute profile one-gpu");
  EXPECT_EQ(Of(r, "compute.cpus"), "8 | compute profile one-gpu");
  EXPECT_EQ(Of(r, "compute.memory"), "96Gi | compute profile one-gpu");
  EXPECT_EQ(Of(r, "flavors"), "h100 | compute profile one-gpu");
  EXPECT_EQ(Of(r, "run.max_runtime"), "72h | platform limit (workspace research)");
  EXPECT_EQ(Of(r, "storage.output"),
            "research-results at /results (read-write) | workspace research default");
  EXPECT_EQ(Of(r, "storage.checkpoint"),
            "research-results at /results (read-write) | workspace research default");
  EXPECT_EQ(r.workspace, "research");
  EXPECT_EQ(r.queue, "research");
  EXPECT_EQ(r.priority_class, "default");
  EXPECT_EQ(r.priority, 100);
  EXPECT_EQ(r.compute_profile, "one-gpu");
  EXPECT_EQ(r.gpus_per_worker, 1);
  EXPECT_EQ(r.flavors, std::vector<std::string>{"h100"});
  EXPECT_EQ(r.node_selector.at(kGpuClassLabel), "h100-80gb");
  EXPECT_EQ(r.max_runtime_ms, 72 * 3600 * 1000LL);
  EXPECT_EQ(r.total_requests.at("cpu"), Quantity::FromUnits(8));
  EXPECT_EQ(r.total_requests.at("memory"), Quantity::FromUnits(96LL << 30));
  EXPECT_EQ(r.total_requests.at("nvidia.com/gpu"), Quantity::FromUnits(1));
  ASSERT_EQ(r.mounts.size(), 2u);
  EXPECT_EQ(r.mounts[0].role, "output");
  EXPECT_EQ(r.mounts[0].host_path, "/srv/tau/research");
  EXPECT_EQ(r.mounts[0].pvc, "research-results");
  EXPECT_FALSE(r.mounts[0].read_only);
  // Every resolved value has exactly one provenance entry.
  std::set<std::string> fields;
  for (const Provenance& p : r.provenance) EXPECT_TRUE(fields.insert(p.field).second) << p.field;
}

TEST_F(ResolveTest, SpecWinsOverProfile) {
  spec_.compute.gpus = 2;
  spec_.compute.cpus = Quantity::FromUnits(4);
  spec_.compute.memory = Quantity::FromUnits(32LL << 30);
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "compute.gpus"), "2 | spec");
  EXPECT_EQ(Of(r, "compute.cpus"), "4 | spec");
  EXPECT_EQ(Of(r, "compute.memory"), "32Gi | spec");
  EXPECT_EQ(Of(r, "policy.profile"), "one-gpu | workspace research default");
}

// A value a --set gave is the command line's; one resolution records nothing of gets an entry of
// its own, with the value as typed.
TEST_F(ResolveTest, OverridesAreTheCommandLines) {
  auto set = spec::ParseOverrides({"compute.gpus=2", "runtime.env.LR=0.01", "compute.cpus=3"});
  ASSERT_TRUE(set.ok());
  spec::ParseOutcome parsed = spec::ParseSpec(
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\ncompute:\n  memory: 32Gi\n",
      "tau.yaml", *set);
  ASSERT_TRUE(parsed.ok()) << parsed.ErrorText();
  spec_ = *parsed.spec;
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "compute.gpus"), "2 | command line");
  EXPECT_EQ(Of(r, "compute.cpus"), "3 | command line");
  EXPECT_EQ(Of(r, "compute.memory"), "32Gi | spec");
  EXPECT_EQ(Of(r, "runtime.env.LR"), "0.01 | command line");
  EXPECT_EQ(Of(r, "policy.queue"), "research | workspace research default");
  // The same spec from a file: the file's.
  parsed = spec::ParseSpec(
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\ncompute:\n  gpus: 2\n",
      "tau.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.ErrorText();
  spec_ = *parsed.spec;
  r = MustResolve();
  EXPECT_EQ(Of(r, "compute.gpus"), "2 | spec");
  for (const Provenance& p : r.provenance) EXPECT_NE(p.source, "command line") << p.field;
}

TEST_F(ResolveTest, SpecProfileWinsOverWorkspaceDefaultProfile) {
  spec_.policy.profile = "cpu-small";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.profile"), "cpu-small | spec");
  EXPECT_EQ(Of(r, "compute.gpus"), "0 | compute profile cpu-small");
  EXPECT_EQ(Of(r, "compute.cpus"), "4 | compute profile cpu-small");
  EXPECT_EQ(Of(r, "flavors"), "any | platform default");
  EXPECT_EQ(r.total_requests.count("nvidia.com/gpu"), 0u);
}

TEST_F(ResolveTest, WorkspaceDefaultsWinOverPlatformDefaults) {
  spec_.policy.workspace = "product";
  ResolvedRun r = MustResolve("carol");
  EXPECT_EQ(Of(r, "policy.workspace"), "product | spec");
  EXPECT_EQ(Of(r, "policy.profile"), "none | platform default");
  EXPECT_EQ(Of(r, "policy.queue"), "product | workspace product default");
  // The platform's default priority is "default"; the workspace's wins.
  EXPECT_EQ(Of(r, "policy.priority"), "priority (1000) | workspace product default");
  EXPECT_EQ(Of(r, "compute.cpus"), "2 | platform default");
  EXPECT_EQ(Of(r, "compute.memory"), "8Gi | platform default");
  EXPECT_EQ(Of(r, "compute.gpus"), "0 | spec");
  EXPECT_EQ(Of(r, "run.max_runtime"), "12h | platform limit (workspace product)");
}

TEST_F(ResolveTest, PlatformDefaultsApplyWhenTheWorkspaceHasNone) {
  platform_.workspaces[0].default_priority.clear();
  platform_.workspaces[0].default_queue.clear();
  platform_.defaults.queue = "product";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.priority"), "default (100) | platform default");
  EXPECT_EQ(Of(r, "policy.queue"), "product | platform default");
}

TEST_F(ResolveTest, NoPriorityAnywhereIsZero) {
  platform_.workspaces[0].default_priority.clear();
  platform_.defaults.priority.clear();
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.priority"), "0 (no class) | platform default");
  EXPECT_EQ(r.priority, 0);
  EXPECT_EQ(r.priority_class, "");
}

TEST_F(ResolveTest, NoCpuOrMemoryAnywhereIsNoRequest) {
  platform_.defaults.cpus.reset();
  platform_.defaults.memory.reset();
  spec_.policy.workspace = "product";
  ResolvedRun r = MustResolve("carol");
  EXPECT_EQ(Of(r, "compute.cpus"), "none (no request) | platform default");
  EXPECT_TRUE(r.total_requests.empty());
}

TEST_F(ResolveTest, Queues) {
  spec_.policy.queue = "product";
  EXPECT_EQ(Of(MustResolve(), "policy.queue"), "product | spec");
  spec_.policy.queue = "reserch";
  EXPECT_EQ(Error(), "policy.queue: unknown queue 'reserch' (did you mean 'research'?)");
  // Only one queue: it is the default.
  spec_.policy.queue.clear();
  platform_.workspaces[0].default_queue.clear();
  platform_.admission.queues.pop_back();
  EXPECT_EQ(Of(MustResolve(), "policy.queue"), "research | platform default");
}

TEST_F(ResolveTest, NoQueueToChooseIsAnError) {
  platform_.workspaces[0].default_queue.clear();
  EXPECT_EQ(Error(),
            "policy.queue: the spec names no queue and neither workspace 'research' nor the "
            "platform has a default queue (queues: research, product)");
}

TEST_F(ResolveTest, Workspaces) {
  spec_.policy.workspace = "reseach";
  EXPECT_EQ(Error(), "policy.workspace: unknown workspace 'reseach' (did you mean 'research'?)");
  spec_.policy.workspace.clear();
  platform_.defaults.workspace.clear();
  EXPECT_NE(Error().find("the spec names no workspace and the platform has no default "
                         "workspace (workspaces: research, product)"),
            std::string::npos);
  platform_.workspaces.pop_back();
  EXPECT_EQ(Of(MustResolve(), "policy.workspace"), "research | platform default");
}

TEST_F(ResolveTest, NamedPriorityAndTier) {
  spec_.policy.priority = "low";
  EXPECT_EQ(Of(MustResolve(), "policy.priority"), "low (0) | spec");
  spec_.policy.priority.clear();
  spec_.policy.priority_tier = "priority";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.priority"), "priority (1000) | spec");
  EXPECT_EQ(r.priority, 1000);
}

TEST_F(ResolveTest, PriorityErrors) {
  spec_.policy.priority = "urgent";
  EXPECT_EQ(Error(), "policy.priority: unknown priority class 'urgent'");
  spec_.policy.priority = "prority";
  EXPECT_EQ(Error(),
            "policy.priority: unknown priority class 'prority' (did you mean "
            "'priority'?)");
  spec_.policy.priority = "low";
  spec_.policy.priority_tier = "priority";
  EXPECT_EQ(Error(),
            "policy.priority: 'low' and policy.priority_tier 'priority' name different "
            "priority classes; give one of them");
  spec_.policy.priority.clear();
  platform_.priorities.pop_back();
  EXPECT_EQ(Error(),
            "policy.priority_tier: 'priority' maps to no priority class of this "
            "platform (classes: low, default)");
}

TEST_F(ResolveTest, DisableDefaultPriorities) {
  spec_.policy.disable_default_priorities = true;
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.priority"), "0 (no class) | spec");
  EXPECT_EQ(r.priority, 0);
}

TEST_F(ResolveTest, GpuLimit) {
  spec_.policy.workspace = "product";
  spec_.compute.gpus = 4;
  EXPECT_EQ(Error("carol"),
            "compute.gpus: 4 GPUs per run exceeds workspace 'product' limit max_gpus_per_run: 2");
  spec_.compute.gpus = 2;
  EXPECT_EQ(Of(MustResolve("carol"), "compute.gpus"), "2 | spec");
}

TEST_F(ResolveTest, GpuLimitCountsEveryWorker) {
  spec_.compute.gpus = 8;
  spec_.compute.workers = 2;
  EXPECT_EQ(Error(),
            "compute.gpus: 16 GPUs per run (8 per worker x 2 workers) exceeds workspace "
            "'research' limit max_gpus_per_run: 8");
}

TEST_F(ResolveTest, GpuLimitAppliesToProfiles) {
  spec_.policy.workspace = "product";
  spec_.policy.profile = "full-node";
  EXPECT_EQ(Error("carol"),
            "compute.gpus: 8 GPUs per run (from compute profile full-node) exceeds workspace "
            "'product' limit max_gpus_per_run: 2");
}

TEST_F(ResolveTest, WorkerLimit) {
  spec_.compute.workers = 3;
  EXPECT_NE(Error().find("compute.workers: 3 workers exceeds workspace 'research' limit "
                         "max_workers: 2"),
            std::string::npos);
}

TEST_F(ResolveTest, MaxRuntimeIsTheSmallerOfSpecAndLimit) {
  spec_.max_runtime_ms = 3600 * 1000;
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "run.max_runtime"), "1h | spec");
  EXPECT_EQ(r.max_runtime_ms, 3600 * 1000);
  spec_.max_runtime_ms = 100 * 3600 * 1000LL;
  r = MustResolve();
  EXPECT_EQ(Of(r, "run.max_runtime"),
            "72h (spec asked 100h) | platform limit (workspace research)");
  EXPECT_EQ(r.max_runtime_ms, 72 * 3600 * 1000LL);
  platform_.workspaces[0].limits.max_runtime_ms.reset();
  spec_.max_runtime_ms.reset();
  EXPECT_EQ(Of(MustResolve(), "run.max_runtime"), "none | platform default");
}

// The limits the controller's guardrails enforce (EffectiveIdle / EffectiveStall), each with its
// source: a looser spec value is shown as asked, not as applied.
TEST_F(ResolveTest, GuardrailsAreTheEnforcedLimitsWithTheirSource) {
  Workspace& w = platform_.workspaces[0];
  w.limits.idle = IdleLimit{5, 30 * 60 * 1000, 3600 * 1000};
  w.limits.stall.reset();
  spec_.policy.idle = spec::IdleGuard{10, 2 * 3600 * 1000, std::nullopt};
  spec_.policy.stall = spec::StallGuard{10 * 60 * 1000, std::nullopt};
  ResolvedRun r = MustResolve();
  const std::string ws = "workspace guardrail (workspace " + w.name + ")";
  EXPECT_EQ(Of(r, "policy.guardrails.idle.warn_after"), "30m (spec asked 2h) | " + ws);
  EXPECT_EQ(Of(r, "policy.guardrails.idle.stop_after"), "1h | " + ws);
  EXPECT_EQ(Of(r, "policy.guardrails.idle.gpu_util_below"), "10% | spec") << "the stricter";
  EXPECT_EQ(Of(r, "policy.guardrails.stall.after"), "10m | spec");
  EXPECT_EQ(Of(r, "policy.guardrails.stall.stop_after"), "(missing)");
  // Nothing set anywhere: no rows.
  w.limits.idle.reset();
  spec_.policy.idle.reset();
  spec_.policy.stall.reset();
  r = MustResolve();
  EXPECT_EQ(Of(r, "policy.guardrails.idle.warn_after"), "(missing)");
  EXPECT_EQ(Of(r, "policy.guardrails.stall.after"), "(missing)");
}

TEST_F(ResolveTest, Membership) {
  MustResolve("bob");
  Result<ResolvedRun> r = Run("carol");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().message(),
            "policy.workspace: user 'carol' is not a member of workspace 'research'");
  // Through a group.
  EXPECT_TRUE(Resolve(spec_, platform_, Caller{"dave", {"ml-research"}}).ok());
  EXPECT_FALSE(Resolve(spec_, platform_, Caller{"dave", {"product-ml"}}).ok());
  // "*" admits everyone.
  platform_.workspaces[0].members = {"*"};
  MustResolve("carol");
}

TEST_F(ResolveTest, Images) {
  spec_.runtime.image = "nvcr.io/nvidia/pytorch:24.05-py3";
  EXPECT_EQ(Of(MustResolve(), "runtime.image"), "nvcr.io/nvidia/pytorch:24.05-py3 | spec");
  spec_.runtime.image = "docker.io/evil/miner:latest";
  EXPECT_EQ(Error(),
            "runtime.image: 'docker.io/evil/miner:latest' is not allowed in workspace "
            "'research' (allowed_images: nvcr.io/nvidia/pytorch:*, "
            "ghcr.io/example/research/*)");
  // A workspace without allowed_images takes any image.
  spec_.policy.workspace = "product";
  MustResolve("carol");
}

TEST_F(ResolveTest, ARunsOwnWebhooksMustMatchItsWorkspacesAllowedUrls) {
  spec_.policy.webhooks = {{"https://hooks.example.com/team-a/x", "k", {"state"}},
                           {"http://10.0.0.7:8080/hook", "k", {"state"}}};
  // A workspace that allows none refuses them: the submitter would choose where the server posts.
  EXPECT_NE(Error().find("policy.webhooks[0].url: workspace 'research' allows no run webhooks"),
            std::string::npos);
  platform_.workspaces[0].allowed_webhooks = {"https://hooks.example.com/*"};
  EXPECT_EQ(Error(),
            "policy.webhooks[1].url: 'http://10.0.0.7:8080/hook' is not allowed in workspace "
            "'research' (allowed_webhooks: https://hooks.example.com/*)");
  spec_.policy.webhooks.pop_back();
  MustResolve();
}

TEST(UrlMatchesTest, TheHostIsMatchedApartFromThePath) {
  EXPECT_TRUE(UrlMatches("https://*.example.com/*", "https://hooks.example.com/a/b"));
  EXPECT_FALSE(UrlMatches("https://*.example.com/*", "https://evil.net/x.example.com/"));
  EXPECT_FALSE(UrlMatches("https://*.example.com/*", "http://hooks.example.com/a"));  // scheme
  EXPECT_TRUE(UrlMatches("http://127.0.0.1:*", "http://127.0.0.1:8080/any/path"));    // no path
  EXPECT_FALSE(UrlMatches("http://127.0.0.1:*", "http://127.0.0.10:8080/"));
  EXPECT_TRUE(
      UrlMatches("https://hooks.example.com/team-a/*", "https://hooks.example.com/team-a/x"));
  EXPECT_FALSE(UrlMatches("https://hooks.example.com/team-a/*", "https://hooks.example.com/b/x"));
  EXPECT_TRUE(UrlMatches("https://hooks.example.com/", "https://hooks.example.com"));
}

TEST_F(ResolveTest, NoImageNoCheck) {
  ResolvedRun r = MustResolve();
  EXPECT_EQ(r.Find("runtime.image"), nullptr);
}

TEST_F(ResolveTest, StorageByName) {
  spec_.storage.data_pvc = "datasets";
  spec_.storage.output = "research-results/exp1";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "storage.data_pvc"), "datasets at /data (read-only) | spec");
  EXPECT_EQ(Of(r, "storage.output"), "research-results/exp1 at /results/exp1 (read-write) | spec");
  ASSERT_EQ(r.mounts.size(), 3u);
  EXPECT_EQ(r.mounts[0].role, "data");
  EXPECT_TRUE(r.mounts[0].read_only);
  EXPECT_EQ(r.mounts[0].host_path, "/srv/tau/datasets");
  EXPECT_EQ(r.mounts[1].sub_path, "exp1");
  EXPECT_EQ(r.mounts[1].host_path, "/srv/tau/research/exp1");
  EXPECT_EQ(r.mounts[1].mount_path, "/results/exp1");
}

TEST_F(ResolveTest, StorageErrors) {
  spec_.storage.data_pvc = "datasetz";
  EXPECT_EQ(Error(),
            "storage.data_pvc: unknown storage volume 'datasetz' (did you mean 'datasets'?)");
  spec_.storage.data_pvc.clear();
  spec_.storage.output = "product-results";
  EXPECT_EQ(Error(),
            "storage.output: workspace 'research' may not use storage volume "
            "'product-results' (its storage: datasets, research-results)");
  spec_.storage.output = "datasets/out";
  EXPECT_EQ(Error(),
            "storage.output: storage volume 'datasets' is read-only; outputs need a "
            "writable volume");
  spec_.storage.output.clear();
  spec_.storage.checkpoint = "research-results/../../etc";
  EXPECT_NE(Error().find("storage.checkpoint: 'research-results/../../etc' is not a storage "
                         "volume name"),
            std::string::npos);
  spec_.storage.checkpoint = "/abs/path";
  EXPECT_EQ(Error(),
            "storage.checkpoint: '/abs/path' is under none of workspace 'research''s storage "
            "volumes (mount paths: /data (datasets), /results (research-results))");
  spec_.storage.checkpoint = "research-result";  // a typo, not an artifact
  EXPECT_NE(Error().find("(did you mean 'research-results'?)"), std::string::npos);
  spec_.storage.checkpoint.clear();
  spec_.storage.output = "/data/projects/x";  // under the read-only datasets volume
  EXPECT_EQ(Error(),
            "storage.output: storage volume 'datasets' is read-only; outputs need a writable "
            "volume");
}

// TauGrid writes storage.output as a path inside the run, under a volume's mount path.
TEST_F(ResolveTest, StorageOutputAsAPathUnderAVolume) {
  spec_.storage.output = "/results/projects/x/";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "storage.output"),
            "research-results/projects/x at /results/projects/x (read-write) | spec");
  ASSERT_FALSE(r.mounts.empty());
  EXPECT_EQ(r.mounts[0].volume, "research-results");
  EXPECT_EQ(r.mounts[0].sub_path, "projects/x");
  spec_.storage.output = "/results";
  EXPECT_EQ(MustResolve().mounts[0].sub_path, "");
  spec_.storage.output = "/resultsx/a";  // a prefix of the string, not of the path
  EXPECT_NE(Error().find("is under none of"), std::string::npos);
}

// TauGrid's storage.checkpoint names the artifact inside the run's checkpoint directory.
TEST_F(ResolveTest, StorageCheckpointAsAnArtifactName) {
  spec_.storage.checkpoint = "last.safetensors";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(r.checkpoint_artifact, "last.safetensors");
  EXPECT_EQ(Of(r, "storage.checkpoint"),
            "artifact last.safetensors in the run's checkpoint directory | spec");
  for (const Mount& m : r.mounts) EXPECT_NE(m.role, "checkpoint") << m.volume;
  ResolvedRun back = *ResolvedRunFromJson(ToJson(r));
  EXPECT_EQ(back.checkpoint_artifact, "last.safetensors");
}

// TauGrid's configs name a namespace, not a workspace: the workspace of that name (its namespace on
// Kubernetes) is chosen.
TEST_F(ResolveTest, NamespaceChoosesTheWorkspaceOfThatName) {
  spec_.policy.namespace_name = "product";
  EXPECT_EQ(Of(MustResolve("carol"), "policy.workspace"), "product | spec (policy.namespace)");
  spec_.policy.namespace_name = "elsewhere";  // no such workspace: the default, as before
  EXPECT_EQ(Of(MustResolve(), "policy.workspace"), "research | platform default");
}

TEST_F(ResolveTest, PresetIsAComputeProfile) {
  spec_.policy.preset = "full-node";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "policy.profile"), "full-node | spec (policy.preset)");
  EXPECT_EQ(r.gpus_per_worker, 8);
  spec_.policy.profile = "one-gpu";
  EXPECT_EQ(Error(),
            "policy.preset: 'full-node' and policy.profile 'one-gpu' name different compute "
            "profiles; give one of them");
  spec_.policy.profile.clear();
  spec_.policy.preset = "full-nod";
  EXPECT_EQ(Error(),
            "policy.preset: unknown compute profile 'full-nod' (did you mean 'full-node'?) (a "
            "preset names one of the platform's compute_profiles)");
}

TEST_F(ResolveTest, LaneIsAQueueOfTheWorkspace) {
  spec_.policy.lane = "training";
  EXPECT_EQ(Error(),
            "policy.lane: workspace 'research' has no lane 'training' (it defines no lanes: see "
            "workspaces[].lanes)");
  platform_.workspaces[0].lanes = {{"training", "product"}, {"eval", "research"}};
  ResolvedRun r = MustResolve();
  EXPECT_EQ(r.queue, "product");
  EXPECT_EQ(Of(r, "policy.queue"), "product | workspace research lane training");
  spec_.policy.queue = "research";
  EXPECT_EQ(Error(),
            "policy.lane: lane 'training' goes to queue 'product', but policy.queue is "
            "'research'; give one of them");
  spec_.policy.queue.clear();
  spec_.policy.lane = "trainin";
  EXPECT_EQ(Error(),
            "policy.lane: workspace 'research' has no lane 'trainin' (its lanes: eval, "
            "training) (did you mean 'training'?)");
}

// The workers of a Ray run are sized apart from the head; both are charged (issue: explain showed
// the head's size and the local quota was understated).
TEST_F(ResolveTest, RayWorkerAndHeadSizesAreCharged) {
  spec_.kind = spec::WorkloadKind::kRayJob;
  spec_.compute.workers = 2;
  spec_.compute.gpus = 1;
  spec_.compute.cpus = Quantity::FromUnits(2);                   // the head's (manifest rule)
  spec_.compute.memory = Quantity::FromUnits(int64_t{8} << 30);  // the head's
  spec_.compute.worker_cpus = Quantity::FromUnits(16);
  spec_.compute.worker_memory = Quantity::FromUnits(int64_t{64} << 30);
  spec_.compute.worker_memory_limit = Quantity::FromUnits(int64_t{80} << 30);
  ResolvedRun r = MustResolve();
  EXPECT_EQ(r.worker.cpus, Quantity::FromUnits(16));
  EXPECT_EQ(r.worker.memory, Quantity::FromUnits(int64_t{64} << 30));
  EXPECT_EQ(r.worker.memory_limit, Quantity::FromUnits(int64_t{80} << 30));
  EXPECT_EQ(r.worker.gpus, 1);
  EXPECT_EQ(r.cpus_per_worker, Quantity::FromUnits(16));
  ASSERT_TRUE(r.head.has_value());
  EXPECT_EQ(r.head->cpus, Quantity::FromUnits(2));
  EXPECT_EQ(r.head->gpus, 0);
  EXPECT_EQ(r.total_requests.at("cpu"), Quantity::FromUnits(34));
  EXPECT_EQ(r.total_requests.at("memory"), Quantity::FromUnits(int64_t{136} << 30));
  EXPECT_EQ(r.total_requests.at("nvidia.com/gpu"), Quantity::FromUnits(2));
  EXPECT_EQ(Of(r, "compute.head"), "cpu=2, memory=8Gi | spec");
  std::string text = ExplainText(r);
  EXPECT_NE(text.find("per worker: cpu=16, memory=64Gi, nvidia.com/gpu=1 (limits memory=80Gi)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ray head: cpu=2, memory=8Gi"), std::string::npos) << text;
  EXPECT_NE(text.find("requests (2 workers and the head): cpu=34"), std::string::npos) << text;
  ResolvedRun back = *ResolvedRunFromJson(ToJson(r));
  EXPECT_EQ(back.head->memory, r.head->memory);
  EXPECT_EQ(back.worker.memory_limit, r.worker.memory_limit);

  // A job has no head; its pods' limits come from compute.cpu_limit / memory_limit.
  spec_.kind = spec::WorkloadKind::kJob;
  spec_.compute.worker_cpus.reset();
  spec_.compute.worker_memory.reset();
  spec_.compute.worker_memory_limit.reset();
  spec_.compute.cpu_limit = Quantity::FromUnits(4);
  r = MustResolve();
  EXPECT_FALSE(r.head.has_value());
  EXPECT_EQ(r.worker.cpu_limit, Quantity::FromUnits(4));
  EXPECT_EQ(r.total_requests.at("cpu"), Quantity::FromUnits(4));
}

TEST_F(ResolveTest, TauGridNodeLabelKeys) {
  Platform p = MustParse(R"(
node_labels: taugrid
flavors:
  - name: a100
    node_labels: {tau.azure.com/gpu-class: a100-80gb}
queues:
  - name: q
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: a100
            resources: [{name: cpu, nominal: 8}, {name: memory, nominal: 64Gi}, {name: nvidia.com/gpu, nominal: 8}]
workspaces:
  - name: w
    members: ["*"]
    lanes: {training: q}
compute_profiles:
  - {name: big, gpus: 4, gpu_class: a100-80gb}
)");
  EXPECT_EQ(p.node_labels.gpu_class, "tau.azure.com/gpu-class");
  EXPECT_EQ(p.node_labels.gpu_series, "kueue.azure.com/gpu-series");
  spec::RunSpec s;
  s.policy.gpu_class = "a100-80gb";
  s.policy.lane = "training";
  Result<ResolvedRun> r = Resolve(s, p, "alice");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->node_selector.at("tau.azure.com/gpu-class"), "a100-80gb");
  EXPECT_EQ(r->node_selector.count(kGpuClassLabel), 0u);
  EXPECT_EQ(r->flavors, std::vector<std::string>{"a100"});
  EXPECT_EQ(r->gpu_class, "a100-80gb");
  EXPECT_EQ(r->node_labels.gpu_class, "tau.azure.com/gpu-class");
}

TEST_F(ResolveTest, GpuClassSelectsFlavors) {
  spec_.policy.profile = "cpu-small";
  spec_.policy.gpu_class = "h100-80gb";
  ResolvedRun r = MustResolve();
  EXPECT_EQ(Of(r, "flavors"), "h100 | spec");
  EXPECT_EQ(r.node_selector.at(kGpuClassLabel), "h100-80gb");
  spec_.policy.gpu_class = "any";
  EXPECT_EQ(Of(MustResolve(), "flavors"), "any | platform default");
  spec_.policy.gpu_class = "a100-80gb";
  EXPECT_EQ(Error(),
            "policy.gpu_class: no flavor of this platform has GPU class 'a100-80gb' "
            "(classes: h100-80gb)");
}

TEST_F(ResolveTest, GpuClassConflictsWithProfile) {
  spec_.policy.gpu_class = "a100-80gb";  // the default profile one-gpu says h100-80gb
  EXPECT_EQ(Error(),
            "policy.gpu_class: 'a100-80gb' conflicts with compute profile 'one-gpu' "
            "gpu_class 'h100-80gb'; give one of them");
  spec_.policy.profile = "full-node";  // pins flavor h100
  EXPECT_EQ(Error(),
            "policy.gpu_class: 'a100-80gb' conflicts with compute profile 'full-node' "
            "flavor 'h100'; give one of them");
  spec_.policy.gpu_class = "h100-80gb";
  EXPECT_EQ(Of(MustResolve(), "flavors"), "h100 | compute profile full-node");
}

TEST_F(ResolveTest, QueueMustOfferTheFlavor) {
  platform_.admission.flavors.push_back({"a100", {{kGpuClassLabel, "a100-80gb"}}});
  platform_.compute_profiles.push_back({"a100-box", "", 1, {}, {}, "a100", ""});
  spec_.policy.profile = "a100-box";
  EXPECT_EQ(Error(),
            "flavors: queue 'research' offers none of the flavors this run needs "
            "(a100); its flavors: h100");
}

TEST_F(ResolveTest, QueueMustCoverRequestedResources) {
  Platform p = MustParse(
      "flavors: [{name: f}]\n"
      "queues:\n"
      "  - name: cpu-only\n"
      "    resource_groups: [{covered_resources: [cpu], flavors: [{name: f, resources: "
      "[{name: cpu, nominal: 8}]}]}]\n"
      "workspaces: [{name: w, members: ['*']}]\n");
  spec_.compute.gpus = 1;
  Result<ResolvedRun> r = Resolve(spec_, p, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "policy.queue: queue 'cpu-only' provides no nvidia.com/gpu, which this run requests "
            "(1)");
}

TEST_F(ResolveTest, UnknownProfile) {
  spec_.policy.profile = "one-gpus";
  EXPECT_EQ(Error(),
            "policy.profile: unknown compute profile 'one-gpus' (did you mean "
            "'one-gpu'?)");
}

TEST_F(ResolveTest, AllViolationsAtOnce) {
  spec_.compute.gpus = 16;
  spec_.compute.workers = 4;
  spec_.runtime.image = "busybox";
  std::string e = Error("mallory");
  EXPECT_NE(e.find("not a member"), std::string::npos) << e;
  EXPECT_NE(e.find("max_workers"), std::string::npos) << e;
  EXPECT_NE(e.find("max_gpus_per_run"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed_images"), std::string::npos) << e;
  EXPECT_EQ(Run("mallory").status().code(), StatusCode::kPermissionDenied);
}

TEST_F(ResolveTest, TotalsMultiplyByWorkers) {
  spec_.compute.gpus = 4;
  spec_.compute.workers = 2;
  spec_.compute.cpus = Quantity::FromMilli(1500);
  ResolvedRun r = MustResolve();
  EXPECT_EQ(r.total_requests.at("nvidia.com/gpu"), Quantity::FromUnits(8));
  EXPECT_EQ(r.total_requests.at("cpu"), Quantity::FromUnits(3));
  EXPECT_EQ(r.total_requests.at("memory"), Quantity::FromUnits(192LL << 30));
}

TEST_F(ResolveTest, FromAParsedSpec) {
  spec::ParseOutcome parsed = spec::ParseSpec(
      "schema_version: 1\n"
      "name: demo\n"
      "run:\n"
      "  entrypoint: train.py\n"
      "  max_runtime: 2h\n"
      "compute:\n"
      "  gpus: 2\n"
      "runtime:\n"
      "  image: ghcr.io/example/research/train:1\n"
      "policy:\n"
      "  workspace: research\n"
      "  priority_tier: priority\n"
      "storage:\n"
      "  data_pvc: datasets\n"
      "  output: research-results/demo\n",
      "tau.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.ErrorText();
  Result<ResolvedRun> r = Resolve(*parsed.spec, platform_, "alice");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->priority, 1000);
  EXPECT_EQ(r->gpus_per_worker, 2);
  EXPECT_EQ(r->max_runtime_ms, 2 * 3600 * 1000);
  EXPECT_EQ(r->mounts.size(), 3u);
}

TEST_F(ResolveTest, ExplainTextIsAnAlignedTable) {
  spec_.compute.gpus = 2;
  std::string text = ExplainText(MustResolve());
  std::vector<std::string> lines = Split(text, '\n');
  ASSERT_GT(lines.size(), 5u);
  EXPECT_EQ(lines[0].rfind("FIELD", 0), 0u);
  size_t value_col = lines[0].find("VALUE");
  size_t source_col = lines[0].find("SOURCE");
  for (size_t i = 1; i < lines.size() && !lines[i].empty(); ++i) {
    EXPECT_NE(lines[i][value_col], ' ') << lines[i];
    EXPECT_EQ(lines[i][value_col - 1], ' ') << lines[i];
    EXPECT_NE(lines[i][source_col], ' ') << lines[i];
  }
  EXPECT_NE(text.find("compute.gpus"), std::string::npos);
  EXPECT_NE(text.find("requests (1 worker): cpu=8, memory=96Gi, nvidia.com/gpu=2"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace tau::policy

namespace tau::policy {
namespace {

TEST_F(ResolveTest, ResolutionRoundTripsThroughJson) {
  // The server records a run's resolution as JSON and reads it back after a restart: nothing may
  // be lost on the way.
  ResolvedRun r = MustResolve();
  Result<ResolvedRun> back = ResolvedRunFromJson(ToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ToJson(*back), ToJson(r));
  EXPECT_EQ(back->total_requests, r.total_requests);
  EXPECT_EQ(back->cpus_per_worker, r.cpus_per_worker);
  EXPECT_EQ(back->mounts.size(), r.mounts.size());
  EXPECT_EQ(back->provenance.size(), r.provenance.size());
  EXPECT_FALSE(ResolvedRunFromJson(nlohmann::json::array()).ok());
  EXPECT_FALSE(ResolvedRunFromJson({{"workspace", "w"}}).ok());  // no queue
  EXPECT_FALSE(
      ResolvedRunFromJson({{"workspace", "w"}, {"queue", "q"}, {"cpus_per_worker", "lots"}}).ok());
}

TEST_F(ResolveTest, ServerProtectingLimitsComeFromTheWorkspaceOrTheDefaults) {
  ResolvedRun r = MustResolve();
  EXPECT_EQ(r.max_log_bytes, kDefaultMaxLogBytes);
  EXPECT_EQ(r.max_metric_points, kDefaultMaxMetricPoints);
  EXPECT_EQ(r.max_metric_series, kDefaultMaxMetricSeries);
  Workspace* w = const_cast<Workspace*>(platform_.FindWorkspace("research"));
  ASSERT_NE(w, nullptr);
  w->limits.max_log_bytes = 1 << 20;
  w->limits.max_metric_points = 10;
  w->limits.max_metric_series = 2;
  r = MustResolve();
  EXPECT_EQ(r.max_log_bytes, 1 << 20);
  EXPECT_EQ(r.max_metric_points, 10);
  EXPECT_EQ(r.max_metric_series, 2);
  // They survive the record's JSON; a record written before they existed reads the defaults.
  auto back = ResolvedRunFromJson(ToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->max_log_bytes, 1 << 20);
  EXPECT_EQ(back->max_metric_series, 2);
  nlohmann::json old = ToJson(r);
  old.erase("max_log_bytes");
  back = ResolvedRunFromJson(old);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->max_log_bytes, kDefaultMaxLogBytes);
}

}  // namespace
}  // namespace tau::policy
