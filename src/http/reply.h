// How the API answers: JSON bodies, and errors as {"error": {"code", "message", ...}} with the
// HTTP status that matches the Status code. One place for every route file.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "http/http.h"

namespace tau::http {

int HttpStatusOf(StatusCode code);
// dump() never throws: invalid UTF-8 (a job's metric names, say) is replaced.
void Reply(HttpResponse& res, int status, const nlohmann::json& body);
void ReplyError(HttpResponse& res, const Status& status,
                nlohmann::json extra = nlohmann::json::object());

}  // namespace tau::http
