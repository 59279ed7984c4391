#include "controller/redact.h"

namespace tau::server {

namespace {

std::vector<std::string> SecretKeysOf(const nlohmann::json& spec_json) {
  std::vector<std::string> keys;
  const nlohmann::json* runtime =
      spec_json.is_object() && spec_json.contains("runtime") ? &spec_json["runtime"] : nullptr;
  if (runtime == nullptr || !runtime->is_object() || !runtime->contains("env")) return keys;
  const nlohmann::json& env = (*runtime)["env"];
  if (!env.is_object()) return keys;
  for (const auto& [name, value] : env.items())
    if (value.is_object() && value.contains("secret_ref") && value["secret_ref"].is_string()) {
      // runtime.env_secret's NAME:KEY is kept in tau's store as NAME.KEY (spec::SecretStoreKey).
      std::string key = value["secret_ref"].get<std::string>();
      if (value.contains("secret_name") && value["secret_name"].is_string())
        key = value["secret_name"].get<std::string>() + "." + key;
      keys.push_back(std::move(key));
    }
  return keys;
}

}  // namespace

Result<std::vector<std::string>> SecretValuesOf(store::Store* store, const store::RunRecord& run) {
  std::vector<std::string> secrets;
  std::vector<std::string> keys = SecretKeysOf(run.spec_json);
  if (keys.empty()) return secrets;
  TAU_ASSIGN_OR_RETURN(auto values, store->SecretValues(run.workspace));
  for (const std::string& k : keys)
    if (auto it = values.find(k); it != values.end()) secrets.push_back(it->second);
  return secrets;
}

}  // namespace tau::server
