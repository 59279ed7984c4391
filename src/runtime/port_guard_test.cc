// PortGuard with real sockets and real users: a listener's guarded port refuses a connect from
// another uid, at every address that reaches it, and lets its user and root in.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

constexpr uint32_t kOwner = 54321, kStranger = 54322;

// A listener on 127.0.0.1 (and, through a dual-stack socket, nothing else); returns its port.
int Listen(int* fd) {
  *fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(*fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(*fd, 64) != 0 ||
      ::getsockname(*fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  return ntohs(a.sin_port);
}

// 0 when a process of `uid` connects to `address`:`port`, else the errno it got.
int ConnectAs(uint32_t uid, const char* address, int port) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (uid != 0 && (::setgid(uid) != 0 || ::setuid(uid) != 0)) ::_exit(250);
    sockaddr_storage s{};
    socklen_t len;
    int family;
    if (std::strchr(address, ':')) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&s);
      a6->sin6_family = family = AF_INET6;
      a6->sin6_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET6, address, &a6->sin6_addr);
      len = sizeof *a6;
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&s);
      a4->sin_family = family = AF_INET;
      a4->sin_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET, address, &a4->sin_addr);
      len = sizeof *a4;
    }
    int fd = ::socket(family, SOCK_STREAM, 0);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&s), len);
    ::_exit(rc == 0 ? 0 : (errno & 0x7f));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

TEST(PortGuardTest, OnlyThePortsUserAndRootConnect) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  auto guard = PortGuard::Start("port_guard_test");
  if (!guard.ok()) GTEST_SKIP() << "this machine cannot guard ports: " << guard.status().ToString();
  int listener = -1;
  const int port = Listen(&listener);
  ASSERT_GT(port, 0);
  // Unguarded: anyone.
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), 0);
  ASSERT_TRUE((*guard)->Allow(port, kOwner).ok());
  // Every address that reaches loopback listeners is guarded (127.0.0.2 reaches none bound to
  // 127.0.0.1: refused by the kernel for those let through, ECONNREFUSED, not by the guard).
  for (const char* address :
       {"127.0.0.1", "127.0.0.2", "0.0.0.0", "::ffff:127.0.0.1", "::ffff:0.0.0.0", "::1", "::"}) {
    EXPECT_EQ(ConnectAs(kStranger, address, port), EPERM) << address;
    EXPECT_NE(ConnectAs(kOwner, address, port), EPERM) << address;
    EXPECT_NE(ConnectAs(0, address, port), EPERM) << address;
  }
  for (const char* address : {"127.0.0.1", "0.0.0.0", "::ffff:127.0.0.1"}) {
    EXPECT_EQ(ConnectAs(kOwner, address, port), 0) << address;
    EXPECT_EQ(ConnectAs(0, address, port), 0) << address;
  }
  // Another port is nobody's business.
  int other_fd = -1;
  const int other = Listen(&other_fd);
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", other), 0);
  (*guard)->Release(port);
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), 0);
  // A guard that goes detaches its programs.
  ASSERT_TRUE((*guard)->Allow(port, kOwner).ok());
  guard->reset();
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), 0);
  ::close(listener);
  ::close(other_fd);
}

TEST(PortGuardTest, ALeftOverGuardOfTheSameOwnerIsDetachedByTheNextOne) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  auto first = PortGuard::Start("port_guard_test_stale");
  if (!first.ok()) GTEST_SKIP() << first.status().ToString();
  int listener = -1;
  const int port = Listen(&listener);
  ASSERT_TRUE((*first)->Allow(port, kOwner).ok());
  // A second server of the same home starts while the first's programs are still attached (as
  // after a SIGKILL): the old ones guard until it detaches them.
  auto second = PortGuard::Start("port_guard_test_stale");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), EPERM);
  ASSERT_TRUE((*second)->Allow(port, kOwner).ok());
  EXPECT_EQ(PortGuard::DetachLeftOvers("port_guard_test_stale", second->get()), 2);
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), EPERM);  // the second's guard holds
  EXPECT_EQ(ConnectAs(kOwner, "127.0.0.1", port), 0);
  // Another owner's guard is left alone, and so is the second's own.
  auto other = PortGuard::Start("port_guard_test_other");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(PortGuard::DetachLeftOvers("port_guard_test_other", other->get()), 0);
  EXPECT_EQ(PortGuard::DetachLeftOvers("port_guard_test_stale", second->get()), 0);
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), EPERM);
  ::close(listener);
}

// How many programs are attached to the cgroup v2 root for IPv4 connects (-1: unknown).
int AttachedConnect4Programs() {
  std::ifstream mounts("/proc/self/mounts");
  std::string device, where, type, rest;
  while (mounts >> device >> where >> type && std::getline(mounts, rest)) {
    if (type != "cgroup2") continue;
    int fd = ::open(where.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    uint32_t ids[256];
    bpf_attr query{};
    query.query.target_fd = static_cast<uint32_t>(fd);
    query.query.attach_type = BPF_CGROUP_INET4_CONNECT;
    query.query.prog_ids = reinterpret_cast<uint64_t>(ids);
    query.query.prog_cnt = 256;
    long rc = ::syscall(SYS_bpf, BPF_PROG_QUERY, &query, sizeof query);
    ::close(fd);
    return rc == 0 ? static_cast<int>(query.query.prog_cnt) : -1;
  }
  return -1;
}

TEST(PortGuardTest, GuardsOfKilledServersDoNotKeepTheNextOneOut) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  auto live = PortGuard::Start("port_guard_test_live");
  if (!live.ok()) GTEST_SKIP() << live.status().ToString();
  int listener = -1;
  const int port = Listen(&listener);
  ASSERT_TRUE((*live)->Allow(port, kOwner).ok());
  // Servers of homes nobody serves again, killed with their programs attached, until the kernel's
  // limit (64 per cgroup and hook) is reached.
  bool full = false;
  for (int i = 0; i < 70 && !(full = AttachedConnect4Programs() >= 64); ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      auto guard = PortGuard::Start("port_guard_test_killed_" + std::to_string(i));
      if (guard.ok()) guard->release();  // never detached: as under SIGKILL
      ::_exit(guard.ok() ? 0 : 1);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "killed server " << i;
  }
  ASSERT_TRUE(full) << AttachedConnect4Programs();
  auto next = PortGuard::Start("port_guard_test_next");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_LT(AttachedConnect4Programs(), 64);
  // What a live server holds stays attached, and guards.
  EXPECT_EQ(ConnectAs(kStranger, "127.0.0.1", port), EPERM);
  EXPECT_EQ(ConnectAs(kOwner, "127.0.0.1", port), 0);
  ::close(listener);
}

}  // namespace
}  // namespace tau::runtime
