// PlanLaunch and the JSON of the attempt files: pure, no processes.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/files.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

// Substring check with the haystack in the failure message.
::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not in: " << haystack;
}

std::string Get(const EnvList& env, const std::string& name) {
  for (const auto& [key, value] : env) {
    if (key == name) return value;
  }
  return "<unset>";
}

int IndexOf(const EnvList& env, const std::string& name) {
  for (size_t i = 0; i < env.size(); ++i) {
    if (env[i].first == name) return static_cast<int>(i);
  }
  return -1;
}

spec::RunSpec Job(int workers, int gpus, std::string entry = "train.py") {
  spec::RunSpec s;
  s.name = "demo";
  s.kind = spec::WorkloadKind::kJob;
  s.entrypoint = std::move(entry);
  s.args = {"--lr", "0.1"};
  s.compute.workers = workers;
  s.compute.gpus = gpus;
  return s;
}

LaunchContext Context(std::vector<int> gpus) {
  LaunchContext ctx;
  ctx.run_name = "demo";
  ctx.attempt = 2;
  ctx.work_dir = "/nonexistent-tau-code";
  ctx.checkpoint_dir = "/ckpt";
  ctx.output_dir = "/out";
  ctx.metrics_file = "/out/metrics.jsonl";
  ctx.gpus = std::move(gpus);
  ctx.master_port = 29511;
  ctx.base_env = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/home/u"}, {"FOO", "base"}};
  return ctx;
}

using Argv = std::vector<std::string>;

TEST(PlanLaunchTest, SingleCpuWorkerRunsPython) {
  auto plan = PlanLaunch(Job(1, 0), Context({}));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 1u);
  const WorkerLaunch& w = (*plan)[0];
  EXPECT_EQ(w.argv, (Argv{"python3", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(Get(w.env, "CUDA_VISIBLE_DEVICES"), "");  // set, and empty
  EXPECT_EQ(Get(w.env, "TAU_RUN_NAME"), "demo");
  EXPECT_EQ(Get(w.env, "TAU_ATTEMPT"), "2");
  EXPECT_EQ(Get(w.env, "TAU_CHECKPOINT_DIR"), "/ckpt");
  EXPECT_EQ(Get(w.env, "TAU_OUTPUT_DIR"), "/out");
  EXPECT_EQ(Get(w.env, "TAU_METRICS_FILE"), "/out/metrics.jsonl");
  EXPECT_EQ(Get(w.env, "PYTHONUNBUFFERED"), "1");
  EXPECT_EQ(Get(w.env, "RANK"), "<unset>");
}

TEST(PlanLaunchTest, SingleGpuWorkerSeesItsGpu) {
  auto plan = PlanLaunch(Job(1, 1), Context({3}));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0].argv[0], "python3");
  EXPECT_EQ(Get((*plan)[0].env, "CUDA_VISIBLE_DEVICES"), "3");
  // NVML's indices, which count in PCI bus order: CUDA must count the same way.
  EXPECT_EQ(Get((*plan)[0].env, "CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
}

TEST(PlanLaunchTest, MultiGpuSingleWorkerUsesStandaloneTorchrun) {
  LaunchContext no_port = Context({4, 5, 6, 7});
  no_port.master_port = 0;  // none handed out: torchrun picks one
  auto plan = PlanLaunch(Job(1, 4), no_port);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].argv,
            (Argv{"torchrun", "--standalone", "--nproc_per_node=4", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(Get((*plan)[0].env, "CUDA_VISIBLE_DEVICES"), "4,5,6,7");
  // With a port handed out (the local backend's, guarded for the run's user): its store there.
  LaunchContext ctx = Context({4, 5, 6, 7});
  ctx.master_port = 41234;
  plan = PlanLaunch(Job(1, 4), ctx);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0].argv,
            (Argv{"torchrun", "--nnodes=1", "--nproc_per_node=4", "--master_addr=127.0.0.1",
                  "--master_port=41234", "train.py", "--lr", "0.1"}));
}

TEST(PlanLaunchTest, CpuGangGetsRendezvousVariables) {
  auto plan = PlanLaunch(Job(3, 0), Context({}));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const WorkerLaunch& w = (*plan)[static_cast<size_t>(r)];
    EXPECT_EQ(w.argv, (Argv{"python3", "train.py", "--lr", "0.1"}));
    EXPECT_EQ(Get(w.env, "MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(Get(w.env, "MASTER_PORT"), "29511");
    EXPECT_EQ(Get(w.env, "WORLD_SIZE"), "3");
    EXPECT_EQ(Get(w.env, "RANK"), std::to_string(r));
    EXPECT_EQ(Get(w.env, "LOCAL_RANK"), std::to_string(r));
    EXPECT_EQ(Get(w.env, "CUDA_VISIBLE_DEVICES"), "");
  }
}

TEST(PlanLaunchTest, MultiGpuGangUsesMultiNodeTorchrunWithGpuSlices) {
  auto plan = PlanLaunch(Job(2, 2), Context({0, 1, 2, 3}));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const WorkerLaunch& w = (*plan)[static_cast<size_t>(r)];
    EXPECT_EQ(w.argv, (Argv{"torchrun", "--nnodes=2", "--node_rank=" + std::to_string(r),
                            "--nproc_per_node=2", "--master_addr=127.0.0.1", "--master_port=29511",
                            "train.py", "--lr", "0.1"}));
  }
  EXPECT_EQ(Get((*plan)[0].env, "CUDA_VISIBLE_DEVICES"), "0,1");
  EXPECT_EQ(Get((*plan)[1].env, "CUDA_VISIBLE_DEVICES"), "2,3");
}

TEST(PlanLaunchTest, RayJobRunsTheDriverOnceWithEveryGpu) {
  spec::RunSpec s = Job(2, 1);
  s.kind = spec::WorkloadKind::kRayJob;
  auto plan = PlanLaunch(s, Context({1, 5}));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].argv, (Argv{"python3", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(Get((*plan)[0].env, "CUDA_VISIBLE_DEVICES"), "1,5");
  EXPECT_EQ(Get((*plan)[0].env, "TAU_RAY_WORKERS"), "2");
  EXPECT_EQ(Get((*plan)[0].env, "RANK"), "<unset>");
}

TEST(PlanLaunchTest, GpuCountMustMatchPlacement) {
  auto job = PlanLaunch(Job(2, 2), Context({0, 1, 2}));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(job.status().message(), "needs 4"));
  spec::RunSpec ray = Job(2, 1);
  ray.kind = spec::WorkloadKind::kRayJob;
  EXPECT_EQ(PlanLaunch(ray, Context({0})).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanLaunch(Job(1, 0), Context({0})).status().code(), StatusCode::kInvalidArgument);
}

TEST(PlanLaunchTest, GangNeedsMasterPort) {
  LaunchContext ctx = Context({});
  ctx.master_port = 0;
  EXPECT_EQ(PlanLaunch(Job(2, 0), ctx).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(PlanLaunch(Job(1, 0), ctx).ok());
}

TEST(PlanLaunchTest, NonPythonEntrypoints) {
  std::string tmpl = ::testing::TempDir() + "tau-launch-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  std::string dir = tmpl;
  ASSERT_TRUE(WriteFileAtomic(dir + "/run.sh", "#!/bin/sh\n", 0755).ok());
  LaunchContext ctx = Context({});
  ctx.work_dir = dir;
  auto file = PlanLaunch(Job(1, 0, "run.sh"), ctx);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)[0].argv, (Argv{dir + "/run.sh", "--lr", "0.1"}));
  auto command = PlanLaunch(Job(1, 0, "nvidia-smi"), ctx);
  ASSERT_TRUE(command.ok());
  EXPECT_EQ((*command)[0].argv, (Argv{"nvidia-smi", "--lr", "0.1"}));
  // torchrun launches only Python; a non-Python multi-GPU entrypoint runs as is.
  auto multi = PlanLaunch(Job(1, 2, "run.sh"), [&] {
    LaunchContext c = ctx;
    c.gpus = {0, 1};
    return c;
  }());
  ASSERT_TRUE(multi.ok());
  EXPECT_EQ((*multi)[0].argv[0], dir + "/run.sh");
  (void)RemoveTree(dir);
}

TEST(PlanLaunchTest, EnvOrderAndOverrides) {
  spec::RunSpec s = Job(1, 0);
  s.runtime.env = {
      {"FOO", "spec", false, ""}, {"TAU_ATTEMPT", "99", false, ""}, {"BAR", "1", false, ""}};
  LaunchContext ctx = Context({});
  ctx.extra_env = {{"TAU_FAILURE_REASON", "OOMKilled"}, {"BAR", "extra"}};
  auto plan = PlanLaunch(s, ctx);
  ASSERT_TRUE(plan.ok());
  const EnvList& env = (*plan)[0].env;
  EXPECT_EQ(Get(env, "FOO"), "spec");       // spec env over base_env
  EXPECT_EQ(Get(env, "TAU_ATTEMPT"), "2");  // tau's variables over the spec's
  EXPECT_EQ(Get(env, "BAR"), "extra");      // extra_env over everything
  EXPECT_EQ(Get(env, "TAU_FAILURE_REASON"), "OOMKilled");
  EXPECT_EQ(Get(env, "HOME"), "/home/u");
  int names = 0;
  for (const auto& [name, value] : env) names += name == "FOO" ? 1 : 0;
  EXPECT_EQ(names, 1);  // replaced, not duplicated
  EXPECT_LT(IndexOf(env, "PATH"), IndexOf(env, "TAU_RUN_NAME"));
  EXPECT_LT(IndexOf(env, "TAU_RUN_NAME"), IndexOf(env, "CUDA_VISIBLE_DEVICES"));
  EXPECT_LT(IndexOf(env, "CUDA_VISIBLE_DEVICES"), IndexOf(env, "PYTHONUNBUFFERED"));
  EXPECT_LT(IndexOf(env, "PYTHONUNBUFFERED"), IndexOf(env, "TAU_FAILURE_REASON"));
}

TEST(PlanLaunchTest, SecretReferencesAreRejected) {
  spec::RunSpec s = Job(1, 0);
  s.runtime.env = {{"TOKEN", "hf-token", true, ""}};
  auto plan = PlanLaunch(s, Context({}));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(plan.status().message(),
                       "secret references are not supported by the local backend yet"));
  EXPECT_TRUE(Contains(plan.status().message(), "TOKEN"));
}

TEST(PlanLaunchTest, RejectsEmptyEntrypointAndBadCounts) {
  EXPECT_FALSE(PlanLaunch(Job(1, 0, ""), Context({})).ok());
  EXPECT_FALSE(PlanLaunch(Job(0, 0), Context({})).ok());
}

TEST(AttemptJsonTest, ConfigRoundTrips) {
  AttemptConfig c;
  c.run_name = "demo";
  c.attempt = 3;
  c.attempt_dir = "/a";
  c.work_dir = "/w";
  c.workers = {{{"python3", "x.py"}, {{"A", "1"}, {"B", "two words"}}}, {{"sleep", "1"}, {}}};
  c.pip = {"numpy==1.26", "torch"};
  c.venv_cache_dir = "/cache";
  c.memory_limit_bytes = int64_t{1} << 33;
  c.max_runtime_ms = 5000;
  c.stop_grace_ms = 250;
  auto back = AttemptConfig::FromJson(nlohmann::json::parse(c.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), c.ToJson());
  EXPECT_EQ(back->workers[0].env[1].second, "two words");
  EXPECT_FALSE(back->cpu_limit_milli.has_value());
  EXPECT_EQ(*back->memory_limit_bytes, int64_t{1} << 33);
}

TEST(AttemptJsonTest, BadConfigIsAnErrorNotAnException) {
  EXPECT_FALSE(AttemptConfig::FromJson(nlohmann::json::array()).ok());
  EXPECT_FALSE(AttemptConfig::FromJson({{"run_name", 5}}).ok());
  EXPECT_FALSE(
      AttemptConfig::FromJson(
          {{"run_name", "x"}, {"attempt", 1}, {"attempt_dir", "/a"}, {"workers", {{{"argv", 1}}}}})
          .ok());
}

TEST(AttemptJsonTest, OutcomeRoundTrips) {
  AttemptOutcome o;
  o.kind = OutcomeKind::kTimedOut;
  o.exit_code = 137;
  o.signal = 9;
  o.failed_rank = 1;
  o.oom_killed = true;
  o.message = "m";
  o.started_ms = 1;
  o.ended_ms = 2;
  o.workers = {{0, 10, 0, 0}, {1, 11, -1, 9}};
  auto back = AttemptOutcome::FromJson(o.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), o.ToJson());
  EXPECT_EQ(o.ToJson()["kind"], "TimedOut");
  EXPECT_FALSE(AttemptOutcome::FromJson({{"kind", "Exploded"}}).ok());
}

TEST(AttemptJsonTest, OutcomeKindNames) {
  EXPECT_STREQ(OutcomeKindName(OutcomeKind::kSucceeded), "Succeeded");
  EXPECT_STREQ(OutcomeKindName(OutcomeKind::kSetupFailed), "SetupFailed");
  EXPECT_STREQ(OutcomeKindName(OutcomeKind::kStopped), "Stopped");
}

TEST(ProcStatTest, ParsesFromTheLastParenthesis) {
  // A command name with spaces and parentheses must not shift the fields.
  std::string stat =
      "1234 (we ird) (name) S 1 1234 1200 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10\n";
  auto st = internal::ParseProcStat(stat);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->state, 'S');
  EXPECT_EQ(st->ppid, 1);
  EXPECT_EQ(st->pgrp, 1234);
  EXPECT_EQ(st->session, 1200);
  EXPECT_EQ(st->start_time, 987654u);
  EXPECT_FALSE(internal::ParseProcStat("1234 (x) S 1 2").has_value());
  EXPECT_FALSE(internal::ParseProcStat("garbage").has_value());
}

TEST(ProcStatTest, SelfIsAliveAndStartTimeIsChecked) {
  auto start = ProcessStartTime(::getpid());
  ASSERT_TRUE(start.has_value());
  EXPECT_TRUE(IsAlive({::getpid(), *start}));
  EXPECT_FALSE(IsAlive({::getpid(), *start + 1}));
  EXPECT_FALSE(IsAlive({0, 0}));
  EXPECT_FALSE(ProcessStartTime(-5).has_value());
  EXPECT_NE(SelfExecutable().find("runtime_test"), std::string::npos);
}

}  // namespace
}  // namespace tau::runtime
