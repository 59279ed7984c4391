// Admission engine benchmark: Kueue's scheduler performance configurations ("baseline" and
// "large-scale" from test/performance/scheduler) replayed in simulated time, and "baseline-afs",
// the baseline with admission fair sharing in every ClusterQueue (each queue's workloads spread
// over 4 LocalQueues): what ordering by LocalQueue usage costs the engine. Prints one JSON object
// with a result per configuration.
//
// Model (a discrete-event simulation; simulated milliseconds, not wall time):
//   * Workloads of each class arrive at k * interval (k = 0, 1, ...) in every ClusterQueue.
//   * The scheduler runs a cycle whenever some queue has an active head, i.e. as long as Kueue's
//     Heads() would not block. A cycle costs kCycleBaseMs plus kCyclePerHeadMs per head of
//     simulated time (snapshot, nomination, status updates); events arriving meanwhile are seen
//     by the next cycle. With no active head the scheduler sleeps until the next event (arrival,
//     finish, eviction), exactly like Kueue's blocking heap.
//   * An admitted workload runs for runtimeMs and then finishes, releasing its quota.
//   * A preempted workload keeps its quota for kEvictionDelayMs (Kueue evicts it, the job is
//     suspended and the reservation cleared by the workload controller) and is then requeued with
//     its original creation time; when admitted again it runs its full runtime from scratch.
//   * Time to admission is creation -> the admission that ran to completion; usage is
//     the integral of the cpu held (victims included until evicted) over the nominal quota times
//     the elapsed time (first arrival to last finish), as the Kueue checker computes it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <queue>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/admission.h"

namespace {

using tau::Quantity;
namespace adm = tau::admission;

constexpr double kCycleBaseMs = 1.0;
constexpr double kCyclePerHeadMs = 0.02;
constexpr double kEvictionDelayMs = 100.0;

struct WorkloadClass {
  std::string name;
  int per_cq;
  int cpu;
  int priority;
  double runtime_ms;
  double interval_ms;
};

struct BenchConfig {
  std::string name;
  int cohorts;
  int queues_per_cohort;
  std::vector<WorkloadClass> classes;
  double min_usage_pct;
  std::map<std::string, double> max_avg_tta_ms;
  int local_queues = 0;  // > 0: admission fair sharing, workloads spread over this many per queue
};

struct Wl {
  std::string name;
  int cls;
  double created;
  double admitted = -1;
  int generation = 0;  // invalidates a finish event after a preemption
};

enum class EventKind { kArrival = 0, kEvictionDone = 1, kFinish = 2 };
struct Event {
  double time;
  EventKind kind;
  int wl;
  int generation;
  bool operator>(const Event& o) const {
    if (time != o.time) return time > o.time;
    return static_cast<int>(kind) > static_cast<int>(o.kind);
  }
};

nlohmann::json Run(const BenchConfig& bc) {
  adm::Config config;
  config.flavors.push_back({"rf", {}});
  int num_cqs = bc.cohorts * bc.queues_per_cohort;
  for (int c = 0; c < bc.cohorts; ++c) {
    config.cohorts.push_back({"cohort-" + std::to_string(c), "", {}, 1.0});
    for (int q = 0; q < bc.queues_per_cohort; ++q) {
      adm::ClusterQueue cq;
      cq.name = "cq-" + std::to_string(c) + "-" + std::to_string(q);
      cq.cohort = "cohort-" + std::to_string(c);
      adm::ResourceQuota rq{"cpu", Quantity::FromUnits(20), Quantity::FromUnits(100), std::nullopt};
      cq.resource_groups.push_back({{"cpu"}, {{"rf", {rq}}}});
      cq.preemption.within_cluster_queue = adm::WithinClusterQueue::kLowerPriority;
      cq.preemption.reclaim_within_cohort = adm::ReclaimWithinCohort::kAny;
      cq.admission_fair_sharing = bc.local_queues > 0;
      config.queues.push_back(std::move(cq));
    }
  }
  if (bc.local_queues > 0)
    config.admission_fair_sharing = adm::AdmissionFairSharing{10'000, 1'000, {}};
  auto engine_or = adm::Engine::Create(config);
  if (!engine_or.ok()) return {{"error", engine_or.status().ToString()}};
  adm::Engine engine = std::move(engine_or).value();

  std::vector<Wl> wls;
  std::unordered_map<std::string, int> by_name;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (int q = 0; q < num_cqs; ++q) {
    for (size_t k = 0; k < bc.classes.size(); ++k) {
      const WorkloadClass& wc = bc.classes[k];
      for (int i = 0; i < wc.per_cq; ++i) {
        Wl w;
        w.name = config.queues[q].name + "-" + wc.name + "-" + std::to_string(i);
        w.cls = static_cast<int>(k);
        w.created = i * wc.interval_ms;
        by_name[w.name] = static_cast<int>(wls.size());
        events.push({w.created, EventKind::kArrival, static_cast<int>(wls.size()), 0});
        wls.push_back(std::move(w));
      }
    }
  }
  std::vector<int> wl_queue(wls.size());
  {
    size_t i = 0;
    for (int q = 0; q < num_cqs; ++q) {
      for (const WorkloadClass& wc : bc.classes) {
        for (int j = 0; j < wc.per_cq; ++j) wl_queue[i++] = q;
      }
    }
  }

  auto start = std::chrono::steady_clock::now();
  double now = 0, last_event = 0;
  double cpu_in_use = 0, cpu_ms = 0;  // held cpu, and its integral
  int64_t admissions = 0, preemptions = 0, cycles = 0, finished = 0;
  std::vector<double> tta_sum(bc.classes.size(), 0);
  std::vector<int> tta_n(bc.classes.size(), 0);
  std::vector<int> holding(wls.size(), 0);  // cpu held by the workload
  auto advance = [&](double t) {
    if (t > now) {
      cpu_ms += cpu_in_use * (t - now);
      now = t;
    }
  };
  bool active = false;  // the last cycle had heads: run again without waiting for an event
  while (true) {
    double next_event = events.empty() ? -1 : events.top().time;
    if (!active) {
      if (events.empty()) break;
      advance(next_event);
    }
    while (!events.empty() && events.top().time <= now) {
      Event e = events.top();
      events.pop();
      Wl& w = wls[e.wl];
      last_event = std::max(last_event, e.time);
      switch (e.kind) {
        case EventKind::kArrival: {
          adm::Workload spec;
          spec.name = w.name;
          spec.queue = config.queues[wl_queue[e.wl]].name;
          if (bc.local_queues > 0)
            spec.local_queue = spec.queue + "/lq-" + std::to_string(e.wl % bc.local_queues);
          spec.priority = bc.classes[w.cls].priority;
          spec.created_ms = static_cast<int64_t>(w.created);
          spec.pod_sets.push_back(
              {"main", 1, {{"cpu", Quantity::FromUnits(bc.classes[w.cls].cpu)}}, {}, {}});
          (void)engine.AddWorkload(spec);
          break;
        }
        case EventKind::kEvictionDone:
          (void)engine.EvictWorkload(w.name);
          cpu_in_use -= holding[e.wl];
          holding[e.wl] = 0;
          break;
        case EventKind::kFinish:
          if (e.generation != w.generation) break;
          (void)engine.FinishWorkload(w.name);
          cpu_in_use -= holding[e.wl];
          holding[e.wl] = 0;
          tta_sum[w.cls] += w.admitted - w.created;
          ++tta_n[w.cls];
          ++finished;
          break;
      }
    }
    adm::CycleOptions options;
    options.now_ms = static_cast<int64_t>(now);
    options.report_pending = false;
    adm::CycleResult r = engine.RunCycle(options);
    ++cycles;
    for (const adm::AdmittedInfo& a : r.admitted) {
      int id = by_name[a.name];
      Wl& w = wls[id];
      w.admitted = now;
      holding[id] = bc.classes[w.cls].cpu;
      cpu_in_use += holding[id];
      events.push({now + bc.classes[w.cls].runtime_ms, EventKind::kFinish, id, w.generation});
      ++admissions;
    }
    for (const adm::PreemptedInfo& p : r.preempted) {
      int id = by_name[p.name];
      ++wls[id].generation;
      events.push({now + kEvictionDelayMs, EventKind::kEvictionDone, id, 0});
      ++preemptions;
    }
    active = r.heads > 0;
    if (active) advance(now + kCycleBaseMs + kCyclePerHeadMs * r.heads);
  }
  double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double elapsed = last_event;
  double usage_pct = 100.0 * cpu_ms / (20.0 * num_cqs * elapsed);
  nlohmann::json classes = nlohmann::json::object();
  bool tta_ok = true;
  for (size_t k = 0; k < bc.classes.size(); ++k) {
    double avg = tta_n[k] ? tta_sum[k] / tta_n[k] : 0;
    double limit = bc.max_avg_tta_ms.at(bc.classes[k].name);
    tta_ok &= avg <= limit && tta_n[k] == bc.classes[k].per_cq * num_cqs;
    classes[bc.classes[k].name] = {{"workloads", tta_n[k]},
                                   {"avg_time_to_admission_ms", avg},
                                   {"max_avg_time_to_admission_ms", limit},
                                   {"ok", avg <= limit}};
  }
  return {{"config", bc.name},
          {"cluster_queues", num_cqs},
          {"workloads", wls.size()},
          {"finished", finished},
          {"wall_s", wall_s},
          {"admissions", admissions},
          {"admissions_per_wall_s", admissions / std::max(wall_s, 1e-9)},
          {"cycles", cycles},
          {"preemptions", preemptions},
          {"simulated_duration_ms", elapsed},
          {"workload_classes", classes},
          {"cq_class_usage",
           {{"cq",
             {{"usage_pct", usage_pct},
              {"min_usage_pct", bc.min_usage_pct},
              {"ok", usage_pct >= bc.min_usage_pct}}}}},
          {"thresholds_met", tta_ok && usage_pct >= bc.min_usage_pct}};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<BenchConfig> configs = {
      {"baseline",
       5,
       6,
       {{"small", 350, 1, 50, 200, 100},
        {"medium", 100, 5, 100, 500, 500},
        {"large", 50, 20, 200, 1000, 1200}},
       50.0,
       {{"large", 23000}, {"medium", 90000}, {"small", 260000}}},
      {"baseline-afs",
       5,
       6,
       {{"small", 350, 1, 50, 200, 100},
        {"medium", 100, 5, 100, 500, 500},
        {"large", 50, 20, 200, 1000, 1200}},
       50.0,
       {{"large", 23000}, {"medium", 90000}, {"small", 260000}},
       4},
      {"large-scale",
       10,
       100,
       {{"small", 35, 1, 50, 150, 60},
        {"medium", 11, 5, 100, 350, 300},
        {"large", 4, 20, 200, 700, 700}},
       31.6,
       {{"large", 128000}, {"medium", 308000}, {"small", 841000}}},
  };
  std::string only = argc > 1 ? argv[1] : "";
  nlohmann::json out = nlohmann::json::array();
  for (const BenchConfig& bc : configs) {
    if (!only.empty() && only != bc.name) continue;
    out.push_back(Run(bc));
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
