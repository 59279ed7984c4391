// The API client: a small HTTP/1.1 client for tau's own REST API, over a Unix socket (the local
// default) or TCP. Thin on purpose: `tau` commands start in a few milliseconds, so the CLI does not
// load libcurl.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tau::client {

struct Endpoint {
  bool unix_socket = true;
  std::string path;  // unix socket path
  std::string host;  // tcp host
  int port = 0;
  std::string ToString() const;
};

// "unix:///path/to/sock", "unix:/path", "/path/to/sock", "http://host:port".
Result<Endpoint> ParseEndpoint(std::string_view text);

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
};

class Connection {
 public:
  static Result<std::unique_ptr<Connection>> Open(const Endpoint& endpoint, int timeout_ms = 5000);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one request and reads the whole response. Reconnects once if a kept-alive connection was
  // closed by the server before answering.
  Result<Response> Call(std::string_view method, std::string_view path, std::string_view body = {},
                        std::string_view content_type = "application/json");
  // Sends one request and hands the body to `on_data` as it arrives (chunked streams such as logs).
  // `on_data` returns false to stop early. Returns the status code.
  Result<int> Stream(std::string_view method, std::string_view path,
                     const std::function<bool(std::string_view)>& on_data);

 private:
  Connection(Endpoint endpoint, int fd, int timeout_ms);
  Status Reconnect();
  Status SendRequest(std::string_view method, std::string_view path, std::string_view body,
                     std::string_view content_type);
  Result<Response> ReadResponse(const std::function<bool(std::string_view)>* on_data);
  Result<size_t> Fill();  // reads more bytes into buf_

  Endpoint endpoint_;
  int fd_ = -1;
  int timeout_ms_;
  std::string buf_;
};

// The error carried in a non-2xx answer of the API ({"error": {"code", "message"}}) as a Status.
Status ErrorFromResponse(const Response& response);

}  // namespace tau::client
