// The request parser of tau's HTTP server: the bytes of a request's head (the request line and the
// header fields) → a RequestHead, or the error to answer with. No I/O, so the connection loop in
// http.cc only reads and writes, and the fuzzer (fuzz/http_fuzz.cc) drives this directly.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace tau::http {

// Where the header section in `buf` ends: the first empty line, whether lines end in CRLF or (as
// RFC 9112 lets a server accept) a bare LF. Returns the header text's length and sets `consumed` to
// the bytes up to the body; npos while the section is incomplete.
size_t HeaderEnd(std::string_view buf, size_t* consumed);

struct RequestHead {
  std::string method;
  std::string path;                            // percent-decoded
  std::map<std::string, std::string> params;   // query parameters, percent-decoded
  std::map<std::string, std::string> headers;  // lowercase names; repeats joined with ", "
  bool keep_alive = true;                      // HTTP/1.1 unless "close"; 1.0 only if asked
  size_t content_length = 0;
  bool expect_continue = false;  // "Expect: 100-continue"
};

// Why a head was refused: the status and error code to answer with (the connection closes).
struct HeadError {
  int status = 400;
  std::string code;  // "BadRequest", "NotImplemented", "ResourceExhausted"
  std::string message;
};

// Parses `text`, a header section without its empty line (HeaderEnd's length). A declared body
// over `max_body_bytes` is refused (413) here, before it is read. Returns false with `error` set.
bool ParseRequestHead(std::string_view text, size_t max_body_bytes, RequestHead* head,
                      HeadError* error);

// Percent-decoding ('+' is a space only in query strings).
std::string PercentDecode(std::string_view s, bool plus_is_space);
// "a=1&b=x%20y" → {a: 1, b: "x y"}; the first of repeated keys wins.
void ParseQuery(std::string_view q, std::map<std::string, std::string>* out);

}  // namespace tau::http
