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
  // Where the connection comes from, as connection budgets count it: "uid N" on a Unix socket, the
  // peer's IP on TCP (an IPv6 peer by its /64: one host may hold a whole prefix).
  std::string peer;
  std::string route;          // the pattern of the route that matched (set before the handler runs)
  size_t content_length = 0;  // as declared; admission runs before the body is read
  // Set by the route's admission for its handler (SecureRouter: the caller it authenticated and
  // the platform it decided under), so the handler need not decide again.
  std::shared_ptr<const void> admitted;
  // Set by admission when the request authenticated: who it is, as budgets count it ("user
  // 'alice'"). Its connection then counts in the signed-in share; its body in its own budget.
  std::string signed_in_as;

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
// Called once a request's head is parsed and its route matched, before a byte of its body is read:
// true to go on; false refuses with `res` (a connection whose body was not read is closed).
using Admission = std::function<bool(HttpRequest& req, HttpResponse& res)>;

// What a route takes, unless it says otherwise: a small JSON body.
constexpr size_t kDefaultMaxBodyBytes = 64 * 1024;

struct RouteOptions {
  size_t max_body_bytes = kDefaultMaxBodyBytes;  // 413 past it, before the body is read
  Admission admit = nullptr;                     // none: every request is admitted
};

class HttpServer {
 public:
  HttpServer();
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes are tried in the order added; `pattern` must match the whole path.
  void Route(const std::string& method, const std::string& pattern, HttpHandler handler,
             RouteOptions options = {});
  // The most any route may take (a route's own limit is lower or equal).
  void set_max_body_bytes(size_t n) { max_body_bytes_ = n; }
  // Limits against clients that hold connections (tests lower them).
  // Connections are counted apart for the Unix socket and for TCP listeners, and per peer
  // (HttpRequest::peer): one address or uid cannot take every slot of its kind. Over TCP, a
  // connection is unproven until one of its requests authenticates (HttpRequest::signed_in_as):
  // unproven ones may take a quarter less than max_connections; past that, or past their peer's
  // budget, a connection is taken on probation into the last quarter (a peer: no more of it than
  // its budget), where its first request must arrive within kProbationMs and authenticate. A flood
  // without tokens holds the quarter only for kProbationMs a connection, so signed-in callers
  // find room there; and none of another peer's.
  struct Limits {
    int max_connections = 512;  // per kind of listener
    // Per Unix uid; over TCP per peer (loopback is one peer, IPv4 a /24, IPv6 a /64) while
    // unproven, and per identity once signed in.
    int max_connections_per_peer = 64;
    // The headers of a connection's first request must be in within this long of the accept (a TLS
    // handshake included); a later request's, of its first byte.
    int header_deadline_ms = 10000;
    int idle_timeout_ms = 15000;  // a kept-alive connection waiting for its next request
    // A body may take body_grace_ms; after that, what has arrived must keep up with
    // body_min_bytes_per_second, so a body that trickles is cut off however long it claims to be.
    int body_grace_ms = 10000;
    int64_t body_min_bytes_per_second = 64 * 1024;
    int max_streams_per_owner = 32;  // see HoldStream
    // Request bodies over kDefaultMaxBodyBytes are counted from their admission to the end of
    // their handler, by their declared length: in all, and per identity (an anonymous caller: per
    // peer). Past either, the request is refused before its body is read (503, 429; Retry-After).
    int64_t max_body_bytes_in_flight = int64_t{384} << 20;
    int64_t max_body_bytes_in_flight_per_identity = int64_t{128} << 20;
  };
  // How long a connection taken on probation has for its first request's headers.
  static constexpr int kProbationMs = 1000;
  // May change while serving (tests do): a connection keeps the limits of its accept.
  void set_limits(Limits limits) {
    MutexLock lock(&mu_);
    limits_ = limits;
  }
  Limits limits() const {
    MutexLock lock(&mu_);
    return limits_;
  }
  // Connections refused or cut off by a limit, with the reason: "connection_limit",
  // "peer_connection_limit", "unproven_connection_limit" (a connection on probation whose request
  // did not authenticate), "identity_connection_limit", "header_deadline", "body_deadline",
  // "body_budget". Called on the accept thread or a
  // connection's thread: it must be quick. Set before Serve().
  void set_refusal_observer(std::function<void(const char* reason)> observer) {
    refusal_observer_ = std::move(observer);
  }

  // A streamed response (one that holds its connection after the headers) held by `owner` (an
  // identity, or an address; the handler decides): counted until the returned handle is destroyed,
  // which it is with the response. Null when `owner` already holds max_streams_per_owner, and
  // `*held` (if given) says how many it holds.
  std::shared_ptr<void> HoldStream(const std::string& owner, int* held = nullptr);
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
    RouteOptions options;
  };
  // Where a TCP connection stands in the listener's shares.
  enum class Share { kUnproven, kProbation, kSignedIn };
  struct ConnState {
    Share share = Share::kUnproven;
    std::string identity;  // once signed in
  };
  void ServeConnection(int fd, bool is_unix, tls::ServerContext* tls, std::string peer,
                       std::string peer_uid, int64_t accepted_ms, Limits limits, Share share);
  // Moves a TCP connection whose request authenticated as `identity` to the signed-in share; false
  // when that identity already holds max_connections_per_peer there (the connection stays).
  bool Prove(ConnState* state, const std::string& peer, const std::string& identity, int most);
  void Release(bool is_unix, const std::string& peer, const ConnState& state);
  // Holds `bytes` of the body budgets for `owner`; null with the refusal in `res` past one.
  std::shared_ptr<void> HoldBody(const std::string& owner, size_t bytes, const Limits& limits,
                                 HttpResponse* res);
  // The route of `req` (its matches and pattern set), or null with a 404 or 405 in `res`.
  const Route_* Match(HttpRequest& req, HttpResponse& res);
  void Refused(const char* reason) const {
    if (refusal_observer_) refusal_observer_(reason);
  }

  std::vector<Route_> routes_;
  Observer observer_;
  std::function<void(const char* reason)> refusal_observer_;
  size_t max_body_bytes_ = 1 << 20;
  std::vector<int> listen_fds_;
  std::vector<bool> listen_is_unix_;
  std::vector<std::shared_ptr<tls::ServerContext>> listen_tls_;  // null: plain
  std::string unix_path_;
  int tcp_port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  mutable Mutex mu_;
  CondVar idle_cv_;
  Limits limits_ TAU_GUARDED_BY(mu_);
  int active_connections_ TAU_GUARDED_BY(mu_) = 0;
  int local_connections_ TAU_GUARDED_BY(mu_) = 0;    // on the Unix socket
  int network_connections_ TAU_GUARDED_BY(mu_) = 0;  // on TCP listeners
  // Unix: every connection, by uid; TCP: the unproven ones, by peer.
  std::map<std::string, int> peer_connections_ TAU_GUARDED_BY(mu_);
  int unproven_connections_ TAU_GUARDED_BY(mu_) = 0;                      // TCP
  int probation_connections_ TAU_GUARDED_BY(mu_) = 0;                     // TCP
  std::map<std::string, int> probation_of_peer_ TAU_GUARDED_BY(mu_);      // TCP, by peer
  std::map<std::string, int> signed_in_connections_ TAU_GUARDED_BY(mu_);  // TCP, by identity
  Mutex bodies_mu_;
  int64_t body_bytes_ TAU_GUARDED_BY(bodies_mu_) = 0;
  std::map<std::string, int64_t> body_bytes_of_ TAU_GUARDED_BY(bodies_mu_);  // by owner
  Mutex streams_mu_;
  std::map<std::string, int> streams_ TAU_GUARDED_BY(streams_mu_);  // held, by owner
};

}  // namespace tau::http
