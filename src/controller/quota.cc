// The controller's quota book: the platform policy in force, the Kueue-model admission engine
// (quota, priorities, preemption, fair sharing) kept in step with the runs, requeues, and why a
// queued run waits. Where attempts are placed is the backend's (local_backend.cc places them on
// this machine's GPUs, CPUs and memory).
#include <algorithm>

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Platform.

Status Controller::LoadPlatformFile() {
  std::shared_ptr<const policy::Platform> platform;
  std::string source = "default";
  int64_t applied_ms = Now();
  if (!options_.platform_file.empty() && PathExists(options_.platform_file)) {
    TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(options_.platform_file));
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
    platform = std::make_shared<const policy::Platform>(
        size ? policy::DefaultPlatform(size->gpus, size->cpu_milli, size->memory_bytes)
             : policy::DefaultPlatform(static_cast<int>(gpus_.devices.size()), cpu_capacity_milli_,
                                       memory_capacity_bytes_));
  }
  MutexLock lock(&mu_);
  platform_ = {platform, source, applied_ms};
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
  platform_ = {platform, filename, now};
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

nlohmann::json Controller::Queues(bool summary) {
  MutexLock lock(&mu_);
  FreshViews();
  if (!summary) return queues_info_;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : queues_info_.items()) {
    if (key != "queues") {
      out[key] = value;
      continue;
    }
    nlohmann::json& queues = out[key] = nlohmann::json::array();
    for (const nlohmann::json& q : value) {
      nlohmann::json& copy = queues.emplace_back(nlohmann::json::object());
      for (const auto& [field, v] : q.items())
        if (field != "pending_runs" && field != "admitted_runs") copy[field] = v;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The engine.

void Controller::RebuildEngine() {
  auto engine = admission::Engine::Create(policy::ToAdmissionConfig(*loop_platform_));
  if (!engine.ok()) {
    // ApplyPlatform and LoadPlatformFile checked this; an engine that cannot be built would admit
    // nothing, so say so loudly rather than run without quota.
    std::fprintf(stderr, "tau server: fatal: the platform's queues are invalid: %s\n",
                 engine.status().ToString().c_str());
    std::_Exit(70);
  }
  quota_.engine = std::move(*engine);
  quota_.in_engine.clear();
  quota_.outside.clear();
  quota_.pending.clear();
  SyncEngine();
}

// Makes the engine's workloads match the runs: runs holding quota (admitted, running, or reserved
// and waiting for the machine) are added with their recorded flavors first, so the quota they hold
// is accounted before anything new is admitted; queued runs past their backoff are added pending.
void Controller::SyncEngine() {
  int64_t now = Now();
  for (int pass = 0; pass < 2; ++pass) {
    const bool holders = pass == 0;
    for (auto& [name, run] : active_) {
      const RunRecord& r = run.record;
      if (store::IsTerminal(r.state)) continue;
      const bool holds = r.flavors.is_object() && !r.flavors.empty();
      const bool waits = r.state == RunState::kQueued && !holds && !r.cancel_requested &&
                         !(r.not_before_ms && *r.not_before_ms > now);
      auto it = quota_.in_engine.find(name);
      if (it != quota_.in_engine.end()) {
        // Gone from the queue, or (Kubernetes: Kueue admitted it) holding quota now while the
        // engine has it pending: taken out, and a holder is added again below. (One waiting in
        // the engine has had no attempt since it was added, so it has not begun draining.)
        bool stale = holders && ((!holds && !waits) || (holds && !it->second));
        if (!stale) continue;
        (void)quota_.engine->RemoveWorkload(name);
        quota_.in_engine.erase(it);
        if (!holds) continue;
      }
      if (holds != holders || (!holds && !waits) || quota_.outside.count(name)) continue;
      // A run whose ended attempt's metric points are still being read waits: its next attempt
      // would append to the same file. (Asked last: it takes the evidence worker's lock.)
      if (!holds && evidence_->Draining(name)) continue;
      admission::Workload w = run.workload;
      if (holds) {
        w.admission = AssignmentFromJson(r.flavors);
        w.admitted_ms = r.admitted_ms.value_or(r.updated_ms);
      }
      Status s = quota_.engine->AddWorkload(w);
      if (s.ok()) {
        quota_.in_engine[name] = holds;
      } else {
        quota_.outside[name] = s.code() == StatusCode::kNotFound
                                   ? fmt::format("the platform has no queue '{}' any more", w.queue)
                                   : s.message();
      }
    }
  }
}

void Controller::Requeue(ActiveRun& run, const std::string& message, Batch* batch) {
  RunRecord& r = run.record;
  bool had_attempt = r.state == RunState::kRunning;
  r.preemptions += 1;
  ReleaseResources(run);
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

nlohmann::json Controller::PendingJson(const ActiveRun& run, int64_t now) {
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
    auto usage = quota_.engine->Usage(r.queue);
    const admission::PodSet& ps = run.workload.pod_sets.front();
    // Every pod set's (the workers' and a sized head's) together.
    for (const auto& [resource, total] : run.resolved.total_requests) {
      if (total.IsZero() || !usage.ok()) continue;
      std::vector<std::string> offers;
      bool fits_somewhere = false;
      for (const admission::ResourceUsage& u : *usage) {
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

nlohmann::json Controller::QueuesJson(int64_t now,
                                      const std::map<std::string, nlohmann::json>& pending_info) {
  nlohmann::json queues = nlohmann::json::array();
  std::map<std::string, std::vector<const ActiveRun*>> pending, admitted;
  for (const auto& [name, run] : active_) {
    if (store::IsTerminal(run.record.state)) continue;
    auto h = quota_.in_engine.find(name);
    if (h != quota_.in_engine.end() && h->second)
      admitted[run.record.queue].push_back(&run);
    else
      pending[run.record.queue].push_back(&run);
  }
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
    nlohmann::json waiting = nlohmann::json::array();
    auto& mine = pending[q.name];
    std::sort(mine.begin(), mine.end(), [&](const ActiveRun* a, const ActiveRun* b) {
      auto pa = quota_.pending.find(a->record.name), pb = quota_.pending.find(b->record.name);
      int xa = pa == quota_.pending.end() ? 1 << 30 : pa->second.position;
      int xb = pb == quota_.pending.end() ? 1 << 30 : pb->second.position;
      return xa != xb ? xa < xb : a->record.seq < b->record.seq;
    });
    for (const ActiveRun* run : mine) {
      auto known = pending_info.find(run->record.name);
      nlohmann::json j = known != pending_info.end() ? known->second : PendingJson(*run, now);
      j["name"] = run->record.name;
      j["workspace"] = run->record.workspace;
      j["priority"] = run->record.priority;
      waiting.push_back(std::move(j));
    }
    nlohmann::json holding = nlohmann::json::array();
    for (const ActiveRun* run : admitted[q.name])
      holding.push_back({{"name", run->record.name},
                         {"workspace", run->record.workspace},
                         {"state", store::RunStateName(run->record.state)},
                         {"priority", run->record.priority},
                         {"flavors", run->record.flavors}});
    queues.push_back({{"name", q.name},
                      {"cohort", q.cohort},
                      {"queueing_strategy", admission::QueueingStrategyName(q.queueing_strategy)},
                      {"usage", std::move(usage)},
                      {"admitted", holding.size()},
                      {"pending", waiting.size()},
                      {"admitted_runs", std::move(holding)},
                      {"pending_runs", std::move(waiting)}});
  }
  nlohmann::json cohorts = nlohmann::json::array();
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
    cohorts.push_back({{"name", name}, {"usage", std::move(usage)}});
  }
  // Runs whose queue is not in the platform (it was removed by a later apply).
  nlohmann::json orphans = nlohmann::json::array();
  for (const auto& [name, why] : quota_.outside) orphans.push_back({{"name", name}, {"why", why}});
  return {{"queues", std::move(queues)},
          {"cohorts", std::move(cohorts)},
          {"unqueued_runs", std::move(orphans)}};
}

namespace {
// How old the views may be when an API call reads them while the loop keeps changing them: at
// most this many builds a second, whatever the callers.
constexpr int64_t kViewsMaxAgeMs = 200;
}  // namespace

void Controller::PostWrite(InboxMessage message) {
  {
    MutexLock lock(&mu_);
    ++writes_posted_;
  }
  inbox_.Push(std::move(message));
}

void Controller::FreshViews(bool now) {
  // Driven by hand, every pass builds them; stopping, no pass will.
  if (!options_.loop_thread || stopping_) return;
  // The caller's own writes (and everyone's before them) are in; then a view at most
  // kViewsMaxAgeMs old will do, and one built since the last change is current.
  if (!now && views_built_writes_ >= writes_posted_ &&
      (views_built_generation_ == views_generation_ ||
       MonotonicMillis() - views_built_ms_ < kViewsMaxAgeMs))
    return;
  const int64_t asked_at = views_generation_, writes = writes_posted_;
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
    writes_taken_ += writes;
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
  int64_t now = Now();
  if (quota_.pending_stale && quota_.engine) {
    quota_.pending.clear();
    for (admission::PendingInfo& p : quota_.engine->Pending())
      quota_.pending[p.name] = std::move(p);
    quota_.pending_stale = false;
  }
  std::map<std::string, nlohmann::json> info;
  size_t queued = 0;
  for (const auto& [name, run] : active_) {
    if (run.record.state != RunState::kQueued) continue;
    ++queued;
    info[name] = PendingJson(run, now);
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
  nlohmann::json queues = QueuesJson(now, info);
  MutexLock lock(&mu_);
  // Keep placeholders for runs submitted after this pass started; they are not in active_ yet.
  for (const std::string& name : inbox_.NewRunNames())
    info.emplace(name, pending_info_.count(name) ? pending_info_[name] : nlohmann::json());
  pending_info_ = std::move(info);
  capacity_info_ = std::move(capacity);
  queues_info_ = std::move(queues);
  views_built_generation_ = views_generation_;
  views_built_ms_ = MonotonicMillis();
  views_built_writes_ = writes_taken_;
  // Still wanted while a posted write is not taken yet: its pass builds them again.
  views_wanted_ = views_built_writes_ < writes_posted_;
  views_cv_.SignalAll();
}

}  // namespace tau::server
