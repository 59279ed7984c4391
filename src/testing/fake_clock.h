// A clock that tests move by hand: the controller's backoffs and stop deadlines are reached by
// advancing it, never by sleeping.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/clock.h"

namespace tau::testutil {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'800'000'000'000) : now_ms_(start_ms) {}
  int64_t NowMillis() override { return now_ms_.load(); }
  // The same hand-moved time: what waits a period waits for Advance.
  int64_t MonotonicMillis() override { return now_ms_.load(); }
  void Advance(int64_t ms) { now_ms_ += ms; }
  void Set(int64_t ms) { now_ms_ = ms; }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace tau::testutil
