#include "cli/digest_cache.h"

#include <cstdlib>
#include <ctime>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/hash.h"
#include "common/json_text.h"

namespace tau::cli {
namespace {

int64_t CtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
}

std::string CacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg == '/')
    return std::string(xdg) + "/tau/code-digests";
  if (const char* home = std::getenv("HOME"); home && *home == '/')
    return std::string(home) + "/.cache/tau/code-digests";
  return "";
}

}  // namespace

DigestCache DigestCache::Open(const std::string& root) {
  DigestCache cache;
  cache.root_ = root;
  const std::string dir = CacheDir();
  if (dir.empty()) return cache;
  cache.file_ = dir + "/" + Sha256Hex(root).substr(0, 32) + ".json";
  auto text = ReadFile(cache.file_);
  if (!text.ok()) return cache;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  // The root is inside, so a (vanishingly unlikely) clash of names is a miss, not a lie.
  if (!j.is_object() || j.value("version", 0) != 1 || j.value("root", "") != root ||
      !j.contains("files") || !j["files"].is_object())
    return cache;
  for (const auto& [path, e] : j["files"].items()) {
    if (!e.is_array() || e.size() != 5 || !e[0].is_number_unsigned() ||
        !e[1].is_number_unsigned() || !e[2].is_number_integer() || !e[3].is_number_integer() ||
        !e[4].is_string())
      continue;
    cache.known_[path] = {e[0].get<uint64_t>(), e[1].get<uint64_t>(), e[2].get<int64_t>(),
                          e[3].get<int64_t>(), e[4].get<std::string>()};
  }
  return cache;
}

std::string DigestCache::Find(const std::string& path, const struct stat& st) const {
  auto it = known_.find(path);
  if (it == known_.end()) return "";
  const Entry& e = it->second;
  if (e.dev != static_cast<uint64_t>(st.st_dev) || e.ino != static_cast<uint64_t>(st.st_ino) ||
      e.size != static_cast<int64_t>(st.st_size) || e.ctime_ns != CtimeNs(st))
    return "";
  used_[path] = e;
  return e.sha256;
}

void DigestCache::Record(const std::string& path, const struct stat& st,
                         const std::string& sha256) {
  if (file_.empty()) return;
  if (static_cast<int64_t>(st.st_ctim.tv_sec) > std::time(nullptr) - kSettledSeconds) return;
  used_[path] = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                 static_cast<int64_t>(st.st_size), CtimeNs(st), sha256};
  recorded_ = true;
}

void DigestCache::Save() const {
  if (file_.empty() || used_.empty()) return;
  // Every entry used was found as the file holds it, and none is left out: nothing to write.
  if (!recorded_ && used_.size() == known_.size()) return;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [path, e] : used_)
    files[path] = nlohmann::json::array({e.dev, e.ino, e.size, e.ctime_ns, e.sha256});
  const std::string dir = file_.substr(0, file_.rfind('/'));
  if (!MakeDirs(dir).ok()) return;
  (void)WriteFileAtomic(file_, JsonText({{"version", 1}, {"root", root_}, {"files", files}}), 0600,
                        Durability::kProcessCrash);
}

}  // namespace tau::cli
