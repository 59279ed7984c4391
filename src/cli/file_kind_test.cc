#include "cli/file_kind.h"

#include <gtest/gtest.h>

namespace tau::cli {
namespace {

TEST(FileKind, EachFileTauReadsIsKnownByItsKeys) {
  EXPECT_EQ(GuessFileKind("schema_version: 1\nname: a\nrun: {entrypoint: a.py}\n").kind,
            FileKind::kRunSpec);
  EXPECT_EQ(GuessFileKind("name: a\nengine: job\nentrypoint: a.py\n").kind, FileKind::kRunSpec);
  EXPECT_EQ(GuessFileKind("kind: workflow\nname: w\nstages: []\n").kind, FileKind::kWorkflow);
  EXPECT_EQ(GuessFileKind("spec: tau.yaml\nparameters: {a: [1]}\n").kind, FileKind::kSweep);
  EXPECT_EQ(GuessFileKind("schema_version: 1\nqueues: []\nworkspaces: []\n").kind,
            FileKind::kPlatform);
  EXPECT_EQ(GuessFileKind("flavors: [{name: a}]\nqueues: []\nworkloads: []\n").kind,
            FileKind::kScenario);
  // What does not parse goes to the run-spec reader, which says where it breaks.
  EXPECT_EQ(GuessFileKind("a: [\n").kind, FileKind::kRunSpec);
  FileKindGuess other = GuessFileKind("colour: red\nsize: 3\n");
  EXPECT_EQ(other.kind, FileKind::kUnknown);
  EXPECT_EQ(other.keys, (std::vector<std::string>{"colour", "size"}));
  const std::string m = UnknownFileKindMessage("x.yaml", other.keys);
  EXPECT_NE(m.find("x.yaml:1:1: error: not a file tau reads (its top-level keys: colour, size)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("a workflow file (kind: workflow)"), std::string::npos) << m;
}

}  // namespace
}  // namespace tau::cli
