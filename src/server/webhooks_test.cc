// Webhooks' senders against real receivers on 127.0.0.1, deliveries put in a real store's outbox:
// a receiver that trickles its answer holds up only its own queue, and only for one try's
// deadline; another receiver's deliveries go meanwhile, in order.
#include "server/webhooks.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/mutex.h"

namespace tau::server {
namespace {

// A receiver that takes connections one after another: `trickle` answers with a status line and
// then a byte every 50 ms for 10 s (never a whole answer); otherwise 204 at once. It notes each
// request's X-Tau-Delivery, and when each connection began and the server left it.
class Receiver {
 public:
  explicit Receiver(bool trickle) : trickle_(trickle) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Receiver() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/hook"; }
  std::vector<std::string> deliveries() {
    MutexLock lock(&mu_);
    return deliveries_;
  }
  // (began, left) in monotonic ms of each connection the server has left.
  std::vector<std::pair<int64_t, int64_t>> tries() {
    MutexLock lock(&mu_);
    return tries_;
  }

 private:
  void Serve() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      const int64_t began = MonotonicMillis();
      std::string got;
      char buf[4096];
      while (got.find("\r\n\r\n") == std::string::npos ||
             got.size() < got.find("\r\n\r\n") + 4 + Length(got)) {
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      size_t at = got.find("X-Tau-Delivery: ");
      {
        MutexLock lock(&mu_);
        deliveries_.push_back(
            at == std::string::npos ? "" : got.substr(at + 16, got.find("\r\n", at) - at - 16));
      }
      if (trickle_) {
        bool open = Send(c, "HTTP/1.1 200 OK\r\nX-Slow: ");
        for (int i = 0; open && !stop_ && i < 200; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          open = Send(c, "z");
        }
      } else {
        Send(c, "HTTP/1.1 204 No Content\r\n\r\n");
        ::shutdown(c, SHUT_WR);
        while (::read(c, buf, sizeof buf) > 0) {  // until the server closes its end
        }
      }
      ::close(c);
      MutexLock lock(&mu_);
      tries_.emplace_back(began, MonotonicMillis());
    }
  }
  static size_t Length(const std::string& head) {
    size_t at = head.find("Content-Length: ");
    return at == std::string::npos ? 0 : std::stoul(head.substr(at + 16));
  }
  static bool Send(int fd, std::string_view data) {
    return ::send(fd, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }

  const bool trickle_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Mutex mu_;
  std::vector<std::string> deliveries_ TAU_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> tries_ TAU_GUARDED_BY(mu_);
};

class WebhooksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tau_webhooks_test_" + std::to_string(::getpid());
    ASSERT_TRUE(RemoveTree(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    auto s = store::Store::Open(dir_ + "/tau.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    for (const char* workspace : {"slow", "fast"}) {
      store::SecretInfo info;
      info.workspace = workspace;
      info.key = "hook-key";
      ASSERT_TRUE(store_->PutSecret(info, "s3cret").ok());
    }
  }
  void TearDown() override {
    store_.reset();
    (void)RemoveTree(dir_);
  }
  store::Delivery Delivery(const std::string& workspace, const std::string& url, int64_t event) {
    store::Delivery d;
    d.workspace = workspace;
    d.url = url;
    d.secret = "hook-key";
    d.event_id = event;
    d.body = "{\"type\": \"Queued\"}";
    d.created_ms = d.next_ms = NowMillis();
    return d;
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  Metrics metrics_;
};

TEST_F(WebhooksTest, ATricklingReceiverHoldsUpOnlyItsOwnQueueAndOnlyForTheDeadline) {
  Receiver slow(/*trickle=*/true), fast(/*trickle=*/false);
  int64_t dropped = 0;
  // The slow receiver's delivery first: one sender would be stuck behind it.
  ASSERT_TRUE(
      store_
          ->QueueDeliveries({Delivery("slow", slow.url(), 1), Delivery("fast", fast.url(), 2),
                             Delivery("fast", fast.url(), 3), Delivery("fast", fast.url(), 4)},
                            *store_->DeliveryCursor(), 100, &dropped)
          .ok());
  Webhooks::Options options;
  options.poll_ms = 20;
  options.timeout_ms = 1000;
  options.backoff_initial_ms = 60'000;  // one try of the slow one in this test
  Webhooks webhooks(
      options, store_.get(), [] { return nullptr; }, &metrics_);
  const int64_t start = MonotonicMillis();
  webhooks.Start();
  // The fast receiver's three, in order, while the slow one's try is still trickling.
  while (fast.deliveries().size() < 3 && MonotonicMillis() - start < 10'000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(fast.deliveries(), (std::vector<std::string>{"2", "3", "4"}));
  EXPECT_EQ(slow.deliveries().size(), 1u);
  EXPECT_TRUE(slow.tries().empty()) << "the slow try ended before the fast ones were taken";
  // The slow try ends at its deadline, though a byte came every 50 ms, and waits its backoff.
  while (slow.tries().empty() && MonotonicMillis() - start < 10'000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(slow.tries().size(), 1u);
  const int64_t took = slow.tries()[0].second - slow.tries()[0].first;
  EXPECT_GE(took, 900);
  EXPECT_LT(took, 3000);  // it trickles for 10 s
  const int64_t stopping = MonotonicMillis();
  webhooks.Stop();
  EXPECT_LT(MonotonicMillis() - stopping, 1500);
  auto left = store_->DueDeliveries(NowMillis() + 120'000);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].url, slow.url());
  EXPECT_EQ((*left)[0].attempts, 1);
  EXPECT_NE((*left)[0].last_error.find("no full answer from http://127.0.0.1:"), std::string::npos)
      << (*left)[0].last_error;
}

}  // namespace
}  // namespace tau::server
