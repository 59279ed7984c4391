// Finding the server: --server, else $TAU_SERVER, else the local Unix socket under $TAU_HOME,
// starting a local server in the background when none answers there.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "client/client.h"
#include "client/tau_api.h"

namespace tau::cli {

// A server's address, token and CA file: --server, else $TAU_SERVER, else the client config's
// current server; $TAU_TOKEN and $TAU_CA_FILE override what the config holds for it. Without
// `start_local`, no local server is started when none answers.
Result<std::unique_ptr<client::Connection>> ConnectToServer(const std::string& server_flag,
                                                            bool start_local = true);
// True when the server the CLI talks to is not the local socket's, or is signed in to with a
// token: then the server, not the Unix account, says who the caller is.
bool SignsInWithAToken(const std::string& server_flag);

// How long a request waits for the server's answer: $TAU_TIMEOUT (a duration: "30s", "500ms"),
// else 5 s. A stream that follows a log waits as long as it takes.
int ClientTimeoutMillis();

// Streams a run's log (`query`, with follow set) to stdout until it ends. When the
// connection is lost (the server restarted), says so, connects again (for up to a minute; the
// local server is started again if need be) and goes on from the byte it had reached: nothing
// shown twice, nothing missed. Meanwhile stderr says what the run does while its log is silent
// (queued, retried after a failed attempt, preempted): what happens from now on, or everything
// since it was submitted with `since_submitted`. Returns the HTTP status of the stream.
Result<int> FollowLog(const std::string& server_flag, std::unique_ptr<client::Connection>* conn,
                      const std::string& run, client::LogQuery query, bool since_submitted = false);

// Where a queued run stands ("queued (position 2): needs 1 nvidia.com/gpu; ..."), or "" when it is
// not queued with a pending reason.
std::string QueuedLine(const api::Run& run);
// What that line is said again for: its pending code and position, not a countdown its reason may
// hold; "" when QueuedLine is.
std::string QueuedKey(const api::Run& run);

// The client config: $TAU_CONFIG, else $XDG_CONFIG_HOME/tau/config.json, else
// ~/.config/tau/config.json. Mode 0600: it holds tokens.
struct ServerEntry {
  std::string token;
  std::string ca_file;
};
struct ClientConfig {
  std::string current;  // the server `tau login` signed in to last
  std::map<std::string, ServerEntry> servers;
};
std::string ClientConfigPath();
ClientConfig LoadClientConfig();  // empty when missing or unreadable
Status SaveClientConfig(const ClientConfig& config);
// Opens a connection to `address` with the entry's CA file and token.
Result<std::unique_ptr<client::Connection>> ConnectWith(const std::string& address,
                                                        const ServerEntry& entry);

}  // namespace tau::cli
