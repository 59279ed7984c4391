// The work copy of a snapshot: complete or absent, whatever moment a server was killed at.
#include "backend/snapshot.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "common/files.h"

namespace tau::server {
namespace {

TEST(CopySnapshotTest, APartialCopyLeftByAKilledServerIsRedone) {
  char tmpl[] = "/tmp/tau-snapshot-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(MakeDirs(dir + "/snap/pkg").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/snap/main.py", "print('hi')\n").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/snap/pkg/util.py", "x = 1\n").ok());
  // What a server killed in the middle of the copy leaves: a partial directory, never `work`.
  ASSERT_TRUE(MakeDirs(dir + "/run/work.partial").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/run/work.partial/stale", "junk").ok());

  const std::string work = dir + "/run/work";
  ASSERT_TRUE(CopySnapshot(dir + "/snap", work).ok());
  EXPECT_EQ(*ReadFile(work + "/main.py"), "print('hi')\n");
  EXPECT_EQ(*ReadFile(work + "/pkg/util.py"), "x = 1\n");
  EXPECT_FALSE(PathExists(work + "/stale"));
  EXPECT_FALSE(PathExists(dir + "/run/work.partial"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tau::server
