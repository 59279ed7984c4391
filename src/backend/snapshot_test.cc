// Code snapshots: the blob store (content checked before it is kept), manifests, snapshots
// assembled from blobs, and the work directory made from a snapshot (linked read-only or copied,
// complete or absent whatever moment a server was killed at).
#include "backend/snapshot.h"

#include <sys/stat.h>
#include <utime.h>

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "common/files.h"
#include "common/hash.h"

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
  ASSERT_TRUE(CloneTree(dir + "/snap", work, TreeFiles::kCopy).ok());
  EXPECT_EQ(*ReadFile(work + "/main.py"), "print('hi')\n");
  EXPECT_EQ(*ReadFile(work + "/pkg/util.py"), "x = 1\n");
  EXPECT_FALSE(PathExists(work + "/stale"));
  EXPECT_FALSE(PathExists(dir + "/run/work.partial"));
  std::filesystem::remove_all(dir);
}

class BlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tau-blob-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    blobs_ = dir_ + "/blobs";
    snaps_ = dir_ + "/snapshots";
    ASSERT_TRUE(MakeDirs(snaps_).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Uploads `data` as a client would and returns its manifest entry.
  CodeManifestEntry Upload(const std::string& path, const std::string& data, int mode = 0644) {
    const std::string digest = Sha256Hex(data);
    EXPECT_TRUE(StoreBlob(blobs_, digest, data).ok());
    return {path, mode, static_cast<int64_t>(data.size()), digest};
  }

  static struct stat Stat(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
    return st;
  }

  std::string dir_, blobs_, snaps_;
};

TEST_F(BlobStoreTest, ABlobIsKeptOnlyUnderItsOwnDigestAndWithinTheLimit) {
  const std::string data = "print('hi')\n";
  auto added = StoreBlob(blobs_, Sha256Hex(data), data);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_TRUE(*added);
  EXPECT_FALSE(*StoreBlob(blobs_, Sha256Hex(data), data));  // stored already
  EXPECT_EQ(Stat(blobs_ + "/" + Sha256Hex(data)).st_mode & 07777, 0444u);

  auto wrong = StoreBlob(blobs_, Sha256Hex("other"), data);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find(Sha256Hex(data)), std::string::npos);
  EXPECT_FALSE(PathExists(blobs_ + "/" + Sha256Hex("other")));

  // A name is a digest or nothing: no path reaches out of the store.
  for (std::string name : {std::string("../escape"), std::string("a/b"), std::string(""),
                           Sha256Hex(data).substr(0, 63) + "/", [&] {
                             std::string upper = Sha256Hex(data);
                             for (char& c : upper) c = static_cast<char>(std::toupper(c));
                             return upper;
                           }()}) {
    auto bad = StoreBlob(blobs_, name, data);
    ASSERT_FALSE(bad.ok()) << name;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << name;
  }
  const std::string big(kMaxSnapshotBytes + 1, 'x');
  auto too_big = StoreBlob(blobs_, Sha256Hex(big), big);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  // Nothing but the one good blob, and no temporary left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(blobs_),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(BlobStoreTest, AManifestIsCheckedAsASnapshotIsAndGivesTheSameDigest) {
  std::vector<CodeFile> files = {{"b/util.py", 0644, "x = 1\n"}, {"run.sh", 0755, "#!/bin/sh\n"}};
  std::vector<CodeManifestEntry> entries;
  for (const CodeFile& f : files)
    entries.push_back({f.path, f.mode, static_cast<int64_t>(f.data.size()), Sha256Hex(f.data)});
  auto manifest = CheckManifest(entries);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  auto inline_snapshot = StoreSnapshot(snaps_, blobs_, files);
  ASSERT_TRUE(inline_snapshot.ok()) << inline_snapshot.status().ToString();
  // An inline submission and one by manifest of the same code name one snapshot.
  EXPECT_EQ(manifest->digest, inline_snapshot->digest);

  auto refused = [&](std::vector<CodeManifestEntry> e, StatusCode code) {
    auto m = CheckManifest(std::move(e));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), code) << m.status().ToString();
  };
  auto with = [&](auto change) {
    auto e = entries;
    change(e);
    return e;
  };
  refused(with([](auto& e) { e[0].sha256 = "not-a-digest"; }), StatusCode::kInvalidArgument);
  refused(with([](auto& e) { e[0].path = "../outside"; }), StatusCode::kInvalidArgument);
  refused(with([](auto& e) { e[1] = e[0]; }), StatusCode::kInvalidArgument);
  refused(with([](auto& e) { e[0].size = -1; }), StatusCode::kResourceExhausted);
  refused(with([](auto& e) {
            e[0].size = kMaxSnapshotBytes / 2 + 1;
            e[1].size = kMaxSnapshotBytes / 2;
          }),
          StatusCode::kResourceExhausted);
  refused(std::vector<CodeManifestEntry>(kMaxSnapshotFiles + 1, entries[0]),
          StatusCode::kResourceExhausted);
}

TEST_F(BlobStoreTest, ASnapshotIsAssembledFromBlobsAsReadOnlyLinks) {
  std::vector<CodeManifestEntry> entries = {Upload("main.py", "print(1)\n"),
                                            Upload("pkg/run.sh", "#!/bin/sh\n", 0755)};
  auto manifest = CheckManifest(entries);
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(MissingBlobs(snaps_, blobs_, *manifest), std::vector<std::string>());
  auto snap = StoreSnapshot(snaps_, blobs_, *manifest);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  struct stat main_py = Stat(snap->dir + "/main.py");
  EXPECT_EQ(main_py.st_mode & 07777, 0444u);
  EXPECT_EQ(main_py.st_ino, Stat(blobs_ + "/" + entries[0].sha256).st_ino);
  EXPECT_EQ(Stat(snap->dir + "/pkg/run.sh").st_mode & 07777, 0555u);
  EXPECT_EQ(*ReadFile(snap->dir + "/pkg/run.sh"), "#!/bin/sh\n");
  auto read = ReadSnapshot(snap->dir);
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[1].mode, 0755);
}

TEST_F(BlobStoreTest, ASnapshotWithABlobMissingOrOfAnotherSizeIsRefusedAndLeavesNothing) {
  CodeManifestEntry stored = Upload("a.py", "a = 1\n");
  CodeManifestEntry absent = {"b.py", 0644, 6, Sha256Hex("b = 1\n")};
  auto manifest = CheckManifest({stored, absent});
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(MissingBlobs(snaps_, blobs_, *manifest), std::vector<std::string>{absent.sha256});
  auto snap = StoreSnapshot(snaps_, blobs_, *manifest);
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(snap.status().message().find(absent.sha256), std::string::npos);

  CodeManifestEntry lying = stored;
  lying.size = 1;
  auto lie = StoreSnapshot(snaps_, blobs_, *CheckManifest({lying}));
  ASSERT_FALSE(lie.ok());
  EXPECT_EQ(lie.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::filesystem::is_empty(snaps_));

  // Once stored, a snapshot needs no blob at all: not even ones since removed.
  ASSERT_TRUE(StoreBlob(blobs_, absent.sha256, "b = 1\n").ok());
  ASSERT_TRUE(StoreSnapshot(snaps_, blobs_, *manifest).ok());
  std::filesystem::remove_all(blobs_);
  EXPECT_TRUE(MissingBlobs(snaps_, blobs_, *manifest).empty());
}

TEST_F(BlobStoreTest, AWorkDirectoryLinksReadOnlyFilesButIsTheRunsOwn) {
  auto snap = StoreSnapshot(snaps_, blobs_,
                            {{"main.py", 0644, "print(1)\n"}, {"pkg/run.sh", 0755, "#!/bin/sh\n"}});
  ASSERT_TRUE(snap.ok());
  const std::string work = dir_ + "/run/work";
  ASSERT_TRUE(MakeDirs(dir_ + "/run").ok());
  ASSERT_TRUE(CloneTree(snap->dir, work, TreeFiles::kLinkReadOnly).ok());
  struct stat linked = Stat(work + "/main.py");
  if (linked.st_nlink > 1) {
    // Linked (this file system has no reflinks): the snapshot's inode, which nobody may write.
    EXPECT_EQ(linked.st_ino, Stat(snap->dir + "/main.py").st_ino);
    EXPECT_EQ(linked.st_mode & 0222, 0u);
  } else {
    EXPECT_EQ(linked.st_mode & 07777, 0644u);  // a reflink: the run's own writable copy
  }
  // The directories are the run's: a file can be replaced, and that leaves the snapshot alone.
  ASSERT_TRUE(WriteFileAtomic(work + "/main.py", "changed\n").ok());
  ASSERT_TRUE(WriteFileAtomic(work + "/pkg/new.txt", "new\n").ok());
  EXPECT_EQ(*ReadFile(snap->dir + "/main.py"), "print(1)\n");
  EXPECT_FALSE(PathExists(snap->dir + "/pkg/new.txt"));

  // A copy gives every file an inode of its own, writable.
  const std::string copy = dir_ + "/run/copy";
  ASSERT_TRUE(CloneTree(snap->dir, copy, TreeFiles::kCopy).ok());
  struct stat copied = Stat(copy + "/main.py");
  EXPECT_NE(copied.st_ino, Stat(snap->dir + "/main.py").st_ino);
  EXPECT_EQ(copied.st_nlink, 1u);
  EXPECT_EQ(copied.st_mode & 07777, 0644u);
  EXPECT_EQ(Stat(copy + "/pkg/run.sh").st_mode & 07777, 0755u);
  EXPECT_EQ(*ReadFile(copy + "/pkg/run.sh"), "#!/bin/sh\n");
}

TEST_F(BlobStoreTest, AWritableSnapshotFileOfAnOlderServerIsCopiedNotLinked) {
  const std::string old = snaps_ + "/old";
  ASSERT_TRUE(MakeDirs(old).ok());
  ASSERT_TRUE(WriteFileAtomic(old + "/main.py", "print(1)\n", 0644).ok());
  const std::string work = dir_ + "/work";
  ASSERT_TRUE(CloneTree(old, work, TreeFiles::kLinkReadOnly).ok());
  EXPECT_NE(Stat(work + "/main.py").st_ino, Stat(old + "/main.py").st_ino);
  EXPECT_EQ(Stat(old + "/main.py").st_nlink, 1u);
}

TEST_F(BlobStoreTest, OnlyUnreferencedBlobsOlderThanTheAgeAreRemoved) {
  ASSERT_TRUE(StoreSnapshot(snaps_, blobs_, {{"kept.py", 0644, "kept\n"}}).ok());
  Upload("young.py", "young\n");
  Upload("old.py", "old\n");
  const int64_t day = 24 * 3600;
  struct utimbuf past = {std::time(nullptr) - 2 * day, std::time(nullptr) - 2 * day};
  for (const char* data : {"kept\n", "old\n"})
    ASSERT_EQ(::utime((blobs_ + "/" + Sha256Hex(data)).c_str(), &past), 0);
  EXPECT_EQ(RemoveUnreferencedBlobs(blobs_, day), 1);
  EXPECT_TRUE(PathExists(blobs_ + "/" + Sha256Hex("kept\n")));  // a snapshot links it
  EXPECT_TRUE(PathExists(blobs_ + "/" + Sha256Hex("young\n")));
  EXPECT_FALSE(PathExists(blobs_ + "/" + Sha256Hex("old\n")));
}

}  // namespace
}  // namespace tau::server
