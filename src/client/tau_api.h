// tau's API as typed calls: each reply read into its api/types.h type, so the CLI reads members,
// not keys. A reply of the wrong shape is an error naming the request and the member.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/types.h"
#include "client/client.h"
#include "common/status.h"

namespace tau::client {

// GET /api/v1/runs: `limit` runs, newest first; `state` (a run state's name) or else `active`.
struct RunQuery {
  int limit = 100;
  int64_t offset = 0;
  std::string state;
  bool active = false;
  std::string workspace, queue, user;  // "" : any
  std::string project, group;          // the spec's experiment.project / .group; "" : any
  std::string workflow;                // only the runs of this workflow; "" : any
  bool oldest_first = false;
};

// GET /api/v1/runs/NAME/logs: one rank's log of one attempt (0: the latest); with `follow` the
// stream stays open until the attempt ends; `skip` bytes already received are not sent again.
struct LogQuery {
  int rank = 0;
  int attempt = 0;
  bool follow = false;
  int64_t skip = 0;
};

// The streams hand the body to `on_data` as it arrives (false stops them) and return the HTTP
// status; a log or an event stream is text, not a reply to read into a type.
using OnData = std::function<bool(std::string_view)>;

class TauApi {
 public:
  explicit TauApi(Connection* conn) : conn_(conn) {}

  Result<api::Version> Version();
  Result<api::RunList> ListRuns(const RunQuery& query);
  Result<api::RunDetail> GetRun(const std::string& name);
  // `body`: the JSON of POST /api/v1/runs ({"spec": {...}, "code": {...}}).
  // POST /api/v1/runs. With an idempotency key, a submission sent again (after a timeout or a lost
  // connection) answers with the run the first one made instead of making another.
  // `missing_blobs` (may be null) gets the blobs of a manifest the server lacks when it refuses
  // the submission for them (a 412 whose error has "missing"): upload those and submit again.
  Result<api::Submitted> Submit(const std::string& body, const std::string& idempotency_key = "",
                                std::vector<std::string>* missing_blobs = nullptr);
  // POST /api/v1/runs/batch: many submissions ({"codes"?, "runs": [...], "array"?}, see
  // docs/api.md), all made or none; the key is the whole batch's, so a batch sent again answers
  // with the runs the first one made.
  Result<api::SubmittedBatch> SubmitBatch(const std::string& body,
                                          const std::string& idempotency_key = "");
  // Code upload: which blobs of a manifest ({"files": [{path, mode, size, sha256}]}) the server
  // lacks, then each of them, its raw bytes under its sha256.
  Result<api::CodeMissing> CodeMissing(const std::string& manifest_body);
  Status PutBlob(const std::string& sha256, std::string_view data);
  // `set`: tau rerun --set's "PATH=VALUE" texts (none: the run as it was).
  Result<api::Submitted> Rerun(const std::string& name, const std::vector<std::string>& set = {});
  // `pending`, when given, is set to the server's reason when the change is accepted but not yet
  // durable (its disk is full): it is lost if the server stops before it can record it.
  Status Cancel(const std::string& name, std::string* pending = nullptr);
  // A workflow's runs that have not ended are cancelled; the names of those asked to stop.
  Result<std::vector<std::string>> CancelWorkflow(const std::string& workflow,
                                                  std::string* pending = nullptr);
  // A stage of a workflow again, with the stages after it that never ran because of it.
  Result<api::SubmittedBatch> RetryStage(const std::string& workflow, const std::string& stage);
  Status Resume(const std::string& name, const std::string& from, bool force,
                std::string* pending = nullptr);
  // `summary`: without each queue's runs (their counts stay).
  // Services (docs/serving.md). `body` of a deploy or update is a submission's body (spec and
  // code) with "service": {"name"?, "from"?}.
  Result<api::Service> DeployService(const std::string& body);
  Result<api::Service> UpdateService(const std::string& name, const std::string& body);
  Result<api::ServiceList> ListServices();
  Result<api::Service> GetService(const std::string& name);
  Result<api::Service> ScaleService(const std::string& name, int64_t replicas);
  // To revision `to`, or (0) the one before the current one.
  Result<api::Service> RollbackService(const std::string& name, int64_t to);
  Result<api::Service> DeleteService(const std::string& name);
  Result<api::Queues> GetQueues(bool summary = false);
  // A queue with its pending runs from position `offset` + 1, at most `limit` of them (the counts
  // are the whole queue's); `limit` < 0: all of them.
  Result<api::Queue> GetQueue(const std::string& name, int64_t offset = 0, int64_t limit = -1);
  Result<api::Capacity> GetCapacity();

  // Platform policy. `yaml` is checked again by the server; `file` names it in the record.
  Result<api::PlatformView> GetPlatform();
  // POST /api/v1/resolve: the spec, with the --set texts `set` applied, resolved for the caller
  // with the platform in force, {"resolved": policy::ToJson's form, "platform": its source, "set"
  // when given}; nothing is submitted.
  Result<nlohmann::json> Resolve(const std::string& yaml, const std::string& file,
                                 const std::vector<std::string>& set = {});
  // The server's warnings about the file (what it means for runs and accounts), when applied.
  Result<std::vector<std::string>> ApplyPlatform(const std::string& yaml, const std::string& file);

  // GPUs and their health; `active` also runs the active probe (admins only).
  Result<api::Gpus> GetGpus();
  Result<api::HealthCheck> CheckHealth(bool active);

  // The run's evidence record: a document with a schema of its own
  // (docs/evidence-record.schema.json), which evidence:: reads.
  Result<nlohmann::json> GetEvidence(const std::string& run);
  // The run's evidence bundle (.tar.gz), handed to `on_data` as it arrives (false stops it). An
  // answer other than 200 is the server's error; what it sent was handed on all the same.
  Status ExportEvidence(const std::string& run,
                        const std::function<bool(std::string_view)>& on_data);

  // A run's checkpoints and outputs: a page of them, with digests computed where `digests`.
  Result<api::ArtifactList> ListArtifacts(const std::string& run, bool digests, int64_t offset,
                                          int64_t limit);
  // One of them ("output/REL" or "checkpoint/REL"), handed to `on_data` as it arrives; nothing is
  // handed on when the server refuses it. Fails when fewer bytes came than the server announced.
  Status GetArtifact(const std::string& run, const std::string& path, const OnData& on_data);

  // Identity (docs/security.md). `expires_in` "" is a token that does not expire.
  Result<int> StreamLog(const std::string& run, const LogQuery& query, const OnData& on_data);
  // GET /api/v1/events (of one run, or every run when `run` is empty): server-sent events.
  Result<int> StreamEvents(const std::string& run, const OnData& on_data);
  // GET /api/v1/runs/NAME/metrics as JSONL, of one metric (`name`) and split when given.
  Result<std::string> GetMetricsJsonl(const std::string& run, const std::string& name,
                                      const std::optional<std::string>& split);

  Result<api::Whoami> Whoami();
  // POST /api/v1/server/stop (admins): the server begins a graceful stop; its pid.
  Result<int> StopServer();
  Result<api::Token> CreateToken(const std::string& user, const std::vector<std::string>& groups,
                                 const std::string& expires_in, const std::string& description);
  Result<api::TokenList> ListTokens(const std::string& user);  // "" : all that the caller may see
  Status RevokeToken(const std::string& id);
  Result<api::AuditList> GetAudit(int limit);
  Status SetSecret(const std::string& workspace, const std::string& key, const std::string& value);
  Result<api::SecretList> ListSecrets(const std::string& workspace);
  Status DeleteSecret(const std::string& workspace, const std::string& key);

 private:
  // The parsed JSON body of one call. A non-2xx answer is the server's error as a Status, and
  // its body, where it is a JSON object, in `*error_reply` (when given).
  Result<nlohmann::json> CallJson(const std::string& method, const std::string& path,
                                  const std::string& body = "", const Headers& headers = {},
                                  nlohmann::json* error_reply = nullptr);
  template <typename T>
  Result<T> Typed(const std::string& method, const std::string& path, const std::string& body = "",
                  const Headers& headers = {}, nlohmann::json* error_reply = nullptr);

  Connection* conn_;
};

}  // namespace tau::client
