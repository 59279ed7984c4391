// Services (kind: service): the serve section's fields, their defaults and the rules a service
// has beyond them, each error at its field.
#include <gtest/gtest.h>

#include "spec/spec.h"
#include "spec/spec_test_util.h"

namespace tau::spec {
namespace {

using testing::Errors;
using testing::Manifest;
using testing::MustParse;

std::string Service(std::string_view serve = "") {
  return Manifest("kind: service\n" + std::string(serve));
}

TEST(SpecServe, ARunSpecHasNoServeSection) {
  RunSpec run = MustParse(Manifest());
  EXPECT_FALSE(run.serve.has_value());
  EXPECT_FALSE(ToJson(run).contains("serve"));  // the config hash of runs is unchanged
  EXPECT_FALSE(MustParse(Manifest("kind: run\n")).serve.has_value());
}

TEST(SpecServe, DefaultsOfAService) {
  RunSpec s = MustParse(Service());
  ASSERT_TRUE(s.serve.has_value());
  EXPECT_EQ(s.serve->replicas, 1);
  EXPECT_EQ(s.serve->port, 8080);
  EXPECT_EQ(s.serve->readiness.http_path, "");  // a TCP probe
  EXPECT_EQ(s.serve->readiness.failure_threshold, 3);
  EXPECT_FALSE(s.serve->liveness.has_value());
  // Replicas restart whenever they stop: the retry policy says so.
  EXPECT_EQ(s.resilience.max_retries, kServiceRestarts);
  EXPECT_EQ(s.resilience.backoff_initial_ms, 1'000);
  EXPECT_EQ(s.resilience.backoff_max_ms, 30'000);
  const recovery::RetryPolicy policy = RetryPolicyOf(s.resilience);
  EXPECT_EQ(policy.EffectiveRetryOn().size(), recovery::RetryableFailureClasses().size());
  EXPECT_TRUE(ToJson(s).contains("serve"));
  EXPECT_NE(ConfigHash(s), ConfigHash(MustParse(Manifest())));
}

TEST(SpecServe, EveryField) {
  RunSpec s = MustParse(
      Service("serve:\n  replicas: 3\n  port: 9000\n  from: quickstart-1a2b3c4d\n  model: output\n"
              "  readiness:\n    http_path: /healthz\n    initial_delay: 2s\n    period: 500ms\n"
              "    timeout: 200ms\n    failure_threshold: 2\n    success_threshold: 2\n"
              "  liveness:\n    http_path: /live\n    period: 5s\n    failure_threshold: 4\n"
              "  restart_backoff_initial: 2s\n  restart_backoff_max: 1m\n"));
  const Serve& v = *s.serve;
  EXPECT_EQ(v.replicas, 3);
  EXPECT_EQ(v.port, 9000);
  EXPECT_EQ(v.from_run, "quickstart-1a2b3c4d");
  EXPECT_EQ(v.model, "output");
  EXPECT_EQ(v.readiness.http_path, "/healthz");
  EXPECT_EQ(v.readiness.initial_delay_ms, 2'000);
  EXPECT_EQ(v.readiness.period_ms, 500);
  EXPECT_EQ(v.readiness.timeout_ms, 200);
  EXPECT_EQ(v.readiness.failure_threshold, 2);
  EXPECT_EQ(v.readiness.success_threshold, 2);
  ASSERT_TRUE(v.liveness.has_value());
  EXPECT_EQ(v.liveness->http_path, "/live");
  EXPECT_EQ(v.liveness->period_ms, 5'000);
  EXPECT_EQ(v.liveness->failure_threshold, 4);
  EXPECT_EQ(s.resilience.backoff_initial_ms, 2'000);
  EXPECT_EQ(s.resilience.backoff_max_ms, 60'000);
  // An empty liveness section is a liveness probe with the defaults.
  EXPECT_TRUE(MustParse(Service("serve:\n  liveness: {}\n")).serve->liveness.has_value());
}

TEST(SpecServe, ErrorsAreAtTheirFields) {
  EXPECT_NE(Errors(Manifest("serve:\n  replicas: 2\n"))
                .find("tau.yaml:5:1: error: serve: only a "
                      "service has a serve section"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("kind: job\n")).find("kind"), std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  replicas: 65\n")).find("tau.yaml:7:13"), std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  port: 0\n")).find("serve.port"), std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  readiness:\n    http_path: healthz\n")).find("tau.yaml:8:16"),
            std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  liveness:\n    success_threshold: 2\n"))
                .find("unknown field 'success_threshold' in 'serve.liveness'"),
            std::string::npos);
  EXPECT_NE(
      Errors(Service("serve:\n  readiness:\n    period: 10ms\n")).find("serve.readiness.period"),
      std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  replica: 2\n")).find("did you mean 'replicas'?"),
            std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  model: weights\n")).find("serve.model"), std::string::npos);
  EXPECT_NE(Errors(Service("compute:\n  workers: 2\n"))
                .find("tau.yaml:7:3: error: compute.workers: a service's replica is one process"),
            std::string::npos);
  EXPECT_NE(Errors(Service("resilience:\n  max_retries: 3\n"))
                .find("tau.yaml:7:3: error: resilience: a service's replicas are restarted"),
            std::string::npos);
  EXPECT_NE(Errors(Service("serve:\n  restart_backoff_initial: 1m\n  restart_backoff_max: 1s\n"))
                .find("serve.restart_backoff_max (1000 ms) is shorter"),
            std::string::npos);
  EXPECT_NE(Errors("schema_version: 1\nname: demo\nkind: service\nrun:\n  entrypoint: serve.py\n"
                   "  workload_kind: job\nserve:\n  import_path: app:app\n")
                .find("serve.import_path: a Ray Serve application"),
            std::string::npos);
}

TEST(SpecServe, JsonSchemaDescribesIt) {
  const std::string text = JsonSchema().dump();
  EXPECT_NE(text.find("\"serve\""), std::string::npos);
  EXPECT_NE(text.find("\"readiness\""), std::string::npos);
  EXPECT_NE(text.find("\"service\""), std::string::npos);  // kind's values
}

}  // namespace
}  // namespace tau::spec
