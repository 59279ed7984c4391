// The controller's quota book: the platform policy in force, the Kueue-model admission engine
// (quota, priorities, preemption, fair sharing) kept in step with the runs, requeues, and why a
// queued run waits. Where attempts are placed is the backend's (local_backend.cc places them on
// this machine's GPUs, CPUs and memory).
#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "controller/controller.h"
#include "recovery/failure_class.h"
#include "recovery/recovery.h"

namespace tau::server {

using store::AttemptRecord;
using store::Batch;
using store::RunRecord;
using store::RunState;

namespace {

std::string RunsAhead(int position) {
  if (position <= 0) return "first in line";
  return fmt::format("{} {} ahead", position, position == 1 ? "run" : "runs");
}

// What a platform's pools mean for the accounts already given (docs/platform.md, run_users): one
// no longer listed stays its user's, and one listed by another workspace is never given there.
std::vector<spec::Diagnostic> RunUserWarnings(const policy::Platform& platform,
                                              const std::vector<store::RunUserRecord>& given,
                                              const std::string& file) {
  std::vector<spec::Diagnostic> out;
  auto warn = [&](std::string message) {
    out.push_back({file, 0, 0, std::move(message), /*warning=*/true});
  };
  for (const store::RunUserRecord& r : given) {
    for (const policy::Workspace& w : platform.workspaces) {
      const bool listed =
          std::find(w.run_users.begin(), w.run_users.end(), r.system_user) != w.run_users.end();
      if (listed && w.name != r.workspace)
        warn(fmt::format(
            "workspaces[{}].run_users: '{}' was given to token user '{}' of "
            "workspace '{}' on {}, and is never given to another user: it serves "
            "nobody in '{}'",
            w.name, r.system_user, r.user, r.workspace, FormatRfc3339(r.assigned_ms), w.name));
      if (w.name == r.workspace && !listed)
        warn(fmt::format(
            "workspaces[{}].run_users: '{}' is no longer listed, but stays token "
            "user '{}''s (given {}): their runs go on as '{}' while the account "
            "exists; delete the account to retire it (they then get another of the "
            "pool)",
            w.name, r.system_user, r.user, FormatRfc3339(r.assigned_ms), r.system_user));
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Platform.

Status Controller::LoadPlatformFile() {
  std::shared_ptr<const policy::Platform> platform;
  std::string source = "default";
  int64_t applied_ms = Now();
  std::string text;
  if (!options_.platform_file.empty() && PathExists(options_.platform_file)) {
    TAU_ASSIGN_OR_RETURN(text, ReadFile(options_.platform_file));
    policy::PlatformOutcome parsed = policy::ParsePlatform(text, options_.platform_file);
    if (!parsed.ok())
      return InvalidArgument(fmt::format(
          "the platform file is not valid (fix it, or remove it to use the default):\n{}",
          parsed.ErrorText()));
    platform = std::make_shared<const policy::Platform>(std::move(*parsed.platform));
    source = options_.platform_file;
    // Which file it was applied from, and when (written by ApplyPlatform).
    if (auto meta = ReadFile(options_.platform_file + ".applied"); meta.ok()) {
      nlohmann::json j = nlohmann::json::parse(*meta, nullptr, false);
      if (j.is_object()) {
        source = j.value("source", source);
        applied_ms = j.value("applied_ms", applied_ms);
      }
    }
  } else {
    const auto& size = options_.default_platform_size;
    const int gpus = size ? size->gpus : static_cast<int>(gpus_.devices.size());
    const int64_t cpu_milli = size ? size->cpu_milli : cpu_capacity_milli_;
    const int64_t memory_bytes = size ? size->memory_bytes : memory_capacity_bytes_;
    text = policy::DefaultPlatformText(gpus, cpu_milli, memory_bytes);
    platform = std::make_shared<const policy::Platform>(
        policy::DefaultPlatform(gpus, cpu_milli, memory_bytes));
  }
  MutexLock lock(&mu_);
  platform_ = {platform, source, applied_ms, std::move(text)};
  loop_platform_ = platform;
  return Status::Ok();
}

Controller::PlatformView Controller::CurrentPlatform() {
  MutexLock lock(&mu_);
  return platform_;
}

Status Controller::ApplyPlatform(const std::string& yaml, const std::string& filename,
                                 std::vector<spec::Diagnostic>* diagnostics) {
  policy::PlatformOutcome parsed = policy::ParsePlatform(yaml, filename);
  if (!parsed.ok()) {
    *diagnostics = parsed.diagnostics;
    return InvalidArgument(parsed.ErrorText());
  }
  auto engine = admission::Engine::Create(policy::ToAdmissionConfig(*parsed.platform));
  if (!engine.ok()) return InvalidArgument(filename + ": " + engine.status().message());
  *diagnostics = parsed.diagnostics;  // its warnings
  TAU_ASSIGN_OR_RETURN(auto given, store_->ListRunUsers());
  for (spec::Diagnostic& d : RunUserWarnings(*parsed.platform, given, filename))
    diagnostics->push_back(std::move(d));
  if (options_.platform_file.empty())
    return FailedPrecondition("this server has no platform file configured");
  // The backend's side first (Kueue's queues): when it refuses, tau keeps the platform it had.
  if (Status s = backend_->ApplyPlatform(*parsed.platform); !s.ok())
    return Status(s.code(),
                  "applying the platform to the cluster failed (tau keeps the one it "
                  "had): " +
                      s.message());
  // Durable before it is used: a restarted server must decide with the same policy.
  int64_t now = Now();
  TAU_RETURN_IF_ERROR(WriteFileAtomic(options_.platform_file, yaml, 0600));
  nlohmann::json meta = {{"source", filename}, {"applied_ms", now}};
  TAU_RETURN_IF_ERROR(
      WriteFileAtomic(options_.platform_file + ".applied", JsonText(meta) + "\n", 0600));
  auto platform = std::make_shared<const policy::Platform>(std::move(*parsed.platform));
  MutexLock lock(&mu_);
  platform_ = {platform, filename, now, yaml};
  int64_t generation = ++platform_generation_;
  ++writes_posted_;
  inbox_.Push(PlatformChanged{platform, generation});
  // The file is durable, so the policy holds from here on; waiting only makes `tau queues` right
  // after `tau platform apply` show the new queues.
  platform_cv_.WaitFor(&mu_, std::chrono::seconds(10), [&]() TAU_REQUIRES(mu_) {
    return stopping_ || platform_in_use_ >= generation;
  });
  return Status::Ok();
}

nlohmann::json Controller::Queues(const QueuesQuery& query) {
  MutexLock lock(&mu_);
  FreshViews();
  nlohmann::json queues = nlohmann::json::array();
  for (const QueueView& q : queues_info_.queues) {
    if (!query.queue.empty() && q.fields.value("name", "") != query.queue) continue;
    nlohmann::json& j = queues.emplace_back(q.fields);
    if (query.summary) continue;
    j["admitted_runs"] = q.admitted_runs;
    nlohmann::json& waiting = j["pending_runs"] = nlohmann::json::array();
    for (size_t i = query.offset; i < q.pending_runs.size() && i - query.offset < query.limit;
         ++i) {
      const QueueView::Waiting& w = q.pending_runs[i];
      auto known = pending_info_.find(w.name);
      nlohmann::json& e = waiting.emplace_back(
          w.pending.is_object()                                       ? w.pending
          : known != pending_info_.end() && known->second.is_object() ? known->second
                                                                      : nlohmann::json::object());
      e["name"] = w.name;
      e["workspace"] = w.workspace;
      e["priority"] = w.priority;
    }
  }
  return {{"queues", std::move(queues)},
          {"cohorts", queues_info_.cohorts},
          {"unqueued_runs", queues_info_.unqueued_runs}};
}

// ---------------------------------------------------------------------------------------------
// The engine.

void Controller::RebuildEngine() {
  // The LocalQueues' decayed usage outlives the engine (a queue that no longer uses admission fair
  // sharing drops its own).
  std::vector<admission::LocalQueueUsage> carried;
  if (quota_.engine) carried = quota_.engine->LocalQueues();
  auto engine = admission::Engine::Create(policy::ToAdmissionConfig(*loop_platform_));
  if (!engine.ok()) {
    // ApplyPlatform and LoadPlatformFile checked this; an engine that cannot be built would admit
    // nothing, so say so loudly rather than run without quota.
    std::fprintf(stderr, "tau server: fatal: the platform's queues are invalid: %s\n",
                 engine.status().ToString().c_str());
    std::_Exit(70);
  }
  quota_.engine = std::move(*engine);
  for (const admission::LocalQueueUsage& u : carried)
    (void)quota_.engine->SetLocalQueueUsage(u.name, u.queue, u.consumed, u.last_update_ms);
  quota_.ClearEngine();
  quota_.outside.clear();
  quota_.pending.clear();
  sync_all_ = true;
  SyncEngine();
}

// Makes the engine's workloads match the runs: runs holding quota (admitted, running, or reserved
// and waiting for the machine) are added with their recorded flavors first, so the quota they hold
// is accounted before anything new is admitted; queued runs past their backoff are added pending.
// Only runs that may need it are looked at (a deep queue's other runs are as the engine has them):
// those whose records changed since (every change is committed, so the batches name them), those
// whose backoff has ended, and those that waited for their metrics to be read; after the engine is
// rebuilt, every run.
void Controller::SyncEngine() {
  const int64_t now = Now();
  std::vector<ActiveRun*> runs;
  if (sync_all_) {
    for (auto& [name, run] : active_) runs.push_back(&run);
    sync_all_ = false;
  } else {
    while (!sync_backoff_.empty() && sync_backoff_.begin()->first <= now) {
      sync_changed_.insert(sync_backoff_.begin()->second);
      sync_backoff_.erase(sync_backoff_.begin());
    }
    sync_changed_.merge(sync_draining_);
    for (const std::string& name : sync_changed_)
      if (auto it = active_.find(name); it != active_.end()) runs.push_back(&it->second);
  }
  sync_changed_.clear();
  sync_draining_.clear();
  for (bool holders : {true, false})
    for (ActiveRun* run : runs) SyncRun(*run, holders, now, /*dry=*/false);
  if (!options_.loop_thread) {
    // Driven by hand (the tests): a sync of every run would change nothing, or a change reached
    // no batch and a run would wait forever.
    for (bool holders : {true, false})
      for (auto& [name, run] : active_)
        if (SyncRun(run, holders, now, /*dry=*/true)) {
          std::fprintf(stderr, "tau server: fatal: run %s changed without a record of it\n",
                       name.c_str());
          std::abort();
        }
  }
}

bool Controller::SyncRun(ActiveRun& run, bool holders, int64_t now, bool dry) {
  const RunRecord& r = run.record;
  const std::string& name = r.name;
  if (store::IsTerminal(r.state)) return false;
  const bool holds = r.flavors.is_object() && !r.flavors.empty();
  const bool queued = r.state == RunState::kQueued && !holds && !r.cancel_requested;
  const bool backing_off = queued && r.not_before_ms && *r.not_before_ms > now;
  // A workflow's stage stays out of its queue until the stages it waits for have ended, and a run
  // of an array with max_parallel until one of its array's leaves play.
  const bool waits = queued && !backing_off && !HeldBack(run);
  auto it = quota_.in_engine().find(name);
  if (it != quota_.in_engine().end()) {
    // Gone from the queue, or (Kubernetes: Kueue admitted it) holding quota now while the
    // engine has it pending: taken out, and a holder is added again below. (One waiting in
    // the engine has had no attempt since it was added, so it has not begun draining.)
    bool stale = holders && ((!holds && !waits) || (holds && !it->second));
    if (!stale) return false;
    if (dry) return true;
    (void)quota_.engine->RemoveWorkload(name);
    quota_.EraseFromEngine(name);
    if (!holds) return true;
  }
  if (holds != holders || (!holds && !waits) || quota_.outside.count(name)) {
    if (backing_off && !dry) sync_backoff_.insert({*r.not_before_ms, name});
    return false;
  }
  // A run whose ended attempt's metric points are still being read waits: its next attempt
  // would append to the same file. (Asked last: it takes the evidence worker's lock.)
  if (!holds && evidence_->Draining(name)) {
    if (!dry) sync_draining_.insert(name);
    return false;
  }
  if (dry) return true;
  admission::Workload w = run.workload;
  if (holds) {
    w.admission = AssignmentFromJson(r.flavors);
    w.admitted_ms = r.admitted_ms.value_or(r.updated_ms);
  }
  Status s = quota_.engine->AddWorkload(w);
  if (s.ok()) {
    quota_.SetInEngine(name, holds);
  } else {
    quota_.outside[name] = s.code() == StatusCode::kNotFound
                               ? fmt::format("the platform has no queue '{}' any more", w.queue)
                               : s.message();
  }
  return true;
}

void Controller::Requeue(ActiveRun& run, const std::string& message, Batch* batch) {
  RunRecord& r = run.record;
  bool had_attempt = r.state == RunState::kRunning;
  r.preemptions += 1;
  ReleaseResources(run, batch);
  r.reason = recovery::FailureClassName(recovery::FailureClass::kPreempted);
  r.message = message;
  r.not_before_ms.reset();
  run.queued_since_ms = Now();
  std::string next = "; back in the queue";
  if (had_attempt) next += backend_->RequeueNote(run);
  Transition(run, RunState::kQueued, "Requeued", message + next, batch,
             {{"preemptions", r.preemptions}});
  batch->runs.push_back(r);
}

// ---------------------------------------------------------------------------------------------
// Why runs wait, and the queues.

nlohmann::json Controller::PendingJson(
    const ActiveRun& run, int64_t now,
    std::map<std::string, std::vector<admission::ResourceUsage>>* usage_of) {
  const RunRecord& r = run.record;
  auto out = [&](int position, const std::string& code, const std::string& reason,
                 const std::string& detail) {
    return PendingEntry(position, r.queue, code, reason, detail);
  };
  if (auto o = quota_.outside.find(r.name); o != quota_.outside.end())
    return out(0, "QueueUnavailable",
               fmt::format("{}: cancel the run, or apply a platform whose queue '{}' can take it",
                           o->second, r.queue),
               "");
  for (const auto& pass : passes_)
    if (nlohmann::json held = pass->Pending(run); !held.is_null()) return held;
  if (!run.budget_hold.empty())
    return out(0, "BudgetSpent", run.budget_hold + "; it enters its queue once the budget has room",
               "");
  if (nlohmann::json known = backend_->PendingReason(run, now); !known.is_null()) return known;
  if (r.not_before_ms && *r.not_before_ms > now)
    return out(0, "BackingOff",
               fmt::format("retrying after {} (attempt {}): waits {} more before it queues again",
                           r.reason, r.attempts, FormatDuration(*r.not_before_ms - now)),
               "");
  auto p = quota_.pending.find(r.name);
  if (p == quota_.pending.end()) return out(0, "Pending", "waiting for the scheduler", "");
  const admission::PendingInfo& info = p->second;
  int position = info.position + 1;
  std::string reason;
  if (info.reason == admission::kReasonWaitingForQuota) {
    // Which requested resources the queue's flavors cannot give now.
    std::vector<std::string> short_of;
    auto cached = usage_of->find(r.queue);
    if (cached == usage_of->end()) {
      auto read = quota_.engine->Usage(r.queue);
      cached = usage_of
                   ->emplace(r.queue,
                             read.ok() ? std::move(*read) : std::vector<admission::ResourceUsage>())
                   .first;
    }
    const std::vector<admission::ResourceUsage>& usage = cached->second;
    const admission::PodSet& ps = run.workload.pod_sets.front();
    // Every pod set's (the workers' and a sized head's) together.
    for (const auto& [resource, total] : run.resolved.total_requests) {
      if (total.IsZero()) continue;
      std::vector<std::string> offers;
      bool fits_somewhere = false;
      for (const admission::ResourceUsage& u : usage) {
        if (u.resource != resource) continue;
        if (!ps.allowed_flavors.empty() &&
            std::find(ps.allowed_flavors.begin(), ps.allowed_flavors.end(), u.flavor) ==
                ps.allowed_flavors.end())
          continue;
        Quantity free = u.usage < u.nominal ? u.nominal - u.usage : Quantity();
        fits_somewhere = fits_somewhere || total <= u.available;
        if (u.available == free && u.usage <= u.nominal) {
          offers.push_back(fmt::format("{} of {} free on flavor {}", free.ToString(),
                                       u.nominal.ToString(), u.flavor));
        } else {
          // Borrowing (or able to): the limit is the cohort's, not the queue's own quota.
          offers.push_back(fmt::format(
              "{} available on flavor {} (uses {} of its nominal {}; the rest of what it can take "
              "is borrowed from its cohort, within the other queues' lending limits)",
              u.available.ToString(), u.flavor, u.usage.ToString(), u.nominal.ToString()));
        }
      }
      if (!fits_somewhere && !offers.empty())
        short_of.push_back(fmt::format("needs {} {}; queue {} has {}", total.ToString(), resource,
                                       r.queue, Join(offers, ", ")));
    }
    reason = short_of.empty()
                 ? fmt::format("waiting for quota in queue {} ({})", r.queue, info.message)
                 : Join(short_of, "; ");
    reason += "; " + RunsAhead(info.position);
  } else if (info.reason == admission::kReasonWaitingForPreemptedWorkloads) {
    reason = fmt::format("waiting for the runs it preempted to stop; {}", RunsAhead(info.position));
  } else if (info.reason == admission::kReasonExceedsMaxQuota) {
    reason = fmt::format(
        "queue {} can never admit it as the platform stands: {}. Ask for a smaller shape, or ask "
        "the platform team for more quota",
        r.queue, info.message);
  } else if (info.reason == admission::kReasonNoMatchingFlavor) {
    reason = fmt::format("no flavor of queue {} matches it: {}", r.queue, info.message);
  } else {
    reason = fmt::format("waiting for its turn in queue {}; {}", r.queue, RunsAhead(info.position));
  }
  return out(position, info.reason, reason, info.message);
}

namespace {
// A queue's LocalQueues under admission fair sharing, the next to go first (lowest usage).
nlohmann::json FairUsageJson(const std::string& queue,
                             const std::vector<admission::LocalQueueUsage>& local_queues) {
  std::vector<const admission::LocalQueueUsage*> mine;
  for (const admission::LocalQueueUsage& u : local_queues)
    if (u.queue == queue) mine.push_back(&u);
  std::stable_sort(mine.begin(), mine.end(),
                   [](const auto* a, const auto* b) { return a->usage < b->usage; });
  nlohmann::json out = nlohmann::json::array();
  for (const admission::LocalQueueUsage* u : mine) {
    // "workspace/queue"; one named as the queue itself holds runs without a workspace.
    const size_t slash = u->name.rfind('/');
    out.push_back({{"workspace", slash == std::string::npos ? "" : u->name.substr(0, slash)},
                   {"usage", std::isfinite(u->usage) ? nlohmann::json(u->usage) : nullptr},
                   {"weight", u->weight},
                   {"consumed", u->consumed},
                   {"held", u->admitted}});
  }
  return out;
}
}  // namespace

Controller::QueuesView Controller::BuildQueuesView(
    int64_t now, const std::map<std::string, nlohmann::json>& info) {
  QueuesView view;
  std::map<std::string, std::vector<admission::ResourceUsage>> usage_of;
  // Each queue's waiting runs with their place in it (runs the engine does not have pending go
  // last, in submission order), and its holders.
  struct Entry {
    int position;
    int64_t seq;
    const ActiveRun* run;
  };
  std::map<std::string, std::vector<Entry>> pending;
  std::map<std::string, std::vector<const ActiveRun*>> admitted;
  for (const auto& [name, run] : active_) {
    if (store::IsTerminal(run.record.state)) continue;
    if (quota_.holders().count(name)) {
      admitted[run.record.queue].push_back(&run);
      continue;
    }
    auto p = quota_.pending.find(name);
    pending[run.record.queue].push_back(
        {p == quota_.pending.end() ? 1 << 30 : p->second.position, run.record.seq, &run});
  }
  const std::vector<admission::LocalQueueUsage> local_queues = quota_.engine->LocalQueues();
  for (const admission::ClusterQueue& q : loop_platform_->admission.queues) {
    nlohmann::json usage = nlohmann::json::array();
    if (auto u = quota_.engine->Usage(q.name); u.ok()) {
      for (const admission::ResourceUsage& x : *u)
        usage.push_back({{"flavor", x.flavor},
                         {"resource", x.resource},
                         {"nominal", x.nominal.ToString()},
                         {"usage", x.usage.ToString()},
                         {"borrowed", x.borrowed.ToString()}});
    }
    QueueView& out = view.queues.emplace_back();
    std::vector<Entry>& mine = pending[q.name];
    std::sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) {
      return a.position != b.position ? a.position < b.position : a.seq < b.seq;
    });
    out.pending_runs.reserve(mine.size());
    for (const Entry& e : mine)
      out.pending_runs.push_back({e.run->record.name, e.run->record.workspace,
                                  static_cast<int64_t>(e.run->record.priority),
                                  info.count(e.run->record.name)
                                      ? nlohmann::json()
                                      : PendingJson(*e.run, now, &usage_of)});
    for (const ActiveRun* run : admitted[q.name])
      out.admitted_runs.push_back({{"name", run->record.name},
                                   {"workspace", run->record.workspace},
                                   {"state", store::RunStateName(run->record.state)},
                                   {"priority", run->record.priority},
                                   {"flavors", run->record.flavors}});
    out.fields = {{"name", q.name},
                  {"cohort", q.cohort},
                  {"queueing_strategy", admission::QueueingStrategyName(q.queueing_strategy)},
                  {"usage", std::move(usage)},
                  {"admitted", out.admitted_runs.size()},
                  {"pending", out.pending_runs.size()}};
    if (q.admission_fair_sharing) out.fields["fair_usage"] = FairUsageJson(q.name, local_queues);
  }
  std::set<std::string> cohort_names;
  for (const auto& c : loop_platform_->admission.cohorts) cohort_names.insert(c.name);
  for (const auto& q : loop_platform_->admission.queues)
    if (!q.cohort.empty()) cohort_names.insert(q.cohort);
  for (const std::string& name : cohort_names) {
    nlohmann::json usage = nlohmann::json::array();
    if (auto u = quota_.engine->CohortUsage(name); u.ok()) {
      for (const admission::ResourceUsage& x : *u)
        usage.push_back({{"flavor", x.flavor},
                         {"resource", x.resource},
                         {"nominal", x.nominal.ToString()},
                         {"usage", x.usage.ToString()}});
    }
    view.cohorts.push_back({{"name", name}, {"usage", std::move(usage)}});
  }
  // Runs whose queue is not in the platform (it was removed by a later apply).
  for (const auto& [name, why] : quota_.outside)
    view.unqueued_runs.push_back({{"name", name}, {"why", why}});
  return view;
}

namespace {
// How old the views may be when an API call reads them while the loop keeps changing them: at
// most this many builds a second, whatever the callers; and a build that takes long (a deep
// queue) makes them older still, so that building them never takes more than a tenth of the loop;
// never older than a second. A build's cost is the CPU time it took: a build the machine's load
// held up must not keep the views seconds old (a run that ended still shown pending).
constexpr int64_t kViewsMaxAgeMs = 200;
constexpr int64_t kViewsAgePerBuildMs = 10;
constexpr int64_t kViewsOldestMs = 1000;

int64_t ThreadCpuMicros() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}
}  // namespace

int64_t Controller::PostWrite(InboxMessage message) {
  // Counted and pushed under one lock: a pass that took N writes took the first N posted.
  MutexLock lock(&mu_);
  inbox_.Push(std::move(message));
  return ++writes_posted_;
}

void Controller::WaitCommitted(int64_t write, std::string* pending) {
  MutexLock lock(&mu_);
  // Driven by hand, no pass runs until the test asks for one.
  if (options_.loop_thread)
    committed_cv_.WaitFor(&mu_, std::chrono::milliseconds(kDurableWaitMs),
                          [&]() TAU_REQUIRES(mu_) { return writes_taken_ >= write || stopping_; });
  if (writes_taken_ >= write || pending == nullptr) return;
  *pending = commit_trouble_.empty()
                 ? fmt::format(
                       "not recorded yet (the server has not committed it within {} ms); it "
                       "takes effect once it is, unless the server stops first",
                       kDurableWaitMs)
                 : fmt::format(
                       "not recorded yet: the server cannot commit ({}); it takes effect once "
                       "it can, unless the server stops first",
                       commit_trouble_);
}

nlohmann::json Controller::WaitingForScheduler() {
  return {{"position", nullptr}, {"reason", "waiting for the scheduler"}};
}

void Controller::FreshViews(bool now, bool own_writes) {
  // Driven by hand, every pass builds them; stopping, no pass will.
  if (!options_.loop_thread || stopping_) return;
  // The caller's own writes (and everyone's before them) are in; then a view at most
  // kViewsMaxAgeMs old will do, and one built since the last change is current.
  if (!now && (!own_writes || views_built_writes_ >= writes_posted_) &&
      (views_built_generation_ == views_generation_ ||
       clock_->MonotonicMillis() - views_built_ms_ <
           std::clamp(kViewsAgePerBuildMs * views_build_ms_, kViewsMaxAgeMs, kViewsOldestMs)))
    return;
  const int64_t asked_at = views_generation_, writes = own_writes ? writes_posted_ : 0;
  views_wanted_ = true;
  inbox_.Push(ViewsWanted{});
  views_cv_.WaitFor(&mu_, std::chrono::seconds(2), [&]() TAU_REQUIRES(mu_) {
    return stopping_ || (views_built_generation_ > asked_at && views_built_writes_ >= writes);
  });
}

void Controller::RefreshPending(int64_t writes) {
  bool build = !options_.loop_thread;
  {
    MutexLock lock(&mu_);
    ++views_generation_;
    // The pass's commits are done: the writes it took are durable.
    writes_taken_ += writes;
    if (writes > 0) committed_cv_.SignalAll();
    build = build || views_wanted_;
    if (platform_in_use_ != loop_generation_) {
      // ApplyPlatform's caller may go on: the loop decides with the new platform, and the next
      // view it reads is built from it.
      platform_in_use_ = loop_generation_;
      platform_cv_.SignalAll();
    }
  }
  if (build) BuildViews();
}

void Controller::BuildViews() {
  const int64_t started_cpu_us = ThreadCpuMicros();
  int64_t now = Now();
  if (quota_.pending_stale && quota_.engine) {
    quota_.pending.clear();
    for (admission::PendingInfo& p : quota_.engine->Pending())
      quota_.pending[p.name] = std::move(p);
    quota_.pending_stale = false;
  }
  std::map<std::string, nlohmann::json> info;
  std::map<std::string, std::vector<admission::ResourceUsage>> usage_of;
  size_t queued = 0;
  for (const auto& [name, run] : active_) {
    if (run.record.state != RunState::kQueued) continue;
    ++queued;
    info.emplace_hint(info.end(), name, PendingJson(run, now, &usage_of));
  }
  MachineCapacity c;
  c.gpus_total = c.gpus_free = static_cast<int64_t>(gpus_.devices.size());
  c.cpu_milli_total = c.cpu_milli_free = cpu_capacity_milli_;
  c.memory_bytes_total = c.memory_bytes_free = memory_capacity_bytes_;
  backend_->FillCapacity(&c);
  nlohmann::json capacity = {{"gpus_total", c.gpus_total},
                             {"gpus_free", c.gpus_free},
                             {"gpus_unplaceable", c.gpus_unplaceable},
                             {"cpu_milli_total", c.cpu_milli_total},
                             {"cpu_milli_free", c.cpu_milli_free},
                             {"memory_bytes_total", c.memory_bytes_total},
                             {"memory_bytes_free", c.memory_bytes_free},
                             {"queued", queued},
                             {"active", active_.size()}};
  QueuesView queues = BuildQueuesView(now, info);
  MutexLock lock(&mu_);
  // Keep placeholders for runs submitted after this pass started; they are not in active_ yet.
  for (const std::string& name : inbox_.NewRunNames())
    info.emplace(name, pending_info_.count(name) ? pending_info_[name] : nlohmann::json());
  pending_info_ = std::move(info);
  capacity_info_ = std::move(capacity);
  queues_info_ = std::move(queues);
  views_built_generation_ = views_generation_;
  views_built_ms_ = clock_->MonotonicMillis();
  views_build_ms_ = (ThreadCpuMicros() - started_cpu_us) / 1000;
  views_built_writes_ = writes_taken_;
  // Still wanted while a posted write is not taken yet: its pass builds them again.
  views_wanted_ = views_built_writes_ < writes_posted_;
  views_cv_.SignalAll();
}

}  // namespace tau::server
