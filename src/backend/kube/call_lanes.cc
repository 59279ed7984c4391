#include "backend/kube/call_lanes.h"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/clock.h"
#include "kubeapi/kubeapi.h"

namespace tau::server {

CallLanes::CallLanes(Options options) : options_(std::move(options)) {}

CallLanes::~CallLanes() { Stop(); }

int64_t CallLanes::Now() const { return options_.now ? options_.now() : MonotonicMillis(); }

void CallLanes::Submit(const std::string& lane, Call call, Done done) {
  {
    MutexLock lock(&mu_);
    if (!stopped_) {
      std::unique_ptr<Lane>& l = lanes_[lane];
      if (!l) {
        l = std::make_unique<Lane>();
        l->thread = std::thread(&CallLanes::Serve, this, l.get());
      }
      l->queue.emplace_back(std::move(call), std::move(done));
      cv_.SignalAll();
      return;
    }
  }
  done(Unavailable("the server is stopping"));
}

void CallLanes::Serve(Lane* lane) {
  for (;;) {
    std::pair<Call, Done> next;
    bool open = false;
    int64_t open_left = 0;
    {
      MutexLock lock(&mu_);
      lane->busy = false;
      cv_.SignalAll();
      cv_.Wait(&mu_, [&]() TAU_REQUIRES(mu_) { return stopped_ || !lane->queue.empty(); });
      if (stopped_) return;
      next = std::move(lane->queue.front());
      lane->queue.pop_front();
      lane->busy = true;
      open_left = lane->open_until - Now();
      open = open_left > 0;
    }
    if (open) {
      next.second(Unavailable(fmt::format(
          "not tried: the last {} calls in this namespace failed as unavailable; tau tries again "
          "in {}s",
          options_.breaker_failures, (open_left + 999) / 1000)));
      continue;
    }
    Status s;
    {
      kubeapi::CallBudget budget(options_.budget_ms, &stopping_);
      s = next.first();
    }
    {
      MutexLock lock(&mu_);
      if (s.code() == StatusCode::kUnavailable) {
        if (++lane->failures >= options_.breaker_failures)
          lane->open_until = Now() + options_.breaker_open_ms;
      } else {
        lane->failures = 0;
        lane->open_until = 0;
      }
    }
    next.second(s);
  }
}

size_t CallLanes::Pending(const std::string& lane) {
  MutexLock lock(&mu_);
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return 0;
  return it->second->queue.size() + (it->second->busy ? 1 : 0);
}

void CallLanes::Stop() {
  std::vector<std::pair<Call, Done>> dropped;
  std::map<std::string, std::unique_ptr<Lane>> lanes;
  stopping_ = true;
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    cv_.SignalAll();
    lanes.swap(lanes_);
  }
  for (auto& [name, lane] : lanes) {
    if (lane->thread.joinable()) lane->thread.join();
    for (auto& call : lane->queue) dropped.push_back(std::move(call));
  }
  for (auto& [call, done] : dropped) done(Unavailable("the server stopped before the call"));
}

}  // namespace tau::server
