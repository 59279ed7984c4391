#include "common/redact.h"

#include <algorithm>

namespace tau {
namespace {

bool SameFolded(char a, char b) {
  auto fold = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return fold(a) == fold(b);
}

// Where `needle` occurs in `hay` at or after `from`, ASCII letters compared without their case.
size_t FindFolded(const std::string& hay, const std::string& needle, size_t from) {
  if (from > hay.size()) return std::string::npos;
  auto it = std::search(hay.begin() + static_cast<std::ptrdiff_t>(from), hay.end(), needle.begin(),
                        needle.end(), SameFolded);
  return it == hay.end() ? std::string::npos : static_cast<size_t>(it - hay.begin());
}

// Whether the last `k` bytes of `hay` are the first `k` of `needle`, without case.
bool EndsWithStartOf(const std::string& hay, const std::string& needle, size_t k) {
  return std::equal(hay.end() - static_cast<std::ptrdiff_t>(k), hay.end(), needle.begin(),
                    SameFolded);
}

}  // namespace

Redactor::Redactor(std::vector<std::string> secrets) {
  for (std::string& s : secrets)
    if (s.size() >= kMinSecretBytes) secrets_.push_back(std::move(s));
  // Case variants are masked too (a program that prints a token upper-cased leaks it just the
  // same), so values that differ only in case are one.
  for (std::string& s : secrets_)
    for (char& c : s)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  std::sort(secrets_.begin(), secrets_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  secrets_.erase(std::unique(secrets_.begin(), secrets_.end()), secrets_.end());
}

std::string Redactor::Feed(std::string_view data, bool flush) {
  if (secrets_.empty()) return std::string(data);
  pending_.append(data);
  for (const std::string& secret : secrets_) {
    for (size_t at = FindFolded(pending_, secret, 0); at != std::string::npos;
         at = FindFolded(pending_, secret, at + 3)) {
      pending_.replace(at, secret.size(), "***");
      masked_any_ = true;
    }
  }
  // Held back: the longest tail that a secret starts with, which more output may complete. Never a
  // byte more, so a pause in the middle of a line delays nothing else; never a byte less, so a
  // pause in the middle of a secret shows no part of it.
  size_t held = 0;
  if (!flush) {
    for (const std::string& secret : secrets_) {
      for (size_t k = std::min(pending_.size(), secret.size() - 1); k > held; --k) {
        if (EndsWithStartOf(pending_, secret, k)) {
          held = k;
          break;
        }
      }
    }
  }
  const size_t release = pending_.size() - held;
  std::string out = pending_.substr(0, release);
  pending_.erase(0, release);
  return out;
}

}  // namespace tau
