// Evidence capture cost (issue #5): a run that emits 100,000 metric points and 100 MB of logs (4
// ranks x 25 MB). Prints one JSON object.
//
// What is timed (wall and CPU seconds of this process, in a scratch directory under $TMPDIR):
//   job_write         the synthetic job writing its metrics file and logs: a floor for any run that
//                     produces this much output (not evidence work)
//   metrics_ingest    MetricsCollector::Poll as the server would run it every few seconds while the
//                     job writes: 100 polls of 1,000 new points each
//   metrics_bulk      one Poll of all 100,000 points (a server that catches up after a restart)
//   metrics_compact   MetricsCollector::Compact at the end of the run
//   log_index         IndexAttemptLogs (sha256 of every log) when the attempt ends
//   record_save       BuildRecord + SaveRecord
//   capture           the sum of the above but metrics_bulk: what evidence costs a run
//   export / verify   ExportBundle and VerifyBundle of the whole (on demand, not part of a run)
//   metrics_flood     a run writing TAU_BENCH_FLOOD_POINTS points (default 2,000,000) at once: read
//                     4 MiB a poll and compacted, with points/s and this process's peak RSS before
//                     and after (it must not grow with the points)
// overhead_pct_vs_job_write is capture over the job's own write time: the worst case, a run that
// does nothing but write its output. overhead_pct_vs_run_<N>s is capture over a run of N seconds
// (the output spread over it), with N from argv[1] (default 600).
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/files.h"
#include "evidence/evidence.h"

namespace {

namespace ev = tau::evidence;

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Timer {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu = CpuSeconds();
  nlohmann::json Stop() const {
    double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    return {{"wall_s", w}, {"cpu_s", CpuSeconds() - cpu}};
  }
};

void Die(const tau::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// This process's peak resident memory (VmHWM), in MiB.
double PeakRssMiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib / 1024;
}

void AppendTo(std::FILE* f, const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) {
    std::perror("write");
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double run_seconds = argc > 1 ? std::atof(argv[1]) : 600;
  if (run_seconds <= 0) run_seconds = 600;
  const char* tmp = std::getenv("TMPDIR");
  std::string root = fmt::format("{}/tau-evidence-bench-{}", tmp ? tmp : "/tmp", ::getpid());
  Die(tau::MakeDirs(root + "/attempts/1/logs"), "mkdir");
  std::string metrics_file = root + "/metrics.jsonl";
  std::string evidence_dir = root + "/evidence";

  constexpr int kPoints = 100'000, kPolls = 100, kRanks = 4;
  constexpr size_t kLogBytesPerRank = 25u << 20;
  const char* names[] = {"loss", "lr", "grad_norm", "tokens_per_s"};

  // The job: metrics interleaved with polls (only the polls are timed as capture), then its logs.
  auto collector = ev::MetricsCollector::Open(evidence_dir);
  Die(collector.ok() ? tau::Status::Ok() : collector.status(), "open collector");
  std::FILE* mf = std::fopen(metrics_file.c_str(), "w");
  double job_wall = 0, ingest_wall = 0, ingest_cpu = 0, job_cpu = 0;
  for (int poll = 0; poll < kPolls; ++poll) {
    Timer job;
    std::string text;
    for (int i = poll * (kPoints / kPolls); i < (poll + 1) * (kPoints / kPolls); ++i)
      text += fmt::format("{{\"name\":\"{}\",\"step\":{},\"value\":{},\"split\":\"train\"}}\n",
                          names[i % 4], i / 4, 1.0 / (1 + i));
    AppendTo(mf, text);
    std::fflush(mf);
    auto j = job.Stop();
    job_wall += j["wall_s"].get<double>();
    job_cpu += j["cpu_s"].get<double>();
    Timer t;
    auto chunk = (*collector)->Poll(metrics_file, 1);
    Die(chunk.ok() ? tau::Status::Ok() : chunk.status(), "poll");
    auto s = t.Stop();
    ingest_wall += s["wall_s"].get<double>();
    ingest_cpu += s["cpu_s"].get<double>();
  }
  std::fclose(mf);
  Timer logs_job;
  std::string line =
      "2025-01-01 00:00:00 INFO step 12345 loss=0.123456 lr=3.0e-04 tokens/s=123456.7 "
      "grad_norm=1.2345 mem=71.2GiB\n";
  for (int r = 0; r < kRanks; ++r) {
    std::FILE* f = std::fopen(fmt::format("{}/attempts/1/logs/rank-{}.log", root, r).c_str(), "w");
    std::string block;
    while (block.size() < (1u << 20)) block += line;
    block.resize(1u << 20);
    for (size_t n = 0; n < kLogBytesPerRank; n += block.size()) AppendTo(f, block);
    std::fclose(f);
  }
  auto lj = logs_job.Stop();
  job_wall += lj["wall_s"].get<double>();
  job_cpu += lj["cpu_s"].get<double>();

  nlohmann::json out;
  out["points"] = kPoints;
  out["log_bytes"] = kRanks * kLogBytesPerRank;
  out["job_write"] = {{"wall_s", job_wall}, {"cpu_s", job_cpu}};
  out["metrics_ingest"] = {{"wall_s", ingest_wall}, {"cpu_s", ingest_cpu}, {"polls", kPolls}};
  out["kept_points"] = (*collector)->kept_points();

  {
    ev::CollectorOptions all_at_once;
    all_at_once.max_poll_bytes = 1u << 30;
    auto bulk = ev::MetricsCollector::Open(root + "/evidence-bulk", all_at_once);
    Timer t;
    auto chunk = (*bulk)->Poll(metrics_file, 1);
    Die(chunk.ok() ? tau::Status::Ok() : chunk.status(), "bulk poll");
    out["metrics_bulk"] = t.Stop();
  }
  ev::CompactReport compacted;
  {
    Timer t;
    auto c = (*collector)->Compact();
    Die(c.ok() ? tau::Status::Ok() : c.status(), "compact");
    compacted = *c;
    out["metrics_compact"] = t.Stop();
    out["distinct_points"] = compacted.distinct;
  }
  ev::RecordInput record;
  record.run.name = "bench-1";
  record.run.state = "Succeeded";
  record.runtime.tau_version = "bench";
  ev::AttemptInfo attempt;
  attempt.number = 1;
  attempt.state = "Finished";
  {
    Timer t;
    auto logs = ev::IndexAttemptLogs(root + "/attempts/1");
    Die(logs.ok() ? tau::Status::Ok() : logs.status(), "index logs");
    attempt.logs = *logs;
    out["log_index"] = t.Stop();
  }
  record.attempts.push_back(attempt);
  {
    Timer t;
    record.metrics = ev::MetricsInfoFrom(compacted, (*collector)->stats());
    record.updated_ms = tau::NowMillis();
    Die(ev::SaveRecord(evidence_dir, ev::BuildRecord(record)), "save record");
    out["record_save"] = t.Stop();
  }
  double capture_wall = 0, capture_cpu = 0;
  for (const char* k : {"metrics_ingest", "metrics_compact", "log_index", "record_save"}) {
    capture_wall += out[k]["wall_s"].get<double>();
    capture_cpu += out[k]["cpu_s"].get<double>();
  }
  out["capture"] = {{"wall_s", capture_wall}, {"cpu_s", capture_cpu}};
  out["overhead_pct_vs_job_write"] = 100.0 * capture_wall / job_wall;
  out[fmt::format("overhead_pct_vs_run_{}s", run_seconds)] = 100.0 * capture_wall / run_seconds;

  ev::BundleSources sources;
  for (int r = 0; r < kRanks; ++r)
    sources.logs.push_back({1, r, fmt::format("{}/attempts/1/logs/rank-{}.log", root, r)});
  sources.metrics_path = evidence_dir + "/metrics.jsonl";
  std::string bundle = root + "/bench.tar.gz";
  {
    Timer t;
    auto report = ev::ExportBundle(record, sources, bundle, tau::NowMillis());
    Die(report.ok() ? tau::Status::Ok() : report.status(), "export");
    out["export"] = t.Stop();
    out["export"]["bundle_bytes"] = report->bytes_out;
  }
  {
    Timer t;
    Die(ev::VerifyBundle(bundle), "verify");
    out["verify"] = t.Stop();
  }
  out["target_pct"] = 5;

  // A flood: one run writes TAU_BENCH_FLOOD_POINTS points (default 2,000,000) as fast as it can;
  // the collector reads them as the server does, 4 MiB a poll, then compacts them. Memory must not
  // grow with the number of points.
  {
    const char* env = std::getenv("TAU_BENCH_FLOOD_POINTS");
    const int64_t n = env ? std::atoll(env) : 2'000'000;
    std::string file = root + "/flood.jsonl";
    std::FILE* f = std::fopen(file.c_str(), "w");
    std::string block;
    for (int64_t i = 0; i < n; ++i) {
      block += fmt::format("{{\"name\":\"{}\",\"step\":{},\"value\":{}}}\n", names[i % 4], i / 4,
                           0.5 + static_cast<double>(i % 1000) / 1000);
      if (block.size() >= (4u << 20)) {
        AppendTo(f, block);
        block.clear();
      }
    }
    AppendTo(f, block);
    std::fclose(f);
    double rss_before = PeakRssMiB();
    ev::CollectorOptions options;
    options.max_points = n;
    auto c = ev::MetricsCollector::Open(root + "/evidence-flood", options);
    Die(c.ok() ? tau::Status::Ok() : c.status(), "open flood collector");
    Timer t;
    int polls = 0;
    for (bool more = true; more; ++polls) {
      auto chunk = (*c)->Poll(file, 1);
      Die(chunk.ok() ? tau::Status::Ok() : chunk.status(), "flood poll");
      more = chunk->more;
    }
    nlohmann::json ingest = t.Stop();
    Timer ct;
    auto compacted = (*c)->Compact();
    Die(compacted.ok() ? tau::Status::Ok() : compacted.status(), "flood compact");
    nlohmann::json compact = ct.Stop();
    out["metrics_flood"] = {
        {"points", n},
        {"polls", polls},
        {"ingest", ingest},
        {"ingest_points_per_s", static_cast<double>(n) / ingest["wall_s"].get<double>()},
        {"compact", compact},
        {"compact_points_per_s", static_cast<double>(n) / compact["wall_s"].get<double>()},
        {"compact_spilled_runs", compacted->spilled_runs},
        {"peak_rss_mib_before", rss_before},
        {"peak_rss_mib_after", PeakRssMiB()}};
  }
  std::printf("%s\n", out.dump(2).c_str());
  (void)tau::RemoveTree(root);
  return 0;
}
