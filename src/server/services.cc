// The service manager (services.h): each pass reads every service's replica runs back, probes the
// running ones, and converges the replicas on what the service's record wants.
#include "server/services.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/files.h"
#include "common/layout.h"
#include "common/ports.h"
#include "common/strings.h"
#include "evidence/evidence.h"
#include "kube/service.h"
#include "recovery/recovery.h"

namespace tau::server {
namespace {

constexpr const char* kActive = "Active";
constexpr const char* kDeleting = "Deleting";
constexpr size_t kMaxHistory = 200;
constexpr size_t kMaxServiceName = 40;  // replicas are "<name>-<8 hex>", DNS labels
constexpr size_t kKeptRevisions = 10;
// What a revision is: the members of a service's record that an update replaces.
constexpr const char* kRevisionKeys[] = {"revision", "spec_file",       "spec_yaml",   "set",
                                         "code_dir", "snapshot_digest", "config_hash", "serve",
                                         "model",    "groups",          "token_user"};
// A rollout stops once a new replica has ended this many attempts in a row before it was ready.
constexpr int kHaltAfterFailedStarts = 3;

// A replica of the service's current revision, as its record says (its spec, code, owner and
// model).
ReplicaRequest RequestOf(const store::ServiceRecord& record) {
  const nlohmann::json& doc = record.doc;
  ReplicaRequest request;
  request.service = record.name;
  request.revision = doc.value("revision", int64_t{1});
  request.spec_file = doc.value("spec_file", "");
  request.spec_yaml = doc.value("spec_yaml", "");
  for (const nlohmann::json& o : doc.value("set", nlohmann::json::array()))
    request.overrides.push_back({o.value("path", ""), o.value("value", "")});
  request.code_dir = doc.value("code_dir", "");
  request.snapshot_digest = doc.value("snapshot_digest", "");
  if (auto model = doc.find("model"); model != doc.end() && model->is_object())
    request.from_run = model->value("run", "");
  request.caller.user = record.owner;
  request.caller.groups = doc.value("groups", std::vector<std::string>{});
  request.token_user = doc.value("token_user", false);
  return request;
}

// The model a service serves, as its record keeps it: what could be resolved now (a run that
// has ended); a run still running is resolved by each replica when it ends (its lineage).
Result<nlohmann::json> ResolveModel(Controller* controller, store::Store* store,
                                    const std::string& from, const std::string& kind,
                                    const std::string& workspace) {
  auto run = store->GetRun(from);
  if (!run.ok())
    return NotFound(fmt::format("serve.from: no run is named '{}' (tau list shows runs)", from));
  if (run->workspace != workspace)
    return PermissionDenied(fmt::format(
        "serve.from: run {} is of workspace '{}'; a service of workspace '{}' serves only its own "
        "workspace's runs",
        from, run->workspace, workspace));
  nlohmann::json model = {{"run", from}, {"kind", kind}, {"path", ""}, {"sha256", ""}};
  if (!store::IsTerminal(run->state)) return model;  // its replicas wait for it
  const std::string dir = controller->StorageDir(*run, kind);
  if (kind == "output") {
    model["path"] = dir;
    return model;
  }
  const std::string newest = recovery::NewestCompleteCheckpoint(dir);
  if (newest.empty())
    return FailedPrecondition(fmt::format(
        "serve.from: run {} ended {} without a complete checkpoint (nothing complete in {}); "
        "serve its output directory with serve.model: output, or deploy from another run",
        from, store::RunStateName(run->state), dir));
  model["path"] = newest;
  if (StartsWith(newest, dir + "/")) {
    auto files = evidence::ScanArtifacts(dir, "checkpoint", {}, nullptr);
    if (files.ok())
      model["sha256"] = evidence::CheckpointDigest(*files, newest.substr(dir.size() + 1)).sha256;
  }
  return model;
}

// How a replica's newest ended attempt ended: its exit code or signal, and the last line of its
// log (already masked of the run's secrets, as every log is when written).
struct ExitOf {
  std::optional<int> code, signal;
  std::string last_line;
};
ExitOf LastExit(Controller* controller, store::Store* store, const std::string& run) {
  ExitOf out;
  auto attempts = store->ListAttempts(run);
  if (!attempts.ok()) return out;
  const store::AttemptRecord* last = nullptr;
  for (const store::AttemptRecord& a : *attempts)
    if (a.ended_ms && (!last || a.number > last->number)) last = &a;
  if (!last) return out;
  out.code = last->exit_code;
  out.signal = last->signal;
  const std::string path = controller->AttemptDir(run, last->number) + "/logs/rank-0.log";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  struct stat st;
  std::string tail;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const int64_t from = std::max<int64_t>(0, st.st_size - 4096);
    tail.resize(static_cast<size_t>(st.st_size - from));
    ssize_t n = ::pread(fd, tail.data(), tail.size(), from);
    tail.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r' || tail.back() == ' '))
    tail.pop_back();
  const size_t nl = tail.find_last_of('\n');
  out.last_line = nl == std::string::npos ? tail : tail.substr(nl + 1);
  if (out.last_line.size() > 300) out.last_line = out.last_line.substr(0, 300) + "...";
  return out;
}

// "exited with code 3: <line>", "was killed by signal 9", or how it stopped when neither is known.
std::string HowItEnded(const std::optional<int>& code, const std::optional<int>& signal,
                       const std::string& line, const std::string& reason) {
  std::string how = signal           ? fmt::format("killed by signal {}", *signal)
                    : code           ? fmt::format("exited with code {}", *code)
                    : reason.empty() ? std::string("stopped")
                                     : "stopped (" + reason + ")";
  if (!line.empty()) how += ": " + line;
  return how;
}

}  // namespace

ServiceManager::ServiceManager(Options options, Controller* controller, store::Store* store,
                               Metrics* metrics)
    : options_(options),
      controller_(controller),
      store_(store),
      metrics_(metrics),
      clock_(options.clock ? options.clock : SystemClock()) {}

ServiceManager::~ServiceManager() { Stop(); }

int64_t ServiceManager::Now() { return clock_->NowMillis(); }

Status ServiceManager::Start() {
  TAU_ASSIGN_OR_RETURN(std::vector<store::ServiceRecord> records, store_->ListServices());
  {
    MutexLock lock(&mu_);
    for (store::ServiceRecord& r : records) {
      auto s = std::make_unique<Service>();
      auto parsed = spec::ParseSpec(r.doc.value("spec_yaml", ""), r.doc.value("spec_file", ""));
      if (parsed.ok() && parsed.spec->serve) s->serve = *parsed.spec->serve;
      s->restarts = r.doc.value("restarts", int64_t{0});
      s->record = std::move(r);
      const std::string name = s->record.name;
      services_[name] = std::move(s);
    }
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void ServiceManager::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
  stop_probes_ = true;
  std::vector<ProbeThread> probes;
  {
    MutexLock lock(&mu_);
    probes.swap(probe_threads_);
  }
  for (ProbeThread& p : probes) p.thread.join();
}

void ServiceManager::Loop() {
  while (true) {
    try {
      ReconcileOnce();
    } catch (const std::exception& e) {
      // A service's record the manager cannot read is said, never the server's end.
      std::fprintf(stderr, "tau server: services: %s\n", e.what());
    }
    MutexLock lock(&mu_);
    if (stopping_) return;
    wake_.WaitFor(&mu_, std::chrono::milliseconds(options_.tick_ms),
                  [&]() TAU_REQUIRES(mu_) { return stopping_; });
    if (stopping_) return;
  }
}

void ServiceManager::ReconcileOnce() {
  MutexLock pass(&pass_mu_);
  std::vector<Service*> services;
  {
    MutexLock lock(&mu_);
    for (auto& [name, s] : services_) services.push_back(s.get());
  }
  // Only this pass removes services, so the pointers stay valid through it.
  for (Service* s : services) {
    std::string gone;
    if (options_.driver) {
      if (ReconcileOnCluster(*s)) {
        MutexLock lock(&mu_);
        gone = s->record.name;
      }
    } else {
      Refresh(*s);
      StartProbes(*s);
      MutexLock lock(&mu_);
      Converge(*s);
      if (s->record.state == kDeleting && s->replicas.empty()) gone = s->record.name;
    }
    if (!gone.empty()) {
      Status deleted = store_->DeleteService(gone);
      if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) continue;
      // The kept logs of its pods go with it (their followers end with the pods).
      if (options_.driver) (void)RemoveTree(layout::ServiceDir(options_.home, gone));
      MutexLock lock(&mu_);
      services_.erase(gone);
    }
  }
}

void ServiceManager::StartProbes(Service& s) {
  std::vector<DueProbe> due = DueProbes(s);
  if (due.empty()) return;
  MutexLock lock(&mu_);
  // Reaped here once done (a probe ends within its timeout).
  for (auto it = probe_threads_.begin(); it != probe_threads_.end();) {
    if (!*it->done) {
      ++it;
      continue;
    }
    it->thread.join();
    it = probe_threads_.erase(it);
  }
  // A thread each, not waited for: a replica that does not answer holds up no other replica's
  // probe, nor any service's pass, beyond its own timeout.
  for (DueProbe& d : due) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread thread([this, name = s.record.name, d = std::move(d), done] {
      const std::string result =
          ProbeReplica(d.port, d.probe.http_path, d.probe.timeout_ms, &stop_probes_);
      if (!stop_probes_) ProbeDone(name, d, result);
      *done = true;
    });
    probe_threads_.push_back({std::move(thread), std::move(done)});
  }
}

void ServiceManager::ProbeDone(const std::string& service, const DueProbe& d,
                               const std::string& failed) {
  MutexLock lock(&mu_);
  auto found = services_.find(service);
  if (found == services_.end()) return;
  Service& s = *found->second;
  auto it = s.replicas.find(d.run);
  if (it == s.replicas.end()) return;
  Replica& rep = it->second;
  (d.liveness ? rep.live_probing : rep.ready_probing) = false;
  // Of an attempt that has ended since: says nothing of the next one.
  if (rep.state != "Running" || rep.attempts != d.attempt || rep.draining) return;
  const int64_t now = Now();
  bool changed = false;
  if (d.liveness) {
    if (failed.empty()) {
      rep.live_failures = 0;
      return;
    }
    if (++rep.live_failures < d.probe.failure_threshold) return;
    const std::string why =
        fmt::format("liveness probe failed {} times in a row: {}", rep.live_failures, failed);
    controller_->RestartReplica(rep.run, why);
    rep.live_failures = 0;
    rep.ready = false;
    rep.probe = failed;
    AppendHistory(s, "LivenessFailed", fmt::format("replica {}: {}", rep.run, why));
    (void)Save(s);
    return;
  }
  if (failed.empty()) {
    rep.failures = 0;
    rep.probe.clear();
    if (++rep.successes >= d.probe.success_threshold && !rep.ready) {
      rep.ready = true;
      rep.ready_attempt = rep.attempts;
      rep.failed_starts = 0;
      if (!rep.was_ready && s.serve.liveness)
        rep.next_live_probe = now + s.serve.liveness->initial_delay_ms;
      rep.was_ready = true;
      s.add_backoff_ms = 0;
      AppendHistory(s, "ReplicaReady",
                    fmt::format("replica {} (revision {}, port {}) is ready", rep.run, rep.revision,
                                rep.port));
      changed = true;
    }
  } else {
    rep.successes = 0;
    rep.probe = failed;
    if (++rep.failures >= d.probe.failure_threshold && rep.ready) {
      rep.ready = false;
      AppendHistory(s, "ReplicaNotReady", fmt::format("replica {}: {}", rep.run, failed));
      changed = true;
    }
  }
  if (changed) (void)Save(s);
  wake_.SignalAll();  // a replica ready (or not) may let a rolling update go on
}

void ServiceManager::Refresh(Service& s) {
  store::RunFilter filter;
  {
    MutexLock lock(&mu_);  // an update rewrites the record
    filter.service = s.record.name;
  }
  filter.active_only = true;
  filter.summary = true;
  auto runs = store_->ListRuns(filter);
  if (!runs.ok()) return;
  std::map<std::string, store::RunRecord> live;
  for (store::RunRecord& r : *runs) live.emplace(r.name, std::move(r));
  const int64_t now = Now();
  std::vector<std::string> ended, failed;
  bool changed = false;
  {
    MutexLock lock(&mu_);
    for (auto& [name, r] : live) {
      Replica& rep = s.replicas[name];
      if (rep.run.empty()) {  // one the manager did not know (after a restart)
        rep.run = name;
        rep.revision = r.service.value("revision", int64_t{0});
        rep.port = r.service.value("port", 0);
        rep.attempts = r.attempts;
      }
      const std::string state = store::RunStateName(r.state);
      if (r.attempts > rep.attempts && rep.attempts > 0) {
        const int64_t more = r.attempts - rep.attempts;
        // Attempts that ended before they were ready make a crash loop (HaltRollout); how the
        // last one ended is read below, off the lock.
        if (rep.ready_attempt < rep.attempts) {
          rep.failed_starts += static_cast<int>(more);
          failed.push_back(name);
        } else {
          rep.failed_starts = 0;
        }
        s.restarts += more;
        if (metrics_)
          metrics_->Count("tau_serve_replica_restarts_total",
                          {{"service", s.record.name}, {"reason", r.reason}},
                          static_cast<double>(more));
        AppendHistory(s, "ReplicaRestarted",
                      fmt::format("replica {} restarted (attempt {}) after {}", name, r.attempts,
                                  r.reason.empty() ? "it stopped" : r.reason));
        changed = true;
      }
      if (state != rep.state || r.attempts != rep.attempts) {
        // A new attempt (or one that stopped running) is probed from the start again.
        rep.ready = rep.was_ready = false;
        rep.successes = rep.failures = rep.live_failures = 0;
        rep.started =
            r.state == store::RunState::kRunning ? std::optional<int64_t>(now) : std::nullopt;
        const int64_t first = rep.started ? *rep.started + s.serve.readiness.initial_delay_ms : 0;
        rep.next_ready_probe = first;
      }
      rep.state = state;
      rep.reason = r.reason;
      rep.attempts = r.attempts;
    }
    for (auto& [name, rep] : s.replicas)
      if (!live.count(name)) ended.push_back(name);
  }
  for (const std::string& name : failed) {
    ExitOf exit = LastExit(controller_, store_, name);
    MutexLock lock(&mu_);
    auto it = s.replicas.find(name);
    if (it == s.replicas.end()) continue;
    it->second.exit_code = exit.code;
    it->second.exit_signal = exit.signal;
    it->second.last_line = exit.last_line;
  }
  for (const std::string& name : ended) {
    auto r = store_->GetRun(name);
    if (r.ok() && !store::IsTerminal(r->state)) continue;  // not ended: read again next pass
    MutexLock lock(&mu_);
    auto it = s.replicas.find(name);
    if (it == s.replicas.end()) continue;
    const bool drained = it->second.draining;
    s.replicas.erase(it);
    if (!drained) {
      // It ended of its own accord (a clean exit, a failure that is not retried): replaced, after
      // a wait that doubles while replicas keep ending so.
      s.add_backoff_ms =
          std::clamp<int64_t>(s.add_backoff_ms * 2, s.serve.restart_backoff_initial_ms,
                              std::max<int64_t>(s.serve.restart_backoff_max_ms, 1));
      s.add_not_before = Now() + s.add_backoff_ms;
    }
    AppendHistory(s, drained ? "ReplicaRemoved" : "ReplicaEnded",
                  r.ok() ? fmt::format("replica {} ended {}{}", name, store::RunStateName(r->state),
                                       r->reason.empty() ? "" : " (" + r->reason + ")")
                         : fmt::format("replica {} is gone", name));
    changed = true;
  }
  // A model whose run had not ended at deploy is recorded once it has (what the replicas got).
  std::string from, kind, workspace;
  {
    MutexLock lock(&mu_);
    workspace = s.record.workspace;
    auto model = s.record.doc.find("model");
    if (model != s.record.doc.end() && model->is_object() && model->value("path", "").empty() &&
        !model->contains("error")) {
      from = model->value("run", "");
      kind = model->value("kind", "checkpoint");
    }
  }
  if (!from.empty()) {
    auto resolved = ResolveModel(controller_, store_, from, kind, workspace);
    if (resolved.ok() && !resolved->value("path", "").empty()) {
      MutexLock lock(&mu_);
      s.record.doc["model"] = *resolved;
      AppendHistory(
          s, "ModelResolved",
          fmt::format("run {} ended: its {} is {}", from, kind, resolved->value("path", "")));
      changed = true;
    } else if (!resolved.ok()) {
      // Said once: its replicas start without a model, and say so in their logs.
      MutexLock lock(&mu_);
      s.record.doc["model"]["error"] = resolved.status().message();
      AppendHistory(s, "ModelMissing", resolved.status().message());
      changed = true;
    }
  }
  if (changed) {
    MutexLock lock(&mu_);
    (void)Save(s);
  }
}

std::vector<ServiceManager::DueProbe> ServiceManager::DueProbes(Service& s) {
  std::vector<DueProbe> due;
  const int64_t now = Now();
  {
    MutexLock lock(&mu_);
    for (auto& [name, rep] : s.replicas) {
      if (rep.state != "Running" || !rep.started || rep.draining) continue;
      if (now >= rep.next_ready_probe && !rep.ready_probing) {
        due.push_back({name, rep.port, rep.attempts, false, s.serve.readiness});
        rep.next_ready_probe = now + s.serve.readiness.period_ms;
        rep.ready_probing = true;
      }
      // Liveness once the attempt has been ready: its start is the readiness probe's business (a
      // server still loading its model is not dead).
      if (s.serve.liveness && rep.was_ready && now >= rep.next_live_probe && !rep.live_probing) {
        due.push_back({name, rep.port, rep.attempts, true, *s.serve.liveness});
        rep.next_live_probe = now + s.serve.liveness->period_ms;
        rep.live_probing = true;
      }
    }
  }
  return due;
}

void ServiceManager::Converge(Service& s) {
  const int64_t now = Now();
  bool changed = false;
  // Draining replicas are stopped once they hold no request (or the drain time is up).
  for (auto& [name, rep] : s.replicas) {
    if (!rep.draining || rep.cancel_sent) continue;
    if (rep.in_flight > 0 && now - rep.drain_since < options_.drain_ms) continue;
    rep.cancel_sent = true;
    (void)controller_->Cancel(name);
  }
  if (s.record.state == kDeleting) {
    for (auto& [name, rep] : s.replicas)
      if (!rep.draining) StartDrain(s, rep, "the service is being deleted");
    return;
  }
  const int64_t wanted = s.record.doc.value("replicas", int64_t{0});
  const int64_t revision = s.record.doc.value("revision", int64_t{1});
  std::vector<Replica*> current, old;
  for (auto& [name, rep] : s.replicas) {
    if (rep.draining) continue;
    (rep.revision == revision ? current : old).push_back(&rep);
  }
  const nlohmann::json rollout = s.record.doc.value("rollout", nlohmann::json::object());
  if (rollout.value("state", "") == "Halted" && rollout.value("revision", int64_t{0}) == revision) {
    // Halted: the old replicas keep serving as they are until a rollback or another update.
    for (Replica* r : current) StartDrain(s, *r, "the rollout of its revision is halted");
    if (!current.empty()) (void)Save(s);
    return;
  }
  auto unready_first = [](const Replica* a, const Replica* b) {
    if (a->ready != b->ready) return !a->ready;
    return a->run > b->run;
  };
  const bool starting =
      std::any_of(current.begin(), current.end(), [](const Replica* r) { return !r->ready; });
  if (!old.empty()) {
    // Rolling: an old replica that serves nothing goes now; a serving one only once a new one is
    // ready in its place, so the service never has fewer ready replicas than it had.
    std::sort(old.begin(), old.end(), unready_first);
    for (Replica* r : old)
      if (!r->ready) {
        StartDrain(s, *r, fmt::format("revision {} replaces it (it was not ready)", revision));
        changed = true;
      }
    old.erase(std::remove_if(old.begin(), old.end(), [](const Replica* r) { return r->draining; }),
              old.end());
    // New replicas that keep ending before they are ready would never take over: the rollout
    // stops there, and the old replicas (ready ones stay in `old`) keep serving.
    if (!old.empty())
      for (Replica* r : current)
        if (r->failed_starts >= kHaltAfterFailedStarts) {
          HaltRollout(s, *r);
          (void)Save(s);
          return;
        }
    if (!old.empty() && !starting) {
      if (static_cast<int64_t>(current.size() + old.size()) > wanted ||
          static_cast<int64_t>(current.size()) >= wanted) {
        StartDrain(s, *old.front(),
                   fmt::format("revision {} has a ready replica in its place", revision));
      } else if (now >= s.add_not_before) {
        (void)AddReplica(s);
      }
      changed = true;
    }
  } else if (static_cast<int64_t>(current.size()) < wanted) {
    if (now >= s.add_not_before)
      for (int64_t i = static_cast<int64_t>(current.size()); i < wanted; ++i)
        if (!AddReplica(s).ok()) break;
    changed = true;
  } else if (static_cast<int64_t>(current.size()) > wanted) {
    std::sort(current.begin(), current.end(), unready_first);
    for (size_t i = 0; i < current.size() - static_cast<size_t>(wanted); ++i)
      StartDrain(s, *current[i], fmt::format("scaled to {}", wanted));
    changed = true;
  }
  if (changed) (void)Save(s);
}

Status ServiceManager::AddReplica(Service& s) {
  ReplicaRequest request = RequestOf(s.record);
  request.port = FreePort(s);
  SubmitError error;
  auto made = controller_->SubmitReplica(request, &error);
  if (!made.ok()) {
    // Retried after the backoff; said once per kind of failure in the history.
    s.add_backoff_ms = std::clamp<int64_t>(s.add_backoff_ms * 2, s.serve.restart_backoff_initial_ms,
                                           std::max<int64_t>(s.serve.restart_backoff_max_ms, 1));
    s.add_not_before = Now() + s.add_backoff_ms;
    if (s.last_add_error != made.status().message()) {
      s.last_add_error = made.status().message();
      AppendHistory(s, "ReplicaRefused", "a new replica was refused: " + s.last_add_error);
    }
    return made.status();
  }
  s.last_add_error.clear();
  Replica& rep = s.replicas[made->name];
  rep.run = made->name;
  rep.state = store::RunStateName(made->state);
  rep.revision = request.revision;
  rep.port = request.port;
  AppendHistory(
      s, "ReplicaAdded",
      fmt::format("replica {} (revision {}, port {})", made->name, request.revision, request.port));
  return Status::Ok();
}

void ServiceManager::HaltRollout(Service& s, const Replica& failing) {
  const int64_t revision = s.record.doc.value("revision", int64_t{1});
  const std::string how =
      HowItEnded(failing.exit_code, failing.exit_signal, failing.last_line, failing.reason);
  const std::string message = fmt::format(
      "rollout halted: revision {} replicas {} (replica {}, {} attempts in a row "
      "ended before they were ready)",
      revision, how, failing.run, failing.failed_starts);
  nlohmann::json rollout = {{"state", "Halted"},
                            {"revision", revision},
                            {"replica", failing.run},
                            {"failed_starts", failing.failed_starts},
                            {"last_line", failing.last_line},
                            {"message", message}};
  if (failing.exit_code) rollout["exit_code"] = *failing.exit_code;
  if (failing.exit_signal) rollout["signal"] = *failing.exit_signal;
  s.record.doc["rollout"] = std::move(rollout);
  AppendHistory(s, "RolloutHalted", message);
  for (auto& [name, rep] : s.replicas)
    if (rep.revision == revision && !rep.draining)
      StartDrain(s, rep, fmt::format("the rollout of revision {} is halted", revision));
}

void ServiceManager::StartDrain(Service& s, Replica& r, const std::string& why) {
  r.draining = true;
  r.ready = false;
  r.drain_since = Now();
  AppendHistory(s, "ReplicaDraining", fmt::format("replica {}: {}", r.run, why));
}

void ServiceManager::AppendHistory(Service& s, const std::string& type,
                                   const std::string& message) {
  nlohmann::json& history = s.record.doc["history"];
  if (!history.is_array()) history = nlohmann::json::array();
  history.push_back({{"time", FormatRfc3339(Now())}, {"type", type}, {"message", message}});
  if (history.size() > kMaxHistory) history.erase(history.begin());
}

Status ServiceManager::Save(Service& s) {
  s.record.updated_ms = Now();
  s.record.doc["restarts"] = s.restarts;
  return store_->PutService(s.record, false);
}

int ServiceManager::FreePort(const Service& s) {
  std::set<int> taken;
  for (const auto& [name, other] : services_)
    for (const auto& [run, rep] : other->replicas) taken.insert(rep.port);
  for (const auto& [run, rep] : s.replicas) taken.insert(rep.port);
  for (int i = 0; i < 16; ++i) {
    int port = FreeLoopbackPort();
    if (port != 0 && !taken.count(port)) return port;
  }
  return FreeLoopbackPort();
}

bool ServiceManager::ReconcileOnCluster(Service& s) {
  const int64_t now = Now();
  std::string state;
  std::vector<nlohmann::json> refs;
  bool apply = false;
  {
    MutexLock lock(&mu_);
    const nlohmann::json& doc = s.record.doc;
    const nlohmann::json cluster = doc.value("cluster", nlohmann::json::object());
    for (const nlohmann::json& ref : cluster.value("objects", nlohmann::json::array()))
      refs.push_back(ref);
    state = s.record.state;
    const nlohmann::json applied = cluster.value("applied", nlohmann::json::object());
    apply = now >= s.apply_not_before &&
            (applied.value("revision", int64_t{-1}) != doc.value("revision", int64_t{1}) ||
             applied.value("replicas", int64_t{-1}) != doc.value("replicas", int64_t{0}));
    if (state == kDeleting && now < s.apply_not_before) return false;
  }
  if (state == kDeleting) {
    Status deleted = options_.driver->DeleteService(refs);
    if (deleted.ok()) return true;
    ClusterFailed(s, "DeleteFailed", deleted);
    return false;
  }
  if (apply) {
    Status applied = ApplyOnCluster(s);
    if (!applied.ok()) ClusterFailed(s, "ApplyFailed", applied);
    s.next_observe = 0;  // what the apply changed is read back at once
  }
  if (now >= s.next_observe) {
    s.next_observe = now + options_.observe_ms;
    ObserveOnCluster(s);
  }
  return false;
}

Status ServiceManager::ApplyOnCluster(Service& s) {
  ReplicaRequest request;
  int64_t replicas = 0;
  std::string model_run;
  {
    MutexLock lock(&mu_);
    request = RequestOf(s.record);
    request.dry_run = true;
    replicas = s.record.doc.value("replicas", int64_t{0});
    model_run = request.from_run;
  }
  SubmitError error;
  TAU_ASSIGN_OR_RETURN(PreparedReplica prepared, controller_->PrepareReplica(request, &error));
  prepared.spec.serve->replicas = replicas;  // as the service is scaled
  ServiceLaunch launch;
  launch.service = request.service;
  launch.revision = request.revision;
  launch.spec = &prepared.spec;
  launch.resolved = &prepared.resolved;
  launch.platform = prepared.platform;
  launch.snapshot_dir = layout::SnapshotsDir(options_.home) + "/" + request.snapshot_digest;
  launch.secrets = prepared.secrets;
  launch.model_run = model_run;
  TAU_ASSIGN_OR_RETURN(std::vector<nlohmann::json> objects, options_.driver->RenderService(launch));
  if (objects.empty()) return Internal("the service rendered to no objects");
  nlohmann::json refs = nlohmann::json::array();
  for (const nlohmann::json& o : objects) {
    const nlohmann::json meta = o.value("metadata", nlohmann::json::object());
    refs.push_back({{"apiVersion", o.value("apiVersion", "")},
                    {"kind", o.value("kind", "")},
                    {"namespace", meta.value("namespace", "")},
                    {"name", meta.value("name", "")}});
  }
  // The workload is the last object (a Deployment's Service goes first).
  const nlohmann::json& workload = refs.back();
  const std::string ns = workload.value("namespace", "");
  const std::string endpoint =
      workload.value("kind", "") == "RayService"
          ? fmt::format("http://{}-serve-svc.{}.svc:{}", workload.value("name", ""), ns,
                        prepared.spec.serve->port)
          : fmt::format("http://{}.{}.svc:{}", refs.front().value("name", ""), ns,
                        kube::kServiceFrontPort);
  {
    // Recorded before they are applied: a delete after a crash finds them.
    MutexLock lock(&mu_);
    nlohmann::json& cluster = s.record.doc["cluster"];
    cluster["objects"] = refs;
    cluster["namespace"] = ns;
    cluster["kind"] = workload.value("kind", "");
    cluster["name"] = workload.value("name", "");
    cluster["endpoint"] = endpoint;
    cluster["max_log_bytes"] = prepared.resolved.max_log_bytes;
    TAU_RETURN_IF_ERROR(Save(s));
  }
  TAU_RETURN_IF_ERROR(options_.driver->ApplyService(launch, objects));
  MutexLock lock(&mu_);
  s.record.doc["cluster"]["applied"] = {{"revision", request.revision}, {"replicas", replicas}};
  s.apply_backoff_ms = 0;
  s.last_cluster_error.clear();
  AppendHistory(s, "Applied",
                fmt::format("revision {} with {} replica(s) applied: {} {}/{}", request.revision,
                            replicas, workload.value("kind", ""), ns, workload.value("name", "")));
  return Save(s);
}

void ServiceManager::ObserveOnCluster(Service& s) {
  std::string name, ns, kind, workload, workspace;
  int64_t max_log_bytes = 0;
  {
    MutexLock lock(&mu_);
    name = s.record.name;
    workspace = s.record.workspace;
    const nlohmann::json cluster = s.record.doc.value("cluster", nlohmann::json::object());
    ns = cluster.value("namespace", "");
    kind = cluster.value("kind", "");
    workload = cluster.value("name", "");
    max_log_bytes = cluster.value("max_log_bytes", int64_t{0});
  }
  if (kind.empty()) return;  // never applied
  auto observed = options_.driver->ObserveService(ns, workload, kind);
  if (!observed.ok()) {
    // Said once; the view keeps what was read last.
    MutexLock lock(&mu_);
    if (s.last_observe_error != observed.status().message()) {
      s.last_observe_error = observed.status().message();
      AppendHistory(s, "ObserveFailed", observed.status().message());
      (void)Save(s);
    }
    return;
  }
  std::vector<ServicePod> to_keep;
  {
    MutexLock lock(&mu_);
    bool changed = false;
    std::map<std::string, ServicePod> now;
    for (const ServicePod& p : observed->pods) {
      auto before = s.pods.find(p.name);
      if (s.observed_once && before == s.pods.end()) {
        AppendHistory(s, "ReplicaAdded",
                      fmt::format("pod {} (revision {}) {}", p.name, p.revision, p.phase));
        changed = true;
      }
      if (before != s.pods.end()) {
        if (p.restarts > before->second.restarts) {
          const int64_t more = p.restarts - before->second.restarts;
          s.restarts += more;
          if (metrics_)
            metrics_->Count("tau_serve_replica_restarts_total",
                            {{"service", name}, {"reason", "ContainerRestarted"}},
                            static_cast<double>(more));
          AppendHistory(s, "ReplicaRestarted",
                        fmt::format("pod {} restarted ({} restarts){}", p.name, p.restarts,
                                    p.reason.empty() ? "" : ": " + p.reason));
          changed = true;
        }
        if (p.ready != before->second.ready) {
          AppendHistory(s, p.ready ? "ReplicaReady" : "ReplicaNotReady",
                        p.ready ? fmt::format("pod {} (revision {}) is ready", p.name, p.revision)
                                : fmt::format("pod {}: {}", p.name,
                                              p.reason.empty() ? "not ready" : p.reason));
          changed = true;
        }
      }
      // A pod's log exists once its container has started.
      if (p.phase != "Pending" && !p.container.empty() && s.kept_logs.insert(p.name).second)
        to_keep.push_back(p);
      now.emplace(p.name, p);
    }
    for (const auto& [pod, p] : s.pods) {
      if (now.count(pod)) continue;
      AppendHistory(s, "ReplicaRemoved", fmt::format("pod {} is gone", pod));
      s.kept_logs.erase(pod);
      changed = true;
    }
    if (!observed->found && s.record.doc["cluster"].contains("applied")) {
      // Deleted behind tau's back (or never made): applied again on the next pass.
      s.record.doc["cluster"].erase("applied");
      AppendHistory(
          s, "WorkloadMissing",
          fmt::format("{} {}/{} is not on the cluster: it is applied again", kind, ns, workload));
      changed = true;
    }
    s.pods = std::move(now);
    s.observed = std::move(*observed);
    s.observed_once = true;
    s.last_observe_error.clear();
    if (changed) (void)Save(s);
  }
  if (to_keep.empty()) return;
  AttemptLogs logs;
  logs.max_bytes = max_log_bytes;
  // Masked of every secret of the workspace (the pods' env may name any of them).
  if (auto values = store_->SecretValues(workspace); values.ok())
    for (const auto& [key, value] : *values) logs.secrets.push_back(value);
  const std::string dir = layout::ServiceLogsDir(options_.home, name);
  if (Status made = MakeDirs(dir); !made.ok()) {
    std::fprintf(stderr, "tau server: service %s: %s\n", name.c_str(), made.ToString().c_str());
    return;
  }
  for (const ServicePod& p : to_keep)
    options_.driver->KeepServiceLog(ns, p.name, p.container, dir + "/" + p.name + ".log", logs);
}

void ServiceManager::ClusterFailed(Service& s, const std::string& type, const Status& status) {
  MutexLock lock(&mu_);
  s.apply_backoff_ms = std::clamp<int64_t>(s.apply_backoff_ms * 2, 1'000, 60'000);
  s.apply_not_before = Now() + s.apply_backoff_ms;
  if (s.last_cluster_error == status.message()) return;
  s.last_cluster_error = status.message();
  AppendHistory(s, type, status.message());
  (void)Save(s);
}

Result<store::ServiceRecord> ServiceManager::Prepare(DeployRequest& request, int64_t revision,
                                                     const store::ServiceRecord* previous,
                                                     spec::Serve* serve_out, SubmitError* error) {
  auto refuse = [error](Status s) {
    error->status = s;
    return s;
  };
  if (options_.driver == nullptr && !controller_->Caps().processes_here)
    return refuse(FailedPrecondition(
        fmt::format("the {} backend cannot run services", controller_->BackendName())));
  SubmitRequest& submit = request.submit;
  auto code = controller_->StoreCode(std::move(submit.code), std::move(submit.manifest),
                                     submit.caller.user, submit.readable_workspaces);
  if (!code.ok()) return refuse(code.status());
  ReplicaRequest check;
  check.spec_file = submit.spec_file;
  check.spec_yaml = submit.spec_yaml;
  check.overrides = submit.spec_overrides;
  check.code_dir = submit.code_dir;
  check.snapshot_digest = code->digest;
  check.caller = submit.caller;
  check.token_user = submit.token_user;
  check.revision = revision;
  check.dry_run = true;
  check.service = previous ? previous->name : request.name;
  // Checked as a replica's submission (named for the spec when the service has no name yet).
  auto checked = controller_->PrepareReplica(check, error);
  if (!checked.ok()) return checked.status();
  if (check.service.empty()) check.service = checked->spec.name;
  if (!IsDns1123Label(check.service, kMaxServiceName))
    return refuse(InvalidArgument(fmt::format(
        "service name '{}' must be a DNS-1123 label of at most {} characters (lowercase letters, "
        "digits and '-'): give --name",
        check.service, kMaxServiceName)));
  const std::string workspace = checked->record.workspace;
  if (previous && workspace != previous->workspace)
    return refuse(InvalidArgument(fmt::format(
        "policy.workspace: service '{}' is of workspace '{}'; an update cannot move it to '{}'",
        previous->name, previous->workspace, workspace)));
  const spec::Serve& serve = *checked->spec.serve;
  *serve_out = serve;
  const std::string from = !request.from_run.empty() ? request.from_run : serve.from_run;
  nlohmann::json model;
  if (!from.empty() && options_.driver) {
    // On a cluster the model is the run's directory on the workspace's storage, which the pods
    // mount (kube::RenderService); tau cannot look into it.
    auto run = store_->GetRun(from);
    if (!run.ok())
      return refuse(
          NotFound(fmt::format("serve.from: no run is named '{}' (tau list shows runs)", from)));
    if (run->workspace != workspace)
      return refuse(PermissionDenied(fmt::format(
          "serve.from: run {} is of workspace '{}'; a service of workspace '{}' serves only its "
          "own workspace's runs",
          from, run->workspace, workspace)));
    model = {
        {"run", from}, {"kind", serve.model}, {"path", ""}, {"sha256", ""}, {"on_cluster", true}};
  } else if (!from.empty()) {
    auto resolved = ResolveModel(controller_, store_, from, serve.model, workspace);
    if (!resolved.ok()) return refuse(resolved.status());
    model = std::move(*resolved);
  } else if (previous) {
    // An update that names no model keeps the one the service serves (from --from or from the
    // earlier spec's serve.from): a new spec file is not a request to serve nothing.
    model = previous->doc.value("model", nlohmann::json());
  }
  store::ServiceRecord r;
  r.name = check.service;
  r.workspace = workspace;
  r.owner = submit.caller.user;
  r.state = kActive;
  r.created_ms = previous ? previous->created_ms : Now();
  r.updated_ms = Now();
  nlohmann::json set = nlohmann::json::array();
  for (const spec::Override& o : submit.spec_overrides)
    set.push_back({{"path", o.path}, {"value", o.value}});
  r.doc = previous ? previous->doc : nlohmann::json::object();
  r.doc.update({{"spec_file", submit.spec_file},
                {"spec_yaml", submit.spec_yaml},
                {"set", set},
                {"code_dir", submit.code_dir},
                {"snapshot_digest", code->digest},
                {"config_hash", checked->record.config_hash},
                {"serve", spec::ServeJson(serve)},
                {"revision", revision},
                {"model", model},
                {"groups", submit.caller.groups},
                {"token_user", submit.token_user}});
  // Each revision is kept (the newest kKeptRevisions) so that `tau serve rollback` can make it
  // current again; a new revision ends any halted rollout.
  nlohmann::json kept = nlohmann::json::object();
  for (const char* key : kRevisionKeys) kept[key] = r.doc[key];
  nlohmann::json revisions = nlohmann::json::array();
  for (const nlohmann::json& k : r.doc.value("revisions", nlohmann::json::array()))
    if (k.is_object() && k.value("revision", int64_t{0}) != revision) revisions.push_back(k);
  revisions.push_back(std::move(kept));
  while (revisions.size() > kKeptRevisions) revisions.erase(revisions.begin());
  r.doc["revisions"] = std::move(revisions);
  r.doc["latest_revision"] = revision;
  if (previous) r.doc["previous_revision"] = previous->doc.value("revision", int64_t{1});
  r.doc.erase("rollout");
  // A deploy takes the spec's replicas; an update too when the spec changed them, else the
  // service keeps the count it was scaled to.
  int64_t before = -1;
  if (previous)
    if (auto was = previous->doc.find("serve"); was != previous->doc.end() && was->is_object())
      before = was->value("replicas", int64_t{-1});
  if (!previous || before != serve.replicas) r.doc["replicas"] = serve.replicas;
  return r;
}

Result<api::Service> ServiceManager::Deploy(DeployRequest request, SubmitError* error) {
  auto s = std::make_unique<Service>();
  TAU_ASSIGN_OR_RETURN(store::ServiceRecord record, Prepare(request, 1, nullptr, &s->serve, error));
  s->record = std::move(record);
  AppendHistory(*s, "Deployed",
                fmt::format("revision 1 from {} with {} replica(s){}",
                            s->record.doc["spec_file"].get<std::string>(),
                            s->record.doc.value("replicas", int64_t{0}),
                            s->record.doc["model"].is_object()
                                ? " serving run " + s->record.doc["model"].value("run", "")
                                : ""));
  if (Status put = store_->PutService(s->record, true); !put.ok()) {
    error->status = put;
    return put;
  }
  api::Service view;
  {
    MutexLock lock(&mu_);
    view = View(*s);
    services_[s->record.name] = std::move(s);
  }
  wake_.SignalAll();
  return view;
}

Result<api::Service> ServiceManager::Update(DeployRequest request, SubmitError* error) {
  store::ServiceRecord previous;
  {
    MutexLock lock(&mu_);
    auto it = services_.find(request.name);
    if (it == services_.end() || it->second->record.state != kActive) {
      error->status = NotFound(fmt::format("no service is named '{}'", request.name));
      return error->status;
    }
    previous = it->second->record;
  }
  // Numbers are never reused: a rollback makes an older revision current again.
  const int64_t revision = std::max(previous.doc.value("revision", int64_t{1}),
                                    previous.doc.value("latest_revision", int64_t{1})) +
                           1;
  spec::Serve serve;
  TAU_ASSIGN_OR_RETURN(store::ServiceRecord record,
                       Prepare(request, revision, &previous, &serve, error));
  api::Service view;
  {
    MutexLock lock(&mu_);
    auto it = services_.find(request.name);
    if (it == services_.end()) {
      error->status = NotFound(fmt::format("service '{}' was deleted meanwhile", request.name));
      return error->status;
    }
    Service& s = *it->second;
    s.record = std::move(record);
    s.serve = std::move(serve);
    s.add_not_before = 0;
    s.add_backoff_ms = 0;
    s.apply_not_before = 0;
    s.apply_backoff_ms = 0;
    const nlohmann::json& model = s.record.doc["model"];
    AppendHistory(s, "Updated",
                  fmt::format("revision {} from {}{}: replicas are replaced one at a time",
                              revision, s.record.doc.value("spec_file", ""),
                              model.is_object() ? " serving run " + model.value("run", "") : ""));
    if (Status saved = Save(s); !saved.ok()) {
      error->status = saved;
      return saved;
    }
    view = View(s);
  }
  wake_.SignalAll();
  return view;
}

Result<api::Service> ServiceManager::Rollback(const std::string& name, int64_t to) {
  if (to < 0) return InvalidArgument(fmt::format("--to: {} is not a revision", to));
  api::Service view;
  {
    MutexLock lock(&mu_);
    auto it = services_.find(name);
    if (it == services_.end() || it->second->record.state != kActive)
      return NotFound(fmt::format("no service is named '{}'", name));
    Service& s = *it->second;
    nlohmann::json& doc = s.record.doc;
    const int64_t current = doc.value("revision", int64_t{1});
    const int64_t target = to > 0 ? to : doc.value("previous_revision", int64_t{0});
    const nlohmann::json revisions = doc.value("revisions", nlohmann::json::array());
    std::string kept_list;
    const nlohmann::json* found = nullptr;
    for (const nlohmann::json& k : revisions) {
      if (!k.is_object()) continue;
      const int64_t n = k.value("revision", int64_t{0});
      kept_list += (kept_list.empty() ? "" : ", ") + std::to_string(n);
      if (n == target) found = &k;
    }
    if (target == 0)
      return FailedPrecondition(fmt::format(
          "service '{}' has had no revision before {}: nothing to roll back to", name, current));
    if (target == current)
      return FailedPrecondition(
          fmt::format("revision {} is already the current revision of service '{}'{}", target, name,
                      to > 0 ? "" : "; name another with --to"));
    if (!found)
      return NotFound(
          fmt::format("service '{}' keeps no revision {} (it keeps {}); name one of "
                      "those with --to",
                      name, target, kept_list.empty() ? "none" : kept_list));
    auto parsed = spec::ParseSpec(found->value("spec_yaml", ""), found->value("spec_file", ""));
    if (!parsed.ok() || !parsed.spec->serve)
      return FailedPrecondition(fmt::format(
          "revision {} of service '{}' no longer parses as a service spec; deploy a fixed spec "
          "with tau serve update",
          target, name));
    for (const auto& [key, value] : found->items()) doc[key] = value;
    doc["previous_revision"] = current;
    doc.erase("rollout");
    s.serve = *parsed.spec->serve;
    s.add_not_before = 0;
    s.add_backoff_ms = 0;
    s.apply_not_before = 0;
    s.apply_backoff_ms = 0;
    AppendHistory(s, "RolledBack",
                  fmt::format("revision {} -> revision {} (from {}): replicas are replaced one at "
                              "a time",
                              current, target, doc.value("spec_file", "")));
    TAU_RETURN_IF_ERROR(Save(s));
    view = View(s);
  }
  wake_.SignalAll();
  return view;
}

Result<api::Service> ServiceManager::Scale(const std::string& name, int64_t replicas) {
  if (replicas < 0 || replicas > 64)
    return InvalidArgument(fmt::format("replicas: {} is not 0 to 64", replicas));
  api::Service view;
  {
    MutexLock lock(&mu_);
    auto it = services_.find(name);
    if (it == services_.end() || it->second->record.state != kActive)
      return NotFound(fmt::format("no service is named '{}'", name));
    Service& s = *it->second;
    const int64_t before = s.record.doc.value("replicas", int64_t{0});
    s.record.doc["replicas"] = replicas;
    s.add_not_before = 0;
    s.apply_not_before = 0;
    AppendHistory(s, "Scaled", fmt::format("{} -> {} replicas", before, replicas));
    TAU_RETURN_IF_ERROR(Save(s));
    view = View(s);
  }
  wake_.SignalAll();
  return view;
}

Result<api::Service> ServiceManager::Delete(const std::string& name) {
  api::Service view;
  {
    MutexLock lock(&mu_);
    auto it = services_.find(name);
    if (it == services_.end()) return NotFound(fmt::format("no service is named '{}'", name));
    Service& s = *it->second;
    if (s.record.state != kDeleting) {
      s.record.state = kDeleting;
      s.apply_not_before = 0;
      AppendHistory(s, "Deleting",
                    options_.driver ? "its objects are deleted from the cluster"
                                    : "its replicas are drained and stopped");
      TAU_RETURN_IF_ERROR(Save(s));
    }
    view = View(s);
  }
  wake_.SignalAll();
  return view;
}

Result<api::Service> ServiceManager::Get(const std::string& name) {
  MutexLock lock(&mu_);
  auto it = services_.find(name);
  if (it == services_.end()) return NotFound(fmt::format("no service is named '{}'", name));
  return View(*it->second);
}

std::vector<api::Service> ServiceManager::List(
    const std::optional<std::vector<std::string>>& workspaces) {
  MutexLock lock(&mu_);
  std::vector<api::Service> out;
  for (const auto& [name, s] : services_) {
    if (workspaces &&
        std::find(workspaces->begin(), workspaces->end(), s->record.workspace) == workspaces->end())
      continue;
    out.push_back(View(*s));
  }
  return out;
}

api::Service ServiceManager::View(const Service& s) const {
  const nlohmann::json& doc = s.record.doc;
  api::Service v;
  v.name = s.record.name;
  v.workspace = s.record.workspace;
  v.owner = s.record.owner;
  v.state = s.record.state;
  v.replicas = doc.value("replicas", int64_t{0});
  v.revision = doc.value("revision", int64_t{1});
  v.endpoint = "/serve/" + s.record.name + "/";
  v.spec_file = doc.value("spec_file", "");
  v.config_hash = doc.value("config_hash", "");
  v.snapshot_digest = doc.value("snapshot_digest", "");
  v.model = doc.value("model", nlohmann::json());
  v.serve = doc.value("serve", nlohmann::json::object());
  for (const auto& [name, rep] : s.replicas) {
    api::ServiceReplica r;
    r.run = name;
    r.state = rep.state;
    r.revision = rep.revision;
    r.port = rep.port;
    r.ready = rep.ready;
    r.draining = rep.draining;
    r.restarts = std::max(0, rep.attempts - 1);
    r.probe = rep.probe;
    r.reason = rep.reason;
    if (rep.failed_starts > 0 && !rep.ready) {
      // Why it is not ready is how its attempts end, not the last probe's refused connection.
      r.extra["failed_starts"] = rep.failed_starts;
      if (rep.exit_code) r.extra["exit_code"] = *rep.exit_code;
      if (rep.exit_signal) r.extra["signal"] = *rep.exit_signal;
      r.extra["last_line"] = rep.last_line;
      r.extra["exit"] = HowItEnded(rep.exit_code, rep.exit_signal, rep.last_line, rep.reason);
    }
    if (rep.ready) ++v.ready;
    v.replica_list.push_back(std::move(r));
  }
  nlohmann::json kept = nlohmann::json::array();
  for (const nlohmann::json& k : doc.value("revisions", nlohmann::json::array()))
    if (k.is_object())
      kept.push_back({{"revision", k.value("revision", int64_t{0})},
                      {"spec_file", k.value("spec_file", "")},
                      {"config_hash", k.value("config_hash", "")},
                      {"model_run", k.value("model", nlohmann::json::object()).is_object()
                                        ? k["model"].value("run", "")
                                        : ""}});
  v.extra["revisions"] = std::move(kept);
  if (doc.contains("previous_revision")) v.extra["previous_revision"] = doc["previous_revision"];
  const int64_t revision = doc.value("revision", int64_t{1});
  const nlohmann::json rollout = doc.value("rollout", nlohmann::json::object());
  if (s.record.state == kActive && rollout.value("state", "") == "Halted" &&
      rollout.value("revision", int64_t{0}) == revision) {
    v.state = "RolloutHalted";
    v.extra["rollout"] = rollout;
  } else if (s.record.state == kActive && !options_.driver) {
    // Without older replicas to fall back on, a crash loop is said, never hidden behind Active.
    for (const auto& [name, rep] : s.replicas) {
      if (rep.revision != revision || rep.draining || rep.ready ||
          rep.failed_starts < kHaltAfterFailedStarts)
        continue;
      v.state = v.ready > 0 ? "Degraded" : "Failing";
      v.extra["failing"] = {
          {"replica", name},
          {"failed_starts", rep.failed_starts},
          {"message",
           fmt::format("revision {} replicas {} ({} attempts in a row ended before they were "
                       "ready)",
                       revision,
                       HowItEnded(rep.exit_code, rep.exit_signal, rep.last_line, rep.reason),
                       rep.failed_starts)}};
      break;
    }
  }
  v.restarts = s.restarts;
  v.requests = {{"total", s.requests}, {"failed", s.failed}, {"retried", s.retried}};
  if (options_.driver) ClusterView(s, &v);
  v.history = doc.value("history", nlohmann::json::array());
  v.created = FormatRfc3339(s.record.created_ms);
  v.updated = FormatRfc3339(s.record.updated_ms);
  return v;
}

void ServiceManager::ClusterView(const Service& s, api::Service* v) const {
  const nlohmann::json cluster = s.record.doc.value("cluster", nlohmann::json::object());
  v->endpoint = cluster.value("endpoint", "");
  const int port = s.serve.port;
  for (const auto& [name, p] : s.pods) {
    api::ServiceReplica r;
    r.run = name;  // a pod: `tau serve logs --replica POD`
    r.state = p.deleting ? "Terminating" : p.phase;
    r.revision = p.revision;
    r.port = port;
    r.ready = p.ready;
    r.draining = p.deleting;
    r.restarts = static_cast<int>(p.restarts);
    r.reason = p.reason;
    if (p.ready) ++v->ready;
    v->replica_list.push_back(std::move(r));
  }
  nlohmann::json out = {{"namespace", cluster.value("namespace", "")},
                        {"kind", cluster.value("kind", "")},
                        {"name", cluster.value("name", "")},
                        {"objects", cluster.value("objects", nlohmann::json::array())},
                        {"applied", cluster.value("applied", nlohmann::json())},
                        {"found", s.observed.found},
                        {"desired", s.observed.desired},
                        {"ready", s.observed.ready},
                        {"updated", s.observed.updated}};
  if (!s.observed.message.empty()) out["message"] = s.observed.message;
  if (!s.last_cluster_error.empty()) out["error"] = s.last_cluster_error;
  if (!s.last_observe_error.empty()) out["observe_error"] = s.last_observe_error;
  v->extra["cluster"] = std::move(out);
}

Result<ServiceManager::LogPart> ServiceManager::ReplicaLog(const std::string& name,
                                                           const std::string& pod, int64_t offset,
                                                           int64_t limit) {
  {
    MutexLock lock(&mu_);
    auto it = services_.find(name);
    if (it == services_.end()) return NotFound(fmt::format("no service is named '{}'", name));
    if (!options_.driver)
      return FailedPrecondition(fmt::format(
          "the replicas of service '{}' are runs: `tau logs RUN` (tau serve status lists them)",
          name));
    if (!it->second->kept_logs.count(pod) && !it->second->pods.count(pod))
      return NotFound(fmt::format("{} is not a replica of service {} now", pod, name));
  }
  LogPart out;
  const std::string path = layout::ServiceLogsDir(options_.home, name) + "/" + pod + ".log";
  if (!PathExists(path)) return out;  // its container has not written yet
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Internal(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) == 0) out.size = st.st_size;
  offset = std::clamp<int64_t>(offset, 0, out.size);
  out.data.resize(static_cast<size_t>(std::clamp<int64_t>(out.size - offset, 0, limit)));
  ssize_t n = out.data.empty() ? 0 : ::pread(fd, out.data.data(), out.data.size(), offset);
  ::close(fd);
  out.data.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

std::optional<ServiceManager::Pick> ServiceManager::Acquire(const std::string& service,
                                                            const std::set<std::string>& tried) {
  MutexLock lock(&mu_);
  auto it = services_.find(service);
  if (it == services_.end()) return std::nullopt;
  Service& s = *it->second;
  Pick pick;
  pick.workspace = s.record.workspace;
  if (options_.driver) {
    pick.cluster_endpoint =
        s.record.doc.value("cluster", nlohmann::json::object()).value("endpoint", "its Service");
    return pick;
  }
  std::vector<Replica*> ready;
  for (auto& [name, rep] : s.replicas)
    if (rep.ready && !rep.draining && rep.state == "Running" && !tried.count(name))
      ready.push_back(&rep);
  if (ready.empty()) return pick;
  Replica* chosen = ready[s.next++ % ready.size()];
  ++chosen->in_flight;
  pick.lease = Lease{service, chosen->run, chosen->port};
  return pick;
}

void ServiceManager::Done(const Lease& lease, bool reached) {
  MutexLock lock(&mu_);
  auto it = services_.find(lease.service);
  if (it == services_.end()) return;
  auto rep = it->second->replicas.find(lease.replica);
  if (rep == it->second->replicas.end()) return;
  --rep->second.in_flight;
  if (!reached && rep->second.ready) {
    // Out of rotation until its readiness probe passes again.
    rep->second.ready = false;
    rep->second.successes = 0;
    rep->second.probe = "the endpoint could not reach it";
  }
}

void ServiceManager::CountRequest(const std::string& service, int status, bool retried,
                                  double seconds) {
  {
    MutexLock lock(&mu_);
    auto it = services_.find(service);
    if (it != services_.end()) {
      ++it->second->requests;
      if (status == 0 || status >= 500) ++it->second->failed;
      if (retried) ++it->second->retried;
    }
  }
  if (!metrics_) return;
  const std::string code = status == 0 ? "error" : fmt::format("{}xx", status / 100);
  metrics_->Count("tau_serve_requests_total", {{"service", service}, {"code", code}});
  if (retried) metrics_->Count("tau_serve_retries_total", {{"service", service}});
  metrics_->Observe("tau_serve_request_duration_seconds", {{"service", service}}, seconds);
}

}  // namespace tau::server
