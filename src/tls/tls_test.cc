// TLS end to end over loopback: tau's HttpServer with a TLS listener, called by client::Connection
// over https://. Certificates are made at test time with the openssl command-line tool: a CA, a
// server certificate for 127.0.0.1 and localhost, one for another name, and an unrelated CA.
#include "tls/tls.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "client/client.h"
#include "http/http.h"
#include "testing/test_certs.h"

namespace tau {
namespace {

using testutil::MakeCa;
using testutil::MakeCert;
using testutil::Shell;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tau-tls-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    ASSERT_TRUE(MakeCa(*dir_, "ca"));
    ASSERT_TRUE(MakeCa(*dir_, "other-ca"));
    ASSERT_TRUE(MakeCert(*dir_, "ca", "server", "IP:127.0.0.1,DNS:localhost"));
    ASSERT_TRUE(MakeCert(*dir_, "ca", "elsewhere", "DNS:elsewhere.test"));
  }
  static void TearDownTestSuite() {
    Shell("rm -rf " + *dir_);
    delete dir_;
  }

  void SetUp() override {
    ASSERT_TRUE(tls::EnsureLoaded().ok()) << tls::EnsureLoaded().ToString();
    http_.Route("GET", "/hello", [](const http::HttpRequest&, http::HttpResponse& res) {
      res.set_content("{\"hello\": \"tls\"}", "application/json");
    });
    http_.Route("GET", "/big", [](const http::HttpRequest&, http::HttpResponse& res) {
      res.set_content(std::string(3 << 20, 'x'), "text/plain");
    });
    http_.Route("GET", "/auth", [](const http::HttpRequest& req, http::HttpResponse& res) {
      auto it = req.headers.find("authorization");
      res.set_content(it == req.headers.end() ? "" : it->second, "text/plain");
    });
    http_.Route("GET", "/stream", [](const http::HttpRequest&, http::HttpResponse& res) {
      auto sent = std::make_shared<int>(0);
      res.content_type = "text/plain";
      res.stream = [sent](http::ChunkSink& sink) {
        if (*sent == 3) return false;
        return sink.Write(fmt::format("chunk {}\n", ++*sent));
      };
    });
    http::TlsServerConfig good{Path("server.pem"), Path("server.key")};
    ASSERT_TRUE(http_.ListenTcp("127.0.0.1", 0, &good).ok());
    port_ = http_.tcp_port();
    serving_ = std::thread([this] { http_.Serve(); });
  }
  void TearDown() override {
    http_.Shutdown(1000);
    serving_.join();
  }

  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  client::Endpoint Https(const std::string& host, int port) {
    auto e = client::ParseEndpoint(fmt::format("https://{}:{}", host, port));
    EXPECT_TRUE(e.ok());
    return *e;
  }
  client::TlsOptions TrustCa(const std::string& ca = "ca.pem") {
    return client::TlsOptions{Path(ca), false};
  }

  static std::string* dir_;
  http::HttpServer http_;
  std::thread serving_;
  int port_ = 0;
};
std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, ParsesHttpsEndpoints) {
  auto e = client::ParseEndpoint("https://example.test:8443/");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->tls);
  EXPECT_FALSE(e->unix_socket);
  EXPECT_EQ(e->host, "example.test");
  EXPECT_EQ(e->port, 8443);
  EXPECT_EQ(e->ToString(), "https://example.test:8443");
  auto plain = client::ParseEndpoint("http://example.test:80");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tls);
  EXPECT_FALSE(client::ParseEndpoint("https://example.test").ok());
}

TEST_F(TlsTest, CallsOverTlsWithKeepAlive) {
  auto conn = client::Connection::Open(Https("127.0.0.1", port_), TrustCa());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  for (int i = 0; i < 3; ++i) {
    auto resp = (*conn)->Call("GET", "/hello");
    ASSERT_TRUE(resp.ok()) << resp.status().ToString();
    EXPECT_EQ(resp->status, 200);
    EXPECT_EQ(resp->body, "{\"hello\": \"tls\"}");
  }
  auto big = (*conn)->Call("GET", "/big");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->body.size(), size_t{3} << 20);
}

TEST_F(TlsTest, VerifiesHostNames) {
  auto by_name = client::Connection::Open(Https("localhost", port_), TrustCa());
  ASSERT_TRUE(by_name.ok()) << by_name.status().ToString();
  ASSERT_TRUE((*by_name)->Call("GET", "/hello").ok());

  http::TlsServerConfig elsewhere{Path("elsewhere.pem"), Path("elsewhere.key")};
  http::HttpServer other;
  ASSERT_TRUE(other.ListenTcp("127.0.0.1", 0, &elsewhere).ok());
  std::thread serving([&] { other.Serve(); });
  auto mismatch = client::Connection::Open(Https("127.0.0.1", other.tcp_port()), TrustCa());
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("mismatch"), std::string::npos)
      << mismatch.status().ToString();
  // Without verification the same server is reachable (tests and debugging only).
  auto insecure =
      client::Connection::Open(Https("127.0.0.1", other.tcp_port()), client::TlsOptions{"", true});
  ASSERT_TRUE(insecure.ok()) << insecure.status().ToString();
  EXPECT_TRUE((*insecure)->Call("GET", "/missing").ok());
  other.Shutdown(1000);
  serving.join();
}

TEST_F(TlsTest, RefusesAnUntrustedCa) {
  auto wrong = client::Connection::Open(Https("127.0.0.1", port_), TrustCa("other-ca.pem"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("certificate verify failed: unable to get local issuer"),
            std::string::npos)
      << wrong.status().ToString();
  // The system's store does not know the test CA either.
  auto system = client::Connection::Open(Https("127.0.0.1", port_));
  ASSERT_FALSE(system.ok());
  EXPECT_NE(system.status().message().find("certificate verify failed"), std::string::npos)
      << system.status().ToString();
}

TEST_F(TlsTest, StreamsChunkedResponses) {
  auto conn = client::Connection::Open(Https("127.0.0.1", port_), TrustCa());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  std::string got;
  auto status = (*conn)->Stream("GET", "/stream", [&](std::string_view data) {
    got.append(data);
    return true;
  });
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(*status, 200);
  EXPECT_EQ(got, "chunk 1\nchunk 2\nchunk 3\n");
  // The connection is still good for an ordinary call after the stream.
  auto resp = (*conn)->Call("GET", "/hello");
  ASSERT_TRUE(resp.ok()) << resp.status().ToString();
  EXPECT_EQ(resp->status, 200);
}

TEST_F(TlsTest, SendsTheBearerToken) {
  auto conn = client::Connection::Open(Https("127.0.0.1", port_), TrustCa());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  auto none = (*conn)->Call("GET", "/auth");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->body, "");
  (*conn)->set_bearer_token("tau_secret_123");
  auto with = (*conn)->Call("GET", "/auth");
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->body, "Bearer tau_secret_123");
}

// A raw TCP connection to the test server: sends `request`, returns what comes back until close.
std::string RawExchange(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST_F(TlsTest, AnswersPlaintextHttpAndKeepsServing) {
  std::string answer = RawExchange(port_, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), size_t{0}) << answer;
  EXPECT_NE(answer.find("requires TLS"), std::string::npos) << answer;
  // Garbage that starts like a handshake record fails the handshake; the server shrugs it off.
  std::string garbage("\x16\x03\x01\x00\x05hello", 10);
  RawExchange(port_, garbage);
  auto conn = client::Connection::Open(Https("127.0.0.1", port_), TrustCa());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  auto resp = (*conn)->Call("GET", "/hello");
  ASSERT_TRUE(resp.ok()) << resp.status().ToString();
  EXPECT_EQ(resp->status, 200);
}

TEST_F(TlsTest, ASilentClientDoesNotBlockOthers) {
  int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  auto conn = client::Connection::Open(Https("127.0.0.1", port_), TrustCa());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  EXPECT_TRUE((*conn)->Call("GET", "/hello").ok());
  ::close(silent);
}

TEST(TlsConfigTest, NamesTheFileAtFault) {
  http::HttpServer http;
  http::TlsServerConfig missing{"/nonexistent/cert.pem", "/nonexistent/key.pem"};
  Status s = http.ListenTcp("127.0.0.1", 0, &missing);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/cert.pem"), std::string::npos) << s.ToString();

  char tmpl[] = "/tmp/tau-tls-bad-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::ofstream(dir + "/junk.pem") << "not a certificate\n";
  http::TlsServerConfig junk{dir + "/junk.pem", dir + "/junk.pem"};
  s = http.ListenTcp("127.0.0.1", 0, &junk);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("junk.pem"), std::string::npos) << s.ToString();

  auto ca = client::Connection::Open(*client::ParseEndpoint("https://127.0.0.1:1"),
                                     client::TlsOptions{dir + "/missing-ca.pem", false});
  ASSERT_FALSE(ca.ok());
  EXPECT_NE(ca.status().message().find("missing-ca.pem"), std::string::npos)
      << ca.status().ToString();
  Shell("rm -rf " + dir);
}

}  // namespace
}  // namespace tau
