// Tests of observe.cc: an attempt's phase from its Job or RayJob, Kueue Workload and pods, one test
// (at least) per rule of docs/kubernetes.md ("How tau reads a run's state back"), with objects
// shaped as the API server, Kueue v1beta2 and KubeRay v1 return them.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kube/kube.h"

namespace tau::kube {
namespace {

using nlohmann::json;
using Phase = AttemptObservation::Phase;

json Parse(const char* text) { return json::parse(text); }

// A suspended Job as RenderRun makes it, before Kueue admits it.
json Job(bool suspend = true, json conditions = json::array()) {
  json job = Parse(R"({
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "train-1", "namespace": "team-a", "uid": "u-1",
                 "labels": {"kueue.x-k8s.io/queue-name": "default"}},
    "spec": {"suspend": true, "completionMode": "Indexed", "completions": 2, "parallelism": 2,
             "backoffLimit": 0},
    "status": {}
  })");
  job["spec"]["suspend"] = suspend;
  if (!conditions.empty()) job["status"]["conditions"] = conditions;
  return job;
}

json RayJob(json status) {
  json job = Parse(R"({
    "apiVersion": "ray.io/v1", "kind": "RayJob",
    "metadata": {"name": "tune-1", "namespace": "team-a", "uid": "u-2"},
    "spec": {"suspend": false, "entrypoint": "python tune.py"}
  })");
  job["status"] = std::move(status);
  return job;
}

// An admitted Workload (QuotaReserved and Admitted True), with its assignment.
json AdmittedWorkload() {
  return Parse(R"({
    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
    "metadata": {"name": "job-train-1-4f2a1", "namespace": "team-a",
                 "creationTimestamp": "2026-11-30T10:00:00Z",
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train-1",
                                      "uid": "u-1", "controller": true}]},
    "spec": {"queueName": "default", "priority": 100,
             "podSets": [{"name": "main", "count": 2, "template": {}}]},
    "status": {
      "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": "Quota reserved in ClusterQueue team-a",
         "lastTransitionTime": "2026-11-30T10:00:05Z"},
        {"type": "Admitted", "status": "True", "reason": "Admitted",
         "message": "The workload is admitted", "lastTransitionTime": "2026-11-30T10:00:05Z"}],
      "admission": {"clusterQueue": "team-a",
                    "podSetAssignments": [{"name": "main", "count": 2,
                                           "flavors": {"nvidia.com/gpu": "h200", "cpu": "default"},
                                           "resourceUsage": {"nvidia.com/gpu": "16"}}]}
    }
  })");
}

// What Kueue leaves after it preempts or evicts an admitted Workload: Evicted True, quota
// released.
json EvictedWorkload(const char* reason, const char* message) {
  json w = AdmittedWorkload();
  w["status"].erase("admission");
  w["status"]["conditions"] = json::array(
      {{{"type", "QuotaReserved"},
        {"status", "False"},
        {"reason", "Pending"},
        {"message", "Preempted"}},
       {{"type", "Admitted"}, {"status", "False"}, {"reason", "NoReservation"}, {"message", ""}},
       {{"type", "Evicted"}, {"status", "True"}, {"reason", reason}, {"message", message}}});
  return w;
}

// A pod of the Job; `status` is merged over a Running pod's.
json Pod(const std::string& name, const std::string& index, json status) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", name},
                {"namespace", "team-a"},
                {"labels", {{"tau.dev/run", "train"}, {"tau.dev/attempt", "1"}}},
                {"annotations", {{"batch.kubernetes.io/job-completion-index", index}}}}},
              {"status",
               {{"phase", "Running"},
                {"initContainerStatuses",
                 {{{"name", "tau-setup"},
                   {"state", {{"terminated", {{"exitCode", 0}, {"reason", "Completed"}}}}}}}},
                {"containerStatuses",
                 {{{"name", "worker"},
                   {"state", {{"running", {{"startedAt", "2026-11-30T10:01:00Z"}}}}}}}}}}};
  pod["status"].merge_patch(status);
  return pod;
}

json FailedWorker(const std::string& name, const std::string& index, int code,
                  const char* reason = "Error") {
  return Pod(name, index,
             {{"phase", "Failed"},
              {"containerStatuses",
               {{{"name", "worker"},
                 {"state", {{"terminated", {{"exitCode", code}, {"reason", reason}}}}}}}}});
}

json FailedCondition(const char* reason, const char* message) {
  return json::array(
      {{{"type", "FailureTarget"}, {"status", "True"}, {"reason", reason}},
       {{"type", "Failed"}, {"status", "True"}, {"reason", reason}, {"message", message}}});
}

// ---- PhaseName ----

TEST(ObservePhaseName, NamesEveryPhase) {
  EXPECT_STREQ(PhaseName(Phase::kPending), "Pending");
  EXPECT_STREQ(PhaseName(Phase::kAdmitted), "Admitted");
  EXPECT_STREQ(PhaseName(Phase::kRunning), "Running");
  EXPECT_STREQ(PhaseName(Phase::kSucceeded), "Succeeded");
  EXPECT_STREQ(PhaseName(Phase::kFailed), "Failed");
  EXPECT_STREQ(PhaseName(Phase::kEvicted), "Evicted");
}

// ---- Rule 1: terminal from the object ----

TEST(ObserveAttempt, JobCompleteSucceedsWithFlavors) {
  json job = Job(false, Parse(R"([
    {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached"},
    {"type": "Complete", "status": "True", "reason": "CompletionsReached",
     "message": "Reached expected number of succeeded pods"}])"));
  json workload = AdmittedWorkload();
  workload["status"]["conditions"].push_back(
      {{"type", "Finished"}, {"status", "True"}, {"reason", "Succeeded"}});
  AttemptObservation o = ObserveAttempt(job, &workload, {});
  EXPECT_EQ(o.phase, Phase::kSucceeded);
  EXPECT_TRUE(o.Terminal());
  EXPECT_EQ(o.message, "the Job completed");
  EXPECT_EQ(o.failure_class, "");
  EXPECT_EQ(o.cluster_queue, "team-a");
  EXPECT_EQ(o.flavors, Parse(R"({"main": {"nvidia.com/gpu": "h200", "cpu": "default"}})"));
}

TEST(ObserveAttempt, JobSuccessCriteriaMetAloneSucceeds) {
  json job = Job(false, Parse(R"([{"type": "SuccessCriteriaMet", "status": "True",
                                   "reason": "SuccessPolicy"}])"));
  EXPECT_EQ(ObserveAttempt(job, nullptr, {}).phase, Phase::kSucceeded);
}

TEST(ObserveAttempt, JobDeadlineExceededIsTimeout) {
  json job = Job(false, FailedCondition("DeadlineExceeded",
                                        "Job was active longer than specified "
                                        "deadline"));
  json workload = AdmittedWorkload();
  AttemptObservation o = ObserveAttempt(job, &workload, {FailedWorker("train-1-0-a", "0", 143)});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "Timeout");
  EXPECT_EQ(o.message, "Job was active longer than specified deadline");
  EXPECT_FALSE(o.read_from_pods) << "the Job's own word: no pod can change it";
}

TEST(ObserveAttempt, JobBackoffLimitTakesUserErrorAndExitCodeFromThePod) {
  json job = Job(false, FailedCondition("BackoffLimitExceeded",
                                        "Job has reached the specified backoff limit"));
  json workload = AdmittedWorkload();
  AttemptObservation o = ObserveAttempt(
      job, &workload,
      {Pod("train-1-1-b", "1", json::object()), FailedWorker("train-1-0-a", "0", 3)});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "UserError");
  EXPECT_EQ(o.reason, "BackoffLimitExceeded");
  EXPECT_EQ(o.message, "worker 0 exited with code 3");
  EXPECT_EQ(o.exit_code, 3);
  EXPECT_EQ(o.cluster_queue, "team-a");  // kept in terminal phases
  EXPECT_TRUE(o.read_from_pods);
}

TEST(ObserveAttempt, JobFailedWithoutPodsIsUserErrorWithTheConditionMessage) {
  json job = Job(false, FailedCondition("PodFailurePolicy",
                                        "Container worker for pod team-a/train-1-0-a failed with "
                                        "exit code 42 matching FailJob rule at index 0"));
  AttemptObservation o = ObserveAttempt(job, nullptr, {});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "UserError");
  EXPECT_EQ(o.message,
            "Container worker for pod team-a/train-1-0-a failed with exit code 42 matching FailJob "
            "rule at index 0");
  EXPECT_FALSE(o.exit_code.has_value());
  // The pods may only not have been seen yet: the caller reads them before it tells the end.
  EXPECT_TRUE(o.read_from_pods);
}

TEST(ObserveAttempt, FailedConditionNotTrueIsNotTerminal) {
  json job = Job(false, Parse(R"([{"type": "Failed", "status": "False"}])"));
  json workload = AdmittedWorkload();
  EXPECT_EQ(ObserveAttempt(job, &workload, {}).phase, Phase::kAdmitted);
}

TEST(ObserveAttempt, RayJobSucceeded) {
  json job = RayJob(Parse(R"({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED",
                              "jobId": "tune-1-x7k2p", "rayClusterName": "tune-1-raycluster-abc"})"));
  AttemptObservation o = ObserveAttempt(job, nullptr, {});
  EXPECT_EQ(o.phase, Phase::kSucceeded);
  EXPECT_FALSE(o.read_from_pods);
}

TEST(ObserveAttempt, RayJobFailedIsUserErrorWithKubeRaysMessage) {
  json job = RayJob(Parse(R"({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED",
                              "reason": "AppFailed",
                              "message": "Job entrypoint command failed with exit code 1"})"));
  json submitter = FailedWorker("tune-1-submitter-q8z", "", 1);
  submitter["metadata"].erase("annotations");
  submitter["status"]["containerStatuses"][0]["name"] = "ray-job-submitter";
  AttemptObservation o = ObserveAttempt(job, nullptr, {submitter});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "UserError");
  EXPECT_EQ(o.message, "Job entrypoint command failed with exit code 1");
  EXPECT_EQ(o.exit_code, 1);
}

TEST(ObserveAttempt, RayJobStoppedWithoutPodsIsUserError) {
  json job = RayJob(Parse(R"({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"})"));
  AttemptObservation o = ObserveAttempt(job, nullptr, {});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "UserError");
  EXPECT_FALSE(o.message.empty());
  EXPECT_TRUE(o.read_from_pods);
}

TEST(ObserveAttempt, RayJobFailedTakesTheClassFromAnOomKilledWorker) {
  json job = RayJob(Parse(R"({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED",
                              "message": "Job entrypoint command failed with exit code 1"})"));
  json worker = FailedWorker("tune-1-raycluster-abc-gpu-group-worker-x1", "", 137, "OOMKilled");
  worker["metadata"].erase("annotations");
  worker["status"]["containerStatuses"][0]["name"] = "ray-worker";
  AttemptObservation o = ObserveAttempt(job, nullptr, {worker});
  EXPECT_EQ(o.failure_class, "OOMKilled");
  EXPECT_EQ(o.exit_code, 137);
  EXPECT_NE(o.message.find("tune-1-raycluster-abc-gpu-group-worker-x1"), std::string::npos);
}

TEST(ObserveAttempt, RayJobDeadlineExceededIsTimeout) {
  json job = RayJob(Parse(R"({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                              "message": "The RayJob has passed the activeDeadlineSeconds."})"));
  AttemptObservation o = ObserveAttempt(job, nullptr, {});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "Timeout");
  EXPECT_EQ(o.message, "The RayJob has passed the activeDeadlineSeconds.");
  EXPECT_FALSE(o.read_from_pods);
}

TEST(ObserveAttempt, TerminalJobBeatsAnEvictedWorkload) {
  json job = Job(false, Parse(R"([{"type": "Complete", "status": "True"}])"));
  json workload = EvictedWorkload("Preempted", "Preempted to accommodate a workload");
  EXPECT_EQ(ObserveAttempt(job, &workload, {}).phase, Phase::kSucceeded);
}

// ---- Rule 2: evicted ----

TEST(ObserveAttempt, PreemptedWorkloadIsEvictedPreempted) {
  const char* message =
      "Preempted to accommodate a workload (UID: 5c4b6a1e-0000-4000-8000-000000000001, JobUID: "
      "u-9) due to prioritization in the ClusterQueue";
  json workload = EvictedWorkload("Preempted", message);
  AttemptObservation o =
      ObserveAttempt(Job(true), &workload, {Pod("train-1-0-a", "0", json::object())});
  EXPECT_EQ(o.phase, Phase::kEvicted);
  EXPECT_EQ(o.failure_class, "Preempted");
  EXPECT_EQ(o.message, message);
  EXPECT_FALSE(o.Terminal());
}

TEST(ObserveAttempt, NodeFailuresEvictionIsNodeLost) {
  json workload = EvictedWorkload("NodeFailures", "Workload was evicted due to node failures");
  AttemptObservation o = ObserveAttempt(Job(true), &workload, {});
  EXPECT_EQ(o.phase, Phase::kEvicted);
  EXPECT_EQ(o.failure_class, "NodeLost");
}

TEST(ObserveAttempt, OtherEvictionsAreEvicted) {
  json workload = EvictedWorkload("PodsReadyTimeout",
                                  "Exceeded the PodsReady timeout team-a/job-train-1-4f2a1");
  AttemptObservation o = ObserveAttempt(Job(true), &workload, {});
  EXPECT_EQ(o.phase, Phase::kEvicted);
  EXPECT_EQ(o.failure_class, "Evicted");
  EXPECT_EQ(o.reason, "PodsReadyTimeout");
  EXPECT_EQ(o.message, "Exceeded the PodsReady timeout team-a/job-train-1-4f2a1");
}

TEST(ObserveAttempt, EvictedButReadmittedIsNotEvicted) {
  json workload = AdmittedWorkload();
  workload["status"]["conditions"].push_back(
      {{"type", "Evicted"}, {"status", "True"}, {"reason", "Preempted"}, {"message", "x"}});
  EXPECT_EQ(ObserveAttempt(Job(false), &workload, {}).phase, Phase::kAdmitted);
}

// ---- Rule 3: running, and what pods waiting say ----

TEST(ObserveAttempt, RunningPodIsRunning) {
  json workload = AdmittedWorkload();
  AttemptObservation o = ObserveAttempt(
      Job(false), &workload,
      {Pod("train-1-1-b", "1", {{"phase", "Pending"}}), Pod("train-1-0-a", "0", json::object())});
  EXPECT_EQ(o.phase, Phase::kRunning);
  EXPECT_EQ(o.flavors["main"]["nvidia.com/gpu"], "h200");
}

TEST(ObserveAttempt, RayJobRunningIsRunning) {
  json job = RayJob(Parse(R"({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})"));
  json workload = AdmittedWorkload();
  EXPECT_EQ(ObserveAttempt(job, &workload, {}).phase, Phase::kRunning);
}

TEST(ObserveAttempt, InvalidImageNameFailsAsSetupError) {
  json pod =
      Pod("train-1-0-a", "0", Parse(R"({"phase": "Pending", "containerStatuses": [{"name": "worker",
                   "state": {"waiting": {"reason": "InvalidImageName",
                   "message": "Failed to apply default image tag \"Ghcr.io/x:1\": couldn't parse image name"}}}]})"));
  json workload = AdmittedWorkload();
  AttemptObservation o = ObserveAttempt(Job(false), &workload, {pod});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "SetupError");
  EXPECT_EQ(o.reason, "InvalidImageName");
  EXPECT_EQ(o.message,
            "Failed to apply default image tag \"Ghcr.io/x:1\": couldn't parse image name");
  EXPECT_FALSE(o.read_from_pods) << "the pod's own news, not a Job's that raced it";
}

TEST(ObserveAttempt, MissingSecretInInitContainerFailsAsSetupErrorEvenWithAPodRunning) {
  json stuck = Pod("train-1-1-b", "1",
                   Parse(R"({"phase": "Pending", "initContainerStatuses": [{"name": "tau-setup",
                     "state": {"waiting": {"reason": "CreateContainerConfigError",
                     "message": "secret \"tau-secrets\" not found"}}}]})"));
  json workload = AdmittedWorkload();
  AttemptObservation o =
      ObserveAttempt(Job(false), &workload, {Pod("train-1-0-a", "0", json::object()), stuck});
  EXPECT_EQ(o.phase, Phase::kFailed);
  EXPECT_EQ(o.failure_class, "SetupError");
  EXPECT_EQ(o.message, "secret \"tau-secrets\" not found");
}

TEST(ObserveAttempt, ImagePullBackOffIsStillAdmitted) {
  json pod =
      Pod("train-1-0-a", "0", Parse(R"({"phase": "Pending", "containerStatuses": [{"name": "worker",
                   "state": {"waiting": {"reason": "ErrImagePull",
                   "message": "rpc error: code = NotFound desc = failed to pull image"}}}]})"));
  json workload = AdmittedWorkload();
  AttemptObservation o = ObserveAttempt(Job(false), &workload, {pod});
  EXPECT_EQ(o.phase, Phase::kAdmitted);
  EXPECT_EQ(o.reason, "ImagePullBackOff");
  EXPECT_EQ(o.message, "rpc error: code = NotFound desc = failed to pull image");
  EXPECT_EQ(o.failure_class, "");
}

// ---- Rule 4: failure classes from the pods (through a failed Job) ----

AttemptObservation FailedJobWith(std::vector<json> pods) {
  json job = Job(false, FailedCondition("BackoffLimitExceeded",
                                        "Job has reached the specified backoff limit"));
  json workload = AdmittedWorkload();
  return ObserveAttempt(job, &workload, pods);
}

TEST(ObserveAttempt, AFailedJobWaitsForPodsThatHaveNotCaughtUp) {
  // The Job's Failed condition came before the pod's own update (separate watches): the pod
  // still reads Running, and how it ended (here OOMKilled) is still to come.
  json running = Pod("train-1-0-a", "0",
                     {{"phase", "Running"},
                      {"containerStatuses", {{{"name", "worker"}, {"state", {{"running", {}}}}}}}});
  AttemptObservation early = FailedJobWith({running});
  EXPECT_FALSE(early.Terminal()) << early.message;
  EXPECT_TRUE(early.read_from_pods) << "the Job failed: its pods are to be read again";
  AttemptObservation later = FailedJobWith({FailedWorker("train-1-0-a", "0", 137, "OOMKilled")});
  EXPECT_EQ(later.phase, Phase::kFailed);
  EXPECT_EQ(later.failure_class, "OOMKilled");
  // A pod that ended beside one that runs, or no pods at all: the Job's word now.
  EXPECT_EQ(FailedJobWith({running, FailedWorker("train-1-1-b", "1", 2)}).phase, Phase::kFailed);
  EXPECT_EQ(FailedJobWith({}).failure_class, "UserError");
}

TEST(ObserveAttempt, OomKilledBeatsTheOtherWorkersExits) {
  AttemptObservation o = FailedJobWith(
      {FailedWorker("train-1-0-a", "0", 1), FailedWorker("train-1-1-b", "1", 137, "OOMKilled")});
  EXPECT_EQ(o.failure_class, "OOMKilled");
  EXPECT_EQ(o.exit_code, 137);
  EXPECT_NE(o.message.find("worker 1"), std::string::npos);
}

TEST(ObserveAttempt, OomKilledInLastStateOfARestartedContainer) {
  json pod =
      Pod("train-1-0-a", "0", Parse(R"({"containerStatuses": [{"name": "worker", "restartCount": 1,
                   "state": {"running": {}},
                   "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})"));
  EXPECT_EQ(FailedJobWith({pod}).failure_class, "OOMKilled");
}

TEST(ObserveAttempt, KubeletEvictionIsEvicted) {
  json pod = Pod("train-1-0-a", "0", Parse(R"({"phase": "Failed", "reason": "Evicted",
                   "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.",
                   "containerStatuses": [{"name": "worker", "state": {"terminated":
                     {"exitCode": 137, "reason": "Error"}}}]})"));
  AttemptObservation o = FailedJobWith({pod});
  EXPECT_EQ(o.failure_class, "Evicted");
  EXPECT_EQ(o.message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.");
  EXPECT_EQ(o.exit_code, 137);
}

json Disrupted(const char* reason, const char* message) {
  json pod = FailedWorker("train-1-0-a", "0", 143);
  pod["status"]["conditions"] = json::array(
      {{{"type", "DisruptionTarget"}, {"status", "True"}, {"reason", reason}, {"message", message}},
       {{"type", "Ready"}, {"status", "False"}}});
  return pod;
}

TEST(ObserveAttempt, DisruptionTargetReasons) {
  struct Case {
    const char* reason;
    const char* failure_class;
  } cases[] = {{"PreemptionByScheduler", "Preempted"},
               {"PreemptionByKubeScheduler", "Preempted"},
               {"DeletionByTaintManager", "NodeLost"},
               {"EvictionByEvictionAPI", "Evicted"},
               {"TerminationByKubelet", "Evicted"}};
  for (const Case& c : cases) {
    AttemptObservation o = FailedJobWith({Disrupted(c.reason, "disrupted")});
    EXPECT_EQ(o.failure_class, c.failure_class) << c.reason;
    EXPECT_EQ(o.message, "disrupted") << c.reason;
    EXPECT_EQ(o.exit_code, 143) << c.reason;
  }
}

TEST(ObserveAttempt, NodeLostPod) {
  for (const char* reason : {"NodeLost", "UnexpectedAdmissionError"}) {
    json pod = Pod("train-1-0-a", "0",
                   {{"phase", "Failed"}, {"reason", reason}, {"message", "Node gpu-7 lost"}});
    AttemptObservation o = FailedJobWith({pod});
    EXPECT_EQ(o.failure_class, "NodeLost") << reason;
    EXPECT_EQ(o.message, "Node gpu-7 lost") << reason;
  }
}

TEST(ObserveAttempt, FailedInitContainerIsSetupError) {
  json pod = Pod("train-1-0-a", "0",
                 Parse(R"({"phase": "Failed", "initContainerStatuses": [{"name": "tau-setup",
                   "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
                   "containerStatuses": [{"name": "worker", "state": {"waiting":
                     {"reason": "PodInitializing"}}}]})"));
  AttemptObservation o = FailedJobWith({pod});
  EXPECT_EQ(o.failure_class, "SetupError");
  EXPECT_EQ(o.message, "init container tau-setup of pod train-1-0-a exited with code 1");
  EXPECT_FALSE(o.exit_code.has_value());
}

TEST(ObserveAttempt, FailedPodsAreReadBeforeOthers) {
  // A running pod that restarted after an OOM does not hide the failed pod's own class.
  json restarted = Pod("train-1-0-a", "0",
                       Parse(R"({"containerStatuses": [{"name": "worker", "state": {"running": {}},
                         "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})"));
  AttemptObservation o = FailedJobWith({restarted, FailedWorker("train-1-1-b", "1", 2)});
  EXPECT_EQ(o.failure_class, "UserError");
  EXPECT_EQ(o.exit_code, 2);
}

// ---- Rule 5: admitted ----

TEST(ObserveAttempt, AdmittedWorkloadIsAdmitted) {
  json workload = AdmittedWorkload();
  AttemptObservation o = ObserveAttempt(Job(false), &workload, {});
  EXPECT_EQ(o.phase, Phase::kAdmitted);
  EXPECT_EQ(o.message, "admitted by ClusterQueue team-a");
  EXPECT_EQ(o.cluster_queue, "team-a");
  EXPECT_EQ(o.flavors, Parse(R"({"main": {"nvidia.com/gpu": "h200", "cpu": "default"}})"));
}

TEST(ObserveAttempt, UnsuspendedJobWithReservedQuotaIsAdmitted) {
  json workload = AdmittedWorkload();
  workload["status"]["conditions"].erase(1);  // no Admitted condition yet
  EXPECT_EQ(ObserveAttempt(Job(false), &workload, {}).phase, Phase::kAdmitted);
  // Still suspended: quota is reserved but admission checks have not passed.
  AttemptObservation o = ObserveAttempt(Job(true), &workload, {});
  EXPECT_EQ(o.phase, Phase::kPending);
  EXPECT_EQ(o.cluster_queue, "team-a");
}

// ---- Rule 6: pending ----

TEST(ObserveAttempt, NoWorkloadIsWaitingForKueue) {
  AttemptObservation o = ObserveAttempt(Job(true), nullptr, {});
  EXPECT_EQ(o.phase, Phase::kPending);
  EXPECT_EQ(o.reason, "WaitingForKueue");
  EXPECT_NE(o.message.find("kueue.x-k8s.io/queue-name"), std::string::npos);
  EXPECT_TRUE(o.flavors.empty());
  EXPECT_EQ(o.cluster_queue, "");
}

TEST(ObserveAttempt, QuotaNotReservedGivesKueuesReason) {
  json workload = Parse(R"({
    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
    "metadata": {"name": "job-train-1-4f2a1", "namespace": "team-a"},
    "spec": {"queueName": "default"},
    "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
      "message": "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 1 more needed"}],
      "resourceRequests": [{"name": "main", "resources": {"nvidia.com/gpu": "8"}}]}
  })");
  AttemptObservation o = ObserveAttempt(Job(true), &workload, {});
  EXPECT_EQ(o.phase, Phase::kPending);
  EXPECT_EQ(o.reason, "Pending");
  EXPECT_EQ(o.message,
            "couldn't assign flavors to pod set main: insufficient unused quota for "
            "nvidia.com/gpu in flavor default-flavor, 1 more needed");
}

TEST(ObserveAttempt, WorkloadWithoutConditionsIsPending) {
  json workload = AdmittedWorkload();
  workload.erase("status");
  AttemptObservation o = ObserveAttempt(Job(true), &workload, {});
  EXPECT_EQ(o.phase, Phase::kPending);
  EXPECT_EQ(o.reason, "Pending");
  EXPECT_EQ(o.message, "waiting for Kueue to consider it");
}

// ---- Malformed input ----

TEST(ObserveAttempt, MalformedObjectsNeverThrowAndArePending) {
  std::vector<json> objects = {
      json(nullptr),
      json("Job"),
      json::array({1, 2}),
      Parse(R"({"kind": 7, "status": "oops", "spec": {"suspend": "no"}})"),
      Parse(R"({"kind": "Job", "status": {"conditions": {"type": "Complete"}}})"),
      Parse(R"({"kind": "Job", "status": {"conditions": [1, "x", {"type": 2, "status": true}]}})"),
      Parse(R"({"kind": "RayJob", "status": {"jobDeploymentStatus": 3, "jobStatus": null}})")};
  std::vector<json> workloads = {
      json(nullptr), json(5), Parse(R"({"status": "x"})"),
      Parse(R"({"status": {"conditions": "x", "admission": []}})"),
      Parse(R"({"status": {"conditions": [{"type": "QuotaReserved", "status": 1, "reason": 2}],
                "admission": {"clusterQueue": 1, "podSetAssignments": [3, {"name": 4},
                {"name": "main", "flavors": [1]}, {"name": "w", "flavors": {"cpu": 1}}]}}})")};
  std::vector<json> pods = {
      json(nullptr), json("pod"),
      Parse(R"({"status": {"phase": 3, "containerStatuses": "x", "initContainerStatuses": [5]}})"),
      Parse(R"({"metadata": [], "status": {"containerStatuses": [{"name": 1, "state":
            {"waiting": {"reason": 5}, "terminated": {"exitCode": "1"}}}], "conditions": [null]}})")};
  for (const json& object : objects) {
    for (const json& w : workloads) {
      AttemptObservation o;
      EXPECT_NO_THROW(o = ObserveAttempt(object, &w, pods)) << object << " " << w;
      EXPECT_EQ(o.phase, Phase::kPending) << object << " " << w;
    }
    EXPECT_NO_THROW(ObserveAttempt(object, nullptr, pods));
  }
}

TEST(ObserveAttempt, MalformedPodsOfAFailedJobGiveUserError) {
  json job = Job(false, FailedCondition("BackoffLimitExceeded", "backoff"));
  std::vector<json> pods = {
      json(nullptr),
      Parse(R"({"status": {"phase": "Failed", "reason": 1, "containerStatuses": [{"lastState":
            {"terminated": {"exitCode": 1.5, "reason": ["OOMKilled"]}}}]}})")};
  AttemptObservation o;
  EXPECT_NO_THROW(o = ObserveAttempt(job, nullptr, pods));
  EXPECT_EQ(o.failure_class, "UserError");
  EXPECT_EQ(o.message, "backoff");
}

// ---- PendingPositions ----

json QueuedWorkload(const std::string& ns, const std::string& name, const std::string& queue,
                    std::optional<int> priority, const std::string& created) {
  json w = {{"apiVersion", "kueue.x-k8s.io/v1beta2"},
            {"kind", "Workload"},
            {"metadata", {{"name", name}, {"namespace", ns}, {"creationTimestamp", created}}},
            {"spec", {{"queueName", queue}}},
            {"status",
             {{"conditions",
               {{{"type", "QuotaReserved"},
                 {"status", "False"},
                 {"reason", "Pending"},
                 {"message", "couldn't assign flavors to pod set main"}}}}}}};
  if (priority) w["spec"]["priority"] = *priority;
  return w;
}

TEST(ObservePendingPositions, OrdersByPriorityThenAgeThenNamePerQueue) {
  std::vector<json> workloads = {
      QueuedWorkload("team-a", "w-old-low", "default", std::nullopt, "2026-11-30T09:00:00Z"),
      QueuedWorkload("team-a", "w-new-high", "default", 100, "2026-11-30T11:00:00Z"),
      QueuedWorkload("team-a", "w-tie-b", "default", 10, "2026-11-30T10:00:00Z"),
      QueuedWorkload("team-a", "w-tie-a", "default", 10, "2026-11-30T10:00:00Z"),
      QueuedWorkload("team-a", "w-older-mid", "default", 10, "2026-11-30T09:30:00Z"),
      QueuedWorkload("team-a", "w-other-queue", "batch", -5, "2026-11-30T12:00:00Z"),
      QueuedWorkload("team-b", "w-other-ns", "default", 0, "2026-11-30T12:00:00Z"),
      QueuedWorkload("team-b", "w-other-ns-2", "default", 0, "2026-11-30T13:00:00Z"),
  };
  json admitted = AdmittedWorkload();  // holds quota: not pending
  workloads.push_back(admitted);
  json finished = QueuedWorkload("team-a", "w-finished", "default", 1000, "2026-11-30T08:00:00Z");
  finished["status"]["conditions"].push_back(
      {{"type", "Finished"}, {"status", "True"}, {"reason", "Failed"}});
  workloads.push_back(finished);

  std::map<std::string, int> want = {{"team-a/w-new-high", 1}, {"team-a/w-older-mid", 2},
                                     {"team-a/w-tie-a", 3},    {"team-a/w-tie-b", 4},
                                     {"team-a/w-old-low", 5},  {"team-a/w-other-queue", 1},
                                     {"team-b/w-other-ns", 1}, {"team-b/w-other-ns-2", 2}};
  EXPECT_EQ(PendingPositions(workloads), want);
}

TEST(ObservePendingPositions, WorkloadWithoutConditionsIsPendingAndMalformedOnesDoNotThrow) {
  json fresh = QueuedWorkload("team-a", "fresh", "default", std::nullopt, "2026-11-30T09:00:00Z");
  fresh.erase("status");
  std::vector<json> workloads = {
      fresh, json(nullptr), json("x"),
      Parse(R"({"metadata": {"name": 1}, "spec": {"priority": "high"}})"),
      Parse(R"({"metadata": {"name": "odd"}, "spec": {"priority": "high"},
                                           "status": {"conditions": 3}})")};
  std::map<std::string, int> got;
  EXPECT_NO_THROW(got = PendingPositions(workloads));
  EXPECT_EQ(got, (std::map<std::string, int>{{"team-a/fresh", 1}, {"/odd", 1}}));
}

// ---- OwnedWorkload ----

TEST(ObserveOwnedWorkload, MatchesByUid) {
  json stale = AdmittedWorkload();  // an earlier Job of the same name: another uid
  stale["metadata"]["name"] = "job-train-1-old";
  stale["metadata"]["ownerReferences"][0]["uid"] = "u-0";
  json other = AdmittedWorkload();
  other["metadata"]["name"] = "job-eval-1-aaaaa";
  other["metadata"]["ownerReferences"][0]["name"] = "eval-1";
  other["metadata"]["ownerReferences"][0]["uid"] = "u-7";
  std::vector<json> workloads = {stale, other, AdmittedWorkload()};
  const json* got = OwnedWorkload(Job(true), workloads);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got, &workloads[2]);
}

TEST(ObserveOwnedWorkload, MatchesByKindAndNameWithoutUid) {
  json job = Job(true);
  job["metadata"].erase("uid");
  json elsewhere = AdmittedWorkload();
  elsewhere["metadata"]["namespace"] = "team-b";
  json ray = AdmittedWorkload();
  ray["metadata"]["ownerReferences"][0]["kind"] = "RayJob";
  ray["metadata"]["ownerReferences"][0]["apiVersion"] = "ray.io/v1";
  std::vector<json> workloads = {elsewhere, ray, AdmittedWorkload()};
  EXPECT_EQ(OwnedWorkload(job, workloads), &workloads[2]);

  // The Workload's reference lacks the uid: kind and name decide too.
  std::vector<json> no_uid = {AdmittedWorkload()};
  no_uid[0]["metadata"]["ownerReferences"][0].erase("uid");
  EXPECT_EQ(OwnedWorkload(Job(true), no_uid), &no_uid[0]);
}

TEST(ObserveOwnedWorkload, NullWhenNoneAndForMalformedInput) {
  json other = AdmittedWorkload();
  other["metadata"]["ownerReferences"][0]["uid"] = "u-9";
  EXPECT_EQ(OwnedWorkload(Job(true), {other}), nullptr);
  EXPECT_EQ(OwnedWorkload(Job(true), {}), nullptr);
  std::vector<json> malformed = {json(nullptr), Parse(R"({"metadata": {"ownerReferences": "x"}})"),
                                 Parse(R"({"metadata": {"ownerReferences": [1, {"uid": 2}]}})")};
  EXPECT_EQ(OwnedWorkload(json("x"), malformed), nullptr);
  EXPECT_EQ(OwnedWorkload(Job(true), malformed), nullptr);
}

}  // namespace
}  // namespace tau::kube
