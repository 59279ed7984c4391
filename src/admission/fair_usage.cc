// Admission fair sharing (Kueue's AdmissionFairSharing): a LocalQueue's usage decays with a
// half-life, and a queue with the mode on takes its next head from the LocalQueue that used the
// least (weighted), then in queue order.
//
// Each LocalQueue's workloads of one shape are their own equivalence class (the LocalQueue is in
// the hash), so every class head is its LocalQueue's first of that shape and the queue's head is
// the lowest (usage, queue order) over the class heads: O(classes), not O(pending). A NoFit head
// parks its shape in every LocalQueue, as Kueue's hash (which has no LocalQueue) does.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "admission/internal.h"

namespace tau::admission {
namespace {

// Kueue's alpha: the share of the new value after `elapsed` of a half-life (> 0: Engine::Create).
double Alpha(double elapsed_ms, double half_life_ms) {
  return 1.0 - std::pow(0.5, elapsed_ms / half_life_ms);
}

}  // namespace

double DecayedHolding(const AdmissionFairSharing& afs, int64_t start_ms, int64_t end_ms,
                      int64_t now_ms) {
  if (afs.usage_half_life_ms <= 0 || end_ms < start_ms) return 0;
  const double h = static_cast<double>(afs.usage_half_life_ms);
  // 1 - Alpha(t) is what is left after t: the decay factor.
  const double left_since_start =
      1 - Alpha(static_cast<double>(now_ms - std::min(start_ms, now_ms)), h);
  const double left_since_end =
      1 - Alpha(static_cast<double>(now_ms - std::min(end_ms, now_ms)), h);
  const double penalty = Alpha(static_cast<double>(afs.usage_sampling_interval_ms), h);
  return left_since_end - left_since_start + penalty * left_since_start;
}

int Engine::Impl::LocalQueueOf(int cq, const std::string& name) {
  auto [it, inserted] = lq_by_name.try_emplace(name, static_cast<int>(lqs.size()));
  if (!inserted) return lqs[it->second].cq == cq ? it->second : -1;
  Lq lq;
  lq.name = name;
  lq.cq = cq;
  if (auto w = lq_weights.find(name); w != lq_weights.end()) lq.weight = w->second;
  Reweigh(lq);
  lqs.push_back(std::move(lq));
  return it->second;
}

void Engine::Impl::FoldUsage(Lq& lq, int64_t now_ms) {
  if (lq.last_update_ms < 0 || now_ms <= lq.last_update_ms) {
    lq.last_update_ms = std::max(lq.last_update_ms, now_ms);
    return;
  }
  const double a = Alpha(static_cast<double>(now_ms - lq.last_update_ms),
                         static_cast<double>(config.admission_fair_sharing->usage_half_life_ms));
  for (auto& [r, v] : lq.consumed) v *= 1 - a;
  for (const auto& [r, milli] : lq.admitted) {
    if (milli != 0) lq.consumed[r] += a * static_cast<double>(milli) / 1000;
  }
  lq.last_update_ms = now_ms;
  Reweigh(lq);
}

void Engine::Impl::SampleUsage(int64_t now_ms) {
  if (!config.admission_fair_sharing) return;
  const int64_t interval = config.admission_fair_sharing->usage_sampling_interval_ms;
  for (Lq& lq : lqs) {
    if (lq.last_update_ms < 0 || now_ms - lq.last_update_ms >= interval) FoldUsage(lq, now_ms);
  }
}

void Engine::Impl::AddEntryPenalty(int id) {
  const Wl& w = wls[id];
  Lq& lq = lqs[w.lq];
  const AdmissionFairSharing& afs = *config.admission_fair_sharing;
  FoldUsage(lq, w.spec.admitted_ms);
  const double a = Alpha(static_cast<double>(afs.usage_sampling_interval_ms),
                         static_cast<double>(afs.usage_half_life_ms));
  for (const auto& [fr, milli] : w.usage)
    lq.consumed[fr_resource[fr]] += a * static_cast<double>(milli) / 1000;
  Reweigh(lq);
}

double Engine::Impl::LqUsage(const Lq& lq) const {
  if (lq.weight <= 0) return std::numeric_limits<double>::infinity();
  const std::map<std::string, double>& weights = config.admission_fair_sharing->resource_weights;
  double usage = 0;
  for (const auto& [r, v] : lq.consumed) {
    auto it = weights.find(resource_names[r]);
    usage += (it == weights.end() ? 1.0 : it->second) * v;
  }
  return usage / lq.weight;
}

bool Engine::Impl::Before(const Cq& cq, int a, int b) const {
  if (cq.spec.admission_fair_sharing) {
    double ua = lqs[wls[a].lq].usage, ub = lqs[wls[b].lq].usage;
    if (ua != ub) return ua < ub;
  }
  return WlLess{&wls}(a, b);
}

int Engine::Impl::AfsHead(const Cq& cq) const {
  int best = -1;
  for (int id : cq.heads)
    if (best < 0 || Before(cq, id, best)) best = id;
  return best;
}

std::vector<LocalQueueUsage> Engine::LocalQueues() const {
  const Impl& m = *impl_;
  std::vector<LocalQueueUsage> out;
  for (const Lq& lq : m.lqs) {
    LocalQueueUsage u;
    u.name = lq.name;
    u.queue = m.cqs[lq.cq].spec.name;
    u.weight = lq.weight;
    for (const auto& [r, v] : lq.consumed) u.consumed[m.resource_names[r]] = v;
    for (const auto& [r, milli] : lq.admitted)
      if (milli != 0) u.admitted[m.resource_names[r]] = static_cast<double>(milli) / 1000;
    u.last_update_ms = std::max<int64_t>(0, lq.last_update_ms);
    u.usage = lq.usage;
    out.push_back(std::move(u));
  }
  std::sort(out.begin(), out.end(),
            [](const LocalQueueUsage& a, const LocalQueueUsage& b) { return a.name < b.name; });
  return out;
}

Status Engine::SetLocalQueueUsage(const std::string& local_queue, const std::string& queue,
                                  const std::map<std::string, double>& consumed, int64_t at_ms) {
  Impl& m = *impl_;
  auto q = m.cq_by_name.find(queue);
  if (q == m.cq_by_name.end())
    return NotFound(
        fmt::format("local queue '{}': unknown cluster queue '{}'", local_queue, queue));
  if (!m.cqs[q->second].spec.admission_fair_sharing) {
    return FailedPrecondition(
        fmt::format("local queue '{}': cluster queue '{}' does not use admission fair sharing",
                    local_queue, queue));
  }
  int id = m.LocalQueueOf(q->second, local_queue);
  if (id < 0) {
    return InvalidArgument(
        fmt::format("local queue '{}' belongs to cluster queue '{}', not '{}'", local_queue,
                    m.cqs[m.lqs[m.lq_by_name[local_queue]].cq].spec.name, queue));
  }
  Lq& lq = m.lqs[id];
  lq.consumed.clear();
  for (const auto& [name, v] : consumed) {
    if (!(v >= 0) || !std::isfinite(v))
      return InvalidArgument(
          fmt::format("local queue '{}': usage of {} must be a number >= 0", local_queue, name));
    lq.consumed[m.InternResource(name)] = v;
  }
  lq.last_update_ms = at_ms;
  m.Reweigh(lq);
  return Status::Ok();
}

}  // namespace tau::admission
