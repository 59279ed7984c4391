// TLS for tau's TCP listener and client, with OpenSSL loaded through dlopen.
//
// Why dlopen: the tau binary links only libc dynamically for a fast cold start (each shared library
// costs about 1.5 ms at every start; see the top-level CMakeLists.txt). Most `tau` processes talk
// over the Unix socket and never need TLS, so libssl.so.3 and libcrypto.so.3 are loaded on first
// use only. OpenSSL's headers are used for types and constants; every call goes through a table of
// resolved function pointers (macros such as SSL_CTX_set_min_proto_version go through
// SSL_CTX_ctrl/SSL_ctrl).
//
// The sockets under a Session are switched to non-blocking mode; each Session call waits with
// poll() up to its own timeout, so a silent peer cannot hold a thread forever.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

// OpenSSL's opaque types, without its headers in ours.
struct ssl_ctx_st;
struct ssl_st;

namespace tau::tls {

// Loads libssl and libcrypto once; later calls return the first outcome. kFailedPrecondition names
// the library that could not be loaded or lacks an entry point.
Status EnsureLoaded();

struct ServerConfig {
  std::string cert_file;  // PEM: the server certificate, then any intermediates
  std::string key_file;   // PEM: its private key
};

struct ClientConfig {
  std::string ca_file;                // PEM CA bundle to trust; empty: the system's CA store
  bool insecure_skip_verify = false;  // no certificate or host name checks (tests only)
};

// One TLS connection over a connected socket, after a successful handshake.
class Session {
 public:
  ~Session();  // sends close_notify (best effort) and frees; does not close the socket
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Reads up to `n` bytes. 0: the peer closed the connection. timeout_ms < 0: wait forever.
  Result<size_t> Read(char* buf, size_t n, int timeout_ms);
  // Writes all of `data` within `timeout_ms` (per stall).
  Status WriteAll(std::string_view data, int timeout_ms);
  // Decrypted bytes buffered inside OpenSSL: readable without waiting on the socket.
  bool HasPending() const;

 private:
  friend class ServerContext;
  friend class ClientContext;
  Session(ssl_st* ssl, int fd) : ssl_(ssl), fd_(fd) {}
  ssl_st* ssl_;
  int fd_;
};

// The server side of one TCP listener: certificate and key, TLS 1.2 at least.
class ServerContext {
 public:
  // Loads the certificate chain and key; errors name the file at fault.
  static Result<std::unique_ptr<ServerContext>> Create(const ServerConfig& config);
  ~ServerContext();
  ServerContext(const ServerContext&) = delete;
  ServerContext& operator=(const ServerContext&) = delete;

  // The server's handshake on an accepted socket, finished within `timeout_ms`. Errors tell why
  // (plaintext HTTP on a TLS port, a client that rejected the certificate, a timeout).
  Result<std::unique_ptr<Session>> Accept(int fd, int timeout_ms);

 private:
  explicit ServerContext(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* ctx_;
};

// The client side: which CAs to trust. One per connection target is enough.
class ClientContext {
 public:
  static Result<std::unique_ptr<ClientContext>> Create(const ClientConfig& config);
  ~ClientContext();
  ClientContext(const ClientContext&) = delete;
  ClientContext& operator=(const ClientContext&) = delete;

  // The client's handshake on a connected socket: SNI (for names, not IP addresses) and, unless
  // insecure, a check that the certificate is valid for `host`. Errors name the reason
  // ("certificate verify failed: hostname mismatch").
  Result<std::unique_ptr<Session>> Connect(int fd, const std::string& host, int timeout_ms);

 private:
  ClientContext(ssl_ctx_st* ctx, bool verify) : ctx_(ctx), verify_(verify) {}
  ssl_ctx_st* ctx_;
  bool verify_;
};

}  // namespace tau::tls
