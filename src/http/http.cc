#include "http/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/mutex.h"
#include "common/strings.h"
#include "http/request_parser.h"

namespace tau::http {
namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr int kIoTimeoutMs = 30000;  // a response that makes no progress
// A TLS client gets at most this long to finish its handshake (and no longer than the header
// deadline): a silent one must not pin a thread.
constexpr int kHandshakeTimeoutMs = 10000;
// What a client refused for a limit is told to wait before it tries again, in seconds.
constexpr int kRetryAfterSeconds = 5;
// How long the rest of a refused request's body is read and dropped before the connection closes.
constexpr int kLingerMs = 2000;

const char* Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

std::string ErrorBody(const char* code, const std::string& message) {
  // Kept free of a JSON library on purpose: the message is produced here, never from user input
  // raw.
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    escaped += c;
  }
  return fmt::format("{{\"error\": {{\"code\": \"{}\", \"message\": \"{}\"}}}}\n", code, escaped);
}

// Runs `f` when the scope ends, however it ends.
template <typename F>
class AtScopeExit {
 public:
  explicit AtScopeExit(F f) : f_(std::move(f)) {}
  ~AtScopeExit() { f_(); }

 private:
  F f_;
};

// One connection: buffered reads with timeouts, full writes; through TLS once set_tls was called.
class Conn : public ChunkSink {
 public:
  Conn(int fd, const std::atomic<bool>* stopping) : fd_(fd), stopping_(stopping) {}

  void set_tls(std::unique_ptr<tls::Session> session) { tls_ = std::move(session); }
  // Sends close_notify; must happen before the socket is closed, since a closed descriptor's number
  // may already belong to another connection.
  void EndTls() { tls_.reset(); }

  // Waits for readable data; false on timeout, close, error or shutdown.
  bool WaitReadable(int timeout_ms) {
    for (int waited = 0; waited < timeout_ms; waited += 100) {
      if (stopping_->load()) return false;
      pollfd p{fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, 100);
      if (rc > 0) return !(p.revents & (POLLERR | POLLNVAL)) || (p.revents & POLLIN);
      if (rc < 0 && errno != EINTR) return false;
    }
    return false;
  }
  // Reads more into buf_, at most `most` bytes (a body is read to its end and no further, so its
  // buffer, reserved for it, never grows); false on EOF/error/timeout.
  bool Fill(int timeout_ms, size_t most = 65536) {
    // Decrypted bytes may already wait inside OpenSSL, where poll() cannot see them.
    bool pending = tls_ && tls_->HasPending();
    if (!pending && !WaitReadable(timeout_ms)) return false;
    char tmp[65536];
    if (tls_) {
      // The socket is readable, but a TLS record may arrive in pieces: wait for the rest, no longer
      // than the caller's deadline allows (a record trickled a byte at a time must not outlast it).
      Result<size_t> got = tls_->Read(tmp, std::min(sizeof tmp, most), timeout_ms);
      if (!got.ok() || *got == 0) return false;
      buf_.append(tmp, *got);
      return true;
    }
    ssize_t n;
    do {
      n = ::recv(fd_, tmp, std::min(sizeof tmp, most), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  bool Send(std::string_view data) {
    if (tls_) return tls_->WriteAll(data, kIoTimeoutMs).ok();
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
          pollfd p{fd_, POLLOUT, 0};
          if (::poll(&p, 1, kIoTimeoutMs) <= 0) return false;
          continue;
        }
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool Write(std::string_view data) override {
    if (data.empty()) return true;
    return Send(fmt::format("{:x}\r\n", data.size())) && Send(data) && Send("\r\n");
  }
  // With TLS too: a client that goes away closes the TCP connection under its TLS session.
  bool ClientGone() override {
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
  }
  std::string& buf() { return buf_; }

 private:
  int fd_;
  const std::atomic<bool>* stopping_;
  std::unique_ptr<tls::Session> tls_;  // null: plaintext
  std::string buf_;
};

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The peer of a TCP connection as budgets count it. Loopback (127.0.0.0/8, ::1) is one peer: any
// local user may bind any of its 16 million addresses. Otherwise an IPv4 address by its /24 and an
// IPv6 one by its /64: a host may hold a whole prefix, and open each connection from another
// address of it.
std::string PeerOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  auto v4 = [&](const unsigned char* bytes) {
    if (bytes[0] == 127) return std::string("loopback");
    in_addr a{};
    unsigned char* out = reinterpret_cast<unsigned char*>(&a.s_addr);
    std::memcpy(out, bytes, 3);
    ::inet_ntop(AF_INET, &a, text, sizeof text);
    return std::string(text) + "/24";
  };
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    return v4(reinterpret_cast<const unsigned char*>(&in->sin_addr.s_addr));
  }
  if (addr.ss_family == AF_INET6) {
    in6_addr a = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) return v4(&a.s6_addr[12]);
    if (IN6_IS_ADDR_LOOPBACK(&a)) return "loopback";
    std::memset(&a.s6_addr[8], 0, 8);
    ::inet_ntop(AF_INET6, &a, text, sizeof text);
    return std::string(text) + "/64";
  }
  return "unknown";
}

// The answer to a connection refused at accept, before any thread is spent on it.
std::string RefusalReply(int status, const char* code, const std::string& message) {
  std::string body = ErrorBody(code, message);
  return fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Retry-After: {}\r\nConnection: close\r\n\r\n{}",
      status, Reason(status), body.size(), kRetryAfterSeconds, body);
}

}  // namespace

std::string HttpRequest::get_param_value(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? "" : it->second;
}

HttpServer::HttpServer() {
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
}

HttpServer::~HttpServer() {
  Shutdown(0);
  for (int fd : listen_fds_) ::close(fd);
  for (int fd : wake_pipe_)
    if (fd >= 0) ::close(fd);
}

void HttpServer::Route(const std::string& method, const std::string& pattern, HttpHandler handler,
                       RouteOptions options) {
  routes_.push_back({method, std::regex(pattern), pattern, std::move(handler), std::move(options)});
}

Status HttpServer::ListenUnix(const std::string& path, int mode) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    return InvalidArgument(
        fmt::format("socket path '{}' is longer than {} bytes; choose a shorter TAU_HOME", path,
                    sizeof(addr.sun_path) - 1));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    // A stale socket of a dead server goes (the server lock guarantees no live one); anything
    // else is not ours to delete.
    if (!S_ISSOCK(st.st_mode))
      return FailedPrecondition(fmt::format(
          "cannot listen on {}: it exists and is not a socket; move it out of the way", path));
    ::unlink(path.c_str());
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError("socket", errno);
  // No permissions for anyone else from the first instant, then the final mode.
  mode_t old = ::umask(0177);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0 || ::listen(fd, 512) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot listen on " + path, err);
  }
  unix_path_ = path;
  listen_fds_.push_back(fd);
  listen_is_unix_.push_back(true);
  listen_tls_.push_back(nullptr);
  return Status::Ok();
}

Status HttpServer::ListenTcp(const std::string& host, int port, const TlsServerConfig* tls) {
  std::shared_ptr<tls::ServerContext> tls_context;
  if (tls) {
    TAU_ASSIGN_OR_RETURN(std::unique_ptr<tls::ServerContext> created,
                         tls::ServerContext::Create(*tls));
    tls_context = std::move(created);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                             &hints, &res);
      rc != 0)
    return InvalidArgument(
        fmt::format("cannot resolve listen address '{}': {}", host, gai_strerror(rc)));
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return IoError("socket", errno);
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
    int err = errno;
    ::close(fd);
    ::freeaddrinfo(res);
    return IoError(fmt::format("cannot listen on {}:{}", host, port), err);
  }
  ::freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  tcp_port_ = bound.ss_family == AF_INET6
                  ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                  : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listen_fds_.push_back(fd);
  listen_is_unix_.push_back(false);
  listen_tls_.push_back(std::move(tls_context));
  return Status::Ok();
}

void HttpServer::Serve() {
  std::vector<pollfd> fds;
  for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_pipe_[0], POLLIN, 0});
  while (!stopping_.load()) {
    if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
    for (size_t i = 0; i < listen_fds_.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      sockaddr_storage addr{};
      socklen_t addr_len = sizeof addr;
      int conn =
          ::accept4(listen_fds_[i], reinterpret_cast<sockaddr*>(&addr), &addr_len, SOCK_CLOEXEC);
      if (conn < 0) continue;
      const int64_t accepted_ms = SteadyMillis();
      const bool is_unix = listen_is_unix_[i];
      std::string peer, peer_uid;
      if (is_unix) {
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
          peer_uid = std::to_string(cred.uid);
        peer = "uid " + (peer_uid.empty() ? std::string("unknown") : peer_uid);
      } else {
        peer = PeerOf(addr);
      }
      std::string refusal;
      const char* reason = nullptr;
      Limits limits;
      Share share = Share::kUnproven;
      {
        MutexLock lock(&mu_);
        limits = limits_;
        int& of_kind = is_unix ? local_connections_ : network_connections_;
        auto of_peer = peer_connections_.find(peer);
        const int held = of_peer == peer_connections_.end() ? 0 : of_peer->second;
        const int max = limits_.max_connections;
        // TCP: what connections not yet signed in may hold; the rest is kept for signed-in ones.
        const int unproven_share = max - max / 4;
        const bool peer_full = held >= limits_.max_connections_per_peer;
        const bool unproven_full = !is_unix && unproven_connections_ >= unproven_share;
        if (of_kind >= max) {
          // Too many clients: refuse this one rather than let the server fall over.
          reason = "connection_limit";
          refusal = RefusalReply(503, "Unavailable",
                                 fmt::format("the server is at its connection limit ({} {})", max,
                                             is_unix ? "on its Unix socket" : "over TCP"));
        } else if (!is_unix && (peer_full || unproven_full) &&
                   probation_connections_ < max - unproven_share &&
                   probation_of_peer_[peer] < limits_.max_connections_per_peer) {
          // The last quarter, on probation: its first request must come at once and sign in.
          share = Share::kProbation;
          ++probation_connections_;
          ++probation_of_peer_[peer];
          ++of_kind;
          ++active_connections_;
        } else if (!is_unix && unproven_full && !peer_full) {
          if (auto it = probation_of_peer_.find(peer);
              it != probation_of_peer_.end() && !it->second)
            probation_of_peer_.erase(it);
          reason = "unproven_connection_limit";
          refusal = RefusalReply(
              503, "Unavailable",
              fmt::format("the connections this server keeps for callers without a token are "
                          "taken ({} of {}); retry shortly",
                          unproven_share, max));
        } else if (peer_full) {
          if (auto it = probation_of_peer_.find(peer);
              it != probation_of_peer_.end() && !it->second)
            probation_of_peer_.erase(it);
          // One uid may not take the slots everyone else needs.
          reason = "peer_connection_limit";
          refusal = RefusalReply(
              429, "TooManyRequests",
              fmt::format("{} already has {} connections open to this server, the most one {} "
                          "may hold{}; close some, or reuse them (keep-alive). The server's "
                          "operator sets the limit (tau server --max-connections-per-address)",
                          is_unix ? "user " + peer : "peer " + peer, held,
                          is_unix ? "user" : "peer",
                          is_unix ? ""
                                  : " before it signs in (loopback is one peer, IPv4 a /24, "
                                    "IPv6 a /64)"));
        } else {
          ++of_kind;
          ++peer_connections_[peer];
          if (!is_unix) ++unproven_connections_;
          ++active_connections_;
        }
      }
      if (reason) {
        // A TLS client could not read a plaintext answer; it only sees the connection close. The
        // send never waits: a new socket's buffer is empty.
        if (!listen_tls_[i])
          (void)!::send(conn, refusal.data(), refusal.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::close(conn);
        Refused(reason);
        continue;
      }
      if (!is_unix) {
        int one = 1;
        ::setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
      std::thread(&HttpServer::ServeConnection, this, conn, is_unix, listen_tls_[i].get(),
                  std::move(peer), std::move(peer_uid), accepted_ms, limits, share)
          .detach();
    }
  }
  for (int fd : listen_fds_) ::close(fd);
  listen_fds_.clear();
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

const HttpServer::Route_* HttpServer::Match(HttpRequest& req, HttpResponse& res) {
  bool path_known = false;
  std::string allow;  // the methods the path has, for a 405's Allow field
  for (const Route_& route : routes_) {
    std::smatch m;
    if (!std::regex_match(req.path, m, route.pattern)) continue;
    path_known = true;
    if (route.method != req.method) {
      if (allow.find(route.method) == std::string::npos)
        allow +=
            (allow.empty() ? "" : ", ") + route.method + (route.method == "GET" ? ", HEAD" : "");
      continue;
    }
    req.matches.clear();
    for (const auto& group : m) req.matches.push_back(group.str());
    req.route = route.pattern_text;
    return &route;
  }
  if (path_known) {
    res.status = 405;
    res.headers_out.emplace_back("Allow", allow);
    res.set_content(
        ErrorBody("MethodNotAllowed", fmt::format("{} is not allowed on {}", req.method, req.path)),
        "application/json");
  } else {
    res.status = 404;
    res.set_content(
        ErrorBody("NotFound", fmt::format("no such endpoint: {} {}", req.method, req.path)),
        "application/json");
  }
  return nullptr;
}

bool HttpServer::Prove(ConnState* state, const std::string& peer, const std::string& identity,
                       int most) {
  MutexLock lock(&mu_);
  int& of_identity = signed_in_connections_[identity];
  if (of_identity >= most) return false;
  ++of_identity;
  if (state->share == Share::kProbation) {
    --probation_connections_;
    if (auto it = probation_of_peer_.find(peer);
        it != probation_of_peer_.end() && --it->second <= 0)
      probation_of_peer_.erase(it);
  } else {
    --unproven_connections_;
    if (auto it = peer_connections_.find(peer); it != peer_connections_.end() && --it->second <= 0)
      peer_connections_.erase(it);
  }
  state->share = Share::kSignedIn;
  state->identity = identity;
  return true;
}

void HttpServer::Release(bool is_unix, const std::string& peer, const ConnState& state) {
  MutexLock lock(&mu_);
  --(is_unix ? local_connections_ : network_connections_);
  auto drop = [](std::map<std::string, int>& counts, const std::string& key) {
    if (auto it = counts.find(key); it != counts.end() && --it->second <= 0) counts.erase(it);
  };
  if (is_unix) {
    drop(peer_connections_, peer);
  } else if (state.share == Share::kSignedIn) {
    drop(signed_in_connections_, state.identity);
  } else if (state.share == Share::kProbation) {
    --probation_connections_;
    drop(probation_of_peer_, peer);
  } else {
    --unproven_connections_;
    drop(peer_connections_, peer);
  }
  --active_connections_;
  idle_cv_.SignalAll();
}

std::shared_ptr<void> HttpServer::HoldBody(const std::string& owner, size_t bytes,
                                           const Limits& limits, HttpResponse* res) {
  const int64_t n = static_cast<int64_t>(bytes);
  {
    MutexLock lock(&bodies_mu_);
    auto it = body_bytes_of_.find(owner);
    const int64_t of_owner = it == body_bytes_of_.end() ? 0 : it->second;
    if (of_owner + n <= limits.max_body_bytes_in_flight_per_identity &&
        body_bytes_ + n <= limits.max_body_bytes_in_flight) {
      body_bytes_ += n;
      body_bytes_of_[owner] += n;
      // The handle's deleter gives the bytes back; the pointer itself is only a token.
      return std::shared_ptr<void>(this, [owner, n](HttpServer* self) {
        MutexLock lock(&self->bodies_mu_);
        self->body_bytes_ -= n;
        if (auto it = self->body_bytes_of_.find(owner);
            it != self->body_bytes_of_.end() && (it->second -= n) <= 0)
          self->body_bytes_of_.erase(it);
      });
    }
    if (of_owner + n > limits.max_body_bytes_in_flight_per_identity) {
      res->status = 429;
      res->set_content(
          ErrorBody(
              "ResourceExhausted",
              fmt::format("{} is already sending {} bytes of request bodies, and this one's "
                          "{} would pass the {} one caller may send at once; send it when "
                          "the others are done. The server's operator sets the limit (tau "
                          "server --max-body-bytes-in-flight-per-identity)",
                          owner, of_owner, bytes, limits.max_body_bytes_in_flight_per_identity)),
          "application/json");
    } else {
      res->status = 503;
      res->set_content(
          ErrorBody("Unavailable",
                    fmt::format("the server is receiving {} bytes of request bodies, and this "
                                "one's {} would pass its limit of {}; try again shortly. The "
                                "server's operator sets the limit (tau server "
                                "--max-body-bytes-in-flight)",
                                body_bytes_, bytes, limits.max_body_bytes_in_flight)),
          "application/json");
    }
  }
  res->headers_out.emplace_back("Retry-After", std::to_string(kRetryAfterSeconds));
  Refused("body_budget");
  return nullptr;
}

void HttpServer::ServeConnection(int fd, bool is_unix, tls::ServerContext* tls, std::string peer,
                                 std::string peer_uid, int64_t accepted_ms, Limits limits,
                                 Share share) {
  Conn conn(fd, &stopping_);
  ConnState state;
  state.share = share;
  AtScopeExit done([&] {
    conn.EndTls();
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    Release(is_unix, peer, state);
  });
  // On probation the first request's headers must come at once.
  if (share == Share::kProbation)
    limits.header_deadline_ms = std::min(limits.header_deadline_ms, kProbationMs);
  auto reply_error = [&](int status, const char* code, const std::string& message) {
    std::string body = ErrorBody(code, message);
    conn.Send(
        fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: "
                    "{}\r\nConnection: close\r\n\r\n{}",
                    status, Reason(status), body.size(), body));
  };
  if (tls) {
    // The handshake happens here, on the connection's own thread, so a slow client delays no one;
    // it counts against the first request's header deadline.
    Result<std::unique_ptr<tls::Session>> session =
        tls->Accept(fd, std::min(kHandshakeTimeoutMs, limits.header_deadline_ms));
    if (!session.ok()) {
      if (session.status().code() == StatusCode::kInvalidArgument)
        reply_error(400, "BadRequest", "this port requires TLS: use https://");
      return;
    }
    conn.set_tls(std::move(session).value());
  }
  std::string& buf = conn.buf();
  bool keep_alive = true;
  bool first_request = true;
  bool unread_body = false;  // a refused request's body, still on its way
  AtScopeExit linger([&] {
    // A client that sends its whole body before it reads would find the connection reset under
    // it, the answer lost: what it still sends is read and dropped for a little while, never
    // kept.
    if (!unread_body || tls) return;
    ::shutdown(fd, SHUT_WR);
    const int64_t until = SteadyMillis() + kLingerMs;
    for (int64_t left; (left = until - SteadyMillis()) > 0;) {
      buf.clear();
      if (!conn.Fill(static_cast<int>(left))) break;
    }
  });
  while (keep_alive && !stopping_.load()) {
    // Headers. The first request's must be in within the header deadline of the accept: a client
    // that connects and trickles, or sends nothing, holds its slot no longer. A kept-alive
    // connection waits up to the idle timeout for a next request's first byte, then the deadline
    // runs from that byte.
    size_t end, consumed = 0;
    const int64_t wait_start = SteadyMillis();
    int64_t deadline = first_request ? accepted_ms + limits.header_deadline_ms
                       : buf.empty() ? -1
                                     : wait_start + limits.header_deadline_ms;
    first_request = false;
    while ((end = HeaderEnd(buf, &consumed)) == std::string::npos) {
      if (buf.size() > kMaxHeaderBytes) break;
      const int64_t now = SteadyMillis();
      int64_t left = deadline < 0 ? wait_start + limits.idle_timeout_ms - now : deadline - now;
      auto too_slow = [&] {
        Refused("header_deadline");
        // A client that never started a request (or closed) is not told; one that did is.
        if (buf.empty() || conn.ClientGone()) return;
        reply_error(
            408, "RequestTimeout",
            fmt::format("request headers took longer than {} ms", limits.header_deadline_ms));
      };
      if (left <= 0) {
        if (deadline >= 0) too_slow();
        keep_alive = false;
        break;
      }
      if (!conn.Fill(static_cast<int>(std::min<int64_t>(left, kIoTimeoutMs)))) {
        // The deadline may pass while Fill waits.
        if (deadline >= 0 && SteadyMillis() >= deadline) too_slow();
        keep_alive = false;
        break;
      }
      if (deadline < 0) deadline = SteadyMillis() + limits.header_deadline_ms;
    }
    if (!keep_alive) break;
    if (end == std::string::npos || end > kMaxHeaderBytes) {
      reply_error(431, "RequestTooLarge", "request headers exceed 64 KiB");
      break;
    }
    RequestHead request_head;
    HeadError error;
    bool parsed = ParseRequestHead(std::string_view(buf).substr(0, end), max_body_bytes_,
                                   &request_head, &error);
    buf.erase(0, consumed);
    if (!parsed) {
      reply_error(error.status, error.code.c_str(), error.message);
      break;
    }
    keep_alive = request_head.keep_alive;
    const size_t length = request_head.content_length;
    HttpRequest req;
    req.peer_uid = peer_uid;
    req.peer = peer;
    req.method = std::move(request_head.method);
    req.path = std::move(request_head.path);
    req.params = std::move(request_head.params);
    req.headers = std::move(request_head.headers);
    req.content_length = length;
    // HEAD is GET without the body (RFC 9110 9.3.2): the same status and headers.
    const bool head_only = req.method == "HEAD";
    if (head_only) req.method = "GET";

    // The route, its body limit and its admission, before a byte of the body is read: a caller
    // who may not send it is refused without the server holding it.
    auto start = std::chrono::steady_clock::now();
    HttpResponse res;
    std::shared_ptr<void> body_hold;
    bool admitted = false;
    const Route_* route = nullptr;
    try {
      route = Match(req, res);  // null: a 404 or 405 in `res`
      if (route && length > route->options.max_body_bytes) {
        res.status = 413;
        res.set_content(ErrorBody("ResourceExhausted",
                                  fmt::format("request body of {} bytes exceeds the limit of {} "
                                              "bytes of {} {}",
                                              length, route->options.max_body_bytes, req.method,
                                              route->pattern_text)),
                        "application/json");
      } else if (route && (!route->options.admit || route->options.admit(req, res))) {
        admitted = true;
      }
      // A connection whose request authenticated joins the signed-in share; one on probation
      // must, or it is refused.
      if (!is_unix && state.share != Share::kSignedIn) {
        const bool proven = !req.signed_in_as.empty() &&
                            Prove(&state, peer, req.signed_in_as, limits.max_connections_per_peer);
        if (!proven && state.share == Share::kProbation) {
          admitted = false;
          keep_alive = false;  // its place was lent for one request that signs in
          res = HttpResponse();
          res.headers_out.emplace_back("Retry-After", std::to_string(kRetryAfterSeconds));
          if (!req.signed_in_as.empty()) {
            Refused("identity_connection_limit");
            res.status = 429;
            res.set_content(
                ErrorBody("TooManyRequests",
                          fmt::format("{} already has {} connections open to this server, the "
                                      "most one identity may hold; close some, or reuse them "
                                      "(keep-alive). The server's operator sets the limit (tau "
                                      "server --max-connections-per-address)",
                                      req.signed_in_as, limits.max_connections_per_peer)),
                "application/json");
          } else {
            Refused("unproven_connection_limit");
            res.status = 503;
            res.set_content(
                ErrorBody("Unavailable",
                          fmt::format("the connections this server keeps for callers without a "
                                      "token are taken ({} of {}{}); callers with a token are "
                                      "still served",
                                      limits.max_connections - limits.max_connections / 4,
                                      limits.max_connections,
                                      peer == "unknown" ? "" : ", or " + peer + "'s share")),
                "application/json");
          }
        }
      }
      if (admitted && length > kDefaultMaxBodyBytes) {
        // Large bodies count against their sender's budget and everyone's until handled.
        body_hold = HoldBody(req.signed_in_as.empty() ? "address " + peer : req.signed_in_as,
                             length, limits, &res);
        admitted = body_hold != nullptr;
      }
    } catch (const std::exception& e) {
      res = HttpResponse();
      res.status = 500;
      res.set_content(
          ErrorBody("Internal", std::string("the server failed on this request: ") + e.what()),
          "application/json");
      admitted = false;
    }
    bool complete = admitted;
    if (!admitted) {
      // Refused: what of the body is here is dropped; a body still on its way is never read, so
      // the connection closes after the answer.
      if (buf.size() >= length) {
        buf.erase(0, length);
      } else {
        buf.clear();
        keep_alive = false;
        unread_body = true;
      }
    } else {
      if (length > 0 && request_head.expect_continue && buf.empty())
        conn.Send("HTTP/1.1 100 Continue\r\n\r\n");
      // Reserved once: a body read into a growing string holds up to twice its size at each
      // reallocation.
      if (buf.size() < length) buf.reserve(length);
      // The body: body_grace_ms, then no slower than body_min_bytes_per_second on average. The
      // time by which more must have arrived grows with what has: a client that stalls is cut off
      // within the grace, however long it said the body was.
      const int64_t body_start = SteadyMillis();
      const int64_t rate = std::max<int64_t>(1, limits.body_min_bytes_per_second);
      while (buf.size() < length) {
        const int64_t body_deadline =
            body_start + limits.body_grace_ms + static_cast<int64_t>(buf.size()) * 1000 / rate;
        int64_t left = body_deadline - SteadyMillis();
        auto too_slow = [&] {
          Refused("body_deadline");
          reply_error(408, "RequestTimeout",
                      fmt::format("request body arrived too slowly ({} of {} bytes; after {} ms "
                                  "it must keep up with {} bytes a second)",
                                  buf.size(), length, limits.body_grace_ms, rate));
        };
        if (left <= 0) {
          too_slow();
          complete = false;
          break;
        }
        if (!conn.Fill(static_cast<int>(std::min<int64_t>(left, kIoTimeoutMs)),
                       length - buf.size())) {
          if (SteadyMillis() >= body_deadline && !conn.ClientGone())
            too_slow();
          else  // the client may still read after half-closing: tell it what went wrong
            reply_error(400, "BadRequest",
                        fmt::format("request body ended after {} of {} bytes", buf.size(), length));
          complete = false;
          break;
        }
      }
      if (!complete) break;
      // Moved, not copied; only bytes of a next request (pipelined) are copied back.
      if (buf.size() == length) {
        req.body = std::move(buf);
        buf = std::string();
      } else {
        std::string rest = buf.substr(length);
        buf.resize(length);
        req.body = std::move(buf);
        buf = std::move(rest);
      }
      start = std::chrono::steady_clock::now();  // the handler's time, as before
      try {
        route->handler(req, res);
      } catch (const std::exception& e) {
        // Handlers report errors as responses; this only catches a library throwing where nobody
        // expected.
        res = HttpResponse();
        res.status = 500;
        res.set_content(
            ErrorBody("Internal", std::string("the server failed on this request: ") + e.what()),
            "application/json");
      }
    }
    // The body, what admission kept and the body budget are let go before the answer is written
    // (a stream may take long).
    std::string().swap(req.body);
    req.admitted.reset();
    body_hold.reset();
    if (observer_) {
      std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      observer_(req.method, req.route.empty() ? "unmatched" : req.route, res.status, took.count());
    }
    std::string head = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", res.status,
                                   Reason(res.status), res.content_type);
    head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    for (const auto& [name, value] : res.headers_out)
      if (value.find_first_of("\r\n") == std::string::npos)  // no header injection
        head += fmt::format("{}: {}\r\n", name, value);
    if (!res.stream) {
      head += fmt::format("Content-Length: {}\r\n\r\n", res.body.size());
      if (!conn.Send(head) || (!head_only && !conn.Send(res.body))) break;
      continue;
    }
    head += "Transfer-Encoding: chunked\r\n\r\n";
    if (!conn.Send(head)) break;
    if (head_only) continue;
    bool ok = true;
    while (ok && !stopping_.load()) {
      if (!res.stream(conn)) break;
      ok = !conn.ClientGone();
    }
    // A server shutting down cuts its streams short, without the last chunk: the client sees a
    // lost connection (and may follow again once a server is back), not the stream's end.
    if (!ok || stopping_.load() || !conn.Send("0\r\n\r\n")) break;
  }
}

std::shared_ptr<void> HttpServer::HoldStream(const std::string& owner, int* held) {
  const int most = limits().max_streams_per_owner;
  MutexLock lock(&streams_mu_);
  int& count = streams_[owner];
  if (held) *held = count;
  if (count >= most) {
    if (count == 0) streams_.erase(owner);
    return nullptr;
  }
  ++count;
  // The handle's deleter gives the slot back; the pointer itself is only a token.
  return std::shared_ptr<void>(this, [owner](HttpServer* self) {
    MutexLock lock(&self->streams_mu_);
    if (auto it = self->streams_.find(owner); it != self->streams_.end() && --it->second <= 0)
      self->streams_.erase(it);
  });
}

void HttpServer::Shutdown(int grace_ms) {
  if (stopping_.exchange(true)) return;
  if (wake_pipe_[1] >= 0) (void)!::write(wake_pipe_[1], "x", 1);
  MutexLock lock(&mu_);
  idle_cv_.WaitFor(&mu_, std::chrono::milliseconds(grace_ms),
                   [&]() TAU_REQUIRES(mu_) { return active_connections_ == 0; });
}

}  // namespace tau::http
