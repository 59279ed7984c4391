// The client's connection handling against a scripted server on a Unix socket: which failures it
// repeats a request after, and which it must not.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "client/client.h"
#include "client/tau_api.h"

namespace tau::client {
namespace {

// Accepts connections one after another; for each request it reads, `script` says what to do:
// answer it (keeping the connection), or close without answering.
class ScriptedServer {
 public:
  enum Action { kAnswer, kCloseWithoutAnswer, kAnswerThenClose };
  explicit ScriptedServer(std::vector<Action> script) : script_(std::move(script)) {
    path_ = ::testing::TempDir() + "tau-client-test-" + std::to_string(::getpid()) + ".sock";
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::string endpoint() const { return "unix://" + path_; }
  int requests() const { return requests_; }

 private:
  void Serve() {
    size_t step = 0;
    while (step < script_.size()) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      bool open = true;
      while (open && step < script_.size()) {
        std::string got;
        char buf[4096];
        while (got.find("\r\n\r\n") == std::string::npos) {
          ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          got.append(buf, static_cast<size_t>(n));
        }
        if (got.empty()) break;  // the client closed this connection
        // The body too, so that the answer never comes before the client has sent it all.
        size_t length_at = got.find("Content-Length: ");
        size_t body = got.find("\r\n\r\n") + 4;
        size_t length = length_at == std::string::npos ? 0 : std::stoul(got.substr(length_at + 16));
        while (got.size() < body + length) {
          ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          got.append(buf, static_cast<size_t>(n));
        }
        ++requests_;
        Action a = script_[step++];
        if (a != kCloseWithoutAnswer) {
          std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
          (void)!::write(c, reply.data(), reply.size());
        }
        open = a == kAnswer;
      }
      ::close(c);
    }
  }
  std::vector<Action> script_;
  std::string path_;
  int fd_ = -1;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::unique_ptr<Connection> Open(const ScriptedServer& server) {
  auto endpoint = ParseEndpoint(server.endpoint());
  EXPECT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  auto conn = Connection::Open(*endpoint, 2000);
  EXPECT_TRUE(conn.ok()) << conn.status().ToString();
  return std::move(*conn);
}

TEST(ConnectionTest, AnIdleConnectionTheServerClosedIsReplacedAndTheRequestSentAgain) {
  ScriptedServer server({ScriptedServer::kAnswerThenClose, ScriptedServer::kAnswer});
  auto conn = Open(server);
  ASSERT_TRUE(conn->Call("GET", "/a", "", "application/json").ok());
  // The server closed the kept-alive connection after its answer; the next call finds it closed.
  auto second = conn->Call("POST", "/b", "{}", "application/json");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(server.requests(), 2);
}

TEST(ConnectionTest, ARequestTheServerTookButNeverAnsweredIsNotSentTwice) {
  // What a server killed between committing a submission and answering it looks like.
  ScriptedServer server({ScriptedServer::kCloseWithoutAnswer, ScriptedServer::kAnswer});
  auto conn = Open(server);
  auto got = conn->Call("POST", "/api/v1/runs", "{}", "application/json");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("may have taken effect"), std::string::npos)
      << got.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(server.requests(), 1);
}

// A peer on 127.0.0.1 that takes one connection, reads the request's head, then does `act` with
// the socket (answers as a hostile webhook receiver would).
class TcpPeer {
 public:
  explicit TcpPeer(std::function<void(int)> act) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, act = std::move(act)] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string got;
      char buf[4096];
      while (got.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      // And its body: a close with it unread would reset the connection under the answer.
      size_t length_at = got.find("Content-Length: ");
      size_t want = got.find("\r\n\r\n") + 4 +
                    (length_at == std::string::npos ? 0 : std::stoul(got.substr(length_at + 16)));
      while (got.size() < want) {
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      act(c);
      ::close(c);
    });
  }
  ~TcpPeer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  Endpoint endpoint() const {
    Endpoint e;
    e.unix_socket = false;
    e.host = "127.0.0.1";
    e.port = port_;
    return e;
  }
  // Writes all of `data`; false once the client has gone.
  static bool Send(int fd, std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

int64_t MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

TEST(LimitsTest, APeerTricklingAByteAtATimeIsCutAtTheDeadline) {
  // Each byte comes well within the per-wait timeout (1 s): only the deadline ends the call.
  TcpPeer peer([](int c) {
    if (!TcpPeer::Send(c, "HTTP/1.1 200 OK\r\n")) return;
    for (int i = 0; i < 100 && TcpPeer::Send(c, "X"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  Limits limits;
  limits.deadline_ms = 500;
  const auto start = std::chrono::steady_clock::now();
  auto conn = Connection::Open(peer.endpoint(), TlsOptions{}, limits, 1000);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  auto got = (*conn)->Call("POST", "/hook", "{}");
  const int64_t took = MillisSince(start);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message().rfind("no full answer from http://127.0.0.1:", 0), 0u)
      << got.status().message();
  EXPECT_NE(got.status().message().find("within 500 ms"), std::string::npos);
  EXPECT_GE(took, 450);
  EXPECT_LT(took, 2500);  // the peer trickles for 5 s
}

// A peer answering 200 with a body far larger than the limit, whatever its framing; it stops
// sending when the client goes (or after 256 MiB).
void HugeAnswer(int c, const std::string& head, bool chunked) {
  if (!TcpPeer::Send(c, head)) return;
  const std::string mib(1 << 20, 'x');
  const std::string chunk = fmt::format("{:x}\r\n{}\r\n", mib.size(), mib);
  for (int i = 0; i < 256; ++i)
    if (!TcpPeer::Send(c, chunked ? chunk : mib)) return;
}

TEST(LimitsTest, AHugeAnswerIsCutAtTheLimitWhateverItsFraming) {
  const std::vector<std::pair<std::string, bool>> answers = {
      {"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n", false},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true},
      {"HTTP/1.1 503 Busy\r\nConnection: close\r\n\r\n", false}};
  for (const auto& answer : answers) {
    // Copies: clang 14 cannot capture a structured binding.
    const std::string head = answer.first;
    const bool chunked = answer.second;
    TcpPeer peer([&](int c) { HugeAnswer(c, head, chunked); });
    Limits limits;
    limits.max_response_bytes = 4096;
    const auto start = std::chrono::steady_clock::now();
    auto conn = Connection::Open(peer.endpoint(), TlsOptions{}, limits, 5000);
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    auto got = (*conn)->Call("POST", "/hook", "{}");
    ASSERT_TRUE(got.ok()) << head << got.status().ToString();
    EXPECT_EQ(got->status, head.find(" 503 ") != std::string::npos ? 503 : 200);
    EXPECT_TRUE(got->truncated) << head;
    EXPECT_LE(got->body.size(), 4096u - head.size()) << head;
    EXPECT_GT(got->body.size(), 0u) << head;
    EXPECT_LT(MillisSince(start), 2000) << head;
  }
}

TEST(LimitsTest, AHeadOverTheLimitIsRefusedAndAnAnswerWithinItIsWhole) {
  {
    TcpPeer peer([](int c) {
      TcpPeer::Send(c, "HTTP/1.1 200 OK\r\nX-Pad: " + std::string(64 << 10, 'p') + "\r\n\r\n");
    });
    Limits limits;
    limits.max_response_bytes = 4096;
    auto conn = Connection::Open(peer.endpoint(), TlsOptions{}, limits, 5000);
    ASSERT_TRUE(conn.ok());
    auto got = (*conn)->Call("POST", "/hook", "{}");
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted) << got.status().ToString();
  }
  TcpPeer peer(
      [](int c) { TcpPeer::Send(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"); });
  Limits limits;
  limits.max_response_bytes = 4096;
  limits.deadline_ms = 5000;
  auto conn = Connection::Open(peer.endpoint(), TlsOptions{}, limits, 5000);
  ASSERT_TRUE(conn.ok());
  auto got = (*conn)->Call("POST", "/hook", "{}");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->status, 201);
  EXPECT_EQ(got->body, "ok");
  EXPECT_FALSE(got->truncated);
}

// The scripted server answers {} to everything: JSON, but no reply of the API's.
TEST(TauApiTest, AReplyOfTheWrongShapeNamesTheRequestAndTheMember) {
  ScriptedServer server({ScriptedServer::kAnswer, ScriptedServer::kAnswer, ScriptedServer::kAnswer,
                         ScriptedServer::kAnswer});
  auto conn = Open(server);
  TauApi tau(conn.get());
  // The evidence record is read by evidence::, with a schema of its own: the JSON as it came.
  auto record = tau.GetEvidence("a-1");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(*record, nlohmann::json::object());
  auto me = tau.Whoami();
  ASSERT_FALSE(me.ok());
  EXPECT_EQ(me.status().message(),
            "the server's reply to GET /api/v1/whoami is not what this tau reads: member 'user' "
            "is missing");
  auto version = tau.Version();
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.status().message(),
            "the server's reply to GET /api/v1/version is not what this tau reads: member "
            "'version' is missing");
  RunQuery failed;
  failed.limit = 5;
  failed.state = "Failed";
  auto runs = tau.ListRuns(failed);
  ASSERT_FALSE(runs.ok());
  EXPECT_NE(runs.status().message().find("GET /api/v1/runs?limit=5&state=Failed"),
            std::string::npos)
      << runs.status().message();
}

TEST(ErrorFromResponseTest, TheCodeTheServerNamesWinsOverTheHttpStatus) {
  // kIo and kInternal share 500: only the body tells them apart.
  Status s =
      ErrorFromResponse({500, {}, R"({"error": {"code": "IoError", "message": "disk said no"}})"});
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_EQ(s.message(), "disk said no");
  s = ErrorFromResponse({404, {}, R"({"error": {"code": "NotFound", "message": "no run x"}})"});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

TEST(ErrorFromResponseTest, WithoutAKnownCodeTheHttpStatusDecides) {
  // No body, a code that is none of tau's, a code that is no error, a code that is no string.
  Status s = ErrorFromResponse({503, {}, "busy"});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "busy");
  s = ErrorFromResponse({409, {}, R"({"error": {"code": "Conflict", "message": "taken"}})"});
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), "taken");
  s = ErrorFromResponse({400, {}, R"({"error": {"code": "OK", "message": "odd"}})"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = ErrorFromResponse({403, {}, R"({"error": {"code": 7, "message": "odd"}})"});
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  s = ErrorFromResponse({502, {}, R"({"error": {"message": "upstream"}})"});
  EXPECT_EQ(s.code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace tau::client
