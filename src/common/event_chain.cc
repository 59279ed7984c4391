#include "common/event_chain.h"

#include "common/hash.h"
#include "common/json_text.h"

namespace tau {

std::string EventHash(const std::string& run, int64_t ts_ms, const std::string& type,
                      const std::string& message, const nlohmann::json& data,
                      const std::string& prev_hash) {
  nlohmann::json body = {
      {"run", run}, {"ts_ms", ts_ms}, {"type", type}, {"message", message}, {"data", data}};
  return Sha256Hex(prev_hash + "\n" + JsonText(body));
}

}  // namespace tau
