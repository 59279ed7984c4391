// Helpers for the admission tests: run a YAML scenario through the Engine API and collect what
// happened in a form that is easy to compare.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "admission/admission.h"
#include "admission/simulate.h"
#include "common/strings.h"

namespace tau::admission::testing {

// "ps:res=flavor,res=flavor;ps2:..." in sorted order.
inline std::string FlavorsString(const FlavorAssignment& a) {
  std::vector<std::string> parts;
  for (const auto& [ps, m] : a) {
    std::vector<std::string> rs;
    for (const auto& [r, f] : m) rs.push_back(r + "=" + f);
    parts.push_back(ps + ":" + Join(rs, ","));
  }
  return Join(parts, ";");
}

struct Outcome {
  std::map<std::string, std::string> admitted;   // name -> FlavorsString
  std::map<std::string, std::string> preempted;  // name -> reason
  std::map<std::string, std::string> preemptor;  // victim -> preemptor
  std::map<std::string, PendingInfo> pending;
};

// Loads the scenario into an Engine through its API and runs `cycles` cycles; victims are
// evicted between cycles, as the simulator does.
inline Outcome RunScenario(const std::string& yaml, int cycles = 1) {
  Outcome o;
  Result<SimulationInput> in = ParseSimulation(yaml, "scenario.yaml");
  EXPECT_TRUE(in.ok()) << in.status().ToString();
  if (!in.ok()) return o;
  Result<Engine> engine = Engine::Create(in->config);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return o;
  int64_t now = 0;
  for (const Workload& w : in->workloads) {
    Status s = engine->AddWorkload(w);
    EXPECT_TRUE(s.ok()) << s.ToString();
    now = std::max(now, w.created_ms);
  }
  for (int c = 0; c < cycles; ++c) {
    if (c > 0) {
      for (const std::string& v : engine->PreemptedAwaitingEviction()) {
        EXPECT_TRUE(engine->EvictWorkload(v).ok());
      }
    }
    CycleOptions options;
    options.now_ms = now + 1000 * (c + 1);
    CycleResult r = engine->RunCycle(options);
    for (const AdmittedInfo& a : r.admitted) o.admitted[a.name] = FlavorsString(a.flavors);
    for (const PreemptedInfo& p : r.preempted) {
      o.preempted[p.name] = p.reason;
      o.preemptor[p.name] = p.preemptor;
    }
    o.pending.clear();
    for (const PendingInfo& p : r.pending) o.pending[p.name] = p;
  }
  return o;
}

// YAML builders. Cpu-only queue: flavors as "default=6" or "on-demand=50/50,spot=100/0/" with
// nominal/borrowing_limit/lending_limit (empty = unset).
inline std::string Q(const std::string& name, const std::string& cohort,
                     const std::string& cpu_flavors, const std::string& extra = "") {
  std::string flavors;
  for (const std::string& f : Split(cpu_flavors, ',')) {
    size_t eq = f.find('=');
    std::vector<std::string> parts = Split(f.substr(eq + 1), '/');
    std::string res = "{name: cpu, nominal: " + parts[0];
    if (parts.size() > 1 && !parts[1].empty()) res += ", borrowing_limit: " + parts[1];
    if (parts.size() > 2 && !parts[2].empty()) res += ", lending_limit: " + parts[2];
    res += "}";
    flavors += "{name: " + f.substr(0, eq) + ", resources: [" + res + "]}, ";
  }
  return "  - {name: " + name + (cohort.empty() ? "" : ", cohort: " + cohort) +
         ", resource_groups: [{covered_resources: [cpu], flavors: [" + flavors + "]}]" +
         (extra.empty() ? "" : ", " + extra) + "}\n";
}

// "2024-01-01T00:00:SSZ"
inline std::string T(int seconds) {
  char buf[32];
  snprintf(buf, sizeof buf, "2024-01-01T00:%02d:%02dZ", seconds / 60, seconds % 60);
  return buf;
}

// A pending cpu workload.
inline std::string W(const std::string& name, const std::string& queue, const std::string& cpu,
                     int priority = 0, int created = -1) {
  return "  - {name: " + name + ", queue: " + queue + ", priority: " + std::to_string(priority) +
         (created >= 0 ? ", created: " + T(created) : "") + ", requests: {cpu: " + cpu + "}}\n";
}

// An admitted cpu workload (reserved at `at` seconds).
inline std::string A(const std::string& name, const std::string& queue, const std::string& cpu,
                     const std::string& flavor, int priority = 0, int at = 0) {
  return "  - {name: " + name + ", queue: " + queue + ", priority: " + std::to_string(priority) +
         ", created: " + T(0) + ", requests: {cpu: " + cpu +
         "}, admitted: {flavors: {cpu: " + flavor + "}, at: " + T(at) + "}}\n";
}

inline std::string Doc(const std::string& cohorts, const std::string& queues,
                       const std::string& workloads, const std::string& extra = "") {
  return "flavors: [{name: default}, {name: on-demand}, {name: spot}, {name: model-a}, "
         "{name: f1}, {name: f2}]\n"
         "cohorts: [" +
         cohorts + "]\nqueues:\n" + queues + "workloads:\n" + workloads + extra;
}

}  // namespace tau::admission::testing
