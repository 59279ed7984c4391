// The machine's accounts: a user's ids, groups and their names, from the system's databases
// (getpwnam_r, getgrouplist), for the server's callers and for running a run as its submitter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tau {

struct SystemUser {
  std::string name;
  uint32_t uid = 0;
  uint32_t gid = 0;                      // primary group
  std::vector<uint32_t> gids;            // every group, the primary one included
  std::vector<std::string> group_names;  // the names of `gids` that have one
};

// NotFound when the machine has no such user.
Result<SystemUser> LookUpUserByName(const std::string& name);
Result<SystemUser> LookUpUserById(uint32_t uid);

// Whether `user` may search every directory from / down to `path` (and, with `read`, list `path`
// itself and read what is in it), by the permission bits: ACLs are not consulted. Components that
// do not exist yet are not checked. FailedPrecondition names the first directory that stops them,
// with its mode and owner.
Status CheckReachable(const std::string& path, const SystemUser& user, bool read);
// The first of `dirs` (a PATH) holding a file named `program` that `user` may execute; NotFound
// lists each candidate found and why it is not theirs to run.
Result<std::string> FindExecutableFor(const std::string& program, const std::string& dirs,
                                      const SystemUser& user);

}  // namespace tau
