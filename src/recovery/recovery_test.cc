#include "recovery/recovery.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include "common/files.h"

namespace tau::recovery {
namespace {

void Touch(const std::string& path, time_t mtime) {
  ASSERT_TRUE(WriteFileAtomic(path, "x").ok());
  struct timespec times[2] = {{mtime, 0}, {mtime, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST(CheckpointTest, NewestCompleteWins) {
  std::string dir = ::testing::TempDir() + "/tau_ckpt_" + std::to_string(::getpid());
  ASSERT_TRUE(RemoveTree(dir).ok());
  ASSERT_TRUE(MakeDirs(dir).ok());
  EXPECT_EQ(NewestCompleteCheckpoint(dir), "");
  EXPECT_EQ(NewestCompleteCheckpoint(dir + "/missing"), "");
  Touch(dir + "/ckpt-1.pt", 1000);
  Touch(dir + "/ckpt-2.pt", 2000);
  EXPECT_EQ(NewestCompleteCheckpoint(dir), dir + "/ckpt-2.pt");
  // Half-written checkpoints are newer but never offered.
  Touch(dir + "/ckpt-3.pt.tmp", 3000);
  Touch(dir + "/.ckpt-4.pt", 4000);
  Touch(dir + "/ckpt-5.partial", 5000);
  EXPECT_EQ(NewestCompleteCheckpoint(dir), dir + "/ckpt-2.pt");
  // A directory counts once it has its COMPLETE marker.
  ASSERT_TRUE(MakeDirs(dir + "/step-6").ok());
  Touch(dir + "/step-6/model.bin", 6000);
  struct timespec t6[2] = {{6000, 0}, {6000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir + "/step-6").c_str(), t6, 0), 0);
  EXPECT_EQ(NewestCompleteCheckpoint(dir), dir + "/ckpt-2.pt");
  Touch(dir + "/step-6/COMPLETE", 6000);
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir + "/step-6").c_str(), t6, 0), 0);
  EXPECT_EQ(NewestCompleteCheckpoint(dir), dir + "/step-6");
  ASSERT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace tau::recovery
