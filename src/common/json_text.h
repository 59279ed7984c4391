// JSON text that never throws. nlohmann's dump() throws on a string that is not valid UTF-8, and
// such strings reach tau from outside all the time: a log line quoted in a diagnosis, a file name,
// an environment value. Here the bad bytes become U+FFFD instead, so a record is always written and
// a request always answered; for valid UTF-8 the text is the same as dump()'s.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tau {

inline std::string JsonText(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tau
