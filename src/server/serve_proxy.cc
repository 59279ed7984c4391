// A service's replicas over plain HTTP/1.0 on 127.0.0.1: the probes and the endpoint's forwarding
// (services.h). HTTP/1.0 keeps both simple and exact: the replica answers without chunking and
// closes the connection when its answer is whole, so an answer cut short is told from a whole one.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/strings.h"
#include "server/services.h"

namespace tau::server {
namespace {

constexpr size_t kMaxAnswerBytes = 64u << 20;

int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Connection {
 public:
  // `stop`, when given, ends a wait early (as a time-out) once it is raised.
  explicit Connection(const std::atomic<bool>* stop = nullptr) : stop_(stop) {}
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  // "" when connected before `deadline` (monotonic ms).
  std::string Connect(int port, int64_t deadline) {
    deadline_ = deadline;
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) return fmt::format("socket: {}", std::strerror(errno));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return "";
    if (errno != EINPROGRESS)
      return fmt::format("connect to port {}: {}", port, std::strerror(errno));
    if (!Wait(POLLOUT)) return fmt::format("connect to port {}: timed out", port);
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return fmt::format("connect to port {}: {}", port, std::strerror(err));
    return "";
  }
  std::string Send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!Wait(POLLOUT)) return "sending: timed out";
      } else if (n < 0 && errno != EINTR) {
        return fmt::format("sending: {}", std::strerror(errno));
      }
    }
    return "";
  }
  // Reads until the peer closes (or `enough` says the answer is whole); "" when it did.
  template <typename Enough>
  std::string ReadAll(std::string* out, Enough enough) {
    char buf[16384];
    while (true) {
      if (enough(*out)) return "";
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        out->append(buf, static_cast<size_t>(n));
        if (out->size() > kMaxAnswerBytes) return "the answer is over 64 MiB";
      } else if (n == 0) {
        return "";
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!Wait(POLLIN)) return "reading the answer: timed out";
      } else if (errno != EINTR) {
        return fmt::format("reading the answer: {}", std::strerror(errno));
      }
    }
  }

 private:
  bool Wait(short events) {
    while (true) {
      const int64_t left = deadline_ - MonoMs();
      if (left <= 0 || (stop_ && stop_->load())) return false;
      pollfd p{fd_, events, 0};
      // In slices, when a stop may come.
      int rc = ::poll(&p, 1, static_cast<int>(stop_ ? std::min<int64_t>(left, 100) : left));
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }
  const std::atomic<bool>* const stop_;
  int fd_ = -1;
  int64_t deadline_ = 0;
};

bool HopByHop(const std::string& lower) {
  return lower == "connection" || lower == "keep-alive" || lower == "transfer-encoding" ||
         lower == "te" || lower == "trailer" || lower == "upgrade" || lower == "proxy-connection" ||
         lower == "proxy-authorization" || lower == "proxy-authenticate" ||
         lower == "content-length" || lower == "host" || lower == "expect" ||
         // The caller's credentials for tau are not the replica's business.
         lower == "authorization" || lower == "cookie";
}

// The status code of an answer's first line ("HTTP/1.x NNN ..."); 0 when it is not one.
int StatusOf(std::string_view head) {
  if (head.size() < 12 || head.substr(0, 5) != "HTTP/") return 0;
  size_t sp = head.find(' ');
  if (sp == std::string_view::npos || sp + 4 > head.size()) return 0;
  int code = 0;
  for (size_t i = sp + 1; i < sp + 4; ++i) {
    if (head[i] < '0' || head[i] > '9') return 0;
    code = code * 10 + (head[i] - '0');
  }
  return code;
}

}  // namespace

std::string ProbeReplica(int port, const std::string& http_path, int64_t timeout_ms,
                         const std::atomic<bool>* stop) {
  const int64_t deadline = MonoMs() + timeout_ms;
  Connection c(stop);
  if (std::string e = c.Connect(port, deadline); !e.empty()) return e;
  if (http_path.empty()) return "";
  if (std::string e = c.Send(fmt::format("GET {} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nUser-Agent: "
                                         "tau-probe\r\n\r\n",
                                         http_path, port));
      !e.empty())
    return e;
  std::string answer;
  std::string e =
      c.ReadAll(&answer, [](const std::string& a) { return a.find("\r\n") != std::string::npos; });
  if (!e.empty()) return e;
  const int status = StatusOf(answer.substr(0, answer.find("\r\n")));
  if (status == 0) return fmt::format("GET {} answered no HTTP status line", http_path);
  if (status < 200 || status >= 400) return fmt::format("GET {} answered {}", http_path, status);
  return "";
}

ForwardResult ForwardRequest(int port, const std::string& method, const std::string& target,
                             const std::map<std::string, std::string>& headers,
                             const std::string& body, int64_t timeout_ms) {
  ForwardResult out;
  const int64_t deadline = MonoMs() + timeout_ms;
  Connection c;
  if (std::string e = c.Connect(port, deadline); !e.empty()) {
    out.error = e;
    return out;
  }
  out.connected = true;
  std::string head = fmt::format("{} {} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n", method, target, port);
  for (const auto& [name, value] : headers)
    if (!HopByHop(name)) head += fmt::format("{}: {}\r\n", name, value);
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH")
    head += fmt::format("Content-Length: {}\r\n", body.size());
  head += "\r\n";
  head += body;
  if (std::string e = c.Send(head); !e.empty()) {
    out.error = e;
    return out;
  }
  std::string answer;
  if (std::string e = c.ReadAll(&answer, [](const std::string&) { return false; }); !e.empty()) {
    out.error = e;
    return out;
  }
  const size_t end = answer.find("\r\n\r\n");
  if (end == std::string::npos) {
    out.error = "the replica closed the connection before a whole answer";
    return out;
  }
  std::string_view head_view(answer.data(), end);
  const size_t first = head_view.find("\r\n");
  out.status = StatusOf(head_view.substr(0, first));
  if (out.status == 0) {
    out.error = "the replica's answer has no HTTP status line";
    return out;
  }
  std::optional<size_t> length;
  size_t at = first == std::string_view::npos ? head_view.size() : first + 2;
  while (at < head_view.size()) {
    size_t eol = head_view.find("\r\n", at);
    if (eol == std::string_view::npos) eol = head_view.size();
    std::string_view line = head_view.substr(at, eol - at);
    at = eol + 2;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name(Trim(line.substr(0, colon)));
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::string value(Trim(line.substr(colon + 1)));
    if (name == "content-length") {
      length = static_cast<size_t>(std::strtoull(value.c_str(), nullptr, 10));
      continue;
    }
    if (HopByHop(name) || name == "server" || name == "date") continue;
    out.headers.emplace_back(std::move(name), std::move(value));
  }
  out.body = answer.substr(end + 4);
  if (length && out.body.size() < *length) {
    out.error = fmt::format("the replica's answer was cut short ({} of {} bytes)", out.body.size(),
                            *length);
    return out;
  }
  if (length) out.body.resize(*length);
  out.answered = true;
  return out;
}

}  // namespace tau::server
