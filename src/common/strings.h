// String helpers shared by the parsers and the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tau {

// Edit distance, for "did you mean" hints.
size_t EditDistance(std::string_view a, std::string_view b);
// The closest candidate within a small distance, or "" when nothing is close.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);
// RFC 1123 label (DNS-1123): lowercase alphanumerics and '-', starts and ends alphanumeric.
bool IsDns1123Label(std::string_view s, size_t max_len = 63);
// DNS-1123 subdomain: dot-separated labels, at most 253 characters.
bool IsDnsSubdomain(std::string_view s);
// A Kubernetes label value: at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends;
// empty is a value too.
bool IsLabelValue(std::string_view s);
// A Kubernetes label key: an optional "SUBDOMAIN/" prefix, then a non-empty label name.
bool IsLabelKey(std::string_view s);
// POSIX-portable environment variable name: [A-Za-z_][A-Za-z0-9_]*
bool IsEnvVarName(std::string_view s);
std::vector<std::string> Split(std::string_view s, char sep);
// Without leading and trailing white space.
std::string_view Trim(std::string_view s);
std::string Join(const std::vector<std::string>& parts, std::string_view sep);
bool StartsWith(std::string_view s, std::string_view prefix);
bool EndsWith(std::string_view s, std::string_view suffix);
// Quotes a word for a POSIX shell, for display only (tau never runs a shell on user strings).
std::string ShellQuote(std::string_view s);
// Length of the UTF-8 sequence starting at s[i], or 0 when it is not valid (overlong, surrogate,
// too big, truncated).
size_t Utf8SequenceLength(std::string_view s, size_t i);
// The offset of the first byte of `s` that is not valid UTF-8, or npos when all of it is.
size_t FindInvalidUtf8(std::string_view s);
// A size for people: "512 B", "1.5 KiB", "23.5 GiB".
std::string FormatBytes(int64_t bytes);
// `s` for a message: control characters and bytes that are not valid UTF-8 written as \xNN.
std::string Printable(std::string_view s);
// The 1-based line and column (counted in bytes) of `offset` in `text`, for diagnostics.
std::pair<int, int> LineColumnAt(std::string_view text, size_t offset);
// A short random lowercase hex string (from /dev/urandom).
std::string RandomHex(size_t chars);

}  // namespace tau
