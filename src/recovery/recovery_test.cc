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

TEST(CheckpointTest, AResumeIsRefusedWhatTheProtocolCallsIncomplete) {
  std::string dir = ::testing::TempDir() + "/tau_ckpt_from_" + std::to_string(::getpid());
  ASSERT_TRUE(RemoveTree(dir).ok());
  ASSERT_TRUE(MakeDirs(dir + "/step-1").ok());
  ASSERT_TRUE(MakeDirs(dir + "/step-2.partial").ok());
  Touch(dir + "/ckpt.pt", 1000);
  Touch(dir + "/ckpt-2.pt.tmp", 1000);
  Touch(dir + "/step-1/model.bin", 1000);
  Touch(dir + "/step-2.partial/model.bin", 1000);
  EXPECT_EQ(IncompleteCheckpointReason(dir, dir + "/ckpt.pt"), "");
  EXPECT_NE(IncompleteCheckpointReason(dir, dir + "/ckpt-2.pt.tmp").find("temporary name"),
            std::string::npos);
  EXPECT_NE(
      IncompleteCheckpointReason(dir, dir + "/step-2.partial/model.bin").find("'step-2.partial'"),
      std::string::npos);
  EXPECT_NE(IncompleteCheckpointReason(dir, dir + "/step-1").find("no COMPLETE file"),
            std::string::npos);
  EXPECT_NE(IncompleteCheckpointReason(dir, dir + "/step-1/model.bin").find("no COMPLETE file"),
            std::string::npos);
  Touch(dir + "/step-1/COMPLETE", 1000);
  EXPECT_EQ(IncompleteCheckpointReason(dir, dir + "/step-1"), "");
  EXPECT_EQ(IncompleteCheckpointReason(dir, dir + "/step-1/model.bin"), "");
  EXPECT_NE(IncompleteCheckpointReason(dir, dir).find("the checkpoint directory itself"),
            std::string::npos);
  ASSERT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace tau::recovery

namespace tau::recovery {
namespace {

TEST(DiagnoseTest, FindsKnownSignatures) {
  std::string rank0 =
      "step 1\n"
      "Traceback (most recent call last):\n"
      "  File \"train.py\", line 3, in <module>\n"
      "    x = torch.zeros(10**12, device='cuda')\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.64 TiB\n";
  std::string rank1 =
      "[rank1]:[E ProcessGroupNCCL.cpp:563] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=1)\n"
      "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n";
  Diagnosis d = Diagnose({rank0, rank1});
  std::vector<std::string> sigs;
  for (const auto& e : d.evidence) sigs.push_back(e.signature + "@" + std::to_string(e.rank));
  EXPECT_EQ(sigs, (std::vector<std::string>{"cuda-oom@0", "python-exception@0", "nccl-timeout@1",
                                            "xid@1"}));
  EXPECT_EQ(d.evidence[1].line,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.64 TiB");
  EXPECT_EQ(
      d.summary,
      "CUDA out of memory (rank 0); NCCL collective timed out (rank 1); GPU Xid error (rank 1)");
}

TEST(DiagnoseTest, PythonExceptionAloneBecomesTheSummary) {
  Diagnosis d =
      Diagnose({"Traceback (most recent call last):\n  File \"a.py\", line 1\n"
                "ValueError: bad learning rate\n"});
  ASSERT_EQ(d.evidence.size(), 1u);
  EXPECT_EQ(d.summary, "ValueError: bad learning rate (rank 0)");
}

TEST(DiagnoseTest, AStackDumpNamesEachThreadsInnermostFrame) {
  // As Python 3.11's faulthandler writes it on SIGUSR1 with all_threads.
  Diagnosis d = Diagnose({"step 1\n",
                          "loading\nThread 0x00007f3a1c2ff640 (most recent call first):\n"
                          "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
                          "  File \"/usr/lib/python3.11/threading.py\", line 622 in wait\n\n"
                          "Current thread 0x00007f3a1e4b9740 (most recent call first):\n"
                          "  File \"/work/train.py\", line 14 in all_reduce\n"
                          "  File \"/work/train.py\", line 30 in <module>\n"});
  ASSERT_EQ(d.evidence.size(), 2u);
  EXPECT_EQ(d.evidence[0].signature, "stack-dump");
  EXPECT_EQ(d.evidence[0].rank, 1);
  EXPECT_EQ(d.evidence[1].line, "File \"/work/train.py\", line 14 in all_reduce");
  EXPECT_EQ(d.summary,
            "stack dump, in File \"/usr/lib/python3.11/threading.py\", line 320 in wait (rank 1)");
  // A known failure says more than where the threads were.
  EXPECT_EQ(Diagnose({"CUDA out of memory\nThread 0x1 (most recent call first):\n  File \"a.py\", "
                      "line 1 in f\n"})
                .summary,
            "CUDA out of memory (rank 0)");
}

TEST(DiagnoseTest, QuietLogsGiveNothingAndRepeatsAreCapped) {
  EXPECT_TRUE(Diagnose({"all good\n", ""}).evidence.empty());
  std::string spam;
  for (int i = 0; i < 50; ++i) spam += "Segmentation fault (core dumped)\n";
  Diagnosis d = Diagnose({spam});
  EXPECT_EQ(d.evidence.size(), 3u);
  EXPECT_EQ(d.summary, "segmentation fault (rank 0)");
}

}  // namespace
}  // namespace tau::recovery
