// Helpers shared by the policy tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "policy/policy.h"

namespace tau::policy::testing {

inline std::filesystem::path SourceDir() {
  const char* src = std::getenv("TAU_SOURCE_DIR");
  return src != nullptr ? std::filesystem::path(src) : std::filesystem::path(TAU_TEST_SOURCE_DIR);
}

inline std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses text that must be valid; fails the test with the diagnostics otherwise.
inline Platform MustParse(std::string_view text) {
  PlatformOutcome out = ParsePlatform(text, "platform.yaml");
  EXPECT_TRUE(out.ok()) << out.ErrorText();
  return out.ok() ? *out.platform : Platform{};
}

// The error text of a file that must be invalid (named p.yaml in the diagnostics).
inline std::string Errors(std::string_view text) {
  PlatformOutcome out = ParsePlatform(text, "p.yaml");
  EXPECT_FALSE(out.ok()) << "expected an error for:\n" << text;
  return out.ErrorText();
}

inline Platform ExamplePlatform() {
  return MustParse(ReadAll(SourceDir() / "examples/platform/platform.yaml"));
}

}  // namespace tau::policy::testing
