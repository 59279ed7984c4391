// Shape coverage: every field of both shapes lands in the right RunSpec member, defaults, aliases.
#include <gtest/gtest.h>

#include "spec/spec.h"
#include "spec/spec_test_util.h"

namespace tau::spec {
namespace {

using testing::Direct;
using testing::Errors;
using testing::Manifest;
using testing::MustParse;
using testing::Parse;
using testing::ReadText;
using testing::SpecDataDir;

Quantity Q(std::string_view text) { return *Quantity::Parse(text); }

TEST(SpecNames, ShapeAndKindNames) {
  EXPECT_STREQ(ShapeName(Shape::kManifest), "manifest");
  EXPECT_STREQ(ShapeName(Shape::kDirect), "direct");
  EXPECT_STREQ(WorkloadKindName(WorkloadKind::kJob), "job");
  EXPECT_STREQ(WorkloadKindName(WorkloadKind::kRayJob), "rayjob");
}

TEST(SpecDiagnostic, ToStringFormats) {
  EXPECT_EQ((Diagnostic{"tau.yaml", 7, 3, "boom"}).ToString(), "tau.yaml:7:3: error: boom");
  EXPECT_EQ((Diagnostic{"tau.yaml", 7, 0, "boom"}).ToString(), "tau.yaml:7: error: boom");
  EXPECT_EQ((Diagnostic{"tau.yaml", 0, 0, "boom"}).ToString(), "tau.yaml: error: boom");
  EXPECT_EQ((Diagnostic{"", 2, 5, "boom"}).ToString(), "2:5: error: boom");
  EXPECT_EQ((Diagnostic{"", 0, 0, "boom"}).ToString(), "error: boom");
}

TEST(SpecDiagnostic, ErrorTextJoinsWithNewlines) {
  ParseOutcome outcome;
  outcome.diagnostics = {{"a.yaml", 1, 2, "one"}, {"a.yaml", 3, 4, "two"}};
  EXPECT_EQ(outcome.ErrorText(), "a.yaml:1:2: error: one\na.yaml:3:4: error: two");
  EXPECT_FALSE(outcome.ok());
  EXPECT_EQ(ParseOutcome{}.ErrorText(), "");
}

TEST(SpecManifest, QuickstartFromTheAnnouncement) {
  RunSpec spec = MustParse(ReadText(SpecDataDir() / "valid" / "manifest_quickstart.yaml"));
  EXPECT_EQ(spec.shape, Shape::kManifest);
  EXPECT_EQ(spec.name, "aks-gpu-quickstart");
  EXPECT_EQ(spec.entrypoint, "train.py");
  EXPECT_EQ(spec.kind, WorkloadKind::kRayJob);
  EXPECT_EQ(spec.compute.gpus, 1);
  EXPECT_EQ(spec.compute.workers, 1);
  EXPECT_EQ(spec.compute.cpus, Q("16"));
  EXPECT_EQ(spec.compute.memory, Q("64Gi"));
  EXPECT_EQ(spec.runtime.image, "mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0");
  EXPECT_EQ(spec.runtime.pip, std::vector<std::string>{"torch>=2.4.0"});
}

TEST(SpecManifest, Defaults) {
  RunSpec spec = MustParse(Manifest());
  EXPECT_EQ(spec.kind, WorkloadKind::kRayJob);
  EXPECT_EQ(spec.compute.workers, 1);
  EXPECT_EQ(spec.compute.gpus, 0);
  EXPECT_FALSE(spec.compute.cpus.has_value());
  EXPECT_FALSE(spec.compute.memory.has_value());
  EXPECT_TRUE(spec.args.empty());
  EXPECT_FALSE(spec.max_runtime_ms.has_value());
  EXPECT_FALSE(spec.ttl_seconds_after_finished.has_value());
  EXPECT_EQ(spec.resilience.max_retries, 0);
  EXPECT_TRUE(spec.resilience.retry_on.empty());
  EXPECT_FALSE(spec.resilience.retry_on_set);
  EXPECT_EQ(spec.resilience.backoff_initial_ms, 30'000);
  EXPECT_EQ(spec.resilience.backoff_max_ms, 300'000);
  EXPECT_FALSE(spec.resilience.max_retry_duration_ms.has_value());
  EXPECT_TRUE(spec.recorded_only.is_object());
  EXPECT_TRUE(spec.recorded_only.empty());
}

TEST(SpecManifest, EveryField) {
  RunSpec spec = MustParse(ReadText(SpecDataDir() / "valid" / "manifest_full.yaml"));
  EXPECT_EQ(spec.name, "full-manifest");
  EXPECT_EQ(spec.resource_prefix, "tau");
  EXPECT_EQ(spec.entrypoint, "src/train.py");  // "./" normalised away
  EXPECT_EQ(spec.kind, WorkloadKind::kJob);
  EXPECT_EQ(spec.args, (std::vector<std::string>{"--epochs", "3", "--fast", "true"}));
  EXPECT_EQ(spec.max_runtime_ms, 2 * 3'600'000 + 30 * 60'000);
  EXPECT_EQ(spec.ttl_seconds_after_finished, 3600);
  EXPECT_EQ(spec.compute.gpus, 8);
  EXPECT_EQ(spec.compute.workers, 2);
  EXPECT_EQ(spec.compute.cpus, Q("1500m"));
  EXPECT_EQ(spec.compute.memory, Q("64Gi"));
  EXPECT_EQ(spec.compute.worker_cpus, Q("32"));
  EXPECT_EQ(spec.compute.worker_memory, Q("256Gi"));
  EXPECT_EQ(spec.compute.gpu_resource_mode, "mig");
  EXPECT_EQ(spec.runtime.image, "ghcr.io/example/train:1.0");
  EXPECT_EQ(spec.runtime.pip, (std::vector<std::string>{"torch>=2.4.0", "numpy==2.*"}));
  ASSERT_EQ(spec.runtime.env.size(), 4u);
  EXPECT_EQ(spec.runtime.env[0].name, "LOG_LEVEL");
  EXPECT_EQ(spec.runtime.env[0].value, "debug");
  EXPECT_EQ(spec.runtime.env[1].value, "42");
  EXPECT_EQ(spec.runtime.env[2].value, "true");
  EXPECT_EQ(spec.runtime.env[3].name, "HF_TOKEN");
  EXPECT_EQ(spec.runtime.env[3].value, "hf-token");
  EXPECT_TRUE(spec.runtime.env[3].secret_ref);
  const Policy& p = spec.policy;
  EXPECT_EQ(p.workspace, "research");
  EXPECT_EQ(p.namespace_name, "ml-team");
  EXPECT_EQ(p.queue, "gpu-queue");
  EXPECT_EQ(p.profile, "training");
  EXPECT_EQ(p.lane, "batch");
  EXPECT_EQ(p.team, "vision");
  EXPECT_EQ(p.preset, "large");
  EXPECT_EQ(p.gpu_class, "h100-80gb");
  EXPECT_EQ(p.topology, "same-host");
  EXPECT_EQ(p.priority_tier, "priority");
  EXPECT_EQ(p.priority, "high-priority");
  EXPECT_TRUE(p.disable_default_priorities);
  EXPECT_EQ(p.node_selector,
            (std::map<std::string, std::string>{{"kubernetes.io/os", "linux"}, {"pool", "gpu"}}));
  const Storage& s = spec.storage;
  EXPECT_EQ(s.data_pvc, "datasets");
  EXPECT_EQ(s.output, "runs/out");
  EXPECT_EQ(s.publish, "staged");
  EXPECT_EQ(s.checkpoint, "ckpt/");
  ASSERT_EQ(s.image_assets.size(), 1u);
  EXPECT_EQ(s.image_assets[0].name, "weights");
  EXPECT_EQ(s.image_assets[0].image, "ghcr.io/example/weights:1");
  EXPECT_EQ(s.image_assets[0].source_path, "/weights");
  EXPECT_EQ(s.image_assets[0].mount_path, "/mnt/weights");
  const Resilience& r = spec.resilience;
  EXPECT_EQ(r.max_retries, 3);
  EXPECT_TRUE(r.retry_on_set);
  EXPECT_EQ(r.retry_on,
            (std::vector<std::string>{"Preempted", "Evicted", "NodeLost", "OOMKilled"}));
  EXPECT_EQ(r.backoff_initial_ms, 10'000);
  EXPECT_EQ(r.backoff_max_ms, 600'000);
  EXPECT_EQ(r.max_retry_duration_ms, 6 * 3'600'000);
  EXPECT_EQ(r.checkpoint_path, "/ckpt");
  EXPECT_EQ(spec.metrics.history, std::vector<std::string>{"metrics/*.jsonl"});
  EXPECT_TRUE(spec.metrics.offload_enabled);
  EXPECT_EQ(spec.metrics.offload_out, "s3://bucket/metrics");
  EXPECT_EQ(spec.experiment.project, "vision");
  EXPECT_EQ(spec.experiment.name, "resnet");
  EXPECT_EQ(spec.experiment.group, "sweep-1");
}

TEST(SpecManifest, RecordedOnlyFieldsAreKept) {
  RunSpec spec = MustParse(ReadText(SpecDataDir() / "valid" / "manifest_full.yaml"));
  const nlohmann::json& r = spec.recorded_only;
  EXPECT_EQ(r["artifacts"]["checkpoint"], "s3://bucket/ckpt");
  EXPECT_EQ(r["profiler"]["mode"], "torch");
  EXPECT_EQ(r["profiler"]["rank"], 0);
  EXPECT_EQ(r["profiler"]["warmup"], 5);
  EXPECT_EQ(r["profiler"]["duration"], 20);
  EXPECT_EQ(r["workflow"]["extra_scripts"], nlohmann::json::array({"prep.sh"}));
  EXPECT_EQ(r["workflow"]["upstream_checkpoint"], "runs/prev");
  EXPECT_EQ(r["run"]["smoke_pairs"], 4);
  EXPECT_EQ(r["eval"]["suite"], "mmlu");
  EXPECT_EQ(r["eval"]["shots"], nlohmann::json::array({0, 5}));
  // The secret payload itself is never recorded, only a digest of it.
  EXPECT_EQ(r["workflow"]["secret_payload"]["redacted"], true);
  EXPECT_EQ(r["workflow"]["secret_payload"]["sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(r.dump().find("c2VjcmV0"), std::string::npos);
}

TEST(SpecManifest, RecordedOnlyScalarTypes) {
  RunSpec spec = MustParse(Manifest("eval:\n  f: 1.5\n  b: false\n  s: '7'\n  n: [x, {y: z}]\n"));
  const nlohmann::json& eval = spec.recorded_only["eval"];
  EXPECT_EQ(eval["f"], "1.5");  // floats keep their spelling
  EXPECT_EQ(eval["b"], false);
  EXPECT_EQ(eval["s"], "7");  // quoted stays a string
  EXPECT_EQ(eval["n"][1]["y"], "z");
}

TEST(SpecManifest, WorkloadKinds) {
  EXPECT_EQ(MustParse(Manifest()).kind, WorkloadKind::kRayJob);
  RunSpec job = MustParse(
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\n  workload_kind: job\n");
  EXPECT_EQ(job.kind, WorkloadKind::kJob);
  RunSpec ray = MustParse(
      "schema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\n  workload_kind: rayjob\n");
  EXPECT_EQ(ray.kind, WorkloadKind::kRayJob);
}

TEST(SpecDirect, PublicKindExample) {
  RunSpec spec = MustParse(ReadText(SpecDataDir() / "valid" / "direct_kind_ray.yaml"));
  EXPECT_EQ(spec.shape, Shape::kDirect);
  EXPECT_EQ(spec.name, "tau-kind-ray");
  EXPECT_EQ(spec.kind, WorkloadKind::kRayJob);
  EXPECT_EQ(spec.entrypoint, "ray_train.py");
  EXPECT_EQ(spec.runtime.image, "mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.54.0");
  ASSERT_EQ(spec.runtime.env.size(), 1u);
  EXPECT_EQ(spec.runtime.env[0].name, "KIND_RAY_MARKER");
  EXPECT_EQ(spec.runtime.env[0].value, "tau-kind-ray");
  EXPECT_FALSE(spec.runtime.env[0].secret_ref);
  EXPECT_EQ(spec.compute.workers, 2);
  EXPECT_EQ(spec.compute.gpus, 0);
  EXPECT_EQ(spec.compute.head_cpus, Q("20m"));
  EXPECT_EQ(spec.compute.head_memory, Q("512Mi"));
  EXPECT_EQ(spec.compute.worker_cpus, Q("50m"));
  EXPECT_EQ(spec.compute.worker_memory, Q("256Mi"));
  EXPECT_EQ(spec.compute.worker_memory_limit, Q("768Mi"));
  EXPECT_EQ(spec.policy.namespace_name, "ray");
  EXPECT_EQ(spec.policy.queue, "kind-cpu");
  EXPECT_EQ(spec.experiment.project, "Tau Local");
  EXPECT_EQ(spec.experiment.name, "kind-ray-smoke");
}

TEST(SpecDirect, EveryField) {
  RunSpec spec = MustParse(ReadText(SpecDataDir() / "valid" / "direct_full.yaml"));
  EXPECT_EQ(spec.name, "full-direct");
  EXPECT_EQ(spec.kind, WorkloadKind::kJob);
  EXPECT_EQ(spec.entrypoint, "train.py");                    // from the `script` alias
  EXPECT_EQ(spec.runtime.image, "ghcr.io/example/train:2");  // runtime.image beats top-level image
  EXPECT_EQ(spec.ttl_seconds_after_finished, 28800);
  EXPECT_EQ(spec.source.image, "ghcr.io/example/code:1");
  EXPECT_EQ(spec.source.path, "/code");
  EXPECT_EQ(spec.args, (std::vector<std::string>{"--lr", "0.001"}));
  EXPECT_EQ(spec.max_runtime_ms, 45 * 60'000);
  EXPECT_EQ(spec.runtime.working_dir, "/workspace");
  EXPECT_EQ(spec.runtime.pip, std::vector<std::string>{"transformers"});
  ASSERT_EQ(spec.runtime.env.size(), 2u);
  EXPECT_EQ(spec.runtime.env[0].value, "1");
  EXPECT_TRUE(spec.runtime.env[1].secret_ref);
  EXPECT_EQ(spec.runtime.env[1].value, "token");
  EXPECT_EQ(spec.runtime.security_mode, "restricted");
  const Compute& c = spec.compute;
  EXPECT_EQ(c.workers, 1);
  EXPECT_EQ(c.gpus, 4);
  EXPECT_EQ(c.cpus, Q("8"));
  EXPECT_EQ(c.memory, Q("32Gi"));
  EXPECT_EQ(c.head_cpus, Q("1"));
  EXPECT_EQ(c.head_memory, Q("2Gi"));
  EXPECT_EQ(c.head_cpu_limit, Q("2"));
  EXPECT_EQ(c.head_memory_limit, Q("4Gi"));
  EXPECT_EQ(c.worker_cpus, Q("8"));
  EXPECT_EQ(c.worker_memory, Q("32Gi"));
  EXPECT_EQ(c.worker_cpu_limit, Q("16"));
  EXPECT_EQ(c.worker_memory_limit, Q("64Gi"));
  EXPECT_EQ(c.gpu_resource_mode, "full");
  const Policy& p = spec.policy;
  EXPECT_EQ(p.workspace, "ws");
  EXPECT_EQ(p.namespace_name, "default");
  EXPECT_EQ(p.queue, "jobqueue");
  EXPECT_EQ(p.profile, "p");
  EXPECT_EQ(p.lane, "l");
  EXPECT_EQ(p.team, "t");
  EXPECT_EQ(p.preset, "s");
  EXPECT_EQ(p.gpu_class, "a100-80gb");
  EXPECT_EQ(p.topology, "same-site");
  EXPECT_EQ(p.priority_tier, "default");
  EXPECT_EQ(p.priority, "low");
  EXPECT_FALSE(p.disable_default_priorities);
  EXPECT_EQ(p.node_selector, (std::map<std::string, std::string>{{"zone", "west"}}));
  EXPECT_EQ(spec.storage.data_pvc, "data");
  EXPECT_EQ(spec.storage.output, "out");
  EXPECT_EQ(spec.storage.publish, "staged");
  EXPECT_EQ(spec.storage.checkpoint, "ckpt");
  ASSERT_EQ(spec.storage.image_assets.size(), 1u);
  EXPECT_EQ(spec.storage.image_assets[0].name, "tok");
  EXPECT_EQ(spec.storage.image_assets[0].mount_path, "/tok");
  EXPECT_EQ(spec.storage.image_assets[0].source_path, "");
  EXPECT_EQ(spec.metrics.history, (std::vector<std::string>{"train.jsonl", "eval/*.jsonl"}));
  EXPECT_FALSE(spec.metrics.offload_enabled);
  EXPECT_EQ(spec.metrics.offload_out, "x");
  EXPECT_EQ(spec.resilience.max_retries, 0);
  EXPECT_TRUE(spec.resilience.retry_on_set);  // an explicit empty list: retry nothing
  EXPECT_TRUE(spec.resilience.retry_on.empty());
  EXPECT_EQ(spec.resilience.backoff_initial_ms, 0);
  EXPECT_EQ(spec.resilience.backoff_max_ms, 60'000);
  EXPECT_EQ(spec.resilience.checkpoint_path, "ckpt");
  EXPECT_EQ(spec.experiment.project, "p");
  EXPECT_EQ(spec.experiment.name, "n");
  EXPECT_EQ(spec.experiment.group, "g");
}

TEST(SpecDirect, RayWorkingDirIsRecorded) {
  RunSpec spec = MustParse(ReadText(SpecDataDir() / "valid" / "direct_ray_multi.yaml"));
  EXPECT_EQ(spec.recorded_only["run"]["working_dir"], ".");
  EXPECT_EQ(spec.compute.workers, 16);
  EXPECT_EQ(spec.compute.gpus, 8);
  EXPECT_EQ(spec.policy.gpu_class, "gb200-192gb");
}

TEST(SpecDirect, TopLevelImageIsTheLowestPriorityAlias) {
  EXPECT_EQ(MustParse(Direct("image: base:1\n")).runtime.image, "base:1");
  EXPECT_EQ(MustParse(Direct("image: base:1\nruntime:\n  image: real:2\n")).runtime.image,
            "real:2");
  EXPECT_EQ(MustParse(Direct("runtime:\n  image: real:2\nimage: base:1\n")).runtime.image,
            "real:2");
}

TEST(SpecDirect, ScriptIsAnAliasOfEntrypoint) {
  EXPECT_EQ(MustParse("name: a\nengine: job\nscript: run.sh\n").entrypoint, "run.sh");
  std::string errors = Errors("name: a\nengine: job\nscript: a.py\nentrypoint: b.py\n");
  EXPECT_NE(errors.find("tau.yaml:4:1: error: both 'script' and 'entrypoint' are set"),
            std::string::npos)
      << errors;
}

// Direct shape: gpus and gpus_per_worker both mean GPUs per worker (like the manifest's
// compute.gpus).
TEST(SpecDirect, GpusAndGpusPerWorker) {
  EXPECT_EQ(MustParse(Direct("compute:\n  gpus: 2\n")).compute.gpus, 2);
  EXPECT_EQ(MustParse(Direct("compute:\n  gpus_per_worker: 3\n")).compute.gpus, 3);
  RunSpec both =
      MustParse(Direct("compute:\n  workers: 4\n  gpus: 8\n  gpus_per_worker: 8\n", "rayjob"));
  EXPECT_EQ(both.compute.gpus, 8);
  EXPECT_EQ(both.compute.workers, 4);
  std::string errors = Errors(Direct("compute:\n  gpus_per_worker: 2\n  gpus: 4\n"));
  EXPECT_NE(errors.find("tau.yaml:6:3: error: compute.gpus (4) and compute.gpus_per_worker (2) "
                        "disagree"),
            std::string::npos)
      << errors;
  EXPECT_EQ(MustParse(Direct()).compute.gpus, 0);
}

TEST(SpecDirect, EngineSpecificFields) {
  MustParse(Direct("run:\n  source:\n    image: code:1\n    path: /src\n", "job"));
  MustParse(Direct("runtime:\n  working_dir: /w\n", "job"));
  MustParse(Direct("run:\n  working_dir: ./proj\n", "rayjob"));
  EXPECT_NE(Errors(Direct("run:\n  source:\n    image: code:1\n", "rayjob"))
                .find("tau.yaml:5:3: error: run.source is only for engine: job"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("runtime:\n  working_dir: /w\n", "rayjob"))
                .find("tau.yaml:5:3: error: runtime.working_dir is only for engine: job"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("run:\n  working_dir: .\n", "job"))
                .find("tau.yaml:5:3: error: run.working_dir is only for engine: rayjob"),
            std::string::npos);
}

TEST(SpecDirect, EngineOrder) {
  // The shape marker need not come first.
  RunSpec spec = MustParse("entrypoint: a.py\nname: late\nengine: job\n");
  EXPECT_EQ(spec.shape, Shape::kDirect);
  EXPECT_EQ(spec.kind, WorkloadKind::kJob);
}

TEST(SpecValidCorpus, EveryFileParses) {
  std::filesystem::path dir = SpecDataDir() / "valid";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  int files = 0, manifest = 0, direct = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    ParseOutcome outcome = ParseSpec(ReadText(entry.path()), entry.path().filename().string());
    EXPECT_TRUE(outcome.ok()) << entry.path() << "\n" << outcome.ErrorText();
    if (outcome.ok()) (outcome.spec->shape == Shape::kManifest ? manifest : direct)++;
  }
  EXPECT_GE(files, 8);
  EXPECT_GE(manifest, 3);
  EXPECT_GE(direct, 3);
}

}  // namespace
}  // namespace tau::spec
