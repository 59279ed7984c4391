// Wall-clock time as used in records: milliseconds since the Unix epoch, printed as RFC 3339 UTC.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tau {

int64_t NowMillis();

// Where a component that decides by time reads it: the real clock in the server, a fake one in
// tests (LevelDB's Env, Kueue's injected clock), so that backoffs and deadlines are tested without
// sleeping.
class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch, as NowMillis().
  virtual int64_t NowMillis() = 0;
  // Monotonic milliseconds, as MonotonicMillis(): for periods, deadlines and ages that must not
  // jump with the wall clock.
  virtual int64_t MonotonicMillis() = 0;
};
// The real clock (one for the process; never deleted).
Clock* SystemClock();

// Monotonic milliseconds, for timeouts and latencies.
int64_t MonotonicMillis();
// "2026-11-30T14:05:09.123Z"
std::string FormatRfc3339(int64_t epoch_ms);
Result<int64_t> ParseRfc3339(std::string_view text);
// Go-style durations: "30s", "5m", "1h30m", "250ms".
Result<int64_t> ParseDurationMillis(std::string_view text);
std::string FormatDuration(int64_t ms);  // "1h2m3s", "850ms"

}  // namespace tau
