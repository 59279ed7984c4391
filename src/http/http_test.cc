// The HTTP server's handling of the protocol's edges, over real sockets: framing that could be
// read two ways, bare-LF requests, HEAD, 405's Allow, header limits, slow clients and connection
// budgets.
#include "http/http.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace tau::http {
namespace {

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tau-http-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    http_.Route("GET", "/hello", [](const HttpRequest&, HttpResponse& res) {
      res.set_content("hello\n", "text/plain");
    });
    http_.Route("POST", "/echo", [](const HttpRequest& req, HttpResponse& res) {
      res.set_content(req.body, "text/plain");
    });
    http_.set_limits({/*max_connections=*/4, /*header_deadline_ms=*/800});
    ASSERT_TRUE(http_.ListenUnix(dir_ + "/sock").ok());
    ASSERT_TRUE(http_.ListenTcp("127.0.0.1", 0).ok());
    serving_ = std::thread([this] { http_.Serve(); });
  }
  void TearDown() override {
    for (int fd : open_) ::close(fd);
    http_.Shutdown(1000);
    serving_.join();
    std::system(("rm -rf " + dir_).c_str());
  }

  int ConnectUnix() {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string path = dir_ + "/sock";
    std::copy(path.begin(), path.end(), addr.sun_path);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return Track(fd);
  }
  int ConnectTcp() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(http_.tcp_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return Track(fd);
  }
  int Track(int fd) {
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    open_.push_back(fd);
    return fd;
  }
  static void Send(int fd, const std::string& data) {
    ASSERT_EQ(::send(fd, data.data(), data.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(data.size()));
  }
  // Everything the server sends until it closes the connection (or 5 s pass).
  static std::string ReadAll(int fd) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }
  std::string Exchange(const std::string& request) {
    int fd = ConnectUnix();
    Send(fd, request);
    return ReadAll(fd);
  }
  static std::string StatusLine(const std::string& reply) {
    return reply.substr(0, reply.find('\r'));
  }

  std::string dir_;
  HttpServer http_;
  std::thread serving_;
  std::vector<int> open_;
};

TEST_F(HttpTest, ConflictingContentLengthsAreRefused) {
  // Read with the first length, "hello" would be the body; with the last, the next request.
  std::string reply =
      Exchange("POST /echo HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 0\r\n\r\nhello");
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 400 Bad Request");
  EXPECT_NE(reply.find("conflicting Content-Length"), std::string::npos) << reply;
  // The same length twice is one length.
  reply = Exchange(
      "POST /echo HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
      "hello");
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 200 OK");
  EXPECT_EQ(reply.substr(reply.size() - 5), "hello");
}

TEST_F(HttpTest, BareLineFeedsEndLinesToo) {
  std::string reply = Exchange("GET /hello HTTP/1.1\nHost: x\nConnection: close\n\n");
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 200 OK");
  EXPECT_NE(reply.find("\r\n\r\nhello\n"), std::string::npos) << reply;
}

TEST_F(HttpTest, HeadIsGetWithoutTheBody) {
  std::string reply = Exchange("HEAD /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 200 OK");
  EXPECT_NE(reply.find("Content-Length: 6\r\n"), std::string::npos) << reply;
  EXPECT_EQ(reply.substr(reply.size() - 4), "\r\n\r\n") << reply;  // and nothing after the headers
}

TEST_F(HttpTest, MethodNotAllowedSaysWhichAre) {
  std::string reply = Exchange("DELETE /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_NE(reply.find("Allow: GET, HEAD\r\n"), std::string::npos) << reply;
  reply = Exchange("GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_NE(reply.find("Allow: POST\r\n"), std::string::npos) << reply;
}

TEST_F(HttpTest, HeadersOverTheLimitAreRefusedEvenInOneWrite) {
  std::string reply =
      Exchange("GET /hello HTTP/1.1\r\nX-Big: " + std::string(70 * 1024, 'a') + "\r\n\r\n");
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 431 Request Header Fields Too Large");
}

TEST_F(HttpTest, HeadersMustArriveWithinTheDeadline) {
  // One byte every 200 ms: each read makes progress, the request as a whole does not.
  int fd = ConnectUnix();
  const std::string request = "GET /hello HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
  auto start = std::chrono::steady_clock::now();
  for (char c : request) {
    if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;  // the server has given up on us
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(3)) break;
  }
  std::string reply = ReadAll(fd);
  EXPECT_EQ(StatusLine(reply), "HTTP/1.1 408 Request Timeout") << reply;
}

TEST_F(HttpTest, NetworkClientsCannotTakeTheLocalSocketsConnections) {
  for (int i = 0; i < 4; ++i) ConnectTcp();  // idle: they hold their connections
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int extra = ConnectTcp();
  EXPECT_EQ(StatusLine(ReadAll(extra)), "HTTP/1.1 503 Service Unavailable");
  EXPECT_EQ(StatusLine(Exchange("GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n")),
            "HTTP/1.1 200 OK");
}

TEST(HttpListenTest, APathThatIsNotASocketIsLeftAlone) {
  char tmpl[] = "/tmp/tau-http-listen-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(std::system(("mkdir " + dir + "/sock && echo keep > " + dir + "/file").c_str()), 0);
  for (const std::string& path : {dir + "/sock", dir + "/file"}) {
    HttpServer http;
    Status s = http.ListenUnix(path);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("exists and is not a socket"), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(::access((dir + "/file").c_str(), F_OK), 0);  // not deleted
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace tau::http
