#include "server/backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/files.h"
#include "recovery/recovery.h"

namespace tau::server {

namespace {

// The last bytes of each rank's log of an attempt, for diagnosis.
std::vector<std::string> LogTails(const std::string& attempt_dir, size_t ranks) {
  constexpr size_t kTailBytes = 64 * 1024;
  std::vector<std::string> tails;
  for (size_t r = 0; r < std::max<size_t>(ranks, 1); ++r) {
    auto text = ReadFile(fmt::format("{}/logs/rank-{}.log", attempt_dir, r));
    std::string t = text.ok() ? std::move(*text) : "";
    if (t.size() > kTailBytes) t = t.substr(t.size() - kTailBytes);
    tails.push_back(std::move(t));
  }
  return tails;
}

}  // namespace

nlohmann::json PendingEntry(int position, const std::string& queue, const std::string& code,
                            const std::string& reason, const std::string& detail) {
  nlohmann::json j = {{"position", position > 0 ? nlohmann::json(position) : nullptr},
                      {"queue", queue},
                      {"code", code},
                      {"reason", reason}};
  if (!detail.empty()) j["detail"] = detail;
  return j;
}

nlohmann::json AttemptDiagnosis(const std::string& attempt_dir, size_t ranks,
                                const std::string& phase) {
  recovery::Diagnosis d = recovery::Diagnose(LogTails(attempt_dir, ranks));
  nlohmann::json evidence = nlohmann::json::array();
  for (const auto& e : d.evidence)
    evidence.push_back({{"signature", e.signature}, {"rank", e.rank}, {"line", e.line}});
  return {{"summary", d.summary}, {"phase", phase}, {"evidence", evidence}};
}

}  // namespace tau::server
