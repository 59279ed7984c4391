#include "controller/evidence_worker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "common/files.h"
#include "common/layout.h"
#include "common/version.h"
#include "controller/run_storage.h"

namespace tau::server {

using store::RunRecord;

namespace {

constexpr int64_t kMetricsPollMs = 2000;

std::vector<std::string> StringList(const nlohmann::json& j) {
  std::vector<std::string> out;
  if (j.is_array())
    for (const auto& v : j)
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

}  // namespace

EvidenceWorker::EvidenceWorker(std::string home, store::Store* store, Clock* clock,
                               health::GpuInventory gpus, DescribeRuntime describe)
    : home_(std::move(home)),
      store_(store),
      clock_(clock),
      gpus_(std::move(gpus)),
      describe_(std::move(describe)) {}

EvidenceWorker::~EvidenceWorker() { Stop(); }

void EvidenceWorker::Start() { thread_ = std::thread(&EvidenceWorker::Work, this); }

void EvidenceWorker::Stop() {
  {
    // The worker finishes the records already queued (ended runs) before it stops.
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

std::string EvidenceWorker::Dir(const std::string& name) const {
  return layout::EvidenceDir(home_, name);
}

void EvidenceWorker::PollMetrics(const std::string& name, int attempt) {
  if (attempt <= 0) return;
  auto& collector = collectors_[name];
  if (!collector) {
    auto opened = evidence::MetricsCollector::Open(Dir(name));
    if (!opened.ok()) {
      std::fprintf(stderr, "tau server: metrics of %s: %s\n", name.c_str(),
                   opened.status().ToString().c_str());
      collectors_.erase(name);
      return;
    }
    collector = std::move(*opened);
  }
  auto polled = collector->Poll(layout::MetricsFile(layout::RunDir(home_, name)), attempt);
  if (!polled.ok())
    std::fprintf(stderr, "tau server: metrics of %s: %s\n", name.c_str(),
                 polled.status().ToString().c_str());
  MutexLock lock(&mu_);
  metrics_stats_[name] = collector->stats();
}

void EvidenceWorker::Tick(const std::vector<RunningAttempt>& running,
                          const std::vector<std::vector<evidence::GpuSample>>& samples) {
  int64_t now = clock_->NowMillis();
  bool poll = now - last_metrics_poll_ms_ >= kMetricsPollMs;
  if (poll) last_metrics_poll_ms_ = now;
  for (const RunningAttempt& r : running) {
    if (poll) PollMetrics(r.run, r.attempt);
    if (r.gpus.empty()) continue;
    std::vector<evidence::GpuSample> mine;
    for (const auto& batch : samples)
      for (const evidence::GpuSample& s : batch)
        if (std::find(r.gpus.begin(), r.gpus.end(), s.gpu) != r.gpus.end()) {
          mine.push_back(s);
          mine.back().attempt = r.attempt;
        }
    if (mine.empty()) continue;
    if (Status st = evidence::AppendGpuSamples(Dir(r.run), mine); !st.ok())
      std::fprintf(stderr, "tau server: GPU samples of %s: %s\n", r.run.c_str(),
                   st.ToString().c_str());
  }
}

void EvidenceWorker::HandOff(const std::string& name, RunRecord ended) {
  FinalRecord f{name, nullptr, std::move(ended)};
  if (auto it = collectors_.find(name); it != collectors_.end()) {
    f.metrics = std::move(it->second);
    collectors_.erase(it);
  }
  MutexLock lock(&mu_);
  queue_.push_back(std::move(f));
  cv_.Signal();
}

void EvidenceWorker::Work() {
  while (true) {
    FinalRecord f;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [&]() TAU_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      f = std::move(queue_.front());
      queue_.pop_front();
    }
    if (f.metrics) {
      if (Status s = f.metrics->Compact(); !s.ok())
        std::fprintf(stderr, "tau server: metrics of %s: %s\n", f.name.c_str(),
                     s.ToString().c_str());
    }
    auto saved = SaveFinal(f.name, f.metrics.get(), &f.ended);
    if (!saved.ok())
      std::fprintf(stderr, "tau server: evidence of %s: %s\n", f.name.c_str(),
                   saved.status().ToString().c_str());
    MutexLock lock(&mu_);
    metrics_stats_.erase(f.name);
  }
}

Result<evidence::RecordInput> EvidenceWorker::Assemble(const RunRecord& r,
                                                       const evidence::MetricHistory& history,
                                                       const evidence::MetricsStats& stats,
                                                       bool final_save) {
  const std::string dir = Dir(r.name);
  // What a previous record computed once (snapshot hashes, each ended attempt's log hashes,
  // artifact hashes, retention) is carried forward, not recomputed.
  std::optional<evidence::RecordInput> prev;
  if (PathExists(dir + "/record.json")) {
    auto loaded = evidence::LoadRecord(dir + "/record.json");
    if (loaded.ok()) {
      auto parsed = evidence::ParseRecord(*loaded);
      if (parsed.ok()) prev = std::move(*parsed);
    }
  }
  evidence::RecordInput in;
  evidence::RunInfo& run = in.run;
  run.name = r.name;
  run.spec_name = r.spec_name;
  run.state = store::RunStateName(r.state);
  run.reason = r.reason;
  run.message = r.message;
  run.exit_code = r.exit_code;
  run.signal = r.signal;
  run.workspace = r.workspace;
  run.queue = r.queue;
  run.priority = r.priority;
  run.resources = r.resources.is_object() ? r.resources : nlohmann::json::object();
  run.created_ms = r.created_ms;
  run.admitted_ms = r.admitted_ms;
  run.started_ms = r.started_ms;
  run.finished_ms = r.finished_ms;

  evidence::ConfigInfo& config = in.config;
  config.spec_file = r.spec_file;
  config.spec_yaml = r.spec_yaml;
  config.spec_json = r.spec_json.is_object() ? r.spec_json : nlohmann::json::object();
  config.config_hash = r.config_hash;
  config.resolved = r.resolved.is_object() ? r.resolved : nlohmann::json::object();
  if (auto p = config.resolved.find("provenance"); p != config.resolved.end()) {
    if (p->is_array())
      for (const auto& e : *p)
        if (e.is_object())
          config.provenance.push_back(
              {e.value("field", ""), e.value("value", ""), e.value("source", "")});
    config.resolved.erase(p);
  }

  if (prev && prev->snapshot.digest == r.snapshot_digest && !prev->snapshot.files.empty()) {
    in.snapshot = prev->snapshot;
  } else {
    auto snap = evidence::ScanSnapshot(r.snapshot_dir);
    if (snap.ok())
      in.snapshot = std::move(*snap);
    else
      in.snapshot.digest = r.snapshot_digest;  // the files are gone; the digest stays
  }

  evidence::RuntimeInfo& rt = in.runtime;
  const nlohmann::json& spec_runtime = config.spec_json.value("runtime", nlohmann::json::object());
  rt.pip = StringList(spec_runtime.value("pip", nlohmann::json::array()));
  rt.image = spec_runtime.value("image", "");
  rt.tau_version = Version();
  describe_(r, final_save, prev ? &*prev : nullptr, &rt);

  TAU_ASSIGN_OR_RETURN(auto events, store_->ListEvents(r.name));
  for (const store::Event& e : events)
    // Verbatim: the store hashed the data as it is (events recorded before every producer used an
    // object may hold null).
    in.events.push_back({e.id, e.ts_ms, e.type, e.message, e.data, e.prev_hash, e.hash});

  TAU_ASSIGN_OR_RETURN(auto attempts, store_->ListAttempts(r.name));
  std::set<int> used_gpus;
  std::vector<int64_t> starts;
  for (const store::AttemptRecord& a : attempts) {
    evidence::AttemptInfo ai;
    ai.number = a.number;
    ai.state = store::AttemptStateName(a.state);
    ai.gpus = a.gpus;
    ai.started_ms = a.started_ms;
    ai.ended_ms = a.ended_ms;
    ai.exit_code = a.exit_code;
    ai.signal = a.signal;
    ai.outcome = a.outcome;
    ai.failure_class = a.reason;
    ai.message = a.message;
    ai.diagnosis = a.diagnosis.is_object() ? a.diagnosis : nlohmann::json::object();
    const evidence::AttemptInfo* before = nullptr;
    if (prev)
      for (const auto& p : prev->attempts)
        if (p.number == a.number && p.ended_ms) before = &p;
    if (before && a.ended_ms && !before->logs.empty()) {
      ai.logs = before->logs;  // hashed when it ended (or pruned since: the hashes stay)
    } else if (PathExists(a.dir)) {
      auto logs = evidence::IndexAttemptLogs(a.dir);
      if (logs.ok()) ai.logs = std::move(*logs);
    }
    for (int g : a.gpus) used_gpus.insert(g);
    starts.push_back(a.started_ms);
    in.attempts.push_back(std::move(ai));
  }
  for (int g : used_gpus)
    for (const health::GpuDevice& d : gpus_.devices)
      if (d.index == g) rt.gpus.push_back({d.index, d.uuid, d.name});

  const std::vector<evidence::Artifact>* prev_artifacts = prev ? &prev->artifacts : nullptr;
  for (const char* kind : {"checkpoint", "output"}) {
    std::string root = StorageDir(home_, r, kind);
    if (!PathExists(root)) continue;
    auto found = evidence::ScanArtifacts(root, kind, starts, prev_artifacts);
    if (!found.ok()) return found.status();
    for (auto& a : *found) in.artifacts.push_back(std::move(a));
  }

  in.metrics = evidence::MetricsInfoFrom(history, stats);
  if (prev) in.retention = prev->retention;
  if (in.retention.samples_pruned_ms && prev) {
    in.gpu_samples = prev->gpu_samples;  // the samples are gone; their summaries stay
  } else {
    auto samples = evidence::LoadGpuSamples(dir + "/gpu-samples.jsonl");
    if (samples.ok()) in.gpu_samples = evidence::SummarizeGpuSamples(*samples);
  }
  in.updated_ms = clock_->NowMillis();
  return in;
}

Result<nlohmann::json> EvidenceWorker::SaveFinal(const std::string& name,
                                                 const evidence::MetricsCollector* collector,
                                                 const RunRecord* ended) {
  std::optional<RunRecord> read;
  if (ended == nullptr) {
    TAU_ASSIGN_OR_RETURN(read, store_->GetRun(name));
    ended = &*read;
  }
  const RunRecord& r = *ended;
  std::optional<evidence::MetricHistory> loaded;
  evidence::MetricsStats stats;
  if (collector) {
    stats = collector->stats();
  } else {
    // No collector (the run ended before a poll, or before this server started): what the
    // evidence directory holds, with the ingestion totals the collector kept there.
    auto c = evidence::MetricsCollector::Open(Dir(name));
    if (c.ok()) stats = (*c)->stats();
  }
  if (!collector) {
    TAU_ASSIGN_OR_RETURN(loaded, evidence::LoadMetricHistory(layout::MetricsFile(Dir(name))));
  }
  const evidence::MetricHistory& history = collector ? collector->history() : *loaded;
  MutexLock lock(&record_save_mu_);
  TAU_ASSIGN_OR_RETURN(evidence::RecordInput in, Assemble(r, history, stats, true));
  nlohmann::json record = evidence::BuildRecord(in);
  // Made again from the store and the run's files when lost, so not worth a disk flush per run;
  // unless it carries the hashes of files retention has pruned, which nothing can make again.
  const bool only_copy = in.retention.logs_pruned_ms || in.retention.samples_pruned_ms;
  TAU_RETURN_IF_ERROR(evidence::SaveRecord(
      Dir(name), record, only_copy ? Durability::kSynced : Durability::kProcessCrash));
  return record;
}

Result<nlohmann::json> EvidenceWorker::Record(const std::string& name) {
  TAU_ASSIGN_OR_RETURN(RunRecord r, store_->GetRun(name));
  const std::string dir = Dir(name);
  if (store::IsTerminal(r.state)) {
    // The saved final record, unless it predates the run's last event (resumed since, or the
    // worker has not saved it yet): then it is saved now.
    auto saved = evidence::LoadRecord(dir + "/record.json");
    auto events = store_->ListEvents(name);
    if (saved.ok() && events.ok() && !events->empty() &&
        saved->value("chain_head", "") == events->back().hash)
      return saved;
    return SaveFinal(name, nullptr);
  }
  evidence::MetricsStats stats;
  {
    MutexLock lock(&mu_);
    if (auto it = metrics_stats_.find(name); it != metrics_stats_.end()) stats = it->second;
  }
  // Read only: the loop's collector appends to this file while the run goes on (a partial last
  // line is skipped).
  TAU_ASSIGN_OR_RETURN(evidence::MetricHistory history,
                       evidence::LoadMetricHistory(layout::MetricsFile(dir)));
  TAU_ASSIGN_OR_RETURN(evidence::RecordInput in, Assemble(r, history, stats, false));
  return evidence::BuildRecord(in);
}

Status EvidenceWorker::Sources(const std::string& name, evidence::RecordInput* input,
                               evidence::BundleSources* sources) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json record, Record(name));
  TAU_ASSIGN_OR_RETURN(*input, evidence::ParseRecord(record));
  const std::string dir = Dir(name);
  sources->metrics_path = layout::MetricsFile(dir);
  sources->gpu_samples_path = dir + "/gpu-samples.jsonl";
  for (const evidence::AttemptInfo& a : input->attempts)
    for (const evidence::LogInfo& l : a.logs)
      if (l.state == evidence::LogState::kKept)
        sources->logs.push_back({a.number, l.rank,
                                 fmt::format("{}/logs/rank-{}.log",
                                             layout::AttemptDir(home_, name, a.number), l.rank)});
  return Status::Ok();
}

Status EvidenceWorker::ApplyRetention(const evidence::RetentionPolicy& policy, int64_t now_ms) {
  if (policy.keep_logs_ms <= 0 && policy.keep_samples_ms <= 0) return Status::Ok();
  store::RunFilter filter;
  filter.newest_first = false;
  TAU_ASSIGN_OR_RETURN(auto runs, store_->ListRuns(filter));
  std::vector<evidence::RunRetentionInput> inputs;
  for (const RunRecord& r : runs) {
    if (!store::IsTerminal(r.state)) continue;
    evidence::RunRetentionInput in;
    in.name = r.name;
    in.terminal = true;
    in.finished_ms = r.finished_ms;
    auto saved = evidence::LoadRecord(Dir(r.name) + "/record.json");
    if (!saved.ok()) continue;  // its final record is not saved yet: prune nothing before it is
    auto parsed = evidence::ParseRecord(*saved);
    if (!parsed.ok()) continue;
    in.state = parsed->retention;
    inputs.push_back(std::move(in));
  }
  for (const evidence::PruneAction& action : evidence::PlanRetention(inputs, policy, now_ms)) {
    // The record first (durable: it says the files are pruned, with their hashes), then the files.
    MutexLock lock(&record_save_mu_);
    auto saved = evidence::LoadRecord(Dir(action.run) + "/record.json");
    if (!saved.ok()) continue;
    auto in = evidence::ParseRecord(*saved);
    if (!in.ok()) continue;
    if (action.what == evidence::PruneWhat::kLogs) {
      in->retention.logs_pruned_ms = now_ms;
      for (auto& a : in->attempts)
        for (auto& l : a.logs)
          if (l.state == evidence::LogState::kKept) l.state = evidence::LogState::kPruned;
    } else {
      in->retention.samples_pruned_ms = now_ms;
    }
    TAU_RETURN_IF_ERROR(evidence::SaveRecord(Dir(action.run), evidence::BuildRecord(*in)));
    if (action.what == evidence::PruneWhat::kLogs) {
      for (const auto& a : in->attempts)
        (void)RemoveTree(layout::AttemptDir(home_, action.run, a.number) + "/logs");
    } else {
      ::unlink((Dir(action.run) + "/gpu-samples.jsonl").c_str());
    }
  }
  return Status::Ok();
}

}  // namespace tau::server
