// Per-field checks: entrypoint paths, names, env, pip, args, compute, policy, storage, metrics,
// resilience.
#include <gtest/gtest.h>

#include "spec/spec.h"
#include "spec/spec_test_util.h"

namespace tau::spec {
namespace {

using testing::Direct;
using testing::Errors;
using testing::Manifest;
using testing::MustParse;

Quantity Q(std::string_view text) { return *Quantity::Parse(text); }

TEST(SpecEntrypoint, Normalisation) {
  auto entry = [](std::string_view e) {
    return MustParse("name: a\nengine: job\nentrypoint: '" + std::string(e) + "'\n").entrypoint;
  };
  EXPECT_EQ(entry("train.py"), "train.py");
  EXPECT_EQ(entry("./train.py"), "train.py");
  EXPECT_EQ(entry("src//pkg/./main.py"), "src/pkg/main.py");
  EXPECT_EQ(entry("src/../main.py"), "main.py");
  // TauGrid's layout: the script beside the spec's folder (the CLI ships the folder it reaches).
  EXPECT_EQ(entry("../train.py"), "../train.py");
  EXPECT_EQ(entry("./../..//lib/./run.py"), "../../lib/run.py");
  EXPECT_EQ(entry("python3"), "python3");  // a bare command
  EXPECT_EQ(entry("bash"), "bash");
  EXPECT_EQ(entry("scripts/run.sh"), "scripts/run.sh");
  EXPECT_EQ(entry("日本/学習.py"), "日本/学習.py");
}

TEST(SpecEntrypoint, Rejections) {
  auto error = [](std::string_view e) {
    return Errors("name: a\nengine: job\nentrypoint: \"" + std::string(e) + "\"\n");
  };
  EXPECT_NE(error("a/../../x.py")
                .find("3:13: error: entrypoint: 'a/../../x.py' leaves the code "
                      "directory"),
            std::string::npos);
  EXPECT_NE(error("../a/../../x.py").find("leaves the folder it reaches"), std::string::npos);
  EXPECT_NE(error("../.").find("names no file"), std::string::npos);
  EXPECT_NE(error("/abs/x.py").find("is an absolute path"), std::string::npos);
  EXPECT_NE(error("~/x.py").find("is an absolute path"), std::string::npos);
  EXPECT_NE(error("python train.py").find("its arguments in run.args"), std::string::npos);
  EXPECT_NE(error("").find("must not be empty"), std::string::npos);
  EXPECT_NE(error("a\\0b").find("NUL"), std::string::npos);
  EXPECT_NE(error("a\\nb").find("control characters"), std::string::npos);
  EXPECT_NE(error("src/").find("names a directory"), std::string::npos);
  EXPECT_NE(error(".").find("names no file"), std::string::npos);
  EXPECT_NE(error("-m").find("starts with '-'"), std::string::npos);
  EXPECT_NE(error("a\\\\b.py").find("uses '\\'"), std::string::npos);
  EXPECT_NE(
      Errors("name: a\nengine: job\nentrypoint: [a.py]\n").find("expected a string, got a list"),
      std::string::npos);
}

TEST(SpecName, Validation) {
  EXPECT_EQ(MustParse("name: a1-b2\nengine: job\nentrypoint: a.py\n").name, "a1-b2");
  EXPECT_EQ(MustParse("name: 123\nengine: job\nentrypoint: a.py\n").name, "123");
  MustParse("name: " + std::string(53, 'a') + "\nengine: job\nentrypoint: a.py\n");
  EXPECT_NE(Errors("name: " + std::string(54, 'a') + "\nengine: job\nentrypoint: a.py\n")
                .find("is 54 characters long; at most 53 allowed"),
            std::string::npos);
  EXPECT_NE(Errors("name: -ab\nengine: job\nentrypoint: a.py\n").find("not a DNS-1123 label"),
            std::string::npos);
  EXPECT_NE(
      Errors("name: My Run\nengine: job\nentrypoint: a.py\n").find("(did you mean 'my-run'?)"),
      std::string::npos);
  EXPECT_NE(Errors("name:\nengine: job\nentrypoint: a.py\n")
                .find("tau.yaml:1:1: error: name: expected a string, got null"),
            std::string::npos);
}

TEST(SpecEnv, ValuesAndSecrets) {
  // Unquoted numbers and booleans are accepted and keep their YAML spelling.
  RunSpec spec = MustParse(Manifest(
      "runtime:\n  env:\n    I: 7\n    F: 1.50\n    B: true\n    H: 0x1F\n    E: ''\n    S: "
      "SECRET:db.password\n    Q: 'SECRET:x'\n    N: '~'\n"));
  ASSERT_EQ(spec.runtime.env.size(), 8u);
  EXPECT_EQ(spec.runtime.env[0].value, "7");
  EXPECT_EQ(spec.runtime.env[1].value, "1.50");
  EXPECT_EQ(spec.runtime.env[2].value, "true");
  EXPECT_EQ(spec.runtime.env[3].value, "0x1F");
  EXPECT_EQ(spec.runtime.env[4].value, "");
  EXPECT_TRUE(spec.runtime.env[5].secret_ref);
  EXPECT_EQ(spec.runtime.env[5].value, "db.password");
  EXPECT_TRUE(spec.runtime.env[6].secret_ref);
  EXPECT_EQ(spec.runtime.env[7].value, "~");
  EXPECT_FALSE(spec.runtime.env[7].secret_ref);
}

TEST(SpecEnv, Errors) {
  EXPECT_NE(Errors(Manifest("runtime:\n  env:\n    9LIVES: x\n"))
                .find("tau.yaml:7:5: error: runtime.env: '9LIVES' is not a valid environment "
                      "variable name"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("runtime:\n  env:\n    A: ~\n"))
                .find("tau.yaml:7:8: error: runtime.env.A: expected a string, got null"),
            std::string::npos);
  EXPECT_NE(
      Errors(Manifest("runtime:\n  env:\n    A: [1]\n")).find("expected a string, got a list"),
      std::string::npos);
  EXPECT_NE(Errors(Manifest("runtime:\n  env:\n    A: SECRET:bad/key\n"))
                .find("'SECRET:' must be followed by a secret key"),
            std::string::npos);
  EXPECT_NE(
      Errors(Manifest("runtime:\n  env:\n    A: x\n    A: y\n"))
          .find(
              "tau.yaml:8:5: error: duplicate field 'A' in 'runtime.env' (first given on line 7)"),
      std::string::npos);
  EXPECT_NE(Errors(Manifest("runtime:\n  env:\n    A: \"x\\0y\"\n")).find("NUL"),
            std::string::npos);
}

TEST(SpecEnv, SizeLimits) {
  std::string exactly(kMaxEnvValueBytes, 'v');
  MustParse(Manifest("runtime:\n  env:\n    A: " + exactly + "\n"));
  EXPECT_NE(Errors(Manifest("runtime:\n  env:\n    A: " + exactly + "v\n"))
                .find("runtime.env.A: value is 65537 bytes; at most 65536 allowed"),
            std::string::npos);
  // Two maximal values fit the total; a third byte over does not. Secrets do not count.
  MustParse(Manifest("runtime:\n  env:\n    A: " + exactly + "\n    B: " + exactly +
                     "\n    C: SECRET:k\n"));
  EXPECT_NE(Errors(Manifest("runtime:\n  env:\n    A: " + exactly + "\n    B: " + exactly +
                            "\n    C: x\n"))
                .find("values total 131073 bytes; at most 131072 allowed"),
            std::string::npos);
  std::string many = "runtime:\n  env:\n";
  for (size_t i = 0; i < kMaxEnvVars; ++i) many += "    V" + std::to_string(i) + ": x\n";
  EXPECT_EQ(MustParse(Manifest(many)).runtime.env.size(), kMaxEnvVars);
  EXPECT_NE(Errors(Manifest(many + "    ONE_MORE: x\n")).find("1025 variables; at most 1024"),
            std::string::npos);
}

TEST(SpecPip, Entries) {
  RunSpec spec =
      MustParse(Manifest("runtime:\n  pip: ['torch==2.4', 'numpy>=1,<3', 'a[extra]']\n"));
  EXPECT_EQ(spec.runtime.pip.size(), 3u);
  EXPECT_NE(Errors(Manifest("runtime:\n  pip: ['']\n")).find("runtime.pip[0]: must not be empty"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("runtime:\n  pip: [\"a\\nb\"]\n")).find("must be a single line"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("runtime:\n  pip: ['-r requirements.txt']\n")).find("is a pip option"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("runtime:\n  pip: [{a: b}]\n"))
                .find("runtime.pip[0]: expected a string, got a mapping"),
            std::string::npos);
}

TEST(SpecArgs, ScalarsBecomeText) {
  RunSpec spec = MustParse(
      "schema_version: 1\nname: a\nrun:\n  entrypoint: a.py\n  args: [--a, 1, 2.5, false, 'x "
      "y']\n");
  EXPECT_EQ(spec.args, (std::vector<std::string>{"--a", "1", "2.5", "false", "x y"}));
  EXPECT_NE(Errors("schema_version: 1\nname: a\nrun:\n  entrypoint: a.py\n  args: --a\n")
                .find("run.args: expected a list, got a string"),
            std::string::npos);
}

TEST(SpecCompute, RangesAndTypes) {
  MustParse(Manifest("compute:\n  workers: 4096\n  gpus: 64\n"));
  MustParse(Manifest("compute:\n  workers: 1\n  gpus: 0\n"));
  EXPECT_NE(Errors(Manifest("compute:\n  workers: 4097\n")).find("4097 is out of range (1..4096)"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  workers: 0\n")).find("0 is out of range (1..4096)"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  gpus: 65\n")).find("65 is out of range (0..64)"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  gpus: -1\n")).find("-1 is out of range (0..64)"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  workers: \"2\"\n"))
                .find("tau.yaml:6:12: error: compute.workers: expected an integer, got a string"),
            std::string::npos);
  EXPECT_NE(
      Errors(Manifest("compute:\n  workers: true\n")).find("expected an integer, got a boolean"),
      std::string::npos);
  EXPECT_NE(
      Errors(Manifest("compute:\n  workers: 2.0\n")).find("expected an integer, got a number"),
      std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  workers: 9223372036854775808\n")).find("out of range"),
            std::string::npos);
  EXPECT_EQ(MustParse(Manifest("compute:\n  workers: 0x10\n")).compute.workers, 16);
  EXPECT_EQ(MustParse(Manifest("compute:\n  workers: +3\n")).compute.workers, 3);
}

TEST(SpecCompute, Quantities) {
  RunSpec spec = MustParse(Manifest("compute:\n  cpus: 0.5\n  memory: 1e9\n  worker_cpus: '2'\n"));
  EXPECT_EQ(spec.compute.cpus, Q("500m"));
  EXPECT_EQ(spec.compute.memory, Q("1G"));
  EXPECT_EQ(spec.compute.worker_cpus, Q("2"));
  EXPECT_NE(Errors(Manifest("compute:\n  cpus: 0\n")).find("compute.cpus: must be positive"),
            std::string::npos);
  EXPECT_NE(
      Errors(Manifest("compute:\n  cpus: lots\n")).find("compute.cpus: invalid quantity 'lots'"),
      std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  cpus: true\n")).find("expected a quantity"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  memory: 512m\n")).find("(did you mean '512Mi'?)"),
            std::string::npos);
  MustParse(Manifest("compute:\n  cpus: 100m\n"));  // milli-CPUs are fine
}

TEST(SpecCompute, LimitsBelowRequests) {
  EXPECT_NE(
      Errors(Direct("compute:\n  head_cpu_request: 2\n  head_cpu_limit: 1\n"))
          .find(
              "tau.yaml:6:19: error: compute.head_cpu_limit (1) is below the head CPU request (2)"),
      std::string::npos);
  // The pod-wide request is the default for both head and workers.
  EXPECT_NE(Errors(Direct("compute:\n  memory_request: 2Gi\n  worker_memory_limit: 1Gi\n"))
                .find("compute.worker_memory_limit (1Gi) is below the worker memory request (2Gi)"),
            std::string::npos);
  MustParse(
      Direct("compute:\n  cpu_request: 1\n  worker_cpu_limit: 1\n  head_memory_limit: 1Gi\n"));
}

TEST(SpecCompute, GpuResourceMode) {
  EXPECT_EQ(
      MustParse(Manifest("compute:\n  gpu_resource_mode: mig-1g.10gb\n")).compute.gpu_resource_mode,
      "mig-1g.10gb");
  EXPECT_NE(Errors(Manifest("compute:\n  gpu_resource_mode: MIG\n")).find("must be lowercase"),
            std::string::npos);
}

TEST(SpecPolicy, Enums) {
  for (const char* gpu : {"any", "a10-4gb", "a10-24gb", "a100-40gb", "h100-95gb", "gb300-288gb",
                          "a10", "a100", "h100", "h200", "gb200", "gb300"}) {
    EXPECT_EQ(
        MustParse(Direct(std::string("policy:\n  gpu_class: ") + gpu + "\n")).policy.gpu_class,
        gpu);
  }
  for (const char* t :
       {"independent", "single-node-nvlink", "multi-node-nccl", "unconstrained", "same-host",
        "same-accelerator-domain", "same-network-domain", "same-site"}) {
    EXPECT_EQ(MustParse(Direct(std::string("policy:\n  topology: ") + t + "\n")).policy.topology,
              t);
  }
  EXPECT_NE(Errors(Direct("policy:\n  gpu_class: a100-80g\n")).find("(did you mean 'a100-80gb'?)"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("policy:\n  priority_tier: prio\n")).find("allowed: default, priority"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("policy:\n  gpu_class: ''\n")).find("unknown value ''"),
            std::string::npos);
}

TEST(SpecPolicy, NamesAndSelectors) {
  EXPECT_NE(Errors(Direct("policy:\n  queue: Bad_Queue\n"))
                .find("policy.queue: 'Bad_Queue' is not a valid"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("policy:\n  priority: UPPER\n")).find("policy.priority"),
            std::string::npos);
  EXPECT_NE(
      Errors(Direct("policy:\n  workspace: ''\n")).find("policy.workspace: must not be empty"),
      std::string::npos);
  RunSpec spec = MustParse(Direct("policy:\n  node_selector:\n    example.com/tier: ''\n"));
  EXPECT_EQ(spec.policy.node_selector.at("example.com/tier"), "");
  EXPECT_NE(Errors(Direct("policy:\n  node_selector:\n    a: 'bad value!'\n"))
                .find("not a valid label value"),
            std::string::npos);
  EXPECT_NE(
      Errors(Direct("policy:\n  node_selector: [a]\n")).find("expected a mapping, got a list"),
      std::string::npos);
  EXPECT_NE(Errors(Direct("policy:\n  disable_default_priorities: 1\n")).find("expected a boolean"),
            std::string::npos);
  EXPECT_TRUE(MustParse(Direct("policy:\n  disable_default_priorities: True\n"))
                  .policy.disable_default_priorities);
}

TEST(SpecStorage, ImageAssets) {
  RunSpec spec =
      MustParse(Direct("storage:\n  image_assets:\n    - {name: a, image: i1, mount_path: /a}\n    "
                       "- name: b\n      image: "
                       "i2\n      source_path: /src\n      mount_path: /b\n"));
  ASSERT_EQ(spec.storage.image_assets.size(), 2u);
  EXPECT_EQ(spec.storage.image_assets[1].name, "b");
  EXPECT_EQ(spec.storage.image_assets[1].source_path, "/src");
  EXPECT_NE(Errors(Direct("storage:\n  image_assets:\n    - x\n"))
                .find("storage.image_assets[0]: expected a mapping, got a string"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("storage:\n  image_assets: {}\n")).find("expected a list"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("storage:\n  publish: now\n")).find("allowed: staged"),
            std::string::npos);
}

TEST(SpecMetrics, History) {
  RunSpec spec = MustParse(Direct("metrics:\n  history: ['./a/*.jsonl', b.jsonl]\n"));
  EXPECT_EQ(spec.metrics.history, (std::vector<std::string>{"a/*.jsonl", "b.jsonl"}));
  EXPECT_NE(Errors(Direct("metrics:\n  history: [/etc/x]\n")).find("absolute path"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("metrics:\n  offload: {enabled: 'no'}\n")).find("expected a boolean"),
            std::string::npos);
}

TEST(SpecResilience, RetryOn) {
  RunSpec spec =
      MustParse(Manifest("resilience:\n  retry_on: [UserError, OOMKilled, Preempted, Evicted, "
                         "GPUError, NodeLost, Timeout, "
                         "SetupError]\n"));
  EXPECT_EQ(spec.resilience.retry_on.size(), 8u);
  auto err = [](std::string_view list) {
    return Errors(Manifest("resilience:\n  retry_on: [" + std::string(list) + "]\n"));
  };
  EXPECT_NE(err("Unknown").find(
                "tau.yaml:6:14: error: resilience.retry_on[0]: 'Unknown' is never retried"),
            std::string::npos);
  EXPECT_NE(err("Cancelled").find("'Cancelled' is not retryable"), std::string::npos);
  EXPECT_NE(err("Succeeded").find("'Succeeded' is not a failure class"), std::string::npos);
  EXPECT_NE(err("oomkilled").find("(did you mean 'OOMKilled'?)"), std::string::npos);
  EXPECT_NE(err("Evicted, Evicted").find("resilience.retry_on[1]: 'Evicted' is listed twice"),
            std::string::npos);
  EXPECT_NE(err("Completed").find("unknown failure class 'Completed'"), std::string::npos);
  // A class the controller gives but retry_on does not take.
  EXPECT_NE(err("SecretNotFound")
                .find("unknown failure class 'SecretNotFound'; allowed: UserError, OOMKilled, "
                      "Preempted, Evicted, GPUError, NodeLost, Timeout, SetupError"),
            std::string::npos);
}

TEST(SpecResilience, RetryPolicyOfUsesRecoverysClasses) {
  EXPECT_EQ(DefaultRetryOn(),
            (std::vector<std::string>{"Preempted", "Evicted", "GPUError", "NodeLost"}));
  recovery::RetryPolicy plain = RetryPolicyOf(MustParse(Manifest("")).resilience);
  EXPECT_FALSE(plain.retry_on_set);
  EXPECT_TRUE(plain.retry_on.empty());
  EXPECT_EQ(plain.EffectiveRetryOn(), recovery::DefaultRetryOn());
  EXPECT_EQ(plain.backoff_initial_ms, 30'000);
  EXPECT_EQ(plain.backoff_max_ms, 300'000);
  EXPECT_FALSE(plain.max_retry_duration_ms.has_value());
  recovery::RetryPolicy p = RetryPolicyOf(
      MustParse(Manifest("resilience:\n  max_retries: 3\n  retry_on: [Timeout, OOMKilled]\n  "
                         "backoff_initial: 1s\n  backoff_max: 8s\n  max_retry_duration: 1h\n"))
          .resilience);
  EXPECT_EQ(p.max_retries, 3);
  EXPECT_TRUE(p.retry_on_set);
  EXPECT_EQ(p.retry_on, (std::vector<recovery::FailureClass>{recovery::FailureClass::kTimeout,
                                                             recovery::FailureClass::kOOMKilled}));
  EXPECT_EQ(p.backoff_initial_ms, 1'000);
  EXPECT_EQ(p.backoff_max_ms, 8'000);
  EXPECT_EQ(p.max_retry_duration_ms, 3'600'000);
}

TEST(SpecResilience, DurationsAndRetries) {
  RunSpec spec = MustParse(
      Manifest("resilience:\n  max_retries: 100\n  backoff_initial: 250ms\n  backoff_max: 1h\n  "
               "max_retry_duration: 1d\n"));
  EXPECT_EQ(spec.resilience.max_retries, 100);
  EXPECT_EQ(spec.resilience.backoff_initial_ms, 250);
  EXPECT_EQ(spec.resilience.backoff_max_ms, 3'600'000);
  EXPECT_EQ(spec.resilience.max_retry_duration_ms, 86'400'000);
  EXPECT_NE(
      Errors(Manifest("resilience:\n  max_retries: -1\n")).find("-1 is out of range (0..100)"),
      std::string::npos);
  // An initial backoff beyond the default maximum is caught too.
  EXPECT_NE(Errors(Manifest("resilience:\n  backoff_initial: 10m\n"))
                .find("resilience.backoff_initial (10m) is longer than resilience.backoff_max (5m, "
                      "the default)"),
            std::string::npos);
  MustParse(Manifest("resilience:\n  backoff_initial: 5m\n"));  // equal is fine
  EXPECT_NE(
      Errors(Manifest("resilience:\n  max_retry_duration: 0s\n")).find("must be longer than zero"),
      std::string::npos);
  EXPECT_NE(Errors(Manifest("resilience:\n  backoff_max: '" + std::string(100, '1') + "s'\n"))
                .find("duration is too long"),
            std::string::npos);
}

TEST(SpecRun, DurationsAndTtl) {
  auto run = [](std::string_view extra) {
    return "schema_version: 1\nname: a\nrun:\n  entrypoint: a.py\n" + std::string(extra);
  };
  EXPECT_EQ(MustParse(run("  max_runtime: 90s\n")).max_runtime_ms, 90'000);
  EXPECT_EQ(MustParse(run("  ttl_seconds_after_finished: 2147483647\n")).ttl_seconds_after_finished,
            2147483647);
  EXPECT_NE(Errors(run("  ttl_seconds_after_finished: 2147483648\n")).find("out of range"),
            std::string::npos);
  EXPECT_NE(Errors(run("  max_runtime: 0s\n")).find("run.max_runtime: must be longer than zero"),
            std::string::npos);
  EXPECT_NE(Errors(run("  max_runtime: 5\n")).find("expected a duration such as 30s"),
            std::string::npos);
  // A minimum above zero is said as it is, not as zero.
  EXPECT_NE(Errors(run("policy:\n  guardrails:\n    idle: {warn_after: 0s}\n"))
                .find("policy.guardrails.idle.warn_after: must be at least 1s, got '0s'"),
            std::string::npos);
  EXPECT_NE(Errors("schema_version: 1\nname: a\nrun: {}\n")
                .find("tau.yaml:3:6: error: missing required field 'entrypoint' in 'run'"),
            std::string::npos);
  EXPECT_NE(Errors("schema_version: 1\nname: a\n")
                .find("tau.yaml:1:1: error: missing required field 'run'"),
            std::string::npos);
}

TEST(SpecMisc, ResourceNamingAndSecurity) {
  EXPECT_EQ(MustParse(Manifest("resource_naming:\n  prefix: team-a\n")).resource_prefix, "team-a");
  EXPECT_NE(Errors(Manifest("resource_naming:\n  prefix: " + std::string(21, 'p') + "\n"))
                .find("at most 20 allowed"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("runtime:\n  security:\n    mode: Restricted\n"))
                .find("(did you mean 'restricted'?)"),
            std::string::npos);
}

TEST(SpecPolicy, ARunNamesItsOwnWebhooksAndTheyAreInItsCanonicalJson) {
  RunSpec spec =
      MustParse(Manifest("policy:\n  webhooks:\n    - url: https://hooks.example.com/tau\n"
                         "      secret: hook-key\n      events: [state, budget]\n"
                         "    - url: http://[::1]:8080/all\n      secret: other\n"));
  ASSERT_EQ(spec.policy.webhooks.size(), 2u);
  EXPECT_EQ(spec.policy.webhooks[0].url, "https://hooks.example.com/tau");
  EXPECT_EQ(spec.policy.webhooks[0].secret, "hook-key");
  EXPECT_EQ(spec.policy.webhooks[0].events, (std::vector<std::string>{"state", "budget"}));
  EXPECT_EQ(spec.policy.webhooks[1].events, WebhookEventKinds());  // every kind when not given
  const nlohmann::json json = ToJson(spec);
  EXPECT_EQ(json["policy"]["webhooks"][0]["events"], nlohmann::json({"state", "budget"}));
  EXPECT_EQ(json["policy"]["webhooks"][1]["url"], "http://[::1]:8080/all");
  // A spec without them keeps its canonical JSON (and config hash) as before the field.
  EXPECT_FALSE(ToJson(MustParse(Manifest()))["policy"].contains("webhooks"));
  EXPECT_FALSE(ToJson(MustParse(Manifest()))["policy"].contains("guardrails"));
  // The guardrails are in it too, where given.
  EXPECT_EQ(ToJson(MustParse(Manifest(
                "policy:\n  guardrails:\n    stall: {after: 20m}\n")))["policy"]["guardrails"]
                                                                      ["stall"]["after_ms"],
            1'200'000);
  // --set reaches a receiver's field.
  ParseOutcome set =
      ParseSpec(Manifest("policy:\n  webhooks:\n    - url: https://a.example/x\n      secret: k\n"),
                "tau.yaml", *ParseOverrides({"policy.webhooks[0].url=https://b.example/y"}));
  ASSERT_TRUE(set.ok()) << set.ErrorText();
  EXPECT_EQ(set.spec->policy.webhooks[0].url, "https://b.example/y");
}

TEST(SpecPolicy, AWebhookMistakeIsRefusedWhereItIs) {
  auto hook = [](const std::string& body) {
    return Manifest("policy:\n  webhooks:\n    - " + body + "\n");
  };
  EXPECT_NE(Errors(hook("url: ftp://x.example/\n      secret: k"))
                .find("tau.yaml:7:12: error: policy.webhooks[0].url: 'ftp://x.example/' is not an "
                      "http:// or https:// URL"),
            std::string::npos);
  EXPECT_NE(Errors(hook("url: https://me:pw@x.example/\n      secret: k")).find("credentials"),
            std::string::npos);
  EXPECT_NE(Errors(hook("url: https://x.example:0/\n      secret: k")).find("port"),
            std::string::npos);
  EXPECT_NE(Errors(hook("url: https://x.example/"))
                .find("missing required field 'secret' in 'policy.webhooks[0]'"),
            std::string::npos);
  const std::string kinds =
      Errors(hook("url: https://x.example/\n      secret: k\n"
                  "      events: [stat, state, state]"));
  EXPECT_NE(kinds.find("tau.yaml:9:16: error: policy.webhooks[0].events[0]: unknown event kind "
                       "'stat' (did you mean 'state'?); allowed: state, guardrail, budget"),
            std::string::npos)
      << kinds;
  EXPECT_NE(kinds.find("policy.webhooks[0].events[2]: 'state' is listed twice"), std::string::npos);
  EXPECT_NE(Errors(hook("url: https://x.example/\n      secret: k\n      events: []"))
                .find("policy.webhooks[0].events: must name at least one kind"),
            std::string::npos);
  EXPECT_NE(Errors(hook("url: https://x.example/\n      secret: k\n      token: t"))
                .find("unknown field 'token' in 'policy.webhooks[0]'"),
            std::string::npos);
}

}  // namespace
}  // namespace tau::spec
