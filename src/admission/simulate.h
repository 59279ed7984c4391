// The admission simulator: a YAML description of flavors, cohorts, cluster queues and workloads
// is loaded into an Engine and run for N scheduling cycles. Pure: it takes the text, not a path.
//
//   flavors:   [{name, node_labels: {k: v}}]
//   cohorts:   [{name, parent, resource_groups, fair_sharing: {weight}}]
//   queues:    [{name, cohort, queueing_strategy: StrictFIFO|BestEffortFIFO,
//                resource_groups: [{covered_resources: [..],
//                                   flavors: [{name, resources: [{name, nominal,
//                                              borrowing_limit, lending_limit}]}]}],
//                preemption: {within_cluster_queue, reclaim_within_cohort,
//                             borrow_within_cohort: {policy, max_priority_threshold}},
//                flavor_fungibility: {when_can_borrow: Borrow|TryNextFlavor,
//                                     when_can_preempt: TryNextFlavor|Preempt},
//                fair_sharing: {weight}}]
//   fair_sharing: true | {enabled: true, preemption_strategies: [..]}
//   admission_fair_sharing: {usage_half_life: 168h, usage_sampling_interval: 5m,
//                            resource_weights: {res: w}}   (queues opt in with
//                            admission_mode: UsageBasedAdmissionFairSharing)
//   local_queues: [{name, queue, fair_sharing: {weight}, usage: {res: qty}}]
//   workloads: [{name, queue | local_queue, priority, created: RFC 3339,
//                requests: {res: qty} | pod_sets: [{name, count, requests, node_selector}],
//                node_selector: {k: v},
//                admitted: {flavors: {res: flavor} | {podset: {res: flavor}}, at: RFC 3339}}]
//
// Every cohort a queue or cohort names must be listed under `cohorts`. A workload without
// `created` is ordered by its place in the file. Cycle N runs N seconds after the latest `created`
// (LocalQueue usage decays by that clock). Errors are collected, one per problem:
//   sim.yaml:12:7: error: unknown key 'nominl' in resource (did you mean 'nominal'?)
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/admission.h"
#include "common/status.h"

namespace tau::admission {

// The top-level sections of a platform file (docs/platform.md), in two kinds: the admission
// configuration the simulator reads too, and platform policy, which a simulation accepts in a
// copy of a platform file and reports as not simulated. The platform reader takes both lists, so
// that a section added to the platform is known to the simulator at once.
inline constexpr const char* kAdmissionSections[] = {"flavors", "cohorts", "queues", "fair_sharing",
                                                     "admission_fair_sharing"};
inline constexpr const char* kPlatformPolicySections[] = {
    "schema_version", "priorities", "workspaces",  "defaults", "compute_profiles", "storage",
    "access",         "users",      "node_labels", "topology", "budgets",          "costs"};

struct Diagnostic {
  std::string file;
  int line = 0;    // 1-based
  int column = 0;  // 1-based
  std::string message;
  std::string ToString() const;  // "file:line:col: error: message"
};

struct SimulationInput {
  Config config;
  std::vector<Workload> workloads;  // in file order
  // LocalQueues' usage at the start (admission fair sharing).
  struct Usage {
    std::string local_queue, queue;
    std::map<std::string, double> consumed;
  };
  std::vector<Usage> usage;
  // Sections of a platform file left in (workspaces, priorities, ...): accepted, not simulated.
  std::vector<std::string> platform_sections;
};

// Parses the YAML; on failure returns InvalidArgument whose message is every diagnostic, one per
// line, and (when `diagnostics` is given) the diagnostics themselves.
Result<SimulationInput> ParseSimulation(std::string_view yaml, std::string_view filename,
                                        std::vector<Diagnostic>* diagnostics = nullptr);

// Reads only the configuration sections (flavors, cohorts, queues, fair_sharing) of a YAML
// document, with the rules and messages of ParseSimulation; other top-level keys are the caller's
// and are not looked at, and a document that is not a mapping gives an empty Config (the caller
// reports that). For files that embed an admission configuration, such as platform.yaml.
Result<Config> ParseAdmissionConfig(std::string_view yaml, std::string_view filename,
                                    std::vector<Diagnostic>* diagnostics = nullptr);

// Runs `cycles` scheduling cycles (at least 1). Between cycles the victims of the previous cycle
// are evicted (quota released, requeued), so their preemptor can be admitted later. Returns
//   {"admitted": [{"name","queue","flavors": {podset: {res: flavor}}}],
//    "preempted": [{"name","reason","preemptor"}],
//    "pending": [{"name","reason","message","inadmissible","position"}],
//    "local_queues": [{"name","queue","usage","consumed","admitted"}]  (admission fair sharing)
//    "not_simulated": [section, ...]}  (only when a platform file's other sections are there)
// where `admitted` lists admissions made in those cycles and `pending` every workload still
// waiting (by queue, in queue order).
Result<nlohmann::json> Simulate(std::string_view yaml, std::string_view filename, int cycles = 1,
                                std::vector<Diagnostic>* diagnostics = nullptr);

}  // namespace tau::admission
