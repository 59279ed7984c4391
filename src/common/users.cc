#include "common/users.h"

#include <grp.h>
#include <pwd.h>

#include <algorithm>
#include <vector>

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

}  // namespace tau
