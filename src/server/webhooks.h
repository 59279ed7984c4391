// Webhooks (docs/webhooks.md): a run's events POSTed to its workspace's receivers and its own,
// signed with HMAC-SHA256. Never on the decision thread: a thread of its own routes the store's new
// events to the store's outbox (durable, bounded per URL) and delivers each URL's queue in order,
// trying a failed delivery again with a growing backoff. A server restart loses nothing: the outbox
// and the cursor of routed events are in the store.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "policy/policy.h"
#include "store/store.h"

namespace tau::server {

class Webhooks {
 public:
  struct Options {
    Clock* clock = nullptr;     // null: the system clock
    int64_t poll_ms = 250;      // how often new events are looked for
    int64_t timeout_ms = 5000;  // one POST's connect and answer, together
    int64_t backoff_initial_ms = 1000;
    int64_t backoff_max_ms = 60'000;
    int64_t give_up_after_ms = 24 * 3'600'000;  // a delivery this old is dropped
    int64_t max_per_url = 10'000;               // deliveries waiting per URL; the oldest go
  };
  using CurrentPlatform = std::function<std::shared_ptr<const policy::Platform>()>;
  Webhooks(Options options, store::Store* store, CurrentPlatform platform, Metrics* metrics);
  ~Webhooks();

  void Start();
  void Stop();  // a POST in flight is waited for (at most timeout_ms)

  // The kind of an event type ("state", "guardrail", "budget"), or "" for one no webhook takes.
  static std::string KindOf(const std::string& event_type);
  // The JSON a receiver gets for one event.
  static std::string Body(const store::EventInScope& e);
  // The X-Tau-Signature header's value: "t=SECONDS,v1=HEX", HEX the HMAC-SHA256 under `secret`
  // of "SECONDS." followed by the body.
  static std::string Signature(const std::string& secret, int64_t seconds, const std::string& body);

 private:
  void Work();
  void Route();    // new events into the outbox
  void Deliver();  // the outbox's due heads, in order per URL
  // "" when the receiver took it (2xx), else why not.
  std::string Post(const store::Delivery& d, const std::string& secret);

  // Owned by the thread. The last event routed: persisted with the deliveries it made, and at most
  // every kCursorPersistMs when it moves past events that made none (a restart routes those
  // again, which queues nothing twice: they made no delivery).
  std::optional<int64_t> cursor_;
  int64_t cursor_persisted_ms_ = 0;
  static constexpr int64_t kCursorPersistMs = 30'000;
  std::string last_error_;  // said once until it changes or clears

  const Options options_;
  store::Store* const store_;
  const CurrentPlatform platform_;
  Metrics* const metrics_;
  Clock* const clock_;
  std::thread thread_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ TAU_GUARDED_BY(mu_) = false;
};

}  // namespace tau::server
