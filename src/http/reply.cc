#include "http/reply.h"

namespace tau::http {

int HttpStatusOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
      return 409;
    case StatusCode::kFailedPrecondition:
      return 412;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

void Reply(HttpResponse& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                  "application/json");
}

void ReplyError(HttpResponse& res, const Status& status, nlohmann::json extra) {
  nlohmann::json err = {{"code", StatusCodeName(status.code())}, {"message", status.message()}};
  for (auto& [k, v] : extra.items()) err[k] = v;
  if (status.code() == StatusCode::kUnauthenticated)
    res.headers_out.emplace_back("WWW-Authenticate", "Bearer realm=\"tau\"");
  Reply(res, HttpStatusOf(status.code()), {{"error", err}});
}

}  // namespace tau::http
