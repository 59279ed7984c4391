#include "controller/array_throttle.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "backend/backend.h"

namespace tau::server {

namespace {

// The array's name and its max_parallel, when the run is of an array that has one.
std::optional<std::pair<std::string, int64_t>> ThrottleOf(const store::RunRecord& r) {
  if (!r.array.is_object()) return std::nullopt;
  auto max = r.array.find("max_parallel");
  if (max == r.array.end() || !max->is_number_integer() || max->get<int64_t>() < 1)
    return std::nullopt;
  return std::make_pair(r.array.value("name", ""), max->get<int64_t>());
}

// Where (seq, name) is or would go in `waiting`, which is sorted.
template <typename Waiting>
typename Waiting::iterator PlaceOf(Waiting& waiting, int64_t seq, const std::string& name) {
  return std::lower_bound(waiting.begin(), waiting.end(), std::make_pair(seq, name));
}

}  // namespace

void ArrayThrottle::RunAdded(ActiveRun& run, bool) {
  const store::RunRecord& r = run.record;
  auto throttle = ThrottleOf(r);
  if (!throttle || store::IsTerminal(r.state)) return;
  Array& t = arrays_[throttle->first];
  t.max = throttle->second;
  const bool holds = r.flavors.is_object() && !r.flavors.empty();
  if (r.state != store::RunState::kQueued || holds ||
      static_cast<int64_t>(t.in_play.size()) < t.max) {
    t.in_play.insert(r.name);
    run.throttled = false;
    return;
  }
  // Runs mostly come in seq order (a batch, a recovery sorted by seq): most go at the back.
  if (auto at = PlaceOf(t.waiting, r.seq, r.name); at == t.waiting.end() || at->second != r.name)
    t.waiting.insert(at, {r.seq, r.name});
  run.throttled = true;
}

void ArrayThrottle::RunEnded(const store::RunRecord& r) {
  auto throttle = ThrottleOf(r);
  if (!throttle) return;
  auto it = arrays_.find(throttle->first);
  if (it == arrays_.end()) return;
  Array& t = it->second;
  t.in_play.erase(r.name);
  if (auto at = PlaceOf(t.waiting, r.seq, r.name); at != t.waiting.end() && at->second == r.name)
    t.waiting.erase(at);
  while (static_cast<int64_t>(t.in_play.size()) < t.max && !t.waiting.empty()) {
    const std::string next = t.waiting.front().second;
    t.waiting.pop_front();
    auto run = host_->active().find(next);
    if (run == host_->active().end() || store::IsTerminal(run->second.record.state)) continue;
    run->second.throttled = false;
    run->second.queued_since_ms = host_->Now();
    t.in_play.insert(next);
    host_->EngineChanged(next);
  }
  if (t.in_play.empty() && t.waiting.empty()) arrays_.erase(it);
}

nlohmann::json ArrayThrottle::Pending(const ActiveRun& run) {
  if (!run.throttled) return nullptr;
  auto throttle = ThrottleOf(run.record);
  const std::string array = throttle ? throttle->first : "";
  size_t ahead = 0, in_play = 0;
  if (auto it = arrays_.find(array); it != arrays_.end()) {
    in_play = it->second.in_play.size();
    ahead = static_cast<size_t>(PlaceOf(it->second.waiting, run.record.seq, run.record.name) -
                                it->second.waiting.begin());
  }
  return PendingEntry(
      0, run.record.queue, "ArrayMaxParallel",
      fmt::format("{} of array {}'s runs are in play (max_parallel {}); {} of its runs wait "
                  "ahead of this one, which enters its queue when a place is free",
                  in_play, array, throttle ? throttle->second : 0, ahead),
      "");
}

}  // namespace tau::server
