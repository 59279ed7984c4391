// ToJson, ConfigHash and JsonSchema: canonical output, shape independence, and a schema that
// matches the parser (checked both ways, and by validating the valid corpus against it with a small
// validator).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <regex>
#include <set>

#include "common/hash.h"
#include "spec/spec.h"
#include "spec/spec_test_util.h"

namespace tau::spec {
namespace {

using nlohmann::json;
using testing::Manifest;
using testing::MustParse;
using testing::Parse;
using testing::ReadText;
using testing::SpecDataDir;

constexpr const char* kManifestEquivalent = R"(schema_version: 1
name: same
run:
  entrypoint: train.py
  workload_kind: job
  args: [--x, 1]
  max_runtime: 1h
  ttl_seconds_after_finished: 600
compute:
  gpus: 2
  workers: 1
  cpus: 8
  memory: 32Gi
  worker_cpus: 4
  worker_memory: 16Gi
  gpu_resource_mode: full
runtime:
  image: img:1
  pip: [torch]
  env:
    A: "1"
    S: SECRET:k
policy:
  queue: q
  gpu_class: a100-80gb
  node_selector: {a: b, c: d}
storage:
  output: out
  publish: staged
resilience:
  max_retries: 2
  retry_on: [Preempted]
  backoff_initial: 1m
  backoff_max: 10m
metrics:
  history: [m.jsonl]
experiment:
  project: p
)";

// The same run in the direct shape, spelled differently wherever the model allows it.
constexpr const char* kDirectEquivalent = R"(engine: job
name: same
script: ./train.py
image: img:1
run:
  args: ["--x", "1"]
  max_runtime: 60m
  ttl_seconds_after_finished: 600
compute:
  gpus_per_worker: 2
  cpu_request: 8000m
  memory_request: 32768Mi
  worker_cpu_request: "4"
  worker_memory_request: 16Gi
  gpu_resource_mode: full
runtime:
  pip: [torch]
  env:
    S: SECRET:k
    A: 1
policy:
  node_selector: {c: d, a: b}
  gpu_class: a100-80gb
  queue: q
storage: {publish: staged, output: out}
resilience: {retry_on: [Preempted], max_retries: 2, backoff_initial: 60s, backoff_max: 10m}
metrics: {history: [./m.jsonl]}
experiment: {project: p}
)";

TEST(SpecJson, CanonicalFormWithDefaults) {
  json j = ToJson(MustParse(Manifest()));
  EXPECT_EQ(j["shape"], "manifest");
  EXPECT_EQ(j["name"], "demo");
  EXPECT_EQ(j["kind"], "rayjob");
  EXPECT_EQ(j["entrypoint"], "train.py");
  EXPECT_EQ(j["compute"]["workers"], 1);
  EXPECT_EQ(j["compute"]["gpus"], 0);
  EXPECT_TRUE(j["compute"]["cpus"].is_null());
  EXPECT_EQ(j["resilience"]["backoff_initial_ms"], 30000);
  EXPECT_EQ(j["resilience"]["backoff_max_ms"], 300000);
  EXPECT_EQ(j["resilience"]["max_retries"], 0);
  EXPECT_EQ(j["resilience"]["retry_on"],
            json::array({"Preempted", "Evicted", "GPUError", "NodeLost"}));
  EXPECT_TRUE(j["max_runtime_ms"].is_null());
  EXPECT_TRUE(j["recorded_only"].is_object());
  // Keys come out sorted.
  std::string dumped = j.dump();
  EXPECT_LT(dumped.find("\"args\""), dumped.find("\"compute\""));
  EXPECT_LT(dumped.find("\"compute\""), dumped.find("\"entrypoint\""));
}

TEST(SpecJson, QuantitiesAndDurationsAreCanonical) {
  json j = ToJson(MustParse(Manifest(
      "compute:\n  cpus: 1.5\n  memory: 1073741824\n  worker_memory: 2048Mi\nresilience:\n  "
      "backoff_initial: 1m30s\n  max_retry_duration: 2h\n")));
  EXPECT_EQ(j["compute"]["cpus"], "1500m");
  EXPECT_EQ(j["compute"]["memory"], "1Gi");
  EXPECT_EQ(j["compute"]["worker_memory"], "2Gi");
  EXPECT_EQ(j["resilience"]["backoff_initial_ms"], 90000);
  EXPECT_EQ(j["resilience"]["max_retry_duration_ms"], 7200000);
}

TEST(SpecJson, EnvIsKeyedByName) {
  json j = ToJson(MustParse(Manifest("runtime:\n  env:\n    B: x\n    A: SECRET:k\n")));
  EXPECT_EQ(j["runtime"]["env"], json({{"A", {{"secret_ref", "k"}}}, {"B", "x"}}));
}

TEST(SpecHash, ManifestAndDirectShapesHashTheSame) {
  RunSpec manifest = MustParse(kManifestEquivalent);
  RunSpec direct = MustParse(kDirectEquivalent);
  ASSERT_EQ(manifest.shape, Shape::kManifest);
  ASSERT_EQ(direct.shape, Shape::kDirect);
  json a = ToJson(manifest), b = ToJson(direct);
  EXPECT_NE(a, b);
  a.erase("shape");
  b.erase("shape");
  EXPECT_EQ(a, b) << a.dump(2) << "\n" << b.dump(2);
  EXPECT_EQ(ConfigHash(manifest), ConfigHash(direct));
  EXPECT_EQ(ConfigHash(manifest).size(), 64u);
  EXPECT_EQ(ConfigHash(manifest).find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(SpecHash, IsTheHashOfTheCanonicalJsonWithoutShape) {
  // Recorded hashes must stay comparable across tau versions (tau rerun compares them): the hash is
  // exactly sha256 of the compact dump of ToJson without "shape", whichever overload computes it.
  for (const std::string& text :
       {Manifest(), Manifest() + "runtime:\n  env:\n    GREETING: \"h\u00e9llo \\\"w\\\"\"\n",
        Manifest() + "compute:\n  workers: 3\n  gpus: 2\n"}) {
    RunSpec spec = MustParse(text);
    json j = ToJson(spec);
    EXPECT_EQ(ConfigHash(j), ConfigHash(spec));
    j.erase("shape");
    EXPECT_EQ(ConfigHash(spec), Sha256Hex(j.dump())) << text;
  }
}

TEST(SpecHash, ChangesWithTheConfig) {
  std::string base = Manifest();
  std::string hash = ConfigHash(MustParse(base));
  EXPECT_EQ(hash, ConfigHash(MustParse(base)));  // stable
  EXPECT_EQ(hash, ConfigHash(MustParse(base + "# a comment\n")));
  EXPECT_NE(hash, ConfigHash(MustParse(base + "compute:\n  workers: 2\n")));
  EXPECT_NE(hash, ConfigHash(MustParse(base + "runtime:\n  env:\n    A: x\n")));
  EXPECT_NE(hash, ConfigHash(MustParse(base + "profiler:\n  mode: torch\n")));
  // Saying the defaults explicitly changes nothing; an explicit empty retry set does.
  EXPECT_EQ(
      hash,
      ConfigHash(MustParse(
          base + "compute:\n  workers: 1\n  gpus: 0\nresilience:\n  "
                 "retry_on: [Preempted, Evicted, GPUError, NodeLost]\n  backoff_initial: 30s\n")));
  EXPECT_NE(hash, ConfigHash(MustParse(base + "resilience:\n  retry_on: []\n")));
}

TEST(SpecHash, SurvivesInvalidUtf8InACodeBuiltSpec) {
  RunSpec spec;
  spec.name = "bad\xff";
  EXPECT_EQ(ConfigHash(spec).size(), 64u);
}

// ---- JsonSchema
// -----------------------------------------------------------------------------------

// Structural checks on every subschema.
void CheckWellFormed(const json& s, const std::string& where) {
  static const std::set<std::string> kTypes = {"object", "array",   "string", "integer",
                                               "number", "boolean", "null"};
  ASSERT_TRUE(s.is_object()) << where;
  if (s.contains("type")) {
    json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    for (const json& t : types) {
      EXPECT_TRUE(kTypes.count(t.get<std::string>())) << where << ": " << t;
    }
  }
  if (s.contains("properties")) {
    EXPECT_EQ(s.value("type", ""), "object") << where;
    EXPECT_EQ(s["additionalProperties"], false) << where << " must set additionalProperties: false";
    for (const auto& [name, sub] : s["properties"].items())
      CheckWellFormed(sub, where + "." + name);
    if (s.contains("required")) {
      for (const json& r : s["required"]) {
        EXPECT_TRUE(s["properties"].contains(r)) << where << ": " << r;
      }
    }
  }
  if (s.contains("pattern")) {
    EXPECT_NO_THROW(std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript)) << where;
  }
  if (s.contains("enum")) {
    EXPECT_FALSE(s["enum"].empty()) << where;
  }
  if (s.contains("items")) CheckWellFormed(s["items"], where + "[]");
  if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
    CheckWellFormed(s["additionalProperties"], where + ".*");
  }
  if (s.contains("oneOf")) {
    for (const json& sub : s["oneOf"]) CheckWellFormed(sub, where + "|");
  }
}

TEST(SpecSchema, IsWellFormedDraft202012) {
  json schema = JsonSchema();
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  ASSERT_TRUE(schema["oneOf"].is_array());
  ASSERT_EQ(schema["oneOf"].size(), 2u);
  CheckWellFormed(schema, "$");
  const json& manifest = schema["oneOf"][0];
  const json& direct = schema["oneOf"][1];
  EXPECT_EQ(manifest["properties"]["schema_version"]["const"], 1);
  EXPECT_EQ(manifest["required"], json::array({"schema_version", "name", "run"}));
  EXPECT_FALSE(direct["properties"].contains("schema_version"));
  // name, engine and the entrypoint may each be at the top or under run: (allOf of anyOf).
  EXPECT_FALSE(direct.contains("required"));
  ASSERT_EQ(direct["allOf"].size(), 3u);
  EXPECT_EQ(direct["allOf"][0]["anyOf"].size(), 2u);
  EXPECT_EQ(direct["allOf"][2]["anyOf"].size(), 4u);
  EXPECT_EQ(direct["properties"]["engine"]["enum"], json::array({"job", "rayjob", "ray"}));
  EXPECT_EQ(direct["properties"]["run"]["properties"]["engine"]["enum"],
            json::array({"job", "rayjob", "ray"}));
  // runtime.env: a mapping or a list of {name, value}.
  const json& env = manifest["properties"]["runtime"]["properties"]["env"];
  ASSERT_EQ(env["oneOf"].size(), 2u);
  EXPECT_EQ(env["oneOf"][0]["type"], "object");
  EXPECT_EQ(env["oneOf"][1]["type"], "array");
  EXPECT_EQ(env["oneOf"][1]["items"]["required"], json::array({"name", "value"}));
  // gpu_class: the classes, and the deprecated aliases in a branch of their own.
  const json& gpu = direct["properties"]["policy"]["properties"]["gpu_class"];
  ASSERT_EQ(gpu["oneOf"].size(), 2u);
  EXPECT_EQ(gpu["oneOf"][1]["deprecated"], true);
  EXPECT_EQ(direct["properties"]["name"]["maxLength"], 53);
  EXPECT_TRUE(direct["properties"]["name"].contains("pattern"));
  EXPECT_TRUE(direct["properties"]["compute"]["properties"]["cpu_request"].contains("pattern"));
  EXPECT_NO_THROW({ [[maybe_unused]] json reparsed = json::parse(schema.dump()); });
}

// A value of the right type for a leaf schema; validity beyond the type does not matter here.
json SampleFor(const json& s) {
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"][0];
  json type = s.value("type", json("string"));
  std::string t = type.is_array() ? type[0].get<std::string>() : type.get<std::string>();
  if (t == "integer") return s.value("minimum", 1);
  if (t == "boolean") return true;
  if (t == "array") return json::array();
  if (t == "object") return json::object();
  return "x";
}

// Every (path, leaf schema) of a shape; object-list items appear under "name[]".
void Leaves(const json& s, const std::string& pointer,
            std::vector<std::pair<std::string, json>>* out) {
  if (s.contains("properties")) {
    for (const auto& [name, sub] : s["properties"].items()) Leaves(sub, pointer + "/" + name, out);
    return;
  }
  if (s.contains("items") && s["items"].contains("properties")) {
    Leaves(s["items"], pointer + "/0", out);
    return;
  }
  out->emplace_back(pointer, s);
}

// JSON is YAML, so a document built as JSON can be handed to the parser as is.
void ExpectEveryPropertyAccepted(const json& shape, const json& base) {
  std::vector<std::pair<std::string, json>> leaves;
  Leaves(shape, "", &leaves);
  EXPECT_GT(leaves.size(), 20u);
  for (const auto& [pointer, leaf] : leaves) {
    json doc = base;
    json::json_pointer ptr(pointer);
    if (doc.contains(ptr)) continue;
    doc[ptr] = SampleFor(leaf);
    ParseOutcome outcome = ParseSpec(doc.dump(), "schema.yaml");
    EXPECT_EQ(outcome.ErrorText().find("unknown field"), std::string::npos)
        << pointer << " is in the schema but the parser rejects it:\n"
        << outcome.ErrorText();
  }
}

TEST(SpecSchema, EverySchemaPropertyIsAcceptedByTheParser) {
  json schema = JsonSchema();
  ExpectEveryPropertyAccepted(
      schema["oneOf"][0],
      {{"schema_version", 1}, {"name", "demo"}, {"run", {{"entrypoint", "a.py"}}}});
  ExpectEveryPropertyAccepted(schema["oneOf"][1],
                              {{"name", "demo"}, {"engine", "job"}, {"entrypoint", "a.py"}});
}

TEST(SpecSchema, ParserFieldsAppearInTheSchema) {
  json schema = JsonSchema();
  const json& manifest = schema["oneOf"][0];
  const json& direct = schema["oneOf"][1];
  for (const char* p :
       {"/properties/compute/properties/workers", "/properties/compute/properties/worker_memory",
        "/properties/run/properties/workload_kind", "/properties/run/properties/smoke_pairs",
        "/properties/runtime/properties/env", "/properties/policy/properties/node_selector",
        "/properties/resilience/properties/retry_on",
        "/properties/resource_naming/properties/prefix", "/properties/profiler/properties/warmup",
        "/properties/workflow/properties/secret_payload",
        "/properties/artifacts/properties/checkpoint", "/properties/eval"}) {
    EXPECT_TRUE(manifest.contains(json::json_pointer(p))) << p;
  }
  for (const char* p :
       {"/properties/script", "/properties/image", "/properties/compute/properties/gpus_per_worker",
        "/properties/compute/properties/head_memory_limit", "/properties/run/properties/source",
        "/properties/runtime/properties/security/properties/mode",
        "/properties/storage/properties/image_assets/items/properties/mount_path",
        "/properties/metrics/properties/offload/properties/enabled",
        "/properties/experiment/properties/group"}) {
    EXPECT_TRUE(direct.contains(json::json_pointer(p))) << p;
  }
  EXPECT_FALSE(manifest.contains(json::json_pointer("/properties/compute/properties/worker")));
  EXPECT_EQ(manifest["properties"]["resilience"]["properties"]["retry_on"]["items"]["enum"],
            json::array({"UserError", "OOMKilled", "Preempted", "Evicted", "GPUError", "NodeLost",
                         "Timeout", "SetupError", "LivenessFailed", "Idle", "Stalled"}));
}

// ---- a small validator for the keywords JsonSchema() uses
// -----------------------------------------

bool TypeMatches(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  return v.is_null();
}

bool Validate(const json& v, const json& s) {
  if (s.contains("type")) {
    json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool any = false;
    for (const json& t : types) any = any || TypeMatches(v, t.get<std::string>());
    if (!any) return false;
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) {
    return false;
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    if (s.contains("pattern") &&
        !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) {
      return false;
    }
    if (s.contains("minLength") && str.size() < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && str.size() > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_number()) {
    if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && v.get<double>() <= s["exclusiveMinimum"].get<double>()) {
      return false;
    }
  }
  if (v.is_array() && s.contains("items")) {
    for (const json& item : v) {
      if (!Validate(item, s["items"])) return false;
    }
  }
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      if (s.contains("propertyNames") && !Validate(key, s["propertyNames"])) return false;
      if (s.contains("properties") && s["properties"].contains(key)) {
        if (!Validate(value, s["properties"][key])) return false;
      } else if (s.contains("additionalProperties")) {
        if (s["additionalProperties"] == false) return false;
        if (s["additionalProperties"].is_object() && !Validate(value, s["additionalProperties"])) {
          return false;
        }
      }
    }
    if (s.contains("required")) {
      for (const json& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) return false;
      }
    }
  }
  if (s.contains("allOf")) {
    for (const json& sub : s["allOf"]) {
      if (!Validate(v, sub)) return false;
    }
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const json& sub : s["anyOf"]) any = any || Validate(v, sub);
    if (!any) return false;
  }
  if (s.contains("oneOf")) {
    int matches = 0;
    for (const json& sub : s["oneOf"]) matches += Validate(v, sub) ? 1 : 0;
    if (matches != 1) return false;
  }
  return true;
}

// YAML -> JSON with YAML 1.2 core-schema scalars (quoted scalars stay strings).
json YamlToJson(const YAML::Node& node) {
  if (node.IsMap()) {
    json out = json::object();
    for (const auto& entry : node) {
      YAML::Node key = entry.first;
      out[key.Scalar()] = YamlToJson(entry.second);
    }
    return out;
  }
  if (node.IsSequence()) {
    json out = json::array();
    for (const auto& element : node) out.push_back(YamlToJson(element));
    return out;
  }
  if (node.IsNull()) return nullptr;
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;
  if (s == "true" || s == "false") return s == "true";
  if (std::regex_match(s, std::regex("[-+]?[0-9]+"))) return std::stoll(s);
  if (std::regex_match(s, std::regex("[-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?"))) {
    return std::stod(s);
  }
  return s;
}

TEST(SpecSchema, ValidCorpusValidatesAgainstTheSchema) {
  json schema = JsonSchema();
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SpecDataDir() / "valid")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    json doc = YamlToJson(YAML::Load(ReadText(entry.path())));
    EXPECT_TRUE(Validate(doc, schema)) << entry.path() << "\n" << doc.dump(2);
  }
  EXPECT_GE(files, 8);
  // And the validator is not vacuous.
  EXPECT_FALSE(Validate(json{{"name", "a"}, {"engine", "job"}}, schema));  // no entrypoint
  EXPECT_FALSE(
      Validate(json{{"name", "a"}, {"engine", "job"}, {"entrypoint", "a"}, {"x", 1}}, schema));
  EXPECT_FALSE(Validate(
      json{{"schema_version", 1}, {"name", "a"}, {"run", {{"entrypoint", "a"}}}, {"engine", "job"}},
      schema));
  EXPECT_FALSE(Validate(json{{"schema_version", 1},
                             {"name", "a"},
                             {"run", {{"entrypoint", "a"}}},
                             {"compute", {{"memory", "64GB"}}}},
                        schema));
  EXPECT_TRUE(
      Validate(json{{"schema_version", 1}, {"name", "a"}, {"run", {{"entrypoint", "a"}}}}, schema));
  EXPECT_TRUE(
      Validate(json{{"run", {{"name", "a"}, {"engine", "ray"}, {"script", "a.py"}}}}, schema));
  EXPECT_FALSE(Validate(json{{"run", {{"name", "a"}, {"script", "a.py"}}}}, schema));  // no engine
  EXPECT_TRUE(Validate(json{{"schema_version", 1},
                            {"name", "a"},
                            {"run", {{"entrypoint", "a"}}},
                            {"runtime", {{"env", json::array({{{"name", "A"}, {"value", "1"}}})}}}},
                       schema));
  EXPECT_FALSE(Validate(json{{"schema_version", 1},
                             {"name", "a"},
                             {"run", {{"entrypoint", "a"}}},
                             {"runtime", {{"env", json::array({{{"name", "A"}}})}}}},
                        schema));
}

}  // namespace
}  // namespace tau::spec
