// The HTTP server's request parser on arbitrary bytes: HeaderEnd finds the header section and
// ParseRequestHead reads it, as the connection loop does with what a client sent. It must refuse
// with a status and a message, never throw or read out of bounds.
//
// Beyond that: an accepted head has a method, a path starting with '/', lowercase header names and
// a Content-Length within the limit; a refusal is a 4xx/5xx with an error code and a message; and
// a head accepted once is accepted the same when its line endings are bare LF instead of CRLF.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "http/request_parser.h"

namespace {

constexpr size_t kMaxBody = 1 << 20;

std::string WithoutCr(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n')) out += s[i];
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  size_t consumed = 0;
  size_t end = tau::http::HeaderEnd(input, &consumed);
  // Without a complete section, the whole input is taken as one (as a server would at EOF).
  std::string_view text = end == std::string_view::npos ? input : input.substr(0, end);
  if (end != std::string_view::npos) TAU_FUZZ_CHECK(consumed > end && consumed <= input.size());

  tau::http::RequestHead head;
  tau::http::HeadError error;
  if (!tau::http::ParseRequestHead(text, kMaxBody, &head, &error)) {
    TAU_FUZZ_CHECK(error.status >= 400 && error.status < 600);
    TAU_FUZZ_CHECK(!error.code.empty() && !error.message.empty());
    return 0;
  }
  TAU_FUZZ_CHECK(!head.method.empty() && !head.path.empty() && head.path.front() == '/');
  TAU_FUZZ_CHECK(head.content_length <= kMaxBody);
  for (const auto& [name, value] : head.headers) {
    TAU_FUZZ_CHECK(!name.empty());
    for (char c : name) TAU_FUZZ_CHECK(!std::isupper(static_cast<unsigned char>(c)));
  }
  // The same head with bare-LF line ends reads the same (where no other CR makes them differ).
  std::string lf = WithoutCr(text);
  if (lf.find('\r') != std::string::npos) return 0;
  tau::http::RequestHead again;
  TAU_FUZZ_CHECK(tau::http::ParseRequestHead(lf, kMaxBody, &again, &error));
  TAU_FUZZ_CHECK(again.method == head.method && again.path == head.path);
  TAU_FUZZ_CHECK(again.headers == head.headers && again.params == head.params);
  TAU_FUZZ_CHECK(again.content_length == head.content_length);
  TAU_FUZZ_CHECK(again.keep_alive == head.keep_alive);
  return 0;
}
