// --set overrides: typed by the field trees, refused at the flag, applied before every check.
#include <gtest/gtest.h>

#include <map>

#include "spec/set_fields.h"
#include "spec/spec.h"
#include "spec/spec_test_util.h"

namespace tau::spec {
namespace {

using testing::Direct;
using testing::Manifest;

std::vector<Override> Set(const std::vector<std::string>& texts) {
  auto parsed = ParseOverrides(texts);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  return parsed.ok() ? *parsed : std::vector<Override>();
}

ParseOutcome ParseWith(const std::string& text, const std::vector<std::string>& set) {
  return ParseSpec(text, "tau.yaml", Set(set));
}

RunSpec MustParseWith(const std::string& text, const std::vector<std::string>& set) {
  ParseOutcome out = ParseWith(text, set);
  EXPECT_TRUE(out.ok()) << out.ErrorText();
  return out.ok() ? *out.spec : RunSpec{};
}

std::string ErrorsWith(const std::string& text, const std::vector<std::string>& set) {
  ParseOutcome out = ParseWith(text, set);
  EXPECT_FALSE(out.ok()) << "expected an error";
  return out.ErrorText();
}

TEST(SpecOverrides, AnIntegerFieldGetsAnInteger) {
  RunSpec spec = MustParseWith(Manifest("compute:\n  gpus: 1\n"), {"compute.gpus=2"});
  EXPECT_EQ(spec.compute.gpus, 2);
  ASSERT_EQ(spec.overrides.size(), 1u);
  EXPECT_EQ(spec.overrides[0].Text(), "compute.gpus=2");
  // The canonical JSON shows the value set and the override; the hash is of the settings, the
  // same as a file that says gpus: 2.
  nlohmann::json j = ToJson(spec);
  EXPECT_EQ(j["compute"]["gpus"], 2);
  EXPECT_EQ(j["overrides"], nlohmann::json::parse(R"([{"path":"compute.gpus","value":"2"}])"));
  RunSpec file = testing::MustParse(Manifest("compute:\n  gpus: 2\n"));
  EXPECT_EQ(ConfigHash(spec), ConfigHash(file));
  EXPECT_NE(ConfigHash(spec), ConfigHash(testing::MustParse(Manifest("compute:\n  gpus: 1\n"))));
  EXPECT_EQ(RecordedOverrides(j).size(), 1u);
  EXPECT_EQ(RecordedOverrides(j)[0].Text(), "compute.gpus=2");
  EXPECT_TRUE(RecordedOverrides(ToJson(file)).empty());
  EXPECT_FALSE(ToJson(file).contains("overrides"));
}

TEST(SpecOverrides, AWrongTypeIsRefusedAtTheFlag) {
  EXPECT_EQ(ErrorsWith(Manifest(), {"compute.gpus=two"}),
            "--set compute.gpus=two: error: compute.gpus: expected an integer, got a string "
            "('two')");
  EXPECT_EQ(ErrorsWith(Manifest(), {"compute.gpus=1000"}),
            "--set compute.gpus=1000: error: compute.gpus: 1000 is out of range (0..64)");
  EXPECT_EQ(ErrorsWith(Manifest(), {"compute.gpus="}),
            "--set compute.gpus=: error: compute.gpus: expected an integer, got null");
  EXPECT_EQ(ErrorsWith(Manifest(), {"execution.allow_nccl_override=yes"}),
            "--set execution.allow_nccl_override=yes: error: execution.allow_nccl_override: "
            "expected a boolean (true or false), got a string ('yes')");
  EXPECT_EQ(ErrorsWith(Manifest(), {"compute.memory=512m"}),
            "--set compute.memory=512m: error: compute.memory: '512m' is a fraction of a byte (did "
            "you mean '512Mi'?)");
  EXPECT_EQ(ErrorsWith(Manifest(), {"policy.priority_tier=urgent"}),
            "--set policy.priority_tier=urgent: error: policy.priority_tier: unknown value "
            "'urgent'; allowed: default, priority");
}

TEST(SpecOverrides, TextFieldsTakeTheTextAsTyped) {
  RunSpec spec = MustParseWith(
      Manifest(), {"experiment.name=2024", "run.max_runtime=90m", "compute.cpus=2", "name=123"});
  EXPECT_EQ(spec.experiment.name, "2024");
  EXPECT_EQ(spec.max_runtime_ms, 90 * 60 * 1000);
  EXPECT_EQ(spec.compute.cpus->ToString(), "2");
  EXPECT_EQ(spec.name, "123");
  // A string field still gets its checks.
  EXPECT_EQ(
      ErrorsWith(Manifest(), {"name=Not_A_Label"}).rfind("--set name=Not_A_Label: error: ", 0), 0u);
}

TEST(SpecOverrides, AnUnknownPathIsRefusedWithWhatIsThere) {
  std::string e = ErrorsWith(Manifest(), {"compute.gpu=1"});
  EXPECT_EQ(e.rfind("--set compute.gpu=1: error: compute.gpu: unknown field 'gpu' in 'compute' of "
                    "the manifest shape (did you mean 'gpus'?); its fields: gpus, workers, ",
                    0),
            0u)
      << e;
  e = ErrorsWith(Direct(), {"compute.cpus=2"});
  EXPECT_NE(
      e.find("--set compute.cpus=2: error: compute.cpus: unknown field 'cpus' in 'compute' of "
             "the direct shape"),
      std::string::npos)
      << e;
  e = ErrorsWith(Manifest(), {"computer.gpus=1"});
  EXPECT_NE(e.find("unknown field 'computer' in the top level of the manifest shape (did you mean "
                   "'compute'?)"),
            std::string::npos)
      << e;
  // A section is set field by field; nothing is below a value.
  e = ErrorsWith(Manifest(), {"compute=3"});
  EXPECT_NE(e.find("--set compute=3: error: compute is a section: set its fields one at a time, "
                   "such as --set compute.gpus=VALUE; its fields: gpus, workers"),
            std::string::npos)
      << e;
  EXPECT_EQ(ErrorsWith(Manifest(), {"compute.gpus.x=1"}),
            "--set compute.gpus.x=1: error: compute.gpus is an integer: nothing is below it (did "
            "you mean --set compute.gpus=...?)");
  EXPECT_EQ(ErrorsWith(Manifest(), {"compute.gpus[0]=1"}),
            "--set compute.gpus[0]=1: error: compute.gpus is an integer, not a list: it has no "
            "items to index");
}

TEST(SpecOverrides, EnvEntriesInEitherForm) {
  RunSpec spec = MustParseWith(Manifest("runtime:\n  env:\n    LR: '0.1'\n    A: b\n"),
                               {"runtime.env.LR=0.01", "runtime.env.NEW=x=y"});
  ASSERT_EQ(spec.runtime.env.size(), 3u);
  EXPECT_EQ(spec.runtime.env[0].name, "LR");
  EXPECT_EQ(spec.runtime.env[0].value, "0.01");  // text, as typed, in the file's place
  EXPECT_EQ(spec.runtime.env[1].value, "b");
  EXPECT_EQ(spec.runtime.env[2].name, "NEW");
  EXPECT_EQ(spec.runtime.env[2].value, "x=y");
  // No env in the file: the section and the field are made.
  spec = MustParseWith(Manifest(), {"runtime.env.LR=0.01"});
  ASSERT_EQ(spec.runtime.env.size(), 1u);
  EXPECT_EQ(spec.runtime.env[0].value, "0.01");
  // The list form of the direct shape: the item named so, or a new one.
  spec = MustParseWith(Direct("runtime:\n  env:\n    - name: LR\n      value: '0.1'\n"),
                       {"runtime.env.LR=0.5", "runtime.env.B=2"});
  ASSERT_EQ(spec.runtime.env.size(), 2u);
  EXPECT_EQ(spec.runtime.env[0].value, "0.5");
  EXPECT_EQ(spec.runtime.env[1].name, "B");
  // An env value is checked as a file's is: reserved names, secret references.
  std::string e = ErrorsWith(Manifest(), {"runtime.env.TAU_RUN_NAME=x"});
  EXPECT_EQ(e.rfind("--set runtime.env.TAU_RUN_NAME=x: error: ", 0), 0u) << e;
  spec = MustParseWith(Manifest(), {"runtime.env.TOKEN=SECRET:hf-token"});
  EXPECT_TRUE(spec.runtime.env[0].secret_ref);
  e = ErrorsWith(Manifest(), {"runtime.env.bad-name=1"});
  EXPECT_EQ(e.rfind("--set runtime.env.bad-name=1: error: ", 0), 0u) << e;
}

TEST(SpecOverrides, EveryFormAHintSuggestsIsAccepted) {
  // A section's hint names a field that takes one value, even where the section's first field is
  // a section itself.
  for (const char* section : {"compute", "policy", "resilience", "runtime", "storage"}) {
    const std::string e = ErrorsWith(Manifest(), {std::string(section) + "=1"});
    const size_t at = e.find("such as --set ");
    ASSERT_NE(at, std::string::npos) << e;
    const std::string path = e.substr(at + 14, e.find("=VALUE", at) - at - 14);
    const std::string got = ParseWith(Manifest(), {path + "=1"}).ErrorText();
    EXPECT_EQ(got.find("is a section"), std::string::npos) << section << ": " << got;
    EXPECT_EQ(got.find("is a list"), std::string::npos) << section << ": " << got;
    EXPECT_EQ(got.find("is a mapping"), std::string::npos) << section << ": " << got;
  }
  // The list and mapping forms, as the shell passes them once their quotes are gone.
  EXPECT_EQ(MustParseWith(Manifest(), {"run.args=[a, b]"}).args,
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(MustParseWith(Manifest(), {"runtime.env={KEY: value}"}).runtime.env.size(), 1u);
}

TEST(SpecOverrides, ListsWholeOrByItem) {
  RunSpec spec = MustParseWith(Manifest(), {"run.args=[--lr, 0.1, --epochs, 3]"});
  EXPECT_EQ(spec.args, (std::vector<std::string>{"--lr", "0.1", "--epochs", "3"}));
  spec = MustParseWith(Manifest().replace(Manifest().find("  entrypoint"), 0, "  args: [a, b]\n"),
                       {"run.args[1]=c"});
  EXPECT_EQ(spec.args, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(ErrorsWith(Manifest(), {"run.args=--lr"}),
            "--set run.args=--lr: error: run.args is a list: write the whole list as --set "
            "'run.args=[a, b]', or one item as run.args[0]=a");
  EXPECT_EQ(ErrorsWith(Manifest(), {"run.args[0]=x"}),
            "--set run.args[0]=x: error: run.args[0]: run.args has no items; --set replaces an "
            "item that is there, or the whole list (--set 'run.args=[a, b]')");
  std::string e = ErrorsWith(Manifest(), {"run.args=[a, [b]]"});
  EXPECT_EQ(e.rfind("--set run.args=[a, [b]]: error: run.args[1]: expected a string", 0), 0u) << e;
  e = ErrorsWith(Manifest(), {"run.args=[a, b"});
  EXPECT_EQ(e.rfind("--set run.args=[a, b: error: run.args: the value is not YAML", 0), 0u) << e;
  // A list of mappings: an item's field.
  std::string assets = Manifest(
      "storage:\n  image_assets:\n    - name: w\n      image: old\n      mount_path: /w\n");
  spec = MustParseWith(assets, {"storage.image_assets[0].image=new"});
  ASSERT_EQ(spec.storage.image_assets.size(), 1u);
  EXPECT_EQ(spec.storage.image_assets[0].image, "new");
  e = ErrorsWith(assets, {"storage.image_assets[0].mount_path=relative"});
  EXPECT_EQ(e,
            "--set storage.image_assets[0].mount_path=relative: error: "
            "storage.image_assets[0].mount_path: must be an absolute path");
}

TEST(SpecOverrides, MapKeysAndFreeFormValues) {
  RunSpec spec = MustParseWith(Manifest(), {"policy.node_selector.kubernetes.io/arch=amd64"});
  EXPECT_EQ(spec.policy.node_selector.at("kubernetes.io/arch"), "amd64");
  spec = MustParseWith(
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\n  "
      "workload_kind: job\n",
      {"execution.configs.max_restarts=3", "execution.configs.log_dir=/tmp/x"});
  EXPECT_EQ(spec.execution.configs["max_restarts"], 3);
  EXPECT_EQ(spec.execution.configs["log_dir"], "/tmp/x");
}

TEST(SpecOverrides, AnAliasKeepsTheFilesValue) {
  // The document is rebuilt along the path, never changed in place: an anchor's other aliases
  // keep what the file says.
  RunSpec spec = MustParseWith(
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: &e train.py\n  args: [*e]\n",
      {"run.entrypoint=other.py"});
  EXPECT_EQ(spec.entrypoint, "other.py");
  EXPECT_EQ(spec.args, (std::vector<std::string>{"train.py"}));
}

TEST(SpecOverrides, ChecksAcrossFieldsNameTheFlag) {
  std::string e =
      ErrorsWith(Manifest("compute:\n  cpus: 2\n  memory: 1Gi\n"), {"compute.cpu_limit=1"});
  EXPECT_EQ(e,
            "--set compute.cpu_limit=1: error: compute.cpu_limit (1) is below the CPU request (2)");
  // And where the file disagrees with a --set of the same setting, the --set is the later.
  e = ErrorsWith(Direct("compute:\n  gpus_per_worker: 1\n"), {"compute.gpus=2"});
  EXPECT_EQ(e.rfind("--set compute.gpus=2: error: compute.gpus (2) and compute.gpus_per_worker (1) "
                    "disagree",
                    0),
            0u)
      << e;
}

TEST(SpecOverrides, PositionsSayTheFlag) {
  ParseOutcome out = ParseWith(Manifest("compute:\n  gpus: 1\n"), {"compute.gpus=4"});
  ASSERT_TRUE(out.ok()) << out.ErrorText();
  ASSERT_TRUE(out.positions.count("compute.gpus"));
  EXPECT_EQ(out.positions["compute.gpus"].origin, "--set compute.gpus=4");
  EXPECT_EQ(out.positions["compute.gpus"].line, 0);
  EXPECT_TRUE(out.positions["run.entrypoint"].origin.empty());
  EXPECT_EQ(LocateFieldErrors("compute.gpus: 4 GPUs per worker, but the queue has 1\n"
                              "run.entrypoint: not found",
                              "tau.yaml", out.positions),
            "--set compute.gpus=4: error: compute.gpus: 4 GPUs per worker, but the queue has 1\n"
            "tau.yaml:4:3: error: run.entrypoint: not found");
}

TEST(SpecOverrides, TheFlagsTextIsChecked) {
  for (const char* bad : {"gpus", "=2", ".gpus=1", "compute..gpus=1", "compute.=1"}) {
    auto parsed = ParseOverrides({bad});
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().message().rfind("--set ", 0), 0u) << parsed.status().message();
  }
  auto twice = ParseOverrides({"compute.gpus=1", "compute.gpus=2"});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(),
            "--set compute.gpus=2: compute.gpus is set twice; give each path once");
  // The value may hold '='.
  auto eq = ParseOverrides({"runtime.env.A=b=c"});
  ASSERT_TRUE(eq.ok());
  EXPECT_EQ((*eq)[0].value, "b=c");
}

TEST(SpecOverrides, MergeReplacesByPath) {
  std::vector<Override> merged = MergeOverrides(Set({"compute.gpus=1", "runtime.env.LR=0.1"}),
                                                Set({"runtime.env.LR=0.2", "compute.workers=2"}));
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].Text(), "compute.gpus=1");
  EXPECT_EQ(merged[1].Text(), "runtime.env.LR=0.2");
  EXPECT_EQ(merged[2].Text(), "compute.workers=2");
  EXPECT_EQ(CanonicalField("compute.gpus_per_worker"), "compute.gpus");
  EXPECT_EQ(CanonicalField("runtime.env.LR"), "runtime.env.LR");
}

// Every field SetFields names is one --set takes: setting each to the value it reports parses,
// and gives the same spec.
TEST(SetFieldsTest, NamesEachFieldAsSetTakesItWithTheOverridesApplied) {
  const std::string text =
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: main.sh\n  args: ['1', 'x y']\n"
      "compute:\n  gpus: 0\n  cpus: 100m\nruntime:\n  env:\n    LR: '0.1'\n"
      "storage:\n  image_assets:\n    - name: data\n      image: busybox\n"
      "      source_path: /d\n      mount_path: /mnt/d\n";
  std::vector<Override> set = Set({"run.args=[5]", "runtime.env.SEED=7"});
  auto fields = SetFields(text, set);
  std::map<std::string, std::string> got(fields.begin(), fields.end());
  EXPECT_EQ(got.size(), fields.size());
  EXPECT_EQ(got["run.args"], "[5]");
  EXPECT_EQ(got["runtime.env.LR"], "0.1");
  EXPECT_EQ(got["runtime.env.SEED"], "7");
  EXPECT_EQ(got["compute.cpus"], "100m");
  EXPECT_EQ(got["storage.image_assets[0].image"], "busybox");
  EXPECT_EQ(got.count("run.args[0]"), 0u);
  const RunSpec want = MustParseWith(text, {"run.args=[5]", "runtime.env.SEED=7"});
  std::vector<std::string> again;
  for (const auto& [path, value] : fields) again.push_back(path + "=" + value);
  const RunSpec same = MustParseWith(text, again);
  nlohmann::json a = ToJson(same), b = ToJson(want);
  a.erase("overrides");
  b.erase("overrides");
  EXPECT_EQ(a.dump(), b.dump());
  // Unquoted, the file's list keeps its items apart ('x y' is one of them).
  EXPECT_EQ(SetFields(text, {})[3].second, "[1, x y]");
  EXPECT_TRUE(SetFields("not: [a spec", {}).empty());
}

}  // namespace
}  // namespace tau::spec
