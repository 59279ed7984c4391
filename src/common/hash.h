// SHA-256 digests as lowercase hex, and base64.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace tau {

std::string Sha256Hex(std::string_view data);

// Incremental hashing for files and trees.
class Sha256 {
 public:
  Sha256();
  void Update(std::string_view data);
  std::string HexDigest();  // finalises; call once

 private:
  void Blocks(const unsigned char* p, size_t blocks);  // the fastest code this CPU runs
  void Block(const unsigned char* p);                  // portable
  uint32_t state_[8];
  unsigned char buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;
};

Result<std::string> Sha256File(const std::string& path);

// HMAC-SHA256 (RFC 2104) of `data` under `key`, as lowercase hex: what signs a webhook's payload.
std::string HmacSha256Hex(std::string_view key, std::string_view data);

// A run's config hash: the sha256 of its canonical spec (spec::ToJson) as compact JSON with keys in
// sorted order and invalid UTF-8 replaced by U+FFFD, leaving out the members "shape" (how the file
// was written) and "overrides" (how --set got there: the spec already holds their values). The one
// definition that the server, the evidence bundle and its verifier share; docs/evidence.md gives it
// for third parties.
std::string ConfigHashOf(const nlohmann::json& canonical_spec);

// Whether Sha256 uses the CPU's SHA instructions where it has them (the default). Returns the
// setting before; false always where the CPU lacks them. For tests of both code paths.
bool UseSha256Instructions(bool use);

}  // namespace tau

namespace tau {

// Standard base64 (RFC 4648, with padding), for file contents inside JSON bodies.
std::string Base64Encode(std::string_view data);
Result<std::string> Base64Decode(std::string_view text);
}  // namespace tau
