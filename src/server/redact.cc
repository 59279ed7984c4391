#include "server/redact.h"

#include <algorithm>

namespace tau::server {

Redactor::Redactor(std::vector<std::string> secrets) {
  for (std::string& s : secrets)
    if (s.size() >= kMinSecretBytes) secrets_.push_back(std::move(s));
  std::sort(secrets_.begin(), secrets_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  secrets_.erase(std::unique(secrets_.begin(), secrets_.end()), secrets_.end());
  if (!secrets_.empty()) hold_ = secrets_.front().size() - 1;
}

std::string Redactor::Feed(std::string_view data, bool flush) {
  if (secrets_.empty()) return std::string(data);
  pending_.append(data);
  for (const std::string& secret : secrets_) {
    for (size_t at = pending_.find(secret); at != std::string::npos;
         at = pending_.find(secret, at + 3))
      pending_.replace(at, secret.size(), "***");
  }
  size_t release = flush ? pending_.size() : pending_.size() - std::min(pending_.size(), hold_);
  std::string out = pending_.substr(0, release);
  pending_.erase(0, release);
  return out;
}

std::vector<std::string> SecretKeysOf(const nlohmann::json& spec_json) {
  std::vector<std::string> keys;
  const nlohmann::json* runtime =
      spec_json.is_object() && spec_json.contains("runtime") ? &spec_json["runtime"] : nullptr;
  if (runtime == nullptr || !runtime->is_object() || !runtime->contains("env")) return keys;
  const nlohmann::json& env = (*runtime)["env"];
  if (!env.is_object()) return keys;
  for (const auto& [name, value] : env.items())
    if (value.is_object() && value.contains("secret_ref") && value["secret_ref"].is_string())
      keys.push_back(value["secret_ref"].get<std::string>());
  return keys;
}

}  // namespace tau::server
