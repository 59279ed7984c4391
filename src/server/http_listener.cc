#include "server/http_listener.h"

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

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace tau::server {
namespace {

constexpr int kMaxConnections = 512;
constexpr int kKeepAliveMaxRequests = 10000;
constexpr int kKeepAliveIdleMs = 30000;

// An httplib::Stream over a connected socket, with read timeouts so a silent client cannot pin a thread.
class SocketStream : public httplib::Stream {
 public:
  SocketStream(int fd, bool is_unix, const std::atomic<bool>* stopping)
      : fd_(fd), is_unix_(is_unix), stopping_(stopping) {}

  bool is_readable() const override { return WaitFor(POLLIN, kReadTimeoutMs); }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT | POLLRDHUP, 0};
    if (::poll(&p, 1, kWriteTimeoutMs) <= 0) return false;
    return !(p.revents & (POLLRDHUP | POLLHUP | POLLERR));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (!WaitFor(POLLIN, kReadTimeoutMs)) return -1;
    ssize_t n;
    do {
      n = ::recv(fd_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t off = 0;
    while (off < size) {
      if (!WaitFor(POLLOUT, kWriteTimeoutMs)) return -1;
      ssize_t n = ::send(fd_, ptr + off, size - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -1;
      }
      off += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    if (is_unix_) {
      ip = "unix";
      port = 0;
      return;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ip.clear();
    port = 0;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(serv);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = is_unix_ ? "unix" : "";
    port = 0;
  }
  socket_t socket() const override { return fd_; }

  // Waits for the next request on a kept-alive connection; false on idle timeout, close or shutdown.
  bool WaitForNextRequest() const {
    for (int waited = 0; waited < kKeepAliveIdleMs; waited += 100) {
      if (stopping_->load()) return false;
      pollfd p{fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, 100);
      if (rc > 0) return !(p.revents & (POLLERR | POLLNVAL));
      if (rc < 0 && errno != EINTR) return false;
    }
    return false;
  }

 private:
  static constexpr int kReadTimeoutMs = 30000;
  static constexpr int kWriteTimeoutMs = 30000;

  bool WaitFor(short events, int timeout_ms) const {
    while (true) {
      pollfd p{fd_, events, 0};
      int rc = ::poll(&p, 1, timeout_ms);
      if (rc < 0 && errno == EINTR) continue;
      return rc > 0 && !(p.revents & (POLLERR | POLLNVAL));
    }
  }

  int fd_;
  bool is_unix_;
  const std::atomic<bool>* stopping_;
};

}  // namespace

HttpListener::HttpListener() {
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
}

HttpListener::~HttpListener() {
  Shutdown(0);
  for (int fd : wake_pipe_)
    if (fd >= 0) ::close(fd);
}

Status HttpListener::ListenUnix(const std::string& path, int mode) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    return InvalidArgument(fmt::format(
        "socket path '{}' is longer than {} bytes; choose a shorter TAU_HOME", path,
        sizeof(addr.sun_path) - 1));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError("socket", errno);
  ::unlink(path.c_str());  // a stale socket of a dead server; the server lock guarantees no live one
  // Create the socket with no permissions for others from the first instant, then set the final mode.
  mode_t old = ::umask(0177);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot bind " + path, err);
  }
  ::chmod(path.c_str(), static_cast<mode_t>(mode));
  if (::listen(fd, 512) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot listen on " + path, err);
  }
  unix_path_ = path;
  listen_fds_.push_back(fd);
  MarkServing(fd);
  listen_is_unix_.push_back(true);
  return Status::Ok();
}

Status HttpListener::ListenTcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                             &hints, &res);
      rc != 0)
    return InvalidArgument(fmt::format("cannot resolve listen address '{}': {}", host,
                                       gai_strerror(rc)));
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
  MarkServing(fd);
  return Status::Ok();
}

void HttpListener::Serve() {
  std::vector<pollfd> fds;
  for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_pipe_[0], POLLIN, 0});
  while (!stopping_.load()) {
    int rc = ::poll(fds.data(), fds.size(), 1000);
    if (rc <= 0) continue;
    for (size_t i = 0; i < listen_fds_.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      int conn = ::accept4(listen_fds_[i], nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (active_connections_ >= kMaxConnections) {
          // Too many clients: refuse this one rather than let the server fall over.
          static const char kBusy[] =
              "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
          ::send(conn, kBusy, sizeof kBusy - 1, MSG_NOSIGNAL);
          ::close(conn);
          continue;
        }
        ++active_connections_;
      }
      if (!listen_is_unix_[i]) {
        int one = 1;
        ::setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
      std::thread(&HttpListener::ServeConnection, this, conn, bool(listen_is_unix_[i])).detach();
    }
  }
  for (int fd : listen_fds_) ::close(fd);
  listen_fds_.clear();
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

void HttpListener::ServeConnection(int fd, bool is_unix) {
  SocketStream stream(fd, is_unix, &stopping_);
  std::string peer_uid;
  if (is_unix) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) peer_uid = std::to_string(cred.uid);
  }
  auto setup = [&](httplib::Request& req) {
    req.headers.erase(kPeerUidHeader);  // never trust a client-supplied value
    if (!peer_uid.empty()) req.headers.emplace(kPeerUidHeader, peer_uid);
  };
  for (int served = 0; served < kKeepAliveMaxRequests && !stopping_.load(); ++served) {
    if (served > 0 && !stream.WaitForNextRequest()) break;
    bool connection_closed = false;
    bool close_after = served + 1 == kKeepAliveMaxRequests || stopping_.load();
    if (!process_request(stream, close_after, connection_closed, setup) || connection_closed) break;
  }
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  std::lock_guard<std::mutex> lock(mu_);
  --active_connections_;
  idle_cv_.notify_all();
}

void HttpListener::Shutdown(int grace_ms) {
  if (stopping_.exchange(true)) return;
  svr_sock_ = INVALID_SOCKET;  // httplib ends streaming responses when it sees this
  if (wake_pipe_[1] >= 0) (void)!::write(wake_pipe_[1], "x", 1);
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait_for(lock, std::chrono::milliseconds(grace_ms),
                    [&] { return active_connections_ == 0; });
}

}  // namespace tau::server
