// Retention: the policy saying when ended runs' bulky artifacts (logs, GPU samples) are pruned
// (Store::ListRetentionDue says which are due). The record, with the
// size and sha256 of every pruned log, the metric history, the checkpoint index and the event chain
// are never pruned here: they are the evidence.
#include <fmt/format.h>

#include "common/clock.h"
#include "common/strings.h"
#include "evidence/evidence.h"

namespace tau::evidence {

Result<RetentionPolicy> ParseRetentionPolicy(std::string_view text) {
  RetentionPolicy policy;
  if (text.empty()) return policy;
  for (const std::string& part : Split(text, ',')) {
    size_t eq = part.find('=');
    if (eq == std::string::npos)
      return InvalidArgument(
          fmt::format("retention '{}': expected KEY=DURATION, e.g. logs=30d,samples=7d", part));
    std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    int64_t ms = 0;
    if (value != "forever" && value != "0") {
      auto parsed = ParseDurationMillis(value);
      if (!parsed.ok()) return parsed.status().WithContext("retention " + key);
      if (*parsed <= 0) return InvalidArgument("retention " + key + " must be positive");
      ms = *parsed;
    }
    if (key == "logs") {
      policy.keep_logs_ms = ms;
    } else if (key == "samples") {
      policy.keep_samples_ms = ms;
    } else {
      return InvalidArgument(
          fmt::format("retention: unknown key '{}' (known: logs, samples)", key));
    }
  }
  return policy;
}

}  // namespace tau::evidence
