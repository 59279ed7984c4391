#include "client/client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/strings.h"
#include "tls/tls.h"

namespace tau::client {

std::string Endpoint::ToString() const {
  return unix_socket ? "unix://" + path
                     : fmt::format("{}://{}:{}", tls ? "https" : "http", host, port);
}

Result<Endpoint> ParseEndpoint(std::string_view text) {
  Endpoint e;
  if (StartsWith(text, "unix://")) {
    e.path = std::string(text.substr(7));
  } else if (StartsWith(text, "unix:")) {
    e.path = std::string(text.substr(5));
  } else if (StartsWith(text, "/")) {
    e.path = std::string(text);
  } else if (StartsWith(text, "http://") || StartsWith(text, "https://")) {
    e.unix_socket = false;
    e.tls = StartsWith(text, "https://");
    std::string_view rest = text.substr(e.tls ? 8 : 7);
    if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos)
      return InvalidArgument(fmt::format("server address '{}' has no port ({}://host:port)", text,
                                         e.tls ? "https" : "http"));
    e.host = std::string(rest.substr(0, colon));
    try {
      e.port = std::stoi(std::string(rest.substr(colon + 1)));
    } catch (...) {
      return InvalidArgument(fmt::format("server address '{}' has a bad port", text));
    }
  } else {
    return InvalidArgument(fmt::format(
        "server address '{}' not understood: use unix:///path/to/tau.sock, https://host:port or "
        "http://host:port",
        text));
  }
  if (e.unix_socket && e.path.empty()) return InvalidArgument("unix socket path is empty");
  return e;
}

// connect() that gives up at `deadline` (monotonic ms; 0: the kernel's own timeout, minutes for
// a host that drops SYNs). 0 or an errno.
static int ConnectBy(int fd, const sockaddr* addr, socklen_t len, int64_t deadline) {
  if (deadline == 0) return ::connect(fd, addr, len) == 0 ? 0 : errno;
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return errno;
  int err = ::connect(fd, addr, len) == 0 ? 0 : errno;
  while (err == EINPROGRESS || err == EINTR) {
    const int64_t left = deadline - MonotonicMillis();
    if (left <= 0) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return errno;
    if (rc == 0) return ETIMEDOUT;
    socklen_t size = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &size) != 0) return errno;
  }
  if (err == 0 && ::fcntl(fd, F_SETFL, flags) != 0) return errno;
  return err;
}

static Result<int> Dial(const Endpoint& e, int64_t deadline) {
  if (e.unix_socket) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return IoError("socket", errno);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (e.path.size() >= sizeof(addr.sun_path)) {
      ::close(fd);
      return InvalidArgument("socket path too long: " + e.path);
    }
    std::memcpy(addr.sun_path, e.path.c_str(), e.path.size() + 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      int err = errno;
      ::close(fd);
      return Status(StatusCode::kUnavailable,
                    fmt::format("cannot connect to {}: {}", e.ToString(), std::strerror(err)));
    }
    return fd;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(e.host.c_str(), std::to_string(e.port).c_str(), &hints, &res); rc != 0)
    return Unavailable(fmt::format("cannot resolve {}: {}", e.host, gai_strerror(rc)));
  int last_err = 0;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if ((last_err = ConnectBy(fd, ai->ai_addr, ai->ai_addrlen, deadline)) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ::freeaddrinfo(res);
      return fd;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return Unavailable(
      fmt::format("cannot connect to {}: {}", e.ToString(), std::strerror(last_err)));
}

Result<std::unique_ptr<Connection>> Connection::Open(const Endpoint& endpoint, int timeout_ms) {
  return Open(endpoint, TlsOptions{}, timeout_ms);
}

Result<std::unique_ptr<Connection>> Connection::Open(const Endpoint& endpoint,
                                                     const TlsOptions& tls, int timeout_ms) {
  return Open(endpoint, tls, Limits{}, timeout_ms);
}

Result<std::unique_ptr<Connection>> Connection::Open(const Endpoint& endpoint,
                                                     const TlsOptions& tls, const Limits& limits,
                                                     int timeout_ms) {
  std::unique_ptr<Connection> conn(new Connection(endpoint, timeout_ms, limits));
  if (endpoint.tls) {
    tls::ClientConfig config;
    config.ca_file = tls.ca_file;
    config.insecure_skip_verify = tls.insecure_skip_verify;
    TAU_ASSIGN_OR_RETURN(conn->tls_context_, tls::ClientContext::Create(config));
  }
  TAU_RETURN_IF_ERROR(conn->Reconnect());
  return conn;
}

Connection::Connection(Endpoint endpoint, int timeout_ms, const Limits& limits)
    : endpoint_(std::move(endpoint)),
      timeout_ms_(timeout_ms),
      limits_(limits),
      deadline_(limits.deadline_ms > 0 ? MonotonicMillis() + limits.deadline_ms : 0) {}

int Connection::WaitMs() const {
  const int wait = timeout_ms_ > 0 ? timeout_ms_ : -1;
  if (deadline_ == 0) return wait;
  const int64_t left = std::max<int64_t>(0, deadline_ - MonotonicMillis());
  return static_cast<int>(wait < 0 ? std::min<int64_t>(left, 1 << 30)
                                   : std::min<int64_t>(left, wait));
}

Status Connection::TimedOut() const {
  if (deadline_ != 0 && MonotonicMillis() >= deadline_)
    return Unavailable(fmt::format("no full answer from {} within {} ms", endpoint_.ToString(),
                                   limits_.deadline_ms));
  return Unavailable(
      fmt::format("no answer from {} within {} ms", endpoint_.ToString(), timeout_ms_));
}

Connection::~Connection() { Close(); }

void Connection::Close() {
  tls_.reset();  // close_notify goes out before the socket closes
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status Connection::Reconnect() {
  Close();
  buf_.clear();
  answers_on_fd_ = 0;
  TAU_ASSIGN_OR_RETURN(int fd, Dial(endpoint_, deadline_));
  const int wait = WaitMs();
  if (wait == 0) {
    ::close(fd);
    return TimedOut();
  }
  if (tls_context_) {
    auto session = tls_context_->Connect(fd, endpoint_.host, wait > 0 ? wait : 5000);
    if (!session.ok()) {
      ::close(fd);
      return Status(session.status().code(),
                    fmt::format("{}: {}", endpoint_.ToString(), session.status().message()));
    }
    tls_ = std::move(session).value();
  }
  fd_ = fd;
  return Status::Ok();
}

Status Connection::SendAll(std::string_view data) {
  if (tls_) {
    // Per stall, each within what is left of the deadline.
    const int wait = WaitMs();
    if (wait == 0) return TimedOut();
    Status s = tls_->WriteAll(data, wait);
    if (!s.ok() && deadline_ != 0 && WaitMs() == 0) return TimedOut();
    return s.ok() ? s : s.WithContext("sending request to " + endpoint_.ToString());
  }
  size_t off = 0;
  while (off < data.size()) {
    // Under a deadline a peer that reads nothing cannot hold the send: it waits in poll.
    ssize_t n = ::send(fd_, data.data() + off, data.size() - off,
                       MSG_NOSIGNAL | (deadline_ != 0 ? MSG_DONTWAIT : 0));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (deadline_ != 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const int wait = WaitMs();
        pollfd p{fd_, POLLOUT, 0};
        if (wait == 0 || ::poll(&p, 1, wait) == 0) return TimedOut();
        continue;
      }
      return IoError("sending request to " + endpoint_.ToString(), errno);
    }
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status Connection::SendRequest(std::string_view method, std::string_view path,
                               std::string_view body, std::string_view content_type,
                               const Headers& headers) {
  // Over TCP the host it was asked for (a receiver behind a proxy routes by it); a Unix socket has
  // none.
  const bool default_port = endpoint_.port == (endpoint_.tls ? 443 : 80);
  const std::string host = endpoint_.unix_socket ? "tau"
                           : default_port        ? endpoint_.host
                                          : fmt::format("{}:{}", endpoint_.host, endpoint_.port);
  std::string head = fmt::format(
      "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tau-cli\r\nAccept: application/json\r\n", method,
      path, host);
  if (!bearer_token_.empty()) head += fmt::format("Authorization: Bearer {}\r\n", bearer_token_);
  for (const auto& [name, value] : headers) head += fmt::format("{}: {}\r\n", name, value);
  if (!body.empty() || method == "POST" || method == "PUT")
    head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", content_type, body.size());
  head += "\r\n";
  TAU_RETURN_IF_ERROR(SendAll(head));
  return SendAll(body);
}

Result<size_t> Connection::Fill() {
  char tmp[65536];
  size_t want = sizeof tmp;
  if (limits_.max_response_bytes > 0) {
    // Never more off the socket than the limit: the rest of a huge answer stays unread.
    if (answer_bytes_ >= limits_.max_response_bytes) {
      answer_limited_ = true;
      return size_t{0};
    }
    want = std::min(want, limits_.max_response_bytes - answer_bytes_);
  }
  if (tls_) {
    const int wait = WaitMs();
    if (wait == 0) return TimedOut();
    Result<size_t> n = tls_->Read(tmp, want, wait);
    if (!n.ok() && deadline_ != 0 && WaitMs() == 0) return TimedOut();
    if (!n.ok())
      return Status(n.status().code(),
                    fmt::format("reading from {}: {}", endpoint_.ToString(), n.status().message()));
    buf_.append(tmp, *n);
    answer_bytes_ += *n;
    return *n;
  }
  while (true) {
    const int wait = WaitMs();
    if (wait == 0) return TimedOut();
    if (wait > 0) {
      pollfd p{fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, wait);
      if (rc == 0) return TimedOut();
      if (rc < 0 && errno == EINTR) continue;
    }
    ssize_t n = ::recv(fd_, tmp, want, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // A reset before any answer: the server closed the connection with our request unread.
      reset_before_answer_ = errno == ECONNRESET && buf_.empty();
      return IoError("reading from " + endpoint_.ToString(), errno);
    }
    buf_.append(tmp, static_cast<size_t>(n));
    answer_bytes_ += static_cast<size_t>(n);
    return static_cast<size_t>(n);
  }
}

Result<Response> Connection::ReadResponse(const std::function<bool(std::string_view)>* on_data,
                                          const OnHead* on_head) {
  Response resp;
  size_t header_end;
  closed_before_answer_ = reset_before_answer_ = false;
  answer_bytes_ = 0;
  answer_limited_ = false;
  while ((header_end = buf_.find("\r\n\r\n")) == std::string::npos) {
    TAU_ASSIGN_OR_RETURN(size_t n, Fill());
    if (n == 0 && answer_limited_) {
      Close();
      return ResourceExhausted(fmt::format("the answer's head from {} is over {} bytes",
                                           endpoint_.ToString(), limits_.max_response_bytes));
    }
    if (n == 0) {
      closed_before_answer_ = buf_.empty();
      return Unavailable("the server closed the connection");
    }
    if (buf_.size() > (1 << 20)) return Internal("response headers too large");
  }
  std::vector<std::string> lines = Split(std::string_view(buf_).substr(0, header_end), '\n');
  for (std::string& l : lines)
    if (!l.empty() && l.back() == '\r') l.pop_back();
  if (lines.empty() || !StartsWith(lines[0], "HTTP/1.") || lines[0].size() < 12)
    return Internal("malformed response from server: " + lines[0]);
  resp.status = std::atoi(lines[0].c_str() + 9);
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string name = lines[i].substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t v = colon + 1;
    while (v < lines[i].size() && lines[i][v] == ' ') ++v;
    resp.headers[name] = lines[i].substr(v);
  }
  buf_.erase(0, header_end + 4);
  if (on_head && *on_head) (*on_head)(resp.status, resp.headers);
  auto deliver = [&](std::string_view data) {
    if (on_data) return (*on_data)(data);
    resp.body.append(data);
    return true;
  };
  bool keep_alive = resp.headers["connection"] != "close";
  // Past Limits::max_response_bytes the body read so far is the answer's, cut there.
  auto cut = [&](std::string_view part) {
    deliver(part);
    buf_.clear();
    resp.truncated = true;
    keep_alive = false;
  };
  if (resp.headers["transfer-encoding"] == "chunked") {
    while (!resp.truncated) {
      size_t eol;
      while ((eol = buf_.find("\r\n")) == std::string::npos) {
        TAU_ASSIGN_OR_RETURN(size_t n, Fill());
        if (n == 0 && answer_limited_) break;
        if (n == 0) return Unavailable("the server closed the connection mid-stream");
      }
      if (answer_limited_) {
        cut({});
        break;
      }
      size_t size = std::strtoul(buf_.substr(0, eol).c_str(), nullptr, 16);
      buf_.erase(0, eol + 2);
      while (buf_.size() < size + 2) {
        TAU_ASSIGN_OR_RETURN(size_t n, Fill());
        if (n == 0 && answer_limited_) break;
        if (n == 0) return Unavailable("the server closed the connection mid-stream");
      }
      if (answer_limited_) {
        cut(std::string_view(buf_).substr(0, std::min(size, buf_.size())));
        break;
      }
      if (size == 0) {
        buf_.erase(0, 2);
        break;
      }
      bool more = deliver(std::string_view(buf_).substr(0, size));
      buf_.erase(0, size + 2);
      if (!more) {
        keep_alive = false;
        break;
      }
    }
  } else if (resp.headers.count("content-length")) {
    size_t length = std::strtoull(resp.headers["content-length"].c_str(), nullptr, 10);
    while (buf_.size() < length) {
      TAU_ASSIGN_OR_RETURN(size_t n, Fill());
      if (n == 0 && answer_limited_) break;
      if (n == 0) return Unavailable("the server closed the connection mid-body");
    }
    if (answer_limited_) {
      cut(buf_);
    } else {
      deliver(std::string_view(buf_).substr(0, length));
      buf_.erase(0, length);
    }
  } else {
    while (true) {
      TAU_ASSIGN_OR_RETURN(size_t n, Fill());
      if (n == 0) break;
    }
    resp.truncated = answer_limited_;
    deliver(buf_);
    buf_.clear();
    keep_alive = false;
  }
  if (!keep_alive) Close();
  return resp;
}

Result<Response> Connection::Call(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view content_type,
                                  const Headers& headers) {
  for (int attempt = 0;; ++attempt) {
    if (fd_ < 0) TAU_RETURN_IF_ERROR(Reconnect());
    const bool reused = answers_on_fd_ > 0;
    Status sent = SendRequest(method, path, body, content_type, headers);
    Result<Response> resp = sent.ok() ? ReadResponse(nullptr) : Result<Response>(sent);
    if (resp.ok()) {
      ++answers_on_fd_;
      return resp;
    }
    // A kept-alive connection that the server closed while it sat idle fails before any byte of
    // an answer, and the request goes again on a fresh connection when it cannot have been acted
    // on: it could not be sent, the server reset the connection with it unread, or it only reads.
    // A request that was read may have been acted on (a server killed between committing a run
    // and answering): repeating it could submit a run twice.
    const bool unanswered = !sent.ok() || reset_before_answer_ ||
                            (closed_before_answer_ && (method == "GET" || method == "HEAD"));
    if (reused && unanswered && attempt == 0) {
      Close();
      continue;
    }
    if (method == "GET" || !sent.ok()) return resp.status();
    return Status(resp.status().code(),
                  resp.status().message() +
                      " before answering; the request may have taken effect (for a submission, "
                      "`tau list` shows whether the run exists)");
  }
}

Result<int> Connection::Stream(std::string_view method, std::string_view path,
                               const std::function<bool(std::string_view)>& on_data,
                               const OnHead& on_head) {
  if (fd_ < 0) TAU_RETURN_IF_ERROR(Reconnect());
  int saved_timeout = timeout_ms_;
  TAU_RETURN_IF_ERROR(SendRequest(method, path, {}, "application/json", {}));
  timeout_ms_ = 0;  // a followed stream can be quiet for a long time
  auto resp = ReadResponse(&on_data, &on_head);
  timeout_ms_ = saved_timeout;
  if (!resp.ok()) return resp.status();
  return resp->status;
}

Status ErrorFromResponse(const Response& response) {
  auto j = nlohmann::json::parse(response.body, nullptr, false);
  std::string message = response.body;
  StatusCode code = StatusCode::kInternal;
  switch (response.status) {
    case 400:
      code = StatusCode::kInvalidArgument;
      break;
    case 401:
      code = StatusCode::kUnauthenticated;
      break;
    case 403:
      code = StatusCode::kPermissionDenied;
      break;
    case 404:
      code = StatusCode::kNotFound;
      break;
    case 409:
      code = StatusCode::kAlreadyExists;
      break;
    case 412:
      code = StatusCode::kFailedPrecondition;
      break;
    case 413:
      code = StatusCode::kResourceExhausted;
      break;
    case 429:
      code = StatusCode::kResourceExhausted;
      break;
    case 503:
      code = StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object()) {
    const nlohmann::json& error = j["error"];
    message = error.value("message", message);
    // The server names the code it failed with; the HTTP status is the fallback, as several
    // codes share one (kIo and kInternal are both 500).
    auto named = error.contains("code") && error["code"].is_string()
                     ? ParseStatusCode(error["code"].get_ref<const std::string&>())
                     : std::nullopt;
    if (named && *named != StatusCode::kOk) code = *named;
  }
  return Status(code, message);
}

}  // namespace tau::client
