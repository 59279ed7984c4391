#include "server/webhooks.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "client/client.h"
#include "common/hash.h"
#include "common/json_text.h"

namespace tau::server {
namespace {

constexpr int64_t kRouteBatch = 500;  // events read from the store at a time

// A webhook URL as the client dials it: scheme, host and port, and the request path.
struct Target {
  client::Endpoint endpoint;
  std::string path;
};

Result<Target> ParseTarget(const std::string& url) {
  const bool tls = url.rfind("https://", 0) == 0;
  if (!tls && url.rfind("http://", 0) != 0) return InvalidArgument("not an http(s) URL: " + url);
  std::string rest = url.substr(tls ? 8 : 7);
  size_t slash = rest.find('/');
  Target t;
  t.path = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string authority = rest.substr(0, slash);
  std::string host = authority;
  int port = tls ? 443 : 80;
  size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']', colon) == std::string::npos) {
    host = authority.substr(0, colon);
    port = std::atoi(authority.c_str() + colon + 1);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  t.endpoint.unix_socket = false;
  t.endpoint.tls = tls;
  t.endpoint.host = host;
  t.endpoint.port = port;
  return t;
}

// What one try at a time is allowed per: the receiver's scheme, host and port. Several URLs on
// one slow host then hold one sender, not all of them.
std::string ReceiverOf(const std::string& url) {
  auto target = ParseTarget(url);
  return target.ok() ? target->endpoint.ToString() : url;
}

// A string field of a run's webhook (its canonical spec's), "" when it is not one.
std::string JsonString(const nlohmann::json& hook, const char* key) {
  if (!hook.is_object()) return "";
  auto it = hook.find(key);
  return it != hook.end() && it->is_string() ? it->get<std::string>() : "";
}

// Whether a run's webhook takes events of `kind`.
bool RunHookTakes(const nlohmann::json& hook, const std::string& kind) {
  if (!hook.is_object()) return false;
  auto events = hook.find("events");
  if (events == hook.end() || !events->is_array()) return false;
  return std::any_of(events->begin(), events->end(), [&](const nlohmann::json& k) {
    return k.is_string() && k.get<std::string>() == kind;
  });
}

}  // namespace

Webhooks::Webhooks(Options options, store::Store* store, CurrentPlatform platform, Metrics* metrics)
    : options_(options),
      store_(store),
      platform_(std::move(platform)),
      metrics_(metrics),
      clock_(options.clock ? options.clock : SystemClock()) {}

Webhooks::~Webhooks() { Stop(); }

void Webhooks::Start() {
  thread_ = std::thread([this] { Work(); });
}

void Webhooks::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
    jobs_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  std::vector<std::thread> senders;
  {
    MutexLock lock(&mu_);
    senders.swap(senders_);  // the router, which starts them, has ended
  }
  for (std::thread& t : senders) t.join();
}

std::string Webhooks::KindOf(const std::string& type) {
  static const std::set<std::string> kState = {"Submitted", "Queued",    "Admitted",
                                               "Running",   "Retrying",  "Succeeded",
                                               "Failed",    "Cancelled", "Preempted"};
  static const std::set<std::string> kGuardrail = {"IdleWarning",   "IdleCleared",  "Idle",
                                                   "StallDetected", "StallCleared", "Stalled"};
  static const std::set<std::string> kBudget = {"BudgetWarning", "BudgetHold", "BudgetAvailable"};
  if (kState.count(type)) return "state";
  if (kGuardrail.count(type)) return "guardrail";
  if (kBudget.count(type)) return "budget";
  return "";
}

std::string Webhooks::Body(const store::EventInScope& e) {
  return JsonText(nlohmann::json{
      {"id", fmt::format("{}", e.event.id)},
      {"kind", KindOf(e.event.type)},
      {"type", e.event.type},
      {"time", FormatRfc3339(e.event.ts_ms)},
      {"message", e.event.message},
      {"data", e.event.data},
      {"run", {{"name", e.event.run}, {"workspace", e.workspace}, {"owner", e.owner}}}});
}

std::string Webhooks::Signature(const std::string& secret, int64_t seconds,
                                const std::string& body) {
  return fmt::format("t={},v1={}", seconds,
                     HmacSha256Hex(secret, fmt::format("{}.{}", seconds, body)));
}

void Webhooks::Work() {
  int64_t next_route = 0;
  while (true) {
    if (MonotonicMillis() >= next_route) {
      Route();
      next_route = MonotonicMillis() + options_.poll_ms;
    }
    Dispatch();
    MutexLock lock(&mu_);
    // Woken early when a delivery leaves the outbox: the next of its URL goes at once.
    const int64_t wait = std::max<int64_t>(0, next_route - MonotonicMillis());
    cv_.WaitFor(&mu_, std::chrono::milliseconds(wait),
                [&]() TAU_REQUIRES(mu_) { return stop_ || settled_; });
    if (stop_) return;
    settled_ = false;
  }
}

void Webhooks::Route() {
  if (!cursor_) {
    auto stored = store_->DeliveryCursor();
    if (!stored.ok()) return;
    cursor_ = *stored;
  }
  auto events = store_->ListEventsAfter(*cursor_, kRouteBatch);
  if (!events.ok()) {
    if (events.status().ToString() != last_error_)
      std::fprintf(stderr, "tau server: webhooks: %s (trying again)\n",
                   events.status().ToString().c_str());
    last_error_ = events.status().ToString();
    return;
  }
  if (events->empty()) return;
  std::shared_ptr<const policy::Platform> platform = platform_();
  const int64_t now = clock_->NowMillis();
  std::vector<store::Delivery> add;
  for (const store::EventInScope& e : *events) {
    const policy::Workspace* w = platform ? platform->FindWorkspace(e.workspace) : nullptr;
    if ((!w || w->webhooks.empty()) && e.run_webhooks.empty()) continue;
    const std::string kind = KindOf(e.event.type);
    if (kind.empty()) continue;
    std::string body;
    std::set<std::string> urls;  // a URL both the workspace and the run name gets the event once
    auto route = [&](const std::string& url, const std::string& secret, bool takes_kind) {
      if (!takes_kind || url.empty() || !urls.insert(url).second) return;
      if (body.empty()) body = Body(e);
      store::Delivery d;
      d.workspace = e.workspace;
      d.url = url;
      d.secret = secret;
      d.event_id = e.event.id;
      d.body = body;
      d.created_ms = d.next_ms = now;
      add.push_back(std::move(d));
    };
    if (w)
      for (const policy::Webhook& hook : w->webhooks)
        route(hook.url, hook.secret,
              std::find(hook.events.begin(), hook.events.end(), kind) != hook.events.end());
    for (const nlohmann::json& hook : e.run_webhooks)
      route(JsonString(hook, "url"), JsonString(hook, "secret"), RunHookTakes(hook, kind));
  }
  const int64_t last = events->back().event.id;
  if (add.empty() && now - cursor_persisted_ms_ < kCursorPersistMs) {
    cursor_ = last;  // nothing to send: no write to the store for it
    return;
  }
  int64_t dropped = 0;
  Status s = store_->QueueDeliveries(add, last, options_.max_per_url, &dropped);
  if (!s.ok()) {
    if (s.ToString() != last_error_)
      std::fprintf(stderr, "tau server: webhooks: %s (trying again)\n", s.ToString().c_str());
    last_error_ = s.ToString();
    return;  // the events are routed again on the next poll
  }
  last_error_.clear();
  cursor_ = last;
  cursor_persisted_ms_ = now;
  if (dropped > 0) {
    std::fprintf(
        stderr,
        "tau server: webhooks: %lld deliveries dropped: a receiver's queue is full (%lld)\n",
        static_cast<long long>(dropped), static_cast<long long>(options_.max_per_url));
    metrics_->Count("tau_webhook_deliveries_total", {{"workspace", ""}, {"result", "dropped"}},
                    static_cast<double>(dropped));
  }
}

void Webhooks::Dispatch() {
  // The store is read under mu_: a sender clears its receiver's mark only after the store has its
  // try's outcome, so a head read here while its receiver is free is never one already tried.
  MutexLock lock(&mu_);
  if (stop_) return;
  auto due = store_->DueDeliveries(clock_->NowMillis());
  if (!due.ok()) return;
  for (store::Delivery& d : *due) {
    std::string receiver = ReceiverOf(d.url);
    if (!busy_.insert(receiver).second) continue;  // its try in flight; this URL's turn comes
    jobs_.push_back({std::move(d), std::move(receiver)});
    if (idle_senders_ < jobs_.size() && senders_.size() < std::max<size_t>(1, options_.max_senders))
      senders_.emplace_back([this] { Send(); });
    jobs_cv_.Signal();
  }
}

void Webhooks::Send() {
  while (true) {
    Job job;
    {
      MutexLock lock(&mu_);
      ++idle_senders_;
      jobs_cv_.Wait(&mu_, [&]() TAU_REQUIRES(mu_) { return stop_ || !jobs_.empty(); });
      --idle_senders_;
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const bool left = Try(job.delivery);
    MutexLock lock(&mu_);
    busy_.erase(job.receiver);
    if (left) {
      settled_ = true;
      cv_.SignalAll();
    }
  }
}

bool Webhooks::Try(const store::Delivery& d) {
  if (clock_->NowMillis() - d.created_ms > options_.give_up_after_ms) {
    std::fprintf(stderr, "tau server: webhooks: gave up on event %lld for %s after %d tries: %s\n",
                 static_cast<long long>(d.event_id), d.url.c_str(), d.attempts,
                 d.last_error.c_str());
    (void)store_->DeleteDelivery(d.id);
    metrics_->Count("tau_webhook_deliveries_total",
                    {{"workspace", d.workspace}, {"result", "dropped"}});
    return true;
  }
  auto values = store_->SecretValues(d.workspace);
  const std::string* secret = nullptr;
  if (values.ok())
    if (auto it = values->find(d.secret); it != values->end()) secret = &it->second;
  std::string error =
      secret ? Post(d, *secret)
             : fmt::format("the secret '{}' is not set in workspace '{}' (tau secret set)",
                           d.secret, d.workspace);
  if (error.empty()) {
    (void)store_->DeleteDelivery(d.id);
    metrics_->Count("tau_webhook_deliveries_total",
                    {{"workspace", d.workspace}, {"result", "delivered"}});
    return true;
  }
  const int attempts = d.attempts + 1;
  const int64_t backoff =
      std::min(options_.backoff_max_ms, options_.backoff_initial_ms << std::min(attempts - 1, 20));
  if (d.attempts == 0)  // said once per delivery; the rest are counted
    std::fprintf(stderr, "tau server: webhooks: %s: %s (trying again)\n", d.url.c_str(),
                 error.c_str());
  (void)store_->PostponeDelivery(d.id, attempts, clock_->NowMillis() + backoff, error);
  metrics_->Count("tau_webhook_deliveries_total",
                  {{"workspace", d.workspace}, {"result", "failed"}});
  return false;
}

std::string Webhooks::Post(const store::Delivery& d, const std::string& secret) {
  auto target = ParseTarget(d.url);
  if (!target.ok()) return target.status().message();
  // The whole try within timeout_ms, and a few KiB of the answer at most: only its status counts.
  client::Limits limits;
  limits.deadline_ms = options_.timeout_ms;
  limits.max_response_bytes = options_.max_answer_bytes;
  auto conn = client::Connection::Open(target->endpoint, client::TlsOptions{}, limits,
                                       static_cast<int>(options_.timeout_ms));
  if (!conn.ok()) return conn.status().message();
  const int64_t seconds = clock_->NowMillis() / 1000;
  const auto kind = nlohmann::json::parse(d.body, nullptr, false);
  client::Headers headers = {{"X-Tau-Delivery", fmt::format("{}", d.event_id)},
                             {"X-Tau-Event", kind.is_object() ? kind.value("type", "") : ""},
                             {"X-Tau-Signature", Signature(secret, seconds, d.body)}};
  auto res = (*conn)->Call("POST", target->path, d.body, "application/json", headers);
  if (!res.ok()) return res.status().message();
  if (res->status < 200 || res->status > 299) return fmt::format("HTTP {}", res->status);
  return "";
}

}  // namespace tau::server
