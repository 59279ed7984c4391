// Webhooks (docs/webhooks.md): a run's events POSTed to its workspace's receivers and its own,
// signed with HMAC-SHA256. Never on the decision thread: a thread of its own routes the store's new
// events to the store's outbox (durable, bounded per URL) and hands each URL's due head to a small
// pool of senders, one try in flight per receiver (scheme, host and port), so that a slow receiver
// holds up only its own queue. A failed try is repeated with a growing backoff. Receivers are not
// trusted: a try ends within timeout_ms whatever the receiver trickles, and reads at most
// max_answer_bytes of its answer. A server restart loses nothing: the outbox and the cursor of
// routed events are in the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "policy/policy.h"
#include "store/store.h"

namespace tau::server {

class Webhooks {
 public:
  struct Options {
    Clock* clock = nullptr;          // null: the system clock
    int64_t poll_ms = 250;           // how often new events are looked for
    int64_t timeout_ms = 5000;       // one try in all: connecting, sending and the answer together
    size_t max_answer_bytes = 4096;  // of a receiver's answer read; the rest is never read
    size_t max_senders = 8;          // threads trying at once, each for another receiver
    int64_t backoff_initial_ms = 1000;
    int64_t backoff_max_ms = 60'000;
    int64_t give_up_after_ms = 24 * 3'600'000;  // a delivery this old is dropped
    int64_t max_per_url = 10'000;               // deliveries waiting per URL; the oldest go
  };
  using CurrentPlatform = std::function<std::shared_ptr<const policy::Platform>()>;
  Webhooks(Options options, store::Store* store, CurrentPlatform platform, Metrics* metrics);
  ~Webhooks();

  void Start();
  void Stop();  // the tries in flight are waited for (at most timeout_ms)

  // The kind of an event type ("state", "guardrail", "budget"), or "" for one no webhook takes.
  static std::string KindOf(const std::string& event_type);
  // The JSON a receiver gets for one event.
  static std::string Body(const store::EventInScope& e);
  // The X-Tau-Signature header's value: "t=SECONDS,v1=HEX", HEX the HMAC-SHA256 under `secret`
  // of "SECONDS." followed by the body.
  static std::string Signature(const std::string& secret, int64_t seconds, const std::string& body);

 private:
  // One due delivery handed to a sender; `receiver` is the key it holds in busy_.
  struct Job {
    store::Delivery delivery;
    std::string receiver;
  };
  void Work();      // the router's thread: Route and Dispatch
  void Route();     // new events into the outbox
  void Dispatch();  // the outbox's due heads whose receiver has no try in flight, to the senders
  void Send();      // a sender's thread: one Try after another
  // One try of `d` and its outcome in the store; true when it left the outbox (taken or dropped).
  bool Try(const store::Delivery& d);
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
  CondVar cv_;       // the router's: stop, or a delivery left the outbox
  CondVar jobs_cv_;  // the senders': stop, or a job
  bool stop_ TAU_GUARDED_BY(mu_) = false;
  bool settled_ TAU_GUARDED_BY(mu_) = false;  // a delivery left: its URL's next may be due now
  std::deque<Job> jobs_ TAU_GUARDED_BY(mu_);
  // Receivers with a try queued or in flight: never two at once, so each URL keeps its order.
  std::set<std::string> busy_ TAU_GUARDED_BY(mu_);
  std::vector<std::thread> senders_ TAU_GUARDED_BY(mu_);  // started as needed, up to max_senders
  size_t idle_senders_ TAU_GUARDED_BY(mu_) = 0;
};

}  // namespace tau::server
