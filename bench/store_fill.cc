// store_fill: fills a tau home with ended runs straight through the Store API (each with an
// attempt, its five lifecycle events and its final evidence record), for store_scale_bench.py.
// Not a test; prints one JSON object.
//
// Usage: store_fill HOME RUNS [DUE] [DUE_AT_MS]
//   RUNS runs (train-N) ended 8 to 38 days ago with their logs and GPU samples pruned, as retention
//   left them (the record and the store agree); DUE more (dueT-N, T the time in hex) end at
//   DUE_AT_MS (ms since the epoch; default now) with their logs, samples and records kept: what a
//   retention pass will find due then.
//
// Inserts come from several threads at once, so that the store's group commit makes one fsync of
// many; the rest is committed in batches; records are written without an fsync (the server makes
// a lost one again).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/layout.h"
#include "evidence/evidence.h"
#include "store/store.h"

namespace {

namespace ev = tau::evidence;
namespace st = tau::store;

constexpr int kThreads = 64;
constexpr int64_t kDayMs = 24 * 3600 * 1000;

// A spec of the size and shape `tau run` stores for a small training job.
const char* kSpecYaml =
    "schema_version: 1\nname: train\nrun:\n  entrypoint: train.py\n  workload_kind: job\n"
    "  args: [--epochs, '3', --lr, '0.001']\ncompute:\n  gpus: 1\n  workers: 1\n"
    "  cpus: 4\n  memory: 16Gi\nresilience:\n  max_retries: 2\n"
    "  retry_on: [Preempted, NodeLost]\nruntime:\n  pip: [torch, numpy]\n";

nlohmann::json SpecJson() {
  return {{"schema_version", 1},
          {"name", "train"},
          {"kind", "job"},
          {"run",
           {{"entrypoint", "train.py"},
            {"args", {"--epochs", "3", "--lr", "0.001"}},
            {"workload_kind", "job"},
            {"working_dir_excludes", nlohmann::json::array()},
            {"env", nlohmann::json::object()},
            {"max_runtime", nullptr}}},
          {"compute",
           {{"gpus", 1},
            {"workers", 1},
            {"cpus", "4"},
            {"memory", "16Gi"},
            {"gpu_type", nullptr},
            {"profile", nullptr}}},
          {"resilience",
           {{"max_retries", 2},
            {"retry_on", {"Preempted", "NodeLost"}},
            {"backoff_initial", "10s"},
            {"backoff_max", "5m"},
            {"max_retry_duration", nullptr}}},
          {"runtime", {{"pip", {"torch", "numpy"}}, {"image", nullptr}, {"python", nullptr}}},
          {"storage", {{"checkpoints", nullptr}, {"outputs", nullptr}}},
          {"secrets", nlohmann::json::array()},
          {"queue", nullptr},
          {"workspace", nullptr},
          {"priority", nullptr}};
}

nlohmann::json Resolved() {
  nlohmann::json provenance = nlohmann::json::array();
  for (const char* field :
       {"workspace", "queue", "priority", "gpus", "cpus", "memory", "max_runtime", "max_log_bytes",
        "max_metric_points", "max_metric_series", "checkpoints", "outputs"})
    provenance.push_back({{"field", field}, {"value", "default"}, {"source", "platform default"}});
  return {{"workspace", "default"},
          {"queue", "default"},
          {"priority", 0},
          {"priority_class", "normal"},
          {"workers", 1},
          {"gpus_per_worker", 1},
          {"total_requests", {{"cpu", "4"}, {"memory", "16Gi"}, {"nvidia.com/gpu", "1"}}},
          {"limits",
           {{"max_log_bytes", 1073741824},
            {"max_metric_points", 1000000},
            {"max_metric_series", 1000}}},
          {"provenance", provenance}};
}

struct Filled {
  std::string name;
  int64_t finished_ms = 0;
  bool due = false;
};

// One run: inserted (Submitted, Queued), then its progress as one batch entry.
void Insert(st::Store* store, const std::string& home, const Filled& f,
            const nlohmann::json& spec_json, const nlohmann::json& resolved, st::Batch* batch) {
  st::RunRecord r;
  r.name = f.name;
  r.spec_name = "train";
  r.spec_file = "tau.yaml";
  r.spec_yaml = kSpecYaml;
  r.spec_json = spec_json;
  r.config_hash = tau::Sha256Hex(f.name);
  r.snapshot_digest = tau::Sha256Hex("code");
  r.snapshot_dir = "/nonexistent/snapshot";
  r.workspace = "default";
  r.queue = "default";
  r.owner = "alice";
  r.resolved = resolved;
  r.resources = {{"gpus", 1}, {"cpu_milli", 4000}, {"memory_bytes", 17179869184}, {"workers", 1}};
  const int64_t start = f.finished_ms - 600'000;
  r.created_ms = r.updated_ms = start - 2000;
  std::vector<st::Event> events = {
      {0, f.name, start - 2000, "Submitted", "submitted by alice", {{"files", 3}}, "", ""},
      {0, f.name, start - 2000, "Queued", "queued in default", nlohmann::json::object(), "", ""}};
  if (tau::Status s = store->InsertRun(&r, std::move(events)); !s.ok()) {
    std::fprintf(stderr, "store_fill: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  r.state = st::RunState::kSucceeded;
  r.reason = "Succeeded";
  r.message = "exit code 0";
  r.exit_code = 0;
  r.attempts = 1;
  r.admitted_ms = start - 1000;
  r.started_ms = start;
  r.finished_ms = f.finished_ms;
  r.updated_ms = f.finished_ms;
  batch->runs.push_back(r);
  st::AttemptRecord a;
  a.run = f.name;
  a.number = 1;
  a.state = st::AttemptState::kFinished;
  a.dir = tau::layout::AttemptDir(home, f.name, 1);
  a.shim_pid = 4242;
  a.gpus = {0};
  a.started_ms = start;
  a.ended_ms = f.finished_ms;
  a.exit_code = 0;
  a.outcome = "Exited";
  a.reason = "Succeeded";
  batch->attempts.push_back(a);
  batch->events.push_back({0, f.name, start - 1000, "Admitted", "admitted", {}, "", ""});
  batch->events.push_back(
      {0, f.name, start, "Running", "attempt 1 started", {{"attempt", 1}}, "", ""});
  batch->events.push_back(
      {0, f.name, f.finished_ms, "Succeeded", "exit code 0", {{"exit_code", 0}}, "", ""});
}

// The run's final record (from what the store holds of it) and, for a due run, its files.
void WriteFiles(st::Store* store, const std::string& home, const Filled& f, int64_t pruned_ms) {
  auto r = store->GetRun(f.name);
  auto events = store->ListEvents(f.name);
  if (!r.ok() || !events.ok()) {
    std::fprintf(stderr, "store_fill: reading %s back failed\n", f.name.c_str());
    std::exit(1);
  }
  ev::RecordInput in;
  in.run.name = r->name;
  in.run.spec_name = r->spec_name;
  in.run.state = "Succeeded";
  in.run.reason = r->reason;
  in.run.message = r->message;
  in.run.exit_code = r->exit_code;
  in.run.workspace = r->workspace;
  in.run.queue = r->queue;
  in.run.resources = r->resources;
  in.run.created_ms = r->created_ms;
  in.run.admitted_ms = r->admitted_ms;
  in.run.started_ms = r->started_ms;
  in.run.finished_ms = r->finished_ms;
  in.config.spec_file = r->spec_file;
  in.config.spec_yaml = r->spec_yaml;
  in.config.spec_json = r->spec_json;
  in.config.config_hash = r->config_hash;
  in.config.resolved = r->resolved;
  in.snapshot.digest = r->snapshot_digest;
  for (const char* p : {"train.py", "model.py", "requirements.txt"})
    in.snapshot.files.push_back({p, 1200, tau::Sha256Hex(p), 0644});
  in.runtime.tau_version = "bench";
  in.runtime.host = "bench";
  in.runtime.python_version = "3.11.2";
  for (const st::Event& e : *events)
    in.events.push_back({e.id, e.ts_ms, e.type, e.message, e.data, e.prev_hash, e.hash});
  ev::AttemptInfo a;
  a.number = 1;
  a.state = "Finished";
  a.gpus = {0};
  a.started_ms = *r->started_ms;
  a.ended_ms = r->finished_ms;
  a.exit_code = 0;
  a.outcome = "Exited";
  a.failure_class = "Succeeded";
  const std::string log = "epoch 1 loss 0.9\nepoch 2 loss 0.5\nepoch 3 loss 0.3\n";
  a.logs.push_back({0, static_cast<int64_t>(log.size()), tau::Sha256Hex(log),
                    f.due ? ev::LogState::kKept : ev::LogState::kPruned});
  in.attempts.push_back(a);
  in.updated_ms = f.finished_ms;
  const std::string evidence_dir = tau::layout::EvidenceDir(home, f.name);
  const std::string logs_dir = tau::layout::AttemptDir(home, f.name, 1) + "/logs";
  tau::Status s = tau::MakeDirs(evidence_dir);
  if (f.due) {
    if (s.ok()) s = tau::MakeDirs(logs_dir);
    if (s.ok())
      s = tau::WriteFileAtomic(logs_dir + "/rank-0.log", log, 0644, tau::Durability::kProcessCrash);
    if (s.ok())
      s = tau::WriteFileAtomic(evidence_dir + "/gpu-samples.jsonl",
                               "{\"ts_ms\":1,\"gpu\":0,\"util\":90}\n", 0644,
                               tau::Durability::kProcessCrash);
  } else {
    in.retention.logs_pruned_ms = pruned_ms;  // as the store's mark says
    in.retention.samples_pruned_ms = pruned_ms;
  }
  if (s.ok()) s = ev::SaveRecord(evidence_dir, ev::BuildRecord(in), tau::Durability::kProcessCrash);
  if (!s.ok()) {
    std::fprintf(stderr, "store_fill: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: store_fill HOME RUNS [DUE] [DUE_AT_MS]\n");
    return 2;
  }
  const std::string home = argv[1];
  const int64_t runs = std::atoll(argv[2]);
  const int64_t due = argc > 3 ? std::atoll(argv[3]) : 0;
  const int64_t now = tau::NowMillis();
  const int64_t due_at = argc > 4 ? std::atoll(argv[4]) : now;
  const auto t0 = std::chrono::steady_clock::now();
  if (tau::Status s = tau::MakeDirs(tau::layout::RunsDir(home)); !s.ok()) {
    std::fprintf(stderr, "store_fill: %s\n", s.ToString().c_str());
    return 1;
  }
  auto opened = st::Store::Open(tau::layout::StoreFile(home));
  if (!opened.ok()) {
    std::fprintf(stderr, "store_fill: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  st::Store* store = opened->get();

  std::vector<Filled> all;
  all.reserve(static_cast<size_t>(runs + due));
  // The old runs, oldest first, ended evenly over 30 days from 38 days ago.
  for (int64_t i = 0; i < runs; ++i)
    all.push_back(
        {fmt::format("train-{:08x}", i), now - 38 * kDayMs + i * (30 * kDayMs) / runs, false});
  for (int64_t i = 0; i < due; ++i)
    all.push_back({fmt::format("due{:x}-{:05x}", due_at, i), due_at + i, true});

  const nlohmann::json spec_json = SpecJson();
  const nlohmann::json resolved = Resolved();
  std::atomic<size_t> next{0};
  auto work = [&] {
    constexpr size_t kChunk = 256;
    while (true) {
      const size_t begin = next.fetch_add(kChunk);
      if (begin >= all.size()) return;
      const size_t end = std::min(all.size(), begin + kChunk);
      st::Batch batch;
      for (size_t i = begin; i < end; ++i) Insert(store, home, all[i], spec_json, resolved, &batch);
      if (tau::Status s = store->Commit(batch); !s.ok()) {
        std::fprintf(stderr, "store_fill: %s\n", s.ToString().c_str());
        std::exit(1);
      }
      for (size_t i = begin; i < end; ++i) WriteFiles(store, home, all[i], now);
      std::vector<std::string> pruned;
      for (size_t i = begin; i < end; ++i)
        if (!all[i].due) pruned.push_back(all[i].name);
      for (st::PruneKind kind : {st::PruneKind::kLogs, st::PruneKind::kGpuSamples})
        if (tau::Status s = store->MarkPruned(kind, pruned, now); !s.ok()) {
          std::fprintf(stderr, "store_fill: %s\n", s.ToString().c_str());
          std::exit(1);
        }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%s\n",
      nlohmann::json{
          {"home", home}, {"runs", runs}, {"due", due}, {"due_at_ms", due_at}, {"seconds", secs}}
          .dump()
          .c_str());
  return 0;
}
