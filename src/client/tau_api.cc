#include "client/tau_api.h"

#include <fmt/format.h>

#include "common/json_text.h"

namespace tau::client {

Result<nlohmann::json> TauApi::CallJson(const std::string& method, const std::string& path,
                                        const std::string& body) {
  TAU_ASSIGN_OR_RETURN(Response resp, conn_->Call(method, path, body));
  if (resp.status < 200 || resp.status >= 300) return ErrorFromResponse(resp);
  auto j = nlohmann::json::parse(resp.body, nullptr, false);
  if (j.is_discarded()) return Internal("the server's answer is not JSON");
  return j;
}

template <typename T>
Result<T> TauApi::Typed(const std::string& method, const std::string& path,
                        const std::string& body) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json j, CallJson(method, path, body));
  Result<T> typed = T::FromJson(j);
  if (!typed.ok())
    return Internal(fmt::format("the server's reply to {} {} is not what this tau reads: {}",
                                method, path, typed.status().message()));
  return typed;
}

Result<api::Version> TauApi::Version() { return Typed<api::Version>("GET", "/api/v1/version"); }

Result<api::RunList> TauApi::ListRuns(const RunQuery& query) {
  std::string path = fmt::format("/api/v1/runs?limit={}", query.limit);
  if (!query.state.empty())
    path += "&state=" + query.state;
  else if (query.active)
    path += "&active=1";
  return Typed<api::RunList>("GET", path);
}

Result<api::RunDetail> TauApi::GetRun(const std::string& name) {
  return Typed<api::RunDetail>("GET", "/api/v1/runs/" + name);
}

Result<api::Submitted> TauApi::Submit(const std::string& body) {
  return Typed<api::Submitted>("POST", "/api/v1/runs", body);
}

Result<api::Submitted> TauApi::Rerun(const std::string& name) {
  return Typed<api::Submitted>("POST", "/api/v1/runs/" + name + "/rerun");
}

Status TauApi::Cancel(const std::string& name) {
  return CallJson("POST", "/api/v1/runs/" + name + "/cancel").status();
}

Status TauApi::Resume(const std::string& name, const std::string& from, bool force) {
  nlohmann::json body = {{"force", force}};
  if (!from.empty()) body["from"] = from;
  return CallJson("POST", "/api/v1/runs/" + name + "/resume", JsonText(body)).status();
}

Result<api::Queues> TauApi::GetQueues() { return Typed<api::Queues>("GET", "/api/v1/queues"); }

Result<api::Queue> TauApi::GetQueue(const std::string& name) {
  TAU_ASSIGN_OR_RETURN(api::QueueReply reply,
                       Typed<api::QueueReply>("GET", "/api/v1/queues/" + name));
  return std::move(reply.queue);
}

Result<api::Capacity> TauApi::GetCapacity() {
  return Typed<api::Capacity>("GET", "/api/v1/capacity");
}

}  // namespace tau::client
