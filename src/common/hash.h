// SHA-256 digests (OpenSSL), as lowercase hex.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace tau {

std::string Sha256Hex(std::string_view data);

// Incremental hashing for files and trees.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::string_view data);
  std::string HexDigest();  // finalises; call once

 private:
  void* ctx_;
};

Result<std::string> Sha256File(const std::string& path);

}  // namespace tau

namespace tau {
// Standard base64 (RFC 4648, with padding), for file contents inside JSON bodies.
std::string Base64Encode(std::string_view data);
Result<std::string> Base64Decode(std::string_view text);
}  // namespace tau
