// Helpers shared by the kube tests: files of the source tree, the schema set, golden files.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kube/kube.h"

namespace tau::kube::testing {

inline std::filesystem::path SourceDir() {
  const char* src = std::getenv("TAU_SOURCE_DIR");
  return src != nullptr ? std::filesystem::path(src) : std::filesystem::path(TAU_TEST_SOURCE_DIR);
}

inline std::filesystem::path DataDir() { return SourceDir() / "tests/data/kube"; }

inline std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The CRDs and built-in kinds of tests/data/kube/schemas, loaded once (the KubeRay CRDs are large).
inline const SchemaSet& Schemas() {
  static const SchemaSet* schemas = [] {
    auto* set = new SchemaSet();
    const std::filesystem::path dir = DataDir() / "schemas";
    for (const char* crd :
         {"kueue.x-k8s.io_clusterqueues.yaml", "kueue.x-k8s.io_cohorts.yaml",
          "kueue.x-k8s.io_localqueues.yaml", "kueue.x-k8s.io_resourceflavors.yaml",
          "kueue.x-k8s.io_workloadpriorityclasses.yaml", "ray.io_rayjobs.yaml",
          "ray.io_rayservices.yaml"}) {
      auto docs = ParseYaml(ReadAll(dir / crd));
      EXPECT_TRUE(docs.ok()) << crd << ": " << docs.status().message();
      if (!docs.ok()) continue;
      for (const auto& doc : *docs) {
        Status s = set->AddCrd(doc);
        EXPECT_TRUE(s.ok()) << crd << ": " << s.message();
      }
    }
    nlohmann::json core =
        nlohmann::json::parse(ReadAll(dir / "kubernetes-core.json"), nullptr, false);
    EXPECT_FALSE(core.is_discarded()) << "kubernetes-core.json is not JSON";
    Status s = set->AddSchemas(core);
    EXPECT_TRUE(s.ok()) << s.message();
    nlohmann::json topology =
        nlohmann::json::parse(ReadAll(dir / "kueue-topology.json"), nullptr, false);
    EXPECT_FALSE(topology.is_discarded()) << "kueue-topology.json is not JSON";
    s = set->AddSchemas(topology);
    EXPECT_TRUE(s.ok()) << s.message();
    return set;
  }();
  return *schemas;
}

// A readable difference of two texts: the first differing line with some context.
inline std::string LineDiff(const std::string& want, const std::string& got) {
  auto lines = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string line; std::getline(ss, line);) out.push_back(line);
    return out;
  };
  std::vector<std::string> a = lines(want), b = lines(got);
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  std::string out = "first difference at line " + std::to_string(i + 1) + ":\n";
  size_t from = i >= 3 ? i - 3 : 0;
  for (size_t k = from; k < i; ++k) out += "    " + a[k] + "\n";
  for (size_t k = i; k < a.size() && k < i + 4; ++k) out += "  - " + a[k] + "\n";
  for (size_t k = i; k < b.size() && k < i + 4; ++k) out += "  + " + b[k] + "\n";
  out += "(- golden, + rendered; " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) +
         " lines)";
  return out;
}

// Compares `got` with the golden file tests/data/kube/golden/NAME, or rewrites the file when
// TAU_UPDATE_GOLDENS=1.
inline void ExpectGolden(const std::string& name, const std::string& got) {
  const std::filesystem::path path = DataDir() / "golden" / name;
  const char* update = std::getenv("TAU_UPDATE_GOLDENS");
  if (update != nullptr && std::string(update) == "1") {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << got;
    return;
  }
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing; run the test with TAU_UPDATE_GOLDENS=1 to create it";
  std::string want = ReadAll(path);
  EXPECT_TRUE(want == got) << name << " differs from its golden file "
                           << "(if the change is intended, rerun with TAU_UPDATE_GOLDENS=1 and "
                              "review the diff):\n"
                           << LineDiff(want, got);
}

}  // namespace tau::kube::testing
