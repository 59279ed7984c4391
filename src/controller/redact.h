// Masks secret values in text a run printed, as tau serves it (logs over the API and the
// dashboard): each occurrence becomes "***". Streams arrive in pieces, so the last bytes that could
// begin a secret are held back until the next piece or the end.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "store/store.h"

namespace tau::server {

class Redactor {
 public:
  // Values shorter than kMinSecretBytes are not masked: masking "1" would garble every log.
  static constexpr size_t kMinSecretBytes = 3;
  explicit Redactor(std::vector<std::string> secrets);

  bool empty() const { return secrets_.empty(); }
  bool masked_any() const { return masked_any_; }
  // The text that can be released now: all but a tail that could be the start of a secret, which
  // waits for more (however long that takes). `flush` (the end of the text) releases everything.
  std::string Feed(std::string_view data, bool flush);

 private:
  std::vector<std::string> secrets_;  // longest first, so a secret inside another is masked whole
  std::string pending_;
  bool masked_any_ = false;
};

// Rewrites a file with its secrets masked (through a temporary file and a rename), when it holds
// any; a missing file is fine. Streams: logs may be large.
Status RedactFile(const std::string& path, const std::vector<std::string>& secrets);

// The values of the secrets a run's env refers to ({"secret_ref": KEY} in its spec JSON), from its
// workspace's secrets; empty when it refers to none.
Result<std::vector<std::string>> SecretValuesOf(store::Store* store, const store::RunRecord& run);

}  // namespace tau::server
