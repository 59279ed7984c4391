// The schema validator (strict about unknown fields, types, enums, quantities, labels), the
// hand-written built-in schemas checked against the pod schema the RayJob CRD embeds, and the YAML
// writer's quoting.
#include <gtest/gtest.h>

#include "common/strings.h"
#include "kube/kube.h"
#include "kube/kube_test_util.h"

namespace tau::kube {
namespace {

using nlohmann::json;
using testing::DataDir;
using testing::ReadAll;
using testing::Schemas;

json SmallJob() {
  return json::parse(R"({
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "j", "namespace": "ns", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
    "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
      "containers": [{"name": "main", "image": "python:3.12",
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}}
  })");
}

std::string Errors(const json& object) {
  Status s = Schemas().Validate(object);
  return s.ok() ? "" : s.message();
}

TEST(Schema, AcceptsAValidJob) { EXPECT_EQ(Errors(SmallJob()), ""); }

TEST(Schema, UnknownFieldFailsWithAHint) {
  json j = SmallJob();
  j["spec"]["template"]["spec"]["containers"][0]["resurces"] = json::object();
  EXPECT_NE(Errors(j).find("Job/j: spec.template.spec.containers[0].resurces: unknown field (did "
                           "you mean 'resources'?)"),
            std::string::npos)
      << Errors(j);
}

TEST(Schema, TypesEnumsRequiredAndQuantities) {
  json j = SmallJob();
  j["spec"]["parallelism"] = "2";
  j["spec"]["template"]["spec"]["restartPolicy"] = "Sometimes";
  j["spec"]["template"]["spec"]["containers"][0].erase("name");
  j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "64GB";
  std::string e = Errors(j);
  EXPECT_NE(e.find("spec.parallelism: expected an integer, got string"), std::string::npos) << e;
  EXPECT_NE(e.find("restartPolicy: \"Sometimes\" is not one of: Always, OnFailure, Never"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("containers[0]: missing required field 'name'"), std::string::npos) << e;
  EXPECT_NE(e.find("requests.memory: '64GB' does not match the pattern"), std::string::npos) << e;
}

TEST(Schema, LabelsAreKubernetesLabels) {
  json j = SmallJob();
  j["metadata"]["labels"]["tau.dev/config-hash"] = std::string(64, 'a');
  j["metadata"]["labels"]["bad key!"] = "x";
  std::string e = Errors(j);
  EXPECT_NE(e.find("is not a valid label value"), std::string::npos) << e;
  EXPECT_NE(e.find("'bad key!' is not a valid label key"), std::string::npos) << e;
}

TEST(Schema, CrdsAreStrictToo) {
  json rj = {{"apiVersion", "ray.io/v1"},
             {"kind", "RayJob"},
             {"metadata", {{"name", "r"}}},
             {"spec", {{"entrypoint", "python3 x.py"}, {"shutdownAfterJobFinish", true}}}};
  EXPECT_NE(Errors(rj).find("spec.shutdownAfterJobFinish: unknown field (did you mean "
                            "'shutdownAfterJobFinishes'?)"),
            std::string::npos)
      << Errors(rj);
  json cq = {{"apiVersion", "kueue.x-k8s.io/v1beta2"},
             {"kind", "ClusterQueue"},
             {"metadata", {{"name", "q"}}},
             {"spec", {{"queueingStrategy", "FIFO"}, {"cohort", "lab"}}}};
  std::string e = Errors(cq);
  EXPECT_NE(e.find("spec.queueingStrategy: \"FIFO\" is not one of"), std::string::npos) << e;
  // v1beta2 renamed `cohort` to `cohortName`; v1beta1 still has `cohort`.
  EXPECT_NE(e.find("spec.cohort: unknown field"), std::string::npos) << e;
  cq["apiVersion"] = "kueue.x-k8s.io/v1beta1";
  cq["spec"]["queueingStrategy"] = "StrictFIFO";
  EXPECT_EQ(Errors(cq), "");
}

TEST(Schema, RayJobChecksItsEmbeddedPods) {
  json rj = json::parse(R"({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r"},
    "spec": {"rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [
      {"name": "h", "image": "ray", "volumeMount": []}]}}}}}})");
  EXPECT_NE(Errors(rj).find("volumeMount: unknown field (did you mean 'volumeMounts'?)"),
            std::string::npos)
      << Errors(rj);
}

TEST(Schema, UnknownKind) {
  json o = {{"apiVersion", "example.com/v1"}, {"kind", "Widget"}, {"metadata", {{"name", "w"}}}};
  EXPECT_NE(Errors(o).find("no schema for example.com/v1 Widget"), std::string::npos);
  EXPECT_FALSE(Schemas().Knows(o));
}

// kubernetes-core.json is written by hand; every pod field it defines must exist, with the same
// type, in the PodSpec that the RayJob CRD embeds (generated from Kubernetes' own Go types).
void CompareWithCrd(const json& mine, const json& theirs, const json& defs, const std::string& path,
                    int depth, std::vector<std::string>& errors) {
  const json* m = &mine;
  if (m->contains("$ref")) {
    std::string ref = (*m)["$ref"].get<std::string>();
    m = &defs.at(ref.substr(std::string("#/definitions/").size()));
  }
  if (depth > 12 || m->value("x-kubernetes-preserve-unknown-fields", false)) return;
  if (m->contains("type") && theirs.contains("type") && (*m)["type"] != theirs["type"]) {
    errors.push_back(path + ": type " + (*m)["type"].dump() + " vs " + theirs["type"].dump());
  }
  if (m->value("x-kubernetes-int-or-string", false) !=
      theirs.value("x-kubernetes-int-or-string", false)) {
    errors.push_back(path + ": int-or-string differs");
  }
  if (m->contains("properties")) {
    for (const auto& [k, v] : (*m)["properties"].items()) {
      if (!theirs.contains("properties") || !theirs["properties"].contains(k)) {
        errors.push_back(path + "." + k + ": not a field of the Kubernetes type");
        continue;
      }
      CompareWithCrd(v, theirs["properties"][k], defs, path + "." + k, depth + 1, errors);
    }
  }
  if (m->contains("items") && theirs.contains("items")) {
    CompareWithCrd((*m)["items"], theirs["items"], defs, path + "[]", depth + 1, errors);
  }
  if (m->contains("additionalProperties") && (*m)["additionalProperties"].is_object() &&
      theirs.contains("additionalProperties") && theirs["additionalProperties"].is_object()) {
    CompareWithCrd((*m)["additionalProperties"], theirs["additionalProperties"], defs, path + "{}",
                   depth + 1, errors);
  }
}

TEST(Schema, HandWrittenPodSchemaAgreesWithKubernetesTypes) {
  json core = json::parse(ReadAll(DataDir() / "schemas/kubernetes-core.json"));
  auto crd = ParseYaml(ReadAll(DataDir() / "schemas/ray.io_rayjobs.yaml"));
  ASSERT_TRUE(crd.ok()) << crd.status().message();
  const json* v1 = nullptr;
  for (const json& v : (*crd)[0]["spec"]["versions"]) {
    if (v["name"] == "v1") v1 = &v;
  }
  ASSERT_NE(v1, nullptr);
  const json& template_schema =
      (*v1)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rayClusterSpec"]
           ["properties"]["headGroupSpec"]["properties"]["template"];
  std::vector<std::string> errors;
  CompareWithCrd(core["definitions"]["PodTemplateSpec"], template_schema, core["definitions"],
                 "PodTemplateSpec", 0, errors);
  EXPECT_TRUE(errors.empty()) << tau::Join(errors, "\n");
  // The Job's template is that PodTemplateSpec.
  EXPECT_EQ(core["kinds"]["batch/v1/Job"]["properties"]["spec"]["properties"]["template"]["$ref"],
            "#/definitions/PodTemplateSpec");
}

// ---------------------------------------------------------------------------------------------
// YAML out and back in.

TEST(Yaml, QuotesWhatYaml11ReadersWouldMisread) {
  json o = {{"a", "yes"},      {"b", "1e3"},  {"c", "0x1f"},  {"d", "64Gi"},
            {"e", "500m"},     {"f", "2"},    {"g", "x: y"},  {"h", ""},
            {"i", "#c"},       {"j", "-1"},   {"k", "on"},    {"l", "2024-01-01"},
            {"m", "1:20"},     {"n", "null"}, {"o", "~"},     {"p", "plain words"},
            {"q", "a #b"},     {"r", "NO"},   {"s", "1_000"}, {"t", "nvidia.com/gpu"},
            {"u", " leading"}, {"v", "0o17"}, {"w", 3},       {"x", true},
            {"y", nullptr},    {"z", 1.5}};
  std::string y = ToYaml(o);
  for (const char* quoted : {"a: \"yes\"", "b: \"1e3\"", "c: \"0x1f\"", "f: \"2\"", "h: \"\"",
                             "k: \"on\"", "l: \"2024-01-01\"", "m: \"1:20\"", "r: \"NO\"",
                             "s: \"1_000\"", "v: \"0o17\"", "u: \" leading\""}) {
    EXPECT_NE(y.find(std::string(quoted) + "\n"), std::string::npos) << quoted << "\n" << y;
  }
  for (const char* plain : {"d: 64Gi", "e: 500m", "p: plain words", "t: nvidia.com/gpu", "w: 3",
                            "x: true", "\"y\": null", "z: 1.5"}) {
    EXPECT_NE(y.find(std::string(plain) + "\n"), std::string::npos) << plain << "\n" << y;
  }
  auto back = ParseYaml(y);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->front(), o);
}

TEST(Yaml, MultiLineTextAndNestingRoundTrip) {
  json o = {
      {"apiVersion", "v1"},
      {"kind", "X"},
      {"metadata", {{"name", "x1"}}},
      {"text", "line one\nline two\n"},
      {"no_newline", "a\nb"},
      {"kept", "a\n\n\n"},
      {"indented", "  two spaces\nnone\n"},
      {"blank_first", "\n  then indented\n"},
      {"cr", "a\r\nb"},
      {"tab", "a\tb\nc"},
      {"unicode", "héllo wörld\n"},
      {"list", {1, "two", {{"k", "v"}, {"k2", {"x", "y"}}}, json::array(), json::object()}},
      {"nested", {{"a", {{"b", {{"c", json::array({json::array({1, 2}), json::array()})}}}}}}}};
  std::string y = ToYaml(std::vector<json>{o, o});
  // apiVersion, kind and metadata lead.
  EXPECT_EQ(y.rfind("apiVersion: v1\nkind: X\nmetadata:\n  name: x1\n", 0), 0u) << y;
  auto back = ParseYaml(y);
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << y;
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0], o) << y;
  EXPECT_EQ((*back)[1], o);
}

TEST(Yaml, ParseErrorsAreStatuses) {
  auto r = ParseYaml("a: [1, 2\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("YAML error at line"), std::string::npos);
}

}  // namespace
}  // namespace tau::kube
