// Service rendering tests (RenderService): golden files for a CPU Deployment service, a GPU one
// serving a trained run's checkpoint, and a RayService; every object validated against the
// built-in kinds' schemas and KubeRay's RayService CRD; the parts a replica depends on (probes,
// replicas, $PORT, Kueue's labels, the read-only model) and the refusals checked one by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kube/kube.h"
#include "kube/kube_test_util.h"
#include "kube/service.h"
#include "policy/policy.h"
#include "spec/spec.h"

namespace tau::kube {
namespace {

using nlohmann::json;
using testing::ExpectGolden;
using testing::ReadAll;
using testing::Schemas;
using testing::SourceDir;

constexpr const char* kMultiPlatform = "tests/data/kube/platform-multi.yaml";

const policy::Platform& Platform() {
  static const policy::Platform* platform = [] {
    policy::PlatformOutcome out =
        policy::ParsePlatform(ReadAll(SourceDir() / kMultiPlatform), kMultiPlatform);
    EXPECT_TRUE(out.ok()) << out.ErrorText();
    return new policy::Platform(out.ok() ? *out.platform : policy::Platform{});
  }();
  return *platform;
}

// The parser of `kind: service` is not this module's: a run spec parsed as usual, its serve
// section set by hand.
spec::RunSpec ServiceSpec(const std::string& yaml, const spec::Serve& serve) {
  spec::ParseOutcome out = spec::ParseSpec(yaml, "tau.yaml");
  EXPECT_TRUE(out.ok()) << out.ErrorText();
  spec::RunSpec s = out.ok() ? *out.spec : spec::RunSpec{};
  s.serve = serve;
  return s;
}

// A CPU HTTP server run as a job: `python3 serve.py`, two env values (one a secret).
constexpr const char* kEchoYaml = R"(schema_version: 1
name: echo
run:
  entrypoint: serve.py
  args: ["--workers", "2"]
  workload_kind: job
compute:
  cpus: 1
  memory: 1Gi
runtime:
  image: python:3.12-slim
  env:
    LOG_LEVEL: info
    API_KEY: SECRET:echo-api-key
)";

// A GPU server in the vision workspace (its profile: one H100), serving a trained run's weights.
constexpr const char* kVisionYaml = R"(schema_version: 1
name: vision-api
run:
  entrypoint: serve.py
  workload_kind: job
runtime:
  image: nvcr.io/nvidia/pytorch:24.05-py3
  pip: ["fastapi==0.115.0", "uvicorn==0.30.0"]
policy:
  workspace: vision
)";

// A Ray Serve application on two GPU workers.
constexpr const char* kRayYaml = R"(schema_version: 1
name: ray-llm
run:
  entrypoint: serve_app.py
  workload_kind: rayjob
compute:
  gpus: 1
  workers: 2
  cpus: 8
  memory: 32Gi
runtime:
  image: rayproject/ray:2.41.0-py312-gpu
  pip: ["transformers==4.44.0"]
  env:
    MODEL_DTYPE: bfloat16
    HF_TOKEN: SECRET:hf-token
policy:
  gpu_class: h100-80gb
)";

spec::Serve EchoServe() {
  spec::Serve serve;
  serve.replicas = 3;
  serve.port = 8080;
  serve.readiness.http_path = "/ready";
  serve.readiness.initial_delay_ms = 2'000;
  serve.readiness.period_ms = 5'000;
  return serve;
}

spec::Serve VisionServe() {
  spec::Serve serve;
  serve.replicas = 2;
  serve.port = 9000;
  serve.from_run = "vision-train";
  serve.readiness.http_path = "/healthz";
  serve.readiness.initial_delay_ms = 30'000;
  serve.readiness.period_ms = 2'500;  // 2.5 s: Kubernetes counts whole seconds, rounded up
  serve.readiness.success_threshold = 2;
  serve.liveness = spec::Probe{};
  serve.liveness->initial_delay_ms = 120'000;
  serve.liveness->period_ms = 10'000;
  serve.liveness->timeout_ms = 3'000;
  serve.liveness->failure_threshold = 5;
  serve.liveness->success_threshold = 3;  // Kubernetes allows only 1 for a liveness probe
  return serve;
}

spec::Serve RayServe() {
  spec::Serve serve;
  serve.port = 8000;
  serve.import_path = "serve_app:app";
  return serve;
}

std::vector<CodeFile> ServerCode(const std::string& entry) {
  return {{entry, 0644, "print('serving')\n"},
          {"lib/model.py", 0644, "def load(path):\n    return path\n"}};
}

ServiceRenderOptions EchoOptions() {
  ServiceRenderOptions o;
  o.service_name = "echo";
  o.revision = 4;
  o.code = ServerCode("serve.py");
  return o;
}

ServiceRenderOptions VisionOptions() {
  ServiceRenderOptions o;
  o.service_name = "vision-api";
  o.revision = 2;
  o.code = ServerCode("serve.py");
  o.model_run = "vision-train";
  o.model_path = "/results/vision-train/checkpoints/step-000400";
  o.installation = "prod";
  return o;
}

ServiceRenderOptions RayOptions() {
  ServiceRenderOptions o;
  o.service_name = "ray-llm";
  o.code = ServerCode("serve_app.py");
  return o;
}

Result<std::vector<json>> Render(const spec::RunSpec& s, const std::string& user,
                                 const ServiceRenderOptions& o) {
  TAU_ASSIGN_OR_RETURN(policy::ResolvedRun run, policy::Resolve(s, Platform(), user));
  return RenderService(s, run, Platform(), o);
}

std::vector<json> MustRender(const spec::RunSpec& s, const std::string& user,
                             const ServiceRenderOptions& o) {
  auto objects = Render(s, user, o);
  EXPECT_TRUE(objects.ok()) << objects.status().message();
  return objects.ok() ? *objects : std::vector<json>{};
}

const json& OfKind(const std::vector<json>& objects, const std::string& kind) {
  for (const json& o : objects)
    if (o["kind"] == kind) return o;
  static const json none;
  ADD_FAILURE() << "no " << kind;
  return none;
}

// A container's env value (or valueFrom) by name; null when absent.
json Env(const json& container, const std::string& name) {
  for (const json& e : container.value("env", json::array()))
    if (e["name"] == name) return e.contains("value") ? e["value"] : e["valueFrom"];
  return nullptr;
}

const json& Worker(const json& deployment) {
  return deployment["spec"]["template"]["spec"]["containers"][0];
}

void ExpectValid(const std::vector<json>& objects) {
  for (const json& o : objects) {
    ASSERT_TRUE(Schemas().Knows(o)) << "no schema for " << o["apiVersion"] << " " << o["kind"];
    Status s = Schemas().Validate(o);
    EXPECT_TRUE(s.ok()) << o["kind"] << ":\n" << s.message();
  }
}

void ExpectGoldenAndValid(const std::string& name, const std::vector<json>& objects) {
  std::string yaml = "# service " + name + " against " + kMultiPlatform + "\n" + ToYaml(objects);
  ExpectGolden("service-" + name + ".yaml", yaml);
  ExpectValid(objects);
  auto back = ParseYaml(yaml);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, objects);
}

// ---------------------------------------------------------------------------------------------
// Goldens: every object as rendered, and valid.

TEST(ServiceGolden, CpuDeployment) {
  ExpectGoldenAndValid("cpu-deployment",
                       MustRender(ServiceSpec(kEchoYaml, EchoServe()), "alice", EchoOptions()));
}

TEST(ServiceGolden, GpuDeploymentWithModelAndLiveness) {
  ExpectGoldenAndValid(
      "gpu-model", MustRender(ServiceSpec(kVisionYaml, VisionServe()), "carol", VisionOptions()));
}

TEST(ServiceGolden, RayService) {
  ExpectGoldenAndValid("rayservice",
                       MustRender(ServiceSpec(kRayYaml, RayServe()), "alice", RayOptions()));
}

// ---------------------------------------------------------------------------------------------
// A job service: a Service, then the Deployment of its replicas.

TEST(ServiceDeployment, TheServiceFrontsTheReplicasOnPort80) {
  std::vector<json> objects =
      MustRender(ServiceSpec(kEchoYaml, EchoServe()), "alice", EchoOptions());
  ASSERT_EQ(objects.size(), 2u);
  // Applied first, so that the replicas start with its name resolvable.
  EXPECT_EQ(objects[0]["kind"], "Service");
  EXPECT_EQ(objects[1]["kind"], "Deployment");
  const json& service = objects[0];
  const json& deployment = objects[1];
  EXPECT_EQ(service["metadata"]["name"], "echo");
  EXPECT_EQ(deployment["metadata"]["name"], "echo");
  EXPECT_EQ(service["metadata"]["namespace"], "research");
  EXPECT_EQ(service["spec"]["type"], "ClusterIP");
  ASSERT_EQ(service["spec"]["ports"].size(), 1u);
  EXPECT_EQ(service["spec"]["ports"][0]["port"], 80);
  EXPECT_EQ(service["spec"]["ports"][0]["targetPort"], "http");
  // The Service's and the Deployment's selectors pick the replicas' pods, and only by labels that
  // never change (a Deployment's selector is immutable).
  const json& labels = deployment["spec"]["template"]["metadata"]["labels"];
  const json& selector = deployment["spec"]["selector"]["matchLabels"];
  EXPECT_EQ(selector, service["spec"]["selector"]);
  EXPECT_EQ(selector, json({{"tau.dev/service", "echo"}}));
  for (const auto& [k, v] : selector.items()) EXPECT_EQ(labels.value(k, json()), v) << k;
  // No Kueue label on the Service: Kueue has nothing to admit there.
  EXPECT_FALSE(service["metadata"]["labels"].contains(kKueueQueueLabel));
}

TEST(ServiceDeployment, ReplicasPortAndRestartsAreTheServices) {
  spec::Serve serve = EchoServe();
  serve.replicas = 5;
  serve.port = 7070;
  std::vector<json> objects = MustRender(ServiceSpec(kEchoYaml, serve), "alice", EchoOptions());
  const json& deployment = OfKind(objects, "Deployment");
  EXPECT_EQ(deployment["spec"]["replicas"], 5);
  const json& pod = deployment["spec"]["template"]["spec"];
  EXPECT_EQ(pod["restartPolicy"], "Always");
  const json& c = Worker(deployment);
  EXPECT_EQ(c["name"], "worker");
  EXPECT_EQ(Env(c, "PORT"), "7070");
  ASSERT_EQ(c["ports"].size(), 1u);
  EXPECT_EQ(c["ports"][0], json({{"name", "http"}, {"containerPort", 7070}, {"protocol", "TCP"}}));
  // The entrypoint runs as a single process with its args, as written.
  EXPECT_EQ(c["command"], json({"python3", "serve.py", "--workers", "2"}));
  // The spec's env: literal values and the secret reference.
  EXPECT_EQ(Env(c, "LOG_LEVEL"), "info");
  EXPECT_EQ(Env(c, "API_KEY"),
            json({{"secretKeyRef", {{"name", "tau-secrets"}, {"key", "echo-api-key"}}}}));
  EXPECT_EQ(Env(c, "TAU_SERVICE_NAME"), "echo");
  EXPECT_EQ(Env(c, "TAU_SERVICE_REVISION"), "4");
  // A replica is no run's attempt.
  EXPECT_TRUE(Env(c, "TAU_RUN_NAME").is_null());
  EXPECT_TRUE(Env(c, "TAU_SERVE_MODEL").is_null());
  // The code is unpacked by the setup container, as for a Job.
  const json& init = pod["initContainers"];
  ASSERT_GE(init.size(), 1u);
  EXPECT_EQ(init[0]["name"], "tau-setup");
  EXPECT_GT(init[0]["args"].size(), 3u);  // -c SCRIPT NAME CHUNKS...
  EXPECT_EQ(c["workingDir"], "/tau/code");
  EXPECT_EQ(c["resources"]["requests"]["cpu"], "1");
  EXPECT_EQ(c["resources"]["limits"]["memory"], "1Gi");
}

TEST(ServiceDeployment, KueueAdmitsEachReplicaFromTheResolvedQueue) {
  spec::RunSpec s = ServiceSpec(kVisionYaml, VisionServe());
  auto run = policy::Resolve(s, Platform(), "carol");
  ASSERT_TRUE(run.ok()) << run.status().message();
  ASSERT_EQ(run->queue, "vision");
  ASSERT_EQ(run->priority_class, "priority");
  auto objects = RenderService(s, *run, Platform(), VisionOptions());
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  const json& deployment = OfKind(*objects, "Deployment");
  for (const json* labels :
       {&deployment["metadata"]["labels"], &deployment["spec"]["template"]["metadata"]["labels"]}) {
    EXPECT_EQ((*labels)[kKueueQueueLabel], "vision");
    EXPECT_EQ((*labels)[kKueuePriorityLabel], "priority");
    EXPECT_EQ((*labels)[kLabelService], "vision-api");
    EXPECT_EQ((*labels)[kLabelWorkspace], "vision");
    EXPECT_EQ((*labels)[kLabelManagedBy], "tau");
    EXPECT_EQ((*labels)[kLabelInstallation], "prod");
    // The Kubernetes backend follows pods and objects labelled tau.dev/run as attempts.
    EXPECT_FALSE(labels->contains(kLabelRun));
    EXPECT_FALSE(labels->contains(kLabelAttempt));
  }
  // The revision is on the objects and on the pods (a new one rolls the replicas).
  EXPECT_EQ(deployment["metadata"]["annotations"][kAnnotationRevision], "2");
  EXPECT_EQ(deployment["spec"]["template"]["metadata"]["annotations"][kAnnotationRevision], "2");
  EXPECT_EQ(OfKind(*objects, "Service")["metadata"]["annotations"][kAnnotationRevision], "2");
  // One GPU per replica, on the GPU nodes (the profile's class), tolerating their taint.
  const json& pod = deployment["spec"]["template"]["spec"];
  EXPECT_EQ(Worker(deployment)["resources"]["limits"]["nvidia.com/gpu"], "1");
  EXPECT_EQ(pod["nodeSelector"]["tau.dev/gpu-class"], "h100-80gb");
  ASSERT_TRUE(pod.contains("tolerations"));
  EXPECT_EQ(pod["tolerations"][0]["key"], "nvidia.com/gpu");
}

// ---------------------------------------------------------------------------------------------
// Probes.

TEST(ServiceProbes, HttpAndTcpProbesInWholeSeconds) {
  std::vector<json> objects =
      MustRender(ServiceSpec(kVisionYaml, VisionServe()), "carol", VisionOptions());
  const json& c = Worker(OfKind(objects, "Deployment"));
  EXPECT_EQ(c["readinessProbe"],
            json({{"httpGet", {{"path", "/healthz"}, {"port", "http"}, {"scheme", "HTTP"}}},
                  {"initialDelaySeconds", 30},
                  {"periodSeconds", 3},
                  {"timeoutSeconds", 1},
                  {"failureThreshold", 3},
                  {"successThreshold", 2}}));
  // A liveness probe passes on one success, whatever the spec says: the API server allows no
  // other value.
  EXPECT_EQ(c["livenessProbe"], json({{"tcpSocket", {{"port", "http"}}},
                                      {"initialDelaySeconds", 120},
                                      {"periodSeconds", 10},
                                      {"timeoutSeconds", 3},
                                      {"failureThreshold", 5},
                                      {"successThreshold", 1}}));

  // No liveness in the spec: none rendered (the kubelet restarts only what stops).
  objects = MustRender(ServiceSpec(kEchoYaml, EchoServe()), "alice", EchoOptions());
  const json& echo = Worker(OfKind(objects, "Deployment"));
  EXPECT_FALSE(echo.contains("livenessProbe"));
  EXPECT_EQ(echo["readinessProbe"]["httpGet"]["path"], "/ready");
  EXPECT_EQ(echo["readinessProbe"]["periodSeconds"], 5);

  // Sub-second times are rounded up, never to 0.
  spec::Serve serve = EchoServe();
  serve.readiness = spec::Probe{};
  serve.readiness.period_ms = 200;
  serve.readiness.timeout_ms = 1'001;
  objects = MustRender(ServiceSpec(kEchoYaml, serve), "alice", EchoOptions());
  const json& tcp = Worker(OfKind(objects, "Deployment"))["readinessProbe"];
  EXPECT_EQ(tcp["tcpSocket"]["port"], "http");
  EXPECT_FALSE(tcp.contains("httpGet"));
  EXPECT_EQ(tcp["periodSeconds"], 1);
  EXPECT_EQ(tcp["timeoutSeconds"], 2);
  EXPECT_EQ(tcp["initialDelaySeconds"], 0);
}

// The schema holds a liveness probe's successThreshold to 1 as the API server does, and knows
// every field of a Deployment: a rendering that broke either would fail the tests above.
TEST(ServiceProbes, TheSchemasRefuseWhatTheApiServerRefuses) {
  std::vector<json> objects =
      MustRender(ServiceSpec(kVisionYaml, VisionServe()), "carol", VisionOptions());
  json deployment = OfKind(objects, "Deployment");
  ASSERT_TRUE(Schemas().Validate(deployment).ok());
  json bad = deployment;
  bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["successThreshold"] = 3;
  Status s = Schemas().Validate(bad);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("livenessProbe.successThreshold"), std::string::npos) << s.message();
  bad = deployment;
  bad["spec"]["replica"] = 2;
  s = Schemas().Validate(bad);
  EXPECT_NE(s.message().find("replica: unknown field (did you mean 'replicas'?)"),
            std::string::npos)
      << s.message();
  bad = deployment;
  bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x";
  EXPECT_FALSE(Schemas().Validate(bad).ok());
  json service = OfKind(objects, "Service");
  ASSERT_TRUE(Schemas().Validate(service).ok());
  service["spec"]["type"] = "Internal";
  EXPECT_FALSE(Schemas().Validate(service).ok());
}

// ---------------------------------------------------------------------------------------------
// The model a service serves: read-only, at $TAU_SERVE_MODEL.

// The mount of the model in a container; null when none.
json ModelMountOf(const json& container) {
  for (const json& m : container["volumeMounts"])
    if (m["mountPath"] == kModelDir) return m;
  return nullptr;
}

TEST(ServiceModel, TheCheckpointIsMountedReadOnly) {
  std::vector<json> objects =
      MustRender(ServiceSpec(kVisionYaml, VisionServe()), "carol", VisionOptions());
  const json& deployment = OfKind(objects, "Deployment");
  const json& c = Worker(deployment);
  EXPECT_EQ(Env(c, "TAU_SERVE_MODEL"), "/tau/model");
  EXPECT_EQ(Env(c, "TAU_SERVE_MODEL_RUN"), "vision-train");
  json mount = ModelMountOf(c);
  ASSERT_FALSE(mount.is_null());
  EXPECT_EQ(mount["name"], "vision-results");
  EXPECT_EQ(mount["subPath"], "vision-train/checkpoints/step-000400");
  EXPECT_EQ(mount["readOnly"], true);
  // The workspace's results volume is the service's own storage too: one pod volume, mounted
  // read-write for the service's own directories and read-only for the model.
  const json& volumes = deployment["spec"]["template"]["spec"]["volumes"];
  EXPECT_EQ(std::count_if(volumes.begin(), volumes.end(),
                          [](const json& v) { return v["name"] == "vision-results"; }),
            1);
  EXPECT_EQ(deployment["metadata"]["annotations"][kAnnotationModelRun], "vision-train");
  // Only the server sees it: not the setup container, which runs pip.
  for (const json& init : deployment["spec"]["template"]["spec"]["initContainers"])
    EXPECT_TRUE(ModelMountOf(init).is_null()) << init["name"];
}

TEST(ServiceModel, ARayServicesHeadAndWorkersMountItToo) {
  spec::Serve serve = RayServe();
  serve.from_run = "llm-finetune";
  std::vector<json> objects = MustRender(ServiceSpec(kRayYaml, serve), "alice", RayOptions());
  const json& cluster = OfKind(objects, "RayService")["spec"]["rayClusterConfig"];
  for (const json* group : {&cluster["headGroupSpec"], &cluster["workerGroupSpecs"][0]}) {
    const json& c = (*group)["template"]["spec"]["containers"][0];
    EXPECT_EQ(ModelMountOf(c), json({{"name", "research-results"},
                                     {"mountPath", "/tau/model"},
                                     {"subPath", "llm-finetune/checkpoints"},
                                     {"readOnly", true}}));
    EXPECT_EQ(Env(c, "TAU_SERVE_MODEL"), "/tau/model");
  }
  ExpectValid(objects);
}

TEST(ServiceModel, WithoutAPathTheRunsDirectoryOfTheModelsKind) {
  ServiceRenderOptions o = VisionOptions();
  o.model_path.clear();
  std::vector<json> objects = MustRender(ServiceSpec(kVisionYaml, VisionServe()), "carol", o);
  EXPECT_EQ(ModelMountOf(Worker(OfKind(objects, "Deployment")))["subPath"],
            "vision-train/checkpoints");
  spec::Serve serve = VisionServe();
  serve.model = "output";
  objects = MustRender(ServiceSpec(kVisionYaml, serve), "carol", o);
  EXPECT_EQ(ModelMountOf(Worker(OfKind(objects, "Deployment")))["subPath"], "vision-train/output");
  // A relative path is on the storage of the model's kind.
  o.model_path = "vision-train/output/export";
  objects = MustRender(ServiceSpec(kVisionYaml, serve), "carol", o);
  EXPECT_EQ(ModelMountOf(Worker(OfKind(objects, "Deployment")))["subPath"],
            "vision-train/output/export");
  // The options name the run when the spec does not.
  serve.from_run.clear();
  o.model_path.clear();
  objects = MustRender(ServiceSpec(kVisionYaml, serve), "carol", o);
  EXPECT_EQ(Env(Worker(OfKind(objects, "Deployment")), "TAU_SERVE_MODEL_RUN"), "vision-train");
}

TEST(ServiceModel, AVolumeTheServiceDoesNotMountJoinsReadOnly) {
  // The datasets volume (/data) is the research workspace's, not mounted by the echo service.
  ServiceRenderOptions o = EchoOptions();
  o.model_run = "bert-base";
  o.model_path = "/data/models/bert-base/";
  std::vector<json> objects = MustRender(ServiceSpec(kEchoYaml, EchoServe()), "alice", o);
  const json& deployment = OfKind(objects, "Deployment");
  json mount = ModelMountOf(Worker(deployment));
  ASSERT_FALSE(mount.is_null());
  EXPECT_EQ(mount, json({{"name", "datasets"},
                         {"mountPath", "/tau/model"},
                         {"subPath", "models/bert-base"},
                         {"readOnly", true}}));
  json volume;
  for (const json& v : deployment["spec"]["template"]["spec"]["volumes"])
    if (v["name"] == "datasets") volume = v;
  EXPECT_EQ(volume["persistentVolumeClaim"], json({{"claimName", "datasets"}, {"readOnly", true}}));
  ExpectValid(objects);
}

TEST(ServiceModel, AModelOffTheWorkspacesStorageIsRefused) {
  ServiceRenderOptions o = VisionOptions();
  o.model_path = "/elsewhere/vision-train";
  auto r = Render(ServiceSpec(kVisionYaml, VisionServe()), "carol", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("serve.from_run: the model of run 'vision-train' at "
                                      "'/elsewhere/vision-train' is on none of workspace "
                                      "'vision''s storage volumes"),
            std::string::npos)
      << r.status().message();
  o.model_path = "/results/../etc";
  r = Render(ServiceSpec(kVisionYaml, VisionServe()), "carol", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has '..'"), std::string::npos) << r.status().message();
}

// ---------------------------------------------------------------------------------------------
// A rayjob service: a RayService.

TEST(ServiceRay, OneServeApplicationOnARayJobsCluster) {
  spec::RunSpec s = ServiceSpec(kRayYaml, RayServe());
  auto run = policy::Resolve(s, Platform(), "alice");
  ASSERT_TRUE(run.ok()) << run.status().message();
  auto objects = RenderService(s, *run, Platform(), RayOptions());
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  ASSERT_EQ(objects->size(), 1u);
  const json& rs = objects->front();
  EXPECT_EQ(rs["apiVersion"], "ray.io/v1");
  EXPECT_EQ(rs["kind"], "RayService");
  EXPECT_EQ(rs["metadata"]["name"], "ray-llm");
  EXPECT_EQ(rs["metadata"]["labels"][kKueueQueueLabel], run->queue);
  EXPECT_EQ(rs["metadata"]["labels"][kKueuePriorityLabel], run->priority_class);
  EXPECT_EQ(rs["metadata"]["labels"][kLabelService], "ray-llm");

  auto config = ParseYaml(rs["spec"]["serveConfigV2"].get<std::string>());
  ASSERT_TRUE(config.ok()) << config.status().message();
  ASSERT_EQ(config->size(), 1u);
  const json& apps = (*config)[0]["applications"];
  ASSERT_EQ(apps.size(), 1u);
  EXPECT_EQ(apps[0]["name"], "ray-llm");
  EXPECT_EQ(apps[0]["import_path"], "serve_app:app");
  EXPECT_EQ(apps[0]["route_prefix"], "/");
  // Literal env and pip through Ray's runtime env; the secret stays out of the object.
  EXPECT_EQ(apps[0]["runtime_env"],
            json({{"env_vars", {{"MODEL_DTYPE", "bfloat16"}}}, {"pip", {"transformers==4.44.0"}}}));
  EXPECT_EQ(rs["spec"]["serveConfigV2"].get<std::string>().find("hf-token"), std::string::npos);
  EXPECT_EQ((*config)[0]["http_options"]["port"], 8000);

  const json& cluster = rs["spec"]["rayClusterConfig"];
  EXPECT_EQ(cluster["rayVersion"], "2.41.0");
  const json& group = cluster["workerGroupSpecs"][0];
  EXPECT_EQ(group["replicas"], 2);
  EXPECT_EQ(group["minReplicas"], 2);
  EXPECT_EQ(group["maxReplicas"], 2);
  EXPECT_EQ(group["rayStartParams"]["num-gpus"], "1");
  const json& head = cluster["headGroupSpec"];
  EXPECT_EQ(head["rayStartParams"]["num-cpus"], "0");
  for (const json* pod : {&head["template"], &group["template"]}) {
    const json& c = (*pod)["spec"]["containers"][0];
    // KubeRay's serve Service and health checks read the port named "serve".
    EXPECT_EQ(c["ports"][0],
              json({{"name", "serve"}, {"containerPort", 8000}, {"protocol", "TCP"}}));
    EXPECT_EQ(Env(c, "HF_TOKEN"),
              json({{"secretKeyRef", {{"name", "tau-secrets"}, {"key", "hf-token"}}}}));
    EXPECT_EQ(Env(c, "PYTHONPATH"), "/tau/code");
    // Kueue admits the RayCluster, not its pods.
    EXPECT_FALSE((*pod)["metadata"]["labels"].contains(kKueueQueueLabel));
    // No driver runs on the head: no metrics sidecar beside it.
    for (const json& init : (*pod)["spec"]["initContainers"])
      EXPECT_NE(init["name"], "tau-metrics");
  }
  EXPECT_EQ(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1");
  ExpectValid(*objects);
}

// A spec in a folder below the shipped code (an entrypoint such as ../lib/x.py ships the folder
// above): Ray imports the application from the spec's folder first, as a local run would.
TEST(ServiceRay, TheApplicationIsImportedFromTheSpecsFolder) {
  spec::RunSpec s = ServiceSpec(kRayYaml, RayServe());
  auto run = policy::Resolve(s, Platform(), "alice");
  ASSERT_TRUE(run.ok()) << run.status().message();
  run->code_subdir = "app";
  ServiceRenderOptions o = RayOptions();
  o.code = {{"app/serve_app.py", 0644, "app = None\n"}, {"lib/util.py", 0644, "x = 1\n"}};
  auto objects = RenderService(s, *run, Platform(), o);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  const json& cluster = objects->front()["spec"]["rayClusterConfig"];
  for (const json* group : {&cluster["headGroupSpec"], &cluster["workerGroupSpecs"][0]}) {
    EXPECT_EQ(Env((*group)["template"]["spec"]["containers"][0], "PYTHONPATH"),
              "/tau/code/app:/tau/code");
  }
}

TEST(ServiceRay, ARayServiceWithoutAnImportPathIsRefused) {
  auto r = Render(ServiceSpec(kRayYaml, spec::Serve{}), "alice", RayOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("serve.import_path: a rayjob service runs as a Ray Serve "
                                      "application"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("serve.import_path: MODULE:APP"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Refusals, as RenderRun's: InvalidArgument naming the field and what to do.

TEST(ServiceErrors, NeedsAnImage) {
  std::string yaml = kEchoYaml;
  yaml.erase(yaml.find("  image: python:3.12-slim\n"),
             std::string("  image: python:3.12-slim\n").size());
  auto r = Render(ServiceSpec(yaml, EchoServe()), "alice", EchoOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("runtime.image: a run on Kubernetes needs a container image"),
            std::string::npos)
      << r.status().message();
  // A default image does.
  ServiceRenderOptions o = EchoOptions();
  o.default_image = "python:3.12-slim";
  EXPECT_TRUE(Render(ServiceSpec(yaml, EchoServe()), "alice", o).ok());
}

TEST(ServiceErrors, RefusesADefaultImageTheWorkspaceDoesNotAllow) {
  std::string yaml = kVisionYaml;
  yaml.erase(yaml.find("  image: nvcr.io/nvidia/pytorch:24.05-py3\n"),
             std::string("  image: nvcr.io/nvidia/pytorch:24.05-py3\n").size());
  ServiceRenderOptions o = VisionOptions();
  o.default_image = "python:3.12";
  auto r = Render(ServiceSpec(yaml, VisionServe()), "carol", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("runtime.image: the default image 'python:3.12' is not "
                                      "allowed in workspace 'vision'"),
            std::string::npos)
      << r.status().message();
}

TEST(ServiceErrors, CodeOverTheInlineLimit) {
  ServiceRenderOptions o = EchoOptions();
  o.code.push_back({"weights.bin", 0644, std::string(300 * 1024, 'x')});
  auto r = Render(ServiceSpec(kEchoYaml, EchoServe()), "alice", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at most 256 KiB"), std::string::npos)
      << r.status().message();
}

TEST(ServiceErrors, AReplicaIsOnePod) {
  std::string yaml = kEchoYaml;
  yaml.replace(yaml.find("  cpus: 1\n"), std::string("  cpus: 1\n").size(),
               "  cpus: 1\n  workers: 2\n");
  auto r = Render(ServiceSpec(yaml, EchoServe()), "alice", EchoOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compute.workers: a service's replica is one pod"),
            std::string::npos)
      << r.status().message();
}

TEST(ServiceErrors, TheServiceNameAndPortMustSuitKubernetes) {
  ServiceRenderOptions o = EchoOptions();
  o.service_name = "Echo_Server";
  spec::Serve serve = EchoServe();
  serve.port = 70000;
  auto r = Render(ServiceSpec(kEchoYaml, serve), "alice", o);
  ASSERT_FALSE(r.ok());
  // Every problem at once.
  EXPECT_NE(r.status().message().find("serve.port: 70000 is not a port"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("name: the service's Kubernetes object would be named "
                                      "'Echo_Server'"),
            std::string::npos)
      << r.status().message();
}

TEST(ServiceErrors, ASpecWithoutServeIsNotAService) {
  spec::RunSpec s = ServiceSpec(kEchoYaml, EchoServe());
  s.serve.reset();
  auto r = Render(s, "alice", EchoOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("serve: the spec is not a service"), std::string::npos);
}

}  // namespace
}  // namespace tau::kube
