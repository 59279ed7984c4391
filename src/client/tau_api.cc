#include "client/tau_api.h"

#include <cctype>

#include <fmt/format.h>

#include "common/json_text.h"

namespace tau::client {
namespace {

// A name as one part of a URL (a path segment or a query value): everything but RFC 3986's
// unreserved characters percent-encoded, so a name with a space, '?', '#' or '/' reaches the server
// as that name, and the server's own validation answers it, never the request line's parser.
std::string E(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

}  // namespace

Result<nlohmann::json> TauApi::CallJson(const std::string& method, const std::string& path,
                                        const std::string& body, const Headers& headers,
                                        nlohmann::json* error_reply) {
  TAU_ASSIGN_OR_RETURN(Response resp, conn_->Call(method, path, body, "application/json", headers));
  if (resp.status < 200 || resp.status >= 300) {
    if (error_reply != nullptr) {
      *error_reply = nlohmann::json::parse(resp.body, nullptr, false);
      if (!error_reply->is_object()) *error_reply = nlohmann::json::object();
    }
    return ErrorFromResponse(resp);
  }
  auto j = nlohmann::json::parse(resp.body, nullptr, false);
  if (j.is_discarded()) return Internal("the server's answer is not JSON");
  return j;
}

template <typename T>
Result<T> TauApi::Typed(const std::string& method, const std::string& path, const std::string& body,
                        const Headers& headers, nlohmann::json* error_reply) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json j, CallJson(method, path, body, headers, error_reply));
  Result<T> typed = T::FromJson(j);
  if (!typed.ok())
    return Internal(fmt::format("the server's reply to {} {} is not what this tau reads: {}",
                                method, path, typed.status().message()));
  return typed;
}

Result<api::Version> TauApi::Version() { return Typed<api::Version>("GET", "/api/v1/version"); }

Result<api::RunList> TauApi::ListRuns(const RunQuery& query) {
  std::string path = fmt::format("/api/v1/runs?limit={}", query.limit);
  if (query.offset > 0) path += fmt::format("&offset={}", query.offset);
  if (!query.state.empty())
    path += "&state=" + E(query.state);
  else if (query.active)
    path += "&active=1";
  if (!query.workspace.empty()) path += "&workspace=" + E(query.workspace);
  if (!query.queue.empty()) path += "&queue=" + E(query.queue);
  if (!query.user.empty()) path += "&user=" + E(query.user);
  if (!query.project.empty()) path += "&project=" + E(query.project);
  if (!query.group.empty()) path += "&group=" + E(query.group);
  if (!query.workflow.empty()) path += "&workflow=" + E(query.workflow);
  if (query.oldest_first) path += "&order=oldest";
  return Typed<api::RunList>("GET", path);
}

Result<api::RunDetail> TauApi::GetRun(const std::string& name) {
  return Typed<api::RunDetail>("GET", "/api/v1/runs/" + E(name));
}

Result<api::Submitted> TauApi::Submit(const std::string& body, const std::string& idempotency_key,
                                      std::vector<std::string>* missing_blobs) {
  Headers headers;
  if (!idempotency_key.empty()) headers.emplace_back("Idempotency-Key", idempotency_key);
  nlohmann::json error;
  auto submitted = Typed<api::Submitted>("POST", "/api/v1/runs", body, headers, &error);
  if (missing_blobs != nullptr) {
    missing_blobs->clear();
    const nlohmann::json missing = error.contains("error") && error["error"].is_object()
                                       ? error["error"].value("missing", nlohmann::json())
                                       : nlohmann::json();
    if (!submitted.ok() && submitted.status().code() == StatusCode::kFailedPrecondition &&
        missing.is_array())
      for (const nlohmann::json& digest : missing)
        if (digest.is_string()) missing_blobs->push_back(digest.get<std::string>());
  }
  return submitted;
}

Result<api::SubmittedBatch> TauApi::SubmitBatch(const std::string& body,
                                                const std::string& idempotency_key) {
  Headers headers;
  if (!idempotency_key.empty()) headers.emplace_back("Idempotency-Key", idempotency_key);
  return Typed<api::SubmittedBatch>("POST", "/api/v1/runs/batch", body, headers);
}

Result<api::CodeMissing> TauApi::CodeMissing(const std::string& manifest_body) {
  return Typed<api::CodeMissing>("POST", "/api/v1/code/missing", manifest_body);
}

Status TauApi::PutBlob(const std::string& sha256, std::string_view data) {
  TAU_ASSIGN_OR_RETURN(Response resp, conn_->Call("PUT", "/api/v1/blobs/" + E(sha256), data,
                                                  "application/octet-stream"));
  if (resp.status < 200 || resp.status >= 300) return ErrorFromResponse(resp);
  return Status::Ok();
}

Result<api::Submitted> TauApi::Rerun(const std::string& name, const std::vector<std::string>& set) {
  if (set.empty()) return Typed<api::Submitted>("POST", "/api/v1/runs/" + E(name) + "/rerun");
  return Typed<api::Submitted>("POST", "/api/v1/runs/" + E(name) + "/rerun",
                               JsonText({{"set", set}}));
}

namespace {
// A 202's "pending": the change is accepted but not durable yet.
void PendingOf(const nlohmann::json& reply, std::string* pending) {
  if (pending == nullptr) return;
  auto it = reply.find("pending");
  if (it != reply.end() && it->is_string()) *pending = it->get<std::string>();
}
}  // namespace

Status TauApi::Cancel(const std::string& name, std::string* pending) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json reply,
                       CallJson("POST", "/api/v1/runs/" + E(name) + "/cancel"));
  PendingOf(reply, pending);
  return Status::Ok();
}

Result<int> TauApi::StopServer() {
  TAU_ASSIGN_OR_RETURN(nlohmann::json reply, CallJson("POST", "/api/v1/server/stop"));
  return reply.value("pid", 0);
}

Result<std::vector<std::string>> TauApi::CancelWorkflow(const std::string& workflow,
                                                        std::string* pending) {
  TAU_ASSIGN_OR_RETURN(nlohmann::json reply,
                       CallJson("POST", "/api/v1/workflows/" + E(workflow) + "/cancel"));
  PendingOf(reply, pending);
  auto names = reply.find("cancelling");
  if (names == reply.end() || !names->is_array())
    return InvalidArgument("the server's reply has no 'cancelling' list");
  std::vector<std::string> out;
  for (const nlohmann::json& n : *names)
    if (n.is_string()) out.push_back(n.get<std::string>());
  return out;
}

Result<api::SubmittedBatch> TauApi::RetryStage(const std::string& workflow,
                                               const std::string& stage) {
  return Typed<api::SubmittedBatch>(
      "POST", "/api/v1/workflows/" + E(workflow) + "/stages/" + E(stage) + "/retry");
}

Result<api::Service> TauApi::DeployService(const std::string& body) {
  return Typed<api::Service>("POST", "/api/v1/services", body);
}

Result<api::Service> TauApi::UpdateService(const std::string& name, const std::string& body) {
  return Typed<api::Service>("PUT", "/api/v1/services/" + E(name), body);
}

Result<api::ServiceList> TauApi::ListServices() {
  return Typed<api::ServiceList>("GET", "/api/v1/services");
}

Result<api::Service> TauApi::GetService(const std::string& name) {
  return Typed<api::Service>("GET", "/api/v1/services/" + E(name));
}

Result<api::Service> TauApi::ScaleService(const std::string& name, int64_t replicas) {
  return Typed<api::Service>("POST", "/api/v1/services/" + E(name) + "/scale",
                             JsonText(nlohmann::json{{"replicas", replicas}}));
}

Result<api::Service> TauApi::RollbackService(const std::string& name, int64_t to) {
  nlohmann::json body = nlohmann::json::object();
  if (to > 0) body["to"] = to;
  return Typed<api::Service>("POST", "/api/v1/services/" + E(name) + "/rollback", JsonText(body));
}

Result<api::Service> TauApi::DeleteService(const std::string& name) {
  return Typed<api::Service>("DELETE", "/api/v1/services/" + E(name));
}

Status TauApi::Resume(const std::string& name, const std::string& from, bool force,
                      std::string* pending) {
  nlohmann::json body = {{"force", force}};
  if (!from.empty()) body["from"] = from;
  TAU_ASSIGN_OR_RETURN(nlohmann::json reply,
                       CallJson("POST", "/api/v1/runs/" + E(name) + "/resume", JsonText(body)));
  PendingOf(reply, pending);
  return Status::Ok();
}

Result<api::Queues> TauApi::GetQueues(bool summary) {
  return Typed<api::Queues>("GET", summary ? "/api/v1/queues?summary=1" : "/api/v1/queues");
}

Result<api::Queue> TauApi::GetQueue(const std::string& name, int64_t offset, int64_t limit) {
  std::string path = "/api/v1/queues/" + E(name) + "?offset=" + std::to_string(offset);
  if (limit >= 0) path += "&limit=" + std::to_string(limit);
  TAU_ASSIGN_OR_RETURN(api::QueueReply reply, Typed<api::QueueReply>("GET", path));
  return std::move(reply.queue);
}

Result<api::Capacity> TauApi::GetCapacity() {
  return Typed<api::Capacity>("GET", "/api/v1/capacity");
}

Result<api::PlatformView> TauApi::GetPlatform() {
  return Typed<api::PlatformView>("GET", "/api/v1/platform");
}

Result<nlohmann::json> TauApi::Resolve(const std::string& yaml, const std::string& file,
                                       const std::vector<std::string>& set) {
  nlohmann::json body = {{"yaml", yaml}, {"file", file}};
  if (!set.empty()) body["set"] = set;
  return CallJson("POST", "/api/v1/resolve", JsonText(body));
}

Result<std::vector<std::string>> TauApi::ApplyPlatform(const std::string& yaml,
                                                       const std::string& file) {
  nlohmann::json body = {{"yaml", yaml}, {"file", file}};
  TAU_ASSIGN_OR_RETURN(nlohmann::json reply, CallJson("PUT", "/api/v1/platform", JsonText(body)));
  std::vector<std::string> warnings;
  if (auto it = reply.find("warnings"); it != reply.end() && it->is_array())
    for (const auto& w : *it)
      if (w.is_string()) warnings.push_back(w.get<std::string>());
  return warnings;
}

Result<api::Gpus> TauApi::GetGpus() { return Typed<api::Gpus>("GET", "/api/v1/gpus"); }

Result<api::HealthCheck> TauApi::CheckHealth(bool active) {
  return Typed<api::HealthCheck>("POST",
                                 std::string("/api/v1/health/check") + (active ? "?active=1" : ""));
}

Result<int> TauApi::StreamLog(const std::string& run, const LogQuery& query,
                              const OnData& on_data) {
  std::string path = fmt::format("/api/v1/runs/{}/logs?rank={}", E(run), query.rank);
  if (query.attempt > 0) path += fmt::format("&attempt={}", query.attempt);
  if (query.follow) path += "&follow=1";
  if (query.skip > 0) path += fmt::format("&skip={}", query.skip);
  return conn_->Stream("GET", path, on_data);
}

Result<int> TauApi::StreamEvents(const std::string& run, const OnData& on_data) {
  return conn_->Stream("GET", run.empty() ? "/api/v1/events" : "/api/v1/events?run=" + E(run),
                       on_data);
}

Result<std::string> TauApi::GetMetricsJsonl(const std::string& run, const std::string& name,
                                            const std::optional<std::string>& split) {
  std::string path = "/api/v1/runs/" + E(run) + "/metrics?format=jsonl";
  if (!name.empty()) path += "&name=" + E(name);
  if (split) path += "&split=" + E(*split);
  TAU_ASSIGN_OR_RETURN(Response res, conn_->Call("GET", path));
  if (res.status != 200) return ErrorFromResponse(res);
  return std::move(res.body);
}

Result<nlohmann::json> TauApi::GetEvidence(const std::string& run) {
  return CallJson("GET", "/api/v1/runs/" + E(run) + "/evidence");
}

Status TauApi::ExportEvidence(const std::string& run,
                              const std::function<bool(std::string_view)>& on_data) {
  // The start of the body is kept: when the answer is not 200, it is the server's error.
  Response answer;
  TAU_ASSIGN_OR_RETURN(answer.status,
                       conn_->Stream("GET", "/api/v1/runs/" + E(run) + "/evidence/bundle",
                                     [&](std::string_view data) {
                                       if (answer.body.size() < 65536) answer.body.append(data);
                                       return on_data(data);
                                     }));
  if (answer.status == 200) return Status::Ok();
  auto j = nlohmann::json::parse(answer.body, nullptr, false);
  if (j.is_object() && j.contains("error")) return ErrorFromResponse(answer);
  return Internal(fmt::format("the server refused the export (HTTP {})", answer.status));
}

Result<api::ArtifactList> TauApi::ListArtifacts(const std::string& run, bool digests,
                                                int64_t offset, int64_t limit) {
  return Typed<api::ArtifactList>(
      "GET", fmt::format("/api/v1/runs/{}/artifacts?offset={}&limit={}{}", E(run), offset, limit,
                         digests ? "&digest=1" : ""));
}

Status TauApi::GetArtifact(const std::string& run, const std::string& path, const OnData& on_data) {
  Response answer;
  int64_t announced = -1, got = 0;
  bool stopped = false;
  auto on_head = [&](int status, const std::map<std::string, std::string>& headers) {
    answer.status = status;
    if (auto it = headers.find("x-tau-size"); it != headers.end())
      announced = std::strtoll(it->second.c_str(), nullptr, 10);
  };
  TAU_ASSIGN_OR_RETURN(answer.status,
                       conn_->Stream(
                           "GET", "/api/v1/runs/" + E(run) + "/artifacts/file?path=" + E(path),
                           [&](std::string_view data) {
                             if (answer.status != 200) {
                               if (answer.body.size() < 65536)
                                 answer.body.append(data);  // the server's error
                               return true;
                             }
                             got += static_cast<int64_t>(data.size());
                             if (!on_data(data)) stopped = true;
                             return !stopped;
                           },
                           on_head));
  if (answer.status != 200) return ErrorFromResponse(answer);
  if (!stopped && announced >= 0 && got != announced)
    return Unavailable(fmt::format("the download of {} stopped after {} of {} bytes; try again",
                                   path, got, announced));
  return Status::Ok();
}

Result<api::Whoami> TauApi::Whoami() { return Typed<api::Whoami>("GET", "/api/v1/whoami"); }

Result<api::Token> TauApi::CreateToken(const std::string& user,
                                       const std::vector<std::string>& groups,
                                       const std::string& expires_in,
                                       const std::string& description) {
  nlohmann::json body = {{"user", user}, {"groups", groups}, {"description", description}};
  if (!expires_in.empty()) body["expires_in"] = expires_in;
  return Typed<api::Token>("POST", "/api/v1/tokens", JsonText(body));
}

Result<api::TokenList> TauApi::ListTokens(const std::string& user) {
  return Typed<api::TokenList>("GET", "/api/v1/tokens" + (user.empty() ? "" : "?user=" + E(user)));
}

Status TauApi::RevokeToken(const std::string& id) {
  return CallJson("DELETE", "/api/v1/tokens/" + E(id)).status();
}

Result<api::AuditList> TauApi::GetAudit(int limit) {
  return Typed<api::AuditList>("GET", fmt::format("/api/v1/audit?limit={}", limit));
}

Status TauApi::SetSecret(const std::string& workspace, const std::string& key,
                         const std::string& value) {
  nlohmann::json body = {{"value", value}};
  return CallJson("PUT", fmt::format("/api/v1/workspaces/{}/secrets/{}", E(workspace), E(key)),
                  JsonText(body))
      .status();
}

Result<api::SecretList> TauApi::ListSecrets(const std::string& workspace) {
  return Typed<api::SecretList>("GET", fmt::format("/api/v1/workspaces/{}/secrets", E(workspace)));
}

Status TauApi::DeleteSecret(const std::string& workspace, const std::string& key) {
  return CallJson("DELETE", fmt::format("/api/v1/workspaces/{}/secrets/{}", E(workspace), E(key)))
      .status();
}

}  // namespace tau::client
