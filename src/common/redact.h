// Masks secret values in text a run printed: each occurrence becomes "***", in any ASCII case
// ("TOKEN", "Token"); what a program derives otherwise (base64, hex, a URL's percent-encoding, a
// value split across lines) is not recognised (docs/security.md). Used where logs are
// written (the shim's log pump, the Kubernetes backend's pod log streams) and where they are served
// (the API). Streams arrive in pieces, so the last bytes that could begin a secret are held back
// until the next piece or the end.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tau {

class Redactor {
 public:
  // Values shorter than kMinSecretBytes are not masked: masking "1" would garble every log.
  static constexpr size_t kMinSecretBytes = 3;
  explicit Redactor(std::vector<std::string> secrets);

  bool empty() const { return secrets_.empty(); }
  bool masked_any() const { return masked_any_; }
  // Bytes fed but not released yet (a possible start of a secret).
  size_t held() const { return pending_.size(); }
  // The text that can be released now: all but a tail that could be the start of a secret, which
  // waits for more (however long that takes). `flush` (the end of the text) releases everything.
  std::string Feed(std::string_view data, bool flush);

 private:
  std::vector<std::string> secrets_;  // longest first, so a secret inside another is masked whole
  std::string pending_;
  bool masked_any_ = false;
};

}  // namespace tau
