// The shim's log pump: masking at write, the cap that keeps the newest output, a full disk
// (/dev/full, and a real filesystem that fills up when one can be mounted), and the notices.
#include "runtime/log_pump.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/files.h"
#include "runtime/runtime.h"

namespace tau::runtime::internal {
namespace {

class LogPumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "tau-logpump-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ASSERT_TRUE(MakeDirs(dir_ + "/logs").ok());
  }
  void TearDown() override { (void)RemoveTree(dir_); }

  std::string Log(int rank = 0) const {
    auto text = ReadFile(dir_ + "/logs/rank-" + std::to_string(rank) + ".log");
    return text.ok() ? *text : "";
  }
  std::vector<AttemptNotice> Notices() const {
    int64_t offset = 0;
    return ReadNotices(dir_, &offset);
  }
  static void WriteAllTo(int fd, const std::string& data) {
    for (size_t done = 0; done < data.size();) {
      ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      ASSERT_GT(n, 0);
      done += static_cast<size_t>(n);
    }
  }

  std::string dir_;
};

TEST_F(LogPumpTest, MasksSecretsSplitAcrossWritesAndReleasesTheHeldTailAtTheEnd) {
  auto pump = LogPump::Create(dir_, 1, 0, {"hunter2-secret"});
  ASSERT_TRUE(pump.ok()) << pump.status().ToString();
  (*pump)->Start();
  WriteAllTo((*pump)->write_fd(0), "token=hunter2-");
  WriteAllTo((*pump)->write_fd(0), "secret ok\nthe end hunt");
  (*pump)->Finish(2000);
  EXPECT_EQ(Log(), "token=*** ok\nthe end hunt");
  EXPECT_TRUE(Notices().empty());
}

TEST_F(LogPumpTest, ACappedLogKeepsTheNewestOutputWithAMarkerAndSaysSoOnce) {
  // 64 KiB for the attempt, two ranks: 32 KiB each.
  auto pump = LogPump::Create(dir_, 2, 64 << 10, {});
  ASSERT_TRUE(pump.ok()) << pump.status().ToString();
  (*pump)->Start();
  std::string out;
  for (int i = 0; i < 20000; ++i) out += "line " + std::to_string(i) + "\n";
  std::thread writer([&] { WriteAllTo((*pump)->write_fd(0), out); });
  WriteAllTo((*pump)->write_fd(1), "rank 1 is quiet\n");
  writer.join();
  (*pump)->Finish(2000);
  const std::string log = Log(0);
  EXPECT_LE(log.size(), (32u << 10) + 256) << log.size();
  EXPECT_GE(log.size(), 16u << 10);
  EXPECT_EQ(log.rfind("[tau] ", 0), 0u) << log.substr(0, 200);
  EXPECT_NE(log.find(" bytes of earlier output dropped: the log reached its cap of 32768 bytes"),
            std::string::npos);
  // The newest output, from a line's start.
  EXPECT_EQ(log.substr(log.size() - 11), "line 19999\n");
  const size_t first = log.find('\n') + 1;
  EXPECT_EQ(log.compare(first, 5, "line "), 0) << log.substr(first, 40);
  // What the marker says was dropped plus what is kept is all that was written.
  const int64_t dropped = std::atoll(log.c_str() + 6);
  EXPECT_EQ(dropped + static_cast<int64_t>(log.size() - first), static_cast<int64_t>(out.size()));
  EXPECT_EQ(Log(1), "rank 1 is quiet\n");
  auto notices = Notices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].type, "LogTruncated");
  EXPECT_EQ(notices[0].data["rank"], 0);
  EXPECT_EQ(notices[0].data["limit"], 32 << 10);
  EXPECT_EQ(notices[0].data["max_log_bytes"], 64 << 10);
}

// The log's disk is full (/dev/full refuses every write with ENOSPC): the pump keeps reading, so
// the writer never blocks, counts what it drops and says so in the notices.
TEST_F(LogPumpTest, AFullDiskDropsOutputWithoutBlockingTheWriterAndSaysHowMuch) {
  UniqueFd full(::open("/dev/full", O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(full.valid());
  auto notices = std::make_unique<NoticeWriter>(dir_ + "/" + kNoticesFile);
  std::vector<std::unique_ptr<LogFile>> files;
  files.push_back(std::make_unique<LogFile>(0, "/dev/full", full.Release(), 0, 0, 1,
                                            std::vector<std::string>{}, notices.get()));
  auto pump = LogPump::ForFiles(std::move(files), std::move(notices));
  ASSERT_TRUE(pump.ok()) << pump.status().ToString();
  (*pump)->Start();
  // 8 MiB, far more than a pipe holds: only a pump that keeps reading lets this finish.
  const std::string chunk(1 << 20, 'x');
  for (int i = 0; i < 8; ++i) WriteAllTo((*pump)->write_fd(0), chunk);
  (*pump)->Finish(2000);
  auto got = Notices();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, "OutputDropped");
  EXPECT_EQ(got[0].data["errno"], "ENOSPC");
  EXPECT_EQ(got[0].data["ended"], false);
  EXPECT_EQ(got[1].type, "OutputDropped");
  EXPECT_EQ(got[1].data["ended"], true);
  EXPECT_EQ(got[1].data["bytes"], 8 << 20);
  EXPECT_NE(got[1].message.find("No space left on device"), std::string::npos) << got[1].message;
}

// A real filesystem that fills up and then has room again: the log goes on after a marker that
// says what was lost. Needs to mount a tmpfs (root); skipped where that is not allowed.
TEST_F(LogPumpTest, ALogOnAFilesystemThatFillsUpResumesWithAMarker) {
  const std::string mnt = dir_ + "/small";
  ASSERT_TRUE(MakeDirs(mnt).ok());
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  ASSERT_TRUE(MakeDirs(mnt + "/logs").ok());
  // Most of the room taken by something else.
  const std::string filler = mnt + "/filler";
  {
    UniqueFd f(::open(filler.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    std::string block(4096, 'f');
    while (::write(f.get(), block.data(), block.size()) > 0) {
    }
  }
  auto pump = LogPump::Create(mnt, 1, 0, {});
  ASSERT_TRUE(pump.ok()) << pump.status().ToString();
  (*pump)->Start();
  WriteAllTo((*pump)->write_fd(0), std::string(64 << 10, 'a') + "\n");
  // The pump has met the full disk once it says so.
  for (int i = 0; i < 200 && !PathExists(mnt + "/" + kNoticesFile); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(PathExists(mnt + "/" + kNoticesFile));
  // Room again; the next write, a retry later, goes through.
  ASSERT_EQ(::unlink(filler.c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  WriteAllTo((*pump)->write_fd(0), "after the disk had room again\n");
  (*pump)->Finish(2000);
  auto log = ReadFile(mnt + "/logs/rank-0.log");
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find(" bytes of output dropped: the log could not be written (No space left on "
                      "device)\nafter the disk had room again\n"),
            std::string::npos)
      << log->substr(log->size() > 300 ? log->size() - 300 : 0);
  int64_t offset = 0;
  auto got = ReadNotices(mnt, &offset);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, "OutputDropped");
  EXPECT_EQ(got[1].data["ended"], true);
  EXPECT_GT(got[1].data["bytes"].get<int64_t>(), 0);
}

TEST_F(LogPumpTest, ReadNoticesLeavesALineStillBeingWrittenForLater) {
  const std::string path = dir_ + "/" + kNoticesFile;
  ASSERT_TRUE(WriteFileAtomic(path,
                              "{\"type\":\"LogTruncated\",\"message\":\"m\",\"data\":{}}\n"
                              "{\"type\":\"Output")
                  .ok());
  int64_t offset = 0;
  auto first = ReadNotices(dir_, &offset);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].type, "LogTruncated");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  WriteAllTo(fd.get(), "Dropped\",\"message\":\"n\",\"data\":{\"rank\":1}}\n");
  auto second = ReadNotices(dir_, &offset);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].type, "OutputDropped");
  EXPECT_EQ(second[0].data["rank"], 1);
  EXPECT_TRUE(ReadNotices(dir_, &offset).empty());
}

}  // namespace
}  // namespace tau::runtime::internal
