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

// For its lifetime, the calling thread (and only it) opens, creates, removes and renames files as
// `uid`:`gid` with `groups`: its file-system ids and supplementary groups are switched with the raw
// system calls, which Linux keeps per thread (glibc's wrappers would switch every thread), and
// a file-system uid other than 0 drops the capabilities that bypass permissions. For a root
// process that must touch a tree a less privileged user can change (a run's virtualenv cache, a
// retried attempt's code): whatever links or swaps that user plants, the operation can do only what
// the user could have done. Files it creates are the user's. Restored when it ends. A thread
// started meanwhile inherits the user's ids: start none. A process that is not root keeps its ids
// (it can only be acting as itself).
class ActingAsUser {
 public:
  ActingAsUser(uint32_t uid, uint32_t gid, const std::vector<uint32_t>& groups);
  ~ActingAsUser();
  ActingAsUser(const ActingAsUser&) = delete;
  ActingAsUser& operator=(const ActingAsUser&) = delete;
  // Whether the switch happened (false: not root, or the kernel refused).
  bool active() const { return active_; }

 private:
  bool active_ = false;
  uint32_t uid_ = 0, gid_ = 0;
  std::vector<uint32_t> saved_groups_;
};

}  // namespace tau
