// The cluster install (RenderCluster, ParseClusterValues) and the Helm chart it mirrors: golden
// files, every object against the schemas of its kind, the chart's values against its
// values.schema.json, RBAC that covers what tau does, and the chart's templates naming the same
// kinds. tests/integration/test_helm_chart.py compares with real `helm template` when helm is
// there.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>
#include <tuple>

#include "kube/kube.h"
#include "kube/kube_test_util.h"
#include "policy/policy.h"

namespace tau::kube {
namespace {

using nlohmann::json;
using testing::DataDir;
using testing::ExpectGolden;
using testing::ReadAll;
using testing::Schemas;
using testing::SourceDir;

const std::filesystem::path kChart = "deploy/helm/taugrid";
constexpr const char* kMultiPlatform = "tests/data/kube/platform-multi.yaml";

// kubernetes-cluster.json's kinds (StatefulSet, DaemonSet, ...) with kubernetes-core.json's
// definitions (the pod template), which its "$ref"s name.
const SchemaSet& ClusterSchemas() {
  static const SchemaSet* set = [] {
    auto* s = new SchemaSet();
    json core = json::parse(ReadAll(DataDir() / "schemas/kubernetes-core.json"), nullptr, false);
    json cluster =
        json::parse(ReadAll(DataDir() / "schemas/kubernetes-cluster.json"), nullptr, false);
    EXPECT_FALSE(core.is_discarded());
    EXPECT_FALSE(cluster.is_discarded());
    if (core.is_discarded() || cluster.is_discarded()) return s;
    for (const auto& [name, def] : cluster["definitions"].items()) core["definitions"][name] = def;
    for (const auto& [kind, schema] : cluster["kinds"].items()) core["kinds"][kind] = schema;
    Status st = s->AddSchemas(core);
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
  }();
  return *set;
}

void ExpectValid(const std::vector<json>& objects) {
  for (const json& o : objects) {
    const SchemaSet& set = ClusterSchemas().Knows(o) ? ClusterSchemas() : Schemas();
    ASSERT_TRUE(set.Knows(o)) << "no schema for " << o["apiVersion"] << " " << o["kind"];
    Status s = set.Validate(o);
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

std::string PlatformText() { return ReadAll(SourceDir() / kMultiPlatform); }

policy::Platform ParsedPlatform(const std::string& text) {
  policy::PlatformOutcome out = policy::ParsePlatform(text, kMultiPlatform);
  EXPECT_TRUE(out.ok()) << out.ErrorText();
  return out.ok() ? *out.platform : policy::Platform{};
}

ClusterValues CustomValues() {
  auto v = ParseClusterValues(ReadAll(DataDir() / "cluster/values-custom.yaml"));
  EXPECT_TRUE(v.ok()) << v.status().message();
  return v.ok() ? *v : ClusterValues{};
}

const json* Find(const std::vector<json>& objects, const std::string& kind,
                 const std::string& name) {
  for (const json& o : objects) {
    if (o["kind"] == kind && o["metadata"]["name"] == name) return &o;
  }
  return nullptr;
}

// The goldens live in tests/data/kube/cluster/ (ExpectGolden's root is tests/data/kube/golden).
void ExpectClusterGolden(const std::string& name, const std::vector<json>& objects) {
  ExpectGolden("../cluster/" + name, ToYaml(objects));
}

TEST(ClusterRender, DefaultsMatchGoldenAndValidate) {
  auto objects = RenderCluster(ClusterValues{}, nullptr);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  ExpectClusterGolden("defaults.yaml", *objects);
  ExpectValid(*objects);
  // Without a platform: no ConfigMap, and the server is not told about one.
  EXPECT_EQ(Find(*objects, "ConfigMap", "taugrid-platform"), nullptr);
  const json* server = Find(*objects, "StatefulSet", "taugrid-server");
  ASSERT_NE(server, nullptr);
  json command = (*server)["spec"]["template"]["spec"]["containers"][0]["command"];
  EXPECT_EQ(std::find(command.begin(), command.end(), "--platform"), command.end());
}

TEST(ClusterRender, CustomValuesWithPlatformMatchGoldenAndValidate) {
  ClusterValues values = CustomValues();
  values.platform = PlatformText();
  policy::Platform platform = ParsedPlatform(values.platform);
  auto objects = RenderCluster(values, &platform);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  ExpectClusterGolden("custom-with-platform.yaml", *objects);
  ExpectValid(*objects);
  // The platform's own objects follow the chart's, as RenderPlatform gives them.
  auto platform_objects = RenderPlatform(platform);
  ASSERT_TRUE(platform_objects.ok());
  ASSERT_GT(objects->size(), platform_objects->size());
  EXPECT_TRUE(std::equal(platform_objects->begin(), platform_objects->end(),
                         objects->end() - platform_objects->size()));
  // The server reads the platform from the ConfigMap.
  const json* config = Find(*objects, "ConfigMap", "taugrid-platform");
  ASSERT_NE(config, nullptr);
  EXPECT_EQ((*config)["data"]["platform.yaml"], values.platform);
  const json& pod = (*Find(*objects, "StatefulSet", "taugrid-server"))["spec"]["template"];
  json command = pod["spec"]["containers"][0]["command"];
  auto flag = std::find(command.begin(), command.end(), "--platform");
  ASSERT_NE(flag, command.end());
  EXPECT_EQ(*(flag + 1), "/etc/tau/platform.yaml");
  EXPECT_EQ(pod["metadata"]["annotations"]["tau.dev/platform-sha256"].get<std::string>().size(),
            64u);
  // The YAML reads back as the same objects.
  auto back = ParseYaml(ToYaml(*objects));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *objects);
}

TEST(ClusterRender, ServerRunsTheKubernetesBackendWithItsStoreOnAVolume) {
  auto objects = RenderCluster(CustomValues(), nullptr);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  const json* set = Find(*objects, "StatefulSet", "taugrid-server");
  ASSERT_NE(set, nullptr);
  EXPECT_EQ((*set)["spec"]["replicas"], 1);
  const json& container = (*set)["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(container["image"], "registry.example.com:5000/ml/tau:0.2.0-rc1");
  EXPECT_EQ(container["command"],
            json({"tau", "server", "--backend", "kubernetes", "--home", "/var/lib/tau", "--listen",
                  "0.0.0.0:8443", "--tls-cert", "/etc/tau/tls/tls.crt", "--tls-key",
                  "/etc/tau/tls/tls.key", "--kube-installation", "taugrid"}));
  // Resources merge into the defaults as Helm merges maps; numbers become quantities.
  EXPECT_EQ(container["resources"], json({{"requests", {{"cpu", "2"}, {"memory", "4Gi"}}},
                                          {"limits", {{"cpu", "4"}, {"memory", "8Gi"}}}}));
  const json& claim = (*set)["spec"]["volumeClaimTemplates"][0];
  EXPECT_EQ(claim["metadata"]["name"], "data");
  EXPECT_EQ(claim["spec"]["resources"]["requests"]["storage"], "50Gi");
  EXPECT_EQ(claim["spec"]["storageClassName"], "fast-ssd");
  EXPECT_EQ(container["volumeMounts"][0], json({{"name", "data"}, {"mountPath", "/var/lib/tau"}}));
  EXPECT_EQ((*set)["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"], "tau-tls");
  EXPECT_EQ((*set)["spec"]["template"]["spec"]["serviceAccountName"], "tau-controller");
}

TEST(ClusterRender, HealthAgentRunsOnTaintedGpuNodesWithItsNodeName) {
  auto objects = RenderCluster(CustomValues(), nullptr);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  const json* ds = Find(*objects, "DaemonSet", "taugrid-health-agent");
  ASSERT_NE(ds, nullptr);
  const json& pod = (*ds)["spec"]["template"]["spec"];
  std::set<std::string> tolerated;
  for (const json& t : pod["tolerations"]) {
    if (t.value("effect", "") == "NoSchedule") tolerated.insert(t.value("key", ""));
  }
  EXPECT_EQ(tolerated, (std::set<std::string>{"nvidia.com/gpu", kGpuUnhealthyTaint, "dedicated"}));
  const json& container = pod["containers"][0];
  EXPECT_EQ(container["command"],
            json({"tau", "health", "agent", "--node", "$(NODE_NAME)", "--poll-interval", "30s"}));
  EXPECT_EQ(container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
  EXPECT_EQ(pod["nodeSelector"],
            json({{"nvidia.com/gpu.present", "true"}, {"tau.dev/gpu-class", "h100-80gb"}}));
  EXPECT_FALSE(pod.contains("runtimeClassName"));  // "" : the node's default runtime
  // Defaults: the NVIDIA runtime class.
  auto defaults = RenderCluster(ClusterValues{}, nullptr);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ((*Find(*defaults, "DaemonSet",
                   "taugrid-health-agent"))["spec"]["template"]["spec"]["runtimeClassName"],
            "nvidia");
}

// Every (group, resource, verb) a set of RBAC rules grants.
std::set<std::tuple<std::string, std::string, std::string>> Grants(const json& rules) {
  std::set<std::tuple<std::string, std::string, std::string>> out;
  for (const json& r : rules) {
    for (const json& g : r["apiGroups"]) {
      for (const json& res : r["resources"]) {
        for (const json& verb : r["verbs"]) {
          out.insert({g.get<std::string>(), res.get<std::string>(), verb.get<std::string>()});
        }
      }
    }
  }
  return out;
}

TEST(ClusterRender, RbacGrantsWhatTauDoesAndNoMore) {
  ClusterValues values;
  values.platform = PlatformText();
  policy::Platform platform = ParsedPlatform(values.platform);
  auto objects = RenderCluster(values, &platform);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  auto server = Grants((*Find(*objects, "ClusterRole", "taugrid-server"))["rules"]);
  // The server creates the members' Role: it must hold all of it (else the API server refuses it
  // as an escalation, since tau has no `escalate` verb).
  const json* member = Find(*objects, "Role", "tau-member");
  ASSERT_NE(member, nullptr);
  for (const auto& grant : Grants((*member)["rules"])) {
    EXPECT_TRUE(server.count(grant))
        << std::get<0>(grant) << "/" << std::get<1>(grant) << " " << std::get<2>(grant);
  }
  // Every kind the platform renders can be applied by the server.
  const std::map<std::string, std::pair<std::string, std::string>> kinds = {
      {"Namespace", {"", "namespaces"}},
      {"Role", {"rbac.authorization.k8s.io", "roles"}},
      {"RoleBinding", {"rbac.authorization.k8s.io", "rolebindings"}},
      {"ResourceFlavor", {"kueue.x-k8s.io", "resourceflavors"}},
      {"Topology", {"kueue.x-k8s.io", "topologies"}},
      {"Cohort", {"kueue.x-k8s.io", "cohorts"}},
      {"ClusterQueue", {"kueue.x-k8s.io", "clusterqueues"}},
      {"WorkloadPriorityClass", {"kueue.x-k8s.io", "workloadpriorityclasses"}},
      {"LocalQueue", {"kueue.x-k8s.io", "localqueues"}}};
  auto platform_objects = RenderPlatform(platform);
  ASSERT_TRUE(platform_objects.ok());
  for (const json& o : *platform_objects) {
    auto it = kinds.find(o["kind"].get<std::string>());
    ASSERT_NE(it, kinds.end()) << "the test does not know " << o["kind"];
    for (const char* verb : {"create", "update", "patch", "get"}) {
      EXPECT_TRUE(server.count({it->second.first, it->second.second, verb}))
          << it->second.second << " " << verb;
    }
  }
  // A service's objects (a Deployment behind a Service, or a RayService): applied (server-side
  // apply), followed and deleted, as a run's are.
  const std::pair<std::string, std::string> service_kinds[] = {
      {"apps", "deployments"}, {"ray.io", "rayservices"}, {"", "services"}};
  for (const auto& [group, resource] : service_kinds) {
    for (const char* verb : {"get", "list", "watch", "create", "patch", "delete"}) {
      EXPECT_TRUE(server.count({group, resource, verb})) << group << "/" << resource << " " << verb;
    }
  }
  EXPECT_TRUE(server.count({"authorization.k8s.io", "subjectaccessreviews", "create"}));
  EXPECT_TRUE(server.count({"", "secrets", "get"}));
  EXPECT_FALSE(server.count({"", "secrets", "list"}));  // never read every secret
  EXPECT_FALSE(server.count({"", "namespaces", "delete"}));
  for (const auto& [group, resource, verb] : server) EXPECT_NE(verb, "*");
  auto agent = Grants((*Find(*objects, "ClusterRole", "taugrid-health-agent"))["rules"]);
  EXPECT_EQ(agent, (std::set<std::tuple<std::string, std::string, std::string>>{
                       {"", "nodes", "get"},
                       {"", "nodes", "list"},
                       {"", "nodes", "patch"},
                       {"", "nodes/status", "patch"}}));
  // Bindings name the ServiceAccounts in the release's namespace.
  const json* binding = Find(*objects, "ClusterRoleBinding", "taugrid-health-agent");
  ASSERT_NE(binding, nullptr);
  EXPECT_EQ((*binding)["subjects"][0], json({{"kind", "ServiceAccount"},
                                             {"name", "taugrid-health-agent"},
                                             {"namespace", "tau-system"}}));
}

TEST(ClusterRender, SwitchesLeaveTheirObjectsOut) {
  ClusterValues values;
  values.health_agent_enabled = false;
  values.rbac_create = false;
  values.service_account_create = false;
  values.release_name = "prod";
  auto objects = RenderCluster(values, nullptr);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  std::vector<std::string> kinds;
  for (const json& o : *objects)
    kinds.push_back(o["kind"].get<std::string>() + "/" + o["metadata"]["name"].get<std::string>());
  // A release not named taugrid is prefixed to it, as Helm's usual fullname does.
  EXPECT_EQ(kinds, (std::vector<std::string>{"Service/prod-taugrid-server",
                                             "StatefulSet/prod-taugrid-server"}));
}

TEST(ClusterRender, RefusesValuesTheServerCouldNotRunWith) {
  struct Bad {
    void (*set)(ClusterValues&);
    std::string message;
  };
  const std::vector<Bad> cases = {
      {[](ClusterValues& v) { v.storage_size = "-5Gi"; }, "server.storage.size"},
      {[](ClusterValues& v) { v.storage_size = "0"; }, "server.storage.size"},
      {[](ClusterValues& v) { v.tls_secret = ""; }, "secretName"},
      {[](ClusterValues& v) { v.release_name = "Tau_Grid"; }, "release name"},
      {[](ClusterValues& v) { v.image_pull_policy = "Sometimes"; }, "pullPolicy"},
      {[](ClusterValues& v) { v.health_agent_poll_interval = "soon"; }, "pollInterval"},
      {[](ClusterValues& v) { v.server_resources["limits"]["memory"] = "lots"; },
       "server.resources.limits.memory"},
      // A request above its limit: the API server would refuse the pod.
      {[](ClusterValues& v) { v.server_resources["requests"]["memory"] = "4Gi"; },
       "the memory request (4Gi) is above its limit (2Gi)"},
  };
  for (const Bad& c : cases) {
    ClusterValues v;
    c.set(v);
    auto objects = RenderCluster(v, nullptr);
    ASSERT_FALSE(objects.ok()) << c.message;
    EXPECT_NE(objects.status().message().find(c.message), std::string::npos)
        << objects.status().message();
  }
}

TEST(ClusterValuesParse, UnknownKeysAndWrongTypesAreErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"imagee: {tag: x}\n", "imagee: unknown key (did you mean 'image'?)"},
      {"server: {storage: {sise: 1Gi}}\n",
       "server.storage.sise: unknown key (did you mean 'size'?)"},
      {"healthAgent: {enabled: maybe}\n", "healthAgent.enabled: true or false"},
      {"healthAgent: {nodeSelector: {gpu: true}}\n", "healthAgent.nodeSelector.gpu: a string"},
      {"healthAgent: {tolerations: {key: x}}\n", "healthAgent.tolerations: a list"},
      {"image: []\n", "image: a map"},
  };
  for (const auto& [yaml, want] : cases) {
    auto v = ParseClusterValues(yaml);
    ASSERT_FALSE(v.ok()) << yaml;
    EXPECT_NE(v.status().message().find(want), std::string::npos)
        << yaml << " -> " << v.status().message();
  }
}

TEST(ClusterValuesParse, MapsMergeIntoTheDefaultsAsHelmMergesThem) {
  auto v = ParseClusterValues(
      "healthAgent:\n  nodeSelector:\n    nvidia.com/gpu.present: null\n    pool: gpu\n"
      "server:\n  resources:\n    limits:\n      memory: null\n");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->health_agent_node_selector, (std::map<std::string, std::string>{{"pool", "gpu"}}));
  EXPECT_EQ(v->server_resources, json({{"requests", {{"cpu", "500m"}, {"memory", "1Gi"}}}}));
  // The chart installs neither Kueue nor KubeRay: a values file that asks is told so.
  for (const char* key : {"kueue", "kuberay"}) {
    auto deps = ParseClusterValues(std::string(key) + ": {enabled: true}\n");
    ASSERT_FALSE(deps.ok()) << key;
    EXPECT_NE(deps.status().message().find("install it from its own chart first"),
              std::string::npos)
        << deps.status().message();
  }
}

// ---- The chart itself ----

// The chart's values.yaml gives the renderer's defaults.
TEST(HelmChart, ValuesYamlIsTheRenderersDefaults) {
  auto v = ParseClusterValues(ReadAll(SourceDir() / kChart / "values.yaml"));
  ASSERT_TRUE(v.ok()) << v.status().message();
  auto from_file = RenderCluster(*v, nullptr);
  auto defaults = RenderCluster(ClusterValues{}, nullptr);
  ASSERT_TRUE(from_file.ok() && defaults.ok());
  EXPECT_EQ(*from_file, *defaults);
}

TEST(HelmChart, ChartYamlNamesAppVersionAndNoDependencies) {
  auto docs = ParseYaml(ReadAll(SourceDir() / kChart / "Chart.yaml"));
  ASSERT_TRUE(docs.ok()) << docs.status().message();
  const json& chart = docs->at(0);
  EXPECT_EQ(chart["apiVersion"], "v2");
  EXPECT_EQ(chart["name"], "taugrid");
  EXPECT_EQ(chart["appVersion"], kChartAppVersion);
  // None: the chart lints and renders with no network (Kueue and KubeRay have their own charts).
  EXPECT_FALSE(chart.contains("dependencies"));
}

// values.schema.json (draft-07) read by SchemaSet: the subset it uses (type, properties,
// additionalProperties, enum, pattern, minLength, anyOf, items) means the same in both.
Status ValidateValues(const json& values) {
  static const SchemaSet* set = [] {
    auto* s = new SchemaSet();
    json schema = json::parse(ReadAll(SourceDir() / kChart / "values.schema.json"), nullptr, false);
    EXPECT_FALSE(schema.is_discarded()) << "values.schema.json is not JSON";
    EXPECT_EQ(schema.value("$schema", ""), "http://json-schema.org/draft-07/schema#");
    // SchemaSet validates Kubernetes objects: the values go in as the `spec` of one.
    json wrapper = {{"type", "object"},
                    {"properties",
                     {{"apiVersion", {{"type", "string"}}},
                      {"kind", {{"type", "string"}}},
                      {"metadata", {{"type", "object"}}},
                      {"spec", schema}}}};
    Status st = s->AddSchemas({{"kinds", {{"tau.dev/test/Values", wrapper}}}});
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
  }();
  return set->Validate({{"apiVersion", "tau.dev/test"},
                        {"kind", "Values"},
                        {"metadata", {{"name", "values"}}},
                        {"spec", values}});
}

json YamlValues(const std::string& text) {
  auto docs = ParseYaml(text);
  EXPECT_TRUE(docs.ok() && docs->size() == 1) << text;
  return docs.ok() && docs->size() == 1 ? docs->front() : json();
}

TEST(HelmChart, ValuesFilesValidateAgainstTheSchema) {
  for (const auto& path :
       {SourceDir() / kChart / "values.yaml", DataDir() / "cluster/values-custom.yaml"}) {
    Status s = ValidateValues(YamlValues(ReadAll(path)));
    EXPECT_TRUE(s.ok()) << path << ": " << s.message();
  }
}

TEST(HelmChart, SchemaAndParserRefuseTheSameMistakes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"server: {storage: {size: -5Gi}}\n", "size"},
      {"server: {storage: {size: \"0\"}}\n", "size"},
      {"imagee: {tag: x}\n", "imagee"},
      {"image: {pullPolicy: Sometimes}\n", "pullPolicy"},
      {"healthAgent: {pollInterval: soon}\n", "pollInterval"},
      {"healthAgent: {enabled: \"yes\"}\n", "enabled"},
      {"server: {tls: {secretName: \"\"}}\n", "secretName"},
      {"server: {resources: {limits: {memory: lots}}}\n", "memory"},
  };
  for (const auto& [yaml, key] : cases) {
    Status schema = ValidateValues(YamlValues(yaml));
    EXPECT_FALSE(schema.ok()) << "schema accepted " << yaml;
    EXPECT_NE(schema.message().find(key), std::string::npos) << schema.message();
    auto values = ParseClusterValues(yaml);
    Status tau = values.ok() ? RenderCluster(*values, nullptr).status() : values.status();
    EXPECT_FALSE(tau.ok()) << "tau accepted " << yaml;
    EXPECT_NE(tau.message().find(key), std::string::npos) << tau.message();
  }
}

// Without helm: the templates declare the kinds the renderer renders (with every switch on and a
// platform, so every template renders). test_helm_chart.py compares whole objects with helm.
TEST(HelmChart, TemplatesDeclareTheRenderedKinds) {
  std::multiset<std::string> declared;
  static const std::regex kKind("^kind: ([A-Za-z]+)$");
  for (const auto& entry :
       std::filesystem::directory_iterator(SourceDir() / kChart / "templates")) {
    if (entry.path().extension() != ".yaml") continue;
    std::stringstream lines(ReadAll(entry.path()));
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_match(line, m, kKind)) declared.insert(m[1].str());
    }
  }
  ClusterValues values;
  values.platform = "schema_version: 1\n";
  auto objects = RenderCluster(values, nullptr);
  ASSERT_TRUE(objects.ok()) << objects.status().message();
  std::multiset<std::string> rendered;
  for (const json& o : *objects) rendered.insert(o["kind"].get<std::string>());
  EXPECT_EQ(declared, rendered);
}

}  // namespace
}  // namespace tau::kube
