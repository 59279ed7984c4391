#include "backend/backend.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "common/strings.h"
#include "recovery/recovery.h"

namespace tau::server {

std::string PreviousAttemptReason(store::Store* store, const std::string& run, int attempt) {
  auto attempts = store->ListAttempts(run);
  if (!attempts.ok()) return "";
  for (const store::AttemptRecord& a : *attempts)
    if (a.number == attempt - 1) return a.reason;
  return "";
}

nlohmann::json AssignmentJson(const admission::FlavorAssignment& a) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [podset, resources] : a) out[podset] = resources;
  return out;
}

admission::FlavorAssignment AssignmentFromJson(const nlohmann::json& j) {
  admission::FlavorAssignment out;
  if (!j.is_object()) return out;
  for (const auto& [podset, resources] : j.items()) {
    if (!resources.is_object()) continue;
    for (const auto& [resource, flavor] : resources.items())
      if (flavor.is_string()) out[podset][resource] = flavor.get<std::string>();
  }
  return out;
}

std::string FlavorsText(const admission::FlavorAssignment& a) {
  std::vector<std::string> parts;
  for (const auto& [podset, resources] : a)
    for (const auto& [resource, flavor] : resources)
      parts.push_back(fmt::format("{} on {}", resource, flavor));
  return parts.empty() ? "no quota needed" : Join(parts, ", ");
}

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

int64_t WrittenBytes(const std::string& attempt_dir, const std::string& metrics_file) {
  std::error_code ec;
  int64_t bytes = 0;
  // increment(ec), not ++: a log removed while it is listed must not throw on the decision thread.
  for (std::filesystem::directory_iterator it(attempt_dir + "/logs", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const auto size = it->file_size(size_ec);
      if (!size_ec) bytes += static_cast<int64_t>(size);
    }
  }
  const auto metrics = std::filesystem::file_size(metrics_file, ec);
  if (!ec) bytes += static_cast<int64_t>(metrics);
  return bytes;
}

}  // namespace tau::server
