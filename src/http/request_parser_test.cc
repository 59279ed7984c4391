// The request parser alone: what a head becomes, and what it is refused with (status, code and
// message), without a socket.
#include "http/request_parser.h"

#include <gtest/gtest.h>

#include <string>

namespace tau::http {
namespace {

constexpr size_t kLimit = 1000;

RequestHead Parse(const std::string& text) {
  RequestHead head;
  HeadError error;
  EXPECT_TRUE(ParseRequestHead(text, kLimit, &head, &error)) << error.message;
  return head;
}

HeadError Refuse(const std::string& text) {
  RequestHead head;
  HeadError error;
  EXPECT_FALSE(ParseRequestHead(text, kLimit, &head, &error)) << text;
  return error;
}

TEST(HeaderEnd, FindsTheEmptyLineWithCrlfOrBareLf) {
  size_t consumed = 0;
  EXPECT_EQ(HeaderEnd("GET / HTTP/1.1\r\nA: b\r\n\r\nbody", &consumed), 21u);
  EXPECT_EQ(consumed, 24u);
  EXPECT_EQ(HeaderEnd("GET / HTTP/1.1\nA: b\n\nbody", &consumed), 19u);
  EXPECT_EQ(consumed, 21u);
  EXPECT_EQ(HeaderEnd("GET / HTTP/1.1\r\nA: b\r\n", &consumed), std::string_view::npos);
  EXPECT_EQ(HeaderEnd("", &consumed), std::string_view::npos);
}

TEST(ParseRequestHead, ReadsTheRequestLineQueryAndFields) {
  RequestHead h = Parse(
      "GET /api/v1/runs/a%2Fb?state=Running&q=x+y&flag&state=Failed HTTP/1.1\r\n"
      "Host: example\r\nX-Trace:  one \t\r\nx-trace: two");
  EXPECT_EQ(h.method, "GET");
  EXPECT_EQ(h.path, "/api/v1/runs/a/b");
  EXPECT_EQ(h.params.at("state"), "Running");  // the first of repeated keys
  EXPECT_EQ(h.params.at("q"), "x y");
  EXPECT_EQ(h.params.at("flag"), "");
  EXPECT_EQ(h.headers.at("host"), "example");
  EXPECT_EQ(h.headers.at("x-trace"), "one, two");  // trimmed, joined as a list
  EXPECT_TRUE(h.keep_alive);
  EXPECT_EQ(h.content_length, 0u);
  EXPECT_FALSE(h.expect_continue);
}

TEST(ParseRequestHead, PlusIsASpaceOnlyInTheQuery) {
  RequestHead h = Parse("GET /a+b?c=d+e HTTP/1.1");
  EXPECT_EQ(h.path, "/a+b");
  EXPECT_EQ(h.params.at("c"), "d e");
}

TEST(ParseRequestHead, KeepAliveByVersionAndConnectionField) {
  EXPECT_TRUE(Parse("GET / HTTP/1.1").keep_alive);
  EXPECT_FALSE(Parse("GET / HTTP/1.1\r\nConnection: Close").keep_alive);
  EXPECT_FALSE(Parse("GET / HTTP/1.0").keep_alive);
  EXPECT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: keep-alive").keep_alive);
}

TEST(ParseRequestHead, BodyLengthAndExpect) {
  RequestHead h = Parse("POST /x HTTP/1.1\r\nContent-Length: 12\r\nExpect: 100-continue");
  EXPECT_EQ(h.content_length, 12u);
  EXPECT_TRUE(h.expect_continue);
  // The same length twice is one length.
  EXPECT_EQ(Parse("POST /x HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3").content_length, 3u);
  EXPECT_EQ(Parse("POST /x HTTP/1.1\r\nContent-Length: 1000").content_length, kLimit);
}

TEST(ParseRequestHead, RefusalsSayWhatAndAnswerWithTheRightStatus) {
  struct Case {
    std::string text;
    int status;
    std::string code, message;
  };
  const Case cases[] = {
      {"", 400, "BadRequest", "malformed request line"},
      {"GET /", 400, "BadRequest", "malformed request line"},
      {"GET x HTTP/1.1", 400, "BadRequest", "malformed request line"},
      {"GET / HTTP/2", 400, "BadRequest", "malformed request line"},
      {" / HTTP/1.1", 400, "BadRequest", "malformed request line"},
      {"GET  / HTTP/1.1", 400, "BadRequest", "malformed request line"},
      {"GET / HTTP/1.1\r\nno colon", 400, "BadRequest", "malformed header line"},
      {"GET / HTTP/1.1\r\n: empty name", 400, "BadRequest", "malformed header line"},
      {"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6", 400, "BadRequest",
       "conflicting Content-Length fields"},
      {"GET / HTTP/1.1\r\nHost: a\r\nHOST: b", 400, "BadRequest", "conflicting HOST fields"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 501, "NotImplemented",
       "chunked request bodies are not supported; send Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: -1", 400, "BadRequest", "invalid Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 1e3", 400, "BadRequest", "invalid Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length:", 400, "BadRequest", "invalid Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999", 400, "BadRequest",
       "invalid Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 1001", 413, "ResourceExhausted",
       "request body of 1001 bytes exceeds the limit of 1000 bytes"},
  };
  for (const Case& c : cases) {
    HeadError e = Refuse(c.text);
    EXPECT_EQ(e.status, c.status) << c.text;
    EXPECT_EQ(e.code, c.code) << c.text;
    EXPECT_EQ(e.message, c.message) << c.text;
  }
}

TEST(PercentDecode, DecodesValidEscapesAndKeepsBrokenOnes) {
  EXPECT_EQ(PercentDecode("a%20b%2fc", false), "a b/c");
  EXPECT_EQ(PercentDecode("100%", false), "100%");
  EXPECT_EQ(PercentDecode("%zz%4", false), "%zz%4");
  EXPECT_EQ(PercentDecode("a+b", true), "a b");
  EXPECT_EQ(PercentDecode("a+b", false), "a+b");
}

}  // namespace
}  // namespace tau::http
