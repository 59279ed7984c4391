// The Kubernetes backend end to end inside one process: the controller with a KubeCluster against
// the fake API server (src/testing/fake_apiserver.h), over real HTTP. The test plays Kueue (it
// makes the Workload, reserves quota, unsuspends the Job, preempts) and the kubelet (it makes the
// pods, writes their logs, ends them) with plain API calls, as those controllers would.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "backend/kube/kube_backend.h"
#include "backend/kube/kube_cluster.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/layout.h"
#include "common/strings.h"
#include "controller/controller.h"
#include "evidence/evidence.h"
#include "kubeapi/kubeapi.h"
#include "store/store.h"
#include "testing/controller_test_util.h"
#include "testing/fake_apiserver.h"

namespace tau::server {
namespace {

using nlohmann::json;
using store::RunState;

const char* kSpec = R"(schema_version: 1
name: k8s-train
run:
  entrypoint: train.py
  workload_kind: job
compute:
  gpus: 0
  workers: 1
  cpus: 1
  memory: 1Gi
runtime:
  image: python:3.12
)";

std::string WithResilience(const std::string& retry_on, int max_retries) {
  return std::string(kSpec) +
         fmt::format("resilience:\n  max_retries: {}\n  backoff_initial: 0s\n  retry_on: [{}]\n",
                     max_retries, retry_on);
}

class KubeBackendTest : public testutil::ControllerFixture {
 protected:
  void SetUp() override {
    ControllerFixture::SetUp();
    // The Kueue and KubeRay objects tau writes are checked against the CRDs, as a cluster would.
    const char* src = std::getenv("TAU_SOURCE_DIR");
    ASSERT_TRUE(fake_
                    .LoadCrds(std::string(src != nullptr ? src : TAU_TEST_SOURCE_DIR) +
                              "/tests/data/kube/schemas")
                    .ok());
    ASSERT_TRUE(fake_.Start().ok());
    kube_ = NewClient();
    cluster_client_ = NewClient();
    StartController();
  }

  std::unique_ptr<kubeapi::Client> NewClient() {
    kubeapi::ClusterConfig config;
    config.server = fake_.url();
    kubeapi::ClientOptions options;
    options.max_attempts = 2;
    options.initial_backoff_ms = 20;
    auto client = kubeapi::Client::Create(config, options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

  void StartController() {
    KubeClusterOptions kopts;
    kopts.resync_ms = 500;
    kopts.watch_timeout_seconds = 5;
    kopts.driver_log_poll_ms = 100;
    kopts.check_access = check_access_;
    kopts.installation = installation_;
    cluster_ = NewKubeCluster(cluster_client_.get(), kopts);
    ControllerOptions options = Options();
    options.default_platform_size = default_size_;
    backend_ = NewKubeBackend(cluster_.get());
    options.backend = backend_.get();
    ControllerFixture::StartController(options);
  }
  void StopController() override {
    ControllerFixture::StopController();
    backend_.reset();
    cluster_.reset();
  }

  std::string Submit(const std::string& yaml, std::vector<CodeFile> code = {}) {
    if (code.empty()) code.push_back({"train.py", 0644, "print('hello from the cluster')\n"});
    return SubmitYaml(yaml, std::move(code));
  }

  // Waits up to 10 s for `done`; false when it never held.
  bool WaitFor(const std::function<bool()>& done) {
    int64_t deadline = MonotonicMillis() + 10'000;
    while (MonotonicMillis() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  }
  bool WaitForState(const std::string& name, RunState state) {
    bool ok = WaitFor([&] { return Run(name).state == state; });
    EXPECT_TRUE(ok) << name << " is " << store::RunStateName(Run(name).state) << " ("
                    << Run(name).message << "), expected " << store::RunStateName(state);
    return ok;
  }

  int Position(const std::string& run) {
    json p = controller_->PendingInfo(run);
    return p.is_object() && p.contains("position") && p["position"].is_number_integer()
               ? p["position"].get<int>()
               : 0;
  }
  std::string JobName(const std::string& run, int attempt) {
    return fmt::format("{}-{}", run, attempt);
  }
  json Job(const std::string& run, int attempt) {
    return fake_.Object("batch/v1/jobs", "default", JobName(run, attempt));
  }
  bool WaitForJob(const std::string& run, int attempt) {
    bool ok = WaitFor([&] { return !Job(run, attempt).is_null(); });
    if (!ok) {
      std::string events;
      for (const store::Event& e : Events(run)) events += "\n  " + e.type + ": " + e.message;
      ADD_FAILURE() << "no Job " << JobName(run, attempt) << "; the run is "
                    << store::RunStateName(Run(run).state) << events
                    << "\n  pending: " << controller_->PendingInfo(run).dump();
      for (const auto& req : fake_.Requests())
        if (req.method != "GET") ADD_FAILURE() << req.method << " " << req.path;
      auto jobs = kube_->List("batch/v1", "Job", "");
      if (!jobs.ok()) ADD_FAILURE() << jobs.status().ToString();
      if (jobs.ok())
        for (const json& j : jobs->items) ADD_FAILURE() << "there is " << j["metadata"].dump();
    }
    return ok;
  }

  // A run whose first Job Kueue admitted.
  std::string AdmittedRun() {
    std::string name = Submit(kSpec);
    EXPECT_TRUE(WaitForJob(name, 1));
    MakeWorkload(name, 1);
    Admit(name, 1);
    WaitForState(name, RunState::kAdmitted);
    return name;
  }

  // ---- Kueue's part ----
  std::string WorkloadName(const std::string& run, int attempt) {
    return "job-" + JobName(run, attempt) + "-1a2b3";
  }
  void MakeWorkload(const std::string& run, int attempt, int priority = 0) {
    json job = Job(run, attempt);
    json owner = {{"apiVersion", "batch/v1"},
                  {"kind", "Job"},
                  {"name", JobName(run, attempt)},
                  {"uid", job["metadata"]["uid"]},
                  {"controller", true}};
    json pending = {{"type", "QuotaReserved"},
                    {"status", "False"},
                    {"reason", "Pending"},
                    {"message",
                     "couldn't assign flavors to pod set main: insufficient unused quota for cpu "
                     "in flavor default, 1 more needed"}};
    json wl = {{"apiVersion", "kueue.x-k8s.io/v1beta2"}, {"kind", "Workload"}};
    wl["metadata"] = {{"name", WorkloadName(run, attempt)},
                      {"namespace", "default"},
                      {"ownerReferences", json::array({owner})}};
    wl["spec"] = {{"queueName", "default"}, {"priority", priority}};
    wl["status"] = {{"conditions", json::array({pending})}};
    auto created_wl = kube_->Create(wl);
    ASSERT_TRUE(created_wl.ok()) << created_wl.status().ToString();
  }
  void SetWorkloadStatus(const std::string& run, int attempt, const json& status) {
    auto patched = kube_->MergePatch("kueue.x-k8s.io/v1beta2", "Workload", "default",
                                     WorkloadName(run, attempt), {{"status", status}}, "status");
    ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  }
  void Admit(const std::string& run, int attempt) {
    SetWorkloadStatus(
        run, attempt,
        {{"conditions",
          {{{"type", "QuotaReserved"}, {"status", "True"}, {"reason", "QuotaReserved"}},
           {{"type", "Admitted"}, {"status", "True"}, {"reason", "Admitted"}}}},
         {"admission",
          {{"clusterQueue", "default"},
           {"podSetAssignments",
            {{{"name", "main"}, {"flavors", {{"cpu", "default"}, {"memory", "default"}}}}}}}}});
    auto unsuspended = kube_->MergePatch("batch/v1", "Job", "default", JobName(run, attempt),
                                         {{"spec", {{"suspend", false}}}});
    ASSERT_TRUE(unsuspended.ok()) << unsuspended.status().ToString();
  }

  // Kueue admits the run's first RayJob (`rayjob`: as tau created it).
  void AdmitRayJob(const std::string& run, json* rayjob) {
    ASSERT_TRUE(WaitFor([&] {
      *rayjob = fake_.Object("ray.io/v1/rayjobs", "default", JobName(run, 1));
      return !rayjob->is_null();
    }));
    json owner = {{"apiVersion", "ray.io/v1"},
                  {"kind", "RayJob"},
                  {"name", JobName(run, 1)},
                  {"uid", (*rayjob)["metadata"]["uid"]}};
    json wl = {{"apiVersion", "kueue.x-k8s.io/v1beta2"},
               {"kind", "Workload"},
               {"metadata",
                {{"name", "rayjob-" + JobName(run, 1)},
                 {"namespace", "default"},
                 {"ownerReferences", json::array({owner})}}},
               {"spec", {{"queueName", "default"}}}};
    ASSERT_TRUE(kube_->Create(wl).ok());
    ASSERT_TRUE(kube_
                    ->MergePatch("kueue.x-k8s.io/v1beta2", "Workload", "default",
                                 "rayjob-" + JobName(run, 1),
                                 {{"status",
                                   {{"conditions",
                                     {{{"type", "QuotaReserved"}, {"status", "True"}},
                                      {{"type", "Admitted"}, {"status", "True"}}}},
                                    {"admission", {{"clusterQueue", "default"}}}}}},
                                 "status")
                    .ok());
  }

  // ---- the kubelet's part ----
  std::string PodName(const std::string& run, int attempt) {
    return JobName(run, attempt) + "-x7k";
  }
  // A pod of the attempt as the Job controller makes it, with the kubelet's `status`.
  void CreatePod(const std::string& run, int attempt, json spec, json status) {
    json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata",
         {{"name", PodName(run, attempt)},
          {"namespace", "default"},
          {"labels", {{"tau.dev/run", run}, {"tau.dev/attempt", std::to_string(attempt)}}}}},
        {"spec", std::move(spec)},
        {"status", std::move(status)}};
    auto created = kube_->Create(pod);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
  }
  void StartPod(const std::string& run, int attempt) {
    CreatePod(run, attempt, {{"containers", {{{"name", "worker"}, {"image", "python:3.12"}}}}},
              {{"phase", "Running"}});
  }
  void SetPodStatus(const std::string& run, int attempt, const json& status) {
    auto patched = kube_->MergePatch("v1", "Pod", "default", PodName(run, attempt),
                                     {{"status", status}}, "status");
    ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  }
  // The kubelet: the init container that installs the run's packages failed with pip's error; the
  // worker container never started, so its log cannot be read (the API server answers 400). Then
  // the Job controller: the Job failed.
  void FailSetup(const std::string& run, int attempt) {
    fake_.AppendLog("default", PodName(run, attempt),
                    "ERROR: No matching distribution found for torch==9.9\n", "tau-setup");
    fake_.EndLog("default", PodName(run, attempt), "tau-setup");
    CreatePod(
        run, attempt,
        {{"initContainers", {{{"name", "tau-setup"}, {"image", "python:3.12"}}}},
         {"containers", {{{"name", "worker"}, {"image", "python:3.12"}}}}},
        {{"phase", "Failed"},
         {"initContainerStatuses",
          {{{"name", "tau-setup"},
            {"state", {{"terminated", {{"exitCode", 1}, {"reason", "Error"}}}}}}}},
         {"containerStatuses",
          {{{"name", "worker"}, {"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}}}});
    SetJobCondition(run, attempt, "Failed", "BackoffLimitExceeded");
  }
  // pip's error is the rank's log, read from the setup container.
  void ExpectPipsErrorKept(const std::string& run) {
    ASSERT_TRUE(WaitFor([&] {
      return Log(run, 1) == "ERROR: No matching distribution found for torch==9.9\n";
    })) << Log(run, 1);
    bool asked = false;
    for (const auto& req : fake_.Requests())
      asked |= req.path == "/api/v1/namespaces/default/pods/" + PodName(run, 1) + "/log" &&
               req.params.count("container") && req.params.at("container") == "tau-setup";
    EXPECT_TRUE(asked);
  }
  // How often tau listed the attempt's pods (not the watch's list of all of them).
  int PodListsOf(const std::string& run, int attempt) {
    int lists = 0;
    for (const auto& req : fake_.Requests())
      lists += req.method == "GET" && req.path == "/api/v1/namespaces/default/pods" &&
               !req.params.count("watch") && req.params.count("labelSelector") &&
               req.params.at("labelSelector") ==
                   fmt::format("tau.dev/run={},tau.dev/attempt={}", run, attempt);
    return lists;
  }
  void SetJobCondition(const std::string& run, int attempt, const std::string& type,
                       const std::string& reason) {
    auto patched = kube_->MergePatch(
        "batch/v1", "Job", "default", JobName(run, attempt),
        {{"status", {{"conditions", {{{"type", type}, {"status", "True"}, {"reason", reason}}}}}}},
        "status");
    ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  }
  // The steps of metric `metric` in the run's evidence (what the evidence worker collected).
  std::vector<int64_t> EvidenceSteps(const std::string& run, const std::string& metric) {
    std::vector<int64_t> steps;
    auto history =
        evidence::LoadMetricHistory(layout::MetricsFile(layout::EvidenceDir(home_, run)));
    if (history.ok())
      for (const auto& p : history->Series(metric, "")) steps.push_back(p.step);
    return steps;
  }
  // The kubelet and the Job controller: the worker exited 0, the Job is Complete.
  void Succeed(const std::string& run, int attempt) {
    SetPodStatus(run, attempt,
                 {{"phase", "Succeeded"},
                  {"containerStatuses",
                   {{{"name", "worker"}, {"state", {{"terminated", {{"exitCode", 0}}}}}}}}});
    SetJobCondition(run, attempt, "Complete", "Completed");
  }
  std::string Log(const std::string& run, int attempt) {
    auto text =
        ReadFile(fmt::format("{}/runs/{}/attempts/{}/logs/rank-0.log", home_, run, attempt));
    return text.ok() ? *text : "";
  }
  testutil::FakeApiServer fake_;
  std::unique_ptr<kubeapi::Client> kube_;            // the test: Kueue and the kubelet
  std::unique_ptr<kubeapi::Client> cluster_client_;  // tau's
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Backend> backend_;
  bool check_access_ = false;
  std::string installation_;
  std::optional<ControllerOptions::DefaultSize> default_size_;
};

// The object names come from the run's name, whose random part is drawn after the checks: a
// spec name that leaves no room for it is refused at submission, not when the attempt renders.
TEST_F(KubeBackendTest, ANameWithNoRoomForTheRunsSuffixIsRefusedAtSubmission) {
  std::string spec = kSpec;
  const std::string long_name(38, 'a');  // 38 + "-" + 8 hex + "-1": 49 > 47 characters
  spec.replace(spec.find("name: k8s-train"), std::string("name: k8s-train").size(),
               "name: " + long_name);
  server::SubmitRequest request;
  request.spec_file = "tau.yaml";
  request.spec_yaml = spec;
  request.code.push_back({"train.py", 0644, "print('hi')\n"});
  request.caller.user = "alice";
  server::SubmitError error;
  auto r = controller_->Submit(std::move(request), &error);
  ASSERT_FALSE(r.ok()) << "made " << r->run.name;
  EXPECT_NE(r.status().message().find("would be named"), std::string::npos) << r.status().message();
}

TEST_F(KubeBackendTest, RunGoesThroughKueueAndKeepsItsLogs) {
  std::string name = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(name, 1));
  json job = Job(name, 1);
  EXPECT_EQ(job["spec"]["suspend"], true) << "created suspended, for Kueue to admit";
  EXPECT_EQ(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "default");
  EXPECT_EQ(Run(name).state, RunState::kQueued);
  // Before Kueue has a Workload for it, tau says what it waits for.
  ASSERT_TRUE(WaitFor([&] {
    return controller_->PendingInfo(name).value("code", "") == "WaitingForKueue";
  })) << controller_->PendingInfo(name).dump();

  MakeWorkload(name, 1);
  ASSERT_TRUE(WaitFor([&] {
    return controller_->PendingInfo(name).value("code", "") == "Pending";
  })) << controller_->PendingInfo(name).dump();
  json pending = controller_->PendingInfo(name);
  EXPECT_NE(pending.value("reason", "").find("insufficient unused quota for cpu"),
            std::string::npos)
      << pending.dump();
  EXPECT_EQ(pending["position"], 1);

  Admit(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kAdmitted));
  EXPECT_EQ(Run(name).flavors["main"]["cpu"], "default");
  // `tau queues` counts it against the queue's quota, as Kueue admitted it.
  auto cpu_used = [&] {
    json queues = controller_->Queues();
    if (!queues.contains("queues")) return std::string();
    for (const json& q : queues["queues"])
      if (q.value("name", "") == "default" && q.value("admitted", 0) == 1)
        for (const json& u : q["usage"])
          if (u.value("resource", "") == "cpu") return u.value("usage", "");
    return std::string();
  };
  ASSERT_TRUE(WaitFor([&] { return cpu_used() == "1"; })) << controller_->Queues().dump();

  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  fake_.AppendLog("default", PodName(name, 1), "step 1 loss 0.5\n");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "step 1 loss 0.5\n"; })) << Log(name, 1);
  // The stream is cut while the pod runs on: followed again, nothing lost or kept twice.
  fake_.CutLogStreams();
  fake_.AppendLog("default", PodName(name, 1), "step 2 loss 0.25\n");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "step 1 loss 0.5\nstep 2 loss 0.25\n"; }))
      << Log(name, 1);

  fake_.EndLog("default", PodName(name, 1));
  Succeed(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kSucceeded));
  EXPECT_EQ(Run(name).exit_code, 0);
  // The pod may go; the log stays with the run.
  ASSERT_TRUE(kube_->Delete("v1", "Pod", "default", PodName(name, 1)).ok());
  EXPECT_EQ(Log(name, 1), "step 1 loss 0.5\nstep 2 loss 0.25\n");
  auto attempts = store_->ListAttempts(name);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 1u);
  EXPECT_EQ(attempts->front().reason, "Succeeded");
  // The evidence record hashes the kept log, and claims nothing about this machine for the run.
  json record;
  ASSERT_TRUE(WaitFor([&] {
    auto r = controller_->EvidenceRecord(name);
    if (r.ok()) record = *r;
    return r.ok() && record["attempts"].size() == 1 && !record["attempts"][0]["logs"].empty();
  })) << record.dump();
  EXPECT_EQ(record["runtime"]["host"], "kubernetes");
  EXPECT_EQ(record["runtime"]["kernel"], "");
  EXPECT_EQ(record["runtime"]["image"], "python:3.12");
  EXPECT_EQ(record["attempts"][0]["logs"][0]["size"], 33);
}

TEST_F(KubeBackendTest, EvictedPodIsRetriedAsANewJobAndOomIsNot) {
  std::string name = Submit(WithResilience("Evicted", 1));
  ASSERT_TRUE(WaitForJob(name, 1));
  MakeWorkload(name, 1);
  Admit(name, 1);
  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  SetPodStatus(name, 1,
               {{"phase", "Failed"},
                {"reason", "Evicted"},
                {"message", "The node was low on resource: memory."}});
  SetJobCondition(name, 1, "Failed", "BackoffLimitExceeded");
  // Attempt 1 ends Evicted; the retry is a Job of its own, queued for Kueue again.
  ASSERT_TRUE(WaitForJob(name, 2));
  EXPECT_EQ(Job(name, 2)["spec"]["suspend"], true);
  auto attempts = store_->ListAttempts(name);
  ASSERT_TRUE(attempts.ok());
  ASSERT_GE(attempts->size(), 1u);
  EXPECT_EQ(attempts->front().reason, "Evicted");
  EXPECT_NE(attempts->front().message.find("low on resource"), std::string::npos);

  // Attempt 2 is OOM-killed: not in retry_on, so the run fails with that class.
  MakeWorkload(name, 2);
  Admit(name, 2);
  StartPod(name, 2);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  SetPodStatus(name, 2,
               {{"phase", "Failed"},
                {"containerStatuses",
                 {{{"name", "worker"},
                   {"state", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}});
  SetJobCondition(name, 2, "Failed", "BackoffLimitExceeded");
  ASSERT_TRUE(WaitForState(name, RunState::kFailed));
  EXPECT_EQ(Run(name).reason, "OOMKilled");
  EXPECT_EQ(Run(name).exit_code, 137);
  EXPECT_TRUE(Job(name, 3).is_null()) << "no third attempt";
}

TEST_F(KubeBackendTest, AStalledRunIsMarkedFromItsKeptLogsThenStoppedAndItsJobDeleted) {
  // Quiet for 3 s: marked Stalled; for 5 s: stopped as Stalled (not retried by default). The
  // limits leave room for a slow machine (the output is measured once a second, and the kept log
  // follows the pod's within a poll).
  std::string name = Submit(std::string(kSpec) +
                            "policy:\n  guardrails:\n    stall: {after: 3s, stop_after: 5s}\n");
  ASSERT_TRUE(WaitForJob(name, 1));
  MakeWorkload(name, 1);
  Admit(name, 1);
  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  // Output every 300 ms for 6 s, longer than stop_after: the kept log grows, so it runs on.
  const int64_t writing_until = MonotonicMillis() + 6000;
  for (int step = 1; MonotonicMillis() < writing_until; ++step) {
    fake_.AppendLog("default", PodName(name, 1), fmt::format("step {} loss 0.5\n", step));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  ASSERT_NE(Log(name, 1).find("step 5 loss"), std::string::npos) << Log(name, 1);
  EXPECT_EQ(Run(name).state, RunState::kRunning) << Run(name).message;
  const std::vector<std::string> early = EventTypes(name);
  EXPECT_EQ(std::count(early.begin(), early.end(), "StallDetected"), 0);
  // Then quiet: marked, then stopped (after 5 s; up to 30 s allowed).
  const int64_t deadline = MonotonicMillis() + 30'000;
  while (Run(name).state != RunState::kFailed && MonotonicMillis() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(Run(name).state, RunState::kFailed) << Run(name).message;
  EXPECT_EQ(Run(name).reason, "Stalled");
  const std::vector<std::string> types = EventTypes(name);
  const auto detected = std::find(types.begin(), types.end(), "StallDetected");
  ASSERT_NE(detected, types.end());
  // The stop is an event of its own, a guardrail webhook's kind, after the mark.
  EXPECT_NE(std::find(detected, types.end(), "Stalled"), types.end());
  for (const store::Event& e : Events(name)) {
    if (e.type != "StallDetected") continue;
    EXPECT_NE(e.message.find("this backend cannot dump stacks"), std::string::npos) << e.message;
  }
  std::vector<store::AttemptRecord> attempts = Attempts(name);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].reason, "Stalled");
  EXPECT_EQ(attempts[0].outcome, "Stopped");
  EXPECT_NE(attempts[0].message.find("the run's policy.guardrails.stall.stop_after"),
            std::string::npos)
      << attempts[0].message;
  // Its Job goes (a Foreground delete takes its pods with it).
  EXPECT_TRUE(WaitFor([&] { return Job(name, 1).is_null(); })) << Job(name, 1).dump();
  EXPECT_TRUE(Job(name, 2).is_null()) << "Stalled is not retried by default";
}

TEST_F(KubeBackendTest, KueuePreemptionRequeuesWithAFreshJob) {
  std::string name = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(name, 1));
  MakeWorkload(name, 1);
  Admit(name, 1);
  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  SetWorkloadStatus(name, 1,
                    {{"conditions",
                      {{{"type", "QuotaReserved"}, {"status", "False"}, {"reason", "Preempted"}},
                       {{"type", "Admitted"}, {"status", "False"}, {"reason", "Preempted"}},
                       {{"type", "Evicted"},
                        {"status", "True"},
                        {"reason", "Preempted"},
                        {"message",
                         "Preempted to accommodate a workload (UID: u-9) due to prioritization in "
                         "the ClusterQueue"}}}}});
  ASSERT_TRUE(WaitForJob(name, 2));
  EXPECT_TRUE(Job(name, 1).is_null()) << "the preempted attempt's Job is deleted";
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kQueued);
  EXPECT_EQ(r.preemptions, 1);
  auto attempts = store_->ListAttempts(name);
  ASSERT_TRUE(attempts.ok());
  EXPECT_EQ(attempts->front().reason, "Preempted");
  EXPECT_NE(attempts->front().message.find("prioritization"), std::string::npos);
}

TEST_F(KubeBackendTest, CancelDeletesTheJobAndPendingRunsKnowTheirPlace) {
  std::string first = Submit(kSpec);
  std::string second = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(first, 1));
  ASSERT_TRUE(WaitForJob(second, 1));
  // The API server stamps creationTimestamp to the second: priority orders these two.
  MakeWorkload(first, 1, 10);
  MakeWorkload(second, 1, 0);
  ASSERT_TRUE(WaitFor([&] { return Position(second) == 2; }))
      << controller_->PendingInfo(second).dump();
  EXPECT_EQ(Position(first), 1);

  ASSERT_TRUE(controller_->Cancel(first).ok());
  ASSERT_TRUE(WaitForState(first, RunState::kCancelled));
  EXPECT_TRUE(Job(first, 1).is_null()) << "deleting the Job frees its quota in Kueue";
  // Kueue would delete the Workload with its owner; the fake has no garbage collector.
  ASSERT_TRUE(
      kube_->Delete("kueue.x-k8s.io/v1beta2", "Workload", "default", WorkloadName(first, 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return Position(second) == 1; }))
      << controller_->PendingInfo(second).dump();
}

TEST_F(KubeBackendTest, CancelBeforeTheWatchSawTheJobDeletesItOnce) {
  // The watches have not delivered the Job yet: the delete finds it by listing, whose items carry
  // no apiVersion or kind in the API's JSON. It must still be deleted, once, and said once.
  fake_.PauseWatches(true);
  std::string name = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(name, 1));
  ASSERT_TRUE(controller_->Cancel(name).ok());
  ASSERT_TRUE(WaitForState(name, RunState::kCancelled));
  EXPECT_TRUE(Job(name, 1).is_null());
  fake_.PauseWatches(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int requested = 0;
  for (const store::Event& e : Events(name)) requested += e.type == "CancelRequested";
  EXPECT_EQ(requested, 1);
  EXPECT_EQ(Run(name).state, RunState::kCancelled);
}

TEST_F(KubeBackendTest, ACancelWhoseDeleteFailsIsToldOnceAndTriedAgain) {
  std::string name = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(name, 1));
  fake_.InjectFailures(1000, 500, 0);
  ASSERT_TRUE(controller_->Cancel(name).ok());
  // Tried (2 tries a call here) and told once, while the run stays cancel-requested.
  ASSERT_TRUE(WaitFor([&] {
    int failed = 0;
    for (const store::Event& e : Events(name))
      failed += e.type == "CancelRequested" && e.message.find("failed") != std::string::npos;
    return failed == 1;
  }));
  EXPECT_NE(Run(name).state, RunState::kCancelled);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  int failed = 0;
  for (const store::Event& e : Events(name))
    failed += e.type == "CancelRequested" && e.message.find("failed") != std::string::npos;
  EXPECT_EQ(failed, 1) << "the same failure is not told again on every pass";
  fake_.InjectFailures(0, 500, 0);
  // The next try (5 s after the failure) deletes it.
  int64_t deadline = MonotonicMillis() + 15'000;
  while (Run(name).state != RunState::kCancelled && MonotonicMillis() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(Run(name).state, RunState::kCancelled);
  EXPECT_TRUE(Job(name, 1).is_null());
}

TEST_F(KubeBackendTest, AHeldNamespaceDoesNotHoldUpAnothersRuns) {
  StopController();
  ASSERT_TRUE(WriteFileAtomic(home_ + "/platform.yaml", R"(schema_version: 1
flavors: [{name: default}]
queues:
  - name: q
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors: [{name: default, resources: [{name: cpu, nominal: 64}, {name: memory, nominal: 256Gi}]}]
workspaces:
  - {name: team-a, members: [alice], default_queue: q}
  - {name: team-b, members: [alice], default_queue: q}
)")
                  .ok());
  StartController();
  // team-a's namespace takes no writes (its webhook hangs): its run's create waits there.
  fake_.HoldWrites("team-a", true);
  std::string held = Submit(std::string(kSpec) + "policy:\n  workspace: team-a\n");
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& req : fake_.Requests())
      if (req.method == "PATCH" && req.path.find("/namespaces/team-a/") != std::string::npos)
        return true;
    return false;
  }));
  int64_t submitted = MonotonicMillis();
  std::string other = Submit(std::string(kSpec) + "policy:\n  workspace: team-b\n");
  ASSERT_TRUE(WaitFor(
      [&] { return !fake_.Object("batch/v1/jobs", "team-b", JobName(other, 1)).is_null(); }));
  int64_t took = MonotonicMillis() - submitted;
  EXPECT_TRUE(fake_.Object("batch/v1/jobs", "team-a", JobName(held, 1)).is_null())
      << "team-a's create is still held";
  // While one namespace's call is held, the decision thread goes on: a cancel is recorded.
  ASSERT_TRUE(controller_->Cancel(other).ok());
  ASSERT_TRUE(WaitForState(other, RunState::kCancelled));
  fake_.HoldWrites("team-a", false);
  ASSERT_TRUE(WaitFor(
      [&] { return !fake_.Object("batch/v1/jobs", "team-a", JobName(held, 1)).is_null(); }));
  EXPECT_LT(took, 5000) << "team-b's Job came " << took << " ms after its submission";
  std::printf("team-b's Job was created %lld ms after its submission\n",
              static_cast<long long>(took));
}

TEST_F(KubeBackendTest, ABareClusterGetsABaselineQueueSizedToItsNodes) {
  // No platform given, and the cluster has no queues: the default platform, sized to the
  // cluster's nodes, is applied at start, so the queue and priority class runs name exist.
  StopController();
  EXPECT_TRUE(fake_.Object("kueue.x-k8s.io/v1beta2/clusterqueues", "", "default").is_null());
  default_size_ = ControllerOptions::DefaultSize{16, 512'000, int64_t{2048} << 30};
  StartController();
  json cq = fake_.Object("kueue.x-k8s.io/v1beta2/clusterqueues", "", "default");
  ASSERT_FALSE(cq.is_null());
  json resources = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"];
  std::map<std::string, std::string> nominal;
  for (const json& r : resources) nominal[r["name"]] = r["nominalQuota"].get<std::string>();
  EXPECT_EQ(nominal["cpu"], "512");
  EXPECT_EQ(nominal["nvidia.com/gpu"], "16");
  EXPECT_FALSE(fake_.Object("kueue.x-k8s.io/v1beta2/localqueues", "default", "default").is_null());
  EXPECT_FALSE(
      fake_.Object("kueue.x-k8s.io/v1beta2/workloadpriorityclasses", "", "default").is_null());
  EXPECT_EQ(controller_->CurrentPlatform().source, "default");
}

TEST_F(KubeBackendTest, AnInstallationNeverAdoptsAnothersPods) {
  StopController();
  installation_ = "lab-a";
  StartController();
  std::string name = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(name, 1));
  json job = Job(name, 1);
  EXPECT_EQ(job["metadata"]["labels"]["tau.dev/installation"], "lab-a");
  EXPECT_EQ(job["spec"]["template"]["metadata"]["labels"]["tau.dev/installation"], "lab-a");
  MakeWorkload(name, 1);
  Admit(name, 1);
  // Another installation's pod with the same run and attempt (its run has the same name): it
  // fails, and must not fail this run.
  json foreign = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", "foreign-pod"},
        {"namespace", "default"},
        {"labels",
         {{"tau.dev/run", name}, {"tau.dev/attempt", "1"}, {"tau.dev/installation", "lab-b"}}}}},
      {"spec", {{"containers", {{{"name", "worker"}, {"image", "python:3.12"}}}}}},
      {"status",
       {{"phase", "Failed"},
        {"containerStatuses",
         {{{"name", "worker"},
           {"state", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}}}};
  ASSERT_TRUE(kube_->Create(foreign).ok());
  fake_.AppendLog("default", "foreign-pod", "not this run's output\n");
  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  fake_.AppendLog("default", PodName(name, 1), "this run's output\n");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "this run's output\n"; })) << Log(name, 1);
  SetPodStatus(name, 1, {{"phase", "Succeeded"}});
  SetJobCondition(name, 1, "Complete", "Completed");
  ASSERT_TRUE(WaitForState(name, RunState::kSucceeded));
  EXPECT_EQ(Log(name, 1), "this run's output\n");
}

TEST_F(KubeBackendTest, RestartReadoptsRunningAttemptsAndNoticesVanishedOnes) {
  std::string kept = Submit(kSpec);
  std::string lost = Submit(WithResilience("NodeLost", 0));
  ASSERT_TRUE(WaitForJob(kept, 1));
  ASSERT_TRUE(WaitForJob(lost, 1));
  for (const std::string& name : {kept, lost}) {
    MakeWorkload(name, 1);
    Admit(name, 1);
    StartPod(name, 1);
    ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  }
  fake_.AppendLog("default", PodName(kept, 1), "before the restart\n");
  ASSERT_TRUE(WaitFor([&] { return Log(kept, 1) == "before the restart\n"; })) << Log(kept, 1);
  StopController();
  // While the server is away: one Job finishes, the other is deleted by someone else.
  fake_.AppendLog("default", PodName(kept, 1), "while it was away\n");
  fake_.EndLog("default", PodName(kept, 1));
  SetPodStatus(kept, 1, {{"phase", "Succeeded"}});
  SetJobCondition(kept, 1, "Complete", "Completed");
  ASSERT_TRUE(kube_->Delete("batch/v1", "Job", "default", JobName(lost, 1)).ok());
  StartController();
  ASSERT_TRUE(WaitForState(kept, RunState::kSucceeded));
  EXPECT_TRUE(Job(kept, 2).is_null()) << "re-adopted, not created again";
  // Its log, followed again from the start, is kept once.
  EXPECT_TRUE(WaitFor([&] { return Log(kept, 1) == "before the restart\nwhile it was away\n"; }))
      << Log(kept, 1);
  ASSERT_TRUE(WaitForState(lost, RunState::kFailed));
  EXPECT_EQ(Run(lost).reason, "NodeLost");
}

TEST_F(KubeBackendTest, GangKeepsEachRanksLogAndCancelDeletesItsService) {
  std::string spec = kSpec;
  spec.replace(spec.find("workers: 1"), 10, "workers: 2");
  std::string name = Submit(spec);
  ASSERT_TRUE(WaitForJob(name, 1));
  EXPECT_EQ(Job(name, 1)["spec"]["completionMode"], "Indexed");
  json service = fake_.Object("v1/services", "default", JobName(name, 1));
  ASSERT_FALSE(service.is_null()) << "the gang's headless Service";
  // Owned by its Job, so that the garbage collector deletes it with the Job (its TTL).
  ASSERT_TRUE(WaitFor([&] {
    service = fake_.Object("v1/services", "default", JobName(name, 1));
    return service["metadata"].contains("ownerReferences");
  }));
  EXPECT_EQ(service["metadata"]["ownerReferences"][0]["kind"], "Job");
  EXPECT_EQ(service["metadata"]["ownerReferences"][0]["uid"], Job(name, 1)["metadata"]["uid"]);
  MakeWorkload(name, 1);
  Admit(name, 1);
  for (int rank = 0; rank < 2; ++rank) {
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", fmt::format("{}-{}-abc", JobName(name, 1), rank)},
                  {"namespace", "default"},
                  {"labels",
                   {{"tau.dev/run", name},
                    {"tau.dev/attempt", "1"},
                    {"batch.kubernetes.io/job-completion-index", std::to_string(rank)}}}}},
                {"spec", {{"containers", {{{"name", "worker"}, {"image", "python:3.12"}}}}}},
                {"status", {{"phase", "Running"}}}};
    ASSERT_TRUE(kube_->Create(pod).ok());
    fake_.AppendLog("default", fmt::format("{}-{}-abc", JobName(name, 1), rank),
                    fmt::format("hello from rank {}\n", rank));
  }
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  auto rank_log = [&](int rank) {
    auto text = ReadFile(fmt::format("{}/runs/{}/attempts/1/logs/rank-{}.log", home_, name, rank));
    return text.ok() ? *text : "";
  };
  ASSERT_TRUE(WaitFor([&] {
    return rank_log(0) == "hello from rank 0\n" && rank_log(1) == "hello from rank 1\n";
  })) << rank_log(0)
      << "|" << rank_log(1);
  ASSERT_TRUE(controller_->Cancel(name).ok());
  ASSERT_TRUE(WaitForState(name, RunState::kCancelled));
  EXPECT_TRUE(Job(name, 1).is_null());
  EXPECT_TRUE(fake_.Object("v1/services", "default", JobName(name, 1)).is_null());
}

TEST_F(KubeBackendTest, MetricsWrittenInEachRanksPodReachTheRunsEvidence) {
  std::string spec = kSpec;
  spec.replace(spec.find("workers: 1"), 10, "workers: 2");
  std::string name = Submit(spec);
  ASSERT_TRUE(WaitForJob(name, 1));
  // The worker writes to a file on a volume of its pod's own, which the sidecar prints.
  const json pod_spec = Job(name, 1)["spec"]["template"]["spec"];
  json sidecar;
  for (const json& c : pod_spec["initContainers"])
    if (c["name"] == "tau-metrics") sidecar = c;
  ASSERT_FALSE(sidecar.is_null()) << pod_spec.dump();
  EXPECT_EQ(sidecar["restartPolicy"], "Always") << "a native sidecar: the Job ends with its worker";
  EXPECT_FALSE(sidecar.contains("resources")) << "nothing added to what Kueue charges the quota";
  bool worker_env = false;
  for (const json& e : pod_spec["containers"][0]["env"])
    if (e["name"] == "TAU_METRICS_FILE") worker_env = e["value"] == "/tau/metrics/metrics.jsonl";
  EXPECT_TRUE(worker_env) << pod_spec["containers"][0]["env"].dump();
  MakeWorkload(name, 1);
  Admit(name, 1);
  // The Job controller makes each rank's pod from the Job's template.
  auto pod_name = [&](int rank) { return fmt::format("{}-{}-m9q", JobName(name, 1), rank); };
  for (int rank = 0; rank < 2; ++rank) {
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", pod_name(rank)},
                  {"namespace", "default"},
                  {"labels",
                   {{"tau.dev/run", name},
                    {"tau.dev/attempt", "1"},
                    {"batch.kubernetes.io/job-completion-index", std::to_string(rank)}}}}},
                {"spec", pod_spec},
                {"status", {{"phase", "Running"}}}};
    ASSERT_TRUE(kube_->Create(pod).ok());
  }
  auto point = [](const char* name, int step, double value) {
    return json{{"name", name}, {"step", step}, {"value", value}}.dump() + "\n";
  };
  fake_.AppendLog("default", pod_name(0), point("loss", 1, 0.5), "tau-metrics");
  fake_.AppendLog("default", pod_name(1), point("rank1_loss", 1, 0.75), "tau-metrics");
  // A line still being written is kept once it ends.
  std::string second = point("loss", 2, 0.25);
  fake_.AppendLog("default", pod_name(0), second.substr(0, 10), "tau-metrics");
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  const std::string run_file = layout::MetricsFile(layout::RunDir(home_, name));
  auto lines = [&] {
    auto text = ReadFile(run_file);
    std::multiset<std::string> out;
    if (!text.ok()) return out;
    for (const std::string& line : Split(*text, '\n'))
      if (!line.empty()) out.insert(line + "\n");
    return out;
  };
  ASSERT_TRUE(WaitFor([&] { return lines().size() == 2; }));
  EXPECT_EQ(lines(),
            (std::multiset<std::string>{point("loss", 1, 0.5), point("rank1_loss", 1, 0.75)}));
  // A cut stream is followed again: nothing kept twice.
  fake_.CutLogStreams();
  fake_.AppendLog("default", pod_name(0), second.substr(10), "tau-metrics");
  ASSERT_TRUE(WaitFor([&] { return lines().size() == 3; }));
  // The last point, written just before the worker ends, is in the record all the same: the
  // run's end waits for its pods' metrics.
  fake_.AppendLog("default", pod_name(0), point("loss", 3, 0.125), "tau-metrics");
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* c : {"worker", "tau-metrics"}) fake_.EndLog("default", pod_name(rank), c);
    auto patched = kube_->MergePatch("v1", "Pod", "default", pod_name(rank),
                                     {{"status", {{"phase", "Succeeded"}}}}, "status");
    ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  }
  SetJobCondition(name, 1, "Complete", "Completed");
  ASSERT_TRUE(WaitForState(name, RunState::kSucceeded));
  EXPECT_EQ(lines(),
            (std::multiset<std::string>{point("loss", 1, 0.5), point("loss", 2, 0.25),
                                        point("loss", 3, 0.125), point("rank1_loss", 1, 0.75)}));
  EXPECT_TRUE(WaitFor([&] { return EvidenceSteps(name, "loss").size() == 3; }));
  EXPECT_EQ(EvidenceSteps(name, "loss"), (std::vector<int64_t>{1, 2, 3}));
}

TEST_F(KubeBackendTest, RayJobKeepsTheDriverLogFromRaysJobApi) {
  std::string spec = kSpec;
  spec.replace(spec.find("workload_kind: job"), 18,
               "workload_kind: rayjob\n  ttl_seconds_after_finished: 1");
  std::string name = Submit(spec);
  json rayjob;
  ASSERT_NO_FATAL_FAILURE(AdmitRayJob(name, &rayjob));
  EXPECT_EQ(rayjob["spec"]["suspend"], true);
  EXPECT_EQ(rayjob["spec"]["submissionMode"], "HTTPMode");
  // KubeRay starts the cluster with its head Service and (HTTPMode) submits the Ray job to the
  // head's dashboard itself: no submitter pod exists. The driver's output is Ray's job log, which
  // the dashboard serves.
  const std::string cluster = JobName(name, 1) + "-raycluster-x7k2p";
  const std::string job_id = JobName(name, 1) + "-q9z4m";
  json head_svc = {{"apiVersion", "v1"},
                   {"kind", "Service"},
                   {"metadata", {{"name", cluster + "-head-svc"}, {"namespace", "default"}}},
                   {"spec", {{"ports", {{{"name", "dashboard"}, {"port", 8265}}}}}}};
  ASSERT_TRUE(kube_->Create(head_svc).ok());
  const std::string logs_path = "/api/jobs/" + job_id + "/logs";
  fake_.SetProxied("default", cluster + "-head-svc:8265", logs_path,
                   json{{"logs", "ray driver: epoch 1\n"}}.dump());
  ASSERT_TRUE(kube_
                  ->MergePatch("ray.io/v1", "RayJob", "default", JobName(name, 1),
                               {{"status",
                                 {{"jobDeploymentStatus", "Running"},
                                  {"jobStatus", "RUNNING"},
                                  {"jobId", job_id},
                                  {"rayClusterName", cluster}}}},
                               "status")
                  .ok());
  // KubeRay makes the head pod from the RayJob's head template; the driver writes its metrics
  // there, which the head's metrics sidecar prints.
  const json head_template = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"];
  json head_labels = head_template["metadata"]["labels"];
  head_labels["ray.io/node-type"] = "head";
  json head_pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", cluster + "-head-8h2kd"}, {"namespace", "default"}, {"labels", head_labels}}},
      {"spec", head_template["spec"]},
      {"status", {{"phase", "Running"}}}};
  ASSERT_TRUE(kube_->Create(head_pod).ok());
  fake_.AppendLog("default", cluster + "-head-8h2kd",
                  json{{"name", "reward"}, {"step", 1}, {"value", 0.5}}.dump() + "\n",
                  "tau-metrics");
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "ray driver: epoch 1\n"; })) << Log(name, 1);
  fake_.SetProxied("default", cluster + "-head-svc:8265", logs_path,
                   json{{"logs", "ray driver: epoch 1\nray driver: epoch 2\n"}}.dump());
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "ray driver: epoch 1\nray driver: epoch 2\n"; }))
      << Log(name, 1);
  // The job ends with output the last poll has not seen: the fetch after the end has it.
  fake_.SetProxied("default", cluster + "-head-svc:8265", logs_path,
                   json{{"logs", "ray driver: epoch 1\nray driver: epoch 2\ndone\n"}}.dump());
  ASSERT_TRUE(
      kube_
          ->MergePatch(
              "ray.io/v1", "RayJob", "default", JobName(name, 1),
              {{"status", {{"jobDeploymentStatus", "Complete"}, {"jobStatus", "SUCCEEDED"}}}},
              "status")
          .ok());
  // The driver's last point, printed as the job ends: the head outlives the job (until KubeRay
  // deletes the cluster), so its end waits a moment for the sidecar, not for the pod.
  fake_.AppendLog("default", cluster + "-head-8h2kd",
                  json{{"name", "reward"}, {"step", 2}, {"value", 0.75}}.dump() + "\n",
                  "tau-metrics");
  ASSERT_TRUE(WaitForState(name, RunState::kSucceeded));
  ASSERT_TRUE(WaitFor([&] {
    return Log(name, 1) == "ray driver: epoch 1\nray driver: epoch 2\ndone\n";
  })) << Log(name, 1);
  EXPECT_TRUE(WaitFor([&] { return EvidenceSteps(name, "reward").size() == 2; }));
  EXPECT_EQ(EvidenceSteps(name, "reward"), (std::vector<int64_t>{1, 2}));
  // KubeRay deletes the RayCluster after ttlSecondsAfterFinished but keeps the RayJob, which
  // holds the code: tau deletes it then.
  ASSERT_TRUE(WaitFor(
      [&] { return fake_.Object("ray.io/v1/rayjobs", "default", JobName(name, 1)).is_null(); }));
  EXPECT_EQ(Log(name, 1), "ray driver: epoch 1\nray driver: epoch 2\ndone\n");
  // The dashboard was asked through the API server's service proxy.
  bool proxied = false;
  for (const auto& req : fake_.Requests())
    proxied |= req.path == "/api/v1/namespaces/default/services/" + cluster +
                               "-head-svc:8265/proxy" + logs_path;
  EXPECT_TRUE(proxied);
}

// The same race for a RayJob: KubeRay's Failed comes before the news of the worker it lost.
TEST_F(KubeBackendTest, ARayJobsFailureBeforeItsPodsNewsIsClassifiedFromThePods) {
  std::string spec = kSpec;
  spec.replace(spec.find("workload_kind: job"), 18, "workload_kind: rayjob");
  std::string name = Submit(spec);
  json rayjob;
  ASSERT_NO_FATAL_FAILURE(AdmitRayJob(name, &rayjob));
  ASSERT_TRUE(WaitForState(name, RunState::kAdmitted));
  fake_.PauseWatchesOf("v1/pods", true);
  // KubeRay makes the worker from the RayJob's template; the kernel kills it for memory.
  const json& group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0];
  json worker = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", JobName(name, 1) + "-raycluster-x7k2p-worker-4tq9v"},
        {"namespace", "default"},
        {"labels", group["template"]["metadata"]["labels"]}}},
      {"spec", group["template"]["spec"]},
      {"status",
       {{"phase", "Failed"},
        {"containerStatuses",
         {{{"name", "ray-worker"},
           {"state", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}}}};
  ASSERT_TRUE(kube_->Create(worker).ok());
  ASSERT_TRUE(kube_
                  ->MergePatch("ray.io/v1", "RayJob", "default", JobName(name, 1),
                               {{"status",
                                 {{"jobDeploymentStatus", "Failed"},
                                  {"jobStatus", "FAILED"},
                                  {"message", "Job entrypoint command failed with exit code 1"}}}},
                               "status")
                  .ok());
  ASSERT_TRUE(WaitForState(name, RunState::kFailed));
  EXPECT_EQ(Run(name).reason, "OOMKilled") << Run(name).message;
  EXPECT_EQ(Run(name).exit_code, 137);
  EXPECT_EQ(PodListsOf(name, 1), 1);
  fake_.PauseWatchesOf("v1/pods", false);
}

TEST_F(KubeBackendTest, AFailedSetupKeepsPipsOutputAsTheRanksLog) {
  std::string name = AdmittedRun();
  FailSetup(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kFailed));
  EXPECT_EQ(Run(name).reason, "SetupError");
  ExpectPipsErrorKept(name);
}

// The pod and Job watches are separate streams: under load the Job's failure can come before
// any news of its pods. The class is read from the pods as the API server has them after the
// failure, not from the watch's view of them, which here has no pod at all (UserError).
TEST_F(KubeBackendTest, AJobsFailureBeforeItsPodsNewsIsClassifiedFromThePods) {
  std::string name = AdmittedRun();
  fake_.PauseWatchesOf("v1/pods", true);
  FailSetup(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kFailed));
  EXPECT_EQ(Run(name).reason, "SetupError") << Run(name).message;
  EXPECT_NE(Run(name).message.find("init container tau-setup"), std::string::npos)
      << Run(name).message;
  EXPECT_EQ(PodListsOf(name, 1), 1);
  // The pod read is followed too: pip's error is the rank's log, with no news from the watch.
  ExpectPipsErrorKept(name);
  fake_.PauseWatchesOf("v1/pods", false);
}

// An API server that cannot list the pods holds the attempt's end up for a few resyncs, not for
// ever: it is then told from the pods the watch has seen.
TEST_F(KubeBackendTest, AFailureWhosePodsCannotBeReadIsToldFromTheWatchsView) {
  std::string name = AdmittedRun();
  fake_.PauseWatchesOf("v1/pods", true);
  fake_.FailLists("v1/pods", 500);
  FailSetup(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kFailed));
  EXPECT_EQ(Run(name).reason, "UserError") << "the watch has seen no pod";
  EXPECT_GE(PodListsOf(name, 1), 3) << "asked three times first";
  fake_.FailLists("v1/pods", 0);
  fake_.PauseWatchesOf("v1/pods", false);
}

TEST_F(KubeBackendTest, WorkspaceSecretsReachTheNamespaceSecretNotTheJob) {
  store::SecretInfo info;
  info.workspace = "default";
  info.key = "api-token";
  info.updated_by = "alice";
  ASSERT_TRUE(store_->PutSecret(info, "s3cr3t-value").ok());
  std::string spec = kSpec;
  spec.replace(spec.find("  image: python:3.12\n"), 21,
               "  image: python:3.12\n  env:\n    API_TOKEN: SECRET:api-token\n");
  std::string name = Submit(spec);
  ASSERT_TRUE(WaitForJob(name, 1));
  json secret = fake_.Object("v1/secrets", "default", "tau-secrets");
  ASSERT_FALSE(secret.is_null());
  EXPECT_EQ(secret["stringData"]["api-token"], "s3cr3t-value");
  std::string job = Job(name, 1).dump();
  EXPECT_EQ(job.find("s3cr3t-value"), std::string::npos) << "the value never enters the Job";
  EXPECT_NE(job.find("secretKeyRef"), std::string::npos);
}

// A secret the pod prints is masked as its log is written, not when the attempt ends: a value
// split across two chunks, across a cut stream, and across a server restart in its middle, with
// every byte kept once.
TEST_F(KubeBackendTest, SecretsAreMaskedInPodLogsAsTheyAreWritten) {
  store::SecretInfo info;
  info.workspace = "default";
  info.key = "api-token";
  info.updated_by = "alice";
  ASSERT_TRUE(store_->PutSecret(info, "s3cr3t-value").ok());
  std::string spec = kSpec;
  spec.replace(spec.find("  image: python:3.12\n"), 21,
               "  image: python:3.12\n  env:\n    API_TOKEN: SECRET:api-token\n");
  std::string name = Submit(spec);
  ASSERT_TRUE(WaitForJob(name, 1));
  MakeWorkload(name, 1);
  Admit(name, 1);
  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  const std::string pod = PodName(name, 1);

  fake_.AppendLog("default", pod, "token=s3cr3t-value\n");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "token=***\n"; })) << Log(name, 1);
  // Split across two chunks: the start is held back (not on disk) until the rest comes.
  fake_.AppendLog("default", pod, "split=s3cr");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "token=***\nsplit="; })) << Log(name, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(Log(name, 1), "token=***\nsplit=");
  fake_.AppendLog("default", pod, "3t-value ok\n");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "token=***\nsplit=*** ok\n"; })) << Log(name, 1);
  // Cut while a secret's start is held back: the next stream goes on after it.
  fake_.AppendLog("default", pod, "cut=s3cr3t");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == "token=***\nsplit=*** ok\ncut="; }))
      << Log(name, 1);
  fake_.CutLogStreams();
  fake_.AppendLog("default", pod, "-value after the cut\n");
  const std::string before_restart = "token=***\nsplit=*** ok\ncut=*** after the cut\n";
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == before_restart; })) << Log(name, 1);
  // The server stops in a secret's middle; the rest is printed while it is away.
  fake_.AppendLog("default", pod, "restart=s3cr3t-");
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == before_restart + "restart="; })) << Log(name, 1);
  StopController();
  EXPECT_EQ(Log(name, 1), before_restart + "restart=");
  fake_.AppendLog("default", pod, "value while away\n");
  StartController();
  const std::string all = before_restart + "restart=*** while away\n";
  ASSERT_TRUE(WaitFor([&] { return Log(name, 1) == all; })) << Log(name, 1);
  // A last chunk that ends like a secret's start is no secret: it is written when the pod ends.
  fake_.AppendLog("default", pod, "bye s3c");
  fake_.EndLog("default", pod);
  SetPodStatus(name, 1, {{"phase", "Succeeded"}});
  SetJobCondition(name, 1, "Complete", "Completed");
  ASSERT_TRUE(WaitForState(name, RunState::kSucceeded));
  EXPECT_TRUE(WaitFor([&] { return Log(name, 1) == all + "bye s3c"; })) << Log(name, 1);
  EXPECT_EQ(Log(name, 1).find("s3cr3t"), std::string::npos);
}

// The workspace's limits.max_log_bytes holds for pod logs as for local ones: the newest output is
// kept, after a marker line, and a LogTruncated event says so once.
TEST_F(KubeBackendTest, PodLogsAreKeptUnderTheWorkspacesCap) {
  StopController();
  ASSERT_TRUE(WriteFileAtomic(home_ + "/platform.yaml", R"(schema_version: 1
flavors:
  - name: default
queues:
  - name: default
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: default
            resources:
              - {name: cpu, nominal: 64}
              - {name: memory, nominal: 512Gi}
priorities:
  - {name: default, value: 0}
workspaces:
  - name: default
    members: ["*"]
    default_queue: default
    default_priority: default
    limits: {max_log_bytes: 8Ki}
defaults:
  workspace: default
)")
                  .ok());
  StartController();
  std::string name = Submit(kSpec);
  ASSERT_TRUE(WaitForJob(name, 1));
  MakeWorkload(name, 1);
  Admit(name, 1);
  StartPod(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  const std::string line = std::string(99, 'x') + "\n";
  for (int i = 0; i < 40; ++i) {
    std::string block;
    for (int j = 0; j < 5; ++j) block += line;
    fake_.AppendLog("default", PodName(name, 1), block);
  }
  fake_.AppendLog("default", PodName(name, 1), "the very last line\n");
  auto ends_well = [&] {
    std::string log = Log(name, 1);
    const std::string last = "the very last line\n";
    return log.size() >= last.size() &&
           log.compare(log.size() - last.size(), last.size(), last) == 0;
  };
  ASSERT_TRUE(WaitFor(ends_well)) << Log(name, 1).size();
  std::string log = Log(name, 1);
  EXPECT_LE(log.size(), 8192u);
  EXPECT_EQ(log.rfind("[tau] ", 0), 0u) << log.substr(0, 200);
  EXPECT_NE(log.find("raise limits.max_log_bytes"), std::string::npos);
  ASSERT_TRUE(WaitFor([&] {
    for (const store::Event& e : Events(name))
      if (e.type == "LogTruncated") return true;
    return false;
  }));
  int truncated = 0;
  for (const store::Event& e : Events(name)) {
    if (e.type != "LogTruncated") continue;
    ++truncated;
    EXPECT_EQ(e.data["attempt"], 1) << e.data.dump();
    EXPECT_EQ(e.data["max_log_bytes"], 8192) << e.data.dump();
  }
  EXPECT_EQ(truncated, 1);
}

TEST_F(KubeBackendTest, SubjectAccessReviewDecidesWhoMaySubmitWhenAsked) {
  StopController();
  check_access_ = true;
  StartController();
  fake_.Grant("alice", "create", "batch", "jobs", "default");
  EXPECT_FALSE(Submit(kSpec).empty()) << "alice may create Jobs in default";
  SubmitRequest request;
  request.spec_file = "tau.yaml";
  request.spec_yaml = kSpec;
  request.code = {{"train.py", 0644, "print(1)\n"}};
  request.caller = {"bob", {"team-b"}};
  SubmitError error;
  auto refused = controller_->Submit(std::move(request), &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("bob"), std::string::npos)
      << refused.status().ToString();
  bool asked = false;
  for (const auto& r : fake_.Requests())
    asked |= r.path.find("subjectaccessreviews") != std::string::npos;
  EXPECT_TRUE(asked);
}

TEST_F(KubeBackendTest, ApplyingThePlatformCreatesKueueQueuesOnTheCluster) {
  const char* src = std::getenv("TAU_SOURCE_DIR");
  std::string path =
      std::string(src != nullptr ? src : TAU_TEST_SOURCE_DIR) + "/examples/platform/platform.yaml";
  auto yaml = ReadFile(path);
  ASSERT_TRUE(yaml.ok()) << yaml.status().ToString();
  std::vector<spec::Diagnostic> diagnostics;
  Status applied = controller_->ApplyPlatform(*yaml, "platform.yaml", &diagnostics);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_FALSE(fake_.Object("kueue.x-k8s.io/v1beta2/clusterqueues", "", "research").is_null());
  EXPECT_FALSE(fake_.Object("kueue.x-k8s.io/v1beta2/resourceflavors", "", "h100").is_null());
  EXPECT_GT(fake_.ObjectCount("kueue.x-k8s.io/v1beta2/localqueues"), 0u);

  // A restarted server applies the platform it has again (the cluster may have lost it).
  StopController();
  ASSERT_TRUE(kube_->Delete("kueue.x-k8s.io/v1beta2", "ClusterQueue", "", "research").ok());
  StartController();
  EXPECT_FALSE(fake_.Object("kueue.x-k8s.io/v1beta2/clusterqueues", "", "research").is_null());

  // The cluster refusing it leaves tau's platform as it was.
  fake_.InjectFailures(20, 500, 0);
  Status refused = controller_->ApplyPlatform(*yaml, "again.yaml", &diagnostics);
  fake_.InjectFailures(0, 500, 0);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("tau keeps the one it had"), std::string::npos);
  EXPECT_EQ(controller_->CurrentPlatform().source, "platform.yaml");
}

TEST_F(KubeBackendTest, UnrenderableRunsAreRefusedAtSubmission) {
  std::string no_image = kSpec;
  no_image.replace(no_image.find("  image: python:3.12\n"), 21, "  env: {A: b}\n");
  SubmitRequest request;
  request.spec_file = "tau.yaml";
  request.spec_yaml = no_image;
  request.code = {{"train.py", 0644, "print(1)\n"}};
  request.caller = {"alice", {}};
  SubmitError error;
  auto r = controller_->Submit(std::move(request), &error);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("image"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(fake_.ObjectCount("batch/v1/jobs"), 0u);
}

TEST_F(KubeBackendTest, AFinishedJobGoneWithItsTtlLeavesTheRunSucceeded) {
  // The TTL-after-finished controller (the fake plays it) deletes the Job and, Foreground, its
  // pods a second after it completes: the run stays Succeeded, with its log.
  std::string spec = kSpec;
  spec.insert(spec.find("compute:"), "  ttl_seconds_after_finished: 1\n");
  std::string name = Submit(spec);
  ASSERT_TRUE(WaitForJob(name, 1));
  EXPECT_EQ(Job(name, 1)["spec"]["ttlSecondsAfterFinished"], 1);
  MakeWorkload(name, 1);
  Admit(name, 1);
  StartPod(name, 1);
  // As the Job controller makes it: owned by the Job.
  json owner = {{"apiVersion", "batch/v1"},
                {"kind", "Job"},
                {"name", JobName(name, 1)},
                {"uid", Job(name, 1)["metadata"]["uid"]},
                {"controller", true}};
  ASSERT_TRUE(kube_
                  ->MergePatch("v1", "Pod", "default", PodName(name, 1),
                               {{"metadata", {{"ownerReferences", json::array({owner})}}}})
                  .ok());
  ASSERT_TRUE(WaitForState(name, RunState::kRunning));
  fake_.AppendLog("default", PodName(name, 1), "hello\n");
  fake_.EndLog("default", PodName(name, 1));
  Succeed(name, 1);
  ASSERT_TRUE(WaitForState(name, RunState::kSucceeded));
  ASSERT_TRUE(WaitFor([&] {
    return Job(name, 1).is_null() && fake_.Object("v1/pods", "default", PodName(name, 1)).is_null();
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // a resync after the deletion
  EXPECT_EQ(Run(name).state, RunState::kSucceeded) << Run(name).message;
  EXPECT_EQ(EventTypes(name).back(), "Succeeded");
  EXPECT_EQ(Log(name, 1), "hello\n");
}

}  // namespace
}  // namespace tau::server
