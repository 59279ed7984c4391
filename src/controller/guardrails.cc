// Idle and stalled runs (docs/budgets.md, "Idle and stalled runs"): the decisions are
// guard::Watch's; here they are fed and acted on, on the decision thread.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/strings.h"
#include "controller/controller.h"

namespace tau::server {

using recovery::FailureClass;
using store::Batch;
using store::RunRecord;
using store::RunState;

namespace {

// How often each running attempt's output is measured (a directory listing and a stat or two).
constexpr int64_t kGuardOutputMs = 1000;

std::string Gpus(const std::vector<int>& gpus) {
  std::vector<std::string> names;
  for (int g : gpus) names.push_back(std::to_string(g));
  return Join(names, ",");
}

// What one monitor pass read of an attempt's GPUs: when, how many, how many were under
// `under_pct`, and the busiest.
struct PassReading {
  int64_t at_ms = 0;
  int64_t sampled = 0, under = 0;
  double busiest_pct = 0;
};
PassReading ReadPass(const GpuSamples& pass, const std::vector<int>& gpus, double under_pct) {
  PassReading r;
  for (const evidence::GpuSample& s : pass.samples)
    if (s.util_pct && std::count(gpus.begin(), gpus.end(), s.gpu)) {
      r.at_ms = std::max(r.at_ms, s.at_ms);
      ++r.sampled;
      if (*s.util_pct < under_pct) ++r.under;
      r.busiest_pct = std::max(r.busiest_pct, *s.util_pct);
    }
  return r;
}

}  // namespace

void Controller::AccountGpuTime(const std::vector<RunningAttempt>& running,
                                const std::vector<GpuSamples>& samples) {
  // A gap longer than this between two samples (a stalled monitor) counts as this long.
  constexpr int64_t kMaxSampleGapMs = 10'000;
  for (const RunningAttempt& a : running) {
    if (a.gpus.empty()) continue;
    for (const GpuSamples& pass : samples) {
      const PassReading r = ReadPass(pass, a.gpus, kIdleSharePct);
      if (r.sampled == 0) continue;
      GpuTime& t = gpu_time_[a.run];
      if (t.last_sample_ms > 0 && r.at_ms > t.last_sample_ms) {
        const int64_t dt = std::min(r.at_ms - t.last_sample_ms, kMaxSampleGapMs);
        t.sampled_gpu_ms += dt * r.sampled;
        t.idle_gpu_ms += dt * r.under;
      }
      t.last_sample_ms = std::max(t.last_sample_ms, r.at_ms);
    }
  }
}

void Controller::ApplyGuardrails(const std::vector<GpuSamples>& samples, Batch* batch) {
  // A spec may set limits of its own, so without any in the workspaces and without samples the
  // running attempts are still looked at, once per kGuardOutputMs (a deep queue's passes cost a
  // look at the workspaces).
  const bool workspace_limits =
      std::any_of(loop_platform_->workspaces.begin(), loop_platform_->workspaces.end(),
                  [](const policy::Workspace& w) { return w.limits.idle || w.limits.stall; });
  const int64_t now = Now();
  const bool read_output = now - guard_output_ms_ >= kGuardOutputMs;
  if (!workspace_limits && samples.empty() && watches_.empty() && !read_output) return;
  if (read_output) guard_output_ms_ = now;
  const std::vector<RunningAttempt> attempts = backend_->RunningAttempts();
  if (!samples.empty()) AccountGpuTime(attempts, samples);
  const bool any_limits =
      workspace_limits ||
      std::any_of(attempts.begin(), attempts.end(), [&](const RunningAttempt& a) {
        auto it = active_.find(a.run);
        return it != active_.end() && (it->second.spec.policy.idle || it->second.spec.policy.stall);
      });
  if (!any_limits) {
    watches_.clear();
    return;
  }
  std::set<std::string> running;
  for (const RunningAttempt& a : attempts) {
    auto it = active_.find(a.run);
    if (it == active_.end()) continue;
    ActiveRun& run = it->second;
    const RunRecord& r = run.record;
    const policy::Workspace* w = loop_platform_->FindWorkspace(r.workspace);
    const std::optional<policy::IdleLimit> idle_limit = policy::EffectiveIdle(w, run.spec.policy);
    const std::optional<policy::StallLimit> stall_limit =
        policy::EffectiveStall(w, run.spec.policy);
    const policy::IdleLimit* idle = idle_limit ? &*idle_limit : nullptr;
    const policy::StallLimit* stall = stall_limit ? &*stall_limit : nullptr;
    // Which limit stops it, for the stop's message: the spec's when it set the value in force.
    auto source = [&](const char* limit, std::optional<int64_t> spec_value,
                      std::optional<int64_t> in_force) {
      if (spec_value && spec_value == in_force)
        return fmt::format("the run's policy.guardrails.{}.stop_after", limit);
      return fmt::format("workspace {}: limits.{}.stop_after", r.workspace, limit);
    };
    // A service's replica answers requests: quiet and idle between them is what it is for.
    if ((!idle && !stall) || r.state != RunState::kRunning || r.cancel_requested ||
        run.stop_class || r.service.is_object())
      continue;
    running.insert(a.run);
    auto watch = watches_.find(a.run);
    if (watch == watches_.end() || watch->second.attempt() != a.attempt)
      watch = watches_.insert_or_assign(a.run, guard::Watch(a.attempt, now)).first;
    guard::Watch& wt = watch->second;
    if (idle && !a.gpus.empty())
      for (const GpuSamples& pass : samples) {
        const PassReading r = ReadPass(pass, a.gpus, idle->gpu_util_below_pct);
        if (r.sampled > 0) wt.Utilisation(std::min(r.at_ms, now), r.busiest_pct, *idle);
      }
    if (stall && read_output)
      if (std::optional<int64_t> bytes = backend_->OutputBytes(run)) wt.Output(now, *bytes);
    // A backend that cannot measure a run's output cannot tell that it stalled.
    for (const guard::Step& step : wt.Check(idle, wt.output_measured() ? stall : nullptr, now)) {
      const std::string since = FormatDuration(now - step.since_ms);
      auto event = [&](const char* type, std::string message, nlohmann::json data = {}) {
        batch->events.push_back({0, r.name, now, type, std::move(message),
                                 data.is_null() ? nlohmann::json::object() : std::move(data), "",
                                 ""});
      };
      switch (step.action) {
        case guard::Action::kIdleWarn:
          event("IdleWarning",
                fmt::format("GPU{} {} under {}% utilisation for {}{}", a.gpus.size() > 1 ? "s" : "",
                            Gpus(a.gpus), idle->gpu_util_below_pct, since,
                            idle->stop_after_ms ? fmt::format("; it is stopped as Idle after {}",
                                                              FormatDuration(*idle->stop_after_ms))
                                                : std::string()),
                {{"since_ms", step.since_ms}, {"gpus", a.gpus}});
          break;
        case guard::Action::kIdleCleared:
          event("IdleCleared", fmt::format("GPUs {} busy again", Gpus(a.gpus)));
          break;
        case guard::Action::kIdleStop:
          backend_->StopAttempt(
              run, FailureClass::kIdle,
              fmt::format(
                  "GPUs {} under {}% utilisation for {} ({})", Gpus(a.gpus),
                  idle->gpu_util_below_pct, since,
                  source("idle",
                         run.spec.policy.idle ? run.spec.policy.idle->stop_after_ms : std::nullopt,
                         idle->stop_after_ms)),
              batch);
          break;
        case guard::Action::kStalled: {
          // The stacks first, so that the mark and any stop come after the dump in the log.
          std::optional<int> asked = backend_->DumpStacks(run);
          if (asked && *asked > 0) wt.StacksDumped(now);
          event("StallDetected",
                fmt::format("no log output and no metric points for {}; {}", since,
                            !asked       ? std::string("this backend cannot dump stacks")
                            : *asked > 0 ? fmt::format("{} Python process{} asked to write "
                                                       "their stacks to the log",
                                                       *asked, *asked > 1 ? "es" : "")
                                         : std::string("no Python process to ask for its stacks")),
                {{"since_ms", step.since_ms}, {"stack_dumps", asked ? *asked : 0}});
          break;
        }
        case guard::Action::kStallCleared:
          event("StallCleared", "output again");
          break;
        case guard::Action::kStallStop:
          backend_->StopAttempt(
              run, FailureClass::kStalled,
              fmt::format("no log output and no metric points for {} ({})", since,
                          source("stall",
                                 run.spec.policy.stall ? run.spec.policy.stall->stop_after_ms
                                                       : std::nullopt,
                                 stall->stop_after_ms)),
              batch);
          break;
      }
    }
  }
  for (auto it = watches_.begin(); it != watches_.end();)
    it = running.count(it->first) ? std::next(it) : watches_.erase(it);
}

}  // namespace tau::server
