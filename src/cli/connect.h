// Finding the server: --server, else $TAU_SERVER, else the local Unix socket under $TAU_HOME,
// starting a local server in the background when none answers there.
#pragma once

#include <memory>
#include <string>

#include "client/client.h"

namespace tau::cli {

Result<std::unique_ptr<client::Connection>> ConnectToServer(const std::string& server_flag);

// Calls the API and turns a non-2xx answer into a Status carrying the server's message.
Result<nlohmann::json> CallJson(client::Connection& conn, const std::string& method,
                                const std::string& path, const std::string& body = "");

}  // namespace tau::cli
