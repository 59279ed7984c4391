// tau's API as typed calls: each reply read into its api/types.h type, so the CLI reads members,
// not keys. A reply of the wrong shape is an error naming the request and the member.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "api/types.h"
#include "client/client.h"
#include "common/status.h"

namespace tau::client {

// GET /api/v1/runs: `limit` runs, newest first; `state` (a run state's name) or else `active`.
struct RunQuery {
  int limit = 100;
  std::string state;
  bool active = false;
};

class TauApi {
 public:
  explicit TauApi(Connection* conn) : conn_(conn) {}

  Result<api::Version> Version();
  Result<api::RunList> ListRuns(const RunQuery& query);
  Result<api::RunDetail> GetRun(const std::string& name);
  // `body`: the JSON of POST /api/v1/runs ({"spec": {...}, "code": {...}}).
  Result<api::Submitted> Submit(const std::string& body);
  Result<api::Submitted> Rerun(const std::string& name);
  Status Cancel(const std::string& name);
  Status Resume(const std::string& name, const std::string& from, bool force);
  Result<api::Queues> GetQueues();
  Result<api::Queue> GetQueue(const std::string& name);
  Result<api::Capacity> GetCapacity();

  // One call whose reply has no type here yet: the parsed JSON body. A non-2xx answer is the
  // server's error as a Status.
  Result<nlohmann::json> CallJson(const std::string& method, const std::string& path,
                                  const std::string& body = "");

 private:
  template <typename T>
  Result<T> Typed(const std::string& method, const std::string& path, const std::string& body = "");

  Connection* conn_;
};

}  // namespace tau::client
