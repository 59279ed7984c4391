// Scenario tests of the admission engine, driven through the Engine API. Names follow Kueue's
// unit tests (pkg/scheduler/scheduler_test.go, preemption/*_test.go, scheduler_fs_test.go) and
// the worked scenarios of the reference notes; each scenario is rebuilt from what it tests.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

// Table rows leave trailing expectations out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "admission/admission.h"
#include "admission/test_util.h"

namespace tau::admission {
namespace {

using testing::A;
using testing::Doc;
using testing::Outcome;
using testing::Q;
using testing::RunScenario;
using testing::T;
using testing::W;

struct Case {
  std::string name;
  std::string yaml;
  std::map<std::string, std::string> admitted;   // name -> "ps:res=flavor"
  std::map<std::string, std::string> preempted;  // name -> reason
  std::map<std::string, std::string> pending;    // name -> reason
  std::map<std::string, std::string> message;    // name -> substring of its message
  int cycles = 1;
};

const std::string kEng = "{name: eng}";
const std::string kLowerPriority = "preemption: {within_cluster_queue: LowerPriority}";
const std::string kReclaimAny = "preemption: {reclaim_within_cohort: Any}";
const std::string kBothAny =
    "preemption: {within_cluster_queue: LowerPriority, reclaim_within_cohort: Any}";
const std::string kFairSharing = "fair_sharing: true\n";

// S-1: flavors on-demand/spot and a second resource group for a GPU model.
std::string EngCohortS1(int beta_count) {
  std::string queues =
      "  - {name: eng-alpha, cohort: eng, queueing_strategy: StrictFIFO, resource_groups: "
      "[{covered_resources: [cpu], flavors: [{name: on-demand, resources: [{name: cpu, nominal: "
      "50, borrowing_limit: 50}]}, {name: spot, resources: [{name: cpu, nominal: 100, "
      "borrowing_limit: 0}]}]}]}\n"
      "  - {name: eng-beta, cohort: eng, queueing_strategy: StrictFIFO, resource_groups: "
      "[{covered_resources: [cpu], flavors: [{name: on-demand, resources: [{name: cpu, nominal: "
      "50, borrowing_limit: 10}]}, {name: spot, resources: [{name: cpu, nominal: 0, "
      "borrowing_limit: 100}]}]}, {covered_resources: [example.com/gpu], flavors: [{name: "
      "model-a, resources: [{name: example.com/gpu, nominal: 20, borrowing_limit: 0}]}]}], "
      "preemption: {reclaim_within_cohort: Any, within_cluster_queue: LowerPriority}}\n";
  std::string wls = "  - {name: alpha-new, queue: eng-alpha, created: " + T(1) +
                    ", pod_sets: [{name: one, count: 45, requests: {cpu: 1}}]}\n"
                    "  - {name: beta-new, queue: eng-beta, created: " +
                    T(2) + ", pod_sets: [{name: one, count: " + std::to_string(beta_count) +
                    ", requests: {cpu: 1}}]}\n";
  return Doc(kEng, queues, wls);
}

std::vector<Case> ScheduleCases() {
  std::vector<Case> cases;
  // --- pkg/scheduler/scheduler_test.go (TestSchedule) ---
  // Admission checks are out of scope: the "check state ready" part is dropped.
  cases.push_back({"workload fits in single clusterQueue, with check state ready",
                   Doc("", Q("sales", "", "default=50"), W("foo", "sales", "10")),
                   {{"foo", "main:cpu=default"}}});
  cases.push_back(
      {"single clusterQueue full (S-6, StrictFIFO)",
       Doc("", Q("sales", "", "default=50", "queueing_strategy: StrictFIFO"),
           A("assigned", "sales", "40", "default") + W("new", "sales", "11")),
       {},
       {},
       {{"new", kReasonWaitingForQuota}},
       {{"new", "insufficient unused quota for cpu in flavor default, 1 more needed"}}});
  // Namespace selectors are out of scope; the closest analogue is a workload that no flavor of
  // its queue can take (node selector mismatch) and is parked as inadmissible.
  cases.push_back({"failed to match clusterQueue selector",
                   "flavors: [{name: default, node_labels: {zone: a}}]\nqueues:\n" +
                       Q("sales", "", "default=50") +
                       "workloads:\n  - {name: foo, queue: sales, requests: {cpu: 1}, "
                       "node_selector: {zone: b}}\n",
                   {},
                   {},
                   {{"foo", kReasonNoMatchingFlavor}},
                   {{"foo", "flavor default doesn't match node affinity"}}});
  cases.push_back({"admit in different cohorts",
                   Doc("{name: eng}, {name: sales}",
                       Q("eng-alpha", "eng", "on-demand=50") + Q("sales-q", "sales", "default=50"),
                       W("a", "eng-alpha", "40") + W("b", "sales-q", "40")),
                   {{"a", "main:cpu=on-demand"}, {"b", "main:cpu=default"}}});
  cases.push_back(
      {"admit in same cohort with no borrowing",
       Doc(kEng, Q("eng-alpha", "eng", "on-demand=50") + Q("eng-beta", "eng", "on-demand=50"),
           W("a", "eng-alpha", "40") + W("b", "eng-beta", "40")),
       {{"a", "main:cpu=on-demand"}, {"b", "main:cpu=on-demand"}}});
  cases.push_back(
      {"assign multiple resources and flavors",
       "flavors: [{name: on-demand}, {name: spot}, {name: model-a}, {name: model-b}]\nqueues:\n"
       "  - {name: multi, resource_groups: [{covered_resources: [cpu, memory], flavors: [{name: "
       "on-demand, resources: [{name: cpu, nominal: 50}, {name: memory, nominal: 600Gi}]}, "
       "{name: spot, resources: [{name: cpu, nominal: 100}, {name: memory, nominal: 1Ti}]}]}, "
       "{covered_resources: [example.com/gpu], flavors: [{name: model-a, resources: [{name: "
       "example.com/gpu, nominal: 20}]}, {name: model-b, resources: [{name: example.com/gpu, "
       "nominal: 40}]}]}]}\n"
       "workloads:\n  - {name: foo, queue: multi, pod_sets: [{name: one, count: 10, requests: "
       "{cpu: 6, memory: 1Gi}}, {name: two, count: 30, requests: {cpu: 1, example.com/gpu: "
       "1}}]}\n",
       {{"foo", "one:cpu=spot,memory=spot;two:cpu=on-demand,example.com/gpu=model-b"}}});
  cases.push_back({"cannot borrow if cohort was assigned and would result in overadmission (S-1)",
                   EngCohortS1(56),
                   {{"alpha-new", "one:cpu=on-demand"}},
                   {},
                   {{"beta-new", kReasonWaitingForQuota}},
                   {{"beta-new", "Workload no longer fits after processing another workload"}}});
  cases.push_back({"can borrow if cohort was assigned and will not result in overadmission (S-1)",
                   EngCohortS1(55),
                   {{"alpha-new", "one:cpu=on-demand"}, {"beta-new", "one:cpu=on-demand"}}});
  // alpha must reclaim on-demand (it stops at a flavor where it can preempt) while gamma borrows
  // spot in the same cycle.
  cases.push_back(
      {"can borrow if needs reclaim from cohort in different flavor",
       Doc(kEng,
           Q("alpha", "eng", "on-demand=50,spot=0",
             kReclaimAny + ", flavor_fungibility: {when_can_preempt: Preempt}") +
               Q("beta", "eng", "on-demand=0,spot=50") + Q("gamma", "eng", "on-demand=0,spot=0"),
           A("alpha-existing", "alpha", "30", "on-demand") +
               A("beta-borrower", "beta", "20", "on-demand") +
               W("alpha-reclaim", "alpha", "20", 0, 1) + W("gamma-new", "gamma", "10", 0, 2)),
       {{"gamma-new", "main:cpu=spot"}},
       {{"beta-borrower", kPreemptInCohortReclamation}},
       {{"alpha-reclaim", kReasonWaitingForPreemptedWorkloads}}});
  cases.push_back(
      {"workload exceeds lending limit when borrow in cohort",
       Doc(kEng, Q("lender", "eng", "default=10//5") + Q("borrower", "eng", "default=0"),
           W("big", "borrower", "6")),
       {},
       {},
       {{"big", kReasonExceedsMaxQuota}},
       {{"big",
         "insufficient quota for cpu in flavor default, request 6 > maximum "
         "capacity 5"}}});
  cases.push_back({"hierarchical cohort respects lending limit when borrowing",
                   Doc("{name: root}, {name: left, parent: root}, {name: right, parent: root}",
                       Q("a", "left", "default=10//4") + Q("b", "right", "default=0") +
                           Q("c", "right", "default=0"),
                       W("b-five", "b", "5") + W("c-four", "c", "4")),
                   {{"c-four", "main:cpu=default"}},
                   {},
                   {{"b-five", kReasonExceedsMaxQuota}},
                   {{"b-five", "request 5 > maximum capacity 4"}}});
  // alpha-high needs 45: reclaims the borrower in beta and its own lower-priority workload.
  cases.push_back(
      {"preempt workloads in ClusterQueue and cohort",
       Doc(kEng,
           Q("alpha", "eng", "default=50", kBothAny) + Q("beta", "eng", "default=50", kBothAny),
           A("alpha-low", "alpha", "20", "default") + A("beta-borrower", "beta", "60", "default") +
               W("alpha-high", "alpha", "45", 10)),
       {},
       {{"alpha-low", kPreemptInClusterQueue}, {"beta-borrower", kPreemptInCohortReclamation}},
       {{"alpha-high", kReasonWaitingForPreemptedWorkloads}}});
  cases.push_back({"cannot borrow resource not listed in clusterQueue",
                   "flavors: [{name: default}]\ncohorts: [{name: eng}]\nqueues:\n" +
                       Q("a", "eng", "default=10") +
                       "  - {name: b, cohort: eng, resource_groups: [{covered_resources: [memory], "
                       "flavors: [{name: default, resources: [{name: memory, nominal: 10Gi}]}]}]}\n"
                       "workloads:\n  - {name: foo, queue: a, requests: {cpu: 1, memory: 1Gi}}\n",
                   {},
                   {},
                   {{"foo", kReasonNoMatchingFlavor}},
                   {{"foo", "resource memory unavailable in ClusterQueue"}}});
  cases.push_back(
      {"not enough resources to borrow, fallback to next flavor; WhenCanPreempt: "
       "TryNextFlavor",
       Doc(kEng, Q("alpha", "eng", "on-demand=50,spot=100") + Q("beta", "eng", "on-demand=50"),
           A("beta-used", "beta", "45", "on-demand") + W("alpha-new", "alpha", "60")),
       {{"alpha-new", "main:cpu=spot"}}});
  // Partial admission (minCount) is out of scope: a pod set that does not fit whole waits; the
  // scenario checks that nothing is admitted partially.
  cases.push_back({"partial admission single variable pod set",
                   Doc("", Q("sales", "", "default=10"),
                       "  - {name: foo, queue: sales, pod_sets: [{name: main, count: 20, requests: "
                       "{cpu: 1}}]}\n"),
                   {},
                   {},
                   {{"foo", kReasonExceedsMaxQuota}}});
  cases.push_back(
      {"only one workload can borrow one resources from the same flavor in the same "
       "cycle if cohort quota cannot fit",
       Doc(kEng,
           Q("a", "eng", "default=0") + Q("b", "eng", "default=0") +
               Q("lender", "eng", "default=10"),
           W("a-wl", "a", "6", 0, 1) + W("b-wl", "b", "6", 0, 2)),
       {{"a-wl", "main:cpu=default"}},
       {},
       {{"b-wl", kReasonWaitingForQuota}},
       {{"b-wl", "no longer fits"}}});
  // b stops borrowing after its newest workload goes, so its older one is skipped and c's is
  // taken instead.
  cases.push_back({"minimal preemptions when target queue is exhausted",
                   Doc(kEng,
                       Q("a", "eng", "default=6", kReclaimAny) + Q("b", "eng", "default=2") +
                           Q("c", "eng", "default=0"),
                       A("b-1", "b", "2", "default", 0, 1) + A("b-2", "b", "2", "default", 0, 2) +
                           A("c-1", "c", "2", "default", 0, 0) + W("a-new", "a", "6")),
                   {},
                   {{"b-2", kPreemptInCohortReclamation}, {"c-1", kPreemptInCohortReclamation}},
                   {{"a-new", kReasonWaitingForPreemptedWorkloads}}});
  cases.push_back(
      {"A workload is only eligible to do preemptions if it fits fully within nominal "
       "quota",
       Doc(kEng, Q("a", "eng", "default=10", kBothAny) + Q("b", "eng", "default=10"),
           A("a-low", "a", "10", "default") + W("a-high", "a", "12", 10)),
       {},
       {},
       {{"a-high", kReasonWaitingForQuota}},
       {{"a-high", "insufficient unused quota for cpu in flavor default, 2 more needed"}}});
  // The lender can't reclaim from a higher-priority borrower, so its free nominal is held back for
  // it in this cycle and the second borrower does not get it.
  cases.push_back(
      {"capacity blocked when lending clusterqueue not guaranteed to reclaim "
       "(ReclaimWithinCohort=LowerPriority)",
       Doc(kEng,
           Q("lender", "eng", "default=10", "preemption: {reclaim_within_cohort: LowerPriority}") +
               Q("borrower", "eng", "default=0"),
           A("b-1", "borrower", "5", "default", 10) + W("lender-wl", "lender", "10", 0, 1) +
               W("b-2", "borrower", "5", 10, 2)),
       {},
       {},
       {{"lender-wl", kReasonWaitingForQuota}, {"b-2", kReasonWaitingForQuota}},
       {{"b-2", "no longer fits"}}});
  cases.push_back(
      {"BorrowingOverPreemption preference: borrow in second flavor instead of preempting in first",
       Doc(kEng,
           Q("a", "eng", "f1=10,f2=0",
             kLowerPriority + ", flavor_fungibility: {when_can_borrow: TryNextFlavor}") +
               Q("b", "eng", "f1=0,f2=10"),
           A("a-low", "a", "10", "f1") + W("a-high", "a", "5", 10)),
       {{"a-high", "main:cpu=f2"}}});
  return cases;
}

std::vector<Case> PreemptionCases() {
  std::vector<Case> cases;
  const std::string standalone = Q("standalone", "", "default=6", kLowerPriority);
  // --- preemption_test.go (TestPreemption) and P-1/P-2 ---
  cases.push_back(
      {"preempt lowest priority",
       Doc("", standalone,
           A("low", "standalone", "2", "default", -1) + A("mid", "standalone", "2", "default", 0) +
               A("high", "standalone", "2", "default", 1) + W("in", "standalone", "2", 1)),
       {},
       {{"low", kPreemptInClusterQueue}},
       {{"in", kReasonWaitingForPreemptedWorkloads}}});
  cases.push_back(
      {"preempt multiple",
       Doc("", standalone,
           A("low", "standalone", "2", "default", -1) + A("mid", "standalone", "2", "default", 0) +
               A("high", "standalone", "2", "default", 1) + W("in", "standalone", "3", 1)),
       {},
       {{"low", kPreemptInClusterQueue}, {"mid", kPreemptInClusterQueue}}});
  cases.push_back(
      {"no preemption for low priority (P-2a)",
       Doc("", standalone,
           A("low", "standalone", "3", "default", -1) + A("mid", "standalone", "3", "default", 0) +
               W("in", "standalone", "1", -1)),
       {},
       {},
       {{"in", kReasonWaitingForQuota}}});
  cases.push_back(
      {"not enough low priority workloads (P-2b)",
       Doc("", standalone,
           A("low", "standalone", "3", "default", -1) + A("mid", "standalone", "3", "default", 0) +
               W("in", "standalone", "4", 0)),
       {},
       {},
       {{"in", kReasonWaitingForQuota}}});
  cases.push_back(
      {"minimal set excludes low priority (P-1)",
       Doc("", standalone,
           A("low", "standalone", "1", "default", -1) + A("mid", "standalone", "2", "default", 0) +
               A("high", "standalone", "3", "default", 1) + W("in", "standalone", "2", 1)),
       {},
       {{"mid", kPreemptInClusterQueue}}});
  cases.push_back(
      {"some free quota, preempt low priority (P-1)",
       Doc("", standalone,
           A("low", "standalone", "1", "default", -1) + A("mid", "standalone", "1", "default", 0) +
               A("high", "standalone", "3", "default", 1) + W("in", "standalone", "2", 1)),
       {},
       {{"low", kPreemptInClusterQueue}}});
  cases.push_back({"reclaim quota from borrower",
                   Doc(kEng, Q("c1", "eng", "default=6", kBothAny) + Q("c2", "eng", "default=6"),
                       A("c1-existing", "c1", "3", "default") +
                           A("c2-borrower", "c2", "9", "default") + W("in", "c1", "3")),
                   {},
                   {{"c2-borrower", kPreemptInCohortReclamation}}});
  cases.push_back({"not enough workloads borrowing",
                   Doc(kEng, Q("c1", "eng", "default=6", kBothAny) + Q("c2", "eng", "default=6"),
                       A("c1-existing", "c1", "4", "default") +
                           A("c2-borrower", "c2", "7", "default") + W("in", "c1", "3")),
                   {},
                   {},
                   {{"in", kReasonWaitingForQuota}}});
  const std::string lower_both =
      "preemption: {within_cluster_queue: LowerPriority, reclaim_within_cohort: LowerPriority}";
  cases.push_back(
      {"preempt from all ClusterQueues in cohort",
       Doc(kEng, Q("c1", "eng", "default=6", lower_both) + Q("c2", "eng", "default=6", lower_both),
           A("c1-low", "c1", "3", "default", -1) + A("c2-low", "c2", "5", "default", -1) +
               A("c2-high", "c2", "4", "default", 1) + W("in", "c1", "6", 0)),
       {},
       {{"c1-low", kPreemptInClusterQueue}, {"c2-low", kPreemptInCohortReclamation}}});
  cases.push_back({"preempt newer workloads with the same priority",
                   Doc("",
                       Q("standalone", "", "default=6",
                         "preemption: {within_cluster_queue: LowerOrNewerEqualPriority}"),
                       "  - {name: old, queue: standalone, created: " + T(1) +
                           ", requests: {cpu: 3}, admitted: {flavors: {cpu: default}}}\n"
                           "  - {name: newer, queue: standalone, created: " +
                           T(3) + ", requests: {cpu: 3}, admitted: {flavors: {cpu: default}}}\n" +
                           W("in", "standalone", "3", 0, 2)),
                   {},
                   {{"newer", kPreemptInClusterQueue}}});
  const std::string borrow_within =
      "preemption: {reclaim_within_cohort: LowerPriority, borrow_within_cohort: {policy: "
      "LowerPriority}}";
  cases.push_back(
      {"use BorrowWithinCohort; allow preempting a lower-priority workload from another "
       "ClusterQueue while borrowing",
       Doc(kEng, Q("c1", "eng", "default=6", borrow_within) + Q("c2", "eng", "default=6"),
           A("a", "c2", "2", "default", -1, 1) + A("b", "c2", "8", "default", -1, 2) +
               W("in", "c1", "8", 0)),
       {},
       {{"b", kPreemptInCohortReclaimWhileBorrowing}}});
  cases.push_back(
      {"use BorrowWithinCohort; don't allow preempting a lower-priority workload with priority "
       "above MaxPriorityThreshold, if borrowing is required even after the preemption",
       Doc(kEng,
           Q("c1", "eng", "default=6",
             "preemption: {reclaim_within_cohort: LowerPriority, borrow_within_cohort: {policy: "
             "LowerPriority, max_priority_threshold: -2}}") +
               Q("c2", "eng", "default=6"),
           A("a", "c2", "2", "default", -1, 1) + A("b", "c2", "8", "default", -1, 2) +
               W("in", "c1", "8", 0)),
       {},
       {},
       {{"in", kReasonWaitingForQuota}}});
  cases.push_back(
      {"reclaim quota from lender",
       Doc(kEng, Q("c1", "eng", "default=6//3", kReclaimAny) + Q("c2", "eng", "default=6//3"),
           A("c1-existing", "c1", "3", "default") + A("c2-b", "c2", "8", "default") +
               W("in", "c1", "3")),
       {},
       {{"c2-b", kPreemptInCohortReclamation}}});
  cases.push_back(
      {"cannot preempt from other ClusterQueues if exceeds requestable quota including "
       "lending limit",
       Doc(kEng,
           Q("c1", "eng", "default=6", kReclaimAny) + Q("c2", "eng", "default=6//2") +
               Q("c3", "eng", "default=0"),
           A("c3-b", "c3", "2", "default") + W("in", "c1", "9")),
       {},
       {},
       {{"in", kReasonExceedsMaxQuota}},
       {{"in", "request 9 > maximum capacity 8"}}});
  // --- preemption_hierarchical_test.go ---
  const std::string tree =
      "{name: r}, {name: left, parent: r, resource_groups: [{covered_resources: [cpu], flavors: "
      "[{name: default, resources: [{name: cpu, nominal: 4}]}]}]}, {name: right, parent: r}";
  cases.push_back(
      {"preempt with hierarchical advantage",
       Doc(tree, Q("q1", "left", "default=0", kReclaimAny) + Q("q2", "right", "default=0"),
           A("q2-b", "q2", "4", "default", 10) + W("in", "q1", "4", 0)),
       {},
       {{"q2-b", kPreemptInCohortReclamation}}});
  cases.push_back({"avoid queues within nominal quota",
                   Doc(tree,
                       Q("q1", "left", "default=0", kReclaimAny) + Q("q2", "right", "default=0") +
                           Q("q3", "right", "default=4"),
                       A("q3-w", "q3", "4", "default", -5, 9) +
                           A("q2-b", "q2", "4", "default", 0, 1) + W("in", "q1", "4", 0)),
                   {},
                   {{"q2-b", kPreemptInCohortReclamation}}});
  cases.push_back(
      {"preempt multiple with hierarchical advantage",
       Doc(tree, Q("q1", "left", "default=0", kReclaimAny) + Q("q2", "right", "default=0"),
           A("q2-b1", "q2", "2", "default") + A("q2-b2", "q2", "2", "default") +
               W("in", "q1", "4", 0)),
       {},
       {{"q2-b1", kPreemptInCohortReclamation}, {"q2-b2", kPreemptInCohortReclamation}}});
  const std::string lending_tree =
      "{name: r}, {name: left, parent: r, resource_groups: [{covered_resources: [cpu], flavors: "
      "[{name: default, resources: [{name: cpu, nominal: 4, lending_limit: 2}]}]}]}, {name: "
      "right, parent: r}";
  cases.push_back(
      {"respect lending limits",
       Doc(lending_tree, Q("q1", "left", "default=0", kReclaimAny) + Q("q2", "right", "default=0"),
           A("q2-b", "q2", "2", "default") + W("in", "q1", "4", 0) + W("too-big", "q2", "3", 0)),
       {},
       {{"q2-b", kPreemptInCohortReclamation}},
       {{"in", kReasonWaitingForPreemptedWorkloads}, {"too-big", kReasonExceedsMaxQuota}},
       {{"too-big", "request 3 > maximum capacity 2"}}});
  const std::string complex_tree =
      "{name: r}, {name: a, parent: r, resource_groups: [{covered_resources: [cpu], flavors: "
      "[{name: default, resources: [{name: cpu, nominal: 6}]}]}]}, {name: a1, parent: a}, "
      "{name: b, parent: r}";
  cases.push_back({"reclaim in complex hierarchy",
                   Doc(complex_tree,
                       Q("q1", "a1", "default=0", kReclaimAny) + Q("q2", "b", "default=0") +
                           Q("q3", "a", "default=0"),
                       A("q2-w", "q2", "3", "default") + A("q3-w", "q3", "3", "default") +
                           W("in", "q1", "3", 0)),
                   {},
                   {{"q2-w", kPreemptInCohortReclamation}}});
  return cases;
}

std::vector<Case> FairSharingCases() {
  std::vector<Case> cases;
  auto three = [](const std::string& a_extra, const std::string& b_extra) {
    return Q("a", "eng", "default=3", kBothAny + (a_extra.empty() ? "" : ", " + a_extra)) +
           Q("b", "eng", "default=3", kBothAny + (b_extra.empty() ? "" : ", " + b_extra)) +
           Q("c", "eng", "default=3", kBothAny);
  };
  auto many = [](const std::string& prefix, const std::string& queue, int n, int priority = 0) {
    std::string out;
    for (int i = 1; i <= n; ++i) {
      out += A(prefix + std::to_string(i), queue, "1", "default", priority);
    }
    return out;
  };
  // --- preemption_fair_test.go ---
  cases.push_back({"reclaim nominal from user using the most",
                   Doc(kEng, three("", ""),
                       many("b", "b", 3) + many("c", "c", 6) + W("in", "a", "3"), kFairSharing),
                   {},
                   {{"c1", kPreemptInCohortReclamation},
                    {"c2", kPreemptInCohortReclamation},
                    {"c3", kPreemptInCohortReclamation}}});
  cases.push_back({"can't preempt when it would switch the imbalance",
                   Doc(kEng, three("", ""),
                       many("a", "a", 4) + many("b", "b", 5) + W("in", "a", "1"), kFairSharing),
                   {},
                   {},
                   {{"in", kReasonWaitingForQuota}}});
  cases.push_back({"can preempt a combination of same CQ and highest user",
                   Doc(kEng, three("", ""),
                       A("a-low", "a", "1", "default", -1) + A("a-x", "a", "2", "default", 0) +
                           many("b", "b", 6) + W("in", "a", "2", 0),
                       kFairSharing),
                   {},
                   {{"a-low", kPreemptInClusterQueue}, {"b1", kPreemptInCohortFairSharing}}});
  cases.push_back({"CQ with higher weight can preempt more",
                   Doc(kEng, three("fair_sharing: {weight: 2}", ""),
                       many("a", "a", 4) + many("b", "b", 5) + W("in", "a", "1"), kFairSharing),
                   {},
                   {{"b1", kPreemptInCohortFairSharing}}});
  cases.push_back({"can preempt anything borrowing from CQ with 0 weight",
                   Doc(kEng, three("", "fair_sharing: {weight: 0}"),
                       many("a", "a", 4) + many("b", "b", 5) + W("in", "a", "2"), kFairSharing),
                   {},
                   {{"b1", kPreemptInCohortFairSharing}, {"b2", kPreemptInCohortFairSharing}}});
  // --- scheduler_fs_test.go ---
  cases.push_back({"with fair sharing: schedule workload with lowest share first",
                   Doc(kEng,
                       Q("a", "eng", "default=0") + Q("b", "eng", "default=0") +
                           Q("lender", "eng", "default=8"),
                       A("a-old", "a", "4", "default") + A("b-old", "b", "2", "default") +
                           W("a-new", "a", "2", 100, 1) + W("b-new", "b", "2", 0, 2),
                       kFairSharing),
                   {{"b-new", "main:cpu=default"}},
                   {},
                   {{"a-new", kReasonWaitingForQuota}}});
  cases.push_back({"fair sharing schedule highest priority first",
                   Doc(kEng,
                       Q("a", "eng", "default=0") + Q("b", "eng", "default=0") +
                           Q("lender", "eng", "default=2"),
                       W("a-new", "a", "2", 0, 1) + W("b-new", "b", "2", 10, 2), kFairSharing),
                   {{"b-new", "main:cpu=default"}},
                   {},
                   {{"a-new", kReasonWaitingForQuota}}});
  cases.push_back(
      {"with fair sharing: preempt workload from CQ with the highest share",
       Doc(kEng,
           Q("a", "eng", "default=4", kBothAny) + Q("b", "eng", "default=0") +
               Q("c", "eng", "default=0"),
           A("b1", "b", "1", "default") + many("c", "c", 3) + W("in", "a", "2"), kFairSharing),
       {},
       {{"c1", kPreemptInCohortReclamation}, {"c2", kPreemptInCohortReclamation}}});
  return cases;
}

void Check(const Case& c) {
  SCOPED_TRACE(c.name);
  Outcome o = RunScenario(c.yaml, c.cycles);
  EXPECT_EQ(o.admitted, c.admitted);
  EXPECT_EQ(o.preempted, c.preempted);
  for (const auto& [name, reason] : c.pending) {
    ASSERT_TRUE(o.pending.count(name)) << name << " is not pending";
    EXPECT_EQ(o.pending[name].reason, reason) << name << ": " << o.pending[name].message;
  }
  for (const auto& [name, text] : c.message) {
    ASSERT_TRUE(o.pending.count(name)) << name;
    EXPECT_NE(o.pending[name].message.find(text), std::string::npos)
        << name << ": '" << o.pending[name].message << "' lacks '" << text << "'";
  }
}

TEST(AdmissionScheduleTest, KueueScenarios) {
  for (const Case& c : ScheduleCases()) Check(c);
}
TEST(AdmissionPreemptionTest, KueueScenarios) {
  for (const Case& c : PreemptionCases()) Check(c);
}
TEST(AdmissionFairSharingTest, KueueScenarios) {
  for (const Case& c : FairSharingCases()) Check(c);
}

TEST(AdmissionScenarioCount, EverySectionTwoNameIsCovered) {
  EXPECT_EQ(ScheduleCases().size() + PreemptionCases().size() + FairSharingCases().size(), 47u);
}

// ---------------------------------------------------------------------------------------------
// Engine API, quota arithmetic, queues.

ResourceGroup CpuGroup(const std::string& flavor, int nominal, std::optional<int> borrowing = {},
                       std::optional<int> lending = {}) {
  ResourceQuota rq{"cpu", Quantity::FromUnits(nominal), std::nullopt, std::nullopt};
  if (borrowing) rq.borrowing_limit = Quantity::FromUnits(*borrowing);
  if (lending) rq.lending_limit = Quantity::FromUnits(*lending);
  return {{"cpu"}, {{flavor, {rq}}}};
}

ClusterQueue MakeQueue(const std::string& name, const std::string& cohort, ResourceGroup group) {
  ClusterQueue q;
  q.name = name;
  q.cohort = cohort;
  q.resource_groups.push_back(std::move(group));
  return q;
}

Workload MakeWorkload(const std::string& name, const std::string& queue, int cpu, int priority = 0,
                      int64_t created = 0) {
  Workload w;
  w.name = name;
  w.queue = queue;
  w.priority = priority;
  w.created_ms = created;
  w.pod_sets.push_back({"main", 1, {{"cpu", Quantity::FromUnits(cpu)}}, {}, {}});
  return w;
}

int64_t UsageOf(const Result<std::vector<ResourceUsage>>& u, const char* what) {
  EXPECT_TRUE(u.ok());
  EXPECT_EQ(u->size(), 1u);
  const ResourceUsage& r = u->front();
  if (std::string(what) == "nominal") return r.nominal.milli() / 1000;
  if (std::string(what) == "usage") return r.usage.milli() / 1000;
  if (std::string(what) == "available") return r.available.milli() / 1000;
  return r.borrowed.milli() / 1000;
}

TEST(AdmissionEngineTest, CohortTreeArithmeticWithLendingAndBorrowingLimits) {
  // root -> {left (own quota 4), right}; a in left lends at most 3 of 10; b in right may borrow 5.
  Config config;
  config.flavors = {{"default", {}}};
  config.cohorts = {{"root", "", {}, 1.0},
                    {"left", "root", {CpuGroup("default", 4)}, 1.0},
                    {"right", "root", {}, 1.0}};
  config.queues = {MakeQueue("a", "left", CpuGroup("default", 10, std::nullopt, 3)),
                   MakeQueue("b", "right", CpuGroup("default", 0, 5))};
  Result<Engine> engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  // left's subtree = 4 + (10 - 7 kept by a) = 7; the root sees all of it.
  EXPECT_EQ(UsageOf(engine->CohortUsage("left"), "nominal"), 7);
  EXPECT_EQ(UsageOf(engine->CohortUsage("root"), "nominal"), 7);
  // b has no quota of its own: what it can take is what it may borrow.
  EXPECT_EQ(UsageOf(engine->Usage("b"), "available"), 5);
  EXPECT_EQ(UsageOf(engine->Usage("a"), "available"), 14);  // its 10 and left's 4
  // b can borrow at most 5 (its borrowing limit) although 7 are lendable.
  ASSERT_TRUE(engine->AddWorkload(MakeWorkload("b6", "b", 6)).ok());
  CycleResult r = engine->RunCycle({});
  ASSERT_EQ(r.pending.size(), 1u);
  EXPECT_EQ(r.pending[0].reason, kReasonExceedsMaxQuota);
  EXPECT_NE(r.pending[0].message.find("request 6 > maximum capacity 5"), std::string::npos);
  ASSERT_TRUE(engine->RemoveWorkload("b6").ok());
  ASSERT_TRUE(engine->AddWorkload(MakeWorkload("b5", "b", 5)).ok());
  r = engine->RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(UsageOf(engine->Usage("b"), "borrowed"), 5);
  EXPECT_EQ(UsageOf(engine->Usage("b"), "available"), 0);  // at its borrowing limit
  EXPECT_EQ(UsageOf(engine->CohortUsage("right"), "usage"), 5);
  EXPECT_EQ(UsageOf(engine->CohortUsage("left"), "usage"), 0);
  // a keeps 7 for itself, and 2 of its lendable 3 are still free (left's 4 + a's 3 - 5 used).
  ASSERT_TRUE(engine->AddWorkload(MakeWorkload("a9", "a", 9)).ok());
  ASSERT_TRUE(engine->AddWorkload(MakeWorkload("a-big", "a", 10, -1)).ok());
  r = engine->RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(r.admitted[0].name, "a9");
  EXPECT_EQ(UsageOf(engine->Usage("a"), "usage"), 9);
  EXPECT_EQ(UsageOf(engine->CohortUsage("left"), "usage"), 2);  // 9 - 7 local
  EXPECT_EQ(UsageOf(engine->CohortUsage("root"), "usage"), 7);  // 2 + 5
  // Finishing b releases its quota through the tree.
  ASSERT_TRUE(engine->FinishWorkload("b5").ok());
  EXPECT_EQ(UsageOf(engine->CohortUsage("root"), "usage"), 2);
  EXPECT_EQ(UsageOf(engine->CohortUsage("right"), "usage"), 0);
}

TEST(AdmissionEngineTest, ConfigValidation) {
  Config config;
  config.flavors = {{"default", {}}};
  config.queues = {MakeQueue("a", "", CpuGroup("nope", 1))};
  EXPECT_EQ(Engine::Create(config).status().code(), StatusCode::kNotFound);
  config.queues = {MakeQueue("a", "", CpuGroup("default", 1, 2))};
  EXPECT_EQ(Engine::Create(config).status().code(), StatusCode::kInvalidArgument);
  config.cohorts = {{"x", "y", {}, 1.0}, {"y", "x", {}, 1.0}};
  config.queues = {MakeQueue("a", "x", CpuGroup("default", 1))};
  Result<Engine> cyclic = Engine::Create(config);
  ASSERT_FALSE(cyclic.ok());
  EXPECT_NE(cyclic.status().message().find("cycle"), std::string::npos);
  config.cohorts.clear();
  config.queues = {MakeQueue("a", "", CpuGroup("default", 1)),
                   MakeQueue("a", "", CpuGroup("default", 1))};
  EXPECT_EQ(Engine::Create(config).status().code(), StatusCode::kAlreadyExists);
}

TEST(AdmissionEngineTest, WorkloadLifecycleAndErrors) {
  Config config;
  config.flavors = {{"default", {}}};
  config.queues = {MakeQueue("q", "", CpuGroup("default", 4))};
  Engine engine = std::move(Engine::Create(config)).value();
  EXPECT_EQ(engine.AddWorkload(MakeWorkload("w", "qq", 1)).code(), StatusCode::kNotFound);
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("w", "q", 3)).ok());
  EXPECT_EQ(engine.AddWorkload(MakeWorkload("w", "q", 1)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine.FinishWorkload("w").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine.EvictWorkload("w").code(), StatusCode::kFailedPrecondition);
  CycleResult r = engine.RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(*engine.State("w"), WorkloadState::kAdmitted);
  EXPECT_EQ(testing::FlavorsString(*engine.Assignment("w")), "main:cpu=default");
  // Evicted: quota released, pending again, admitted again next cycle.
  ASSERT_TRUE(engine.EvictWorkload("w").ok());
  EXPECT_EQ(UsageOf(engine.Usage("q"), "usage"), 0);
  EXPECT_EQ(*engine.State("w"), WorkloadState::kPending);
  EXPECT_EQ(engine.RunCycle({}).admitted.size(), 1u);
  ASSERT_TRUE(engine.FinishWorkload("w").ok());
  EXPECT_EQ(engine.State("w").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine.Admitted().empty());
  // A restored admission must name flavors the queue has.
  Workload restored = MakeWorkload("r", "q", 1);
  restored.admission = FlavorAssignment{{"main", {{"cpu", "other"}}}};
  EXPECT_EQ(engine.AddWorkload(restored).code(), StatusCode::kInvalidArgument);
}

TEST(AdmissionEngineTest, QueueOrderPrioritiesAndPositions) {
  Config config;
  config.flavors = {{"default", {}}};
  ClusterQueue q = MakeQueue("q", "", CpuGroup("default", 1));
  q.queueing_strategy = QueueingStrategy::kStrictFifo;
  config.queues = {q};
  Engine engine = std::move(Engine::Create(config)).value();
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("old-low", "q", 2, 0, 1)).ok());
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("new-low", "q", 1, 0, 5)).ok());
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("high", "q", 1, 10, 9)).ok());
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("tie-b", "q", 1, 0, 3)).ok());
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("tie-a", "q", 1, 0, 3)).ok());
  EXPECT_EQ(*engine.QueueOrder("q"),
            (std::vector<std::string>{"high", "old-low", "tie-a", "tie-b", "new-low"}));
  CycleResult r = engine.RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(r.admitted[0].name, "high");
  r = engine.RunCycle({});
  EXPECT_TRUE(r.admitted.empty());
  ASSERT_EQ(r.pending.size(), 4u);
  EXPECT_EQ(r.pending[0].name, "old-low");  // StrictFIFO: the head blocks the others
  EXPECT_EQ(r.pending[0].reason, kReasonExceedsMaxQuota);
  EXPECT_FALSE(r.pending[0].inadmissible);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.pending[i].position, i);
  EXPECT_EQ(r.pending[3].name, "new-low");
  EXPECT_EQ(r.pending[3].reason, kReasonPending);
}

TEST(AdmissionEngineTest, BestEffortFifoParksEquivalentWorkloadsUntilQuotaIsReleased) {
  Config config;
  config.flavors = {{"default", {}}};
  // big needs more than q's nominal, so it cannot preempt: a plain NoFit while the lender's
  // quota is in use.
  config.cohorts = {{"c", "", {}, 1.0}};
  config.queues = {MakeQueue("q", "c", CpuGroup("default", 1)),
                   MakeQueue("lender", "c", CpuGroup("default", 3))};
  Engine engine = std::move(Engine::Create(config)).value();
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("running", "lender", 3)).ok());
  ASSERT_EQ(engine.RunCycle({}).admitted.size(), 1u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        engine.AddWorkload(MakeWorkload("big" + std::to_string(i), "q", 2, 0, 10 + i)).ok());
  }
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("small", "q", 1, 0, 20)).ok());
  CycleResult r = engine.RunCycle({});  // big0 fails: the whole equivalence class is parked
  EXPECT_TRUE(r.admitted.empty());
  for (const PendingInfo& p : r.pending) {
    EXPECT_EQ(p.inadmissible, p.name != "small") << p.name;
    if (p.name.rfind("big", 0) == 0) {
      EXPECT_EQ(p.reason, kReasonWaitingForQuota);
    }
  }
  r = engine.RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(r.admitted[0].name, "small");
  EXPECT_EQ(engine.RunCycle({}).heads, 0);  // nothing to try until quota is released
  ASSERT_TRUE(engine.FinishWorkload("running").ok());
  r = engine.RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(r.admitted[0].name, "big0");
}

TEST(AdmissionEngineTest, RemovedWorkloadsGiveTheirRoomBack) {
  Config config;
  config.flavors = {{"default", {}}};
  config.queues = {MakeQueue("q", "", CpuGroup("default", 2))};
  Engine engine = std::move(Engine::Create(config)).value();
  // A long life of short runs, three at a time: the engine keeps room for the three.
  for (int i = 0; i < 3000; ++i) {
    ASSERT_TRUE(engine.AddWorkload(MakeWorkload("w" + std::to_string(i), "q", 1, 0, i)).ok());
    engine.RunCycle({});
    if (i >= 2) {
      ASSERT_TRUE(engine.RemoveWorkload("w" + std::to_string(i - 2)).ok());
    }
  }
  EXPECT_LE(engine.WorkloadSlots(), 3u);
  ASSERT_EQ(engine.RunCycle({}).admitted.size(), 1u);  // the last one, in the room w2997 left
  EXPECT_EQ(engine.Admitted(), (std::vector<std::string>{"w2998", "w2999"}));
}

TEST(AdmissionEngineTest, AReusedSlotIsNotWokenFromTheParkedListOfItsLastWorkload) {
  Config config;
  config.flavors = {{"default", {}}};
  ClusterQueue a = MakeQueue("a", "", CpuGroup("default", 1));
  a.preemption.within_cluster_queue = WithinClusterQueue::kLowerPriority;
  ClusterQueue b = MakeQueue("b", "", CpuGroup("default", 1));
  b.preemption.within_cluster_queue = WithinClusterQueue::kLowerPriority;
  config.queues = {a, b};
  Engine engine = std::move(Engine::Create(config)).value();
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("a-high", "a", 1, 10)).ok());
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("b-high", "b", 1, 10)).ok());
  ASSERT_EQ(engine.RunCycle({}).admitted.size(), 2u);
  // A lower priority run could only preempt, and finds nothing to preempt: parked in a.
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("a-low", "a", 1, 0)).ok());
  CycleResult r = engine.RunCycle({});
  ASSERT_EQ(r.pending.size(), 1u);
  ASSERT_TRUE(r.pending[0].inadmissible);
  // Removed while parked: a's parked list still names its slot, which b-low now takes, and b-low
  // is parked in b the same way.
  ASSERT_TRUE(engine.RemoveWorkload("a-low").ok());
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("b-low", "b", 1, 0)).ok());
  ASSERT_EQ(engine.WorkloadSlots(), 3u);
  r = engine.RunCycle({});
  ASSERT_EQ(r.pending.size(), 1u);
  ASSERT_TRUE(r.pending[0].inadmissible);
  // Quota released in a wakes a's parked list: b-low stays parked, as nothing changed in b.
  ASSERT_TRUE(engine.FinishWorkload("a-high").ok());
  r = engine.RunCycle({});
  EXPECT_EQ(r.heads, 0);
  ASSERT_EQ(r.pending.size(), 1u);
  EXPECT_EQ(r.pending[0].name, "b-low");
  EXPECT_TRUE(r.pending[0].inadmissible);
}

TEST(AdmissionEngineTest, VictimsKeepQuotaUntilEvicted) {
  Config config;
  config.flavors = {{"default", {}}};
  ClusterQueue q = MakeQueue("q", "", CpuGroup("default", 2));
  q.preemption.within_cluster_queue = WithinClusterQueue::kLowerPriority;
  config.queues = {q};
  Engine engine = std::move(Engine::Create(config)).value();
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("low", "q", 2, 0)).ok());
  ASSERT_EQ(engine.RunCycle({}).admitted.size(), 1u);
  ASSERT_TRUE(engine.AddWorkload(MakeWorkload("high", "q", 2, 5)).ok());
  CycleResult r = engine.RunCycle({});
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0].preemptor, "high");
  EXPECT_EQ(*engine.State("low"), WorkloadState::kPreempted);
  // Not evicted yet: the preemptor keeps waiting and nothing new is preempted.
  r = engine.RunCycle({});
  EXPECT_TRUE(r.admitted.empty());
  EXPECT_TRUE(r.preempted.empty());
  ASSERT_EQ(r.pending.size(), 1u);
  EXPECT_EQ(r.pending[0].reason, kReasonWaitingForPreemptedWorkloads);
  EXPECT_EQ(engine.PreemptedAwaitingEviction(), std::vector<std::string>{"low"});
  ASSERT_TRUE(engine.EvictWorkload("low").ok());
  r = engine.RunCycle({});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(r.admitted[0].name, "high");
}

// Randomized: after every cycle no queue exceeds nominal + borrowing limit, no cohort exceeds its
// subtree quota, usage equals the sum of holders, and every admitted workload has a flavor for
// each requested resource.
TEST(AdmissionEngineTest, RandomizedInvariants) {
  std::mt19937 rng(42);
  for (int round = 0; round < 30; ++round) {
    Config config;
    config.flavors = {{"f1", {}}, {"f2", {}}};
    config.fair_sharing = round % 3 == 0;
    config.cohorts = {{"root", "", {}, 1.0}, {"sub", "root", {}, 1.0}};
    std::vector<int> limit(4);
    for (int i = 0; i < 4; ++i) {
      ClusterQueue q;
      q.name = "q" + std::to_string(i);
      q.cohort = i < 2 ? "sub" : "root";
      q.queueing_strategy =
          rng() % 2 ? QueueingStrategy::kStrictFifo : QueueingStrategy::kBestEffortFifo;
      std::vector<FlavorQuotas> fq;
      for (const char* f : {"f1", "f2"}) {
        ResourceQuota rq{"cpu", Quantity::FromUnits(rng() % 8), std::nullopt, std::nullopt};
        if (rng() % 2) rq.borrowing_limit = Quantity::FromUnits(rng() % 6);
        if (rng() % 3 == 0) rq.lending_limit = Quantity::FromUnits(rng() % 4);
        fq.push_back({f, {rq}});
      }
      q.resource_groups.push_back({{"cpu"}, fq});
      q.preemption.within_cluster_queue = static_cast<WithinClusterQueue>(rng() % 3);
      q.preemption.reclaim_within_cohort = static_cast<ReclaimWithinCohort>(rng() % 3);
      if (q.preemption.reclaim_within_cohort != ReclaimWithinCohort::kNever && rng() % 2) {
        q.preemption.borrow_within_cohort = BorrowWithinCohortPolicy::kLowerPriority;
      }
      q.flavor_fungibility.when_can_borrow = static_cast<WhenCanBorrow>(rng() % 2);
      q.flavor_fungibility.when_can_preempt = static_cast<WhenCanPreempt>(rng() % 2);
      config.queues.push_back(q);
    }
    Result<Engine> created = Engine::Create(config);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Engine engine = std::move(created).value();
    std::map<std::string, Workload> all;
    int next = 0;
    for (int cycle = 0; cycle < 40; ++cycle) {
      for (int k = rng() % 4; k > 0; --k) {
        Workload w = MakeWorkload("w" + std::to_string(next++), "q" + std::to_string(rng() % 4),
                                  1 + rng() % 5, static_cast<int>(rng() % 3), cycle);
        ASSERT_TRUE(engine.AddWorkload(w).ok());
        all[w.name] = w;
      }
      for (const std::string& v : engine.PreemptedAwaitingEviction()) {
        if (rng() % 2) {
          ASSERT_TRUE(engine.EvictWorkload(v).ok());
        }
      }
      for (const std::string& a : engine.Admitted()) {
        if (rng() % 5 == 0) {
          ASSERT_TRUE(engine.FinishWorkload(a).ok());
          all.erase(a);
        }
      }
      CycleOptions options;
      options.now_ms = cycle;
      CycleResult r = engine.RunCycle(options);
      std::map<std::string, int> per_queue_admissions;
      for (const AdmittedInfo& a : r.admitted) {
        EXPECT_EQ(++per_queue_admissions[a.queue], 1) << "two admissions in one queue";
      }
      // Usage equals the sum over holders, and limits hold.
      std::map<std::pair<std::string, std::string>, int64_t> held;
      for (const std::string& a : engine.Admitted()) {
        FlavorAssignment fa = *engine.Assignment(a);
        ASSERT_EQ(fa.size(), 1u);
        ASSERT_EQ(fa["main"].count("cpu"), 1u) << "partially admitted";
        held[{all[a].queue, fa["main"]["cpu"]}] += all[a].pod_sets[0].requests["cpu"].milli();
      }
      for (const ClusterQueue& q : config.queues) {
        Result<std::vector<ResourceUsage>> usage = engine.Usage(q.name);
        for (const ResourceUsage& u : *usage) {
          EXPECT_EQ(u.usage.milli(), (held[{q.name, u.flavor}]));
          for (const FlavorQuotas& fq : q.resource_groups[0].flavors) {
            if (fq.flavor != u.flavor || !fq.resources[0].borrowing_limit) continue;
            // Victims may linger until evicted, but nothing new is admitted beyond the limit.
            if (!engine.PreemptedAwaitingEviction().empty()) continue;
            EXPECT_LE(u.usage, u.nominal + *fq.resources[0].borrowing_limit) << q.name;
          }
        }
      }
      if (engine.PreemptedAwaitingEviction().empty()) {
        Result<std::vector<ResourceUsage>> usage = engine.CohortUsage("root");
        for (const ResourceUsage& u : *usage) {
          EXPECT_LE(u.usage, u.nominal) << "root over its quota in flavor " << u.flavor;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tau::admission

namespace tau::admission {
namespace {

TEST(AdmissionEngineTest, AllowedFlavorsPinAPodSet) {
  // Flavor "small" comes first and has room, but a pod set pinned to "large" (a compute profile
  // with a flavor) must not land there; one pinned to "small" cannot use "large" either.
  Config config;
  config.flavors = {{"small", {}}, {"large", {}}};
  ResourceGroup group{{"cpu"},
                      {{"small", {{"cpu", Quantity::FromUnits(2), std::nullopt, std::nullopt}}},
                       {"large", {{"cpu", Quantity::FromUnits(8), std::nullopt, std::nullopt}}}}};
  config.queues = {MakeQueue("q", "", group)};
  Result<Engine> engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Workload pinned_large = MakeWorkload("pinned-large", "q", 1, 0, 1);
  pinned_large.pod_sets[0].allowed_flavors = {"large"};
  Workload pinned_small = MakeWorkload("pinned-small", "q", 4, 0, 2);
  pinned_small.pod_sets[0].allowed_flavors = {"small"};
  Workload free = MakeWorkload("free", "q", 1, 0, 3);
  ASSERT_TRUE(engine->AddWorkload(pinned_large).ok());
  ASSERT_TRUE(engine->AddWorkload(pinned_small).ok());
  ASSERT_TRUE(engine->AddWorkload(free).ok());
  std::map<std::string, std::string> admitted;
  std::vector<PendingInfo> pending;
  for (int c = 0; c < 4; ++c) {
    CycleResult r = engine->RunCycle({c, true});
    for (const AdmittedInfo& a : r.admitted) admitted[a.name] = a.flavors.at("main").at("cpu");
    pending = r.pending;
  }
  EXPECT_EQ(admitted["pinned-large"], "large");
  EXPECT_EQ(admitted["free"], "small");
  EXPECT_EQ(admitted.count("pinned-small"), 0u);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].name, "pinned-small");
  EXPECT_EQ(pending[0].reason, kReasonExceedsMaxQuota);
}

// ---------------------------------------------------------------------------------------------
// Admission fair sharing: the decay, the entry penalty and the ordering, by the numbers.

namespace afs {

Config OneQueue(int64_t half_life_ms, int64_t sampling_ms, double gpu_weight = 1) {
  Config c;
  c.flavors = {{"h100", {}}};
  ClusterQueue q;
  q.name = "gpu";
  q.admission_fair_sharing = true;
  q.resource_groups = {
      {{"nvidia.com/gpu"}, {{"h100", {{"nvidia.com/gpu", Quantity::FromUnits(4)}}}}}};
  c.queues = {q};
  c.admission_fair_sharing =
      AdmissionFairSharing{half_life_ms, sampling_ms, {{"nvidia.com/gpu", gpu_weight}}};
  return c;
}

Workload Gpus(const std::string& name, const std::string& lq, int gpus, int64_t created) {
  Workload w;
  w.name = name;
  w.queue = "gpu";
  w.local_queue = lq;
  w.created_ms = created;
  PodSet ps;
  ps.requests["nvidia.com/gpu"] = Quantity::FromUnits(gpus);
  w.pod_sets = {ps};
  return w;
}

double Consumed(const Engine& e, const std::string& lq) {
  for (const LocalQueueUsage& u : e.LocalQueues())
    if (u.name == lq)
      return u.consumed.count("nvidia.com/gpu") ? u.consumed.at("nvidia.com/gpu") : 0;
  return -1;
}

}  // namespace afs

TEST(AdmissionFairSharingUsageTest, UsageHalvesEveryHalfLifeAndApproachesWhatIsHeld) {
  const int64_t h = 3'600'000;  // half-life 1 h, sampled every minute
  Result<Engine> e = Engine::Create(afs::OneQueue(h, 60'000));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_TRUE(e->SetLocalQueueUsage("idle", "gpu", {{"nvidia.com/gpu", 8}}, 0).ok());
  // Sampled once after exactly one half-life: half is left.
  e->RunCycle({h, false});
  EXPECT_NEAR(afs::Consumed(*e, "idle"), 4.0, 1e-9);
  // Sampling more often decays the same (the decay composes): three more half-lives, per minute.
  for (int64_t t = h + 60'000; t <= 4 * h; t += 60'000) e->RunCycle({t, false});
  EXPECT_NEAR(afs::Consumed(*e, "idle"), 0.5, 1e-9);

  // A queue holding 2 GPUs for a long time converges to 2 (plus its entry penalty, decayed).
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("w", "busy", 2, 0)).ok());
  e->RunCycle({4 * h + 60'000, false});
  ASSERT_EQ(e->State("w").value(), WorkloadState::kAdmitted);
  // Right after admission: nothing held before, the penalty is 2 * (1 - 0.5^(1/60)).
  EXPECT_NEAR(afs::Consumed(*e, "busy"), 2 * (1 - std::pow(0.5, 1.0 / 60)), 1e-9);
  for (int64_t t = 4 * h + 120'000; t <= 30 * h; t += 60'000) e->RunCycle({t, false});
  EXPECT_NEAR(afs::Consumed(*e, "busy"), 2.0, 1e-3);
}

TEST(AdmissionFairSharingUsageTest, WhatAHoldingLeavesIsWhatTheSamplingMade) {
  // What a restart rebuilds a LocalQueue's usage from (DecayedHolding, per unit held) against
  // the engine's own sampling of the same holding: 2 GPUs for 2 h, then an hour after.
  const int64_t h = 3'600'000, minute = 60'000;
  const Config config = afs::OneQueue(h, minute);
  Result<Engine> e = Engine::Create(config);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const int64_t start = minute, end = start + 2 * h, later = end + h;
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("w", "team", 2, 0)).ok());
  e->RunCycle({start, false});
  ASSERT_EQ(e->State("w").value(), WorkloadState::kAdmitted);
  for (int64_t t = start + minute; t <= end; t += minute) e->RunCycle({t, false});
  ASSERT_TRUE(e->FinishWorkload("w").ok());
  for (int64_t t = end + minute; t <= later; t += minute) e->RunCycle({t, false});
  const AdmissionFairSharing& a = *config.admission_fair_sharing;
  EXPECT_NEAR(afs::Consumed(*e, "team"), 2 * DecayedHolding(a, start, end, later), 1e-6);
  // While still held, and before anything is held.
  EXPECT_NEAR(DecayedHolding(a, 0, h, h), 0.5 + (1 - std::pow(0.5, 1.0 / 60)) * 0.5, 1e-12);
  EXPECT_EQ(DecayedHolding(a, h, h - 1, h), 0);
}

TEST(AdmissionFairSharingUsageTest, ABurstFromOneLocalQueueAlternatesWithAnother) {
  // Both queues start equal; each admission's penalty hands the next head to the other queue.
  Result<Engine> e = Engine::Create(afs::OneQueue(3'600'000, 300'000));
  ASSERT_TRUE(e.ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(e->AddWorkload(afs::Gpus("a" + std::to_string(i), "lq-a", 1, 1 + i)).ok());
    ASSERT_TRUE(e->AddWorkload(afs::Gpus("b" + std::to_string(i), "lq-b", 1, 10 + i)).ok());
  }
  std::vector<std::string> order;
  for (int c = 0; c < 4; ++c) {
    for (const AdmittedInfo& a : e->RunCycle({1000 + c, false}).admitted) order.push_back(a.name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "b0", "a1", "b1"}));
}

TEST(AdmissionFairSharingUsageTest, ZeroWeightGoesLastAndPositionsFollowUsage) {
  Config c = afs::OneQueue(3'600'000, 300'000);
  c.local_queues = {{"starved", "gpu", 0.0}, {"heavy", "gpu", 1.0}};
  c.queues[0].resource_groups[0].flavors[0].resources[0].nominal = Quantity::FromUnits(0);
  Result<Engine> e = Engine::Create(c);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(e->SetLocalQueueUsage("heavy", "gpu", {{"nvidia.com/gpu", 1000}}, 0).ok());
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("s", "starved", 1, 1)).ok());
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("h", "heavy", 1, 2)).ok());
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("n", "new", 1, 3)).ok());
  EXPECT_EQ(e->QueueOrder("gpu").value(), (std::vector<std::string>{"n", "h", "s"}));
}

TEST(AdmissionFairSharingUsageTest, ANoFitHeadParksItsShapeInEveryLocalQueue) {
  // Kueue's equivalence hash has no LocalQueue in it: one NoFit head makes the same shape of
  // every LocalQueue inadmissible without each being tried.
  Result<Engine> e = Engine::Create(afs::OneQueue(3'600'000, 300'000));
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(e->SetLocalQueueUsage("lq-a", "gpu", {{"nvidia.com/gpu", 1}}, 0).ok());
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("a", "lq-a", 8, 1)).ok());  // more than the queue has
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("b", "lq-b", 8, 2)).ok());
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("small", "lq-a", 1, 3)).ok());
  CycleResult r = e->RunCycle({1000, true});
  EXPECT_EQ(r.heads, 1);  // lq-b's b (no usage) was tried; lq-a's a was not
  std::map<std::string, PendingInfo> pending;
  for (const PendingInfo& p : r.pending) pending[p.name] = p;
  for (const char* name : {"a", "b"}) {
    EXPECT_TRUE(pending[name].inadmissible) << name;
    EXPECT_EQ(pending[name].reason, kReasonExceedsMaxQuota) << name;
  }
  // Another shape of lq-a is not held back by it.
  r = e->RunCycle({2000, false});
  ASSERT_EQ(r.admitted.size(), 1u);
  EXPECT_EQ(r.admitted[0].name, "small");
  EXPECT_EQ(e->RunCycle({3000, false}).heads, 0);
}

TEST(AdmissionFairSharingUsageTest, ConfigurationMistakesAreRefused) {
  Config c = afs::OneQueue(3'600'000, 300'000);
  c.admission_fair_sharing.reset();
  EXPECT_NE(Engine::Create(c).status().message().find("needs the admission_fair_sharing"),
            std::string::npos);
  c = afs::OneQueue(0, 300'000);
  EXPECT_NE(Engine::Create(c).status().message().find("usage_half_life"), std::string::npos);
  c = afs::OneQueue(3'600'000, 300'000);
  c.local_queues = {{"x", "nope", 1.0}};
  EXPECT_EQ(Engine::Create(c).status().code(), StatusCode::kNotFound);
  c = afs::OneQueue(3'600'000, 300'000, -1);
  EXPECT_FALSE(Engine::Create(c).ok());
  // A LocalQueue belongs to one ClusterQueue.
  c = afs::OneQueue(3'600'000, 300'000);
  ClusterQueue other = c.queues[0];
  other.name = "other";
  c.queues.push_back(other);
  Result<Engine> e = Engine::Create(c);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(e->AddWorkload(afs::Gpus("w1", "lq", 1, 1)).ok());
  Workload w2 = afs::Gpus("w2", "lq", 1, 2);
  w2.queue = "other";
  EXPECT_NE(e->AddWorkload(w2).message().find("belongs to cluster queue 'gpu'"), std::string::npos);
}

}  // namespace
}  // namespace tau::admission
