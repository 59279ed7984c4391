// Secrets in the logs of a run: which values to mask, and masking a stored file (the Redactor
// itself, which masks a stream, is common/redact.h: the shim masks as it writes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/redact.h"
#include "common/status.h"
#include "store/store.h"

namespace tau::server {

// Rewrites a file with its secrets masked (through a temporary file and a rename), when it holds
// any; a missing file is fine. Streams: logs may be large.
Status RedactFile(const std::string& path, const std::vector<std::string>& secrets);

// The values of the secrets a run's env refers to ({"secret_ref": KEY} in its spec JSON), from its
// workspace's secrets; empty when it refers to none.
Result<std::vector<std::string>> SecretValuesOf(store::Store* store, const store::RunRecord& run);

}  // namespace tau::server
