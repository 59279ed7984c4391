// The hash chain of a run's events: each event's hash covers the hash before it, so an edited,
// dropped or reordered event shows. The store computes it when it appends an event; the evidence
// record recomputes it to verify a run's chain. One formula, here, for both.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tau {

// sha256(prev_hash + "\n" + {run, ts_ms, type, message, data}), the object as compact JSON with
// its keys sorted (JsonText), as lowercase hex. prev_hash is "" for a run's first event. Changing
// this changes every stored hash: the chains already written would no longer verify.
std::string EventHash(const std::string& run, int64_t ts_ms, const std::string& type,
                      const std::string& message, const nlohmann::json& data,
                      const std::string& prev_hash);

}  // namespace tau
