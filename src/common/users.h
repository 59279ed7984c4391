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

}  // namespace tau
