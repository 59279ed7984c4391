#include "common/clock.h"

#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <ctime>

namespace tau {

int64_t NowMillis() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

Clock* SystemClock() {
  class System final : public Clock {
   public:
    int64_t NowMillis() override { return tau::NowMillis(); }
    int64_t MonotonicMillis() override { return tau::MonotonicMillis(); }
  };
  static System* const clock = new System;
  return clock;
}

int64_t MonotonicMillis() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

std::string FormatRfc3339(int64_t epoch_ms) {
  time_t secs = static_cast<time_t>(epoch_ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, epoch_ms % 1000);
}

Result<int64_t> ParseRfc3339(std::string_view text) {
  // YYYY-MM-DDTHH:MM:SS[.fff][Z|+HH:MM|-HH:MM]
  auto bad = [&] {
    return InvalidArgument(
        fmt::format("invalid timestamp '{}': expected RFC 3339, e.g. 2026-01-02T15:04:05Z", text));
  };
  auto num = [&](size_t pos, size_t len, int* out) {
    if (pos + len > text.size()) return false;
    int v = 0;
    for (size_t i = pos; i < pos + len; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
      v = v * 10 + (text[i] - '0');
    }
    *out = v;
    return true;
  };
  struct tm tm = {};
  int year, mon, day, hour, min, sec;
  if (!num(0, 4, &year) || text.size() < 19 || text[4] != '-' || !num(5, 2, &mon) ||
      text[7] != '-' || !num(8, 2, &day) ||
      (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || !num(11, 2, &hour) ||
      text[13] != ':' || !num(14, 2, &min) || text[16] != ':' || !num(17, 2, &sec))
    return bad();
  if (mon < 1 || mon > 12 || day < 1 || day > 31 || hour > 23 || min > 59 || sec > 60) return bad();
  size_t pos = 19;
  int millis = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
      if (digits < 3) millis = millis * 10 + (text[pos] - '0');
      ++digits;
      ++pos;
    }
    if (digits == 0) return bad();
    for (int d = digits; d < 3; ++d) millis *= 10;
  }
  int offset_minutes = 0;
  if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    ++pos;
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    int oh, om;
    if (!num(pos + 1, 2, &oh) || pos + 3 >= text.size() || text[pos + 3] != ':' ||
        !num(pos + 4, 2, &om))
      return bad();
    offset_minutes = (oh * 60 + om) * (text[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return bad();
  }
  if (pos != text.size()) return bad();
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  int64_t secs = static_cast<int64_t>(timegm(&tm)) - offset_minutes * 60;
  return secs * 1000 + millis;
}

Result<int64_t> ParseDurationMillis(std::string_view text) {
  auto bad = [&] {
    return InvalidArgument(
        fmt::format("invalid duration '{}': expected e.g. 30s, 5m, 1h30m, 250ms", text));
  };
  if (text.empty()) return bad();
  int64_t total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    double value = 0;
    double scale = 0;
    while (i < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
      if (text[i] == '.') {
        if (scale != 0) return bad();
        scale = 0.1;
      } else if (scale == 0) {
        value = value * 10 + (text[i] - '0');
      } else {
        value += (text[i] - '0') * scale;
        scale /= 10;
      }
      ++i;
    }
    if (i == start) return bad();
    size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    std::string_view unit = text.substr(unit_start, i - unit_start);
    double ms;
    if (unit == "ms")
      ms = value;
    else if (unit == "s")
      ms = value * 1000;
    else if (unit == "m")
      ms = value * 60000;
    else if (unit == "h")
      ms = value * 3600000;
    else if (unit == "d")
      ms = value * 86400000;
    else
      return bad();
    if (ms > 1e15) return bad();
    total += static_cast<int64_t>(ms + 0.5);
  }
  return total;
}

std::string FormatDuration(int64_t ms) {
  if (ms < 1000) return fmt::format("{}ms", ms);
  int64_t s = ms / 1000;
  if (s < 60) return fmt::format("{:.1f}s", ms / 1000.0);
  int64_t h = s / 3600, m = (s % 3600) / 60;
  s %= 60;
  // Zero parts left out ("168h", "1h30m", "10m"): still a duration ParseDurationMillis reads.
  std::string out;
  if (h > 0) out += fmt::format("{}h", h);
  if (m > 0) out += fmt::format("{}m", m);
  if (s > 0) out += fmt::format("{}s", s);
  return out;
}

}  // namespace tau
