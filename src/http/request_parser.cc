#include "http/request_parser.h"

#include <cctype>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "common/strings.h"

namespace tau::http {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool Fail(HeadError* error, int status, const char* code, std::string message) {
  *error = {status, code, std::move(message)};
  return false;
}

}  // namespace

size_t HeaderEnd(std::string_view buf, size_t* consumed) {
  for (size_t p = buf.find('\n'); p != std::string_view::npos; p = buf.find('\n', p + 1)) {
    if (p + 1 < buf.size() && buf[p + 1] == '\n') {
      *consumed = p + 2;
      return p;
    }
    if (p + 2 < buf.size() && buf[p + 1] == '\r' && buf[p + 2] == '\n') {
      *consumed = p + 3;
      return p;
    }
  }
  return std::string_view::npos;
}

bool ParseRequestHead(std::string_view text, size_t max_body_bytes, RequestHead* head,
                      HeadError* error) {
  *head = RequestHead();
  std::vector<std::string> lines = Split(text, '\n');
  for (std::string& l : lines)
    if (!l.empty() && l.back() == '\r') l.pop_back();
  std::vector<std::string> parts = Split(lines[0], ' ');
  if (parts.size() != 3 || parts[0].empty() || !StartsWith(parts[2], "HTTP/1.") ||
      parts[1].empty() || parts[1][0] != '/')
    return Fail(error, 400, "BadRequest", "malformed request line");
  head->method = parts[0];
  const bool http10 = parts[2] == "HTTP/1.0";
  size_t q = parts[1].find('?');
  head->path = PercentDecode(std::string_view(parts[1]).substr(0, q), false);
  if (q != std::string::npos) ParseQuery(std::string_view(parts[1]).substr(q + 1), &head->params);
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos || colon == 0)
      return Fail(error, 400, "BadRequest", "malformed header line");
    std::string name = Lower(lines[i].substr(0, colon));
    size_t v = colon + 1;
    while (v < lines[i].size() && (lines[i][v] == ' ' || lines[i][v] == '\t')) ++v;
    std::string value = lines[i].substr(v);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
    auto [it, added] = head->headers.emplace(name, value);
    if (added) continue;
    // Two lengths that disagree make the body's end ambiguous (RFC 9112 6.3): a proxy and this
    // server could split the stream differently. Other repeated fields join as a list.
    if (name == "content-length" || name == "host") {
      if (it->second != value)
        return Fail(error, 400, "BadRequest",
                    "conflicting " + lines[i].substr(0, colon) + " fields");
    } else {
      it->second += ", " + value;
    }
  }
  auto header = [&](const char* name) -> std::string {
    auto it = head->headers.find(name);
    return it == head->headers.end() ? "" : it->second;
  };
  std::string connection = Lower(header("connection"));
  head->keep_alive = http10 ? connection == "keep-alive" : connection != "close";
  if (head->headers.count("transfer-encoding"))
    return Fail(error, 501, "NotImplemented",
                "chunked request bodies are not supported; send Content-Length");
  if (auto it = head->headers.find("content-length"); it != head->headers.end()) {
    const std::string& digits = it->second;
    // Digits only: strtoull would take "-1" as 2^64-1 and " 5" as 5.
    if (digits.empty() || digits.size() > 19 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      return Fail(error, 400, "BadRequest", "invalid Content-Length");
    unsigned long long n = std::strtoull(digits.c_str(), nullptr, 10);
    if (n > max_body_bytes)
      return Fail(
          error, 413, "ResourceExhausted",
          fmt::format("request body of {} bytes exceeds the limit of {} bytes", n, max_body_bytes));
    head->content_length = static_cast<size_t>(n);
  }
  head->expect_continue = header("expect") == "100-continue";
  return true;
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

void ParseQuery(std::string_view q, std::map<std::string, std::string>* out) {
  for (const std::string& pair : Split(q, '&')) {
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string key = PercentDecode(pair.substr(0, eq), true);
    std::string value = eq == std::string::npos ? "" : PercentDecode(pair.substr(eq + 1), true);
    out->emplace(std::move(key), std::move(value));
  }
}

}  // namespace tau::http
