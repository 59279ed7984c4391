#include "backend/inbox.h"

#include <algorithm>
#include <chrono>

namespace tau::server {

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

void Inbox::Push(InboxMessage message) {
  MutexLock lock(&mu_);
  if (std::holds_alternative<GpuSamples>(message) && ++sample_batches_ > kMaxSampleBatches) {
    auto oldest = std::find_if(queue_.begin(), queue_.end(), [](const InboxMessage& m) {
      return std::holds_alternative<GpuSamples>(m);
    });
    if (oldest != queue_.end()) queue_.erase(oldest);
    --sample_batches_;
  }
  queue_.push_back(std::move(message));
  cv_.Signal();
}

bool Inbox::Take(int64_t timeout_ms, InboxTake* take) {
  MutexLock lock(&mu_);
  cv_.WaitFor(&mu_, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
              [&]() TAU_REQUIRES(mu_) { return closed_ || !queue_.empty(); });
  if (closed_) return false;
  *take = TakeLocked();
  return true;
}

InboxTake Inbox::TakeNow() {
  MutexLock lock(&mu_);
  return TakeLocked();
}

InboxTake Inbox::TakeLocked() {
  InboxTake take;
  for (InboxMessage& m : queue_)
    std::visit(Overloaded{
                   [&](NewRun& x) {
                     ++take.writes;
                     take.new_runs.push_back(std::move(x));
                   },
                   [&](CancelRequest& x) {
                     ++take.writes;
                     take.cancels.push_back(std::move(x));
                   },
                   [&](AttemptExited& x) { take.exits.push_back(std::move(x)); },
                   [&](GpuNews& x) { take.gpu_news.push_back(std::move(x)); },
                   [&](ResumeRequest& x) {
                     ++take.writes;
                     take.resumes.push_back(std::move(x));
                   },
                   [&](AttemptNews& x) { take.attempt_news.push_back(std::move(x)); },
                   [&](GpuSamples& x) { take.samples.push_back(std::move(x)); },
                   [&](PlatformChanged& x) {
                     ++take.writes;
                     take.platform = std::move(x);
                   },
                   [&](RunNotice& x) { take.notices.push_back(std::move(x)); },
                   [&](MetricsDrained& x) { take.drained.push_back(std::move(x)); },
                   [&](ViewsWanted&) {},
                   [&](RestartRequest& x) { take.restarts.push_back(std::move(x)); },
               },
               m);
  queue_.clear();
  sample_batches_ = 0;
  return take;
}

void Inbox::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

bool Inbox::WaitClosed(int64_t timeout_ms) {
  MutexLock lock(&mu_);
  return cv_.WaitFor(&mu_, std::chrono::milliseconds(timeout_ms),
                     [&]() TAU_REQUIRES(mu_) { return closed_; });
}

std::vector<std::string> Inbox::NewRunNames() {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const InboxMessage& m : queue_)
    if (const NewRun* n = std::get_if<NewRun>(&m)) names.push_back(n->name);
  return names;
}

}  // namespace tau::server
