// The controller's evidence side (docs/evidence.md): metric collection and GPU samples from the
// loop, the record assembled from the store and the run's files, the final record saved by a worker
// thread once a run has ended, and retention.
#include <fcntl.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/layout.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "server/controller.h"
#include "server/server.h"

extern char** environ;

namespace tau::server {

using store::RunRecord;

namespace {

constexpr int64_t kMetricsPollMs = 2000;

std::string Hostname() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

std::string ReadOsName() {
  std::ifstream in("/etc/os-release");
  std::string line;
  while (std::getline(in, line)) {
    if (!StartsWith(line, "PRETTY_NAME=")) continue;
    std::string v = line.substr(12);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return v;
  }
  struct utsname u {};
  return ::uname(&u) == 0 ? u.sysname : "";
}

// Read once: every record wants it, and it changes only with an upgrade (which restarts the
// server).
const std::string& OsName() {
  static const std::string name = ReadOsName();
  return name;
}

std::string Kernel() {
  struct utsname u {};
  return ::uname(&u) == 0 ? fmt::format("{} {}", u.release, u.machine) : "";
}

// The standard output of a program (argv, found on PATH; no shell), "" when it fails. Only for
// the evidence worker: it may take a second (pip freeze).
std::string Capture(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  std::string text;
  if (rc == 0) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  if (rc != 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    return "";
  return text;
}

// `python3 --version`, asked at most once a minute: every run's record wants it, and on a machine
// with pyenv shims it costs tens of milliseconds of CPU.
std::string SystemPythonVersion() {
  static Mutex mu;
  static std::string version TAU_GUARDED_BY(mu);
  static int64_t asked_ms TAU_GUARDED_BY(mu) = -1;
  MutexLock lock(&mu);
  int64_t now = MonotonicMillis();
  if (asked_ms < 0 || now - asked_ms > 60'000) {
    version = Capture({"python3", "--version"});
    asked_ms = now;
  }
  return version;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& l : Split(text, '\n'))
    if (!Trim(l).empty()) out.emplace_back(Trim(l));
  return out;
}

// The interpreter's version, and the packages installed in the run's virtualenv when its spec asks
// for pip requirements: the shim keys its venv cache by the sorted requirements and `python3
// --version` (runtime/shim.cc, EnsureVenv), so the same key finds the venv the run used.
void FillPython(const std::string& venv_cache, const std::vector<std::string>& pip,
                evidence::RuntimeInfo* rt) {
  std::string version = SystemPythonVersion();
  rt->python_version = std::string(Trim(version));
  if (StartsWith(rt->python_version, "Python ")) rt->python_version = rt->python_version.substr(7);
  if (pip.empty() || version.empty()) return;
  std::vector<std::string> sorted = pip;
  std::sort(sorted.begin(), sorted.end());
  std::string key = Sha256Hex(Join(sorted, "\n") + "\n--\n" + version).substr(0, 32);
  char target[4096];
  ssize_t len = ::readlink((venv_cache + "/" + key).c_str(), target, sizeof target - 1);
  if (len <= 0) return;
  std::string dir = venv_cache + "/" + std::string(target, static_cast<size_t>(len));
  rt->packages = Lines(Capture({dir + "/bin/python", "-m", "pip", "freeze"}));
}

std::vector<std::string> StringList(const nlohmann::json& j) {
  std::vector<std::string> out;
  if (j.is_array())
    for (const auto& v : j)
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

}  // namespace

void Controller::PollMetrics(const std::string& name, int attempt) {
  if (attempt <= 0) return;
  auto& collector = collectors_[name];
  if (!collector) {
    auto opened = evidence::MetricsCollector::Open(EvidenceDir(name));
    if (!opened.ok()) {
      std::fprintf(stderr, "tau server: metrics of %s: %s\n", name.c_str(),
                   opened.status().ToString().c_str());
      collectors_.erase(name);
      return;
    }
    collector = std::move(*opened);
  }
  auto polled = collector->Poll(layout::MetricsFile(RunDir(name)), attempt);
  if (!polled.ok())
    std::fprintf(stderr, "tau server: metrics of %s: %s\n", name.c_str(),
                 polled.status().ToString().c_str());
  MutexLock lock(&evidence_mu_);
  metrics_stats_[name] = collector->stats();
}

void Controller::OnGpuSamples(std::vector<evidence::GpuSample> samples) {
  if (samples.empty()) return;
  MutexLock lock(&mu_);
  if (inbox_samples_.size() > 100) inbox_samples_.pop_front();  // a stalled loop keeps the newest
  inbox_samples_.push_back(std::move(samples));
  cv_.Signal();
}

void Controller::EvidenceTick(const std::vector<std::vector<evidence::GpuSample>>& samples) {
  int64_t now = NowMillis();
  bool poll = now - last_metrics_poll_ms_ >= kMetricsPollMs;
  if (poll) last_metrics_poll_ms_ = now;
  for (auto& [name, run] : active_) {
    const RunRecord& r = run.record;
    if (store::IsTerminal(r.state)) continue;  // handed to the evidence worker (HandOffEnded)
    if (!run.shim) continue;
    if (poll) PollMetrics(name, r.attempts);
    if (r.gpus.empty()) continue;
    std::vector<evidence::GpuSample> mine;
    for (const auto& batch : samples)
      for (const evidence::GpuSample& s : batch)
        if (std::find(r.gpus.begin(), r.gpus.end(), s.gpu) != r.gpus.end()) {
          mine.push_back(s);
          mine.back().attempt = r.attempts;
        }
    if (mine.empty()) continue;
    if (Status st = evidence::AppendGpuSamples(EvidenceDir(name), mine); !st.ok())
      std::fprintf(stderr, "tau server: GPU samples of %s: %s\n", name.c_str(),
                   st.ToString().c_str());
  }
}

void Controller::HandOffEnded(const std::string& name, RunRecord ended) {
  FinalRecord f{name, nullptr, std::move(ended)};
  if (auto it = collectors_.find(name); it != collectors_.end()) {
    f.metrics = std::move(it->second);
    collectors_.erase(it);
  }
  MutexLock lock(&evidence_mu_);
  evidence_queue_.push_back(std::move(f));
  evidence_cv_.Signal();
}

void Controller::EvidenceWorker() {
  while (true) {
    FinalRecord f;
    {
      MutexLock lock(&evidence_mu_);
      evidence_cv_.Wait(&evidence_mu_, [&]() TAU_REQUIRES(evidence_mu_) {
        return evidence_stopping_ || !evidence_queue_.empty();
      });
      if (evidence_queue_.empty()) return;
      f = std::move(evidence_queue_.front());
      evidence_queue_.pop_front();
    }
    if (f.metrics) {
      if (Status s = f.metrics->Compact(); !s.ok())
        std::fprintf(stderr, "tau server: metrics of %s: %s\n", f.name.c_str(),
                     s.ToString().c_str());
    }
    auto saved = SaveFinalRecord(f.name, f.metrics.get(), &f.ended);
    if (!saved.ok())
      std::fprintf(stderr, "tau server: evidence of %s: %s\n", f.name.c_str(),
                   saved.status().ToString().c_str());
    MutexLock lock(&evidence_mu_);
    metrics_stats_.erase(f.name);
  }
}

Result<evidence::RecordInput> Controller::AssembleRecord(const RunRecord& r,
                                                         const evidence::MetricHistory& history,
                                                         const evidence::MetricsStats& stats,
                                                         bool final_save) {
  const std::string dir = EvidenceDir(r.name);
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
  if (options_.cluster) {
    // The run's pods ran on the cluster's nodes, in its image: nothing of this machine describes
    // them, so nothing of it is recorded (the image is, above).
    rt.host = "kubernetes";
  } else {
    rt.host = Hostname();
    rt.os = OsName();
    rt.kernel = Kernel();
    rt.driver_version = gpus_.driver_version;
    rt.cuda_version = gpus_.cuda_driver_version;
    if (prev) {
      rt.python_version = prev->runtime.python_version;
      rt.packages = prev->runtime.packages;
    }
    if (final_save || rt.python_version.empty()) {
      // The cache the run's attempts used: runs of other users have their own (RunAsSubmitter).
      // Only a run with pip requirements has a virtualenv to look for.
      std::string venvs = VenvCacheDir(std::nullopt);
      if (!rt.pip.empty())
        if (auto ids = SubmitterIds(r); ids.ok()) venvs = VenvCacheDir(*ids);
      FillPython(venvs, rt.pip, &rt);
    }
  }

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
    std::string root = StorageDir(r, kind);
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
  in.updated_ms = NowMillis();
  return in;
}

Result<nlohmann::json> Controller::SaveFinalRecord(const std::string& name,
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
    auto c = evidence::MetricsCollector::Open(EvidenceDir(name));
    if (c.ok()) stats = (*c)->stats();
  }
  if (!collector) {
    TAU_ASSIGN_OR_RETURN(loaded,
                         evidence::LoadMetricHistory(layout::MetricsFile(EvidenceDir(name))));
  }
  const evidence::MetricHistory& history = collector ? collector->history() : *loaded;
  MutexLock lock(&record_save_mu_);
  TAU_ASSIGN_OR_RETURN(evidence::RecordInput in, AssembleRecord(r, history, stats, true));
  nlohmann::json record = evidence::BuildRecord(in);
  // Made again from the store and the run's files when lost, so not worth a disk flush per run;
  // unless it carries the hashes of files retention has pruned, which nothing can make again.
  const bool only_copy = in.retention.logs_pruned_ms || in.retention.samples_pruned_ms;
  TAU_RETURN_IF_ERROR(evidence::SaveRecord(
      EvidenceDir(name), record, only_copy ? Durability::kSynced : Durability::kProcessCrash));
  return record;
}

Result<nlohmann::json> Controller::EvidenceRecord(const std::string& name) {
  TAU_ASSIGN_OR_RETURN(RunRecord r, store_->GetRun(name));
  const std::string dir = EvidenceDir(name);
  if (store::IsTerminal(r.state)) {
    // The saved final record, unless it predates the run's last event (resumed since, or the
    // worker has not saved it yet): then it is saved now.
    auto saved = evidence::LoadRecord(dir + "/record.json");
    auto events = store_->ListEvents(name);
    if (saved.ok() && events.ok() && !events->empty() &&
        saved->value("chain_head", "") == events->back().hash)
      return saved;
    return SaveFinalRecord(name, nullptr);
  }
  evidence::MetricsStats stats;
  {
    MutexLock lock(&evidence_mu_);
    if (auto it = metrics_stats_.find(name); it != metrics_stats_.end()) stats = it->second;
  }
  // Read only: the loop's collector appends to this file while the run goes on (a partial last
  // line is skipped).
  TAU_ASSIGN_OR_RETURN(evidence::MetricHistory history,
                       evidence::LoadMetricHistory(layout::MetricsFile(dir)));
  TAU_ASSIGN_OR_RETURN(evidence::RecordInput in, AssembleRecord(r, history, stats, false));
  return evidence::BuildRecord(in);
}

Status Controller::EvidenceSources(const std::string& name, evidence::RecordInput* input,
                                   evidence::BundleSources* sources) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json record, EvidenceRecord(name));
  TAU_ASSIGN_OR_RETURN(*input, evidence::ParseRecord(record));
  const std::string dir = EvidenceDir(name);
  sources->metrics_path = layout::MetricsFile(dir);
  sources->gpu_samples_path = dir + "/gpu-samples.jsonl";
  for (const evidence::AttemptInfo& a : input->attempts)
    for (const evidence::LogInfo& l : a.logs)
      if (l.state == evidence::LogState::kKept)
        sources->logs.push_back(
            {a.number, l.rank,
             fmt::format("{}/logs/rank-{}.log", AttemptDir(name, a.number), l.rank)});
  return Status::Ok();
}

Status Controller::ApplyRetention(const evidence::RetentionPolicy& policy, int64_t now_ms) {
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
    auto saved = evidence::LoadRecord(EvidenceDir(r.name) + "/record.json");
    if (!saved.ok()) continue;  // its final record is not saved yet: prune nothing before it is
    auto parsed = evidence::ParseRecord(*saved);
    if (!parsed.ok()) continue;
    in.state = parsed->retention;
    inputs.push_back(std::move(in));
  }
  for (const evidence::PruneAction& action : evidence::PlanRetention(inputs, policy, now_ms)) {
    // The record first (durable: it says the files are pruned, with their hashes), then the files.
    MutexLock lock(&record_save_mu_);
    auto saved = evidence::LoadRecord(EvidenceDir(action.run) + "/record.json");
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
    TAU_RETURN_IF_ERROR(evidence::SaveRecord(EvidenceDir(action.run), evidence::BuildRecord(*in)));
    if (action.what == evidence::PruneWhat::kLogs) {
      for (const auto& a : in->attempts)
        (void)RemoveTree(AttemptDir(action.run, a.number) + "/logs");
    } else {
      ::unlink((EvidenceDir(action.run) + "/gpu-samples.jsonl").c_str());
    }
  }
  return Status::Ok();
}

}  // namespace tau::server
