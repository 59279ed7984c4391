// Retention: which ended runs' bulky artifacts (logs, GPU samples) to prune. The record, with the
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

std::vector<PruneAction> PlanRetention(const std::vector<RunRetentionInput>& runs,
                                       const RetentionPolicy& policy, int64_t now_ms) {
  std::vector<PruneAction> out;
  for (const RunRetentionInput& r : runs) {
    if (!r.terminal || !r.finished_ms) continue;  // a live run's files are still being written
    int64_t age = now_ms - *r.finished_ms;
    if (policy.keep_logs_ms > 0 && age >= policy.keep_logs_ms && !r.state.logs_pruned_ms)
      out.push_back({r.name, PruneWhat::kLogs});
    if (policy.keep_samples_ms > 0 && age >= policy.keep_samples_ms && !r.state.samples_pruned_ms)
      out.push_back({r.name, PruneWhat::kGpuSamples});
  }
  return out;
}

}  // namespace tau::evidence
