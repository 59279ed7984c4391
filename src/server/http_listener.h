// HTTP serving on Unix sockets and TCP. cpp-httplib (as packaged in Debian 12) parses requests and routes
// them, but it can only listen on TCP; this class owns the listening sockets and the connections, and hands
// each connection to httplib's request processing. It also records the peer's uid on Unix sockets
// (SO_PEERCRED) in the request header X-Tau-Peer-Uid, which clients cannot forge.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace tau::server {

inline constexpr const char* kPeerUidHeader = "X-Tau-Peer-Uid";

class HttpListener : public httplib::Server {
 public:
  HttpListener();
  ~HttpListener() override;

  // Binds a Unix socket at `path` (replacing a stale one) with the given mode.
  Status ListenUnix(const std::string& path, int mode = 0600);
  // Binds host:port; port 0 picks a free one (see tcp_port()).
  Status ListenTcp(const std::string& host, int port);
  int tcp_port() const { return tcp_port_; }

  // Accepts connections until Shutdown(); each connection is served on its own thread.
  void Serve();
  // Stops accepting, closes idle connections, waits up to `grace_ms` for busy ones.
  void Shutdown(int grace_ms = 2000);
  bool shutting_down() const { return stopping_.load(); }

 private:
  void ServeConnection(int fd, bool is_unix);
  // httplib decides whether the server is shutting down (and so whether a streaming response may go on)
  // by looking at its own listening socket, which this class does not use: point it at ours.
  void MarkServing(int fd) { svr_sock_ = fd; }

  std::vector<int> listen_fds_;
  std::vector<bool> listen_is_unix_;
  std::string unix_path_;
  int tcp_port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable idle_cv_;
  int active_connections_ = 0;  // GUARDED_BY(mu_)
};

}  // namespace tau::server
