// Rendering tests: golden files for examples, spec-corpus files and tau's own kube specs against
// the example platform and a multi-workspace one; every rendered object validated against the
// Kueue and KubeRay CRDs and the built-in kinds' schemas; the YAML read back; error cases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "common/hash.h"
#include "kube/kube.h"
#include "kube/kube_test_util.h"
#include "policy/policy.h"
#include "spec/spec.h"

// Test cases are aggregates that leave trailing fields at their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace tau::kube {
namespace {

using nlohmann::json;
using testing::DataDir;
using testing::ExpectGolden;
using testing::ReadAll;
using testing::Schemas;
using testing::SourceDir;

policy::Platform LoadPlatform(const std::string& rel) {
  policy::PlatformOutcome out = policy::ParsePlatform(ReadAll(SourceDir() / rel), rel);
  EXPECT_TRUE(out.ok()) << out.ErrorText();
  return out.ok() ? *out.platform : policy::Platform{};
}

spec::RunSpec LoadSpec(const std::string& rel) {
  spec::ParseOutcome out = spec::ParseSpec(ReadAll(SourceDir() / rel), rel);
  EXPECT_TRUE(out.ok()) << out.ErrorText();
  return out.ok() ? *out.spec : spec::RunSpec{};
}

// Goldens ship a small fixed code directory, so they change only when rendering does.
std::vector<CodeFile> FixedCode(const spec::RunSpec& s) {
  std::vector<CodeFile> code = {{"lib/util.py", 0644, "def double(x):\n    return 2 * x\n"}};
  if (s.entrypoint.ends_with(".py"))
    code.push_back({s.entrypoint, 0755, "print('hello from tau')\n"});
  return code;
}

struct Case {
  std::string name;      // golden file name, without .yaml
  std::string spec;      // relative to the source tree
  std::string platform;  // relative to the source tree
  std::string user;
  std::string default_image;
  std::string namespace_name;
  int attempt = 1;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr const char* kExamplePlatform = "examples/platform/platform.yaml";
constexpr const char* kMultiPlatform = "tests/data/kube/platform-multi.yaml";
constexpr const char* kTauGridPlatform = "tests/data/taugrid/platform.yaml";

std::vector<Case> Cases() {
  return {
      // The examples (the GPU quickstart's image is not allowed in the example platform's
      // default workspace: see RefusesImageTheWorkspaceDoesNotAllow).
      {"quickstart-example-platform", "examples/quickstart/tau.yaml", kExamplePlatform, "alice",
       "nvcr.io/nvidia/pytorch:24.05-py3"},
      {"quickstart", "examples/quickstart/tau.yaml", kMultiPlatform, "alice", "python:3.12-slim"},
      {"gpu-quickstart", "examples/gpu-quickstart/tau.yaml", kMultiPlatform, "alice"},
      // The spec corpus: both shapes, Ray and torchrun.
      {"manifest-quickstart-rayjob", "tests/data/spec/valid/manifest_quickstart.yaml",
       kMultiPlatform, "alice"},
      {"manifest-minimal-rayjob", "tests/data/spec/valid/manifest_minimal.yaml", kMultiPlatform,
       "alice", "rayproject/ray:2.41.0-py312"},
      {"manifest-torchrun-8gpu", "tests/data/spec/valid/manifest_torchrun.yaml", kMultiPlatform,
       "alice", "nvcr.io/nvidia/pytorch:24.05-py3"},
      {"anchors-rayjob-cpu", "tests/data/spec/valid/anchors_and_comments.yaml", kMultiPlatform,
       "bob", "rayproject/ray:2.41.0-py312"},
      {"direct-minimal-job", "tests/data/spec/valid/direct_minimal.yaml", kMultiPlatform, "bob",
       "python:3.12-slim"},
      // The public TauGrid kind example names namespace `ray`: rendered as an operator would with
      // `--namespace ray`.
      {"direct-kind-ray", "tests/data/spec/valid/direct_kind_ray.yaml", kMultiPlatform, "bob", "",
       "ray"},
      {"direct-ray-multi-gb200", "tests/data/spec/valid/direct_ray_multi.yaml", kMultiPlatform,
       "bob", "rayproject/ray:2.41.0-py312-gpu"},
      // tau's own kube specs: multi-node torchrun, a CPU gang, a sized GPU RayJob, a retry.
      {"torchrun-multinode", "tests/data/kube/specs/torchrun-multinode.yaml", kMultiPlatform,
       "carol"},
      {"cpu-gang", "tests/data/kube/specs/cpu-gang.yaml", kMultiPlatform, "dave"},
      {"ray-vision", "tests/data/kube/specs/ray-vision.yaml", kMultiPlatform, "carol"},
      {"ray-vision-attempt-3", "tests/data/kube/specs/ray-vision.yaml", kMultiPlatform, "carol", "",
       "", 3},
      // TauGrid's documented forms, on a cluster labelled the TauGrid way.
      {"taugrid-ray-worker-sizes", "tests/data/taugrid/specs/ray-worker-sizes.yaml",
       kTauGridPlatform, "alice"},
      {"taugrid-torchrun-2x8", "tests/data/taugrid/specs/torchrun-multinode.yaml", kTauGridPlatform,
       "alice"},
      {"taugrid-env-secret", "tests/data/taugrid/specs/env-secret.yaml", kTauGridPlatform, "alice"},
      {"taugrid-image-assets", "tests/data/taugrid/specs/image-assets.yaml", kTauGridPlatform,
       "alice"},
      {"taugrid-ray-tune", "tests/data/taugrid/specs/ray-tune.yaml", kTauGridPlatform, "alice"},
  };
}

const Case& FindCase(const std::string& name) {
  static const std::vector<Case> cases = Cases();
  for (const Case& c : cases) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no case " << name;
  return cases.front();
}

Result<std::vector<json>> RenderCase(const Case& c) {
  spec::RunSpec s = LoadSpec(c.spec);
  policy::Platform p = LoadPlatform(c.platform);
  TAU_ASSIGN_OR_RETURN(policy::ResolvedRun run, policy::Resolve(s, p, c.user));
  RenderOptions o;
  o.default_image = c.default_image;
  o.namespace_name = c.namespace_name;
  o.attempt = c.attempt;
  o.code = FixedCode(s);
  if (c.attempt > 1) {
    o.resume_from = "/results/vision-ray/checkpoints/step-000200";
    o.failure_reason = "Preempted";
  }
  return RenderRun(s, run, p, o);
}

void ExpectValid(const std::vector<json>& objects, const std::string& what) {
  for (const json& o : objects) {
    Status s = Schemas().Validate(o);
    EXPECT_TRUE(s.ok()) << what << ":\n" << s.message();
  }
}

class GoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenTest, MatchesGoldenAndValidates) {
  const Case& c = GetParam();
  auto objects = RenderCase(c);
  ASSERT_TRUE(objects.ok()) << c.spec << ": " << objects.status().message();
  std::string yaml = "# " + c.spec + " against " + c.platform + "\n" + ToYaml(*objects);
  ExpectGolden(c.name + ".yaml", yaml);
  ExpectValid(*objects, c.name);
  // The YAML reads back as the same objects.
  auto back = ParseYaml(yaml);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, *objects);
}

INSTANTIATE_TEST_SUITE_P(Runs, GoldenTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Every run config of the TauGrid corpus renders, and each object validates against its schema.
TEST(TauGridCorpus, EveryConfigRendersAndValidates) {
  size_t rendered = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(SourceDir() / "tests/data/taugrid/specs")) {
    const std::string file = "tests/data/taugrid/specs/" + entry.path().filename().string();
    spec::RunSpec s = LoadSpec(file);
    policy::Platform p = LoadPlatform(kTauGridPlatform);
    auto run = policy::Resolve(s, p, "alice");
    ASSERT_TRUE(run.ok()) << file << ": " << run.status().message();
    RenderOptions o;
    o.default_image = "python:3.12-slim";
    o.code = FixedCode(s);
    auto objects = RenderRun(s, *run, p, o);
    ASSERT_TRUE(objects.ok()) << file << ": " << objects.status().message();
    ExpectValid(*objects, file);
    ++rendered;
  }
  EXPECT_GE(rendered, 20u);
}

TEST(Platform, TheBaselineIsSizedToTheSchedulableNodes) {
  auto node = [](const char* cpu, const char* memory, const char* gpus, bool cordoned) {
    json n = {{"kind", "Node"}, {"status", {{"allocatable", {{"cpu", cpu}, {"memory", memory}}}}}};
    if (gpus != nullptr) n["status"]["allocatable"]["nvidia.com/gpu"] = gpus;
    if (cordoned) n["spec"] = {{"unschedulable", true}};
    return n;
  };
  ClusterSize size =
      NodesAllocatable({node("7910m", "63Gi", "8", false), node("4", "16Gi", nullptr, false),
                        node("96", "1Ti", "8", true),            // cordoned: not counted
                        node("lots", "16Gi", nullptr, false)});  // unreadable cpu
  EXPECT_EQ(size.nodes, 3);
  EXPECT_EQ(size.cpu_milli, 7910 + 4000);
  EXPECT_EQ(size.memory_bytes, (63LL + 16 + 16) << 30);
  EXPECT_EQ(size.gpus, 8);
}

TEST(Platform, GoldenAndValid) {
  for (const auto& [golden, file] : std::vector<std::pair<std::string, std::string>>{
           {"platform-example.yaml", kExamplePlatform}, {"platform-multi.yaml", kMultiPlatform}}) {
    auto objects = RenderPlatform(LoadPlatform(file));
    ASSERT_TRUE(objects.ok()) << objects.status().message();
    std::string yaml = "# tau platform render " + file + "\n" + ToYaml(*objects);
    ExpectGolden(golden, yaml);
    ExpectValid(*objects, file);
    auto back = ParseYaml(yaml);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, *objects);
  }
}

TEST(Platform, AdmissionFairSharingIsTheQueuesScopeTheWorkspacesWeightAndKueuesConfiguration) {
  policy::Platform p = LoadPlatform(kMultiPlatform);
  auto objects = RenderPlatform(p);
  ASSERT_TRUE(objects.ok());
  int weighted = 0;
  for (const json& o : *objects) {
    const std::string name = o["metadata"]["name"];
    if (o["kind"] == "ClusterQueue") {
      // Only `shared` asks for it; the schema check in GoldenAndValid covers the field's shape.
      EXPECT_EQ(o["spec"].contains("admissionScope"), name == "shared") << name;
      if (name == "shared") {
        EXPECT_EQ(o["spec"]["admissionScope"]["admissionMode"], "UsageBasedAdmissionFairSharing");
      }
    }
    if (o["kind"] == "LocalQueue" && o["spec"].contains("fairSharing")) {
      // nlp's weight, on its LocalQueue of the queue that uses it only.
      EXPECT_EQ(o["metadata"]["namespace"], "nlp");
      EXPECT_EQ(name, "shared");
      EXPECT_EQ(o["spec"]["fairSharing"]["weight"], "2");
      ++weighted;
    }
  }
  EXPECT_EQ(weighted, 1);
  EXPECT_EQ(KueueConfiguration(p), json::parse(R"({
    "fairSharing": {"enable": true},
    "admissionFairSharing": {"usageHalfLifeTime": "168h", "usageSamplingInterval": "5m",
                             "resourceWeights": {"cpu": 0.05, "memory": 0.0,
                                                 "nvidia.com/gpu": 1.0}},
    "featureGates": {"AdmissionFairSharing": true}})"));
  EXPECT_EQ(KueueConfiguration(LoadPlatform(kExamplePlatform)), json::object());
}

TEST(Platform, EveryWorkspaceGetsNamespaceRbacAndLocalQueues) {
  policy::Platform p = LoadPlatform(kMultiPlatform);
  auto objects = RenderPlatform(p);
  ASSERT_TRUE(objects.ok());
  std::set<std::string> seen;
  for (const json& o : *objects) {
    std::string ns = o["metadata"].value("namespace", "");
    seen.insert(o["kind"].get<std::string>() + "/" + ns + "/" +
                o["metadata"]["name"].get<std::string>());
  }
  for (const policy::Workspace& w : p.workspaces) {
    EXPECT_TRUE(seen.count("Namespace//" + w.name)) << w.name;
    EXPECT_TRUE(seen.count("Role/" + w.name + "/tau-member")) << w.name;
    EXPECT_TRUE(seen.count("RoleBinding/" + w.name + "/tau-member")) << w.name;
    for (const auto& q : p.admission.queues) {
      EXPECT_TRUE(seen.count("LocalQueue/" + w.name + "/" + q.name)) << w.name << " " << q.name;
    }
  }
  for (const auto& f : p.admission.flavors) EXPECT_TRUE(seen.count("ResourceFlavor//" + f.name));
  for (const auto& c : p.admission.cohorts) EXPECT_TRUE(seen.count("Cohort//" + c.name));
  for (const auto& q : p.admission.queues) EXPECT_TRUE(seen.count("ClusterQueue//" + q.name));
  for (const auto& pc : p.priorities) EXPECT_TRUE(seen.count("WorkloadPriorityClass//" + pc.name));
}

// Every example, with its real code directory, renders valid objects against the multi-workspace
// platform (one image for those that have none).
TEST(Examples, EachRendersValidObjectsWithItsOwnCode) {
  policy::Platform p = LoadPlatform(kMultiPlatform);
  int examples = 0;
  for (const auto& dir : std::filesystem::directory_iterator(SourceDir() / "examples")) {
    const auto file = dir.path() / "tau.yaml";
    if (!std::filesystem::exists(file)) continue;
    ++examples;
    spec::ParseOutcome parsed = spec::ParseSpec(ReadAll(file), file.string());
    ASSERT_TRUE(parsed.ok()) << parsed.ErrorText();
    auto run = policy::Resolve(*parsed.spec, p, "alice");
    ASSERT_TRUE(run.ok()) << file << ": " << run.status().message();
    RenderOptions o;
    o.default_image = "python:3.12-slim";
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir.path())) {
      if (!f.is_regular_file()) continue;
      o.code.push_back(
          {std::filesystem::relative(f.path(), dir.path()).string(), 0644, ReadAll(f.path())});
    }
    auto objects = RenderRun(*parsed.spec, *run, p, o);
    ASSERT_TRUE(objects.ok()) << file << ": " << objects.status().message();
    ExpectValid(*objects, file.string());
  }
  EXPECT_GE(examples, 2);
}

// The shape of what is rendered, beyond the goldens: the facts the issue and TauGrid ask for.
TEST(RayJob, FollowsTheKueueAndTauGridShape) {
  auto objects = RenderCase(FindCase("manifest-quickstart-rayjob"));  // 1 worker, 1 GPU, pip
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  ASSERT_EQ(objects->size(), 1u);
  const json& rj = objects->front();
  EXPECT_EQ(rj["apiVersion"], "ray.io/v1");
  EXPECT_EQ(rj["metadata"]["labels"][kKueueQueueLabel], "shared");
  EXPECT_EQ(rj["metadata"]["labels"][kKueuePriorityLabel], "default");
  EXPECT_EQ(rj["metadata"]["annotations"][kAnnotationConfigHash].get<std::string>().size(), 64u);
  const json& spec = rj["spec"];
  EXPECT_EQ(spec["suspend"], true);
  EXPECT_EQ(spec["shutdownAfterJobFinishes"], true);
  EXPECT_EQ(spec["submissionMode"], "HTTPMode");
  EXPECT_EQ(spec["submitterConfig"]["backoffLimit"], 0);
  EXPECT_EQ(spec["rayClusterSpec"]["rayVersion"], "2.56.0");
  const json& head = spec["rayClusterSpec"]["headGroupSpec"];
  EXPECT_EQ(head["rayStartParams"]["num-cpus"], "0");
  EXPECT_EQ(head["rayStartParams"]["num-gpus"], "0");
  ASSERT_EQ(spec["rayClusterSpec"]["workerGroupSpecs"].size(), 1u);
  const json& workers = spec["rayClusterSpec"]["workerGroupSpecs"][0];
  EXPECT_EQ(workers["replicas"], 1);
  EXPECT_EQ(workers["rayStartParams"]["num-gpus"], "1");
  const json& pod = workers["template"]["spec"];
  const json& res = pod["containers"][0]["resources"];
  EXPECT_EQ(res["requests"]["nvidia.com/gpu"], "1");
  EXPECT_EQ(res["limits"]["nvidia.com/gpu"], "1");
  EXPECT_EQ(pod["tolerations"][0]["key"], "nvidia.com/gpu");
  bool shm = false;
  for (const json& m : pod["containers"][0]["volumeMounts"])
    shm = shm || m["mountPath"] == "/dev/shm";
  EXPECT_TRUE(shm);
  EXPECT_NE(spec["runtimeEnvYAML"].get<std::string>().find("torch>=2.4.0"), std::string::npos);
}

TEST(Job, MultiNodeTorchrunIsAnIndexedJobBehindAHeadlessService) {
  auto objects = RenderCase(FindCase("torchrun-multinode"));
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  ASSERT_EQ(objects->size(), 2u);
  const json& svc = (*objects)[0];
  const json& job = (*objects)[1];
  EXPECT_EQ(svc["kind"], "Service");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(job["kind"], "Job");
  EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
  EXPECT_EQ(job["spec"]["parallelism"], 2);
  EXPECT_EQ(job["spec"]["backoffLimit"], 0);
  EXPECT_EQ(job["spec"]["suspend"], true);
  EXPECT_EQ(job["spec"]["activeDeadlineSeconds"], 24 * 3600);  // capped by the workspace
  EXPECT_EQ(job["metadata"]["labels"][kKueuePriorityLabel], "priority");
  const json& pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["subdomain"], svc["metadata"]["name"]);
  EXPECT_EQ(pod["nodeSelector"]["tau.dev/gpu-class"], "h100-80gb");
  const json& cmd = pod["containers"][0]["command"];
  EXPECT_EQ(cmd[2], "torch.distributed.run");
  EXPECT_EQ(cmd[3], "--nnodes=2");

  bool secret = false;
  for (const json& e : pod["containers"][0]["env"]) {
    if (e["name"] == "WANDB_API_KEY") {
      secret = e["valueFrom"]["secretKeyRef"]["key"] == "wandb-key";
    }
  }
  EXPECT_TRUE(secret);
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the field and what to do.

Result<std::vector<json>> RenderText(const std::string& spec_text, const std::string& platform_rel,
                                     const std::string& user, RenderOptions o = {}) {
  spec::ParseOutcome parsed = spec::ParseSpec(spec_text, "tau.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.ErrorText();
  if (!parsed.ok()) return InvalidArgument("bad spec");
  policy::Platform p = LoadPlatform(platform_rel);
  TAU_ASSIGN_OR_RETURN(policy::ResolvedRun run, policy::Resolve(*parsed.spec, p, user));
  return RenderRun(*parsed.spec, run, p, o);
}

TEST(RenderJob, TheSpecsWordsReachTheProcessAsWritten) {
  // The kubelet expands $(VAR) and reads $$ as $ in a command: the spec's words are escaped, tau's
  // own $(RANK) of a gang's torchrun is not.
  auto r = RenderText(
      "schema_version: 1\nname: q\nrun:\n  entrypoint: train.py\n  workload_kind: job\n"
      "  args: ['$(HOME)', 'cost$5', '$$']\nruntime: {image: x}\n",
      kMultiPlatform, "alice");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const json& job = r->back();
  const json& cmd = job["spec"]["template"]["spec"]["containers"][0]["command"];
  ASSERT_GE(cmd.size(), 3u);
  EXPECT_EQ(cmd[cmd.size() - 3], "$$(HOME)");
  EXPECT_EQ(cmd[cmd.size() - 2], "cost$$5");
  EXPECT_EQ(cmd[cmd.size() - 1], "$$$$");
  auto gang = RenderCase(FindCase("torchrun-multinode"));
  ASSERT_TRUE(gang.ok()) << gang.status().message();
  const json& torchrun = (*gang)[1]["spec"]["template"]["spec"]["containers"][0]["command"];
  EXPECT_NE(std::find(torchrun.begin(), torchrun.end(), "--node_rank=$(RANK)"), torchrun.end());
}

TEST(RenderJob, ARunOfAnArrayGetsItsIndexAsTauArrayIndex) {
  const std::string spec =
      "schema_version: 1\nname: q\nrun:\n  entrypoint: train.py\n  workload_kind: job\n"
      "runtime: {image: x}\n";
  auto index_of = [](const std::vector<json>& objects) -> std::optional<std::string> {
    for (const json& e : objects.back()["spec"]["template"]["spec"]["containers"][0]["env"])
      if (e["name"] == "TAU_ARRAY_INDEX") return e["value"].get<std::string>();
    return std::nullopt;
  };
  RenderOptions o;
  o.array_index = 42;
  auto in_array = RenderText(spec, kMultiPlatform, "alice", o);
  ASSERT_TRUE(in_array.ok()) << in_array.status().message();
  EXPECT_EQ(index_of(*in_array), std::optional<std::string>("42"));
  auto alone = RenderText(spec, kMultiPlatform, "alice");
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_EQ(index_of(*alone), std::nullopt);
}

TEST(RenderJob, CodeFromAnImageIsCopiedIntoThePodsInsteadOfTheSubmittedCode) {
  RenderOptions o;
  o.code = {{"train.py", 0644, "print('the submitted copy')\n"}};
  auto r = RenderText(
      "name: q\nengine: job\nrun:\n  entrypoint: train.py\n"
      "  source: {image: 'ghcr.io/lab/code:7', path: /app/src}\nruntime: {image: x}\n",
      kMultiPlatform, "alice", o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectValid(*r, "run.source");
  const json& pod = r->back()["spec"]["template"]["spec"];
  ASSERT_GE(pod["initContainers"].size(), 2u);
  const json& copy = pod["initContainers"][0];
  EXPECT_EQ(copy["name"], "tau-source");
  EXPECT_EQ(copy["image"], "ghcr.io/lab/code:7");
  EXPECT_EQ(copy["command"], json({"/bin/cp", "-a", "/app/src/.", "/tau/code"}));
  const json& setup = pod["initContainers"][1];
  EXPECT_EQ(setup["name"], "tau-setup");
  EXPECT_EQ(setup["args"].size(), 3u) << "no code archive: the submitted copy is not shipped";
  const json& worker = pod["containers"][0];
  EXPECT_EQ(worker["workingDir"], "/tau/code");
  EXPECT_EQ(worker["command"], json({"python3", "train.py"}));
  bool mounted = false;
  for (const json& m : worker["volumeMounts"]) mounted |= m["mountPath"] == "/tau/code";
  EXPECT_TRUE(mounted);
}

// Init containers run before the worker and hold no GPU: none may be handed the node's GPUs by an
// image that says NVIDIA_VISIBLE_DEVICES=all (CUDA images do), however many GPUs the worker asks.
TEST(RenderJob, NoInitContainerIsGivenTheNodesGpus) {
  auto r = RenderText(
      "name: q\nengine: job\nrun:\n  entrypoint: train.py\n"
      "  source: {image: 'ghcr.io/lab/code:7', path: /app/src}\n"
      "runtime: {image: 'nvcr.io/nvidia/pytorch:24.01-py3'}\ncompute: {gpus: 1}\n"
      "storage:\n  image_assets:\n    - name: ref\n"
      "      image: ghcr.io/x/assets@sha256:"
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"
      "      source_path: /opt/a\n      mount_path: /opt/ref\n",
      kMultiPlatform, "alice", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const json& pod = r->back()["spec"]["template"]["spec"];
  std::set<std::string> seen;
  for (const json& c : pod["initContainers"]) {
    std::string name = c["name"];
    seen.insert(name);
    std::string value = "(unset)";
    for (const json& e : c.value("env", json::array())) {
      if (e["name"] == "NVIDIA_VISIBLE_DEVICES") value = e["value"];
    }
    EXPECT_EQ(value, "void") << name;
  }
  EXPECT_TRUE(seen.count("tau-source")) << "the code copy was rendered";
  EXPECT_TRUE(seen.count("tau-asset-ref")) << "the asset copy was rendered";
}

// A direct-shape Job of `workers` pods with `topology`, against platform-multi.yaml
// (network-domain, accelerator-domain, host) or, with `platform_without_topology`, the example
// platform, which defines none.
Result<std::vector<json>> RenderPlaced(const std::string& topology, int workers,
                                       bool platform_without_topology = false) {
  return RenderText(fmt::format("name: q\nengine: job\nentrypoint: train.py\ncompute: {{workers: "
                                "{}}}\npolicy: {{topology: {}}}\n"
                                "runtime: {{image: 'nvcr.io/nvidia/pytorch:24.05-py3'}}\n",
                                workers, topology),
                    platform_without_topology ? kExamplePlatform : kMultiPlatform, "alice");
}

json TemplateAnnotations(const std::vector<json>& objects) {
  return objects.back()["spec"]["template"]["metadata"].value("annotations", json::object());
}

TEST(RenderJob, PlacementsBecomeKueueTopologyRequestsAgainstThePlatformsLevels) {
  struct Case {
    std::string topology;
    json annotations;
  };
  for (const Case& c : std::vector<Case>{
           {"same-host", {{"kueue.x-k8s.io/podset-required-topology", "kubernetes.io/hostname"}}},
           {"same-accelerator-domain",
            {{"kueue.x-k8s.io/podset-required-topology", "nvidia.com/gpu.clique"}}},
           {"same-network-domain",
            {{"kueue.x-k8s.io/podset-required-topology", "tau.dev/network-block"}}},
           // As close as the cluster allows: the narrowest level above the host, preferred.
           {"multi-node-nccl",
            {{"kueue.x-k8s.io/podset-preferred-topology", "nvidia.com/gpu.clique"}}},
           {"independent", json::object()},
       }) {
    auto r = RenderPlaced(c.topology, 4);
    ASSERT_TRUE(r.ok()) << c.topology << ": " << r.status().message();
    ExpectValid(*r, c.topology);
    EXPECT_EQ(TemplateAnnotations(*r), c.annotations) << c.topology;
  }
  // The platform's Topology, named by its flavors with node labels.
  policy::Platform p = LoadPlatform(kMultiPlatform);
  auto objects = RenderPlatform(p);
  ASSERT_TRUE(objects.ok());
  const json* topology = nullptr;
  for (const json& o : *objects) {
    if (o["kind"] == "Topology") topology = &o;
    if (o["kind"] == "ResourceFlavor" && o["spec"].contains("nodeLabels")) {
      EXPECT_EQ(o["spec"]["topologyName"], "tau") << o.dump();
    }
  }
  ASSERT_NE(topology, nullptr);
  EXPECT_EQ((*topology)["spec"]["levels"], json::parse(R"([{"nodeLabel": "tau.dev/network-block"},
                            {"nodeLabel": "nvidia.com/gpu.clique"},
                            {"nodeLabel": "kubernetes.io/hostname"}])"));
}

TEST(Errors, PlacementsThePlatformCannotHoldAreRefused) {
  // No topology at all: a gang's placement cannot be honoured, so it is refused, with what to do.
  auto r = RenderPlaced("same-host", 2, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("policy.topology: 'same-host' needs the cluster's 'host' "
                                      "level, and the platform defines no topology"),
            std::string::npos)
      << r.status().message();
  r = RenderPlaced("multi-node-nccl", 2, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("policy.topology: 'multi-node-nccl'"), std::string::npos);
  // A level the platform lacks.
  r = RenderPlaced("same-site", 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("defines only network-domain, accelerator-domain, host"),
            std::string::npos)
      << r.status().message();
  // One pod is in one domain at every level: nothing to ask, nothing to refuse.
  r = RenderPlaced("same-site", 1, true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(TemplateAnnotations(*r), json::object());
}

TEST(MetricsSidecar, ItsScriptPrintsTheFileAndTheLastLinesWrittenBeforeItIsStopped) {
  auto r = RenderText("name: q\nengine: job\nentrypoint: train.py\nruntime: {image: x}\n",
                      kMultiPlatform, "bob");
  ASSERT_TRUE(r.ok()) << r.status().message();
  json sidecar;
  for (const json& c : r->back()["spec"]["template"]["spec"]["initContainers"])
    if (c["name"] == "tau-metrics") sidecar = c;
  ASSERT_EQ(sidecar["command"], json({"sh"}));
  const std::string script = sidecar["args"][1];
  std::string dir = (std::filesystem::temp_directory_path() /
                     fmt::format("tau-sidecar-{}", static_cast<long>(::getpid())))
                        .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/script.sh") << script;
  // As the kubelet runs it: started before the worker writes, stopped (TERM) once it has ended,
  // the last line written just before the stop. Its tail goes with it (no process left).
  const std::string harness = fmt::format(
      "cd {0} && export TAU_METRICS_FILE={0}/metrics.jsonl && "
      "(sh ./script.sh tau-metrics > out.txt 2>&1 & p=$!; sleep 0.5; "
      "echo first >> \"$TAU_METRICS_FILE\"; sleep 0.5; echo last >> \"$TAU_METRICS_FILE\"; "
      "kill -TERM $p; wait $p; sleep 0.2; ! pgrep -f \"[F] {0}/metrics.jsonl\" >/dev/null)",
      dir);
  ASSERT_EQ(std::system(harness.c_str()), 0);
  EXPECT_EQ(ReadAll(dir + "/out.txt"), "first\nlast\n");
  std::filesystem::remove_all(dir);
}

TEST(Errors, RefusesImageTheWorkspaceDoesNotAllow) {
  spec::RunSpec s = LoadSpec("examples/gpu-quickstart/tau.yaml");
  auto run = policy::Resolve(s, LoadPlatform(kExamplePlatform), "alice");
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("runtime.image"), std::string::npos);
  // A default image is held to the same rule.
  auto r =
      RenderText("schema_version: 1\nname: q\nrun: {entrypoint: train.py, workload_kind: job}\n",
                 kExamplePlatform, "alice", RenderOptions{.default_image = "python:3.12"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("default image 'python:3.12' is not allowed"),
            std::string::npos)
      << r.status().message();
}

TEST(Errors, NeedsAnImage) {
  auto r = RenderText("schema_version: 1\nname: q\nrun: {entrypoint: train.py}\n", kMultiPlatform,
                      "alice");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("runtime.image: a run on Kubernetes needs a container image"),
            std::string::npos)
      << r.status().message();
}

TEST(Errors, CodeOverTheInlineLimit) {
  RenderOptions o;
  o.default_image = "python:3.12";
  o.code = {{"train.py", 0644, "print(1)\n"}, {"data.bin", 0644, std::string(300 * 1024, 'x')}};
  auto r =
      RenderText("schema_version: 1\nname: q\nrun: {entrypoint: train.py, workload_kind: job}\n",
                 kMultiPlatform, "alice", o);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("at most 256 KiB"), std::string::npos) << m;
  EXPECT_NE(m.find(".tauignore"), std::string::npos) << m;
}

TEST(Errors, BadCodePaths) {
  for (const char* path : {"../x.py", "/etc/passwd", "a//b.py", "./a.py"}) {
    RenderOptions o;
    o.default_image = "python:3.12";
    o.code = {{path, 0644, "x"}};
    auto r = RenderText("schema_version: 1\nname: q\nrun: {entrypoint: train.py}\n", kMultiPlatform,
                        "alice", o);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.status().message().find("code file"), std::string::npos) << r.status().message();
  }
}

TEST(Errors, NamespaceOtherThanTheWorkspaces) {
  auto r = RenderText(
      "schema_version: 1\nname: q\nrun: {entrypoint: train.py}\nruntime: {image: x}\n"
      "policy: {namespace: elsewhere}\n",
      kMultiPlatform, "alice");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("policy.namespace: 'elsewhere' is not the namespace of "
                                      "workspace 'research'"),
            std::string::npos)
      << r.status().message();
}

TEST(Errors, StorageWithoutPvc) {
  auto r = RenderText(
      "schema_version: 1\nname: q\nrun: {entrypoint: train.py}\nruntime: {image: x}\n"
      "storage: {output: laptop-scratch}\n",
      kMultiPlatform, "alice");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("storage volume 'laptop-scratch' has no pvc"),
            std::string::npos)
      << r.status().message();
}

TEST(Errors, NameTooLongOrNotALetterFirst) {
  std::string long_name(46, 'a');
  auto r = RenderText("schema_version: 1\nname: " + long_name +
                          "\nrun: {entrypoint: train.py}\nruntime: {image: x}\n",
                      kMultiPlatform, "alice");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at most 47 characters"), std::string::npos)
      << r.status().message();
  r = RenderText(
      "schema_version: 1\nname: 7run\nrun: {entrypoint: train.py}\nruntime: {image: x}\n",
      kMultiPlatform, "alice");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("start with a lowercase letter"), std::string::npos);
}

TEST(Errors, MigAndImageAssetsAreNotSupportedYet) {
  auto r = RenderText(
      "schema_version: 1\nname: q\nrun: {entrypoint: train.py}\nruntime: {image: x}\n"
      "compute: {gpus: 1, gpu_resource_mode: mig}\n"
      "storage: {image_assets: [{name: w, image: 'ghcr.io/x:1', mount_path: /w}]}\n",
      kMultiPlatform, "alice");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compute.gpu_resource_mode: 'mig'"), std::string::npos);
  EXPECT_NE(r.status().message().find("storage.image_assets"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The code archive is a tar that any tar reads: headers with valid checksums, sizes, padding.

TEST(CodeArchive, IsAValidUstarArchive) {
  RenderOptions o;
  o.default_image = "python:3.12";
  std::string long_dir(120, 'd');
  o.code = {{"train.py", 0755, "print('hi')\n"},
            {"pkg/" + long_dir + "/mod.py", 0644, std::string(700, 'y')}};
  auto r =
      RenderText("schema_version: 1\nname: q\nrun: {entrypoint: train.py, workload_kind: job}\n",
                 kMultiPlatform, "alice", o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const json& init = r->back()["spec"]["template"]["spec"]["initContainers"][0];
  std::string b64;
  for (size_t i = 3; i < init["args"].size(); ++i) b64 += init["args"][i].get<std::string>();
  auto tar = Base64Decode(b64);
  ASSERT_TRUE(tar.ok());
  ASSERT_EQ(tar->size() % 512, 0u);
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos + 512 <= tar->size() && (*tar)[pos] != '\0') {
    const char* h = tar->data() + pos;
    unsigned sum = 0;
    for (int i = 0; i < 512; ++i)
      sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
    EXPECT_EQ(std::stoul(std::string(h + 148, 6), nullptr, 8), sum);
    EXPECT_EQ(std::string(h + 257, 5), "ustar");
    std::string prefix(h + 345, strnlen(h + 345, 155));
    std::string name(h, strnlen(h, 100));
    names.push_back(prefix.empty() ? name : prefix + "/" + name);
    size_t size = std::stoul(std::string(h + 124, 11), nullptr, 8);
    pos += 512 + (size + 511) / 512 * 512;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"pkg/" + long_dir + "/mod.py", "train.py"}));
}

}  // namespace
}  // namespace tau::kube
