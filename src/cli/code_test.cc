// The code directory `tau run` ships and where the run starts in it: a spec's own folder, and
// TauGrid's repository layout (tau/NAME.yaml at a repository root, --code-dir).
#include "cli/code.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

class CodeRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tau-code-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = fs::canonical(tmpl);
    old_cwd_ = fs::current_path();
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    fs::remove_all(dir_);
  }
  void Write(const std::string& rel, const std::string& text = "x") {
    fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  static spec::RunSpec Entry(const std::string& entrypoint) {
    spec::RunSpec s;
    s.entrypoint = entrypoint;
    return s;
  }
  std::string Path(const std::string& rel) const { return (dir_ / rel).string(); }

  fs::path dir_, old_cwd_;
};

TEST_F(CodeRootTest, APlainSpecShipsItsOwnFolder) {
  // No .git anywhere: today's behaviour, the spec's folder, run from there.
  Write("proj/tau.yaml");
  Write("proj/train.py");
  auto root = FindCodeRoot(Path("proj/tau.yaml"), Entry("train.py"));
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_EQ(root->root, Path("proj"));
  EXPECT_EQ(root->subdir, "");
  // Even in a folder named tau/, without a repository above it.
  Write("other/tau/train.yaml");
  root = FindCodeRoot(Path("other/tau/train.yaml"), Entry("train.py"));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->root, Path("other/tau"));
  // And a spec elsewhere in a repository keeps its own folder: only tau/ is the layout.
  Write("repo/.git/HEAD");
  Write("repo/exp/tau.yaml");
  root = FindCodeRoot(Path("repo/exp/tau.yaml"), Entry("train.py"));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->root, Path("repo/exp"));
  EXPECT_EQ(root->subdir, "");
  // ../ reaches the folder above, and the run starts in the spec's folder.
  root = FindCodeRoot(Path("repo/exp/tau.yaml"), Entry("../train.py"));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->root, Path("repo"));
  EXPECT_EQ(root->subdir, "exp");
}

TEST_F(CodeRootTest, TheRepositoryLayoutShipsTheRootAndRunsFromIt) {
  Write("repo/.git/HEAD");
  Write("repo/tau/train.yaml");
  Write("repo/train.py");
  auto root = FindCodeRoot(Path("repo/tau/train.yaml"), Entry("train.py"));
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_EQ(root->root, Path("repo"));
  EXPECT_EQ(root->subdir, "");  // TauGrid runs from the repository root
  // A worktree's .git is a file.
  Write("wt/.git", "gitdir: elsewhere\n");
  Write("wt/tau/train.yaml");
  root = FindCodeRoot(Path("wt/tau/train.yaml"), Entry("scripts/train.py"));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->root, Path("wt"));
  // ../train.py, written for the spec's folder, still means the root's train.py: the run starts
  // in tau/ then.
  root = FindCodeRoot(Path("repo/tau/train.yaml"), Entry("../train.py"));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->root, Path("repo"));
  EXPECT_EQ(root->subdir, "tau");
  // Leaving the repository is refused.
  root = FindCodeRoot(Path("repo/tau/train.yaml"), Entry("../../train.py"));
  ASSERT_FALSE(root.ok());
  EXPECT_NE(
      root.status().message().find("run.entrypoint: '../../train.py' leaves the repository root"),
      std::string::npos)
      << root.status().message();
}

TEST_F(CodeRootTest, CodeDirIsTheRoot) {
  Write("code/train.py");
  Write("specs/run.yaml");
  auto root = FindCodeRoot(Path("specs/run.yaml"), Entry("train.py"), Path("code"));
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_EQ(root->root, Path("code"));
  EXPECT_EQ(root->subdir, "");
  root = FindCodeRoot(Path("specs/run.yaml"), Entry("train.py"), Path("missing"));
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().message(), "--code-dir " + Path("missing") + ": not a directory");
}

TEST_F(CodeRootTest, FindRepositoryRootLooksUp) {
  Write("repo/.git/HEAD");
  Write("repo/src/deep/file.py");
  EXPECT_EQ(FindRepositoryRoot(Path("repo/src/deep")), Path("repo"));
  EXPECT_EQ(FindRepositoryRoot(Path("repo")), Path("repo"));
  Write("alone/x");
  // dir_ is under /tmp: no repository above it (unless the machine's / is one).
  if (!fs::exists("/tmp/.git") && !fs::exists("/.git")) {
    EXPECT_EQ(FindRepositoryRoot(Path("alone")), "");
  }
}

TEST_F(CodeRootTest, ATargetResolvesUnderTau) {
  Write("repo/.git/HEAD");
  Write("repo/tau/train.yaml");
  Write("repo/tau/eval.yml");
  Write("repo/tau/both.yaml");
  Write("repo/tau/both.yml");
  Write("repo/src/x.py");
  fs::current_path(dir_ / "repo");
  EXPECT_EQ(*ResolveSpecTarget("train", ""), "tau/train.yaml");
  EXPECT_EQ(*ResolveSpecTarget("eval", ""), "tau/eval.yml");
  // From a folder inside the repository, named from there.
  fs::current_path(dir_ / "repo/src");
  EXPECT_EQ(*ResolveSpecTarget("train", ""), "../tau/train.yaml");
  auto both = ResolveSpecTarget("both", "");
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().message(),
            "both ../tau/both.yaml and ../tau/both.yml exist; name the one to run");
  auto none = ResolveSpecTarget("nothing", "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(),
            "no file 'nothing' here, and neither ../tau/nothing.yaml nor ../tau/nothing.yml "
            "exists (in the repository root)");
  // A file, a path or a .yaml name is taken as it is.
  EXPECT_EQ(*ResolveSpecTarget("x.py", ""), "x.py");
  EXPECT_EQ(*ResolveSpecTarget("missing.yaml", ""), "missing.yaml");
  EXPECT_EQ(*ResolveSpecTarget("a/b", ""), "a/b");
  // A directory names the tau.yaml in it.
  Write("repo/proj/tau.yaml");
  fs::current_path(dir_ / "repo");
  EXPECT_EQ(*ResolveSpecTarget("proj", ""), "proj/tau.yaml");
  EXPECT_EQ(*ResolveSpecTarget("proj/", ""), "proj/tau.yaml");
  auto empty = ResolveSpecTarget("src", "");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            "'src' is a directory with no tau.yaml in it: name the spec's file");
  // --code-dir is where tau/ is looked for, with or without .git.
  Write("plain/tau/train.yaml");
  fs::current_path(dir_);
  EXPECT_EQ(*ResolveSpecTarget("train", Path("plain")), "plain/tau/train.yaml");
}

TEST_F(CodeRootTest, ATargetOutsideARepositorySaysWhatItLookedFor) {
  Write("alone/x");
  fs::current_path(dir_ / "alone");
  if (fs::exists("/tmp/.git") || fs::exists("/.git")) GTEST_SKIP() << "/tmp is in a repository";
  auto got = ResolveSpecTarget("train", "");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "no file 'train' here, and no repository to look for tau/train.yaml in (no folder "
            "from " +
                Path("alone") + " up holds .git); name the spec's file, or give --code-dir DIR");
}

}  // namespace
}  // namespace tau::cli
