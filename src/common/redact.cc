#include "common/redact.h"

#include <algorithm>

namespace tau {

Redactor::Redactor(std::vector<std::string> secrets) {
  for (std::string& s : secrets)
    if (s.size() >= kMinSecretBytes) secrets_.push_back(std::move(s));
  std::sort(secrets_.begin(), secrets_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  secrets_.erase(std::unique(secrets_.begin(), secrets_.end()), secrets_.end());
}

std::string Redactor::Feed(std::string_view data, bool flush) {
  if (secrets_.empty()) return std::string(data);
  pending_.append(data);
  for (const std::string& secret : secrets_) {
    for (size_t at = pending_.find(secret); at != std::string::npos;
         at = pending_.find(secret, at + 3)) {
      pending_.replace(at, secret.size(), "***");
      masked_any_ = true;
    }
  }
  // Held back: the longest tail that a secret starts with, which more output may complete. Never a
  // byte more, so a pause in the middle of a line delays nothing else; never a byte less, so a
  // pause in the middle of a secret shows no part of it.
  size_t held = 0;
  if (!flush) {
    for (const std::string& secret : secrets_) {
      for (size_t k = std::min(pending_.size(), secret.size() - 1); k > held; --k) {
        if (pending_.compare(pending_.size() - k, k, secret, 0, k) == 0) {
          held = k;
          break;
        }
      }
    }
  }
  const size_t release = pending_.size() - held;
  std::string out = pending_.substr(0, release);
  pending_.erase(0, release);
  return out;
}

}  // namespace tau
