// The client's connection handling against a scripted server on a Unix socket: which failures it
// repeats a request after, and which it must not.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

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
