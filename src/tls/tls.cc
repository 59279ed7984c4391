#include "tls/tls.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

namespace tau::tls {
namespace {

// The OpenSSL entry points tau uses, resolved with dlsym. The types come from OpenSSL's own
// declarations, so a mismatch is a compile error, not a crash.
#define TAU_TLS_FUNCTIONS(X)                 \
  X(ssl, TLS_server_method)                  \
  X(ssl, TLS_client_method)                  \
  X(ssl, SSL_CTX_new)                        \
  X(ssl, SSL_CTX_free)                       \
  X(ssl, SSL_CTX_ctrl)                       \
  X(ssl, SSL_CTX_set_options)                \
  X(ssl, SSL_CTX_set_verify)                 \
  X(ssl, SSL_CTX_use_certificate_chain_file) \
  X(ssl, SSL_CTX_use_PrivateKey_file)        \
  X(ssl, SSL_CTX_check_private_key)          \
  X(ssl, SSL_CTX_load_verify_locations)      \
  X(ssl, SSL_CTX_set_default_verify_paths)   \
  X(ssl, SSL_new)                            \
  X(ssl, SSL_free)                           \
  X(ssl, SSL_set_fd)                         \
  X(ssl, SSL_ctrl)                           \
  X(ssl, SSL_set1_host)                      \
  X(ssl, SSL_accept)                         \
  X(ssl, SSL_connect)                        \
  X(ssl, SSL_read)                           \
  X(ssl, SSL_write)                          \
  X(ssl, SSL_shutdown)                       \
  X(ssl, SSL_get_error)                      \
  X(ssl, SSL_pending)                        \
  X(ssl, SSL_get_verify_result)              \
  X(crypto, ERR_get_error)                   \
  X(crypto, ERR_clear_error)                 \
  X(crypto, ERR_reason_error_string)         \
  X(crypto, ERR_error_string_n)              \
  X(crypto, X509_verify_cert_error_string)   \
  X(crypto, OPENSSL_init_crypto)

struct Api {
#define TAU_TLS_DECLARE(lib, name) decltype(&::name) name = nullptr;
  TAU_TLS_FUNCTIONS(TAU_TLS_DECLARE)
#undef TAU_TLS_DECLARE
};

constexpr const char* kLibSsl = "libssl.so.3";
constexpr const char* kLibCrypto = "libcrypto.so.3";

Api g_api;             // written once under g_load_once, read-only afterwards
Status g_load_status;  // the outcome of the one load

void Load() {
  void* crypto = dlopen(kLibCrypto, RTLD_NOW | RTLD_LOCAL);
  void* ssl = crypto ? dlopen(kLibSsl, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!crypto || !ssl) {
    g_load_status = FailedPrecondition(fmt::format(
        "TLS needs OpenSSL 3, but {} could not be loaded ({}); install it (Debian/Ubuntu: "
        "apt-get install libssl3)",
        crypto ? kLibSsl : kLibCrypto, dlerror()));
    return;
  }
  std::string missing;
#define TAU_TLS_RESOLVE(lib, name)                                     \
  g_api.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name)); \
  if (!g_api.name) missing += (missing.empty() ? "" : ", ") + std::string(#name);
  TAU_TLS_FUNCTIONS(TAU_TLS_RESOLVE)
#undef TAU_TLS_RESOLVE
  if (!missing.empty()) {
    g_load_status = FailedPrecondition(
        fmt::format("the OpenSSL found ({}, {}) lacks entry points tau needs: {}", kLibSsl,
                    kLibCrypto, missing));
    return;
  }
  // No clean-up at exit: it frees OpenSSL's global locks while a connection thread (detached,
  // its connection already closed) may still be ending and releasing one (ThreadSanitizer saw
  // it in a server's exit). The process's memory goes with it anyway.
  g_api.OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
}

const Api& api() { return g_api; }

// OpenSSL writes to the socket with write(2), which raises SIGPIPE when the peer is gone. The
// server ignores SIGPIPE, but the CLI and tests may not: block it on this thread for the duration
// and swallow a SIGPIPE raised meanwhile.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeBlocked() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits until `fd` is ready for what OpenSSL wants; false once `deadline_ms` (< 0: none) passed.
bool WaitFor(int fd, int ssl_error, int64_t deadline_ms) {
  short events = ssl_error == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN;
  while (true) {
    int wait = -1;
    if (deadline_ms >= 0) {
      int64_t left = deadline_ms - NowMs();
      if (left <= 0) return false;
      wait = static_cast<int>(std::min<int64_t>(left, INT_MAX));
    }
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, wait);
    if (rc > 0) return true;  // readable, writable, or an error OpenSSL will report
    if (rc == 0) return false;
    if (errno != EINTR) return true;
  }
}

// Why the last OpenSSL call failed, from the thread's error queue (which is then empty).
std::string ErrorText(int ssl_error, int saved_errno) {
  std::string text;
  while (unsigned long e = api().ERR_get_error()) {
    if (!text.empty()) text += "; ";
    if (const char* reason = api().ERR_reason_error_string(e)) {
      text += reason;
    } else {
      char buf[256];
      api().ERR_error_string_n(e, buf, sizeof buf);
      text += buf;
    }
  }
  if (!text.empty()) return text;
  if (ssl_error == SSL_ERROR_SYSCALL)
    return saved_errno ? std::strerror(saved_errno) : "the peer closed the connection";
  return fmt::format("OpenSSL error {}", ssl_error);
}

Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return IoError("cannot make the socket non-blocking", errno);
  return Status::Ok();
}

// A readable file, checked before OpenSSL's less helpful "system library" error.
Status CheckReadable(const std::string& what, const std::string& path) {
  if (path.empty()) return InvalidArgument(what + " file is not set");
  if (::access(path.c_str(), R_OK) != 0)
    return IoError(fmt::format("cannot read {} file '{}'", what, path), errno);
  return Status::Ok();
}

// Settings both sides share: TLS 1.2 at least; a peer that closes without close_notify is an
// ordinary end of stream (HTTP finds truncation by its own framing); partial writes, so a
// non-blocking SSL_write reports progress.
Status ConfigureCommon(SSL_CTX* ctx) {
  if (api().SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, nullptr) != 1)
    return Internal("cannot require TLS 1.2: " + ErrorText(SSL_ERROR_SSL, 0));
  api().SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
  api().SSL_CTX_ctrl(ctx, SSL_CTRL_MODE,
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, nullptr);
  return Status::Ok();
}

// Runs SSL_accept or SSL_connect to completion on a non-blocking socket.
Status Handshake(SSL* ssl, int fd, int (*step)(SSL*), int timeout_ms) {
  SigpipeBlocked no_sigpipe;
  int64_t deadline = NowMs() + timeout_ms;
  while (true) {
    api().ERR_clear_error();
    errno = 0;
    int rc = step(ssl);
    if (rc == 1) return Status::Ok();
    int saved_errno = errno;
    int err = api().SSL_get_error(ssl, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      if (!WaitFor(fd, err, deadline))
        return Unavailable(
            fmt::format("the TLS handshake did not finish within {} ms", timeout_ms));
      continue;
    }
    std::string why = ErrorText(err, saved_errno);
    long verify = api().SSL_get_verify_result(ssl);
    if (verify != X509_V_OK)
      why =
          fmt::format("certificate verify failed: {}", api().X509_verify_cert_error_string(verify));
    return Unavailable("TLS handshake failed: " + why);
  }
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

Status EnsureLoaded() {
  static std::once_flag once;
  std::call_once(once, Load);
  return g_load_status;
}

Session::~Session() {
  SigpipeBlocked no_sigpipe;
  api().ERR_clear_error();
  api().SSL_shutdown(ssl_);  // one close_notify, no wait for the peer's
  api().ERR_clear_error();
  api().SSL_free(ssl_);
}

bool Session::HasPending() const { return api().SSL_pending(ssl_) > 0; }

Result<size_t> Session::Read(char* buf, size_t n, int timeout_ms) {
  int64_t deadline = timeout_ms < 0 ? -1 : NowMs() + timeout_ms;
  while (true) {
    api().ERR_clear_error();
    errno = 0;
    int rc = api().SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, INT_MAX)));
    if (rc > 0) return static_cast<size_t>(rc);
    int saved_errno = errno;
    int err = api().SSL_get_error(ssl_, rc);
    if (err == SSL_ERROR_ZERO_RETURN) return size_t{0};
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      if (!WaitFor(fd_, err, deadline))
        return Unavailable(fmt::format("no data within {} ms", timeout_ms));
      continue;
    }
    if (err == SSL_ERROR_SYSCALL && saved_errno == 0) return size_t{0};
    return Status(StatusCode::kIo, "TLS read failed: " + ErrorText(err, saved_errno));
  }
}

Status Session::WriteAll(std::string_view data, int timeout_ms) {
  SigpipeBlocked no_sigpipe;
  size_t off = 0;
  while (off < data.size()) {
    api().ERR_clear_error();
    errno = 0;
    int chunk = static_cast<int>(std::min<size_t>(data.size() - off, 1 << 20));
    int rc = api().SSL_write(ssl_, data.data() + off, chunk);
    if (rc > 0) {
      off += static_cast<size_t>(rc);
      continue;
    }
    int saved_errno = errno;
    int err = api().SSL_get_error(ssl_, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      if (!WaitFor(fd_, err, timeout_ms < 0 ? -1 : NowMs() + timeout_ms))
        return Unavailable(fmt::format("the peer took no data for {} ms", timeout_ms));
      continue;
    }
    return Status(StatusCode::kIo, "TLS write failed: " + ErrorText(err, saved_errno));
  }
  return Status::Ok();
}

Result<std::unique_ptr<ServerContext>> ServerContext::Create(const ServerConfig& config) {
  TAU_RETURN_IF_ERROR(EnsureLoaded());
  TAU_RETURN_IF_ERROR(CheckReadable("TLS certificate", config.cert_file));
  TAU_RETURN_IF_ERROR(CheckReadable("TLS key", config.key_file));
  api().ERR_clear_error();
  SSL_CTX* ctx = api().SSL_CTX_new(api().TLS_server_method());
  if (!ctx) return Internal("cannot create a TLS context: " + ErrorText(SSL_ERROR_SSL, 0));
  std::unique_ptr<ServerContext> out(new ServerContext(ctx));
  TAU_RETURN_IF_ERROR(ConfigureCommon(ctx));
  if (api().SSL_CTX_use_certificate_chain_file(ctx, config.cert_file.c_str()) != 1)
    return InvalidArgument(
        fmt::format("TLS certificate file '{}' holds no usable PEM certificate: {}",
                    config.cert_file, ErrorText(SSL_ERROR_SSL, 0)));
  if (api().SSL_CTX_use_PrivateKey_file(ctx, config.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    return InvalidArgument(fmt::format("TLS key file '{}' holds no usable PEM private key: {}",
                                       config.key_file, ErrorText(SSL_ERROR_SSL, 0)));
  if (api().SSL_CTX_check_private_key(ctx) != 1)
    return InvalidArgument(
        fmt::format("TLS key file '{}' does not match the certificate in '{}': {}", config.key_file,
                    config.cert_file, ErrorText(SSL_ERROR_SSL, 0)));
  return out;
}

ServerContext::~ServerContext() { api().SSL_CTX_free(ctx_); }

Result<std::unique_ptr<Session>> ServerContext::Accept(int fd, int timeout_ms) {
  TAU_RETURN_IF_ERROR(SetNonBlocking(fd));
  // A TLS connection opens with a handshake record (content type 22). Anything else, typically
  // plaintext HTTP, is told apart before OpenSSL sees it, so the caller can answer in plaintext.
  int64_t deadline = NowMs() + timeout_ms;
  unsigned char first = 0;
  while (true) {
    ssize_t n = ::recv(fd, &first, 1, MSG_PEEK);
    if (n == 1) break;
    if (n == 0) return Unavailable("the client closed the connection before the TLS handshake");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoError("reading the TLS handshake", errno);
    if (!WaitFor(fd, SSL_ERROR_WANT_READ, deadline))
      return Unavailable(fmt::format("no TLS handshake within {} ms", timeout_ms));
  }
  if (first != 22)
    return InvalidArgument(
        "the client did not start a TLS handshake (plaintext HTTP on a TLS port?)");
  api().ERR_clear_error();
  SSL* ssl = api().SSL_new(ctx_);
  if (!ssl) return Internal("cannot create a TLS connection: " + ErrorText(SSL_ERROR_SSL, 0));
  if (api().SSL_set_fd(ssl, fd) != 1) {
    api().SSL_free(ssl);
    return Internal("cannot attach the socket to TLS: " + ErrorText(SSL_ERROR_SSL, 0));
  }
  if (Status s = Handshake(ssl, fd, api().SSL_accept, timeout_ms); !s.ok()) {
    api().SSL_free(ssl);
    return s;
  }
  return std::unique_ptr<Session>(new Session(ssl, fd));
}

Result<std::unique_ptr<ClientContext>> ClientContext::Create(const ClientConfig& config) {
  TAU_RETURN_IF_ERROR(EnsureLoaded());
  bool verify = !config.insecure_skip_verify;
  if (verify && !config.ca_file.empty()) TAU_RETURN_IF_ERROR(CheckReadable("CA", config.ca_file));
  api().ERR_clear_error();
  SSL_CTX* ctx = api().SSL_CTX_new(api().TLS_client_method());
  if (!ctx) return Internal("cannot create a TLS context: " + ErrorText(SSL_ERROR_SSL, 0));
  std::unique_ptr<ClientContext> out(new ClientContext(ctx, verify));
  TAU_RETURN_IF_ERROR(ConfigureCommon(ctx));
  api().SSL_CTX_set_verify(ctx, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);
  if (!verify) return out;
  if (!config.ca_file.empty()) {
    if (api().SSL_CTX_load_verify_locations(ctx, config.ca_file.c_str(), nullptr) != 1)
      return InvalidArgument(fmt::format("CA file '{}' holds no usable PEM certificate: {}",
                                         config.ca_file, ErrorText(SSL_ERROR_SSL, 0)));
  } else if (api().SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return Internal("cannot load the system's CA store: " + ErrorText(SSL_ERROR_SSL, 0));
  }
  return out;
}

ClientContext::~ClientContext() { api().SSL_CTX_free(ctx_); }

Result<std::unique_ptr<Session>> ClientContext::Connect(int fd, const std::string& host,
                                                        int timeout_ms) {
  TAU_RETURN_IF_ERROR(SetNonBlocking(fd));
  api().ERR_clear_error();
  SSL* ssl = api().SSL_new(ctx_);
  if (!ssl) return Internal("cannot create a TLS connection: " + ErrorText(SSL_ERROR_SSL, 0));
  std::unique_ptr<Session> session(new Session(ssl, fd));
  if (api().SSL_set_fd(ssl, fd) != 1)
    return Internal("cannot attach the socket to TLS: " + ErrorText(SSL_ERROR_SSL, 0));
  // SNI carries names only (RFC 6066); SSL_set1_host checks an IP address against the
  // certificate's IP subjectAltNames.
  if (!IsIpAddress(host))
    api().SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                   const_cast<char*>(host.c_str()));
  if (verify_ && api().SSL_set1_host(ssl, host.c_str()) != 1)
    return InvalidArgument(fmt::format("'{}' is not a host name TLS can verify", host));
  TAU_RETURN_IF_ERROR(Handshake(ssl, fd, api().SSL_connect, timeout_ms));
  return session;
}

}  // namespace tau::tls
