// A small HTTP/1.1 server, on Unix sockets and TCP: tau's API, and the test API server.
//
// Why not a library: Debian 12's cpp-httplib cannot listen on Unix sockets, and loading it (with
// the OpenSSL and brotli libraries it pulls in) costs every `tau` process about 8 ms of relocations
// and page faults at start, which the CLI and every attempt's supervisor would pay. This server
// does what tau needs and no more: keep-alive, Content-Length bodies with a size limit, `Expect:
// 100-continue`, chunked streaming responses, regex routes, percent-decoded query parameters, and
// the Unix peer's uid (SO_PEERCRED). A TCP listener may speak TLS (src/tls/, OpenSSL loaded on
// first use); the Unix socket is always plain, its peers are authenticated by the kernel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "tls/tls.h"

namespace tau::http {

// The certificate and key of a TLS listener (PEM files).
using TlsServerConfig = tls::ServerConfig;

struct HttpRequest {
  std::string method;
  std::string path;                            // percent-decoded
  std::map<std::string, std::string> headers;  // lowercase names
  std::map<std::string, std::string> params;   // query parameters, percent-decoded
  std::string body;
  std::vector<std::string> matches;  // regex groups of the route; [0] is the whole path
  std::string peer_uid;  // the connecting process's uid on a Unix socket (SO_PEERCRED), else ""

  bool has_param(const std::string& name) const { return params.count(name) > 0; }
  std::string get_param_value(const std::string& name) const;
};

// Where a streaming response writes its body; each Write becomes one chunk.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual bool Write(std::string_view data) = 0;  // false: the client is gone
  virtual bool ClientGone() = 0;                  // cheap check while idle
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers_out;  // extra response headers
  // When set, the body is streamed (chunked): called until it returns false or a write fails.
  std::function<bool(ChunkSink&)> stream;

  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

class HttpServer {
 public:
  HttpServer();
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes are tried in the order added; `pattern` must match the whole path.
  void Route(const std::string& method, const std::string& pattern, HttpHandler handler);
  void set_max_body_bytes(size_t n) { max_body_bytes_ = n; }
  // Limits against clients that hold connections (defaults in http.cc; tests lower them). Set
  // before Serve(). Connections are counted apart for the Unix socket and for TCP listeners.
  struct Limits {
    int max_connections;     // per kind of listener
    int header_deadline_ms;  // from a request's first byte to the end of its headers
  };
  void set_limits(Limits limits) { limits_ = limits; }
  // Called after each handler with the route's pattern ("unmatched" for 404/405), the status and
  // the handling time in seconds. Set before Serve().
  using Observer = std::function<void(const std::string& method, const std::string& route,
                                      int status, double seconds)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  Status ListenUnix(const std::string& path, int mode = 0600);
  // port 0: any free port. With `tls`, every connection must complete a TLS handshake (TLS 1.2 or
  // newer) within a few seconds; the certificate and key are loaded here, so a bad file fails now.
  Status ListenTcp(const std::string& host, int port, const TlsServerConfig* tls = nullptr);
  int tcp_port() const { return tcp_port_; }

  // Accepts connections until Shutdown(); each connection is served on its own thread.
  void Serve();
  // Stops accepting and waits up to `grace_ms` for open connections to finish.
  void Shutdown(int grace_ms = 2000);
  bool shutting_down() const { return stopping_.load(); }

 private:
  struct Route_ {
    std::string method;
    std::regex pattern;
    std::string pattern_text;
    HttpHandler handler;
  };
  void ServeConnection(int fd, bool is_unix, tls::ServerContext* tls);
  void Dispatch(HttpRequest& req, HttpResponse& res);
  void DispatchRoute(HttpRequest& req, HttpResponse& res, std::string* route_name);

  std::vector<Route_> routes_;
  Observer observer_;
  size_t max_body_bytes_ = 1 << 20;
  Limits limits_;
  std::vector<int> listen_fds_;
  std::vector<bool> listen_is_unix_;
  std::vector<std::shared_ptr<tls::ServerContext>> listen_tls_;  // null: plain
  std::string unix_path_;
  int tcp_port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  CondVar idle_cv_;
  int active_connections_ TAU_GUARDED_BY(mu_) = 0;
  int local_connections_ TAU_GUARDED_BY(mu_) = 0;    // on the Unix socket
  int network_connections_ TAU_GUARDED_BY(mu_) = 0;  // on TCP listeners
};

}  // namespace tau::http
