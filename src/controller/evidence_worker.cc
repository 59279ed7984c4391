#include "controller/evidence_worker.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "common/files.h"
#include "common/layout.h"
#include "common/strings.h"
#include "common/version.h"
#include "controller/redact.h"
#include "controller/run_storage.h"
#include "policy/policy.h"

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
                               health::GpuInventory gpus, DescribeRuntime describe, Post post)
    : home_(std::move(home)),
      store_(store),
      clock_(clock),
      gpus_(std::move(gpus)),
      describe_(std::move(describe)),
      post_(std::move(post)) {}

EvidenceWorker::~EvidenceWorker() { Stop(); }

void EvidenceWorker::Start() {
  thread_ = std::thread(&EvidenceWorker::Work, this);
  metrics_thread_ = std::thread(&EvidenceWorker::MetricsWork, this);
}

void EvidenceWorker::Stop() {
  {
    // The metrics thread reads what ended attempts and ended runs left, and hands the ended runs
    // on; the final records' thread saves them all before it stops.
    MutexLock lock(&mu_);
    stopping_ = true;
    metrics_cv_.SignalAll();
  }
  if (metrics_thread_.joinable()) metrics_thread_.join();
  {
    MutexLock lock(&mu_);
    final_stopping_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

std::string EvidenceWorker::Dir(const std::string& name) const {
  return layout::EvidenceDir(home_, name);
}

void EvidenceWorker::Tick(const std::vector<RunningAttempt>& running,
                          std::vector<std::vector<evidence::GpuSample>> samples) {
  MutexLock lock(&mu_);
  running_ = running;
  for (auto& batch : samples) {
    if (batch.empty()) continue;
    samples_.push_back(std::move(batch));
    metrics_kick_ = true;
  }
  // A stalled metrics thread keeps the newest batches.
  while (samples_.size() > Inbox::kMaxSampleBatches) samples_.pop_front();
  if (metrics_kick_) metrics_cv_.Signal();
}

void EvidenceWorker::AttemptEnded(const std::string& name, int attempt) {
  if (attempt <= 0) return;
  MutexLock lock(&mu_);
  ended_[name] = attempt;
  metrics_kick_ = true;
  metrics_cv_.Signal();
}

bool EvidenceWorker::Draining(const std::string& name) {
  MutexLock lock(&mu_);
  return ended_.count(name) > 0;
}

void EvidenceWorker::HandOff(const std::string& name, RunRecord ended) {
  MutexLock lock(&mu_);
  ending_.emplace_back(name, std::move(ended));
  metrics_kick_ = true;
  metrics_cv_.Signal();
}

Result<evidence::MetricsStats> EvidenceWorker::MetricsStats(const std::string& name) {
  {
    MutexLock lock(&mu_);
    if (auto it = metrics_stats_.find(name); it != metrics_stats_.end()) return it->second;
  }
  return evidence::LoadMetricsStats(Dir(name));
}

bool EvidenceWorker::PollOnce(const std::string& name, int attempt, const RunRecord* r) {
  if (attempt <= 0) return false;
  Collector& c = collectors_[name];
  if (!c.collector) {
    std::optional<RunRecord> read;
    if (r == nullptr) {
      auto got = store_->GetRun(name);
      if (!got.ok()) {
        collectors_.erase(name);
        return false;
      }
      read = std::move(*got);
      r = &*read;
    }
    evidence::CollectorOptions options;
    if (auto resolved = policy::ResolvedRunFromJson(r->resolved); resolved.ok()) {
      options.max_points = resolved->max_metric_points;
      options.max_series = resolved->max_metric_series;
    }
    // Masked before anything is kept: the evidence file, the record and bundles all come from it.
    if (auto secrets = SecretValuesOf(store_, *r); secrets.ok())
      options.secrets = std::move(*secrets);
    auto opened = evidence::MetricsCollector::Open(Dir(name), std::move(options));
    if (!opened.ok()) {
      std::fprintf(stderr, "tau server: metrics of %s: %s\n", name.c_str(),
                   opened.status().ToString().c_str());
      collectors_.erase(name);
      return false;
    }
    c.collector = std::move(*opened);
    c.told_points = c.collector->stats().refused_points > 0;
    c.told_series = c.collector->stats().refused_series > 0;
    c.workspace = r->workspace;
    c.max_points = c.collector->options().max_points;
    c.max_series = c.collector->options().max_series;
    if (auto m = r->spec_json.find("metrics"); m != r->spec_json.end() && m->is_object())
      c.history = StringList(m->value("history", nlohmann::json::array()));
    if (!c.history.empty()) c.output_dir = StorageDir(home_, *r, "output");
  }
  auto polled = c.collector->Poll(layout::MetricsFile(layout::RunDir(home_, name)), attempt);
  if (!polled.ok())
    std::fprintf(stderr, "tau server: metrics of %s: %s\n", name.c_str(),
                 polled.status().ToString().c_str());
  const bool history_more = PollHistory(name, c, attempt);
  const evidence::MetricsStats& stats = c.collector->stats();
  {
    MutexLock lock(&mu_);
    metrics_stats_[name] = stats;
  }
  // Once per run and cap: a run that floods would otherwise fill its events.
  auto tell = [&](bool* told, int64_t refused, const char* limit, int64_t value, const char* what) {
    if (*told || refused == 0) return;
    *told = true;
    post_(RunNotice{
        name,
        "MetricsLimited",
        fmt::format("the run reached its limit of {} metric {} (limits.{}): more are refused "
                    "and counted; an admin may raise limits.{} of workspace '{}' in platform.yaml",
                    value, what, limit, limit, c.workspace),
        {{"limit", limit}, {"value", value}, {"attempt", attempt}}});
  };
  tell(&c.told_points, stats.refused_points, "max_metric_points", c.max_points, "points");
  tell(&c.told_series, stats.refused_series, "max_metric_series", c.max_series, "series");
  return (polled.ok() && polled->more) || history_more;
}

bool EvidenceWorker::PollHistory(const std::string& name, Collector& c, int attempt) {
  if (c.history.empty() || !PathExists(c.output_dir)) return false;
  // Only files inside the output directory are read: a glob that crosses a link the run made
  // (output/x -> /etc) must not make the server read what the run cannot show otherwise.
  char* real_root = ::realpath(c.output_dir.c_str(), nullptr);
  if (real_root == nullptr) return false;
  const std::string root = std::string(real_root) + "/";
  std::free(real_root);
  std::set<std::string> files;
  bool capped = false;
  for (const std::string& pattern : c.history) {
    glob_t g;
    const std::string full = c.output_dir + "/" + pattern;
    if (::glob(full.c_str(), GLOB_NOSORT, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (files.size() >= kMaxHistoryFiles) {
          capped = true;
          break;
        }
        char* real = ::realpath(g.gl_pathv[i], nullptr);
        if (real == nullptr) continue;
        std::string resolved = real;
        std::free(real);
        if (StartsWith(resolved, root)) files.insert(g.gl_pathv[i]);
      }
    }
    ::globfree(&g);
  }
  if (capped && !c.told_history_cap) {
    c.told_history_cap = true;
    post_(RunNotice{name,
                    "MetricsLimited",
                    fmt::format("metrics.history matches more than {} files: only {} are read",
                                kMaxHistoryFiles, kMaxHistoryFiles),
                    {{"limit", "history_files"},
                     {"value", static_cast<int64_t>(kMaxHistoryFiles)},
                     {"attempt", attempt}}});
  }
  bool more = false;
  for (const std::string& file : files) {
    auto polled = c.collector->Poll(file, attempt, evidence::MetricsFormat::kHistory);
    if (!polled.ok()) {
      std::fprintf(stderr, "tau server: metrics.history of %s: %s\n", name.c_str(),
                   polled.status().ToString().c_str());
      continue;
    }
    more = more || polled->more;
  }
  return more;
}

void EvidenceWorker::AppendSamples(const std::vector<RunningAttempt>& running,
                                   const std::vector<std::vector<evidence::GpuSample>>& samples) {
  for (const RunningAttempt& r : running) {
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

// Each pass reads at most one bounded chunk of each run that has something to read (an ended
// attempt, an ended run, a running attempt every 2 s, or at once while it is behind), so a run
// that writes millions of points is read in turns with the others, never all at once.
void EvidenceWorker::MetricsWork() {
  using std::chrono::steady_clock;
  steady_clock::time_point last_poll = steady_clock::now() - std::chrono::hours(1);
  std::set<std::string> behind;  // a running attempt's last read stopped with more to read
  while (true) {
    std::vector<RunningAttempt> running;
    std::map<std::string, int> ended;
    std::vector<std::pair<std::string, RunRecord>> ending;
    std::vector<std::vector<evidence::GpuSample>> samples;
    bool stop = false;
    {
      MutexLock lock(&mu_);
      if (behind.empty() && ended_.empty() && ending_.empty()) {
        auto wait = std::chrono::milliseconds(kMetricsPollMs) - (steady_clock::now() - last_poll);
        if (wait > std::chrono::milliseconds(0))
          metrics_cv_.WaitFor(&mu_, wait,
                              [&]() TAU_REQUIRES(mu_) { return stopping_ || metrics_kick_; });
      }
      metrics_kick_ = false;
      running = running_;
      ended = ended_;
      for (const auto& e : ending_) ending.push_back(e);
      for (auto& b : samples_) samples.push_back(std::move(b));
      samples_.clear();
      stop = stopping_;
    }
    if (stop && ended.empty() && ending.empty()) return;
    bool due = steady_clock::now() - last_poll >= std::chrono::milliseconds(kMetricsPollMs);
    if (due) last_poll = steady_clock::now();
    // Ended attempts first: their runs' next attempts wait for them.
    for (const auto& [name, attempt] : ended) {
      if (PollOnce(name, attempt, nullptr)) continue;
      {
        MutexLock lock(&mu_);
        if (auto it = ended_.find(name); it != ended_.end() && it->second == attempt)
          ended_.erase(it);
      }
      post_(MetricsDrained{name});
    }
    for (auto& [name, record] : ending) {
      if (ended.count(name)) continue;  // its last attempt's points first
      if (PollOnce(name, record.attempts, &record)) continue;
      FinalRecord f{name, nullptr, std::move(record)};
      if (auto it = collectors_.find(name); it != collectors_.end()) {
        f.metrics = std::move(it->second.collector);
        collectors_.erase(it);
      }
      MutexLock lock(&mu_);
      for (auto it = ending_.begin(); it != ending_.end(); ++it)
        if (it->first == name) {
          ending_.erase(it);
          break;
        }
      metrics_stats_.erase(name);
      queue_.push_back(std::move(f));
      cv_.Signal();
    }
    for (const RunningAttempt& r : running) {
      if (ended.count(r.run) || (!due && !behind.count(r.run))) continue;
      if (PollOnce(r.run, r.attempt, nullptr))
        behind.insert(r.run);
      else
        behind.erase(r.run);
    }
    // Runs that stopped running since (their ends are handled above).
    for (auto it = behind.begin(); it != behind.end();)
      it = std::any_of(running.begin(), running.end(),
                       [&](const RunningAttempt& r) { return r.run == *it; })
               ? std::next(it)
               : behind.erase(it);
    if (!samples.empty()) AppendSamples(running, samples);
  }
}

void EvidenceWorker::Work() {
  while (true) {
    FinalRecord f;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [&]() TAU_REQUIRES(mu_) { return final_stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      f = std::move(queue_.front());
      queue_.pop_front();
    }
    std::optional<evidence::MetricsInfo> metrics;
    if (f.metrics) {
      auto compacted = f.metrics->Compact();
      if (compacted.ok()) {
        metrics = evidence::MetricsInfoFrom(*compacted, f.metrics->stats());
        // Kept with the compacted file: reads of an ended run's metrics neither sort nor re-read
        // them (a failure only costs those reads their shortcut).
        if (Status s = evidence::SaveMetricSummaries(Dir(f.name), *compacted); !s.ok())
          std::fprintf(stderr, "tau server: metrics of %s: %s\n", f.name.c_str(),
                       s.ToString().c_str());
      } else
        std::fprintf(stderr, "tau server: metrics of %s: %s\n", f.name.c_str(),
                     compacted.status().ToString().c_str());
    }
    auto saved = SaveFinal(f.name, metrics ? &*metrics : nullptr, &f.ended);
    if (!saved.ok())
      std::fprintf(stderr, "tau server: evidence of %s: %s\n", f.name.c_str(),
                   saved.status().ToString().c_str());
  }
}

evidence::MetricsInfo EvidenceWorker::MetricsOf(const std::string& name) {
  evidence::MetricsStats stats;
  if (auto s = MetricsStats(name); s.ok()) stats = std::move(*s);
  evidence::CompactReport summary;
  auto summarised = evidence::CompactMetricsFile(layout::MetricsFile(Dir(name)), "");
  if (summarised.ok()) summary = std::move(*summarised);
  return evidence::MetricsInfoFrom(summary, stats);
}

std::vector<evidence::LineageEntry> EvidenceWorker::Lineage(
    const std::vector<store::Event>& events, const std::vector<evidence::LineageEntry>* before) {
  std::vector<evidence::LineageEntry> out;
  const store::Event* ready = nullptr;
  for (const store::Event& e : events)
    if (e.type == "UpstreamReady") ready = &e;  // the last one: a restart may have said it again
  if (ready == nullptr) return out;
  for (const nlohmann::json& u : ready->data.value("upstreams", nlohmann::json::array())) {
    evidence::LineageEntry l;
    l.stage = u.value("stage", "");
    l.run = u.value("run", "");
    l.state = u.value("state", "");
    l.checkpoint = u.value("checkpoint", "");
    l.output_dir = u.value("output_dir", "");
    const std::string dir = u.value("checkpoint_dir", "");
    bool known = false;
    if (before)  // digested once
      for (const evidence::LineageEntry& b : *before)
        if (b.run == l.run && b.checkpoint == l.checkpoint && !b.checkpoint_sha256.empty()) {
          l = b;
          known = true;
        }
    if (!known && !l.checkpoint.empty() && StartsWith(l.checkpoint, dir + "/")) {
      // The upstream run's own record hashed its checkpoints when it ended: reused while each
      // file keeps its size and time, read again otherwise.
      std::optional<evidence::RecordInput> upstream;
      auto saved = evidence::LoadRecord(layout::EvidenceDir(home_, l.run) + "/record.json");
      if (saved.ok())
        if (auto parsed = evidence::ParseRecord(*saved); parsed.ok()) upstream = std::move(*parsed);
      auto files =
          evidence::ScanArtifacts(dir, "checkpoint", {}, upstream ? &upstream->artifacts : nullptr);
      if (files.ok()) {
        evidence::CheckpointSum sum =
            evidence::CheckpointDigest(*files, l.checkpoint.substr(dir.size() + 1));
        l.checkpoint_sha256 = sum.sha256;
        l.checkpoint_files = sum.files;
        l.checkpoint_bytes = sum.bytes;
      }
    }
    out.push_back(std::move(l));
  }
  return out;
}

Result<evidence::RecordInput> EvidenceWorker::Assemble(const RunRecord& r,
                                                       evidence::MetricsInfo metrics,
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

  in.lineage = Lineage(events, prev ? &prev->lineage : nullptr);

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
  // A file named after a secret (a checkpoint tagged with a token, say) is listed masked: the
  // record, describe and bundles (checkpoints.json) all take their names from here.
  if (!in.artifacts.empty()) {
    if (auto secrets = SecretValuesOf(store_, r); secrets.ok())
      evidence::MaskArtifactPaths(&in.artifacts, *secrets);
  }

  in.metrics = std::move(metrics);
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
                                                 const evidence::MetricsInfo* metrics,
                                                 const RunRecord* ended) {
  std::optional<RunRecord> read;
  if (ended == nullptr) {
    TAU_ASSIGN_OR_RETURN(read, store_->GetRun(name));
    ended = &*read;
  }
  const RunRecord& r = *ended;
  // No compaction (the run ended before its metrics were read, or before this server started):
  // what the evidence directory holds, with the ingestion totals the collector kept there.
  evidence::MetricsInfo info = metrics ? *metrics : MetricsOf(name);
  MutexLock lock(&record_save_mu_);
  TAU_ASSIGN_OR_RETURN(evidence::RecordInput in, Assemble(r, std::move(info), true));
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
  // Summarised from the file the metrics thread appends to (a partial last line is skipped), in
  // bounded memory.
  TAU_ASSIGN_OR_RETURN(evidence::RecordInput in, Assemble(r, MetricsOf(name), false));
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
  const std::pair<store::PruneKind, int64_t> kinds[] = {
      {store::PruneKind::kLogs, policy.keep_logs_ms},
      {store::PruneKind::kGpuSamples, policy.keep_samples_ms}};
  for (const auto& [kind, keep_ms] : kinds) {
    if (keep_ms <= 0) continue;
    // The store's queue of what is due, a page at a time: what was pruned or is not due is never
    // read, memory holds one page, and the store's lock is held only to read a page and to mark
    // it, so API calls go on between pages.
    std::optional<store::RetentionDue> after;
    while (true) {
      TAU_ASSIGN_OR_RETURN(
          auto due, store_->ListRetentionDue(kind, now_ms - keep_ms, after, kRetentionBatch));
      if (due.empty()) break;
      after = due.back();
      std::vector<std::string> pruned;
      for (const store::RetentionDue& d : due) {
        TAU_ASSIGN_OR_RETURN(std::optional<int64_t> when, PruneRun(d.name, kind, now_ms));
        if (!when) continue;  // no final record yet: due again next pass
        if (*when == now_ms) {
          pruned.push_back(d.name);
        } else {
          // Pruned by a tau from before the store kept it: the store learns the record's time.
          TAU_RETURN_IF_ERROR(store_->MarkPruned(kind, {d.name}, *when));
        }
      }
      TAU_RETURN_IF_ERROR(store_->MarkPruned(kind, pruned, now_ms));
      if (static_cast<int64_t>(due.size()) < kRetentionBatch) break;
    }
  }
  return Status::Ok();
}

Result<std::optional<int64_t>> EvidenceWorker::PruneRun(const std::string& name,
                                                        store::PruneKind kind, int64_t now_ms) {
  MutexLock lock(&record_save_mu_);
  auto saved = evidence::LoadRecord(Dir(name) + "/record.json");
  if (!saved.ok()) return std::optional<int64_t>();  // prune nothing before the record is saved
  auto in = evidence::ParseRecord(*saved);
  if (!in.ok()) return std::optional<int64_t>();
  const bool logs = kind == store::PruneKind::kLogs;
  std::optional<int64_t>& when =
      logs ? in->retention.logs_pruned_ms : in->retention.samples_pruned_ms;
  if (when) return std::optional<int64_t>(when);
  // The record first (durable: it says the files are pruned, with their hashes), then the files;
  // the store's mark comes last, so a crash before it finds the run due again and finishes.
  when = now_ms;
  if (logs)
    for (auto& a : in->attempts)
      for (auto& l : a.logs)
        if (l.state == evidence::LogState::kKept) l.state = evidence::LogState::kPruned;
  TAU_RETURN_IF_ERROR(evidence::SaveRecord(Dir(name), evidence::BuildRecord(*in)));
  if (logs) {
    for (const auto& a : in->attempts)
      (void)RemoveTree(layout::AttemptDir(home_, name, a.number) + "/logs");
  } else {
    ::unlink((Dir(name) + "/gpu-samples.jsonl").c_str());
  }
  return std::optional<int64_t>(now_ms);
}

}  // namespace tau::server
