// Secrets in the logs of a run: which values to mask (the Redactor itself, which masks a stream, is
// common/redact.h: every log is masked as it is written, and replies as they are served).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/redact.h"
#include "common/status.h"
#include "store/store.h"

namespace tau::server {

// The values of the secrets a run's env refers to ({"secret_ref": KEY} in its spec JSON), from its
// workspace's secrets; empty when it refers to none.
Result<std::vector<std::string>> SecretValuesOf(store::Store* store, const store::RunRecord& run);

}  // namespace tau::server
