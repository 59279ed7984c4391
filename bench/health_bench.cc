// GPU health monitor cost: CPU time per GPU per polling pass, and the latency from an XID event to
// the verdict-change callback, against the scenario NVML (tests/data/health/bench_8gpu.scn, 8
// GPUs). Prints JSON. The fake answers from memory, so the CPU figure is tau's own work plus a
// function call per NVML entry point; a real driver adds its ioctls on top.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "health/health.h"

namespace {

int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t MonotonicMicros() {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tau::health;
  // `health_bench [PASSES] [--real]`: --real measures the driver's own NVML (whatever GPUs the
  // machine has, no XID scenario) instead of the scenario fake.
  int passes = 2000;
  bool real = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--real") {
      real = true;
    } else {
      passes = std::atoi(argv[i]);
    }
  }
  if (!real) {
    setenv("TAU_NVML_LIBRARY", TAU_FAKE_NVML_PATH, 1);
    setenv("TAU_FAKE_NVML_SCENARIO", TAU_HEALTH_BENCH_SCENARIO, 1);
  }

  // The XID times in the scenario, from nvmlInit (which Start calls first).
  const std::vector<int64_t> xid_at_ms = {1000, 1250, 1500, 1750, 2000, 2250, 2500, 2750};
  std::mutex mu;
  std::vector<std::pair<int, int64_t>> flips;  // gpu, µs since start
  int64_t start_us = 0;
  MonitorOptions options;
  options.poll_interval_ms = 1'000'000;  // polling is driven by hand below
  options.on_verdict_change = [&](int gpu, Verdict, Verdict now, const std::vector<Reason>&) {
    if (now != Verdict::kUnhealthy) return;
    std::lock_guard<std::mutex> lock(mu);
    flips.emplace_back(gpu, MonotonicMicros() - start_us);
  };
  GpuMonitor monitor(options);
  start_us = MonotonicMicros();  // just before nvmlInit: latencies are upper bounds
  if (!monitor.Start().ok()) return 1;
  int gpus = int(monitor.Snapshot().inventory.devices.size());
  if (real ? gpus == 0 : gpus != 8) {
    std::fprintf(stderr, "expected 8 GPUs, got %d: %s\n", gpus,
                 monitor.Snapshot().inventory.note.c_str());
    return 1;
  }

  // Polling passes on this thread while the event thread waits: CPU time of the pass itself.
  std::vector<double> per_gpu_us;
  per_gpu_us.reserve(passes);
  int64_t wall0 = MonotonicMicros();
  for (int i = 0; i < passes; ++i) {
    int64_t c0 = ThreadCpuNanos();
    monitor.PollOnce();
    per_gpu_us.push_back(double(ThreadCpuNanos() - c0) / 1000.0 / gpus);
  }
  double wall_per_pass_us = double(MonotonicMicros() - wall0) / passes;

  // Wait for every XID of the scenario.
  while (!real && MonotonicMicros() - start_us < 4'000'000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    if (flips.size() >= xid_at_ms.size()) break;
  }
  std::vector<double> latency_ms;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto [gpu, at_us] : flips) latency_ms.push_back(double(at_us) / 1000.0 - xid_at_ms[gpu]);
  }
  HealthSnapshot snap = monitor.Snapshot();
  size_t metrics_bytes = RenderMetrics(snap).size();
  int64_t c0 = ThreadCpuNanos();
  std::string json = ToJson(snap).dump();
  double json_us = double(ThreadCpuNanos() - c0) / 1000.0;
  monitor.Stop();

  nlohmann::json out = {
      {"benchmark", "health_monitor"},
      {"nvml", real ? "driver" : "scenario fake"},
      {"gpu_name", gpus > 0 ? snap.inventory.devices[0].name : ""},
      {"gpus", gpus},
      {"passes", passes},
      {"cpu_us_per_gpu_per_pass_median", Median(per_gpu_us)},
      {"cpu_us_per_gpu_per_pass_p99", Percentile(per_gpu_us, 0.99)},
      {"wall_us_per_pass_mean", wall_per_pass_us},
      {"cpu_fraction_of_one_core_at_10s_interval", Median(per_gpu_us) * gpus / 10'000'000.0},
      {"xid_events", latency_ms.size()},
      {"xid_to_callback_ms_median", Median(latency_ms)},
      {"xid_to_callback_ms_max",
       latency_ms.empty() ? 0.0 : *std::max_element(latency_ms.begin(), latency_ms.end())},
      {"snapshot_json_cpu_us", json_us},
      {"snapshot_json_bytes", json.size()},
      {"metrics_bytes", metrics_bytes},
  };
  std::printf("%s\n", out.dump(2).c_str());
  return real || latency_ms.size() == xid_at_ms.size() ? 0 : 2;
}
