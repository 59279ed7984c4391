#include "common/users.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include <vector>
#include "common/strings.h"

namespace tau {
namespace {

SystemUser FromPasswd(const struct passwd& pw) {
  SystemUser u;
  u.name = pw.pw_name;
  u.uid = pw.pw_uid;
  u.gid = pw.pw_gid;
  int n = 64;
  std::vector<gid_t> gids(static_cast<size_t>(n));
  if (::getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n) < 0) {
    gids.resize(static_cast<size_t>(n));
    (void)::getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n);
  }
  gids.resize(static_cast<size_t>(std::max(n, 0)));
  std::vector<char> buf(16384);
  for (gid_t gid : gids) {
    u.gids.push_back(gid);
    struct group gr {};
    struct group* found = nullptr;
    if (::getgrgid_r(gid, &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr)
      u.group_names.push_back(gr.gr_name);
  }
  return u;
}

}  // namespace

Result<SystemUser> LookUpUserByName(const std::string& name) {
  std::vector<char> buf(16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (::getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return NotFound("no system user '" + name + "'");
  return FromPasswd(pw);
}

Result<SystemUser> LookUpUserById(uint32_t uid) {
  std::vector<char> buf(16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return NotFound("no system user with uid " + std::to_string(uid));
  return FromPasswd(pw);
}

namespace {

// The permission class bits of `st` that apply to `user` (rwx as 4, 2, 1).
unsigned AccessBits(const struct stat& st, const SystemUser& user) {
  if (user.uid == 0) return 7;
  if (st.st_uid == user.uid) return (st.st_mode >> 6) & 7;
  if (std::find(user.gids.begin(), user.gids.end(), st.st_gid) != user.gids.end())
    return (st.st_mode >> 3) & 7;
  return st.st_mode & 7;
}

std::string OwnerName(uid_t uid, gid_t gid) {
  auto u = LookUpUserById(uid);
  struct group gr {};
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  std::string group = ::getgrgid_r(gid, &gr, buf.data(), buf.size(), &found) == 0 && found
                          ? std::string(gr.gr_name)
                          : std::to_string(gid);
  return (u.ok() ? u->name : std::to_string(uid)) + ":" + group;
}

std::string Describe(const std::string& dir, const struct stat& st) {
  return fmt::format("{} is mode {:04o}, owned by {}", dir, st.st_mode & 07777,
                     OwnerName(st.st_uid, st.st_gid));
}

}  // namespace

Status CheckReachable(const std::string& path, const SystemUser& user, bool read) {
  std::error_code ec;
  std::filesystem::path real = std::filesystem::weakly_canonical(path, ec);
  if (ec) real = path;
  std::filesystem::path at = "/";
  std::vector<std::filesystem::path> chain = {at};
  for (const auto& part : real.relative_path()) chain.push_back(at /= part);
  for (size_t i = 0; i < chain.size(); ++i) {
    struct stat st;
    if (::stat(chain[i].c_str(), &st) != 0) break;  // made later, by the server
    if (!S_ISDIR(st.st_mode)) break;
    const bool last = i + 1 == chain.size();
    const unsigned need = last && read ? 5 : 1;
    if ((AccessBits(st, user) & need) != need)
      return FailedPrecondition(fmt::format("user {} (uid {}) cannot {} {}: {}", user.name,
                                            user.uid, last && read ? "read" : "reach", path,
                                            Describe(chain[i].string(), st)));
  }
  return Status::Ok();
}

Result<std::string> FindExecutableFor(const std::string& program, const std::string& dirs,
                                      const SystemUser& user) {
  std::vector<std::string> why;
  for (const std::string& dir : Split(dirs, ':')) {
    if (dir.empty() || dir[0] != '/') continue;  // a relative entry depends on the cwd
    std::string candidate = dir + "/" + program;
    struct stat st;
    if (::stat(candidate.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (Status reach = CheckReachable(dir, user, false); !reach.ok()) {
      why.push_back(candidate + ": " + reach.message());
      continue;
    }
    if ((AccessBits(st, user) & 5) != 5) {
      why.push_back(fmt::format("{}: not executable by {}: {}", candidate, user.name,
                                Describe(candidate, st)));
      continue;
    }
    return candidate;
  }
  return NotFound(fmt::format("no {} on PATH ({}) that user {} may run{}{}", program, dirs,
                              user.name, why.empty() ? "" : ": ", Join(why, "; ")));
}

ActingAsUser::ActingAsUser(uint32_t uid, uint32_t gid, const std::vector<uint32_t>& groups)
    : uid_(uid), gid_(gid) {
  if (::geteuid() != 0 || uid == 0) return;
  const long n = ::syscall(SYS_getgroups, 0, nullptr);
  if (n < 0) return;
  saved_groups_.resize(static_cast<size_t>(n));
  if (n > 0 && ::syscall(SYS_getgroups, n, saved_groups_.data()) != n) return;
  // Groups and the gid first: once the file-system uid is not 0, changing them is still allowed
  // (CAP_SETGID stays), but do it while nothing can fail half-way.
  if (::syscall(SYS_setgroups, groups.size(), groups.data()) != 0) return;
  ::syscall(SYS_setfsgid, gid);
  ::syscall(SYS_setfsuid, uid);
  // setfs*id answer the previous id, never an error: ask again to know.
  active_ = static_cast<uint32_t>(::syscall(SYS_setfsuid, -1)) == uid &&
            static_cast<uint32_t>(::syscall(SYS_setfsgid, -1)) == gid;
  if (!active_) {
    ::syscall(SYS_setfsuid, 0);
    ::syscall(SYS_setfsgid, 0);
    ::syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data());
  }
}

ActingAsUser::~ActingAsUser() {
  if (!active_) return;
  ::syscall(SYS_setfsuid, 0);
  ::syscall(SYS_setfsgid, 0);
  ::syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data());
}

}  // namespace tau
