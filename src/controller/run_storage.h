// Where a run's checkpoints and outputs live: a directory of the run's name on the platform's
// storage volume when its resolution mounts one with a host directory (durable, shared by its
// attempts, apart from other runs'), else in the run's own directory under TAU_HOME.
#pragma once

#include <string>

#include "store/store.h"

namespace tau::server {

// `role`: "checkpoint" or "output".
std::string StorageDir(const std::string& home, const store::RunRecord& r, const std::string& role);

}  // namespace tau::server
