// Reading an attempt's state back from the cluster: the Job or RayJob, its Kueue Workload and its
// pods become one AttemptObservation. Pure. Objects come from the API server of a cluster tau does
// not own (and from other versions of Kueue and KubeRay), so nothing here trusts a field's type:
// every read goes through the helpers below, and a malformed object reads as "nothing known"
// rather than throwing.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "kube/kube.h"
#include "recovery/failure_class.h"

namespace tau::kube {
namespace {

using nlohmann::json;
using Phase = AttemptObservation::Phase;
using recovery::FailureClass;

// A failure class as AttemptObservation and PodVerdict spell it.
// ---- Type-checked reads (nlohmann's value() throws when the key holds another type) ----

const json* Field(const json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

const json* Path(const json& j, std::initializer_list<std::string_view> keys) {
  const json* cur = &j;
  for (std::string_view key : keys) {
    cur = Field(*cur, key);
    if (cur == nullptr) return nullptr;
  }
  return cur;
}

std::string Str(const json* j) {
  return j != nullptr && j->is_string() ? j->get<std::string>() : "";
}
std::string Str(const json& j, std::initializer_list<std::string_view> keys) {
  return Str(Path(j, keys));
}

std::optional<int64_t> Int(const json* j) {
  if (j == nullptr || !j->is_number_integer()) return std::nullopt;
  return j->get<int64_t>();
}

// An array's elements, or none when the field is absent or not an array.
const std::vector<json>& Items(const json* j) {
  static const std::vector<json> kNone;
  return j != nullptr && j->is_array() ? j->get_ref<const json::array_t&>() : kNone;
}

// The status.conditions[] entry of the given type, or null.
const json* Condition(const json* object, std::string_view type) {
  if (object == nullptr) return nullptr;
  for (const json& c : Items(Path(*object, {"status", "conditions"}))) {
    if (Str(Field(c, "type")) == type) return &c;
  }
  return nullptr;
}

bool IsTrue(const json* condition) {
  return condition != nullptr && Str(Field(*condition, "status")) == "True";
}

// ---- Pods ----

// A pod's container statuses: init containers too when asked.
std::vector<const json*> Containers(const json& pod, bool init) {
  std::vector<const json*> out;
  for (const json& c :
       Items(Path(pod, {"status", init ? "initContainerStatuses" : "containerStatuses"}))) {
    out.push_back(&c);
  }
  return out;
}

// How a container ended: its current state if terminated, else the last one (a restarted
// container, restartPolicy OnFailure); null when it never terminated.
const json* Terminated(const json& container) {
  if (const json* t = Path(container, {"state", "terminated"}); t != nullptr && t->is_object()) {
    return t;
  }
  if (const json* t = Path(container, {"lastState", "terminated"});
      t != nullptr && t->is_object()) {
    return t;
  }
  return nullptr;
}

std::optional<int> ExitCode(const json* terminated) {
  if (terminated == nullptr) return std::nullopt;
  std::optional<int64_t> code = Int(Field(*terminated, "exitCode"));
  if (!code) return std::nullopt;
  return static_cast<int>(*code);
}

// The exit code of the pod's main containers: a non-zero one first (the one that failed), else
// the first known.
std::optional<int> MainExitCode(const json& pod) {
  std::optional<int> first;
  for (const json* c : Containers(pod, false)) {
    std::optional<int> code = ExitCode(Terminated(*c));
    if (code && *code != 0) return code;
    if (code && !first) first = code;
  }
  return first;
}

std::string PodName(const json& pod) { return Str(pod, {"metadata", "name"}); }

// "worker 0" for the pods of an Indexed Job (the completion index says which), else
// "worker in pod NAME".
std::string Who(const json& pod, const json& container) {
  std::string name = Str(Field(container, "name"));
  std::string index =
      Str(pod, {"metadata", "annotations", "batch.kubernetes.io/job-completion-index"});
  if (index.empty()) {
    index = Str(pod, {"metadata", "labels", "batch.kubernetes.io/job-completion-index"});
  }
  if (!index.empty()) return fmt::format("{} {}", name, index);
  return fmt::format("{} in pod {}", name, PodName(pod));
}

struct PodVerdict {
  std::string failure_class;  // "" : the pods say nothing
  std::string reason;
  std::string message;
  std::optional<int> exit_code;
};

// One rule of the pod failure classes, applied to one pod: the verdict, or an empty class.
using PodRule = PodVerdict (*)(const json& pod);

PodVerdict OomRule(const json& pod) {
  for (bool init : {false, true}) {
    for (const json* c : Containers(pod, init)) {
      const json* t = Terminated(*c);
      if (t != nullptr && Str(Field(*t, "reason")) == "OOMKilled") {
        return {recovery::FailureClassName(FailureClass::kOOMKilled), "OOMKilled",
                fmt::format("{} was killed for running out of memory (OOMKilled)", Who(pod, *c)),
                MainExitCode(pod)};
      }
    }
  }
  return {};
}

PodVerdict EvictedRule(const json& pod) {
  if (Str(pod, {"status", "reason"}) != "Evicted") return {};
  std::string message = Str(pod, {"status", "message"});
  if (message.empty()) message = fmt::format("pod {} was evicted", PodName(pod));
  return {recovery::FailureClassName(FailureClass::kEvicted), "Evicted", message,
          MainExitCode(pod)};
}

PodVerdict DisruptionRule(const json& pod) {
  const json* c = Condition(&pod, "DisruptionTarget");
  if (!IsTrue(c)) return {};
  std::string reason = Str(Field(*c, "reason"));
  std::string cls;
  if (reason == "PreemptionByScheduler" || reason == "PreemptionByKubeScheduler") {
    cls = recovery::FailureClassName(FailureClass::kPreempted);
  } else if (reason == "DeletionByTaintManager") {
    cls = recovery::FailureClassName(FailureClass::kNodeLost);
  } else if (reason == "EvictionByEvictionAPI" || reason == "TerminationByKubelet") {
    cls = recovery::FailureClassName(FailureClass::kEvicted);
  } else {
    return {};
  }
  std::string message = Str(Field(*c, "message"));
  if (message.empty()) message = fmt::format("pod {} was disrupted ({})", PodName(pod), reason);
  return {cls, reason, message, MainExitCode(pod)};
}

PodVerdict NodeLostRule(const json& pod) {
  std::string reason = Str(pod, {"status", "reason"});
  if (reason != "NodeLost" && reason != "UnexpectedAdmissionError") return {};
  std::string message = Str(pod, {"status", "message"});
  if (message.empty()) message = fmt::format("pod {} failed: {}", PodName(pod), reason);
  return {recovery::FailureClassName(FailureClass::kNodeLost), reason, message, MainExitCode(pod)};
}

// tau's init container unpacks the code and installs pip packages: its failure is the setup's.
PodVerdict InitExitRule(const json& pod) {
  for (const json* c : Containers(pod, true)) {
    std::optional<int> code = ExitCode(Terminated(*c));
    if (code && *code != 0) {
      return {recovery::FailureClassName(FailureClass::kSetupError), "InitContainerFailed",
              fmt::format("init container {} of pod {} exited with code {}", Str(Field(*c, "name")),
                          PodName(pod), *code),
              MainExitCode(pod)};
    }
  }
  return {};
}

PodVerdict ExitRule(const json& pod) {
  for (const json* c : Containers(pod, false)) {
    std::optional<int> code = ExitCode(Terminated(*c));
    if (code && *code != 0) {
      return {recovery::FailureClassName(FailureClass::kUserError), "Error",
              fmt::format("{} exited with code {}", Who(pod, *c), *code), code};
    }
  }
  return {};
}

// The failure class the pods give (rule 4 of docs/kubernetes.md): failed pods first, then any;
// within each, the rules in order of how specific they are, so that an OOMKilled worker is not
// hidden by the non-zero exits of the workers torchrun then stopped. Pods are read in name order
// so the verdict does not depend on the order the API server listed them.
PodVerdict ClassifyPods(const std::vector<json>& pods) {
  std::vector<const json*> sorted;
  for (const json& p : pods) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const json* a, const json* b) { return PodName(*a) < PodName(*b); });
  std::vector<const json*> failed;
  for (const json* p : sorted) {
    if (Str(*p, {"status", "phase"}) == "Failed") failed.push_back(p);
  }
  static constexpr PodRule kRules[] = {OomRule,      EvictedRule,  DisruptionRule,
                                       NodeLostRule, InitExitRule, ExitRule};
  for (const std::vector<const json*>* group : {&failed, &sorted}) {
    for (PodRule rule : kRules) {
      for (const json* p : *group) {
        PodVerdict v = rule(*p);
        if (!v.failure_class.empty()) return v;
      }
    }
  }
  return {};
}

// Fills a kFailed observation from the pods, or UserError with the object's own words.
void FailFromPods(AttemptObservation& out, const std::vector<json>& pods, std::string reason,
                  std::string message) {
  out.phase = Phase::kFailed;
  PodVerdict v = ClassifyPods(pods);
  out.reason = std::move(reason);
  if (v.failure_class.empty()) {
    out.failure_class = recovery::FailureClassName(FailureClass::kUserError);
    out.message = std::move(message);
    for (const json& p : pods) {  // the exit code, if any pod knows one
      if (!out.exit_code) out.exit_code = MainExitCode(p);
    }
    return;
  }
  out.failure_class = v.failure_class;
  out.message = v.message;
  out.exit_code = v.exit_code;
  if (out.reason.empty()) out.reason = v.reason;
}

// ---- Rule 1: terminal from the object ----

// Whether every pod still says it runs or waits, none with a container that terminated: a view of
// the pods older than the Job's own status (the watches of pods and Jobs are separate streams, so
// the Job's Failed condition can arrive first). How the pods ended is then still to come.
bool PodsNotCaughtUp(const std::vector<json>& pods) {
  if (pods.empty()) return false;
  for (const json& p : pods) {
    const std::string phase = Str(p, {"status", "phase"});
    if (phase != "Running" && phase != "Pending") return false;
    // A container that terminated, or an init container that failed (one that completed is how
    // every running pod starts), says how the pod ended.
    for (const char* list : {"containerStatuses", "initContainerStatuses"}) {
      const bool init = std::string_view(list) == "initContainerStatuses";
      const json* status = Field(p, "status");
      const json* statuses = status ? Field(*status, list) : nullptr;
      if (statuses == nullptr || !statuses->is_array()) continue;
      for (const json& c : *statuses) {
        const json* state = c.is_object() ? Field(c, "state") : nullptr;
        const json* terminated = state ? Field(*state, "terminated") : nullptr;
        if (terminated == nullptr) {
          // A main container that ran before and was restarted: its last end is news too.
          const json* last = init || !c.is_object() ? nullptr : Field(c, "lastState");
          if (last != nullptr && Field(*last, "terminated") != nullptr) return false;
          continue;
        }
        const json* code = Field(*terminated, "exitCode");
        if (!init || code == nullptr || !code->is_number_integer() || code->get<int64_t>() != 0)
          return false;
      }
    }
  }
  return true;
}

bool JobTerminal(const json& object, const std::vector<json>& pods, AttemptObservation& out) {
  for (const char* type : {"Complete", "SuccessCriteriaMet"}) {
    if (IsTrue(Condition(&object, type))) {
      out.phase = Phase::kSucceeded;
      out.reason = type;
      out.message = "the Job completed";
      return true;
    }
  }
  const json* failed = Condition(&object, "Failed");
  if (!IsTrue(failed)) return false;
  std::string reason = Str(Field(*failed, "reason"));
  std::string message = Str(Field(*failed, "message"));
  if (reason == "DeadlineExceeded") {
    out.phase = Phase::kFailed;
    out.failure_class = recovery::FailureClassName(FailureClass::kTimeout);
    out.reason = reason;
    out.message = message.empty() ? "the Job ran past its activeDeadlineSeconds" : message;
    return true;
  }
  // The pods say how it failed (OOMKilled, Evicted, an exit code); wait for them to say it.
  out.read_from_pods = true;
  if (PodsNotCaughtUp(pods)) return false;
  FailFromPods(out, pods, reason, message.empty() ? "the Job failed" : message);
  return true;
}

bool RayJobTerminal(const json& object, const std::vector<json>& pods, AttemptObservation& out) {
  std::string deployment = Str(object, {"status", "jobDeploymentStatus"});
  std::string job = Str(object, {"status", "jobStatus"});
  std::string reason = Str(object, {"status", "reason"});
  std::string message = Str(object, {"status", "message"});
  if (deployment == "Complete" && job == "SUCCEEDED") {
    out.phase = Phase::kSucceeded;
    out.reason = "Complete";
    out.message = message.empty() ? "the Ray job succeeded" : message;
    return true;
  }
  if (deployment != "Failed" && job != "FAILED" && job != "STOPPED") return false;
  if (reason == "DeadlineExceeded") {
    out.phase = Phase::kFailed;
    out.failure_class = recovery::FailureClassName(FailureClass::kTimeout);
    out.reason = reason;
    out.message = message.empty() ? "the RayJob ran past its activeDeadlineSeconds" : message;
    return true;
  }
  out.read_from_pods = true;
  std::string fallback = message;
  if (fallback.empty()) {
    fallback = job.empty() ? "the RayJob failed" : fmt::format("the Ray job ended {}", job);
  }
  FailFromPods(out, pods, reason.empty() ? (job.empty() ? deployment : job) : reason, fallback);
  if (!message.empty() &&
      out.failure_class == recovery::FailureClassName(FailureClass::kUserError)) {
    // A non-zero exit is the submitter's (ray job submit); KubeRay's message says which Ray job
    // failed and why, more than the code does.
    out.message = message;
  }
  return true;
}

// ---- Rule 3: what the pods say while the object runs ----

// Waiting reasons Kubernetes retries forever although they cannot heal by themselves.
bool FatalWaiting(const std::string& reason) {
  return reason == "InvalidImageName" || reason == "CreateContainerConfigError" ||
         reason == "ErrImageNeverPull";
}

bool PullWaiting(const std::string& reason) {
  return reason == "ErrImagePull" || reason == "ImagePullBackOff";
}

// The first container (init ones included) waiting for one of `which`' reasons.
struct Waiting {
  const json* pod = nullptr;
  const json* container = nullptr;
  std::string reason, message;
};
Waiting FindWaiting(const std::vector<const json*>& pods, bool (*which)(const std::string&)) {
  for (const json* p : pods) {
    for (bool init : {true, false}) {
      for (const json* c : Containers(*p, init)) {
        std::string reason = Str(*c, {"state", "waiting", "reason"});
        if (which(reason)) return {p, c, reason, Str(*c, {"state", "waiting", "message"})};
      }
    }
  }
  return {};
}

}  // namespace

const char* PhaseName(AttemptObservation::Phase phase) {
  switch (phase) {
    case Phase::kPending:
      return "Pending";
    case Phase::kAdmitted:
      return "Admitted";
    case Phase::kRunning:
      return "Running";
    case Phase::kSucceeded:
      return "Succeeded";
    case Phase::kFailed:
      return "Failed";
    case Phase::kEvicted:
      return "Evicted";
  }
  return "Unknown";
}

AttemptObservation ObserveAttempt(const json& object, const json* workload,
                                  const std::vector<json>& pods) {
  AttemptObservation out;

  // Kueue's assignment, in every phase it is known in (a terminal attempt keeps its flavors for
  // the evidence record).
  if (workload != nullptr) {
    if (const json* admission = Path(*workload, {"status", "admission"}); admission != nullptr) {
      out.cluster_queue = Str(Field(*admission, "clusterQueue"));
      for (const json& a : Items(Field(*admission, "podSetAssignments"))) {
        std::string pod_set = Str(Field(a, "name"));
        const json* flavors = Field(a, "flavors");
        if (pod_set.empty() || flavors == nullptr || !flavors->is_object()) continue;
        json entry = json::object();
        for (const auto& [resource, flavor] : flavors->items()) {
          if (flavor.is_string()) entry[resource] = flavor;
        }
        out.flavors[pod_set] = std::move(entry);
      }
    }
  }

  // 1. Terminal: the object's own word beats anything Kueue or the pods say afterwards (once the
  // pods have caught up with it: PodsNotCaughtUp).
  bool terminal = Str(object, {"kind"}) == "RayJob" ? RayJobTerminal(object, pods, out)
                                                    : JobTerminal(object, pods, out);
  if (terminal) return out;

  const json* quota = Condition(workload, "QuotaReserved");

  // 2. Evicted: Kueue took the admission back.
  if (const json* evicted = Condition(workload, "Evicted"); IsTrue(evicted) && !IsTrue(quota)) {
    std::string reason = Str(Field(*evicted, "reason"));
    out.phase = Phase::kEvicted;
    out.failure_class =
        recovery::FailureClassName(reason == "Preempted"      ? FailureClass::kPreempted
                                   : reason == "NodeFailures" ? FailureClass::kNodeLost
                                                              : FailureClass::kEvicted);
    out.reason = reason;
    out.message = Str(Field(*evicted, "message"));
    return out;
  }

  // 3. The pods.
  std::vector<const json*> sorted;
  for (const json& p : pods) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const json* a, const json* b) { return PodName(*a) < PodName(*b); });
  // Kubernetes retries these forever; they never heal without a new spec, so tau fails the
  // attempt instead of holding its GPUs.
  if (Waiting w = FindWaiting(sorted, FatalWaiting); w.pod != nullptr) {
    out.phase = Phase::kFailed;
    out.failure_class = recovery::FailureClassName(FailureClass::kSetupError);
    out.reason = w.reason;
    out.message =
        w.message.empty() ? fmt::format("{}: {}", Who(*w.pod, *w.container), w.reason) : w.message;
    return out;
  }
  for (const json* p : sorted) {
    if (Str(*p, {"status", "phase"}) == "Running") {
      out.phase = Phase::kRunning;
      out.reason = "Running";
      out.message = fmt::format("pod {} is running", PodName(*p));
      return out;
    }
  }
  if (Str(object, {"kind"}) == "RayJob" &&
      Str(object, {"status", "jobDeploymentStatus"}) == "Running") {
    out.phase = Phase::kRunning;
    out.reason = "Running";
    out.message = "the Ray job is running";
    return out;
  }
  // A failed pull may be a registry's hiccup: Kubernetes retries, so the attempt only waits.
  if (Waiting w = FindWaiting(sorted, PullWaiting); w.pod != nullptr) {
    out.phase = Phase::kAdmitted;
    out.reason = "ImagePullBackOff";
    out.message = w.message.empty()
                      ? fmt::format("{}: pulling its image", Who(*w.pod, *w.container))
                      : w.message;
    return out;
  }

  // 5. Admitted. A Job Kueue has unsuspended is admitted even when the Admitted condition lags
  // behind (or is absent, as in Kueue versions before admission checks).
  const json* suspend = Path(object, {"spec", "suspend"});
  bool unsuspended = suspend != nullptr && suspend->is_boolean() && !suspend->get<bool>();
  if (IsTrue(Condition(workload, "Admitted")) || (unsuspended && IsTrue(quota))) {
    out.phase = Phase::kAdmitted;
    out.reason = "Admitted";
    out.message = out.cluster_queue.empty()
                      ? "admitted by Kueue"
                      : fmt::format("admitted by ClusterQueue {}", out.cluster_queue);
    return out;
  }

  // 6. Pending.
  out.phase = Phase::kPending;
  if (workload == nullptr) {
    out.reason = "WaitingForKueue";
    out.message =
        "waiting for Kueue to create the run's Workload (is Kueue installed, and does the "
        "namespace have the LocalQueue named in the kueue.x-k8s.io/queue-name label?)";
    return out;
  }
  if (quota != nullptr) {
    out.reason = Str(Field(*quota, "reason"));
    out.message = Str(Field(*quota, "message"));
    if (IsTrue(quota) && out.message.empty()) {
      out.message = "quota reserved; waiting for the admission checks";
    }
  }
  if (out.reason.empty()) out.reason = "Pending";
  if (out.message.empty()) out.message = "waiting for Kueue to consider it";
  return out;
}

std::map<std::string, int> PendingPositions(const std::vector<json>& workloads) {
  struct Entry {
    int64_t priority;
    std::string created, name, key;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Entry>> queues;
  for (const json& w : workloads) {
    if (IsTrue(Condition(&w, "QuotaReserved")) || IsTrue(Condition(&w, "Finished"))) continue;
    std::string name = Str(w, {"metadata", "name"});
    if (name.empty()) continue;
    std::string ns = Str(w, {"metadata", "namespace"});
    queues[{ns, Str(w, {"spec", "queueName"})}].push_back(
        {Int(Path(w, {"spec", "priority"})).value_or(0), Str(w, {"metadata", "creationTimestamp"}),
         name, fmt::format("{}/{}", ns, name)});
  }
  std::map<std::string, int> out;
  for (auto& [queue, entries] : queues) {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(b.priority, a.created, a.name) < std::tie(a.priority, b.created, b.name);
    });
    for (size_t i = 0; i < entries.size(); ++i) out[entries[i].key] = static_cast<int>(i + 1);
  }
  return out;
}

const json* OwnedWorkload(const json& object, const std::vector<json>& workloads) {
  std::string uid = Str(object, {"metadata", "uid"});
  std::string kind = Str(object, {"kind"});
  std::string name = Str(object, {"metadata", "name"});
  std::string ns = Str(object, {"metadata", "namespace"});
  for (const json& w : workloads) {
    for (const json& ref : Items(Path(w, {"metadata", "ownerReferences"}))) {
      std::string ref_uid = Str(Field(ref, "uid"));
      if (!uid.empty() && !ref_uid.empty()) {
        // A uid names one object for ever: a Workload left by an earlier object of the same name
        // does not match.
        if (uid == ref_uid) return &w;
        continue;
      }
      if (!name.empty() && Str(Field(ref, "kind")) == kind && Str(Field(ref, "name")) == name &&
          Str(w, {"metadata", "namespace"}) == ns) {
        return &w;
      }
    }
  }
  return nullptr;
}

}  // namespace tau::kube
