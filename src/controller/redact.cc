#include "controller/redact.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tau::server {

Status RedactFile(const std::string& path, const std::vector<std::string>& secrets) {
  Redactor redactor(secrets);
  if (redactor.empty()) return Status::Ok();
  int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (in < 0) return errno == ENOENT ? Status::Ok() : IoError("opening " + path, errno);
  std::string tmp = path + ".redacting";
  int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(in);
    return IoError("creating " + tmp, errno);
  }
  bool changed = false;
  Status status = Status::Ok();
  auto write_all = [&](const std::string& data) {
    for (size_t done = 0; done < data.size() && status.ok();) {
      ssize_t n = ::write(out, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        status = IoError("writing " + tmp, errno);
      else
        done += static_cast<size_t>(n);
    }
  };
  std::string buf(1 << 20, '\0');
  for (;;) {
    ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = IoError("reading " + path, errno);
      break;
    }
    std::string masked = redactor.Feed(std::string_view(buf.data(), static_cast<size_t>(n)),
                                       /*flush=*/n == 0);
    write_all(masked);
    if (n == 0 || !status.ok()) break;
  }
  changed = redactor.masked_any();
  ::close(in);
  if (status.ok() && ::fsync(out) != 0) status = IoError("syncing " + tmp, errno);
  ::close(out);
  if (status.ok() && changed && ::rename(tmp.c_str(), path.c_str()) != 0)
    status = IoError("replacing " + path, errno);
  if (!status.ok() || !changed) ::unlink(tmp.c_str());
  return status;
}

namespace {

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
