#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/event_chain.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/layout.h"
#include "common/redact.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/users.h"

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

namespace tau {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  TAU_ASSIGN_OR_RETURN(int h, Half(x));
  TAU_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().ToString(), "InvalidArgument: odd");
  EXPECT_EQ(r.status().WithContext("x").message(), "x: odd");
}

// Pins the event chain's formula: every stored chain was hashed with it, so a change fails here
// before it makes the chains already written unverifiable. The values were computed independently
// (sha256 of prev + "\n" + the compact, key-sorted JSON of the event).
TEST(EventChainTest, KnownHashes) {
  std::string first = EventHash("demo-1", 1700000000123, "Submitted", "submitted by alice",
                                nlohmann::json::object(), "");
  EXPECT_EQ(first, "2af2bd94e101727b8b0d6d57cf68ef9c979c413437b8c9606c6da43365cf846e");
  nlohmann::json data = {{"reason", "OOMKilled"}, {"exit_code", 137}, {"attempt", 1}};
  EXPECT_EQ(EventHash("demo-1", 1700000000456, "Failed", "attempt 1 failed: exit 137", data, first),
            "ca9995da1c4a2a31f1d7769aabc7198dc9190a4b1fd71437248a677c45988603");
}

TEST(StatusTest, EveryCodeNameParsesBackToItsCode) {
  std::vector<std::string> names;
  for (int i = static_cast<int>(StatusCode::kOk); i <= static_cast<int>(StatusCode::kIo); ++i) {
    auto code = static_cast<StatusCode>(i);
    std::string name = StatusCodeName(code);
    EXPECT_NE(name, "Unknown") << i;
    EXPECT_EQ(ParseStatusCode(name), code) << name;
    for (const std::string& other : names) EXPECT_NE(name, other);
    names.push_back(name);
  }
  EXPECT_EQ(ParseStatusCode("NotFound"), StatusCode::kNotFound);
  EXPECT_EQ(ParseStatusCode("IoError"), StatusCode::kIo);
  EXPECT_EQ(ParseStatusCode("Unknown"), std::nullopt);
  EXPECT_EQ(ParseStatusCode("notfound"), std::nullopt);
  EXPECT_EQ(ParseStatusCode(""), std::nullopt);
}

// The layout of TAU_HOME is an installed server's state: a path that moves loses what is there.
TEST(LayoutTest, EveryPathUnderTheHome) {
  const std::string h = "/var/lib/tau";
  EXPECT_EQ(layout::StoreFile(h), "/var/lib/tau/tau.db");
  EXPECT_EQ(layout::SocketPath(h), "/var/lib/tau/tau.sock");
  EXPECT_EQ(layout::LockFile(h), "/var/lib/tau/server.lock");
  EXPECT_EQ(layout::PidFile(h), "/var/lib/tau/server.pid");
  EXPECT_EQ(layout::ServerLog(h), "/var/lib/tau/server.log");
  EXPECT_EQ(layout::PlatformFile(h), "/var/lib/tau/platform.yaml");
  EXPECT_EQ(layout::SnapshotsDir(h), "/var/lib/tau/snapshots");
  EXPECT_EQ(layout::VenvsDir(h), "/var/lib/tau/venvs");
  EXPECT_EQ(layout::VenvsDir(h, 1001), "/var/lib/tau/venvs/uid-1001");
  EXPECT_EQ(layout::RunsDir(h), "/var/lib/tau/runs");
  EXPECT_EQ(layout::RunDir(h, "demo-1"), "/var/lib/tau/runs/demo-1");
  EXPECT_EQ(layout::WorkDir(layout::RunDir(h, "demo-1")), "/var/lib/tau/runs/demo-1/work");
  EXPECT_EQ(layout::AttemptDir(h, "demo-1", 2), "/var/lib/tau/runs/demo-1/attempts/2");
  EXPECT_EQ(layout::EvidenceDir(h, "demo-1"), "/var/lib/tau/runs/demo-1/evidence");
  EXPECT_EQ(layout::MetricsFile(layout::RunDir(h, "demo-1")),
            "/var/lib/tau/runs/demo-1/metrics.jsonl");
  EXPECT_EQ(layout::MetricsFile(layout::EvidenceDir(h, "demo-1")),
            "/var/lib/tau/runs/demo-1/evidence/metrics.jsonl");
}

TEST(ClockTest, Rfc3339RoundTrip) {
  auto t = ParseRfc3339("2026-01-02T15:04:05Z");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, int64_t{1767366245} * 1000);
  EXPECT_EQ(FormatRfc3339(*t), "2026-01-02T15:04:05.000Z");
  EXPECT_EQ(*ParseRfc3339("2026-01-02T16:04:05.5+01:00"), *t + 500);
  EXPECT_FALSE(ParseRfc3339("2026-13-02T15:04:05Z").ok());
  EXPECT_FALSE(ParseRfc3339("yesterday").ok());
}

TEST(ClockTest, Durations) {
  EXPECT_EQ(*ParseDurationMillis("30s"), 30000);
  EXPECT_EQ(*ParseDurationMillis("5m"), 300000);
  EXPECT_EQ(*ParseDurationMillis("1h30m"), 5400000);
  EXPECT_EQ(*ParseDurationMillis("250ms"), 250);
  EXPECT_EQ(*ParseDurationMillis("1.5s"), 1500);
  EXPECT_FALSE(ParseDurationMillis("5 minutes").ok());
  EXPECT_FALSE(ParseDurationMillis("").ok());
  EXPECT_EQ(FormatDuration(850), "850ms");
  EXPECT_EQ(FormatDuration(3723000), "1h2m3s");
  EXPECT_EQ(FormatDuration(168 * 3600 * 1000), "168h");
  EXPECT_EQ(FormatDuration(90 * 60 * 1000), "1h30m");
  EXPECT_EQ(FormatDuration(61000), "1m1s");
}

TEST(StringsTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t{24683620} * 1024), "24 GiB");
  EXPECT_EQ(FormatBytes(int64_t{100} << 40), "100 TiB");
}

TEST(StringsTest, Printable) {
  EXPECT_EQ(Printable("plain é"), "plain é");
  EXPECT_EQ(Printable("caf\xe9\n"), "caf\\xe9\\x0a");
}

TEST(StringsTest, Names) {
  EXPECT_TRUE(IsDns1123Label("my-run-1"));
  EXPECT_FALSE(IsDns1123Label("My-run"));
  EXPECT_FALSE(IsDns1123Label("-run"));
  EXPECT_FALSE(IsDns1123Label(std::string(64, 'a')));
  EXPECT_TRUE(IsEnvVarName("_A1"));
  EXPECT_FALSE(IsEnvVarName("1A"));
  EXPECT_FALSE(IsEnvVarName("A-B"));
  EXPECT_EQ(ClosestMatch("worker", {"workers", "gpus", "cpus"}), "workers");
  EXPECT_EQ(ClosestMatch("zzzzzz", {"workers", "gpus"}), "");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(RandomHex(4).size(), 4u);
}

TEST(StringsTest, Utf8AndPositions) {
  EXPECT_EQ(FindInvalidUtf8("plain \xc3\xa9 \xf0\x9f\x98\x80"), std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xff"), 2u);
  EXPECT_EQ(FindInvalidUtf8("\xed\xa0\x80"), 0u);  // a surrogate
  EXPECT_EQ(FindInvalidUtf8("a\xc3"), 1u);         // truncated
  EXPECT_EQ(LineColumnAt("ab\ncd", 4), std::make_pair(2, 2));
  EXPECT_EQ(LineColumnAt("ab", 0), std::make_pair(1, 1));
}

TEST(FilesTest, AtomicWriteAndRead) {
  std::string dir = ::testing::TempDir() + "/tau_files_test";
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/f", "hello").ok());
  EXPECT_EQ(*ReadFile(dir + "/f"), "hello");
  ASSERT_TRUE(WriteFileAtomic(dir + "/f", "again").ok());
  EXPECT_EQ(*ReadFile(dir + "/f"), "again");
  EXPECT_EQ(ReadFile(dir + "/missing").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(RemoveTree(dir).ok());
  EXPECT_FALSE(PathExists(dir));
}

// Unchanged content is not written again (a full disk refuses the new file it would need): the
// file keeps its inode; changed content or mode is written.
TEST(FilesTest, WriteFileIfChangedLeavesAnUnchangedFileAlone) {
  std::string dir = ::testing::TempDir() + "/tau_files_if_changed";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string path = dir + "/f";
  auto inode = [&] {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return std::make_pair(st.st_ino, st.st_mode & 07777);
  };
  ASSERT_TRUE(WriteFileIfChanged(path, "hello", 0644).ok());
  const auto first = inode();
  ASSERT_TRUE(WriteFileIfChanged(path, "hello", 0644).ok());
  EXPECT_EQ(inode(), first);
  ASSERT_TRUE(WriteFileIfChanged(path, "hello", 0600).ok());
  EXPECT_EQ(inode().first, first.first);
  EXPECT_EQ(inode().second, 0600u);
  ASSERT_TRUE(WriteFileIfChanged(path, "again", 0600).ok());
  EXPECT_NE(inode().first, first.first);
  EXPECT_EQ(*ReadFile(path), "again");
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(FilesTest, RelativePathsThatLeaveTheirDirectoryAreRefused) {
  EXPECT_TRUE(CheckRelativePath("a.txt").ok());
  EXPECT_TRUE(CheckRelativePath("sub/dir/a..b").ok());
  EXPECT_TRUE(CheckRelativePath(".hidden/x").ok());
  EXPECT_EQ(CheckRelativePath("").message(), "the path is empty");
  EXPECT_EQ(CheckRelativePath("/etc/passwd").message(),
            "the path is absolute: name it relative to its directory");
  EXPECT_EQ(CheckRelativePath("..").message(), "the path leaves its directory ('..')");
  EXPECT_EQ(CheckRelativePath("a/../../b").message(), "the path leaves its directory ('..')");
  EXPECT_EQ(CheckRelativePath("a/..").message(), "the path leaves its directory ('..')");
  EXPECT_EQ(CheckRelativePath("a//b").message(), "the path has an empty or '.' component");
  EXPECT_EQ(CheckRelativePath("a/./b").message(), "the path has an empty or '.' component");
  EXPECT_EQ(CheckRelativePath("a/").message(), "the path has an empty or '.' component");
  EXPECT_EQ(CheckRelativePath(std::string("a\0b", 3)).message(), "the path holds a NUL byte");
  EXPECT_EQ(CheckRelativePath(std::string(4097, 'a')).message(),
            "the path is longer than 4096 bytes");
}

TEST(FilesTest, OpenBeneathStaysInsideItsDirectory) {
  namespace fs = std::filesystem;
  const std::string base = ::testing::TempDir() + "/tau_open_beneath_" + std::to_string(::getpid());
  (void)RemoveTree(base);
  const std::string root = base + "/out";
  ASSERT_TRUE(MakeDirs(root + "/sub").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/sub/a.txt", "inside").ok());
  ASSERT_TRUE(WriteFileAtomic(base + "/secret.txt", "outside").ok());
  fs::create_symlink(base + "/secret.txt", root + "/escape");  // absolute, leaves
  fs::create_symlink("../../secret.txt", root + "/sub/up");    // relative, leaves
  fs::create_symlink(base, root + "/dir-escape");              // a directory outside
  ASSERT_EQ(::mkfifo((root + "/fifo").c_str(), 0600), 0);
  auto read_all = [](int fd) {
    std::string text;
    EXPECT_TRUE(ReadChunksAndClose(fd, "f", [&](std::string_view c) { text.append(c); }).ok());
    return text;
  };
  auto inside = OpenBeneath(root, "sub/a.txt");
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  EXPECT_EQ(read_all(*inside), "inside");
  for (const char* escaping : {"escape", "sub/up", "dir-escape/secret.txt"}) {
    auto refused = OpenBeneath(root, escaping);
    EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << escaping;
  }
  EXPECT_EQ(OpenBeneath(root, "../secret.txt").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenBeneath(root, base + "/secret.txt").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenBeneath(root, "missing.txt").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(OpenBeneath(root, "sub").status().message(), "sub: is a directory, not a file");
  // A FIFO is refused at once, not waited on.
  EXPECT_EQ(OpenBeneath(root, "fifo").status().message(), "fifo: is not a regular file");
  (void)RemoveTree(base);
}

// What a run's user may plant in a tree that root walks: a directory that is a symbolic link to a
// place of root's, a hard link to a file of root's, a file of another user's.
TEST(RedactorTest, CaseVariantsOfASecretAreMaskedToo) {
  Redactor r({"s3cr3t-Token"});
  // Split across two writes, in another case: held back, then masked whole.
  std::string out = r.Feed("key=S3CR3T-to", false);
  EXPECT_EQ(out, "key=");
  out += r.Feed("KEN and s3cr3t-token and S3cr3t-tokeN.", true);
  EXPECT_EQ(out, "key=*** and *** and ***.");
  EXPECT_TRUE(r.masked_any());
  Redactor plain({"abc"});
  EXPECT_EQ(plain.Feed("ab-c ABx", true), "ab-c ABx");
}

TEST(FilesTest, TreeWalksNeverLeaveTheTreeThroughLinks) {
  namespace fs = std::filesystem;
  const std::string base = ::testing::TempDir() + "/tau_tree_walk_" + std::to_string(::getpid());
  (void)RemoveTree(base);
  const std::string tree = base + "/tree", outside = base + "/outside";
  ASSERT_TRUE(MakeDirs(tree + "/sub/deeper").ok());
  ASSERT_TRUE(MakeDirs(outside + "/inner").ok());
  ASSERT_TRUE(WriteFileAtomic(tree + "/sub/deeper/a.txt", "a").ok());
  ASSERT_TRUE(WriteFileAtomic(outside + "/inner/keep.txt", "keep").ok());
  ASSERT_TRUE(WriteFileAtomic(outside + "/linked.txt", "linked").ok());
  fs::create_symlink(outside, tree + "/escape");
  fs::create_symlink(outside + "/inner", tree + "/sub/escape-inner");
  fs::create_hard_link(outside + "/linked.txt", tree + "/hard.txt");
  std::vector<std::string> seen;
  ASSERT_TRUE(WalkTree(tree, [&](const TreeEntry& e) -> Result<bool> {
                seen.push_back(e.rel);
                return true;  // asked to enter every directory: links are still not entered
              }).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"escape", "hard.txt", "sub", "sub/deeper",
                                            "sub/deeper/a.txt", "sub/escape-inner"}));
  // A file read through the walk's descriptor: a link is refused, not followed.
  ASSERT_TRUE(WalkTree(tree, [&](const TreeEntry& e) -> Result<bool> {
                auto fd = OpenRegularAt(e.dir_fd, e.name, e.rel);
                if (S_ISLNK(e.st.st_mode)) {
                  EXPECT_EQ(fd.status().code(), StatusCode::kInvalidArgument) << e.rel;
                } else if (S_ISREG(e.st.st_mode)) {
                  EXPECT_TRUE(fd.ok()) << e.rel;
                  if (fd.ok()) ::close(*fd);
                }
                return true;
              }).ok());
  if (::geteuid() == 0) {
    // Handed to a user: the tree's own entries change owner, nothing outside does, nor the hard
    // link (a file outside), nor a file already another user's.
    ASSERT_TRUE(WriteFileAtomic(tree + "/theirs.txt", "t").ok());
    ASSERT_EQ(::chown((tree + "/theirs.txt").c_str(), 4242, 4242), 0);
    ASSERT_TRUE(ChownTree(tree, 54321, 54321).ok());
    auto owner = [](const std::string& p) {
      struct stat st;
      EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
      return st.st_uid;
    };
    for (const char* mine : {"", "/sub", "/sub/deeper", "/sub/deeper/a.txt", "/escape"})
      EXPECT_EQ(owner(tree + mine), 54321u) << mine;
    EXPECT_EQ(owner(tree + "/theirs.txt"), 4242u);
    for (const char* root_s : {"", "/inner", "/inner/keep.txt", "/linked.txt"})
      EXPECT_EQ(owner(outside + root_s), 0u) << root_s;
  }
  // Removing the tree removes the links, never what they point at.
  ASSERT_TRUE(RemoveTree(tree).ok());
  EXPECT_FALSE(PathExists(tree));
  EXPECT_TRUE(PathExists(outside + "/inner/keep.txt"));
  EXPECT_TRUE(PathExists(outside + "/linked.txt"));
  EXPECT_TRUE(RemoveTree(base).ok());
  EXPECT_TRUE(RemoveTree(base).ok());  // a missing tree is no error
}

TEST(FilesTest, AbandonedTemporariesOfDeadWritersAreRemoved) {
  std::string dir = ::testing::TempDir() + "/tau_files_temporaries";
  ASSERT_TRUE(MakeDirs(dir).ok());
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // now a pid of nobody's
  const std::string dead = dir + "/f.tmp." + std::to_string(child);
  const std::string live = dir + "/f.tmp." + std::to_string(::getpid());
  const std::string other = dir + "/f.tmp.notapid";
  const std::string sibling = dir + "/g.tmp." + std::to_string(child);
  for (const std::string& path : {dead, live, other, sibling})
    ASSERT_TRUE(WriteFileAtomic(path, "x").ok());
  RemoveAbandonedTemporaries(dir + "/f");
  EXPECT_FALSE(PathExists(dead));
  EXPECT_TRUE(PathExists(live));
  EXPECT_TRUE(PathExists(other));
  EXPECT_TRUE(PathExists(sibling));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace tau

namespace tau {
namespace {
TEST(Base64Test, RoundTrip) {
  for (const std::string& s :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    auto d = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, s);
  }
  EXPECT_EQ(Base64Encode("abc"), "YWJj");
  EXPECT_FALSE(Base64Decode("abc").ok());
  EXPECT_FALSE(Base64Decode("a*==").ok());
}
}  // namespace
}  // namespace tau

namespace tau {
namespace {
// Every vector through both code paths: the CPU's SHA instructions (where it has them) and the
// portable rounds.
class HashTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { before_ = UseSha256Instructions(GetParam()); }
  void TearDown() override { UseSha256Instructions(before_); }
  bool before_ = false;
};

INSTANTIATE_TEST_SUITE_P(Paths, HashTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Native" : "Portable"; });

TEST_P(HashTest, KnownVectors) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_P(HashTest, MoreVectorsAndIncremental) {
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  EXPECT_EQ(Sha256Hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 h;
  for (size_t i = 0; i < million.size(); i += 997)
    h.Update(std::string_view(million).substr(i, 997));
  EXPECT_EQ(h.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary.
  EXPECT_EQ(Sha256Hex(std::string(55, 'x')).size(), 64u);
  EXPECT_NE(Sha256Hex(std::string(55, 'x')), Sha256Hex(std::string(56, 'x')));
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(HashPathsTest, HmacSha256MatchesRfc4231) {
  // Test cases 1, 2 and 6 of RFC 4231 (6: a key longer than the block, hashed first).
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(HmacSha256Hex(std::string(131, '\xaa'),
                          "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HashPathsTest, BothPathsAgreeOnEveryLengthAndSplit) {
  std::string data;
  uint32_t x = 12345;
  for (int i = 0; i < 4096; ++i)
    data.push_back(static_cast<char>((x = x * 1103515245 + 12345) >> 16));
  const bool before = UseSha256Instructions(true);
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 4095, 4096}) {
    std::string_view part = std::string_view(data).substr(0, len);
    UseSha256Instructions(true);
    std::string native = Sha256Hex(part);
    Sha256 split;  // odd pieces: blocks cross Update calls
    for (size_t i = 0; i < part.size(); i += 37) split.Update(part.substr(i, 37));
    std::string native_split = split.HexDigest();
    UseSha256Instructions(false);
    std::string portable = Sha256Hex(part);
    EXPECT_EQ(native, portable) << len;
    EXPECT_EQ(native_split, portable) << len;
  }
  UseSha256Instructions(before);
}
}  // namespace
// A fresh path in the test's temporary directory, without "//" or symlinks (messages name real
// paths).
std::string TempPath(const std::string& prefix) {
  std::string base = std::filesystem::canonical(::testing::TempDir()).string();
  return base + "/" + prefix + std::to_string(::getpid());
}

// A user who owns nothing here and is in no group of these files.
SystemUser Stranger() {
  SystemUser u;
  u.name = "stranger";
  u.uid = 54321;
  u.gid = 54321;
  u.gids = {54321};
  return u;
}

TEST(UsersTest, ReachabilityNamesTheDirectoryThatStopsAUser) {
  std::string root = TempPath("tau_reach_");
  ASSERT_TRUE(RemoveTree(root).ok());
  ASSERT_TRUE(MakeDirs(root + "/open/closed/inner", 0755).ok());
  ::chmod(root.c_str(), 0755);
  ::chmod((root + "/open").c_str(), 0711);
  ::chmod((root + "/open/closed").c_str(), 0700);
  const SystemUser u = Stranger();
  EXPECT_TRUE(CheckReachable(root + "/open", u, false).ok());
  // Searchable but not listable: reachable, not readable.
  EXPECT_FALSE(CheckReachable(root + "/open", u, true).ok());
  Status s = CheckReachable(root + "/open/closed/inner/not-yet", u, false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("user stranger (uid 54321) cannot reach " + root +
                             "/open/closed/inner/not-yet: " + root +
                             "/open/closed is mode 0700, owned by "),
            std::string::npos)
      << s.message();
  // The owner, and a member of the directory's group with g+x, get through.
  struct stat st;
  ASSERT_EQ(::stat((root + "/open/closed").c_str(), &st), 0);
  SystemUser owner = u;
  owner.uid = st.st_uid;
  EXPECT_TRUE(CheckReachable(root + "/open/closed/inner", owner, false).ok());
  ::chmod((root + "/open/closed").c_str(), 0710);
  SystemUser member = u;
  member.gids.push_back(st.st_gid);
  EXPECT_TRUE(CheckReachable(root + "/open/closed/inner", member, false).ok());
  EXPECT_FALSE(CheckReachable(root + "/open/closed/inner", u, false).ok());
  (void)RemoveTree(root);
}

// Root acting as a user in one thread: that thread can do only what the user could, and files it
// makes are the user's; the process's other threads stay root.
TEST(UsersTest, ActingAsAUserChangesOnlyTheCallingThread) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  std::string root = TempPath("tau_acting_");
  ASSERT_TRUE(RemoveTree(root).ok());
  ASSERT_TRUE(MakeDirs(root + "/roots", 0700).ok());
  ASSERT_TRUE(MakeDirs(root + "/theirs", 0700).ok());
  ::chmod(root.c_str(), 0755);
  ASSERT_EQ(::chown((root + "/theirs").c_str(), 54321, 54321), 0);
  // A thread that exists before the switch (one started meanwhile would inherit it) stays root.
  std::mutex mu;
  std::condition_variable cv;
  bool acting = false, written = false;
  std::thread other([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return acting; });
    EXPECT_TRUE(WriteFileAtomic(root + "/roots/by-root", "x").ok());
    written = true;
    cv.notify_all();
  });
  {
    ActingAsUser as(54321, 54321, {54321});
    ASSERT_TRUE(as.active());
    {
      std::unique_lock<std::mutex> lock(mu);
      acting = true;
      cv.notify_all();
      cv.wait(lock, [&] { return written; });
    }
    other.join();
    Status refused = WriteFileAtomic(root + "/roots/by-user", "x");
    EXPECT_FALSE(refused.ok());
    EXPECT_TRUE(WriteFileAtomic(root + "/theirs/made", "x").ok());
  }
  struct stat st;
  ASSERT_EQ(::stat((root + "/theirs/made").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 54321u);
  EXPECT_EQ(st.st_gid, 54321u);
  EXPECT_TRUE(PathExists(root + "/roots/by-root"));
  // Root again once it ends.
  EXPECT_TRUE(WriteFileAtomic(root + "/roots/again", "x").ok());
  (void)RemoveTree(root);
}

TEST(UsersTest, AnExecutableIsFoundOnlyWhereTheUserMayRunIt) {
  std::string root = TempPath("tau_exec_");
  ASSERT_TRUE(RemoveTree(root).ok());
  ASSERT_TRUE(MakeDirs(root + "/private", 0700).ok());
  ASSERT_TRUE(MakeDirs(root + "/public", 0755).ok());
  ::chmod(root.c_str(), 0755);
  for (const char* dir : {"/private", "/public"}) {
    ASSERT_TRUE(WriteFileAtomic(root + dir + "/tool", "#!/bin/sh\n", 0755).ok());
    ::chmod((root + dir + "/tool").c_str(), 0755);
  }
  const SystemUser u = Stranger();
  auto found = FindExecutableFor("tool", root + "/private:" + root + "/public", u);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, root + "/public/tool");
  ::chmod((root + "/public/tool").c_str(), 0700);
  found = FindExecutableFor("tool", root + "/private:" + root + "/public", u);
  ASSERT_FALSE(found.ok());
  EXPECT_NE(found.status().message().find(root + "/private is mode 0700"), std::string::npos)
      << found.status().message();
  EXPECT_NE(found.status().message().find(root + "/public/tool: not executable by stranger"),
            std::string::npos)
      << found.status().message();
  (void)RemoveTree(root);
}

}  // namespace tau
