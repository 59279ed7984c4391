// Helpers shared by the spec tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "spec/spec.h"

namespace tau::spec::testing {

inline ParseOutcome Parse(std::string_view text) { return ParseSpec(text, "tau.yaml"); }

// Parses text that must be valid; fails the test with the diagnostics otherwise.
inline RunSpec MustParse(std::string_view text) {
  ParseOutcome outcome = Parse(text);
  EXPECT_TRUE(outcome.ok()) << outcome.ErrorText();
  return outcome.ok() ? *outcome.spec : RunSpec{};
}

// The full error text of text that must be invalid.
inline std::string Errors(std::string_view text) {
  ParseOutcome outcome = Parse(text);
  EXPECT_FALSE(outcome.ok()) << "expected an error for:\n" << text;
  EXPECT_FALSE(outcome.diagnostics.empty());
  return outcome.ErrorText();
}

// A minimal manifest with `extra` appended (extra must be top-level YAML).
inline std::string Manifest(std::string_view extra = "") {
  return "schema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\n" + std::string(extra);
}

// A minimal direct-shape spec with `extra` appended.
inline std::string Direct(std::string_view extra = "", std::string_view engine = "job") {
  return "name: demo\nengine: " + std::string(engine) + "\nentrypoint: train.py\n" +
         std::string(extra);
}

// tests/data/spec in the source tree: $TAU_SOURCE_DIR (set by ctest), else relative to this file.
inline std::filesystem::path SpecDataDir() {
  if (const char* root = std::getenv("TAU_SOURCE_DIR"); root != nullptr && *root != '\0') {
    return std::filesystem::path(root) / "tests" / "data" / "spec";
  }
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "tests" /
         "data" / "spec";
}

inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace tau::spec::testing
