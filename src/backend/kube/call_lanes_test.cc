#include "backend/kube/call_lanes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "kubeapi/kubeapi.h"

namespace tau::server {
namespace {

// Waits up to 10 s for `done`.
bool Eventually(const std::function<bool()>& done) {
  int64_t deadline = MonotonicMillis() + 10'000;
  while (!done() && MonotonicMillis() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return done();
}

TEST(CallLanesTest, AHeldCallHoldsUpItsOwnLaneOnly) {
  CallLanes lanes({});
  std::atomic<bool> release{false}, held_done{false}, after_held{false}, other_done{false};
  lanes.Submit(
      "team-a",
      [&] {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return Status::Ok();
      },
      [&](const Status&) { held_done = true; });
  lanes.Submit(
      "team-a", [] { return Status::Ok(); }, [&](const Status&) { after_held = true; });
  lanes.Submit(
      "team-b", [] { return Status::Ok(); }, [&](const Status&) { other_done = true; });
  ASSERT_TRUE(Eventually([&] { return other_done.load(); }));
  // Its own lane keeps its order: the call behind the held one waits for it.
  EXPECT_FALSE(held_done);
  EXPECT_FALSE(after_held);
  EXPECT_EQ(lanes.Pending("team-a"), 2u);
  release = true;
  ASSERT_TRUE(Eventually([&] { return after_held.load(); }));
  EXPECT_TRUE(held_done);
}

TEST(CallLanesTest, CallsOfALaneRunInOrderUnderTheirBudget) {
  CallLanes::Options options;
  options.budget_ms = 5000;
  CallLanes lanes(options);
  Mutex mu;
  std::vector<int> order;
  std::atomic<int> done{0};
  std::atomic<int64_t> left{0};
  for (int i = 0; i < 20; ++i)
    lanes.Submit(
        "ns",
        [&, i] {
          MutexLock lock(&mu);
          order.push_back(i);
          left = kubeapi::CallBudget::Deadline() - MonotonicMillis();
          return Status::Ok();
        },
        [&](const Status&) { ++done; });
  ASSERT_TRUE(Eventually([&] { return done == 20; }));
  MutexLock lock(&mu);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
  EXPECT_GT(left, 0);
  EXPECT_LE(left, 5000);
  EXPECT_EQ(kubeapi::CallBudget::Deadline(), 0) << "no budget outside a lane's call";
}

TEST(CallLanesTest, ALaneThatKeepsFailingOpensItsBreakerForAWhile) {
  std::atomic<int64_t> now{1'000'000};
  CallLanes::Options options;
  options.breaker_failures = 3;
  options.breaker_open_ms = 30'000;
  options.now = [&] { return now.load(); };
  CallLanes lanes(options);
  std::atomic<int> calls{0}, results{0};
  Mutex mu;
  std::vector<Status> seen;
  auto submit = [&](StatusCode code) {
    lanes.Submit(
        "ns",
        [&, code] {
          ++calls;
          return code == StatusCode::kOk ? Status::Ok() : Status(code, "the API server is away");
        },
        [&](const Status& s) {
          MutexLock lock(&mu);
          seen.push_back(s);
          ++results;
        });
  };
  // A refusal (not the cluster's health) does not count.
  submit(StatusCode::kPermissionDenied);
  for (int i = 0; i < 3; ++i) submit(StatusCode::kUnavailable);
  submit(StatusCode::kOk);  // not tried: the breaker is open
  ASSERT_TRUE(Eventually([&] { return results == 5; }));
  EXPECT_EQ(calls, 4);
  {
    MutexLock lock(&mu);
    EXPECT_EQ(seen[4].code(), StatusCode::kUnavailable);
    EXPECT_NE(seen[4].message().find("not tried"), std::string::npos) << seen[4].message();
    EXPECT_NE(seen[4].message().find("30s"), std::string::npos) << seen[4].message();
  }
  // Another namespace is not affected.
  std::atomic<bool> other{false};
  lanes.Submit(
      "other", [] { return Status::Ok(); }, [&](const Status& s) { other = s.ok(); });
  ASSERT_TRUE(Eventually([&] { return other.load(); }));
  // After the pause, the next call is tried, and a success closes the breaker.
  now += 30'001;
  submit(StatusCode::kOk);
  submit(StatusCode::kOk);
  ASSERT_TRUE(Eventually([&] { return results == 7; }));
  EXPECT_EQ(calls, 6);
  MutexLock lock(&mu);
  EXPECT_TRUE(seen[5].ok());
  EXPECT_TRUE(seen[6].ok());
}

TEST(CallLanesTest, StopAbandonsTheCallInProgressAndAnswersTheQueuedOnes) {
  CallLanes lanes({});
  std::atomic<bool> started{false}, saw_stop{false};
  std::atomic<int> unavailable{0};
  lanes.Submit(
      "ns",
      [&] {
        started = true;
        const std::atomic<bool>* stop = kubeapi::CallBudget::Stop();
        while (stop != nullptr && !stop->load())
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        saw_stop = stop != nullptr;
        return Unavailable("abandoned");
      },
      [&](const Status& s) { unavailable += s.code() == StatusCode::kUnavailable; });
  lanes.Submit(
      "ns", [] { return Status::Ok(); },
      [&](const Status& s) { unavailable += s.code() == StatusCode::kUnavailable; });
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  lanes.Stop();
  EXPECT_TRUE(saw_stop);
  EXPECT_EQ(unavailable, 2);
  // After Stop, a call is answered at once, not made.
  bool made = false;
  Status late;
  lanes.Submit(
      "ns",
      [&] {
        made = true;
        return Status::Ok();
      },
      [&](const Status& s) { late = s; });
  EXPECT_FALSE(made);
  EXPECT_EQ(late.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tau::server
