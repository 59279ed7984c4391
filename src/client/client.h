// The API client: a small HTTP/1.1 client for tau's own REST API, over a Unix socket (the local
// default), TCP, or TLS over TCP (https://, OpenSSL loaded on first use by src/tls/). Thin on
// purpose: `tau` commands start in a few milliseconds, so the CLI does not load libcurl.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tau::tls {
class ClientContext;
class Session;
}  // namespace tau::tls

namespace tau::client {

struct Endpoint {
  bool unix_socket = true;
  std::string path;  // unix socket path
  std::string host;  // tcp host
  int port = 0;
  bool tls = false;  // https://
  std::string ToString() const;
};

// "unix:///path/to/sock", "unix:/path", "/path/to/sock", "http://host:port", "https://host:port".
Result<Endpoint> ParseEndpoint(std::string_view text);

// How an https:// endpoint's certificate is checked. By default against the system's CA store, with
// the host name of the endpoint (an IP address is checked against the certificate's IP SANs).
struct TlsOptions {
  std::string ca_file;                // PEM CA bundle to trust instead of the system's store
  bool insecure_skip_verify = false;  // no certificate checks at all: tests and debugging only
};

// Extra request headers (name, value).
using Headers = std::vector<std::pair<std::string, std::string>>;

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  bool truncated = false;  // the body was cut at Limits::max_response_bytes; the rest is unread
};

// Bounds on a connection to a peer that is not trusted to answer well (a webhook's receiver), so
// that a slow or hostile one costs at most this time and this memory. Zero: no bound.
struct Limits {
  // Everything from Open on (connecting, TLS, sending each request, reading its answer) ends
  // within this many ms in all, however the peer trickles; past it a wait fails (kUnavailable).
  // Name resolution is not counted: getaddrinfo has its resolver's own timeouts.
  int64_t deadline_ms = 0;
  // The most bytes of one answer read off the connection, head and body. A longer head is an
  // error (kResourceExhausted); a longer body is cut there (Response::truncated) and the
  // connection closed, its rest never read.
  size_t max_response_bytes = 0;
};

class Connection {
 public:
  static Result<std::unique_ptr<Connection>> Open(const Endpoint& endpoint, int timeout_ms = 5000);
  // `tls` applies to https:// endpoints only.
  static Result<std::unique_ptr<Connection>> Open(const Endpoint& endpoint, const TlsOptions& tls,
                                                  int timeout_ms = 5000);
  // `timeout_ms` bounds each wait as above; `limits` the connection's whole life and its answers.
  static Result<std::unique_ptr<Connection>> Open(const Endpoint& endpoint, const TlsOptions& tls,
                                                  const Limits& limits, int timeout_ms = 5000);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one request and reads the whole response. Reconnects once if a kept-alive connection was
  // closed by the server before answering.
  Result<Response> Call(std::string_view method, std::string_view path, std::string_view body = {},
                        std::string_view content_type = "application/json",
                        const Headers& headers = {});
  // Sends one request and hands the body to `on_data` as it arrives (chunked streams such as logs).
  // `on_data` returns false to stop early. Returns the status code. `on_head`, when set, is told
  // the status and the headers (lowercase names) before the body's first byte.
  using OnHead = std::function<void(int status, const std::map<std::string, std::string>& headers)>;
  Result<int> Stream(std::string_view method, std::string_view path,
                     const std::function<bool(std::string_view)>& on_data,
                     const OnHead& on_head = nullptr);

  // Sent as `Authorization: Bearer TOKEN` with every request from now on; empty: none.
  void set_bearer_token(std::string token) { bearer_token_ = std::move(token); }
  // Where this connection goes (the socket path or the URL).
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  Connection(Endpoint endpoint, int timeout_ms, const Limits& limits);
  // How long the next wait may be: timeout_ms_ capped by what is left of the deadline; -1:
  // forever; 0: the deadline has passed.
  int WaitMs() const;
  Status TimedOut() const;  // a wait ran out: why, naming the deadline or the per-wait timeout
  Status Reconnect();
  void Close();
  Status SendAll(std::string_view data);
  Status SendRequest(std::string_view method, std::string_view path, std::string_view body,
                     std::string_view content_type, const Headers& headers);
  Result<Response> ReadResponse(const std::function<bool(std::string_view)>* on_data,
                                const OnHead* on_head = nullptr);
  Result<size_t> Fill();  // reads more bytes into buf_

  Endpoint endpoint_;
  int fd_ = -1;
  int timeout_ms_;
  const Limits limits_;
  int64_t deadline_ = 0;         // monotonic ms that limits_.deadline_ms ends at; 0: none
  size_t answer_bytes_ = 0;      // bytes of the answer being read, counted against the limit
  bool answer_limited_ = false;  // Fill stopped at limits_.max_response_bytes
  std::string bearer_token_;
  std::unique_ptr<tls::ClientContext> tls_context_;  // set for https:// endpoints
  std::unique_ptr<tls::Session> tls_;                // the session on fd_, when connected
  std::string buf_;
  bool closed_before_answer_ = false;  // the last response ended before its first byte (EOF)
  bool reset_before_answer_ = false;   // ... or was reset before its first byte
  int answers_on_fd_ = 0;              // requests answered on this connection
};

// The error carried in a non-2xx answer of the API ({"error": {"code", "message"}}) as a Status.
Status ErrorFromResponse(const Response& response);

}  // namespace tau::client
